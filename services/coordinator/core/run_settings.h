// Where the run config meets the round engine (docs/CONFIG.md): the
// coordinator's own settings of RunConfig (`timeouts`, `checkpoints`) as the
// engine's typed options and back, and the config a resumed run continues
// with. Pure functions, thread-safe.
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_RUN_SETTINGS_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_RUN_SETTINGS_H_

#include <string>

#include "services/coordinator/core/round_engine.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

// Sets the engine's deadlines, leases, retries, adaptive deadline, election
// and checkpointers from config.timeouts() and config.checkpoints().
void ApplyRunSettings(const shoal::v1::RunConfig& config, EngineOptions* options);

// The inverse: writes those options into config.timeouts() and
// config.checkpoints().checkpointers(), so that the config a run shows and
// records is what its engine uses (heartbeat_interval_ms, which only the
// workers use, is kept).
void RecordRunSettings(const EngineOptions& options, shoal::v1::RunConfig* config);

// The config a run resumed from `recorded` (its run record's) continues with
// when this coordinator was given `given`: the recorded model, training,
// mode, exchange and topology (they define the run), and this start's
// timeouts and checkpoints (a restart may lengthen a deadline or move the
// store). A record written by a build older than the grouped RunConfig holds
// none of the groups: then `given` whole. `*note` says what was kept, empty
// when the result equals `given`.
shoal::v1::RunConfig ResumedRunConfig(const shoal::v1::RunConfig& recorded,
                                      const shoal::v1::RunConfig& given, std::string* note);

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_RUN_SETTINGS_H_
