// Member credentials (docs/SECURITY.md, "Member credentials"): only current
// members of a run read its model from peers.
//
// The coordinator (with --token_file) gives each member a fresh random
// credential at every Join. The worker sends it with every Peer call as
// metadata `x-shoal-member: <worker_id>:<credential>`. Peers learn which
// credentials are current from the coordinator's MemberUpdate messages on
// their session stream, and refuse slice, snapshot, manifest and model-file
// reads with anything else: PERMISSION_DENIED. A re-join replaces the
// worker's credential; a removal (Leave, eviction, lost session) revokes it.
//
// Three parts:
//  - MemberRoster (coordinator, inside the RoundEngine): issues and revokes,
//    and makes the MemberUpdate messages. Not thread-safe (the engine's lock).
//  - MemberSet (each worker's Peer service): the current credentials as the
//    worker heard them, and the check. Thread-safe.
//  - MemberCredentialHolder (each worker's clients): the credential this
//    worker sends. Thread-safe.
// No gRPC types here (the RoundEngine uses the roster); the two ends of the
// metadata are in member_credentials_grpc.h.
//
// A credential's text is "<epoch>.<version>.<64 hex digits>": the roster's
// epoch (one per coordinator start), the roster version at which it was
// issued, and 32 random bytes. Rosters and sets keep only SHA-256 digests of
// whole credential texts and compare them in constant time.
//
// Why versions: a worker that joins late reads from peers right after its
// Join, possibly before they heard of it. A peer asked with a credential of
// a version it has not reached yet answers UNAVAILABLE (the readers retry
// that), never PERMISSION_DENIED; it refuses only credentials it knows are
// not current: a version up to which it heard every change (its full list,
// then each change in turn) or at or below what it heard about that worker.
#ifndef SHOAL_COMMON_MEMBER_CREDENTIALS_H_
#define SHOAL_COMMON_MEMBER_CREDENTIALS_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal {

// The metadata key of a member's credential: "<worker_id>:<credential>".
inline constexpr char kMemberMetadataKey[] = "x-shoal-member";

// A parsed credential text.
struct ParsedCredential {
  uint64_t epoch = 0;
  uint64_t version = 0;
};
// INVALID_ARGUMENT unless `text` is "<epoch>.<version>.<64 hex digits>".
absl::StatusOr<ParsedCredential> ParseCredential(absl::string_view text);

// 32 random bytes from OpenSSL's RAND_bytes, as 64 hex digits.
std::string RandomCredentialSecret();

// Issues and revokes the credentials of one coordinator start. Not
// thread-safe: the RoundEngine calls it under its lock.
class MemberRoster {
 public:
  // `epoch` identifies this coordinator start (e.g. its start time in
  // microseconds; must not be 0); `secret` makes the random part (tests
  // inject a deterministic one).
  MemberRoster(uint64_t epoch, std::function<std::string()> secret = RandomCredentialSecret);

  // A new credential for `worker_id`, replacing any it had. `update` gets
  // the change (one entry) for the other members.
  std::string Issue(const std::string& worker_id, shoal::v1::MemberUpdate* update);
  // Revokes `worker_id`'s credential; false (and no update) when it has none.
  bool Revoke(const std::string& worker_id, shoal::v1::MemberUpdate* update);
  // Every current member, for a session that opens.
  shoal::v1::MemberUpdate Full() const;

  uint64_t epoch() const { return epoch_; }
  uint64_t version() const { return version_; }
  size_t size() const { return current_.size(); }

 private:
  struct Entry {
    uint64_t version;
    std::string digest;  // SHA-256 of the credential text, 32 bytes
  };
  const uint64_t epoch_;
  const std::function<std::string()> secret_;
  uint64_t version_ = 0;
  std::map<std::string, Entry> current_;
};

// The credentials a worker's Peer service accepts, as its session heard
// them. Thread-safe. Off (every call allowed) until Enable(): a worker turns
// it on when its Join returned a credential, i.e. the run checks members.
class MemberSet {
 public:
  void Enable();
  bool enabled() const;
  // Applies a MemberUpdate (any order; a full list of another epoch starts
  // over, a change of another epoch is ignored).
  void Apply(const shoal::v1::MemberUpdate& update);

  // OK when `worker_id` holds the current credential `credential`;
  // PERMISSION_DENIED when the credential is malformed, of an earlier
  // coordinator start, or superseded or revoked as far as this set knows;
  // UNAVAILABLE (retry) when the set has no list yet, the credential comes
  // from a later coordinator start, or it is newer than what the set heard.
  absl::Status Check(absl::string_view worker_id, absl::string_view credential) const;
  // The same from the value of a call's x-shoal-member metadata,
  // "<worker_id>:<credential>" (nullopt: the call has none:
  // PERMISSION_DENIED). OK for every call while not enabled.
  absl::Status CheckHeader(std::optional<absl::string_view> value) const;

  // Roster version and members currently accepted (tests, logs).
  uint64_t version() const;
  size_t size() const;

 private:
  struct Entry {
    uint64_t version = 0;
    std::string digest;  // empty = revoked
  };
  mutable absl::Mutex mu_;
  bool enabled_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;  // 0 = no list yet
  // Every change up to this version is known (a full list, then each change
  // in turn: the roster makes one change per version, and a member's
  // session hears every one after its full list). A credential of a version
  // up to it that matches no entry is not current, whatever worker id it
  // names.
  uint64_t complete_ ABSL_GUARDED_BY(mu_) = 0;
  // Changes heard beyond complete_ (out of order), until the gap fills.
  std::set<uint64_t> ahead_ ABSL_GUARDED_BY(mu_);
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
};

// The credential this worker sends with its Peer calls. Thread-safe.
class MemberCredentialHolder {
 public:
  void Set(const std::string& worker_id, const std::string& credential);
  // "<worker_id>:<credential>" (the x-shoal-member value), or empty.
  std::string Value() const;

 private:
  mutable absl::Mutex mu_;
  std::string value_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal

#endif  // SHOAL_COMMON_MEMBER_CREDENTIALS_H_
