// The worker's side of the round protocol, as a state machine with no gRPC
// types, threads or I/O: it takes the coordinator's directives and the
// results of the worker's own work, and returns the actions to carry out.
// `Worker` (services/worker/worker.cc) carries them out in order and
// reports each result back; it makes no protocol decision of its own.
//
// What it tracks:
//  - round_: the round being worked on; model_round_ / model_hash_: the
//    averaged model the worker holds;
//  - pending: from the end of this worker's exchange until the coordinator
//    settles the round. Meanwhile the parameters hold the round's average
//    (served to peers catching up as the snapshot) and the snapshot buffer
//    keeps the previous agreed model (agreed_round_, agreed_hash_):
//      commit (kCommit): RoundComplete naming the round and hash, a later
//        RoundStart / CheckpointRequest / JoinResponse naming it or a newer
//        round;
//      void (kVoid): a new plan attempt of the round, RoundAborted,
//        RoundMissed, or an agreed model of that round with another hash;
//  - a new plan attempt after a participant was lost: the parameters, as
//    the last attempt's exchange left them (per element the trained value,
//    or that attempt's average where it came), are the contribution again
//    (kContributeAgain): no copy of the trained model is kept;
//  - the participant list of the latest full plan (PlanList), which
//    expands plans that name it by version;
//  - late work (RunConfig.sync.fold_late_work): the update of a round whose
//    ready report came after the deadline (trained minus its base, kept by
//    kKeepLateWork) until it is folded into a later round. At the next
//    RoundStart the worker pulls the newest model as usual, does not train,
//    and contributes base + w(s) x update (kFoldLateWork, StalenessWeight in
//    common/staleness.h, s = the round's base round minus the update's base
//    round), reporting ready at once with the fold's base round and weight.
//    The update is let go when that round is committed (kDropLateWork); when
//    the round is voided, aborted or missed again it stays and is folded
//    into the next round with its staleness grown; staler than
//    max_staleness it is dropped and the worker trains.
//  - carried work: when the session breaks (or the ready report finds a
//    coordinator that does not know this worker) after the worker trained
//    round_, the trained model is kept across the re-join instead of being
//    dropped, in the parameters: once a plan came they hold, per element,
//    the trained value or the interrupted exchange's average (a pending
//    average is contributed as it is unless the coordinator completed the
//    round). JoinRound
//    names it (carried_round); a RoundStart of that round from the same
//    base (a new leader reopening the round its record did not complete)
//    is answered with the ready report at once, after kContributeAgain
//    when needed, so the round is not trained twice. Any other outcome
//    (another base, a later round) drops it (kDropWork) first.
//
// Memory actions (kCommit, kVoid, kDropWork, kContributeAgain,
// kHoldPending, kCatchUp, kTrain, kKeepLateWork,
// kFoldLateWork, kDropLateWork) are carried out by
// the model memory owner (core/model_memory.h), which closes windows and
// waits for lent chunks by itself.
//
// Not thread-safe: the worker's main thread owns it. Time comes from the
// injected clock (train and exchange durations in the reports).
#ifndef SHOAL_SERVICES_WORKER_CORE_WORKER_PROTOCOL_H_
#define SHOAL_SERVICES_WORKER_CORE_WORKER_PROTOCOL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/staleness.h"
#include "services/worker/core/plan_list.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::worker {

struct Action {
  enum Kind {
    // Join the run (Join with previous_id, held round and hash), then
    // feed the response to OnJoined.
    kJoin,
    // Open the session stream (heartbeats, directives; before a join's
    // catch-up, so a joiner pulling a big model keeps its membership and
    // its heartbeats show the pull's progress); a failure means: join
    // again.
    kOpenSession,
    // On the open session, ask for the earliest open round (JoinRound(0,
    // carried_round())); after the join's catch-up. A failure means: join
    // again.
    kJoinRound,
    // Pull the averaged model of (round, hash) from `holders` (the store's
    // checkpoint `checkpoint_id` when it is of that round), then OnCaughtUp.
    kCatchUp,
    // Train local_steps of `round` from the current parameters, then
    // OnTrained.
    kTrain,
    // ReportReady(round, train_loss), then OnReadyReported.
    kReportReady,
    // A new plan attempt: the parameters as the last attempt left them are
    // the contribution again.
    kContributeAgain,
    // Serve the plan (own slice) and the contribution of `round`.
    kServePlan,
    // Probe the plan's peers, then ConnectionsReady(round, attempt) with
    // the unreachable ones (`retry` is the coordinator's retry count).
    kProbe,
    // Run the averager on `plan`, then OnExchanged.
    kExchange,
    // The exchange's average becomes the served model (round, hash),
    // pending; the snapshot buffer keeps the agreed model.
    kHoldPending,
    // The pending round is agreed: the snapshot buffer takes its average.
    kCommit,
    // The pending round is void: back to the agreed model (round, hash)
    // whose bytes the snapshot buffer still holds.
    kVoid,
    // Local work of `round` is discarded: the parameters go back to the
    // snapshot buffer's model.
    kDropWork,
    // The work of `round` came too late: keep its update (parameters minus
    // the snapshot buffer's model, its base), then the parameters go back
    // to that base.
    kKeepLateWork,
    // Contribution of `round` without training: the parameters become the
    // snapshot buffer's model (the round's base) + `weight` x the kept
    // update.
    kFoldLateWork,
    // The kept update is folded into an agreed round (or too stale): free
    // it.
    kDropLateWork,
    // ReportRoundDone(round, attempt, hash, durations, metrics when
    // `evaluate`).
    kReportDone,
    // Upload the snapshot for `checkpoint`, or report `reason` as the
    // error when this worker cannot.
    kUpload,
    // The session is gone or unusable: close it and join again.
    kRejoin,
    // Leave the run (graceful shutdown).
    kLeave,
    // Stop: the run is over for this worker with `status`.
    kExit,
    // Replay another participant's round (`audit`) and ReportAudit the
    // hash (services/worker/audit_replay.h). Nothing of this worker's own
    // state changes.
    kAudit,
  };
  Kind kind;
  uint64_t round = 0;
  uint32_t attempt = 0;
  uint32_t retry = 0;
  std::string hash;
  std::string reason;
  bool evaluate = false;
  double weight = 0;  // kFoldLateWork
  std::vector<std::string> holders;
  std::string checkpoint_id;
  uint64_t checkpoint_round = 0;
  shoal::v1::RoundPlan plan;  // kServePlan, kProbe, kExchange
  // kTrain with the sample ledger: the round's samples (RoundStart.samples).
  std::vector<shoal::v1::SampleRange> samples;
  shoal::v1::CheckpointRequest checkpoint;  // kUpload
  shoal::v1::ReportReadyRequest ready;      // kReportReady
  shoal::v1::ReportRoundDoneRequest done;   // kReportDone (metrics added by the worker)
  shoal::v1::JoinRequest join;              // kJoin
  shoal::v1::AuditRequest audit;            // kAudit
  absl::Status status;                      // kExit
  // kReportReady of work carried across a re-join (not trained again).
  bool resumed = false;
};
using Actions = std::vector<Action>;

const char* ActionName(Action::Kind kind);

class WorkerProtocol {
 public:
  struct Options {
    std::string advertise;  // this worker's peer address (not a catch-up source)
    std::string name;
    // Sent in JoinRequest.zone (common/zone.h).
    std::string zone;
    // Sent in JoinRequest.outbound_only.
    bool outbound_only = false;
    // Sent in JoinRequest.replay_fingerprint.
    std::string replay_fingerprint;
    const Clock* clock = nullptr;  // the real clock when null
  };
  explicit WorkerProtocol(Options options);

  // The first join (previous_id empty) or a re-join.
  Actions Start();
  // The coordinator's answer to kJoin. FAILED_PRECONDITION (as kExit) when
  // a re-join finds another run configuration.
  Actions OnJoined(const shoal::v1::JoinResponse& joined);
  // The last round whose ledger samples this worker recorded ("ledger: round
  // R trained samples ..."): an agreed round whose model this worker's own
  // exchange computed. 0: none yet.
  uint64_t ledger_recorded_round() const { return ledger_recorded_round_; }
  // One directive from the session stream.
  Actions OnDirective(const shoal::v1::CoordinatorMessage& message);
  // The session stream ended (not asked for by this worker).
  Actions OnSessionClosed(const absl::Status& why);
  // kOpenSession failed: join again.
  Actions OnSessionOpenFailed(const absl::Status& why);
  // Shutdown requested (SIGTERM, or the Python API's close): leave with
  // `reason`.
  Actions OnStopRequested(const std::string& reason = "worker shut down");

  // Results of actions.
  Actions OnCaughtUp(uint64_t round, const std::string& hash, const absl::Status& result);
  // `contribution_hash`: SHA-256 of the contribution as served, in audited
  // runs (ReportReadyRequest.contribution_hash); empty otherwise.
  // `train_seconds` >= 0: how long the steps trained (overlapped rounds
  // train them before the round starts); < 0: since the round started.
  Actions OnTrained(uint64_t round, double train_loss, uint64_t total_elements,
                    const std::string& contribution_hash = "", double train_seconds = -1);
  Actions OnReadyReported(uint64_t round, const absl::Status& result);
  Actions OnExchanged(uint64_t round, uint32_t attempt, const absl::Status& result,
                      const std::string& hash);

  // True for directives that make a running exchange pointless (the worker
  // cancels it at once, from the session's reader thread).
  static bool Interrupts(const shoal::v1::CoordinatorMessage& message);

  const std::string& worker_id() const { return worker_id_; }
  const shoal::v1::RunConfig& config() const { return config_; }
  uint64_t round() const { return round_; }
  uint64_t model_round() const { return model_round_; }
  const std::string& model_hash() const { return model_hash_; }
  bool pending() const { return pending_; }
  uint64_t agreed_round() const { return agreed_round_; }
  const std::string& agreed_hash() const { return agreed_hash_; }
  const shoal::v1::RoundPlan& plan() const { return plan_; }
  const PlanList& plan_list() const { return plan_list_; }
  double train_seconds() const { return train_seconds_; }
  double train_loss() const { return train_loss_; }
  bool joined() const { return !worker_id_.empty(); }
  // The round whose trained work is carried across a re-join (0 = none):
  // JoinRoundRequest.carried_round.
  uint64_t carried_round() const { return carried_.round; }
  // Rounds whose ready report was sent from carried work (not retrained).
  uint64_t resumed_rounds() const { return resumed_rounds_; }

  // Late work (see the class comment).
  struct LateWork {
    bool held = false;
    uint64_t trained_round = 0;  // the round it was trained for and missed
    uint64_t base_round = 0;     // the model round it was trained from
    double train_seconds = 0;    // how long that training took
    uint64_t folded_into = 0;    // round it is reported folded into, 0 = none yet
    uint64_t staleness = 0;      // of that fold
    double weight = 0;
  };
  const LateWork& late_work() const { return late_; }
  uint64_t rounds_sat_out_for_base() const { return rounds_sat_out_for_base_; }
  // Late updates kept, folded into committed rounds, dropped (too stale,
  // or folding off and the work refused).
  uint64_t late_kept() const { return late_kept_; }
  uint64_t late_folded() const { return late_folded_; }
  uint64_t late_dropped() const { return late_dropped_; }

  // The initial model (round 0) and its hash, set by the worker once it
  // built the model after the first join.
  void SetInitialModel(const std::string& hash);

 private:
  Actions OnRoundStart(const shoal::v1::RoundStart& start);
  Actions OnRoundPlan(shoal::v1::RoundPlan plan);
  Actions OnStartSharing(const shoal::v1::StartWeightSharing& start);
  Actions OnCheckpointRequest(const shoal::v1::CheckpointRequest& request);
  // The coordinator names the run's agreed model.
  void Settle(uint64_t agreed_round, const std::string& agreed_hash, Actions* out);
  void Commit(Actions* out);
  void Void(const std::string& why, Actions* out);
  void DropRound(const std::string& why, Actions* out);
  // The round's own work: fold held late work, or train.
  void StartWork(Actions* out);
  // False when no catch-up is needed or possible (nothing pushed).
  bool CatchUp(uint64_t round, const std::string& hash, std::vector<std::string> holders,
               const std::string& checkpoint_id, uint64_t checkpoint_round, Actions* out);
  Actions Rejoin(const std::string& why);
  // The ready report of round_ from its trained model (OnTrained, or
  // carried work when `resumed`).
  Action ReadyAction(bool resumed) const;
  // The session is lost: keep round_'s trained work for the re-join
  // (carried_) when there is some, else drop the round's work.
  void CarryOrDrop(Actions* out);
  // The carried work cannot be used: the parameters go back to the agreed
  // model (kDropWork) unless a settled round replaced them already.
  void DiscardCarried(const std::string& why, Actions* out);
  // At a RoundStart with late work held: fold it (true, actions added) or
  // drop it when too stale (false: the worker trains).
  bool FoldLateWork(uint64_t base_round, Actions* out);

  Options options_;
  const Clock* clock_;

  std::string worker_id_;
  shoal::v1::RunConfig config_;
  bool has_config_ = false;
  uint32_t data_rank_ = 0;
  bool has_data_rank_ = false;
  uint64_t round_ = 0;
  uint64_t model_round_ = 0;
  std::string model_hash_;
  bool pending_ = false;
  uint64_t agreed_round_ = 0;
  std::string agreed_hash_;
  uint64_t contribution_round_ = 0;
  shoal::v1::RoundPlan plan_;
  PlanList plan_list_;
  absl::Time train_started_ = absl::InfinitePast();
  absl::Time exchange_started_ = absl::InfinitePast();
  double train_seconds_ = 0;
  std::string contribution_hash_;  // of the round trained last (audited runs)
  double train_loss_ = 0;
  uint64_t total_elements_ = 0;
  LateWork late_;
  // Base round of round_ (RoundStart.base_model_round).
  uint64_t round_base_ = 0;
  // The round whose work (train or fold) waits for the catch-up in flight
  // (0 = none).
  uint64_t work_after_catch_up_ = 0;
  // Rounds sat out because the base could not be pulled; the round whose
  // ready report says so (0 = none), and the checkpoint the catch-up in
  // flight reads (empty: holders only).
  uint64_t rounds_sat_out_for_base_ = 0;
  uint64_t base_reported_round_ = 0;
  std::string catch_up_checkpoint_;
  // The sample ledger's ranges of round_ (RoundStart.samples), and those of
  // the round this worker trained, logged when that round is agreed with the
  // model this worker's own exchange computed (averaged_round_): a model
  // that came from elsewhere (a catch-up, a void back to the agreed one)
  // does not hold this worker's samples.
  std::vector<shoal::v1::SampleRange> round_samples_;
  std::vector<shoal::v1::SampleRange> trained_samples_;
  uint64_t trained_samples_round_ = 0;
  uint64_t averaged_round_ = 0;
  uint64_t ledger_recorded_round_ = 0;
  uint64_t late_kept_ = 0;
  uint64_t late_folded_ = 0;
  uint64_t late_dropped_ = 0;
  bool leaving_ = false;
  // Hash of round_base_ (RoundStart.base_model_hash).
  std::string round_base_hash_;
  // round_ when its local training finished here (0 = not trained, or the
  // work was dropped).
  uint64_t trained_round_ = 0;
  // Work carried across a re-join (see the class comment).
  struct Carried {
    uint64_t round = 0;  // 0 = none
    uint64_t base_round = 0;
    std::string base_hash;
    // A plan came: the parameters were served (and maybe partly averaged)
    // in an attempt, and are served again as a new contribution.
    bool in_contribution = false;
  };
  Carried carried_;
  uint64_t resumed_rounds_ = 0;
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_WORKER_PROTOCOL_H_
