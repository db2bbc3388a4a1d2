#include "services/worker/memory_transport.h"

#include "absl/strings/str_cat.h"

namespace shoal::worker {

absl::Status MemoryTransport::Publish(const GroupStep& step, const float* in,
                                      const StepCall& call) {
  if (!codec_->raw()) {
    return absl::FailedPreconditionError(
        absl::StrCat("codec ", codec_->name(), " cannot travel from model memory"));
  }
  // Our contributions are served from the parameters (ModelState: the
  // trained model became readable when training ended). What peers read of
  // us: our contribution to every other owner, our slice to every other.
  const SliceRange own = step.own();
  const uint64_t total = state_->total_elements();
  const uint64_t mine = own.end - own.begin;
  call.counters->published += ((total - mine) + mine * (step.members.size() - 1)) * sizeof(float);
  return absl::OkStatus();
}

absl::Status MemoryTransport::PushContribution(const GroupStep& step, int k, const float* in,
                                               const StepCall& call, CancellationToken* stop) {
  const GroupMember& owner = step.members[k];
  const SliceRange s = step.slices[k];
  return PushToOwner(io_, owner.id, owner.address, call.round, call.attempt, s.begin, s.end,
                     call.self_id, /*encoded=*/false,
                     absl::string_view(reinterpret_cast<const char*>(in + s.begin),
                                       (s.end - s.begin) * sizeof(float)),
                     call.deadline, stop, &call.counters->retries);
}

const float* MemoryTransport::OwnContribution(const GroupStep& step, const float* in) {
  return in + step.own().begin;
}

std::shared_ptr<ResumeHandle> MemoryTransport::StartReadContribution(const GroupStep& step, int k,
                                                                     const StepCall& call,
                                                                     CancellationToken* stop,
                                                                     ChunkSink sink,
                                                                     ReadDone done) {
  const SliceRange own = step.own();
  const GroupMember& member = step.members[k];
  StepCounters* counters = call.counters;
  auto count = [counters](const ChunkView& c) {
    const uint64_t bytes = c.count * sizeof(float);
    counters->received += bytes;
    counters->raw_received += bytes;
    counters->reduce_bytes += bytes;
  };
  if (member.outbound_only) {
    // Behind NAT: its contribution was pushed to us (checked whole).
    StartTakePushed(io_, member.id, call.round, call.attempt, own.begin, own.end,
                    /*encoded=*/false, call.deadline, stop,
                    [own, count, sink = std::move(sink),
                     done = std::move(done)](absl::StatusOr<std::string> pushed) {
                      if (!pushed.ok()) return done(pushed.status());
                      ChunkView view;
                      view.begin = own.begin;
                      view.data = reinterpret_cast<const float*>(pushed->data());
                      view.count = own.end - own.begin;
                      count(view);
                      ReduceNext next;
                      done(sink(view, &next));
                    });
    return nullptr;
  }
  // The receiver checked that each chunk lies in [own.begin, own.end).
  SliceReadSpec spec{member.address, shoal::v1::CONTRIBUTION,
                     call.round,     call.attempt,
                     own.begin,      own.end,
                     call.self_id,   call.deadline,
                     stop,           &call.counters->retries};
  return SliceRead::Start(
      io_, std::move(spec),
      [count, sink = std::move(sink)](const ChunkView& c, ChunkNext* next) {
        count(c);
        ReduceNext reduce = ReduceNext::kRead;
        absl::Status s = sink(c, &reduce);
        if (reduce == ReduceNext::kPause) *next = ChunkNext::kPause;
        return s;
      },
      std::move(done));
}

void MemoryTransport::PublishAveragePrefix(const GroupStep& step, const float* avg, uint64_t until,
                                           const StepCall& call) {
  // fp32 travels as it is (a raw codec's round trip is the identity): the
  // cells are served as the reduce completes them.
  state_->MarkAveragedUntil(call.round, until);
}

absl::Status MemoryTransport::PublishAverage(const GroupStep& step, float* avg,
                                             const StepCall& call) {
  const SliceRange own = step.own();
  codec_->RoundTripAverage(avg, own.end - own.begin);
  state_->MarkAveraged(call.round);
  return absl::OkStatus();
}

void MemoryTransport::StartReadAverage(const GroupStep& step, int k, float* dst,
                                       const StepCall& call, CancellationToken* stop,
                                       ReadDone done) {
  const SliceRange s = step.slices[k];
  SliceReadSpec spec{step.members[k].address,
                     shoal::v1::AVERAGED,
                     call.round,
                     call.attempt,
                     s.begin,
                     s.end,
                     call.self_id,
                     call.deadline,
                     stop,
                     &call.counters->retries};
  StepCounters* counters = call.counters;
  const Codec* codec = codec_;
  SliceRead::Start(
      io_, std::move(spec),
      [counters, codec, dst, s](const ChunkView& c, ChunkNext*) {
        counters->received += c.count * sizeof(float);
        counters->raw_received += c.count * sizeof(float);
        return codec->ApplyAverage(c, dst + (c.begin - s.begin));
      },
      std::move(done));
}

}  // namespace shoal::worker
