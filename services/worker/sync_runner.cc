#include "services/worker/sync_runner.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/sha256.h"
#include "common/shard_plan.h"
#include "common/status_util.h"
#include "services/worker/audit_replay.h"
#include "services/worker/core/trainer.h"
#include "services/worker/core/transfer_checks.h"
#include "services/worker/gossip_checkpointer.h"
#include "services/worker/worker_metrics.h"

namespace shoal::worker {
namespace {

WorkerProtocol::Options ProtocolOptions(const RunnerParts& parts) {
  WorkerProtocol::Options p;
  p.advertise = parts.identity.advertise;
  p.replay_fingerprint = parts.identity.replay_fingerprint;
  p.name = parts.identity.name;
  p.zone = parts.identity.zone;
  p.outbound_only = parts.identity.outbound_only;
  p.clock = parts.clock;
  return p;
}

}  // namespace

SyncRunner::SyncRunner(RunnerHost* host, RunnerParts parts, const std::string& initial_hash)
    : host_(host), parts_(std::move(parts)), protocol_(ProtocolOptions(parts_)) {
  protocol_.SetInitialModel(initial_hash);
}

absl::Status SyncRunner::OnJoined(const shoal::v1::JoinResponse& joined,
                                  std::optional<absl::Status>* exit) {
  Actions next = protocol_.OnJoined(joined);
  for (Action& a : next) {
    if (a.kind == Action::kOpenSession) {
      RETURN_IF_ERROR(host_->OpenSession());
      continue;
    }
    if (a.kind == Action::kJoinRound) {
      RETURN_IF_ERROR(host_->JoinRound(protocol_.carried_round()));
      continue;
    }
    Actions more;
    *exit = ExecuteOne(a, &more);
    if (exit->has_value()) return absl::OkStatus();
    if (!more.empty()) *exit = Execute(std::move(more));
    if (exit->has_value()) return absl::OkStatus();
  }
  return absl::OkStatus();
}

absl::Status SyncRunner::Run() {
  while (true) {
    if (host_->StopRequested()) {
      parts_.stop->Cancel();
      if (parts_.local != nullptr) parts_.local->Stop();
      if (std::optional<absl::Status> exit =
              Execute(protocol_.OnStopRequested(host_->StopReason())))
        return *exit;
      return absl::OkStatus();
    }
    WorkerEvent event;
    // The shutdown queues an event too: the timeout only bounds the wait.
    if (!host_->PopEvent(&event, absl::Seconds(1))) continue;
    Actions actions;
    if (event.kind == WorkerEvent::kStop) continue;
    if (event.kind == WorkerEvent::kSessionClosed) {
      if (host_->StopRequested()) continue;
      actions = protocol_.OnSessionClosed(event.status);
    } else {
      actions = protocol_.OnDirective(event.message);
    }
    if (std::optional<absl::Status> exit = Execute(std::move(actions))) return *exit;
  }
}

std::optional<absl::Status> SyncRunner::Execute(Actions actions) {
  std::deque<Action> queue(std::make_move_iterator(actions.begin()),
                           std::make_move_iterator(actions.end()));
  while (!queue.empty()) {
    Action action = std::move(queue.front());
    queue.pop_front();
    Actions next;
    std::optional<absl::Status> exit = ExecuteOne(action, &next);
    if (exit.has_value()) return exit;
    // A result's follow-ups come before what was queued after the action.
    queue.insert(queue.begin(), std::make_move_iterator(next.begin()),
                 std::make_move_iterator(next.end()));
  }
  return std::nullopt;
}

std::optional<absl::Status> SyncRunner::ExecuteOne(Action& a, Actions* next) {
  SHOAL_VLOG(2) << "action " << ActionName(a.kind) << " round " << a.round;
  host_->CountServedBytes();
  switch (a.kind) {
    case Action::kJoin:
      return host_->Join(a.join);
    case Action::kOpenSession:
    case Action::kJoinRound:
      // Only inside OnJoined (they belong to one join attempt).
      return std::nullopt;
    case Action::kRejoin:
      host_->CloseSession();
      // The plan of a coordinator that is gone: a new leader may plan the
      // same round and attempt, and its readers must not get these bytes.
      WithdrawPublished();
      return std::nullopt;
    case Action::kCatchUp:
      return CatchUp(a, next);
    case Action::kTrain:
      return Train(a, next);
    case Action::kReportReady:
      return ReportReady(a, next);
    case Action::kContributeAgain:
      parts_.memory->ContributeAgain(a.round);
      return std::nullopt;
    case Action::kServePlan:
      // The round's exchange is under way: the steps ahead go on.
      if (parts_.local != nullptr) parts_.local->Release();
      for (const auto& s : a.plan.slices()) {
        if (s.worker_id() == protocol_.worker_id()) {
          parts_.memory->ServePlan(a.round, a.attempt, s.begin(), s.end());
        }
      }
      return std::nullopt;
    case Action::kProbe:
      return Probe(a, next);
    case Action::kExchange:
      return RunExchange(a, next);
    case Action::kHoldPending:
      parts_.memory->HoldPending(a.round, a.hash);
      // The steps ahead move onto this round's average at once (not at
      // the next round's start): fewer of them are stale.
      if (parts_.local != nullptr) parts_.local->Post(parts_.memory->parameters());
      return std::nullopt;
    case Action::kCommit:
      parts_.memory->CommitPending(a.round);
      parts_.averaging->outer->Commit(a.round);
      if (parts_.averaging->is_encoded()) parts_.averaging->PublishOuterState(a.round);
      return std::nullopt;
    case Action::kVoid:
      parts_.memory->VoidPending(a.round, a.hash);
      WithdrawPublished();
      return std::nullopt;
    case Action::kDropWork:
      parts_.memory->DropWork(a.round);
      return std::nullopt;
    case Action::kKeepLateWork:
      parts_.memory->KeepLateWork(a.round);
      return std::nullopt;
    case Action::kFoldLateWork:
      parts_.memory->FoldLateWork(a.round, a.weight);
      return std::nullopt;
    case Action::kDropLateWork:
      parts_.memory->DropLateWork();
      return std::nullopt;
    case Action::kReportDone:
      return ReportDone(a, next);
    case Action::kUpload:
      Upload(a);
      return std::nullopt;
    case Action::kLeave:
      host_->Leave(a.reason);
      return std::nullopt;
    case Action::kAudit:
      return Audit(a, next);
    case Action::kExit:
      host_->CloseSession();
      if (parts_.local != nullptr) {
        parts_.local->Stop();
        if (Overlapped()) {
          SHOAL_LOG(INFO) << "overlapped rounds: " << parts_.local->carried()
                          << " carried the steps trained ahead (" << parts_.local->merged_early()
                          << " took the average before their last step), "
                          << parts_.local->restarted() << " trained from their base";
        } else {
          SHOAL_LOG(INFO) << "fragment rounds: " << parts_.local->carried()
                          << " carried the local progress, " << parts_.local->restarted()
                          << " restarted the local model from their base";
        }
      }
      return a.status;
  }
  return std::nullopt;
}

// kCatchUp: pull the round's model (and the outer momentum) into the snapshot buffer.
std::optional<absl::Status> SyncRunner::CatchUp(Action& a, Actions* next) {
  const absl::Time t0 = parts_.clock->Now();
  uint64_t pulled = 0;
  absl::Status s = parts_.memory->CatchUp(a.round, a.hash, protocol_.model_round(),
                                          [&](float* dst, uint64_t total) {
                                            pulled = total * sizeof(float);
                                            RETURN_IF_ERROR(PullModel(a, dst, total));
                                            return PullOuterState(a);
                                          });
  if (pulled > 0) {
    (s.ok() ? M().catchups_ok : M().catchups_failed).Add();
    if (s.ok()) {
      M().catchup_bytes.Add(static_cast<double>(pulled));
      M().catchup_seconds.Observe(absl::ToDoubleSeconds(parts_.clock->Now() - t0));
    }
  }
  if (s.ok()) {
    SHOAL_LOG(INFO) << absl::StrFormat("caught up to round %d in %.2fs (%d MiB)", a.round,
                                       absl::ToDoubleSeconds(parts_.clock->Now() - t0),
                                       parts_.memory->total() * sizeof(float) >> 20);
  }
  *next = protocol_.OnCaughtUp(a.round, a.hash, s);
  return std::nullopt;
}

// kTrain: the round's local steps (or, with a local model, its progress).
std::optional<absl::Status> SyncRunner::Train(Action& a, Actions* next) {
  const absl::Time t0 = parts_.clock->Now();
  parts_.trainer->SetRound(a.round);
  if (protocol_.config().training().sample_ledger()) {
    // The coordinator's samples of this round (a trainer that cannot
    // take them was refused at join).
    if (absl::Status s = parts_.trainer->SetSamples(a.samples); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("round ", a.round, ": ", s.message()));
    }
  }
  std::string contribution_hash;
  // Overlapped rounds: the steps were (mostly) trained ahead, while the
  // last round was averaged; their own duration is the round's.
  double train_seconds = -1;
  const double loss = parts_.memory->Train(a.round, [&](float* params) {
    const uint32_t steps = protocol_.config().training().local_steps();
    double l = 0;
    if (parts_.local != nullptr) {
      const uint32_t fragments = protocol_.config().exchange().fragments();
      const SliceRange fragment = FragmentOf(parts_.trainer->num_elements(), fragments, a.round);
      const LocalTraining::Round r =
          parts_.local->TrainRound(a.round, protocol_.model_round(), steps, params, fragment);
      l = r.loss;
      train_seconds = r.train_seconds;
      round_note_.clear();
      if (fragments > 1) {
        absl::StrAppend(&round_note_, " fragment=", a.round % fragments, "/", fragments);
      }
      if (parts_.local->overlapped()) {
        absl::StrAppend(&round_note_, " stale=",
                        r.use == AheadUse::kCarry ? absl::StrCat(r.stale_steps, "/", r.steps)
                                                  : std::string("0"));
      }
    } else {
      l = parts_.trainer->TrainSteps(steps);
    }
    if (parts_.options->contribution_transform) {
      parts_.options->contribution_transform(a.round, params, parts_.trainer->num_elements());
    }
    if (protocol_.config().trust().audit_rate() > 0) {
      // What an audit's replay must reproduce: the contribution as served.
      contribution_hash = HashParameters(params, parts_.trainer->num_elements());
    }
    return l;
  });
  if (host_->StopRequested()) {
    // Training ended early for the shutdown: leave without reporting
    // the unfinished round.
    parts_.stop->Cancel();
    *next = protocol_.OnStopRequested(host_->StopReason());
    return std::nullopt;
  }
  if (train_seconds < 0) train_seconds = absl::ToDoubleSeconds(parts_.clock->Now() - t0);
  M().train_seconds.Observe(train_seconds);
  M().seconds_training.Add(train_seconds);
  M().train_loss.Set(loss);
  M().rounds_in_flight.Set(Overlapped() ? 2 : 1);
  *next = protocol_.OnTrained(a.round, loss, parts_.trainer->num_elements(), contribution_hash,
                              parts_.local != nullptr ? train_seconds : -1);
  return std::nullopt;
}

// kReportReady.
std::optional<absl::Status> SyncRunner::ReportReady(Action& a, Actions* next) {
  absl::Status s = parts_.coordinator->ReportReady(a.ready);
  if (s.ok()) SHOAL_VLOG(1) << "round " << a.round << " ready, loss " << a.ready.train_loss();
  if (s.ok() && a.resumed) {
    SHOAL_LOG(INFO) << "round " << a.round
                    << ": ready report accepted for the work trained before the coordinator "
                       "session was lost (round not trained again)";
  }
  *next = protocol_.OnReadyReported(a.round, s);
  return std::nullopt;
}

// kProbe: every peer of the plan at once, then ConnectionsReady.
std::optional<absl::Status> SyncRunner::Probe(Action& a, Actions* next) {
  shoal::v1::ConnectionsReadyRequest req;
  req.set_worker_id(protocol_.worker_id());
  req.set_round(a.round);
  req.set_attempt(a.attempt);
  for (std::string& id : UnreachablePeers(a.plan, a.retry)) req.add_unreachable(std::move(id));
  absl::Status s = parts_.coordinator->ConnectionsReady(req);
  if (!s.ok()) SHOAL_LOG(WARNING) << "connections-ready refused: " << s.message();
  return std::nullopt;
}

// kExchange: the averager on the plan, with its metrics.
std::optional<absl::Status> SyncRunner::RunExchange(Action& a, Actions* next) {
  std::string hash;
  const absl::Time t0 = parts_.clock->Now();
  absl::Status s = Exchange(a, &hash);
  M().seconds_exchanging.Add(absl::ToDoubleSeconds(parts_.clock->Now() - t0));
  if (s.ok()) {
    M().exchanges_ok.Add();
    M().exchange_seconds.Observe(absl::ToDoubleSeconds(parts_.clock->Now() - t0));
  } else {
    M().exchanges_failed.Add();
  }
  M().received_bytes.Add(static_cast<double>(last_stats_.bytes_received));
  M().retries.Add(last_stats_.retries);
  *next = protocol_.OnExchanged(a.round, a.attempt, s, hash);
  return std::nullopt;
}

// kReportDone: evaluate when asked, log the round's line, ReportRoundDone.
std::optional<absl::Status> SyncRunner::ReportDone(Action& a, Actions* next) {
  shoal::v1::ReportRoundDoneRequest done = a.done;
  if (a.evaluate) *done.mutable_metrics() = Evaluate();
  if (done.metrics().evaluated()) {
    M().test_accuracy.Set(done.metrics().test_accuracy());
    M().test_loss.Set(done.metrics().test_loss());
  }
  M().model_round.Set(static_cast<double>(a.round));
  M().rounds_in_flight.Set(Overlapped() ? 1 : 0);
  const double ratio =
      last_stats_.raw_bytes_received > 0
          ? static_cast<double>(last_stats_.bytes_received) / last_stats_.raw_bytes_received
          : 1.0;
  done.set_bytes_received(last_stats_.bytes_received);
  done.set_bytes_sent(last_stats_.bytes_published);
  done.set_compression_ratio(ratio);
  // Fragments: a short hash of each fragment of the agreed model, so a
  // reader of the logs sees which ones this round moved (its own only).
  std::string parts;
  if (const uint32_t k = protocol_.config().exchange().fragments(); k > 1) {
    std::vector<std::string> hashes;
    for (uint32_t f = 0; f < k; ++f) {
      const SliceRange r = FragmentOf(parts_.memory->total(), k, f);
      hashes.push_back(
          HashParameters(parts_.memory->parameters() + r.begin, r.end - r.begin).substr(0, 8));
    }
    parts = absl::StrCat(" parts=", absl::StrJoin(hashes, "/"));
  }
  zone_measurements_.AddTraining(done.train_seconds(), protocol_.config().training().local_steps());
  zone_measurements_.AddTransfer(last_stats_.reduce_bytes, last_stats_.reduce_seconds);
  done.set_step_seconds(zone_measurements_.step_seconds());
  done.set_bandwidth_bytes_per_second(zone_measurements_.bandwidth_bytes_per_second());
  // What the coordinator sizes bandwidth-proportional slices by (only
  // read when the run does).
  if (protocol_.config().exchange().slice_sizing() == "bandwidth") {
    for (const PeerReadTiming& r : last_stats_.peer_reads) {
      shoal::v1::PeerRead* read = done.add_peer_reads();
      read->set_worker_id(r.worker_id);
      read->set_bytes(r.bytes);
      read->set_seconds(r.seconds);
    }
  }
  SHOAL_LOG(INFO) << absl::StrFormat(
      "round %d: train_loss=%.4f%s train=%.2fs exchange=%.3fs (%d KiB in, %d retries) "
      "wire_in=%d wire_out=%d ratio=%.4f codec=%s%s%s hash=%s",
      a.round, protocol_.train_loss(),
      done.metrics().evaluated()
          ? absl::StrFormat(" test_accuracy=%.4f test_loss=%.4f", done.metrics().test_accuracy(),
                            done.metrics().test_loss())
          : "",
      done.train_seconds(), done.exchange_seconds(), last_stats_.bytes_received / 1024,
      last_stats_.retries, last_stats_.bytes_received, last_stats_.bytes_published, ratio,
      parts_.averaging->codec->name(),
      last_stats_.stage_bytes_received.empty()
          ? std::string()
          : absl::StrCat(" stage_in=", absl::StrJoin(last_stats_.stage_bytes_received, "/"),
                         last_stats_.stages_carried > 0
                             ? absl::StrCat(" carried=", last_stats_.stages_carried)
                             : ""),
      round_note_ + parts, a.hash.substr(0, 12));
  absl::Status r = parts_.coordinator->ReportRoundDone(done);
  if (!r.ok()) SHOAL_LOG(WARNING) << "report of round " << a.round << " refused: " << r.message();
  return std::nullopt;
}

// kAudit: replay another participant's round from the agreed base.
std::optional<absl::Status> SyncRunner::Audit(Action& a, Actions* next) {
  const absl::Time t0 = parts_.clock->Now();
  // The snapshot buffer holds the agreed model: the pending round's
  // base while an average is pending, else the model itself.
  ReplayAudit(parts_, protocol_.worker_id(),
              protocol_.pending() ? protocol_.agreed_round() : protocol_.model_round(),
              protocol_.pending() ? protocol_.agreed_hash() : protocol_.model_hash(), a.audit)
      .IgnoreError();  // logged; the coordinator drops an audit it never hears of
  M().seconds_auditing.Add(absl::ToDoubleSeconds(parts_.clock->Now() - t0));
  return std::nullopt;
}

shoal::v1::Metrics SyncRunner::Evaluate() {
  if (parts_.local == nullptr) return parts_.trainer->Evaluate();
  // The trainer's own model is the local one: the agreed model (the
  // round's average) is evaluated on a second instance.
  absl::StatusOr<shoal::v1::Metrics> m =
      parts_.trainer->EvaluateParams(parts_.memory->parameters());
  if (m.ok()) return *m;
  SHOAL_LOG(WARNING) << "evaluation of the averaged model failed: " << m.status();
  return shoal::v1::Metrics();
}

std::vector<std::string> SyncRunner::UnreachablePeers(const shoal::v1::RoundPlan& plan,
                                                      uint32_t retry) {
  // Report within the coordinator's connection timeout.
  absl::Duration budget = parts_.options->probe_timeout;
  const uint32_t connection_timeout_ms = protocol_.config().timeouts().connection_timeout_ms();
  if (connection_timeout_ms > 0) {
    budget = std::min(budget, absl::Milliseconds(connection_timeout_ms) / 2);
  }
  std::vector<int> probed;
  std::vector<std::string> addresses;
  for (int k = 0; k < plan.slices_size(); ++k) {
    // Nobody connects to a participant behind NAT: it pushes to the owners.
    if (plan.slices(k).worker_id() == protocol_.worker_id() || plan.slices(k).outbound_only()) {
      continue;
    }
    probed.push_back(k);
    addresses.push_back(plan.slices(k).peer_address());
  }
  // Every probe at once, awaited together (no thread per peer).
  const std::vector<absl::Status> results = parts_.peers->ProbeAll(addresses, budget);
  std::vector<std::string> unreachable;
  for (size_t i = 0; i < probed.size(); ++i) {
    if (results[i].ok()) continue;
    const auto& slice = plan.slices(probed[i]);
    SHOAL_LOG(WARNING) << "round " << plan.round() << ": cannot reach " << slice.worker_id() << " ("
                       << results[i].message() << ")"
                       << (retry ? absl::StrCat(", retry ", retry) : "");
    unreachable.push_back(slice.worker_id());
  }
  return unreachable;
}

absl::Status SyncRunner::Exchange(const Action& a, std::string* hash) {
  CancellationToken token(parts_.stop);
  // A directive that interrupts this exchange may already be queued: then
  // the token is cancelled at once.
  host_->SetInterruptible(&token);
  last_stats_ = {};
  absl::Status s = parts_.averaging->averager->Average(
      a.plan, protocol_.worker_id(), parts_.memory->exchange_target(), &token, &last_stats_);
  host_->SetInterruptible(nullptr);
  if (s.ok()) *hash = HashParameters(parts_.memory->parameters(), parts_.memory->total());
  return s;
}

absl::Status SyncRunner::PullOuterState(const Action& a) {
  if (!parts_.averaging->outer->has_state()) return absl::OkStatus();
  if (a.round == 0) {
    // The initial model's momentum is zero.
    RETURN_IF_ERROR(
        parts_.averaging->outer->SetMomentum(0, std::vector<float>(parts_.memory->total(), 0.0f)));
    parts_.averaging->PublishOuterState(0);
    return absl::OkStatus();
  }
  const uint64_t bytes = parts_.memory->total() * sizeof(float);
  absl::Status last =
      absl::UnavailableError(absl::StrCat("no peer holds the outer momentum of round ", a.round));
  for (const std::string& holder : a.holders) {
    EncodedAssembly blob(a.round, bytes, bytes,
                         absl::StrCat("outer momentum of round ", a.round, " from ", holder));
    absl::Status s;
    while (s.ok() && !blob.done()) {
      shoal::v1::ReadEncodedRequest request;
      request.set_round(a.round);
      request.set_kind(shoal::v1::SNAPSHOT);
      request.set_begin(0);
      request.set_end(parts_.memory->total());
      request.set_offset(blob.offset());
      request.set_reader_id(protocol_.worker_id());
      absl::StatusOr<shoal::v1::EncodedPiece> piece = parts_.peers->ReadEncoded(
          holder, request, parts_.options->sync.piece_timeout, parts_.stop);
      s = piece.ok() ? blob.Add(*piece) : piece.status();
    }
    if (!s.ok()) {
      SHOAL_LOG(WARNING) << "outer momentum of round " << a.round << " from " << holder << ": "
                         << s.message();
      last = s;
      continue;
    }
    std::vector<float> m(parts_.memory->total());
    std::memcpy(m.data(), blob.bytes().data(), bytes);
    RETURN_IF_ERROR(parts_.averaging->outer->SetMomentum(a.round, m));
    parts_.averaging->PublishOuterState(a.round);
    SHOAL_LOG(INFO) << "outer momentum of round " << a.round << " pulled from " << holder;
    return absl::OkStatus();
  }
  // Like the model: the checkpoint store serves what no peer can (a restart
  // of the whole run from the store).
  if (parts_.store != nullptr && !a.checkpoint_id.empty()) {
    absl::Status s = LoadOuterStateFromCheckpoint(a);
    if (s.ok() || a.holders.empty()) return s;
    SHOAL_LOG(WARNING) << "outer momentum of round " << a.round << " from checkpoint "
                       << a.checkpoint_id << ": " << s.message();
  }
  return last;
}

absl::Status SyncRunner::LoadOuterStateFromCheckpoint(const Action& a) {
  absl::StatusOr<shoal::v1::Manifest> manifest = parts_.store->GetManifest(a.checkpoint_id);
  if (!manifest.ok()) return Annotate(manifest.status(), "checkpoint store");
  if (manifest->round() != a.round) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", a.checkpoint_id, " is of round ", manifest->round(), ", not ", a.round));
  }
  const int layer = checkpoint::FindStateLayer(*manifest, kMomentumLayer);
  if (layer < 0) {
    // Only a checkpoint of a run without a stateful outer optimizer lacks
    // it (a nesterov worker does not upload without it): the momentum of
    // a model reached without momentum is zero, the same on every worker.
    SHOAL_LOG(WARNING) << "checkpoint " << a.checkpoint_id
                       << " carries no outer momentum (its run had no nesterov): starting from "
                          "zero momentum at round "
                       << a.round;
    RETURN_IF_ERROR(parts_.averaging->outer->SetMomentum(
        a.round, std::vector<float>(parts_.memory->total(), 0.0f)));
    parts_.averaging->PublishOuterState(a.round);
    return absl::OkStatus();
  }
  const shoal::v1::LayerEntry& entry = manifest->layers(layer);
  if (entry.dtype() != "float32" || entry.bytes() != parts_.memory->total() * sizeof(float)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", a.checkpoint_id, ": outer momentum of ", entry.bytes(), " bytes of ",
        entry.dtype(), ", the model has ", parts_.memory->total(), " float32 parameters"));
  }
  std::vector<uint8_t> got;
  RETURN_IF_ERROR(checkpoint::ReadWholeLayer(parts_.store, a.checkpoint_id, *manifest,
                                             static_cast<uint32_t>(layer), &got));
  std::vector<float> m(parts_.memory->total());
  std::memcpy(m.data(), got.data(), got.size());
  RETURN_IF_ERROR(parts_.averaging->outer->SetMomentum(a.round, m));
  parts_.averaging->PublishOuterState(a.round);
  // The digest of what the optimizer now holds (equal to the layer's, which
  // ReadWholeLayer checked): tests compare it with the manifest's.
  const std::vector<float>& held = parts_.averaging->outer->momentum();
  SHOAL_LOG(INFO) << "outer momentum of round " << a.round << " loaded from checkpoint "
                  << a.checkpoint_id << " (sha256 "
                  << Sha256Hex(held.data(), held.size() * sizeof(float)) << ")";
  return absl::OkStatus();
}

absl::Status SyncRunner::PullModel(const Action& a, float* dst, uint64_t total) {
  SHOAL_LOG(INFO) << "catching up: pulling the model of round " << a.round << " from "
                  << a.holders.size() << " peers";
  // Peers first; the checkpoint store serves what no peer can.
  CheckpointFallback fallback;
  if (parts_.store != nullptr && !a.checkpoint_id.empty()) {
    fallback.client = parts_.store;
    fallback.checkpoint_id = a.checkpoint_id;
    if (a.holders.empty()) {
      SHOAL_LOG(INFO) << "no peer holds round " << a.round << "; loading checkpoint "
                      << a.checkpoint_id << " from the store";
    }
  }
  SyncOptions options = parts_.options->sync;
  options.stop = parts_.stop;
  ModelSyncer syncer(parts_.peers, options);
  return syncer.Sync(a.round, a.hash, a.holders, dst, total, protocol_.worker_id(),
                     parts_.sync_progress, fallback);
}

void SyncRunner::Upload(const Action& a) {
  const shoal::v1::CheckpointRequest& request = a.checkpoint;
  shoal::v1::ReportCheckpointRequest report;
  report.set_worker_id(protocol_.worker_id());
  report.set_round(request.round());
  if (parts_.store == nullptr) {
    report.set_error("this worker has no checkpoint store configured");
  } else if (!a.reason.empty()) {
    report.set_error(a.reason);
  } else {
    const shoal::v1::RunConfig& config = protocol_.config();
    shoal::v1::Manifest manifest;
    manifest.set_run_id(request.run_id());
    manifest.set_round(request.round());
    manifest.set_model(config.model().name());
    manifest.set_model_sha256(request.model_hash());
    // The sample ledger as of this round: a run resumed from here continues it.
    if (request.has_ledger()) *manifest.mutable_ledger() = request.ledger();
    const uint64_t seen =
        request.round() * config.training().local_steps() * config.training().batch_size();
    manifest.set_epoch(parts_.trainer->shard_size() ? seen / parts_.trainer->shard_size() : 0);
    std::vector<checkpoint::ByteSpan> spans;
    AppendModelLayers(parts_.trainer->layers(), parts_.memory->snapshot(), &manifest, &spans);
    absl::Status s;
    if (parts_.averaging->outer->has_state()) {
      // The outer momentum of this model travels with it (a restart from
      // the store resumes it): one flat float32 layer after the model's.
      const std::vector<float>& m = parts_.averaging->outer->momentum();
      if (parts_.averaging->outer->momentum_round() != request.round()) {
        s = absl::FailedPreconditionError(absl::StrCat(
            "the outer momentum held is of round ", parts_.averaging->outer->momentum_round(),
            ", the checkpoint is of round ", request.round()));
      }
      auto* entry = manifest.add_layers();
      entry->set_name(kMomentumLayer);
      entry->set_dtype("float32");
      entry->add_shape(static_cast<int64_t>(m.size()));
      entry->set_optimizer_state(true);
      spans.push_back({reinterpret_cast<const uint8_t*>(m.data()), m.size() * sizeof(float)});
    }
    const absl::Time t0 = parts_.clock->Now();
    if (s.ok()) s = checkpoint::CompleteManifest(&manifest, spans);
    absl::StatusOr<shoal::v1::CheckpointInfo> info =
        s.ok() ? parts_.store->Upload(manifest, spans)
               : absl::StatusOr<shoal::v1::CheckpointInfo>(s);
    (info.ok() ? M().uploads_ok : M().uploads_failed).Add();
    if (info.ok()) {
      M().upload_seconds.Observe(absl::ToDoubleSeconds(parts_.clock->Now() - t0));
      report.set_checkpoint_id(info->id());
      const int state = checkpoint::FindStateLayer(manifest, kMomentumLayer);
      SHOAL_LOG(INFO) << absl::StrFormat(
          "checkpoint %s of round %d uploaded in %.2fs%s", info->id(), request.round(),
          absl::ToDoubleSeconds(parts_.clock->Now() - t0),
          state < 0 ? ""
                    : absl::StrCat(" with the outer momentum (sha256 ",
                                   manifest.layers(state).sha256(), ")"));
    } else {
      report.set_error(info.status().ToString());
      SHOAL_LOG(WARNING) << "checkpoint upload of round " << request.round()
                         << " failed: " << info.status();
    }
  }
  absl::Status s = parts_.coordinator->ReportCheckpoint(report);
  if (!s.ok()) SHOAL_LOG(WARNING) << "checkpoint report refused: " << s.message();
}

}  // namespace shoal::worker
