#include "services/coordinator/core/run_settings.h"

#include <algorithm>
#include <limits>

#include "google/protobuf/util/message_differencer.h"

namespace shoal::coordinator {
namespace {

uint32_t Ms(absl::Duration d) {
  return static_cast<uint32_t>(
      std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 0, std::numeric_limits<uint32_t>::max()));
}

}  // namespace

void ApplyRunSettings(const shoal::v1::RunConfig& config, EngineOptions* o) {
  const shoal::v1::TimeoutsConfig& t = config.timeouts();
  o->heartbeat_lease = absl::Milliseconds(t.heartbeat_lease_ms());
  // A joined worker that opens no session is gone as soon as a silent one.
  o->session_grace = absl::Milliseconds(t.heartbeat_lease_ms());
  o->round_timeout = absl::Milliseconds(t.round_timeout_ms());
  o->connection_timeout = absl::Milliseconds(t.connection_timeout_ms());
  o->max_connection_retry = t.max_connection_retry();
  o->max_missed_rounds = t.max_missed_rounds();
  o->adaptive_deadline.enabled = t.adaptive_deadline().enabled();
  o->adaptive_deadline.after_rounds = t.adaptive_deadline().rounds();
  o->adaptive_deadline.factor = t.adaptive_deadline().factor();
  o->adaptive_deadline.floor = absl::Milliseconds(t.adaptive_deadline().floor_ms());
  o->checkpoint_timeout = absl::Milliseconds(t.checkpoint_timeout_ms());
  o->election.switch_factor = t.election().switch_factor();
  o->election.switch_evaluations = t.election().switch_rounds();
  o->election.min_tenure = absl::Milliseconds(t.election().min_tenure_ms());
  o->checkpointers = config.checkpoints().checkpointers();
}

void RecordRunSettings(const EngineOptions& o, shoal::v1::RunConfig* config) {
  shoal::v1::TimeoutsConfig* t = config->mutable_timeouts();
  t->set_heartbeat_lease_ms(Ms(o.heartbeat_lease));
  t->set_round_timeout_ms(Ms(o.round_timeout));
  t->set_connection_timeout_ms(Ms(o.connection_timeout));
  t->set_max_connection_retry(o.max_connection_retry);
  t->set_max_missed_rounds(o.max_missed_rounds);
  shoal::v1::AdaptiveDeadlineConfig* a = t->mutable_adaptive_deadline();
  a->set_enabled(o.adaptive_deadline.enabled);
  a->set_rounds(o.adaptive_deadline.after_rounds);
  a->set_factor(o.adaptive_deadline.factor);
  a->set_floor_ms(Ms(o.adaptive_deadline.floor));
  t->set_checkpoint_timeout_ms(Ms(o.checkpoint_timeout));
  shoal::v1::ElectionConfig* e = t->mutable_election();
  e->set_switch_factor(o.election.switch_factor);
  e->set_switch_rounds(o.election.switch_evaluations);
  e->set_min_tenure_ms(Ms(o.election.min_tenure));
  config->mutable_checkpoints()->set_checkpointers(o.checkpointers);
}

shoal::v1::RunConfig ResumedRunConfig(const shoal::v1::RunConfig& recorded,
                                      const shoal::v1::RunConfig& given, std::string* note) {
  note->clear();
  if (!recorded.has_model()) {
    *note =
        "the run record was written by an older build (its configuration has the flat shape, "
        "which this build does not read); the run continues with the configuration given now";
    return given;
  }
  shoal::v1::RunConfig out = recorded;
  *out.mutable_timeouts() = given.timeouts();
  *out.mutable_checkpoints() = given.checkpoints();
  if (!google::protobuf::util::MessageDifferencer::Equals(out, given)) {
    *note =
        "the run record's model, training, mode, exchange or topology differ from the "
        "configuration given; the run continues with the recorded ones (timeouts and checkpoints "
        "as given)";
  }
  return out;
}

}  // namespace shoal::coordinator
