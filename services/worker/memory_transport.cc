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

absl::Status MemoryTransport::ReadContribution(const GroupStep& step, int k, const StepCall& call,
                                               CancellationToken* stop, const ChunkSink& sink) {
  const SliceRange own = step.own();
  const GroupMember& member = step.members[k];
  auto apply = [&](const ChunkView& c) {
    const uint64_t bytes = c.count * sizeof(float);
    call.counters->received += bytes;
    call.counters->raw_received += bytes;
    call.counters->reduce_bytes += bytes;
    return sink(c);
  };
  if (member.outbound_only) {
    // Behind NAT: its contribution was pushed to us (checked whole).
    absl::StatusOr<std::string> pushed =
        TakePushed(io_, member.id, call.round, call.attempt, own.begin, own.end,
                   /*encoded=*/false, call.deadline, stop);
    if (!pushed.ok()) return pushed.status();
    ChunkView view;
    view.begin = own.begin;
    view.data = reinterpret_cast<const float*>(pushed->data());
    view.count = own.end - own.begin;
    return apply(view);
  }
  // The receiver checked that each chunk lies in [own.begin, own.end).
  return ReadRawSlice(io_, member.address, shoal::v1::CONTRIBUTION, call.round, call.attempt,
                      own.begin, own.end, call.self_id, call.deadline, stop, apply,
                      &call.counters->retries);
}

absl::Status MemoryTransport::PublishAverage(const GroupStep& step, float* avg,
                                             const StepCall& call) {
  const SliceRange own = step.own();
  codec_->RoundTripAverage(avg, own.end - own.begin);
  state_->MarkAveraged(call.round);
  return absl::OkStatus();
}

absl::Status MemoryTransport::ReadAverage(const GroupStep& step, int k, float* dst,
                                          const StepCall& call, CancellationToken* stop) {
  const SliceRange s = step.slices[k];
  return ReadRawSlice(
      io_, step.members[k].address, shoal::v1::AVERAGED, call.round, call.attempt, s.begin, s.end,
      call.self_id, call.deadline, stop,
      [&](const ChunkView& c) {
        call.counters->received += c.count * sizeof(float);
        call.counters->raw_received += c.count * sizeof(float);
        return codec_->ApplyAverage(c, dst + (c.begin - s.begin));
      },
      &call.counters->retries);
}

}  // namespace shoal::worker
