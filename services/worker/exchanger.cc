#include "services/worker/exchanger.h"

#include <pthread.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/chunk_codec.h"
#include "common/logging.h"
#include "common/retry.h"
#include "common/status_util.h"
#include "services/worker/blob_reader.h"
#include "services/worker/core/aggregation.h"
#include "services/worker/core/transfer_checks.h"

namespace shoal::worker {
namespace {

// Names the calling thread (at most 15 characters), so that profiles and
// debuggers tell the exchange's reads apart from gRPC's threads.
void NameThread(const char* name) {
#if defined(__linux__)
  pthread_setname_np(pthread_self(), name);
#endif
}

const Fp32Codec kFp32;

// The first failure, preferring the one that stopped the others over their
// ABORTED.
absl::Status FirstError(const std::vector<absl::Status>& statuses) {
  absl::Status aborted;
  for (const auto& s : statuses) {
    if (s.ok()) continue;
    if (!absl::IsAborted(s)) return s;
    if (aborted.ok()) aborted = s;
  }
  return aborted;
}

}  // namespace

Exchanger::Exchanger(PeerClient* peers, ModelState* state, ExchangeOptions options,
                     const Codec* codec, const EncodedExchange* encoded)
    : peers_(peers),
      state_(state),
      options_(options),
      clock_(options.clock != nullptr ? options.clock : RealClock::Get()),
      codec_(codec != nullptr ? codec : &kFp32),
      encoded_(encoded != nullptr ? *encoded : EncodedExchange{}),
      use_encoded_(encoded != nullptr) {}

absl::Status Exchanger::ReadWithRetry(const std::string& address, shoal::v1::SliceKind kind,
                                      uint64_t round, uint32_t attempt, uint64_t begin,
                                      uint64_t end, const std::string& self_id, absl::Time deadline,
                                      CancellationToken* stop,
                                      const std::function<absl::Status(const ChunkView&)>& apply,
                                      std::atomic<int>* retries) {
  RetryPolicy policy;
  policy.initial_backoff = options_.initial_backoff;
  policy.max_backoff = options_.max_backoff;
  policy.deadline = deadline - clock_->Now();
  policy.clock = clock_;
  // A peer refuses a read past its --max_reads_per_peer before sending
  // anything: come back after a backoff.
  policy.also_retry = {absl::StatusCode::kResourceExhausted};
  uint64_t next = begin;
  absl::Status s = Retry(
      policy, stop,
      [&](absl::Duration left) {
        shoal::v1::ReadSliceRequest request;
        request.set_round(round);
        request.set_begin(next);
        request.set_end(end);
        request.set_kind(kind);
        request.set_reader_id(self_id);
        request.set_attempt(attempt);
        absl::Status applied;
        absl::Status read =
            peers_->ReadSliceCancellable(address, request, left, stop, [&](const ChunkView& chunk) {
              applied = apply(chunk);
              if (!applied.ok()) return false;
              next = chunk.begin + chunk.count;
              return !stop->cancelled();
            });
        // A chunk the codec refuses is final (bad data would fail again).
        if (!applied.ok()) return applied;
        return read;
      },
      [&](const absl::Status&, int) { ++*retries; });
  if (stop->cancelled()) return absl::AbortedError("round aborted");
  if (absl::IsDeadlineExceeded(s) || (!s.ok() && clock_->Now() >= deadline)) {
    return absl::DeadlineExceededError(absl::StrCat("exchange of round ", round,
                                                    " timed out reading [", next, ", ", end,
                                                    ") from ", address, ": ", s.message()));
  }
  return s;
}

absl::Status Exchanger::Average(const shoal::v1::RoundPlan& plan, const std::string& self_id,
                                float* params, CancellationToken* cancel, AveragingStats* stats) {
  const uint64_t round = plan.round();
  const int n = plan.slices_size();
  int self = -1;
  for (int k = 0; k < n; ++k) {
    if (plan.slices(k).worker_id() == self_id) self = k;
  }
  if (self < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan of round ", round, " has no slice for ", self_id));
  }
  if (plan.total_elements() != state_->total_elements()) {
    return absl::InvalidArgumentError(absl::StrCat("plan is for ", plan.total_elements(),
                                                   " elements, the model has ",
                                                   state_->total_elements()));
  }
  const auto& own = plan.slices(self);
  state_->SetPlan(round, plan.attempt(), own.begin(), own.end());
  for (const auto& s : plan.slices()) {
    if (s.outbound_only() && options_.push_box == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(s.worker_id(), " is behind NAT and this exchanger takes no pushes"));
    }
  }
  // Pushes of earlier rounds will never be taken.
  if (options_.push_box != nullptr) options_.push_box->DropBefore(round);
  if (use_encoded_) return AverageEncoded(plan, self, params, cancel, stats);
  if (!codec_->raw()) {
    return absl::FailedPreconditionError(
        absl::StrCat("codec ", codec_->name(), " needs the encoded exchange"));
  }
  const absl::Time deadline = clock_->Now() + options_.timeout;

  std::mutex accumulate_mu;
  std::atomic<uint64_t> received{0};
  std::atomic<uint64_t> raw_received{0};
  std::atomic<int> retries{0};
  std::vector<absl::Status> reduce_status(n), gather_status(n);
  std::vector<std::thread> reducers, gatherers;
  // Cancelled with the caller's token, or when the reduce part failed (our
  // own slice will never be averaged, so waiting for the others' is
  // pointless): either ends every read at once.
  CancellationToken stop(cancel);

  // All-gather reads start at once; they wait for the owners' averages.
  for (int k = 0; k < n; ++k) {
    if (k == self || plan.slices(k).begin() == plan.slices(k).end()) continue;
    const auto& s = plan.slices(k);
    gatherers.emplace_back([&, k, s] {
      NameThread("shoal-gather");
      gather_status[k] = ReadWithRetry(
          s.peer_address(), shoal::v1::AVERAGED, round, plan.attempt(), s.begin(), s.end(), self_id,
          deadline, &stop,
          [&](const ChunkView& c) {
            received += c.count * sizeof(float);
            raw_received += c.count * sizeof(float);
            return codec_->ApplyAverage(c, params + c.begin);
          },
          &retries);
    });
  }
  // Behind NAT: nobody can read our contributions, so we push each owner
  // its slice of our parameters (its reduce waits for it). Our slice is
  // empty, so we average nothing; our gathers above fill in the model. A
  // gather of slice k writes params[k] only after k's owner averaged, which
  // is after it received our whole push of params[k]: no overlap.
  std::vector<std::thread> pushers;
  std::vector<absl::Status> push_status(n);
  if (own.outbound_only()) {
    for (int k = 0; k < n; ++k) {
      const auto& s = plan.slices(k);
      if (k == self || s.begin() == s.end()) continue;
      pushers.emplace_back([&, k, s] {
        NameThread("shoal-push");
        push_status[k] =
            PushWithRetry(s, round, plan.attempt(), self_id, /*encoded=*/false,
                          absl::string_view(reinterpret_cast<const char*>(params + s.begin()),
                                            (s.end() - s.begin()) * sizeof(float)),
                          deadline, &stop, &retries);
        if (!push_status[k].ok()) stop.Cancel();
      });
    }
  }
  // Reduce-scatter: sum every other participant's copy of our slice (the
  // mean), or keep each copy apart for a robust rule.
  const uint64_t count = own.end() - own.begin();
  const bool keep_apart = NeedsAllContributions(options_.aggregation);
  std::atomic<uint64_t> reduce_bytes{0};
  const absl::Time reduce_start = clock_->Now();
  std::vector<std::vector<float>> parts(keep_apart ? n : 0);
  if (own.begin() < own.end()) {
    for (int k = 0; k < n; ++k) {
      if (k == self) continue;
      const auto& s = plan.slices(k);
      if (keep_apart) parts[k].resize(count);
      reducers.emplace_back([&, k, s] {
        NameThread("shoal-reduce");
        auto apply = [&](const ChunkView& c) {
          received += c.count * sizeof(float);
          raw_received += c.count * sizeof(float);
          reduce_bytes += c.count * sizeof(float);
          // The receiver checked that the chunk lies in [own.begin, own.end).
          if (keep_apart) return codec_->ApplyAverage(c, parts[k].data() + (c.begin - own.begin()));
          std::lock_guard<std::mutex> lock(accumulate_mu);
          return codec_->AccumulateContribution(c, params + c.begin);
        };
        if (s.outbound_only()) {
          // Behind NAT: its contribution was pushed to us (checked whole).
          absl::StatusOr<std::string> pushed =
              TakePushed(s.worker_id(), round, plan.attempt(), own.begin(), own.end(),
                         /*encoded=*/false, deadline, &stop);
          reduce_status[k] = pushed.status();
          if (pushed.ok()) {
            ChunkView view;
            view.begin = own.begin();
            view.data = reinterpret_cast<const float*>(pushed->data());
            view.count = count;
            reduce_status[k] = apply(view);
          }
        } else {
          reduce_status[k] =
              ReadWithRetry(s.peer_address(), shoal::v1::CONTRIBUTION, round, plan.attempt(),
                            own.begin(), own.end(), self_id, deadline, &stop, apply, &retries);
        }
        if (!reduce_status[k].ok()) stop.Cancel();
      });
    }
  }
  for (auto& t : reducers) t.join();
  for (auto& t : pushers) t.join();
  const double reduce_seconds = absl::ToDoubleSeconds(clock_->Now() - reduce_start);
  absl::Status result = FirstError(reduce_status);
  if (result.ok()) result = FirstError(push_status);
  if (result.ok() && !stop.cancelled() && keep_apart && count > 0) {
    // Our own contribution is our slice of the parameters, overwritten by
    // the result (nobody reads it before MarkAveraged).
    std::vector<const float*> inputs(n);
    for (int k = 0; k < n; ++k) inputs[k] = k == self ? params + own.begin() : parts[k].data();
    result = CombineOwnSlice(round, inputs, count, params + own.begin());
  }
  if (result.ok() && !stop.cancelled()) {
    if (!keep_apart) DivideFloats(params + own.begin(), count, static_cast<float>(n));
    codec_->RoundTripAverage(params + own.begin(), count);
    state_->MarkAveraged(round);
  } else if (result.ok()) {
    result = absl::AbortedError("round aborted");
  }
  if (!result.ok()) stop.Cancel();
  for (auto& t : gatherers) t.join();
  if (result.ok()) result = FirstError(gather_status);
  if (stats != nullptr) {
    stats->bytes_received = received.load();
    stats->raw_bytes_received = raw_received.load();
    stats->retries = retries.load();
    stats->reduce_bytes = reduce_bytes.load();
    stats->reduce_seconds = reduce_seconds;
    // Our contribution to every other owner (read, or pushed from behind
    // NAT), our slice to every other.
    stats->bytes_published =
        (state_->total_elements() - (own.end() - own.begin())) * sizeof(float) +
        (own.end() - own.begin()) * sizeof(float) * (n - 1);
  }
  return result;
}

absl::StatusOr<std::string> Exchanger::ReadEncodedWithRetry(
    const std::string& address, shoal::v1::SliceKind kind, uint64_t round, uint32_t attempt,
    uint64_t begin, uint64_t end, const std::string& self_id, absl::Time deadline,
    CancellationToken* stop, std::atomic<int>* retries) {
  RetryPolicy policy;
  policy.initial_backoff = options_.initial_backoff;
  policy.max_backoff = options_.max_backoff;
  shoal::v1::ReadEncodedRequest request;
  request.set_round(round);
  request.set_attempt(attempt);
  request.set_kind(kind);
  request.set_begin(begin);
  request.set_end(end);
  request.set_reader_id(self_id);
  return ReadBlobWithRetry(peers_, address, request, {codec_->MaxEncodedBytes(end - begin), false},
                           policy, deadline, clock_, stop, retries);
}

namespace {
// randomk's choice of elements: the same for every worker in a slice of a
// round (so the contributions and the average share their elements).
uint64_t SliceSeed(uint64_t round, uint64_t begin) {
  return round * 0x9E3779B97F4A7C15ull ^ (begin + 0x632BE59BD9B4E019ull);
}
}  // namespace

absl::Status Exchanger::AverageEncoded(const shoal::v1::RoundPlan& plan, int self, float* params,
                                       CancellationToken* cancel, AveragingStats* stats) {
  const uint64_t round = plan.round();
  const uint32_t attempt = plan.attempt();
  const int n = plan.slices_size();
  const uint64_t total = state_->total_elements();
  const std::string& self_id = plan.slices(self).worker_id();
  const auto& own = plan.slices(self);
  const absl::Time deadline = clock_->Now() + options_.timeout;
  encoded_.store->BeginRound(round, attempt);

  // Error feedback starts each attempt from the residual the round began with.
  if (residual_.size() != total) residual_.assign(total, 0.0f);
  if (owner_residual_.size() != total) owner_residual_.assign(total, 0.0f);
  if (round != residual_round_) {
    residual_start_ = residual_;
    owner_residual_start_ = owner_residual_;
    residual_round_ = round;
  } else {
    residual_ = residual_start_;
    owner_residual_ = owner_residual_start_;
  }
  // What the average of a slice this worker no longer owns left out is not
  // carried into a later ownership of it (it would arrive rounds late).
  for (uint64_t i = 0; i < total; ++i) {
    if (i < own.begin() || i >= own.end()) owner_residual_[i] = 0.0f;
  }

  // 1. Encode every slice's change once.
  std::vector<float> change(total);
  for (uint64_t i = 0; i < total; ++i) change[i] = params[i] - encoded_.base[i];
  Blob own_blob;
  std::vector<Blob> blobs(n);  // kept for the pushes from behind NAT
  uint64_t published = 0;
  for (int k = 0; k < n; ++k) {
    const auto& s = plan.slices(k);
    if (s.begin() >= s.end()) continue;
    auto blob = std::make_shared<const std::string>(
        EncodeWithFeedback(*codec_, change.data() + s.begin(), s.end() - s.begin(),
                           SliceSeed(round, s.begin()), residual_.data() + s.begin()));
    if (k == self) {
      own_blob = blob;
    } else {
      published += blob->size();
    }
    blobs[k] = blob;
    encoded_.store->Publish(round, attempt, shoal::v1::CONTRIBUTION, s.begin(), s.end(),
                            std::move(blob));
  }

  // `change` now receives the decoded averaged change, slice by slice.
  std::atomic<uint64_t> received{0};
  std::atomic<uint64_t> raw_received{0};
  std::atomic<int> retries{0};
  std::vector<absl::Status> reduce_status(n), gather_status(n);
  std::vector<std::thread> reducers, gatherers;
  CancellationToken stop(cancel);

  for (int k = 0; k < n; ++k) {
    if (k == self || plan.slices(k).begin() == plan.slices(k).end()) continue;
    const auto& s = plan.slices(k);
    gatherers.emplace_back([&, k, s] {
      NameThread("shoal-gather");
      absl::StatusOr<std::string> bytes =
          ReadEncodedWithRetry(s.peer_address(), shoal::v1::AVERAGED, round, attempt, s.begin(),
                               s.end(), self_id, deadline, &stop, &retries);
      if (bytes.ok()) {
        received += bytes->size();
        raw_received += (s.end() - s.begin()) * sizeof(float);
        gather_status[k] = codec_->DecodeSlice(
            absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size()),
            s.end() - s.begin(), change.data() + s.begin());
      } else {
        gather_status[k] = bytes.status();
      }
    });
  }
  // Behind NAT: push each owner our encoded contribution of its slice.
  std::vector<std::thread> pushers;
  std::vector<absl::Status> push_status(n);
  if (own.outbound_only()) {
    for (int k = 0; k < n; ++k) {
      const auto& s = plan.slices(k);
      if (k == self || s.begin() == s.end()) continue;
      pushers.emplace_back([&, k, s] {
        NameThread("shoal-push");
        push_status[k] = PushWithRetry(s, round, attempt, self_id, /*encoded=*/true, *blobs[k],
                                       deadline, &stop, &retries);
        if (!push_status[k].ok()) stop.Cancel();
      });
    }
  }
  const uint64_t count = own.end() - own.begin();
  std::vector<float> sum(count, 0.0f);
  // Each contribution is decoded into its own buffer and summed in plan
  // order once all are in: float addition is not associative, and the
  // order the reads finish in must not change the average's bits (the same
  // round gives the same encoded average, run after run).
  std::vector<std::vector<float>> parts(n);
  std::atomic<uint64_t> reduce_bytes{0};
  const absl::Time reduce_start = clock_->Now();
  if (count > 0) {
    // Our own contribution, as the others would decode it.
    absl::Status mine = codec_->DecodeSlice(
        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(own_blob->data()), own_blob->size()),
        count, sum.data());
    if (!mine.ok()) return mine;
    for (int k = 0; k < n; ++k) {
      if (k == self) continue;
      const auto& s = plan.slices(k);
      reducers.emplace_back([&, k, s] {
        NameThread("shoal-reduce");
        absl::StatusOr<std::string> bytes =
            s.outbound_only()
                ? TakePushed(s.worker_id(), round, attempt, own.begin(), own.end(),
                             /*encoded=*/true, deadline, &stop)
                : ReadEncodedWithRetry(s.peer_address(), shoal::v1::CONTRIBUTION, round, attempt,
                                       own.begin(), own.end(), self_id, deadline, &stop, &retries);
        if (bytes.ok() && bytes->size() > codec_->MaxEncodedBytes(count)) {
          bytes = absl::InvalidArgumentError(absl::StrCat("contribution of ", s.worker_id(), " is ",
                                                          bytes->size(), " bytes, at most ",
                                                          codec_->MaxEncodedBytes(count)));
        }
        if (bytes.ok()) {
          received += bytes->size();
          raw_received += count * sizeof(float);
          reduce_bytes += bytes->size();
          parts[k].resize(count);
          reduce_status[k] = codec_->DecodeSlice(
              absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size()),
              count, parts[k].data());
        } else {
          reduce_status[k] = bytes.status();
        }
        if (!reduce_status[k].ok()) stop.Cancel();
      });
    }
  }
  for (auto& t : reducers) t.join();
  for (auto& t : pushers) t.join();
  const double reduce_seconds = absl::ToDoubleSeconds(clock_->Now() - reduce_start);
  absl::Status result = FirstError(reduce_status);
  if (result.ok()) result = FirstError(push_status);
  if (result.ok() && !stop.cancelled()) {
    if (count > 0) {
      if (NeedsAllContributions(options_.aggregation)) {
        std::vector<const float*> inputs(n);
        for (int k = 0; k < n; ++k) inputs[k] = k == self ? sum.data() : parts[k].data();
        result = CombineOwnSlice(round, inputs, count, sum.data());
        parts.clear();
      } else {
        for (int k = 0; k < n; ++k) {
          if (k == self) continue;
          const float* part = parts[k].data();
          for (uint64_t i = 0; i < count; ++i) sum[i] += part[i];
          std::vector<float>().swap(parts[k]);
        }
        DivideFloats(sum.data(), count, static_cast<float>(n));
      }
    }
    if (result.ok() && count > 0) {
      // 2. The average, encoded once with the owner's own error feedback
      // (what this encoding leaves out is added to the slice's next
      // average: without it topk:F would lose most of the averaged change
      // for good); we apply what everyone decodes, so the models stay
      // bit-identical whatever the owner keeps.
      auto blob = std::make_shared<const std::string>(
          EncodeWithFeedback(*codec_, sum.data(), count, SliceSeed(round, own.begin()),
                             owner_residual_.data() + own.begin()));
      published += blob->size() * static_cast<uint64_t>(n - 1);
      result = codec_->DecodeSlice(
          absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(blob->data()), blob->size()), count,
          change.data() + own.begin());
      encoded_.store->Publish(round, attempt, shoal::v1::AVERAGED, own.begin(), own.end(),
                              std::move(blob));
    }
  } else if (result.ok()) {
    result = absl::AbortedError("round aborted");
  }
  if (!result.ok()) stop.Cancel();
  for (auto& t : gatherers) t.join();
  if (result.ok()) result = FirstError(gather_status);
  if (result.ok() && stop.cancelled()) result = absl::AbortedError("round aborted");
  if (result.ok()) {
    // 4. The new model: the outer step from the base (identical inputs on
    // every worker, so identical bits).
    encoded_.outer->Apply(round, 0, total, encoded_.base, change.data(), params);
  }
  if (stats != nullptr) {
    stats->bytes_received = received.load();
    stats->raw_bytes_received = raw_received.load();
    stats->bytes_published = published;
    stats->retries = retries.load();
    stats->reduce_bytes = reduce_bytes.load();
    stats->reduce_seconds = reduce_seconds;
  }
  return result;
}

absl::Status Exchanger::PushWithRetry(const shoal::v1::SliceAssignment& owner, uint64_t round,
                                      uint32_t attempt, const std::string& self_id, bool encoded,
                                      absl::string_view bytes, absl::Time deadline,
                                      CancellationToken* stop, std::atomic<int>* retries) {
  shoal::v1::PushHeader header;
  header.set_round(round);
  header.set_attempt(attempt);
  header.set_begin(owner.begin());
  header.set_end(owner.end());
  header.set_pusher_id(self_id);
  header.set_encoded(encoded);
  header.set_total_bytes(bytes.size());
  RetryPolicy policy;
  policy.initial_backoff = options_.initial_backoff;
  policy.max_backoff = options_.max_backoff;
  policy.deadline = deadline - clock_->Now();
  policy.clock = clock_;
  policy.also_retry = {absl::StatusCode::kResourceExhausted};
  absl::Status s = Retry(
      policy, stop,
      [&](absl::Duration left) {
        return peers_->Push(owner.peer_address(), header, bytes, left, stop);
      },
      [&](const absl::Status&, int) { ++*retries; });
  if (stop->cancelled()) return absl::AbortedError("round aborted");
  if (!s.ok()) {
    return Annotate(s, absl::StrCat("round ", round, ": pushing [", owner.begin(), ", ",
                                    owner.end(), ") to ", owner.worker_id()));
  }
  return s;
}

absl::StatusOr<std::string> Exchanger::TakePushed(const std::string& pusher, uint64_t round,
                                                  uint32_t attempt, uint64_t begin, uint64_t end,
                                                  bool encoded, absl::Time deadline,
                                                  CancellationToken* stop) {
  PushKey key{.round = round,
              .attempt = attempt,
              .pusher = pusher,
              .begin = begin,
              .end = end,
              .encoded = encoded};
  absl::StatusOr<std::string> bytes = options_.push_box->Take(key, deadline, stop);
  if (!bytes.ok() && stop->cancelled()) return absl::AbortedError("round aborted");
  if (bytes.ok() && !encoded && bytes->size() != (end - begin) * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat("push of ", pusher, " has ", bytes->size(),
                                                   " bytes for ", end - begin, " elements"));
  }
  return bytes;
}

absl::Status Exchanger::CombineOwnSlice(uint64_t round, const std::vector<const float*>& inputs,
                                        uint64_t count, float* out) {
  absl::StatusOr<AggregationSpec> applied =
      CombineContributions(options_.aggregation, inputs, count, out);
  if (!applied.ok()) return applied.status();
  std::string rule = AggregationName(*applied);
  if (rule != last_rule_) {
    if (applied->kind != options_.aggregation.kind) {
      SHOAL_LOG(WARNING) << "round " << round << ": " << inputs.size()
                         << " contributions are too few for "
                         << AggregationName(options_.aggregation) << " (needs "
                         << MinContributions(options_.aggregation)
                         << "): the owner takes their median";
    } else {
      SHOAL_LOG(INFO) << "round " << round << ": the owner combines " << inputs.size()
                      << " contributions by " << rule;
    }
    last_rule_ = std::move(rule);
  }
  return absl::OkStatus();
}

}  // namespace shoal::worker
