#include "common/upload_grant.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace shoal {
namespace {

std::string HmacHex(absl::string_view key, absl::string_view text) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(text.data()), text.size(), mac, &len);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * len);
  for (unsigned int i = 0; i < len; ++i) {
    hex.push_back(kHex[mac[i] >> 4]);
    hex.push_back(kHex[mac[i] & 15]);
  }
  return hex;
}

absl::Status Denied(absl::string_view why) {
  return absl::PermissionDeniedError(
      absl::StrCat("upload refused: ", why,
                   " (uploads need the coordinator's grant for this checkpoint; "
                   "--upload_key_file)"));
}

}  // namespace

std::string SignUploadGrant(absl::string_view key, const UploadGrant& grant) {
  const std::string body =
      absl::StrCat("v1|", grant.run_id, "|", grant.worker_id, "|", grant.first_round, "|",
                   grant.last_round, "|", absl::ToUnixMillis(grant.expires));
  return absl::StrCat(body, "|", HmacHex(key, body));
}

absl::StatusOr<UploadGrant> VerifyUploadGrant(absl::string_view key, absl::string_view text,
                                              absl::Time now) {
  if (text.empty()) return Denied("no grant (`x-shoal-upload-grant`)");
  const size_t bar = text.rfind('|');
  if (bar == absl::string_view::npos) return Denied("malformed grant");
  const absl::string_view body = text.substr(0, bar);
  const std::string mac = HmacHex(key, body);
  const absl::string_view given = text.substr(bar + 1);
  // Constant time: the signature is checked before anything else is read.
  if (given.size() != mac.size() || CRYPTO_memcmp(given.data(), mac.data(), mac.size()) != 0) {
    return Denied("the grant's signature is not the coordinator's");
  }
  std::vector<absl::string_view> parts = absl::StrSplit(body, '|');
  UploadGrant g;
  int64_t expires_ms = 0;
  if (parts.size() != 6 || parts[0] != "v1" || !absl::SimpleAtoi(parts[3], &g.first_round) ||
      !absl::SimpleAtoi(parts[4], &g.last_round) || !absl::SimpleAtoi(parts[5], &expires_ms)) {
    return Denied("malformed grant");
  }
  g.run_id = std::string(parts[1]);
  g.worker_id = std::string(parts[2]);
  g.expires = absl::FromUnixMillis(expires_ms);
  if (now >= g.expires) {
    return Denied(absl::StrCat("the grant of ", g.worker_id, " expired ",
                               absl::FormatDuration(absl::Floor(now - g.expires, absl::Seconds(1))),
                               " ago"));
  }
  return g;
}

absl::Status GrantCovers(const UploadGrant& grant, absl::string_view run_id, uint64_t round) {
  if (grant.run_id != run_id) {
    return Denied(absl::StrCat("the grant is for another run than '", run_id.substr(0, 64), "'"));
  }
  if (round < grant.first_round || round > grant.last_round) {
    return Denied(absl::StrCat("the grant of ", grant.worker_id, " covers rounds ",
                               grant.first_round, "..", grant.last_round, ", not ", round));
  }
  return absl::OkStatus();
}

}  // namespace shoal
