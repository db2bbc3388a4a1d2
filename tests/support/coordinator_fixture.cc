#include "tests/support/coordinator_fixture.h"

#include "common/clock.h"

namespace shoal::testing {

coordinator::CoordinatorOptions TestCoordinatorOptions(const std::string& run_id) {
  coordinator::CoordinatorOptions options;
  options.listen = "127.0.0.1:0";
  options.engine.run_id = run_id;
  auto& c = options.engine.config;
  c.mutable_model()->set_name("mlp");
  c.mutable_training()->set_learning_rate(0.05);
  c.mutable_training()->set_momentum(0.9);
  c.mutable_training()->set_batch_size(32);
  c.mutable_training()->set_local_steps(5);
  c.mutable_sync()->set_min_participants(2);
  c.mutable_sync()->set_rounds(2);
  c.mutable_training()->set_seed(42);
  c.mutable_training()->set_data_shards(2);
  c.mutable_training()->set_eval_every(1);
  c.mutable_timeouts()->set_heartbeat_interval_ms(500);
  return options;
}

absl::StatusOr<std::unique_ptr<coordinator::CoordinatorServer>> StartTestCoordinator(
    const coordinator::CoordinatorOptions& options) {
  return coordinator::CoordinatorServer::Start(options, RealClock::Get());
}

uint64_t DirectiveRound(const shoal::v1::CoordinatorMessage& m) {
  using shoal::v1::CoordinatorMessage;
  switch (m.kind_case()) {
    case CoordinatorMessage::kRoundStart:
      return m.round_start().round();
    case CoordinatorMessage::kRoundPlan:
      return m.round_plan().round();
    case CoordinatorMessage::kStartSharing:
      return m.start_sharing().round();
    case CoordinatorMessage::kRoundComplete:
      return m.round_complete().round();
    case CoordinatorMessage::kRunFinished:
      return m.run_finished().last_round();
    case CoordinatorMessage::kRoundAborted:
      return m.round_aborted().round();
    case CoordinatorMessage::kRetryConnections:
      return m.retry_connections().round();
    case CoordinatorMessage::kConnectionFail:
      return m.connection_fail().round();
    case CoordinatorMessage::kRoundMissed:
      return m.round_missed().round();
    default:
      return 0;
  }
}

}  // namespace shoal::testing
