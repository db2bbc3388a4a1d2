// Work that can be checked (RunConfig.trust, docs/SECURITY.md "Audits,
// scores and bans"): audits by replay, members' scores, and bans. A part of
// SyncRounds, which calls it at the round's steps and carries out what it
// decides (sending AuditRequests, taking a failed contribution out of the
// round, evicting a banned member).
//
//  - The draw: a (round, participant) pair is audited when
//    SHA-256(secret, round, worker id), read as a number in [0, 1), is below
//    trust.audit_rate. The secret is 32 random bytes of this coordinator
//    start (a fixed one in tests): no participant can tell in advance which
//    of its rounds will be replayed, and every round is as likely as any
//    other (a memoryless draw; a schedule would tell a cheater when it is
//    safe).
//  - The auditor: another participant of the round, ready, with the same
//    replay fingerprint (JoinRequest.replay_fingerprint: build, Torch's CPU
//    kernels, BLAS core, threads), chosen by the same hash among those that
//    audit nobody else yet. No such member: the pair is not audited
//    (counted as dropped).
//  - The verdict: the auditor's replay hash against the participant's
//    contribution_hash. Equal: passed. Different: a second auditor (another
//    candidate) replays the same work, so that one lying or broken auditor
//    cannot get an honest member banned. The second agrees with the
//    participant: the first auditor's replay was wrong and counts against
//    it (as a failed audit). The second agrees with the first: failed; the
//    contribution leaves the round (its samples go back to the ledger) and
//    the participant's score falls by 1. All three differ: dropped, nobody
//    blamed (the replays are not deterministic: a fingerprint is missing
//    something). With no second candidate the first auditor's word decides.
//    Auditors never learn the hash they should find.
//  - Scores start at 1 and never exceed it: a failed audit -1, a passed
//    one +0.02, a hash-vote minority -0.25, bad chunks reported by two
//    members in one round -0.25, an eviction -0.1, a missed ready
//    deadline -0.02 (once for a run of them: a member cut off for many
//    rounds is absent, not lying), a completed round +0.01 (so that an
//    honest member that was slow once earns it back). Below trust.ban_below the member is
//    banned for trust.ban_seconds:
//    evicted (its credential revoked) and its re-joins, by worker id or by
//    name, refused with PERMISSION_DENIED and the reason.
//
// No clock, no I/O, no logging: times come in as arguments. Not
// thread-safe: called under the engine's mutex.
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_ROUND_TRUST_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_ROUND_TRUST_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

// How a member's score moves (docs/SECURITY.md).
enum class TrustEvent {
  kAuditPassed,
  kAuditFailed,
  kHashMinority,
  kMissedDeadline,
  kEvicted,
  kRoundCompleted,
  kBadChunks,
};
double ScoreChange(TrustEvent event);
const char* TrustEventName(TrustEvent event);

// True when (round, worker_id) is audited at `rate` under `secret`.
bool AuditDrawn(const std::string& secret, uint64_t round, const std::string& worker_id,
                double rate);

class RoundTrust {
 public:
  // `secret`: the draw's secret (RandomCredentialSecret() outside tests).
  RoundTrust(const shoal::v1::TrustConfig& config, std::string secret);

  bool audits_on() const { return config_.audit_rate() > 0; }

  // A restarted coordinator keeps the bans of its record.
  void Resume(const shoal::v1::RunRecord& record, absl::Time now);

  // PERMISSION_DENIED, with the reason and until when, for a banned member
  // (by previous_worker_id or name); FAILED_PRECONDITION, when audits are
  // on, for a member with no replay fingerprint (it cannot be replayed).
  absl::Status CheckJoin(const shoal::v1::JoinRequest& request, absl::Time now);
  void OnJoined(const std::string& worker_id, const shoal::v1::JoinRequest& request);
  void Forget(const std::string& worker_id);

  // A round starts: the previous round's audits are over.
  void StartRound(uint64_t round);
  // A participant's ready report; `samples` its ranges of the round.
  void OnReady(const std::string& worker_id, const shoal::v1::ReportReadyRequest& request,
               std::vector<shoal::v1::SampleRange> samples);
  // The participant no longer takes part in the round (sits out, left):
  // audits of its work, or by it, are dropped.
  void LeaveRound(const std::string& worker_id);

  struct Assignment {
    std::string auditor;
    shoal::v1::AuditRequest request;
  };
  // Every participant is ready (`participants`, in order): the audits of
  // the round, once (later calls return none). Pairs drawn but without an
  // auditor are dropped.
  std::vector<Assignment> Assign(uint64_t base_round, const std::string& base_hash,
                                 const std::vector<std::string>& participants);
  // Assign ran for the round and a replay is still out.
  bool Pending() const;
  bool assigned() const { return assigned_; }

  struct Verdict {
    enum class Kind {
      kPassed,
      kFailed,
      kDropped,
      // The replay disagreed: `second` goes to another auditor.
      kSecondOpinion,
      // The second auditor agreed with the participant: `auditor` (the
      // first) replayed wrong.
      kAuditorWrong,
    };
    Kind kind = Kind::kDropped;
    std::string participant;
    std::string auditor;
    // For the log and RoundMissed.
    std::string reason;
    Assignment second;  // kSecondOpinion
  };
  // An auditor's report. NOT_FOUND for an audit that is not out (another
  // round, already settled: a retried call is answered the same way by the
  // caller), PERMISSION_DENIED when `auditor` is not who it was asked of.
  absl::StatusOr<Verdict> OnReport(const std::string& auditor,
                                   const shoal::v1::ReportAuditRequest& report);
  // The audits still out are dropped (`why`: the deadline).
  std::vector<Verdict> DropPending(const std::string& why);

  // Moves `worker_id`'s score. Returns the ban's reason when it fell below
  // trust.ban_below now (the caller evicts it; Ban records it).
  std::string Record(const std::string& worker_id, TrustEvent event, const std::string& detail);
  void Ban(const std::string& worker_id, const std::string& name, const std::string& reason,
           absl::Time now);
  // `reporter` got a bad chunk from `accused` (Heartbeat.bad_chunks_from).
  // True when a second member reports the same one in this round: only
  // then does it count (one member alone could lie about a peer). The
  // names of the reporters so far go to `reporters`.
  bool OnBadChunks(const std::string& reporter, const std::string& accused, std::string* reporters);

  void FillStatus(shoal::v1::RunStatus* s, absl::Time now) const;
  void FillWorker(const std::string& worker_id, shoal::v1::WorkerStatus* w) const;
  void FillRecord(shoal::v1::RunRecord* r, absl::Time now) const;

  uint64_t audits_performed() const { return performed_; }
  uint64_t audits_failed() const { return failed_; }
  uint64_t audits_dropped() const { return dropped_; }

 private:
  struct Score {
    double score = 1;
    // Missed the ready deadline and completed no round since (a run of
    // missed deadlines costs once).
    bool missing = false;
    std::deque<std::string> reasons;  // newest first
    uint64_t passed = 0;
    uint64_t failed = 0;
    uint64_t replayed = 0;
  };
  struct Ready {
    std::string contribution_hash;
    std::vector<shoal::v1::SampleRange> samples;
  };
  struct Out {
    std::string participant;
    std::string auditor;
    // A second opinion: the first auditor and its hash.
    std::string first_auditor;
    std::string first_hash;
    shoal::v1::AuditRequest request;
  };
  void ForgetExpired(absl::Time now);
  // The auditor for `participant`'s work among the ready participants of
  // the same fingerprint, not in `exclude`: the least busy, then by the
  // draw's hash. Empty when none.
  std::string PickAuditor(const std::string& participant, const std::vector<std::string>& exclude,
                          const std::map<std::string, int>& load) const;

  const shoal::v1::TrustConfig config_;
  const std::string secret_;
  std::map<std::string, std::string> fingerprints_;
  std::map<std::string, Score> scores_;
  std::vector<shoal::v1::Ban> bans_;
  uint64_t round_ = 0;
  std::map<std::string, Ready> ready_;
  bool assigned_ = false;
  uint64_t next_audit_id_ = 1;
  std::map<uint64_t, Out> out_;
  // This round's bad-chunk reports: accused -> reporters.
  std::map<std::string, std::vector<std::string>> bad_chunks_;
  uint64_t performed_ = 0;
  uint64_t failed_ = 0;
  uint64_t dropped_ = 0;
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_ROUND_TRUST_H_
