#include "services/worker/blob_transport.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/retry.h"
#include "services/worker/blob_reader.h"

namespace shoal::worker {

BlobTransport::BlobTransport(SliceIo io, EncodedStore* store, const Codec* codec,
                             StageFeedback* feedback, uint64_t total)
    : io_(io),
      store_(store),
      codec_(codec),
      feedback_(codec->lossy() ? feedback : nullptr),
      total_(total) {}

uint64_t BlobTransport::SliceSeed(uint64_t round, uint32_t stage, uint64_t begin) {
  return (round * 0x9E3779B97F4A7C15ull ^ (begin + 0x632BE59BD9B4E019ull)) ^
         (uint64_t{stage} * 0xBF58476D1CE4E5B9ull);
}

Blob BlobTransport::Encode(const float* src, size_t n, uint64_t seed, float* residual) const {
  if (residual != nullptr) {
    return std::make_shared<const std::string>(EncodeWithFeedback(*codec_, src, n, seed, residual));
  }
  return std::make_shared<const std::string>(codec_->EncodeSlice(src, n, seed));
}

absl::Status BlobTransport::Decode(const std::string& bytes, SliceRange range, float* out) const {
  return codec_->DecodeSlice(
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
      range.end - range.begin, out);
}

void BlobTransport::Record(shoal::v1::SliceKind kind, SliceRange range, Blob blob,
                           const StepCall& call, uint32_t stage) {
  store_->Publish(call.round, call.attempt, kind, range.begin, range.end, blob, stage);
  published_.push_back({kind, range, std::move(blob)});
}

void BlobTransport::StartRead(const std::string& address, shoal::v1::SliceKind kind, uint32_t stage,
                              SliceRange range, const StepCall& call, CancellationToken* stop,
                              std::function<void(absl::StatusOr<std::string>)> done) const {
  RetryPolicy policy;
  policy.initial_backoff = io_.initial_backoff;
  policy.max_backoff = io_.max_backoff;
  shoal::v1::ReadEncodedRequest request;
  request.set_round(call.round);
  request.set_attempt(call.attempt);
  request.set_stage(stage);
  request.set_kind(kind);
  request.set_begin(range.begin);
  request.set_end(range.end);
  request.set_reader_id(call.self_id);
  const size_t n = range.end - range.begin;
  const BlobLimits limits{codec_->MaxEncodedBytes(n), codec_->raw()};
  BadChunkLog* bad_chunks = io_.bad_chunks;
  StartBlobRead(io_.peers, address, request, limits, std::move(policy), call.deadline, io_.clock,
                stop, &call.counters->retries,
                [bad_chunks, address, done = std::move(done)](absl::StatusOr<std::string> blob) {
                  if (absl::IsDataLoss(blob.status()) && bad_chunks != nullptr) {
                    bad_chunks->Note(address);
                  }
                  done(std::move(blob));
                });
}

absl::Status BlobTransport::Publish(const GroupStep& step, const float* in, const StepCall& call) {
  const size_t n = step.members.size();
  const SliceRange own = step.own();
  if (feedback_ != nullptr) {
    if (feedback_->contribution.size() != total_) feedback_->contribution.assign(total_, 0.0f);
    const SliceRange old = feedback_->owner_range;
    if (old.begin != own.begin || old.end != own.end ||
        feedback_->owner.size() != own.end - own.begin) {
      // What the average of a slice we no longer own left out is not
      // carried into a later ownership of it (it would arrive rounds late);
      // the part we still own keeps its leftover.
      std::vector<float> moved(own.end - own.begin, 0.0f);
      const uint64_t b = std::max(old.begin, own.begin);
      const uint64_t e = std::min(old.end, own.end);
      if (b < e && feedback_->owner.size() == old.end - old.begin) {
        std::copy(feedback_->owner.begin() + (b - old.begin),
                  feedback_->owner.begin() + (e - old.begin), moved.begin() + (b - own.begin));
      }
      feedback_->owner = std::move(moved);
      feedback_->owner_range = own;
    }
  }
  contributions_.assign(n, nullptr);
  own_decoded_.clear();
  published_.clear();
  {
    absl::MutexLock lock(&pieces_mu_);
    pieces_.clear();
  }
  for (size_t k = 0; k < n; ++k) {
    const SliceRange s = step.slices[k];
    if (s.begin == s.end) continue;
    Blob blob = Encode(in + s.begin, s.end - s.begin, SliceSeed(call.round, step.stage, s.begin),
                       feedback_ != nullptr ? feedback_->contribution.data() + s.begin : nullptr);
    if (static_cast<int>(k) == step.self) {
      // Our own contribution counts as the others would decode it.
      if (codec_->lossy()) {
        own_decoded_.resize(s.end - s.begin);
        if (absl::Status d = Decode(*blob, s, own_decoded_.data()); !d.ok()) return d;
      }
      continue;
    }
    call.counters->published += blob->size();
    contributions_[k] = blob;
    Record(shoal::v1::CONTRIBUTION, s, std::move(blob), call, step.stage);
  }
  return absl::OkStatus();
}

absl::Status BlobTransport::PushContribution(const GroupStep& step, int k, const float* in,
                                             const StepCall& call, CancellationToken* stop) {
  const GroupMember& owner = step.members[k];
  const SliceRange s = step.slices[k];
  return PushToOwner(io_, owner.id, owner.address, call.round, call.attempt, s.begin, s.end,
                     call.self_id, /*encoded=*/true, *contributions_[k], call.deadline, stop,
                     &call.counters->retries);
}

const float* BlobTransport::OwnContribution(const GroupStep& step, const float* in) {
  return codec_->lossy() ? own_decoded_.data() : in + step.own().begin;
}

std::shared_ptr<ResumeHandle> BlobTransport::StartReadContribution(const GroupStep& step, int k,
                                                                   const StepCall& call,
                                                                   CancellationToken* stop,
                                                                   ChunkSink sink, ReadDone done) {
  const SliceRange own = step.own();
  const uint64_t count = own.end - own.begin;
  const GroupMember member = step.members[k];
  StepCounters* counters = call.counters;
  // The whole blob, decoded, is one chunk: the reduce takes it at once.
  auto take = [this, own, count, member, counters, sink = std::move(sink),
               done = std::move(done)](absl::StatusOr<std::string> bytes) {
    if (!bytes.ok()) return done(bytes.status());
    if (bytes->size() > codec_->MaxEncodedBytes(count)) {
      return done(absl::InvalidArgumentError(absl::StrCat("contribution of ", member.id, " is ",
                                                          bytes->size(), " bytes, at most ",
                                                          codec_->MaxEncodedBytes(count))));
    }
    counters->received += bytes->size();
    counters->raw_received += count * sizeof(float);
    counters->reduce_bytes += bytes->size();
    std::vector<float> decoded(count);
    if (absl::Status d = Decode(*bytes, own, decoded.data()); !d.ok()) return done(d);
    bytes->clear();
    ChunkView view;
    view.begin = own.begin;
    view.data = decoded.data();
    view.count = count;
    ReduceNext next;
    done(sink(view, &next));
  };
  if (member.outbound_only) {
    StartTakePushed(io_, member.id, call.round, call.attempt, own.begin, own.end,
                    /*encoded=*/true, call.deadline, stop, std::move(take));
  } else {
    StartRead(member.address, shoal::v1::CONTRIBUTION, step.stage, own, call, stop,
              std::move(take));
  }
  return nullptr;
}

absl::Status BlobTransport::PublishAverage(const GroupStep& step, float* avg,
                                           const StepCall& call) {
  const SliceRange own = step.own();
  const uint64_t count = own.end - own.begin;
  if (count == 0) return absl::OkStatus();
  // Encoded once, with the owner's own error feedback (what this encoding
  // leaves out is added to the slice's next average: without it topk:F
  // would lose most of the averaged change for good); we keep what
  // everyone decodes, so the vectors stay bit-identical whatever the owner
  // keeps.
  Blob blob = Encode(avg, count, SliceSeed(call.round, step.stage, own.begin),
                     feedback_ != nullptr ? feedback_->owner.data() : nullptr);
  if (codec_->lossy()) {
    if (absl::Status d = Decode(*blob, own, avg); !d.ok()) return d;
  }
  call.counters->published += blob->size() * (step.members.size() - 1);
  {
    absl::MutexLock lock(&pieces_mu_);
    pieces_.push_back({own, blob});
  }
  Record(shoal::v1::AVERAGED, own, std::move(blob), call, step.stage);
  return absl::OkStatus();
}

void BlobTransport::StartReadAverage(const GroupStep& step, int k, float* dst, const StepCall& call,
                                     CancellationToken* stop, ReadDone done) {
  const SliceRange s = step.slices[k];
  StepCounters* counters = call.counters;
  const bool keep = step.stage > 0;  // a later broadcast may forward it
  StartRead(
      step.members[k].address, shoal::v1::AVERAGED, step.stage, s, call, stop,
      [this, s, dst, counters, keep, done = std::move(done)](absl::StatusOr<std::string> bytes) {
        if (!bytes.ok()) return done(bytes.status());
        counters->received += bytes->size();
        counters->raw_received += (s.end - s.begin) * sizeof(float);
        if (absl::Status d = Decode(*bytes, s, dst); !d.ok()) return done(d);
        if (keep) {
          absl::MutexLock lock(&pieces_mu_);
          pieces_.push_back({s, std::make_shared<const std::string>(*std::move(bytes))});
        }
        done(absl::OkStatus());
      });
}

std::vector<HeldPiece> BlobTransport::TakePieces() {
  absl::MutexLock lock(&pieces_mu_);
  std::vector<HeldPiece> out = std::move(pieces_);
  pieces_.clear();
  std::sort(out.begin(), out.end(),
            [](const HeldPiece& a, const HeldPiece& b) { return a.range.begin < b.range.begin; });
  return out;
}

absl::Status BlobTransport::Broadcast(const GroupStep& step, float* model,
                                      std::vector<HeldPiece>* held, const StepCall& call,
                                      CancellationToken* cancel) {
  published_.clear();
  std::vector<SliceRange> ranges;
  for (const SliceRange& r : step.pieces) {
    if (r.begin < r.end) ranges.push_back(r);
  }
  if (step.self == step.head) {
    bool same = held->size() == ranges.size();
    for (size_t i = 0; same && i < ranges.size(); ++i) {
      same = (*held)[i].range.begin == ranges[i].begin && (*held)[i].range.end == ranges[i].end;
    }
    if (!same) {
      return absl::InternalError(absl::StrCat("stage ", step.stage, ": this head holds ",
                                              held->size(), " pieces, the plan expects ",
                                              ranges.size()));
    }
    for (const HeldPiece& p : *held) {
      call.counters->published += p.blob->size() * (step.members.size() - 1);
      Record(shoal::v1::STAGE_MODEL, p.range, p.blob, call, step.stage);
    }
    return absl::OkStatus();
  }
  const std::string& head = step.members[step.head].address;
  CancellationToken stop(cancel);
  std::vector<HeldPiece> got(ranges.size());
  ReadLatch reads(ranges.size());
  for (size_t i = 0; i < ranges.size(); ++i) {
    const SliceRange r = ranges[i];
    ReadDone done = reads.Add(i);
    StartRead(head, shoal::v1::STAGE_MODEL, step.stage, r, call, &stop,
              [this, r, i, model, &got, &call, &stop,
               done = std::move(done)](absl::StatusOr<std::string> bytes) {
                absl::Status s = bytes.status();
                if (bytes.ok()) {
                  call.counters->received += bytes->size();
                  call.counters->raw_received += (r.end - r.begin) * sizeof(float);
                  s = Decode(*bytes, r, model + r.begin);
                  got[i] = {r, std::make_shared<const std::string>(*std::move(bytes))};
                }
                if (!s.ok()) stop.Cancel();
                done(std::move(s));
              });
  }
  reads.Wait(absl::Now() + (call.deadline - call.clock->Now()) + absl::Seconds(5), &stop);
  absl::Status result = FirstError(reads.statuses());
  if (result.ok() && stop.cancelled()) result = absl::AbortedError("round aborted");
  if (result.ok()) *held = std::move(got);
  return result;
}

}  // namespace shoal::worker
