#include "services/coordinator/core/round_decisions.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/staleness.h"

namespace shoal::coordinator {
namespace {

std::string Short(absl::string_view hash) { return std::string(hash.substr(0, 12)); }

// A measured duration in a reason, to the millisecond.
std::string Ms(absl::Duration d) {
  return absl::FormatDuration(absl::Trunc(d, absl::Milliseconds(1)));
}

}  // namespace

uint64_t NextOpenRound(shoal::v1::Phase phase, uint64_t round, bool any_ready) {
  const bool open =
      phase == shoal::v1::WAITING_FOR_MEMBERS || (phase == shoal::v1::TRAINING && !any_ready);
  return open ? round : round + 1;
}

AdmissionDecision DecideAdmission(const AdmissionInput& in) {
  using Action = AdmissionDecision::Action;
  if (in.phase == shoal::v1::FINISHED) return {Action::kReject, 0, "run is finished"};
  const uint64_t requested = in.requested == 0 ? in.round : in.requested;
  if (requested < in.round) {
    return {Action::kReject, 0,
            absl::StrCat("round ", requested, " is stale: the run is at round ", in.round)};
  }
  if (requested > in.round + 1) {
    return {Action::kReject, 0,
            absl::StrCat("round ", requested, " is in the future: the run is at round ", in.round)};
  }
  const bool waiting = in.phase == shoal::v1::WAITING_FOR_MEMBERS;
  if (in.participant) {
    return {Action::kAlreadyIn, in.round,
            absl::StrCat("already a participant of round ", in.round)};
  }
  if (in.queued) {
    const uint64_t r = waiting ? in.round : in.round + 1;
    return {Action::kAlreadyIn, r, absl::StrCat("already queued for round ", r)};
  }
  if (waiting) {
    return {Action::kQueueForThisRound, in.round,
            absl::StrCat("round ", in.round, " has not started: queued for it")};
  }
  if (in.phase == shoal::v1::TRAINING && !in.any_ready && requested == in.round) {
    return {Action::kJoinRunningRound, in.round,
            absl::StrCat("round ", in.round, " is training and nobody is ready yet: joins it")};
  }
  // A worker that trained this round before its session broke (a
  // coordinator failover) reports ready at once: it cannot slow the round
  // down, so the join window does not apply to it.
  if (in.phase == shoal::v1::TRAINING && requested == in.round && in.carried == in.round) {
    return {Action::kJoinRunningRound, in.round,
            absl::StrCat("round ", in.round, " is training and the worker carries its work",
                         " from before its session broke: joins it")};
  }
  std::string why;
  if (requested > in.round) {
    why = absl::StrCat("asked for round ", requested);
  } else if (in.phase == shoal::v1::TRAINING) {
    why = absl::StrCat("a participant of round ", in.round, " is already ready");
  } else {
    why = absl::StrCat("round ", in.round, " is ", shoal::v1::Phase_Name(in.phase));
  }
  return {Action::kQueueForNextRound, in.round + 1,
          absl::StrCat(why, ": queued for round ", in.round + 1)};
}

RoundStartDecision DecideRoundStart(shoal::v1::Phase phase, uint64_t round, size_t queued,
                                    uint32_t min_participants) {
  if (phase != shoal::v1::WAITING_FOR_MEMBERS) {
    return {false, absl::StrCat("round ", round, " is ", shoal::v1::Phase_Name(phase))};
  }
  const size_t min = std::max<uint32_t>(1, min_participants);
  if (queued < min) {
    return {false, absl::StrCat(queued, " of ", min, " participants needed for round ", round)};
  }
  return {true,
          absl::StrCat(queued, " participants queued for round ", round, " (", min, " needed)")};
}

ConnectionBarrierDecision DecideConnectionBarrier(const ConnectionBarrierInput& in,
                                                  ConnectionEvent event,
                                                  uint32_t max_connection_retry) {
  using Action = ConnectionBarrierDecision::Action;
  const bool all_reported = in.reported >= in.participants;
  if (all_reported && in.reported_unreachable == 0) {
    return {Action::kStartSharing,
            absl::StrCat("all ", in.participants, " participants reached their peers")};
  }
  std::string state;
  if (!all_reported) {
    state = absl::StrCat(in.reported, "/", in.participants, " participants reported");
    if (event == ConnectionEvent::kReport) return {Action::kWait, std::move(state)};
    state = absl::StrCat("connection deadline passed with ", state);
  } else {
    state = absl::StrCat("all ", in.participants, " participants reported, ",
                         in.reported_unreachable, " with unreachable peers");
  }
  if (in.retries < max_connection_retry) {
    return {Action::kRetry,
            absl::StrCat(state, ": retry ", in.retries + 1, "/", max_connection_retry)};
  }
  // The text of ConnectionFail.
  return {Action::kEvictFailing,
          absl::StrCat("could not connect with the peers of round ", in.round, " after ",
                       max_connection_retry, " retries")};
}

FailingPeers FindFailingPeers(absl::Span<const PeerReport> participants) {
  std::map<std::string, int, std::less<>> named;
  int reporters = 0;
  for (const PeerReport& p : participants) {
    if (!p.reported) continue;
    ++reporters;
    for (const std::string& u : p.unreachable) ++named[u];
  }
  FailingPeers result;
  std::vector<std::string> silent, shunned;
  for (const PeerReport& p : participants) {
    const int others = reporters - (p.reported ? 1 : 0);
    const auto it = named.find(p.worker_id);
    const int n = it == named.end() ? 0 : it->second;
    if (!p.reported) {
      silent.emplace_back(p.worker_id);
    } else if (n > 0 && 2 * n > others) {
      shunned.emplace_back(p.worker_id);
    } else {
      continue;
    }
    result.failing.emplace_back(p.worker_id);
  }
  if (!result.failing.empty()) {
    std::vector<std::string> parts;
    if (!silent.empty()) {
      parts.push_back(absl::StrCat("did not report: ", absl::StrJoin(silent, ",")));
    }
    if (!shunned.empty()) {
      parts.push_back(absl::StrCat("unreachable for a majority of the reporting peers: ",
                                   absl::StrJoin(shunned, ",")));
    }
    result.reason = absl::StrJoin(parts, "; ");
    return result;
  }
  const size_t others = participants.empty() ? 0 : participants.size() - 1;
  for (const PeerReport& p : participants) {
    if (2 * p.unreachable.size() > others) result.failing.emplace_back(p.worker_id);
  }
  if (!result.failing.empty()) {
    result.reason = absl::StrCat("cannot reach most of the other participants: ",
                                 absl::StrJoin(result.failing, ","));
    return result;
  }
  for (const auto& [id, n] : named) {
    if (n > 0) result.failing.push_back(id);
  }
  if (!result.failing.empty()) {
    result.reason = absl::StrCat("no majority names anyone; named unreachable at least once: ",
                                 absl::StrJoin(result.failing, ","));
    return result;
  }
  result.reason = "every participant reported and nobody is unreachable";
  return result;
}

HashVote DecideHashVote(absl::Span<const HashReport> reports) {
  HashVote vote;
  if (reports.empty()) {
    vote.reason = "no participant reported a hash";
    return vote;
  }
  std::map<absl::string_view, size_t> votes;
  for (const HashReport& r : reports) ++votes[r.model_hash];
  absl::string_view hash;
  size_t best = 0;
  for (const auto& [h, n] : votes) {
    if (n > best) best = n, hash = h;
  }
  if (votes.size() > 1 && 2 * best <= reports.size()) {
    // The text of RoundAborted.
    vote.reason = "participants reported different model hashes with no majority";
    return vote;
  }
  vote.outcome = HashVote::Outcome::kAgreed;
  vote.hash = std::string(hash);
  for (const HashReport& r : reports) {
    if (r.model_hash != hash) vote.minority.emplace_back(r.worker_id);
  }
  vote.reason =
      absl::StrCat(best, " of ", reports.size(), " participants agree on hash ", Short(hash));
  if (!vote.minority.empty()) {
    absl::StrAppend(&vote.reason, "; out of sync: ", absl::StrJoin(vote.minority, ","));
  }
  return vote;
}

RoundStage StageOf(shoal::v1::Phase phase, bool sharing_started) {
  switch (phase) {
    case shoal::v1::TRAINING:
      return RoundStage::kTraining;
    case shoal::v1::SHARING:
      return sharing_started ? RoundStage::kSharing : RoundStage::kConnecting;
    case shoal::v1::FINISHED:
      return RoundStage::kFinished;
    default:
      return RoundStage::kWaitingForMembers;
  }
}

absl::Duration MedianDuration(std::vector<absl::Duration> samples) {
  if (samples.empty()) return absl::ZeroDuration();
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  return n % 2 == 1 ? samples[n / 2] : (samples[n / 2 - 1] + samples[n / 2]) / 2;
}

ReadyDeadlineDecision DecideReadyDeadline(const ReadyDeadlineInput& in,
                                          const AdaptiveDeadlineOptions& options, absl::Time now) {
  ReadyDeadlineDecision d;
  d.deadline = in.hard_deadline;
  const std::string timeout =
      absl::StrCat("--round_timeout=", absl::FormatDuration(options.round_timeout));
  if (!options.enabled) {
    d.reason = absl::StrCat(timeout, " (adaptive deadline off)");
    return d;
  }
  if (in.measured.empty()) {
    d.reason =
        absl::StrCat(timeout, ": no participant measured in ", options.after_rounds, " rounds yet");
    return d;
  }
  const absl::Duration median = MedianDuration(in.measured);
  absl::Duration basis = median;
  std::string basis_text =
      absl::StrCat("median ready time ", Ms(median), " of ", in.measured.size(), "/",
                   in.participants, " measured participants");
  if (in.first_ready.has_value() && *in.first_ready > median) {
    basis = *in.first_ready;
    basis_text = absl::StrCat("first ready report of this round after ", Ms(basis), " (median ",
                              Ms(median), ")");
  }
  // A factor below 1 would leave out the median participant itself.
  const double factor = std::max(1.0, options.factor);
  absl::Duration budget = basis * factor;
  std::string clamp;
  if (budget < options.floor) {
    budget = options.floor;
    clamp = absl::StrCat(", floor ", absl::FormatDuration(options.floor));
  }
  const absl::Time adaptive = in.round_started + budget;
  if (adaptive >= in.hard_deadline || budget >= options.round_timeout) {
    d.reason = absl::StrCat(timeout, ": ", factor, " x ", basis_text, " is not shorter");
    return d;
  }
  if (!in.first_ready.has_value() && now >= adaptive) {
    d.reason = absl::StrCat(timeout, ": nobody ready by the adaptive deadline ", Ms(budget),
                            "; waiting for the first ready report");
    return d;
  }
  d.deadline = adaptive;
  d.adaptive = true;
  d.reason = absl::StrCat("adaptive ", Ms(budget), " = ", factor, " x ", basis_text, clamp);
  return d;
}

RoundDeadlineDecision DecideRoundDeadline(const RoundDeadlineInput& in,
                                          absl::Duration round_timeout, absl::Time now) {
  using Action = RoundDeadlineDecision::Action;
  RoundDeadlineDecision d;
  if (in.stage == RoundStage::kWaitingForMembers || in.stage == RoundStage::kFinished) {
    d.reason = "no deadline in this phase";
    return d;
  }
  if (now < in.deadline) {
    d.reason = absl::StrCat("deadline in ", absl::FormatDuration(in.deadline - now));
    return d;
  }
  switch (in.stage) {
    case RoundStage::kTraining:
      d.adaptive = in.adaptive;
      if (in.late.size() == in.participants) {
        d.action = Action::kKeepWaiting;
        d.reason = in.adaptive
                       ? "no participant ready by the adaptive deadline; waiting up to "
                         "--round_timeout"
                       : absl::StrCat("no participant ready after ",
                                      absl::FormatDuration(round_timeout), "; still waiting");
        return d;
      }
      d.action = Action::kSitOut;
      d.sit_out = in.late;
      d.reason = in.adaptive
                     ? absl::StrCat("not ready within the adaptive deadline (", in.adaptive_reason,
                                    "; --round_timeout=", absl::FormatDuration(round_timeout),
                                    " is its upper bound)")
                     : absl::StrCat("not ready within --round_timeout=",
                                    absl::FormatDuration(round_timeout));
      return d;
    case RoundStage::kConnecting:
      d.action = Action::kConnectionBarrier;
      d.reason = "connection deadline passed";
      return d;
    case RoundStage::kSharing:
      if (in.late.size() == in.participants) {
        d.action = Action::kAbort;
        d.reason = "no participant finished sharing within --round_timeout";
        return d;
      }
      d.action = Action::kSitOut;
      d.sit_out = in.late;
      d.reason = "did not finish sharing within --round_timeout";
      return d;
    default:
      return d;
  }
}

MissedRoundDecision DecideMissedRound(const MissedRoundInput& in, uint32_t max_missed_rounds,
                                      absl::string_view why) {
  MissedRoundDecision d;
  if (in.adaptive && in.alive) {
    d.counts = false;
    d.missed_in_row = in.missed_before;
    d.reason = std::string(why);
    return d;
  }
  d.missed_in_row = in.missed_before + 1;
  if (max_missed_rounds > 0 && d.missed_in_row >= max_missed_rounds) {
    d.evict = true;
    d.reason = absl::StrCat("missed ", d.missed_in_row, " rounds in a row (last: ", why, ")");
    return d;
  }
  d.reason = std::string(why);
  return d;
}

LeaseDecision DecideLease(bool session_open, absl::Time last_seen, absl::Duration heartbeat_lease,
                          absl::Duration session_grace, absl::Time now) {
  const absl::Duration silent = now - last_seen;
  if (session_open && silent > heartbeat_lease) {
    return {true, absl::StrCat("no heartbeat for ", absl::FormatDuration(silent))};
  }
  if (!session_open && silent > session_grace) {
    return {true, absl::StrCat("no session opened within ", absl::FormatDuration(session_grace))};
  }
  return {false, "lease holds"};
}

CheckpointWatchDecision DecideCheckpointWatch(const CheckpointWatch& in,
                                              absl::Duration checkpoint_timeout, absl::Time now) {
  if (in.pending_round == 0) return {false, "no upload in progress"};
  if (!in.worker_active) {
    return {true, absl::StrCat("uploader ", in.worker_id, " of round ", in.pending_round,
                               " is no member any more")};
  }
  if (now - in.since > checkpoint_timeout) {
    return {true, absl::StrCat("upload of round ", in.pending_round, " by ", in.worker_id,
                               " not reported within ", absl::FormatDuration(checkpoint_timeout))};
  }
  return {false,
          absl::StrCat("upload of round ", in.pending_round, " by ", in.worker_id, " in progress")};
}

CheckpointUploaderDecision DecideCheckpointUploader(absl::Span<const CheckpointCandidate> members,
                                                    const std::set<std::string>& tried,
                                                    uint32_t checkpointers) {
  using Action = CheckpointUploaderDecision::Action;
  const size_t attempts = std::max<uint32_t>(1, checkpointers) + 2;
  if (tried.size() >= attempts) {
    return {Action::kGiveUp, "",
            absl::StrCat("failed ", tried.size(), " times (at most ", attempts, " attempts)")};
  }
  for (const CheckpointCandidate& c : members) {
    if (!c.holds_model || tried.count(std::string(c.worker_id))) continue;
    return {Action::kAssign, std::string(c.worker_id),
            absl::StrCat(c.worker_id, " holds the model and was not tried yet")};
  }
  return {Action::kNoneLeft, "", "no untried worker holds the model"};
}

// ------------------------------------------------------------ Late work

absl::StatusOr<FoldedReady> CheckFoldedReady(const FoldedReadyInput& in) {
  if (!in.fold_late_work) {
    return absl::FailedPreconditionError(
        "this run drops late work (--fold_late_work=false): train the round instead");
  }
  if (in.folded_base_round > in.base_round) {
    return absl::InvalidArgumentError(
        absl::StrCat("late work from base round ", in.folded_base_round,
                     " is newer than the round's base ", in.base_round));
  }
  if (in.folded_trained_round <= in.folded_base_round || in.folded_trained_round > in.round) {
    return absl::InvalidArgumentError(
        absl::StrCat("late work trained for round ", in.folded_trained_round, " from base round ",
                     in.folded_base_round, " cannot be folded into round ", in.round));
  }
  FoldedReady out;
  out.staleness = in.base_round - in.folded_base_round;
  if (out.staleness > in.max_staleness) {
    return absl::InvalidArgumentError(absl::StrCat("late work of staleness ", out.staleness,
                                                   " exceeds --max_staleness=", in.max_staleness));
  }
  out.weight = StalenessWeight(out.staleness, in.max_staleness);
  if (!(std::fabs(in.folded_weight - out.weight) <= 1e-12)) {
    return absl::InvalidArgumentError(absl::StrCat("folded_weight ", in.folded_weight,
                                                   " differs from the rule's ", out.weight,
                                                   " for staleness ", out.staleness));
  }
  return out;
}

}  // namespace shoal::coordinator
