#include "services/worker/hierarchical_averager.h"

#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/sha256.h"
#include "common/shard_plan.h"
#include "common/status_util.h"
#include "services/worker/blob_reader.h"

namespace shoal::worker {
namespace {

using shoal::v1::HierarchyGroup;
using shoal::v1::HierarchyStage;

// The first failure, preferring the one that stopped the others over their
// ABORTED.
absl::Status FirstError(const std::vector<absl::Status>& statuses) {
  absl::Status aborted;
  for (const auto& s : statuses) {
    if (s.ok()) continue;
    if (!absl::IsAborted(s) && !absl::IsCancelled(s)) return s;
    if (aborted.ok()) aborted = s;
  }
  return aborted;
}

Blob CopyFloats(const float* data, uint64_t count) {
  return std::make_shared<const std::string>(reinterpret_cast<const char*>(data),
                                             count * sizeof(float));
}

// The position of plan index `self` in `group`, or -1.
int PositionIn(const HierarchyGroup& group, int self) {
  for (int k = 0; k < group.members_size(); ++k) {
    if (static_cast<int>(group.members(k)) == self) return k;
  }
  return -1;
}

// Length-prefixed, so that no two field lists hash alike.
void HashField(Sha256* h, const std::string& field) {
  const uint64_t size = field.size();
  h->Update(&size, sizeof(size));
  h->Update(field.data(), field.size());
}

}  // namespace

std::vector<std::vector<std::string>> GroupIdentities(const shoal::v1::RoundPlan& plan) {
  const int n = plan.slices_size();
  // What participant k brings to the next group it sits in.
  std::vector<std::string> brings(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) brings[k] = "trained model of " + plan.slices(k).worker_id();
  std::vector<std::vector<std::string>> out;
  for (const HierarchyStage& stage : plan.hierarchy().stages()) {
    std::vector<std::string>& ids = out.emplace_back();
    for (const HierarchyGroup& g : stage.groups()) {
      Sha256 h;
      HashField(&h, absl::StrCat("round ", plan.round(), " of ", plan.total_elements()));
      HashField(&h, HierarchyStage::Kind_Name(stage.kind()));
      HashField(&h, g.zone());
      for (int k = 0; k < g.members_size(); ++k) {
        const int m = static_cast<int>(g.members(k));
        HashField(&h, plan.slices(m).worker_id());
        HashField(&h, stage.kind() == HierarchyStage::AVERAGE ? absl::StrCat(g.weights(k)) : "");
        HashField(&h, brings[m]);
      }
      if (stage.kind() == HierarchyStage::BROADCAST) {
        HashField(&h, plan.slices(static_cast<int>(g.head())).worker_id());
      }
      ids.push_back(h.HexDigest());
      for (uint32_t m : g.members()) brings[m] = ids.back();
    }
  }
  return out;
}

absl::Status CheckHierarchy(const shoal::v1::RoundHierarchy& hierarchy, int n) {
  for (int s = 0; s < hierarchy.stages_size(); ++s) {
    const HierarchyStage& stage = hierarchy.stages(s);
    const std::string where = absl::StrCat("hierarchy stage ", s + 1);
    if (stage.kind() != HierarchyStage::AVERAGE && stage.kind() != HierarchyStage::BROADCAST) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": kind must be AVERAGE or BROADCAST"));
    }
    std::vector<bool> seen(static_cast<size_t>(n), false);
    for (const HierarchyGroup& g : stage.groups()) {
      if (g.members_size() < 2) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": a group of ", g.members_size(),
                                                       " members (zone '", g.zone(), "')"));
      }
      for (uint32_t m : g.members()) {
        if (m >= static_cast<uint32_t>(n)) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": member ", m, " is not one of the ", n, " participants"));
        }
        if (seen[m]) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": participant ", m, " sits in two groups or twice in one"));
        }
        seen[m] = true;
      }
      if (stage.kind() == HierarchyStage::AVERAGE) {
        if (g.weights_size() != g.members_size()) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": ", g.weights_size(),
                                                         " weights for ", g.members_size(),
                                                         " members (zone '", g.zone(), "')"));
        }
        for (uint32_t w : g.weights()) {
          if (w == 0) return absl::InvalidArgumentError(absl::StrCat(where, ": a zero weight"));
        }
      } else if (PositionIn(g, static_cast<int>(g.head())) < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": head ", g.head(), " is not a member of its group"));
      }
    }
  }
  return absl::OkStatus();
}

HierarchicalAverager::HierarchicalAverager(PeerClient* peers, ModelState* state,
                                           EncodedStore* store, ExchangeOptions options,
                                           Averager* flat)
    : peers_(peers),
      state_(state),
      store_(store),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : RealClock::Get()),
      flat_(flat) {}

absl::Status HierarchicalAverager::Average(const shoal::v1::RoundPlan& plan,
                                           const std::string& self_id, float* params,
                                           CancellationToken* cancel, AveragingStats* stats) {
  if (!plan.has_hierarchy()) return flat_->Average(plan, self_id, params, cancel, stats);
  const int n = plan.slices_size();
  int self = -1;
  for (int k = 0; k < n; ++k) {
    if (plan.slices(k).worker_id() == self_id) self = k;
  }
  if (self < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", self_id, " is not a participant of round ", plan.round()));
  }
  if (plan.total_elements() != state_->total_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan of ", plan.total_elements(), " elements for a model of ", state_->total_elements()));
  }
  RETURN_IF_ERROR(CheckHierarchy(plan.hierarchy(), n));
  const uint64_t round = plan.round();
  const uint32_t attempt = plan.attempt();
  const absl::Time deadline = clock_->Now() + options_.timeout;
  store_->BeginRound(round, attempt);
  if (round != carried_round_) {
    carried_.clear();
    carried_round_ = round;
  }
  const std::vector<std::vector<std::string>> identities = GroupIdentities(plan);
  const uint64_t total = plan.total_elements();
  CancellationToken stop(cancel);
  const auto& stages = plan.hierarchy().stages();
  stats->stage_bytes_received.assign(static_cast<size_t>(stages.size()), 0);
  for (int s = 0; s < stages.size(); ++s) {
    const uint32_t stage = static_cast<uint32_t>(s) + 1;
    store_->ReachStage(round, attempt, stage);
    if (stop.cancelled()) return absl::AbortedError("round aborted");
    for (int g = 0; g < stages[s].groups_size(); ++g) {
      const HierarchyGroup& group = stages[s].groups(g);
      if (PositionIn(group, self) < 0) continue;
      const HierarchyStage::Kind kind = stages[s].kind();
      const std::string& identity = identities[s][g];
      if (auto it = carried_.find(identity); it != carried_.end()) {
        // The same group over the same inputs: our input is the same bits
        // (checked: a mismatch would be a bug, and the stage runs again).
        const Carried& c = it->second;
        if (kind == HierarchyStage::BROADCAST ||
            std::memcmp(c.input.data(), params, total * sizeof(float)) == 0) {
          CarryStage(plan, stage, kind, group, self, c, params, stats);
          break;
        }
        SHOAL_LOG(WARNING) << "round " << round << " stage " << stage
                           << ": the input differs from the attempt that finished its group; "
                              "the stage runs again";
      }
      Carried kept;
      if (kind == HierarchyStage::AVERAGE) kept.input.assign(params, params + total);
      uint64_t* received = &stats->stage_bytes_received[static_cast<size_t>(s)];
      absl::Status r = kind == HierarchyStage::AVERAGE
                           ? AverageStage(plan, stage, group, self, self_id, params, deadline,
                                          &stop, stats, received)
                           : BroadcastStage(plan, stage, group, self, self_id, params, deadline,
                                            &stop, stats, received);
      if (stop.cancelled()) return absl::AbortedError("round aborted");
      if (!r.ok()) {
        return Annotate(
            r, absl::StrCat("round ", round, " stage ", stage, " (",
                            HierarchyStage::Kind_Name(kind), " zone '", group.zone(), "')"));
      }
      kept.result.assign(params, params + total);
      carried_[identity] = std::move(kept);
      break;  // groups of a stage are disjoint
    }
  }
  SHOAL_VLOG(1) << "round " << round << " hierarchical: " << [&] {
    std::string out;
    for (uint64_t b : stats->stage_bytes_received) absl::StrAppend(&out, b, " ");
    return out;
  }() << "bytes in per stage";
  return absl::OkStatus();
}

absl::Status HierarchicalAverager::AverageStage(const shoal::v1::RoundPlan& plan, uint32_t stage,
                                                const HierarchyGroup& group, int self,
                                                const std::string& self_id, float* params,
                                                absl::Time deadline, CancellationToken* stop,
                                                AveragingStats* stats, uint64_t* received) {
  const uint64_t round = plan.round();
  const uint32_t attempt = plan.attempt();
  const int n = group.members_size();
  const int me = PositionIn(group, self);
  const std::vector<SliceRange> ranges = PlanSlices(plan.total_elements(), static_cast<size_t>(n));
  auto address = [&](int k) -> const std::string& {
    return plan.slices(static_cast<int>(group.members(k))).peer_address();
  };
  // 1. Our copy of every other member's slice, as an immutable blob.
  for (int k = 0; k < n; ++k) {
    const SliceRange& r = ranges[k];
    if (k == me || r.begin == r.end) continue;
    Blob blob = CopyFloats(params + r.begin, r.end - r.begin);
    stats->bytes_published += blob->size();
    store_->Publish(round, attempt, shoal::v1::CONTRIBUTION, r.begin, r.end, std::move(blob),
                    stage);
  }
  const SliceRange own = ranges[me];
  const uint64_t count = own.end - own.begin;
  std::atomic<int> retries{0};
  std::atomic<uint64_t> got{0};
  CancellationToken local(stop);
  std::vector<absl::Status> reduce_status(n), gather_status(n);
  std::vector<std::vector<float>> parts(n), averaged(n);
  std::vector<std::thread> reducers, gatherers;
  // 2. Every other owner's average (waits there until it is published).
  for (int k = 0; k < n; ++k) {
    const SliceRange r = ranges[k];
    if (k == me || r.begin == r.end) continue;
    gatherers.emplace_back([&, k, r] {
      averaged[k].resize(r.end - r.begin);
      gather_status[k] =
          ReadBlob(plan, self_id, {address(k), shoal::v1::AVERAGED, stage, r.begin, r.end},
                   deadline, &local, averaged[k].data(), &retries);
      if (gather_status[k].ok()) got += (r.end - r.begin) * sizeof(float);
      if (!gather_status[k].ok()) local.Cancel();
    });
  }
  // 3. Every other member's copy of our slice.
  if (count > 0) {
    for (int k = 0; k < n; ++k) {
      if (k == me) continue;
      reducers.emplace_back([&, k] {
        parts[k].resize(count);
        reduce_status[k] = ReadBlob(
            plan, self_id, {address(k), shoal::v1::CONTRIBUTION, stage, own.begin, own.end},
            deadline, &local, parts[k].data(), &retries);
        if (reduce_status[k].ok()) got += count * sizeof(float);
        if (!reduce_status[k].ok()) local.Cancel();
      });
    }
  }
  for (auto& t : reducers) t.join();
  absl::Status result = FirstError(reduce_status);
  if (result.ok() && count > 0 && !local.cancelled()) {
    // sum(w_k * x_k) / sum(w_k), in member order: the order the reads
    // finished in does not change the bits.
    std::vector<float> acc(count, 0.0f);
    uint64_t total_weight = 0;
    for (int k = 0; k < n; ++k) {
      const float w = static_cast<float>(group.weights(k));
      total_weight += group.weights(k);
      const float* x = k == me ? params + own.begin : parts[k].data();
      for (uint64_t i = 0; i < count; ++i) acc[i] += w * x[i];
      if (k != me) std::vector<float>().swap(parts[k]);
    }
    const float divisor = static_cast<float>(total_weight);
    for (uint64_t i = 0; i < count; ++i) params[own.begin + i] = acc[i] / divisor;
    Blob blob = CopyFloats(params + own.begin, count);
    stats->bytes_published += blob->size() * static_cast<uint64_t>(n - 1);
    store_->Publish(round, attempt, shoal::v1::AVERAGED, own.begin, own.end, std::move(blob),
                    stage);
  } else if (!result.ok()) {
    local.Cancel();
  }
  for (auto& t : gatherers) t.join();
  if (result.ok()) result = FirstError(gather_status);
  if (result.ok() && local.cancelled()) result = absl::AbortedError("round aborted");
  if (!result.ok()) return result;
  for (int k = 0; k < n; ++k) {
    const SliceRange& r = ranges[k];
    if (k == me || r.begin == r.end) continue;
    std::memcpy(params + r.begin, averaged[k].data(), (r.end - r.begin) * sizeof(float));
  }
  *received += got.load();
  stats->bytes_received += got.load();
  stats->raw_bytes_received += got.load();
  stats->retries += retries.load();
  return absl::OkStatus();
}

void HierarchicalAverager::CarryStage(const shoal::v1::RoundPlan& plan, uint32_t stage,
                                      const HierarchyStage::Kind kind, const HierarchyGroup& group,
                                      int self, const Carried& carried, float* params,
                                      AveragingStats* stats) {
  const uint64_t round = plan.round();
  const uint32_t attempt = plan.attempt();
  const uint64_t total = plan.total_elements();
  if (kind == HierarchyStage::AVERAGE) {
    // What AverageStage publishes: our copies of the others' slices of our
    // input, and the average of the slice we own.
    const int n = group.members_size();
    const int me = PositionIn(group, self);
    const std::vector<SliceRange> ranges = PlanSlices(total, static_cast<size_t>(n));
    for (int k = 0; k < n; ++k) {
      const SliceRange& r = ranges[k];
      if (r.begin == r.end) continue;
      const std::vector<float>& from = k == me ? carried.result : carried.input;
      store_->Publish(round, attempt, k == me ? shoal::v1::AVERAGED : shoal::v1::CONTRIBUTION,
                      r.begin, r.end, CopyFloats(from.data() + r.begin, r.end - r.begin), stage);
    }
  } else if (static_cast<int>(group.head()) == self) {
    store_->Publish(round, attempt, shoal::v1::STAGE_MODEL, 0, total,
                    CopyFloats(carried.result.data(), total), stage);
  }
  std::memcpy(params, carried.result.data(), total * sizeof(float));
  ++stats->stages_carried;
  SHOAL_VLOG(1) << "round " << round << " attempt " << attempt << " stage " << stage << " ("
                << HierarchyStage::Kind_Name(kind) << " zone '" << group.zone()
                << "'): carried from an earlier attempt";
}

absl::Status HierarchicalAverager::BroadcastStage(const shoal::v1::RoundPlan& plan, uint32_t stage,
                                                  const HierarchyGroup& group, int self,
                                                  const std::string& self_id, float* params,
                                                  absl::Time deadline, CancellationToken* stop,
                                                  AveragingStats* stats, uint64_t* received) {
  const uint64_t total = plan.total_elements();
  if (static_cast<int>(group.head()) == self) {
    Blob blob = CopyFloats(params, total);
    stats->bytes_published += blob->size() * static_cast<uint64_t>(group.members_size() - 1);
    store_->Publish(plan.round(), plan.attempt(), shoal::v1::STAGE_MODEL, 0, total, std::move(blob),
                    stage);
    return absl::OkStatus();
  }
  if (total == 0) return absl::OkStatus();
  std::atomic<int> retries{0};
  std::vector<float> model(total);
  const std::string& head = plan.slices(static_cast<int>(group.head())).peer_address();
  absl::Status s = ReadBlob(plan, self_id, {head, shoal::v1::STAGE_MODEL, stage, 0, total},
                            deadline, stop, model.data(), &retries);
  stats->retries += retries.load();
  if (!s.ok()) return s;
  std::memcpy(params, model.data(), total * sizeof(float));
  *received += total * sizeof(float);
  stats->bytes_received += total * sizeof(float);
  stats->raw_bytes_received += total * sizeof(float);
  return absl::OkStatus();
}

absl::Status HierarchicalAverager::ReadBlob(const shoal::v1::RoundPlan& plan,
                                            const std::string& self_id, const Read& read,
                                            absl::Time deadline, CancellationToken* stop,
                                            float* out, std::atomic<int>* retries) {
  RetryPolicy policy;
  policy.initial_backoff = options_.initial_backoff;
  policy.max_backoff = options_.max_backoff;
  shoal::v1::ReadEncodedRequest request;
  request.set_round(plan.round());
  request.set_attempt(plan.attempt());
  request.set_stage(read.stage);
  request.set_kind(read.kind);
  request.set_begin(read.begin);
  request.set_end(read.end);
  request.set_reader_id(self_id);
  const size_t want = (read.end - read.begin) * sizeof(float);
  absl::StatusOr<std::string> bytes = ReadBlobWithRetry(peers_, read.address, request, {want, true},
                                                        policy, deadline, clock_, stop, retries);
  if (!bytes.ok()) return bytes.status();
  std::memcpy(out, bytes->data(), want);
  return absl::OkStatus();
}

}  // namespace shoal::worker
