// Upload grants (docs/SECURITY.md, "Member credentials"): only the worker
// the coordinator asked to upload a checkpoint may write it to the store.
//
// The coordinator and the store share a secret that workers never see
// (--upload_key_file on both; not the run token, which every member, current
// or former, holds). Each CheckpointRequest the coordinator sends carries a
// grant: the run id, the rounds it covers, the worker it was given to and an
// expiry, signed with HMAC-SHA256 under that key. The worker sends it with
// its upload as metadata `x-shoal-upload-grant`; the store checks the
// signature, the expiry and that the manifest's run and round are covered,
// before it writes anything: PERMISSION_DENIED otherwise.
//
// Text: "v1|<run_id>|<worker_id>|<first_round>|<last_round>|<expiry unix
// ms>|<64 hex digits of HMAC-SHA256 over everything before the last '|'>".
// Run ids and worker ids never contain '|' (ValidateRunId).
#ifndef SHOAL_COMMON_UPLOAD_GRANT_H_
#define SHOAL_COMMON_UPLOAD_GRANT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace shoal {

inline constexpr char kUploadGrantMetadataKey[] = "x-shoal-upload-grant";

struct UploadGrant {
  std::string run_id;
  std::string worker_id;
  // Rounds (sequence numbers in gossip mode) the grant covers, inclusive.
  uint64_t first_round = 0;
  uint64_t last_round = 0;
  absl::Time expires = absl::InfinitePast();
};

// The signed text of `grant` under `key` (non-empty).
std::string SignUploadGrant(absl::string_view key, const UploadGrant& grant);

// The grant `text` carries, when it is well formed, signed with `key` and
// not expired at `now`; PERMISSION_DENIED otherwise (the message says which,
// never the key).
absl::StatusOr<UploadGrant> VerifyUploadGrant(absl::string_view key, absl::string_view text,
                                              absl::Time now);

// OK when `grant` covers an upload of `round` of `run_id`; PERMISSION_DENIED
// otherwise.
absl::Status GrantCovers(const UploadGrant& grant, absl::string_view run_id, uint64_t round);

}  // namespace shoal

#endif  // SHOAL_COMMON_UPLOAD_GRANT_H_
