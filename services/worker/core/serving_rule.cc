#include "services/worker/core/serving_rule.h"

#include "absl/strings/str_cat.h"

namespace shoal::worker {

ServingDecision DecideRead(const ServingState& s, const shoal::v1::ReadSliceRequest& r) {
  ServingDecision d;
  auto refuse = [&d](absl::Status status, bool may_wait = false) {
    d.status = std::move(status);
    d.may_wait = may_wait;
    return d;
  };
  if (!s.bound) return refuse(absl::UnavailableError("this worker has no model yet"));
  if (r.end() <= r.begin()) {
    return refuse(absl::InvalidArgumentError(
        absl::StrCat("empty or reversed range [", r.begin(), ", ", r.end(), ")")));
  }
  if (r.end() > s.total_elements) {
    return refuse(absl::OutOfRangeError(absl::StrCat("range end ", r.end(), " is past the model's ",
                                                     s.total_elements, " elements")));
  }
  if (r.kind() != shoal::v1::CONTRIBUTION && r.kind() != shoal::v1::AVERAGED &&
      r.kind() != shoal::v1::SNAPSHOT) {
    return refuse(absl::InvalidArgumentError("kind must be CONTRIBUTION, AVERAGED or SNAPSHOT"));
  }
  if (r.stage() != 0) {
    // The stages of a hierarchical round are immutable copies served by
    // Peer.ReadEncoded (core/encoded_store.h), never lent model memory.
    return refuse(absl::InvalidArgumentError(
        absl::StrCat("stage ", r.stage(), " of a hierarchical round is read with ReadEncoded")));
  }
  if (s.shutting_down) return refuse(absl::UnavailableError("worker is shutting down"));
  if (r.kind() == shoal::v1::SNAPSHOT) {
    if (!s.has_snapshot || !s.snapshot_valid) {
      return refuse(absl::UnavailableError("the snapshot is being replaced"));
    }
    if (r.round() != s.snapshot_round) {
      return refuse(absl::FailedPreconditionError(absl::StrCat(
          "this worker holds the model of round ", s.snapshot_round, ", not ", r.round())));
    }
    d.buffer = ModelBuffer::kSnapshot;
    return d;
  }
  if (r.round() < s.round) {
    return refuse(absl::FailedPreconditionError(
        absl::StrCat("round ", r.round(), " is stale: this worker is at round ", s.round)));
  }
  if (r.round() > s.round) {
    return refuse(absl::FailedPreconditionError(
        absl::StrCat("round ", r.round(), " is in the future: this worker is at round ", s.round)));
  }
  if (!s.ready) {
    return refuse(absl::FailedPreconditionError(
        absl::StrCat("this worker has not finished training round ", s.round)));
  }
  if (s.has_plan && r.attempt() != s.attempt) {
    return refuse(absl::FailedPreconditionError(absl::StrCat(
        "plan attempt ", r.attempt(), " is not current (this worker is at ", s.attempt, ")")));
  }
  d.buffer = ModelBuffer::kParameters;
  if (r.kind() == shoal::v1::CONTRIBUTION) return d;
  if (!s.has_plan) {
    return refuse(absl::UnavailableError("the round's plan has not arrived here yet"),
                  /*may_wait=*/true);
  }
  if (r.begin() < s.own_begin || r.end() > s.own_end) {
    return refuse(absl::FailedPreconditionError(
        absl::StrCat("this worker owns [", s.own_begin, ", ", s.own_end, ") in round ", s.round,
                     ", not [", r.begin(), ", ", r.end(), ")")));
  }
  if (!s.averaged && r.begin() >= s.averaged_until) {
    // Served as far as it is averaged; the rest waits (the peer service
    // parks the stream there).
    return refuse(absl::UnavailableError("slice not averaged yet"), /*may_wait=*/true);
  }
  return d;
}

absl::Status DecideManifest(const ServingState& s, uint64_t round) {
  if (!s.bound || !s.has_snapshot) return absl::UnavailableError("this worker has no model yet");
  if (s.shutting_down) return absl::UnavailableError("worker is shutting down");
  if (!s.snapshot_valid) return absl::UnavailableError("the snapshot is being replaced");
  if (round != s.snapshot_round) {
    return absl::FailedPreconditionError(
        absl::StrCat("this worker holds the model of round ", s.snapshot_round, ", not ", round));
  }
  return absl::OkStatus();
}

}  // namespace shoal::worker
