// Which reads of its model a worker may serve right now: a pure decision
// over a copy of the worker's serving state (round, trained or not, plan
// attempt and owned slice, averaged or not, snapshot, shutting down). No
// locks, clock or gRPC; ModelState takes the copy under its lock and asks.
#ifndef SHOAL_SERVICES_WORKER_CORE_SERVING_RULE_H_
#define SHOAL_SERVICES_WORKER_CORE_SERVING_RULE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "shoal/v1/peer.pb.h"

namespace shoal::worker {

// Which memory a read is served from.
enum class ModelBuffer { kParameters, kSnapshot };

// What the rule looks at.
struct ServingState {
  // Model memory attached (ModelState::Bind) and its size.
  bool bound = false;
  uint64_t total_elements = 0;
  // The round the worker is in, and whether its contribution is trained.
  uint64_t round = 0;
  bool ready = false;
  // The round's plan (attempt) and the slice [own_begin, own_end) it gives
  // this worker; `averaged` once that slice holds the average.
  bool has_plan = false;
  uint32_t attempt = 0;
  uint64_t own_begin = 0;
  uint64_t own_end = 0;
  bool averaged = false;
  // Before the whole slice is: [own_begin, averaged_until) holds the
  // average already (the reduce publishes it cell by cell).
  uint64_t averaged_until = 0;
  // The snapshot buffer: attached, holding the averaged model of
  // `snapshot_round` (`snapshot_valid`), or being replaced.
  bool has_snapshot = false;
  bool snapshot_valid = false;
  uint64_t snapshot_round = 0;
  bool shutting_down = false;
};

struct ServingDecision {
  // OK: serve from `buffer`. UNAVAILABLE: may be served later (no model
  // yet, slice not averaged yet, no plan yet, snapshot being replaced,
  // shutting down). Every other code is final: INVALID_ARGUMENT (empty or
  // reversed range, no kind), OUT_OF_RANGE (past the end),
  // FAILED_PRECONDITION (stale or future round, not trained yet, another
  // plan attempt, a slice the worker does not own, another snapshot round).
  absl::Status status;
  ModelBuffer buffer = ModelBuffer::kParameters;
  // The refusal is an AVERAGED read that a change of state can turn into
  // OK (no plan yet, not averaged yet): the peer service parks it.
  bool may_wait = false;
};

ServingDecision DecideRead(const ServingState& state, const shoal::v1::ReadSliceRequest& request);

// Whether the snapshot of `round` may be described (Peer.GetManifest): OK;
// UNAVAILABLE (no model or snapshot, being replaced, shutting down);
// FAILED_PRECONDITION (the snapshot holds another round).
absl::Status DecideManifest(const ServingState& state, uint64_t round);

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_SERVING_RULE_H_
