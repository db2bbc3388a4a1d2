// A coordinator for integration tests: the options every in-process
// CoordinatorServer test starts from (library test_coordinator, which links
// the coordinator; test_support does not, so unit tests stay light).
#ifndef SHOAL_TESTS_SUPPORT_COORDINATOR_FIXTURE_H_
#define SHOAL_TESTS_SUPPORT_COORDINATOR_FIXTURE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/coordinator/coordinator_server.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::testing {

// Listens on 127.0.0.1:0; run `run_id` of an MLP (learning rate 0.05,
// momentum 0.9, batch 32, 5 local steps), 2 rounds of at least 2
// participants on 2 data shards, seed 42, evaluation every round, 500 ms
// heartbeats. Everything else keeps the defaults of CoordinatorOptions; a
// test changes what it exercises before starting the server.
coordinator::CoordinatorOptions TestCoordinatorOptions(const std::string& run_id);

// Starts a CoordinatorServer with `options` on the real clock.
absl::StatusOr<std::unique_ptr<coordinator::CoordinatorServer>> StartTestCoordinator(
    const coordinator::CoordinatorOptions& options);

// The round a directive is about (RunFinished: its last round); 0 for those
// about no round (member lists, peer updates, routes, checkpoints).
uint64_t DirectiveRound(const shoal::v1::CoordinatorMessage& m);

}  // namespace shoal::testing

#endif  // SHOAL_TESTS_SUPPORT_COORDINATOR_FIXTURE_H_
