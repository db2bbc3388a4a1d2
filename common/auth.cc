#include "common/auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_util.h"

namespace shoal {
namespace {

std::string& MutableProcessToken() {
  static std::string* token = new std::string;
  return *token;
}

std::array<unsigned char, 32> DigestOf(absl::string_view text) {
  std::array<unsigned char, 32> digest;
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest.data());
  return digest;
}

}  // namespace

absl::Status ValidateToken(absl::string_view token) {
  if (token.size() < kMinTokenLength) {
    return absl::InvalidArgumentError(absl::StrCat("token is ", token.size(),
                                                   " characters long; at least ", kMinTokenLength,
                                                   " are needed (e.g. `openssl rand -hex 32`)"));
  }
  if (token.size() > kMaxTokenLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("token is longer than ", kMaxTokenLength, " characters"));
  }
  for (size_t i = 0; i < token.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c <= 0x20 || c >= 0x7f) {
      return absl::InvalidArgumentError(
          absl::StrCat("token has a space, control or non-ASCII character at position ", i,
                       "; use printable ASCII only (it travels in an HTTP/2 header)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read token file ", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::NotFoundError(absl::StrCat("cannot read token file ", path));
  std::string token(absl::StripAsciiWhitespace(text.str()));
  if (absl::Status s = ValidateToken(token); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, ": ", s.message()));
  }
  return token;
}

void SetProcessToken(std::string token) { MutableProcessToken() = std::move(token); }

const std::string& ProcessToken() { return MutableProcessToken(); }

TokenGate::TokenGate(absl::string_view run_token, absl::string_view admin_token) {
  if (!run_token.empty()) run_ = DigestOf(run_token);
  if (!admin_token.empty()) admin_ = DigestOf(admin_token);
}

absl::Status TokenGate::Check(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
                              Access access) const {
  if (open()) return absl::OkStatus();
  auto it = metadata.find(kAuthMetadataKey);
  if (it == metadata.end()) {
    return absl::UnauthenticatedError(
        "this server needs a token: `authorization: Bearer <token>` metadata (--token_file)");
  }
  const absl::string_view value(it->second.data(), it->second.size());
  if (!absl::StartsWith(value, kBearerPrefix)) {
    return absl::UnauthenticatedError("`authorization` metadata is not `Bearer <token>`");
  }
  const std::array<unsigned char, 32> digest = DigestOf(value.substr(sizeof(kBearerPrefix) - 1));
  auto same = [&](const std::optional<Digest>& known) {
    return known.has_value() && CRYPTO_memcmp(known->data(), digest.data(), digest.size()) == 0;
  };
  if (same(admin_)) return absl::OkStatus();
  if (same(run_)) {
    if (access == Access::kAdmin) {
      return absl::PermissionDeniedError(
          "the run token may read and upload; this needs the admin token (--admin_token_file)");
    }
    return absl::OkStatus();
  }
  return absl::UnauthenticatedError("unknown token");
}

grpc::Status TokenGate::Check(const grpc::CallbackServerContext* ctx, Access access) const {
  if (open()) return grpc::Status::OK;
  return ToGrpcStatus(Check(ctx->client_metadata(), access));
}

}  // namespace shoal
