// An auditor's side of an audit by replay (AuditRequest; docs/SECURITY.md
// "Audits, scores and bans"): this worker trains another participant's
// samples of the round from the round's base model, which it holds itself
// (the snapshot buffer keeps the agreed model while it waits for the
// plan), with a fresh optimizer on a separate instance of the model
// (Trainer::Replay), and reports the hash of the result. It never learns
// the hash it should find. Nothing of its own model or round changes.
#ifndef SHOAL_SERVICES_WORKER_AUDIT_REPLAY_H_
#define SHOAL_SERVICES_WORKER_AUDIT_REPLAY_H_

#include <string>

#include "absl/status/status.h"
#include "services/worker/runner.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::worker {

// Replays `request` and reports it (ReportAudit) as `worker_id`, whose
// agreed model is of `agreed_round` with `agreed_hash`. A replay that
// cannot run (another base, a trainer that cannot replay) is reported with
// its error, so the coordinator drops the audit and blames nobody. Returns
// the report's status.
absl::Status ReplayAudit(const RunnerParts& parts, const std::string& worker_id,
                         uint64_t agreed_round, const std::string& agreed_hash,
                         const shoal::v1::AuditRequest& request);

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_AUDIT_REPLAY_H_
