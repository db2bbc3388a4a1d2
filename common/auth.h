// Who may call a Shoal server (docs/SECURITY.md): the run token every member
// holds and the checkpoint store's admin token.
//
// A token is a secret string read from a file (--token_file,
// --admin_token_file). Clients send it with every call as gRPC metadata
// `authorization: Bearer <token>` (MakeChannel attaches the process's token;
// grpcurl users pass `-H 'authorization: Bearer ...'`). Servers hold only the
// SHA-256 of each token and compare digests in constant time.
//
// With no token configured a server lets every call in (the default on
// 127.0.0.1, like plain text). The gRPC health service is never gated, so
// Kubernetes probes need no secret.
#ifndef SHOAL_COMMON_AUTH_H_
#define SHOAL_COMMON_AUTH_H_

#include <grpcpp/grpcpp.h>

#include <array>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shoal {

// The metadata key and the scheme of the value ("Bearer <token>").
inline constexpr char kAuthMetadataKey[] = "authorization";
inline constexpr char kBearerPrefix[] = "Bearer ";

// Shortest token accepted: a token is a secret, not a password to remember
// (`openssl rand -hex 32` makes a good one).
inline constexpr size_t kMinTokenLength = 16;
inline constexpr size_t kMaxTokenLength = 4096;

// Checks a token's text: at least kMinTokenLength, at most kMaxTokenLength
// characters, printable ASCII without spaces (it travels in an HTTP/2 header).
// INVALID_ARGUMENT says what is wrong, never the token itself.
absl::Status ValidateToken(absl::string_view token);

// Reads a token file: its content with surrounding whitespace (the trailing
// newline of `echo`) removed, then validated. NOT_FOUND when the file cannot be
// read; errors name the file.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// The token this process's clients send (MakeChannel attaches it to every call
// of the channels it makes); empty = none. Set once at start, before any
// channel is made (like the TLS configuration).
void SetProcessToken(std::string token);
const std::string& ProcessToken();

// What a call asks for. Every Shoal call needs kMember, except deleting
// checkpoints, which needs kAdmin.
enum class Access { kMember, kAdmin };

// A server's check of the tokens it was given. Copyable; immutable once made.
class TokenGate {
 public:
  // Open: every call gets in.
  TokenGate() = default;
  // `run_token` grants kMember; `admin_token` grants both. Either may be empty
  // (not accepted). Both empty = open.
  TokenGate(absl::string_view run_token, absl::string_view admin_token);

  bool open() const { return !run_.has_value() && !admin_.has_value(); }

  // OK, or UNAUTHENTICATED (no `authorization` metadata, not a Bearer token,
  // or a token this server does not know), or PERMISSION_DENIED (a run token
  // where the admin token is needed).
  absl::Status Check(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
                     Access access) const;
  grpc::Status Check(const grpc::CallbackServerContext* ctx, Access access) const;

 private:
  using Digest = std::array<unsigned char, 32>;
  std::optional<Digest> run_;
  std::optional<Digest> admin_;
};

}  // namespace shoal

#endif  // SHOAL_COMMON_AUTH_H_
