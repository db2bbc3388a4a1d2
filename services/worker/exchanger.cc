#include "services/worker/exchanger.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/sha256.h"
#include "common/status_util.h"
#include "services/worker/core/aggregation.h"
#include "services/worker/fan_out.h"
#include "services/worker/memory_transport.h"

namespace shoal::worker {
namespace {

const Fp32Codec kFp32;

bool ChangesTravel(const Codec& codec, const OuterStep* outer) {
  return !codec.raw() || (outer != nullptr && outer->options().kind != OuterOptimizer::kNone);
}

const char* KindName(const GroupStep& step) {
  return step.kind == GroupStep::Kind::kAverage ? "AVERAGE" : "BROADCAST";
}

}  // namespace

Exchanger::Exchanger(PeerClient* peers, ModelState* state, ExchangeOptions options,
                     ExchangeParts parts)
    : peers_(peers),
      state_(state),
      options_(options),
      clock_(options.clock != nullptr ? options.clock : RealClock::Get()),
      codec_(parts.codec != nullptr ? parts.codec : &kFp32),
      parts_(parts),
      changes_(ChangesTravel(*codec_, parts.outer)) {}

absl::Status Exchanger::Average(const shoal::v1::RoundPlan& plan, const std::string& self_id,
                                float* params, CancellationToken* cancel, AveragingStats* stats) {
  absl::StatusOr<std::vector<GroupStep>> steps = PlanSteps(plan, self_id, state_->total_elements());
  if (!steps.ok()) return steps.status();
  const bool flat = !plan.has_hierarchy() || plan.hierarchy().stages_size() == 0;
  if (flat) {
    const GroupStep& step = steps->front();
    state_->SetPlan(plan.round(), plan.attempt(), step.own().begin, step.own().end);
    for (const GroupMember& m : step.members) {
      if (m.outbound_only && options_.push_box == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat(m.id, " is behind NAT and this exchanger takes no pushes"));
      }
    }
    // Pushes of earlier rounds will never be taken.
    if (options_.push_box != nullptr) options_.push_box->DropBefore(plan.round());
  }
  if ((changes_ || !flat) && parts_.store == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(flat ? absl::StrCat("codec ", codec_->name(), " or an outer optimizer")
                          : std::string("a hierarchical round"),
                     " needs the encoded store"));
  }
  if (changes_ && (parts_.outer == nullptr || parts_.base == nullptr)) {
    return absl::FailedPreconditionError(
        "the exchange of changes needs the base and the outer step");
  }
  StepCounters counters;
  StepCall call;
  call.round = plan.round();
  call.attempt = plan.attempt();
  call.self_id = self_id;
  call.deadline = clock_->Now() + options_.timeout;
  call.clock = clock_;
  call.counters = &counters;
  call.pacer = options_.pacer;
  AveragingStats local;
  if (stats == nullptr) stats = &local;
  *stats = AveragingStats();
  absl::Status result;
  if (flat && !changes_) {
    const SliceIo io = Io();
    MemoryTransport transport(io, state_, codec_);
    AggregationSpec applied = options_.aggregation;
    result = RunAverageStep(steps->front(), params, params, options_.aggregation, &transport, call,
                            cancel, &applied);
    if (result.ok()) NoteRule(call.round, 0, steps->front(), applied);
  } else {
    result = AverageBlobs(*steps, call, FragmentRange(plan), flat, params, cancel, stats);
  }
  stats->bytes_received = counters.received.load();
  stats->raw_bytes_received = counters.raw_received.load();
  stats->bytes_published = counters.published.load();
  stats->retries = counters.retries.load();
  stats->reduce_bytes = counters.reduce_bytes.load();
  stats->reduce_seconds = counters.reduce_seconds;
  {
    absl::MutexLock lock(&counters.reads_mu);
    stats->peer_reads = std::move(counters.peer_reads);
  }
  return result;
}

float* Exchanger::RoundInput(uint64_t round, bool flat, float* params) {
  const uint64_t total = state_->total_elements();
  // A new trained model (or the first attempt of a round): not a new
  // attempt's.
  const uint64_t trainings = state_->trainings();
  const bool fresh = round != input_round_ || trainings != input_trainings_;
  input_round_ = round;
  input_trainings_ = trainings;
  auto change_of = [&](std::vector<float>* out) {
    out->resize(total);
    for (uint64_t i = 0; i < total; ++i) (*out)[i] = params[i] - parts_.base[i];
  };
  if (!flat) {
    // A hierarchical round carries the groups of an earlier attempt whose
    // input did not change: every attempt starts from the round's input,
    // kept whole (the one model-sized copy hierarchy adds).
    if (fresh) {
      if (changes_) {
        change_of(&kept_input_);
      } else {
        kept_input_.assign(params, params + total);
      }
    }
    if (!changes_) {
      std::memcpy(params, kept_input_.data(), total * sizeof(float));
      return params;
    }
    change_ = kept_input_;
    return change_.data();
  }
  kept_input_ = {};
  if (!changes_) return params;
  // What travels is the change from the agreed base. A new attempt of the
  // round exchanges the change as the failed attempt left it (per element
  // this worker's change, or that attempt's average): the parameters may
  // already hold its outer step, and no copy of the trained model is kept
  // (core/model_memory.h).
  if (fresh || change_.size() != total) change_of(&change_);
  return change_.data();
}

SliceIo Exchanger::Io() const {
  return SliceIo{peers_,
                 clock_,
                 options_.initial_backoff,
                 options_.max_backoff,
                 options_.push_box,
                 options_.bad_chunks};
}

absl::Status Exchanger::AverageBlobs(const std::vector<GroupStep>& steps, const StepCall& call,
                                     SliceRange fragment, bool flat, float* params,
                                     CancellationToken* cancel, AveragingStats* stats) {
  const uint64_t round = call.round;
  const uint64_t total = state_->total_elements();
  parts_.store->BeginRound(round, call.attempt);
  // Error feedback: a hierarchical round starts each attempt from what the
  // round began with (its carried groups must meet the same state). A flat
  // round's new attempt goes on from what the failed one left, as its
  // vector does: keeping the round's start would be a second copy of every
  // residual for an event as rare as a lost participant, and what the
  // failed attempt sent then is not carried (one round's leftover of one
  // worker, not a drift).
  if (round != feedback_.round) {
    if (flat) {
      feedback_.start.clear();
    } else {
      feedback_.start = feedback_.current;
    }
    feedback_.round = round;
  } else if (!flat) {
    feedback_.current = feedback_.start;
  }
  if (round != carried_round_) {
    carried_.clear();
    carried_round_ = round;
  }
  float* const buf = RoundInput(round, flat, params);
  const SliceIo io = Io();
  // How this worker holds `buf` (the pieces a broadcast forwards).
  std::vector<HeldPiece> held;
  uint32_t stages = 0;
  for (const GroupStep& step : steps) stages = std::max(stages, step.stage);
  stats->stage_bytes_received.assign(stages, 0);
  for (const GroupStep& step : steps) {
    if (step.stage > 0) parts_.store->ReachStage(round, call.attempt, step.stage);
    if (cancel != nullptr && cancel->cancelled()) return absl::AbortedError("round aborted");
    const bool average = step.kind == GroupStep::Kind::kAverage;
    if (!step.identity.empty()) {
      if (auto it = carried_.find(step.identity); it != carried_.end()) {
        // The same group over the same inputs: our input is the same bits
        // (checked: a mismatch would be a bug, and the stage runs again).
        Carried& c = it->second;
        if (!average || c.input_hash == Sha256Hex(buf, total * sizeof(float))) {
          for (const PublishedBlob& p : c.published) {
            parts_.store->Publish(round, call.attempt, p.kind, p.range.begin, p.range.end, p.blob,
                                  step.stage);
          }
          std::memcpy(buf, c.result.data(), total * sizeof(float));
          held = c.held;
          if (codec_->lossy()) feedback_.current[step.stage] = c.feedback;
          ++stats->stages_carried;
          SHOAL_VLOG(1) << "round " << round << " attempt " << call.attempt << " stage "
                        << step.stage << " (" << KindName(step) << " zone '" << step.zone
                        << "'): carried from an earlier attempt";
          continue;
        }
        SHOAL_LOG(WARNING) << "round " << round << " stage " << step.stage
                           << ": the input differs from the attempt that finished its group; "
                              "the stage runs again";
      }
    }
    Carried kept;
    if (average && !step.identity.empty()) kept.input_hash = Sha256Hex(buf, total * sizeof(float));
    StageFeedback* feedback = codec_->lossy() ? &feedback_.current[step.stage] : nullptr;
    BlobTransport transport(io, parts_.store, codec_, feedback, total);
    const uint64_t before = call.counters->received.load();
    absl::Status r;
    if (average) {
      AggregationSpec applied = options_.aggregation;
      r = RunAverageStep(step, buf, buf, options_.aggregation, &transport, call, cancel, &applied);
      if (r.ok()) {
        NoteRule(round, step.stage, step, applied);
        held = transport.TakePieces();
      }
    } else {
      r = transport.Broadcast(step, buf, &held, call, cancel);
    }
    if (step.stage > 0) {
      stats->stage_bytes_received[step.stage - 1] += call.counters->received.load() - before;
    }
    if (cancel != nullptr && cancel->cancelled()) return absl::AbortedError("round aborted");
    if (!r.ok()) {
      if (step.stage == 0) return r;
      return Annotate(r, absl::StrCat("round ", round, " stage ", step.stage, " (", KindName(step),
                                      " zone '", step.zone, "')"));
    }
    if (!step.identity.empty()) {
      kept.result.assign(buf, buf + total);
      kept.published = transport.published();
      kept.held = held;
      if (feedback != nullptr) kept.feedback = *feedback;
      carried_[step.identity] = std::move(kept);
    }
  }
  if (changes_) {
    // The new model: the outer step from the base (identical inputs on
    // every worker, so identical bits), on the round's fragment: the rest
    // of the model, and its momentum, wait for their own rounds.
    const uint64_t b = fragment.begin;
    parts_.outer->Apply(round, b, fragment.end - b, parts_.base + b, change_.data() + b,
                        params + b);
  }
  return absl::OkStatus();
}

void Exchanger::NoteRule(uint64_t round, uint32_t stage, const GroupStep& step,
                         const AggregationSpec& applied) {
  // The mean is the rule of almost every run: only robust rules are logged.
  if (step.own().begin == step.own().end || !NeedsAllContributions(options_.aggregation)) return;
  std::string rule = AggregationName(applied);
  std::string& last = last_rule_[stage];
  if (rule == last) return;
  const std::string where = stage == 0 ? "" : absl::StrCat(" stage ", stage);
  if (applied.kind != options_.aggregation.kind) {
    SHOAL_LOG(WARNING) << "round " << round << where << ": " << step.members.size()
                       << " contributions are too few for " << AggregationName(options_.aggregation)
                       << " (needs " << MinContributions(options_.aggregation)
                       << "): the owner takes their median";
  } else {
    SHOAL_LOG(INFO) << "round " << round << where << ": the owner combines " << step.members.size()
                    << " contributions by " << rule;
  }
  last = std::move(rule);
}

}  // namespace shoal::worker
