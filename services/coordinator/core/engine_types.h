// What every part of the coordinator's engine shares (round_engine.h and the
// parts it is made of: membership, sync_rounds, gossip_peers, topology,
// checkpoint_planner): its options, the directives it returns, and the two
// versions that say what changed (EngineVersions).
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_ENGINE_TYPES_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_ENGINE_TYPES_H_

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "services/coordinator/core/round_decisions.h"
#include "services/coordinator/core/zone_election.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

struct EngineOptions {
  shoal::v1::RunConfig config;
  std::string run_id;
  // A member whose session sent nothing for this long is removed.
  absl::Duration heartbeat_lease = absl::Seconds(10);
  // A joined worker that opens no session within this time is removed.
  absl::Duration session_grace = absl::Seconds(10);
  // Participants not ready this long after the round started sit the round
  // out; the same deadline applies to the exchange after sharing starts.
  absl::Duration round_timeout = absl::Seconds(120);
  // Time for every participant to report ConnectionsReady for a plan.
  absl::Duration connection_timeout = absl::Seconds(10);
  // Connection retries of one plan before the failing peers are evicted.
  uint32_t max_connection_retry = 3;
  // A worker that misses this many rounds in a row is asked to leave
  // (0 = never). Misses of the adaptive deadline by a live worker do not
  // count.
  uint32_t max_missed_rounds = 5;
  // The ready deadline from the participants' measured ready times
  // (DecideReadyDeadline); its round_timeout is taken from round_timeout
  // above. enabled = false keeps the fixed round_timeout.
  AdaptiveDeadlineOptions adaptive_deadline;
  // Largest number of members at once (--max_members); a new worker past it
  // is refused with RESOURCE_EXHAUSTED (a member re-joining under its id is
  // not new). 0 = no limit.
  uint32_t max_members = 0;
  // The service probes each joining worker's Peer address with a TCP
  // connect this long (--probe_joiners_timeout); a worker it cannot reach
  // is outbound-only (behind NAT: docs/SUPERNODES.md). 0 = no probe (only
  // workers that declare --outbound_only are).
  absl::Duration join_probe_timeout = absl::ZeroDuration();
  // Removed members stay visible in the status, up to this many (the
  // status counts the others: RunStatus.departed_not_shown).
  size_t max_departed_shown = 50;
  // Members that joined and opened no session yet, at most
  // (--max_pending_joins): a new worker's Join past it is refused with
  // UNAVAILABLE (it retries). Bounds what Joins that are never followed
  // up add to the status, however many arrive (docs/SECURITY.md
  // "Limits"). 0 = no limit.
  size_t max_pending_joins = 256;
  // Workers asked to upload each checkpoint, one after the other until one
  // succeeds (the first holder by id, then the next).
  uint32_t checkpointers = 1;
  // An upload not reported within this time moves to another worker.
  absl::Duration checkpoint_timeout = absl::Seconds(120);
  // Where the run continues from (a persisted record), if anywhere.
  std::optional<shoal::v1::RunRecord> resume;
  // Replicas (--etcd): called (under the engine's lock) with the run record
  // as it stands and its record_version() right before a round would start;
  // false = do not start it now (the record cannot be written under this
  // leader's term, or its lease is uncertain). The round starts on a later
  // event or HoldRounds(false). Unset = rounds start freely.
  std::function<bool(const shoal::v1::RunRecord&, uint64_t version)> before_round_start;
  // The supernode election (docs/SUPERNODES.md): hysteresis factor and
  // rounds (--supernode_switch_factor, --supernode_switch_rounds).
  ElectionOptions election;
  // Member credentials (common/member_credentials.h; on with --token_file):
  // every Join returns a fresh credential, and every member's session hears
  // which credentials are current (MemberUpdate). Off = no credentials.
  bool member_credentials = false;
  // Makes the random part of each credential (tests); RandomCredentialSecret
  // when unset.
  std::function<std::string()> credential_secret;
  // The secret of the audit draw (core/round_trust.h; --audit_seed in
  // tests); empty = 32 random bytes at each start.
  std::string audit_secret;
  // The secret shared with the checkpoint store (--upload_key_file; empty =
  // no grants): every CheckpointRequest carries an upload grant signed with
  // it (common/upload_grant.h), valid for checkpoint_timeout plus a minute
  // (gossip: gossip_grant_ttl, for every later sequence of the run).
  std::string upload_key;
  absl::Duration gossip_grant_ttl = absl::Hours(24);
};

// A message for one worker's session stream. Immutable and shared: a
// broadcast (RoundStart with its holders, RoundPlan with one slice per
// participant) is built once and every recipient's Directive points at the
// same object. Copying an O(N) message per recipient made each round O(N^2);
// the service also serializes each shared message only once.
using SharedMessage = std::shared_ptr<const shoal::v1::CoordinatorMessage>;
struct Directive {
  std::string worker_id;
  SharedMessage message;
};
using Directives = std::vector<Directive>;

inline SharedMessage Share(shoal::v1::CoordinatorMessage msg) {
  return std::make_shared<const shoal::v1::CoordinatorMessage>(std::move(msg));
}

// A SHA-256 digest as the engine takes it: 64 lowercase hex digits.
inline bool IsHexSha256(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return std::isxdigit(static_cast<unsigned char>(c)) &&
                  !std::isupper(static_cast<unsigned char>(c));
         });
}

// The engine's two versions and what the call in progress changed. The
// parts mark what they change (a status change: anything Status() shows but
// the passing of time; a record change: anything Record() holds, which is a
// status change too); the versions move only in Commit and CommitRecord,
// so that a public call of the engine moves the status version at most
// once however many parts it went through (the record version also moves
// in CommitRecord, before a round start hands the record out).
//
// Not thread-safe: owned by RoundEngine under its mutex, like the parts.
class EngineVersions {
 public:
  void MarkStatusChanged() { status_changed_ = true; }
  void MarkRecordChanged() { record_changed_ = true; }
  // A record change marked so far gets its version now (the status version
  // still moves once, at Commit). Before a round start hands the record out
  // (EngineOptions::before_round_start): the record handed out is known by
  // its own version, not by the one of the state before it.
  void CommitRecord() {
    if (!record_changed_) return;
    ++record_version_;
    record_changed_ = false;
    status_changed_ = true;
  }
  // When a public call returns (RoundEngine::Changes): moves each version
  // once if the call changed what it counts.
  void Commit() {
    CommitRecord();
    if (status_changed_) ++status_version_;
    status_changed_ = false;
  }
  uint64_t record_version() const { return record_version_; }
  uint64_t status_version() const { return status_version_; }

 private:
  uint64_t record_version_ = 1;
  uint64_t status_version_ = 1;
  bool record_changed_ = false;
  bool status_changed_ = false;
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_ENGINE_TYPES_H_
