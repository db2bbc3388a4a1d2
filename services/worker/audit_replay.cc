#include "services/worker/audit_replay.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "services/worker/coordinator_client.h"
#include "services/worker/core/model_memory.h"
#include "services/worker/core/trainer.h"

namespace shoal::worker {

absl::Status ReplayAudit(const RunnerParts& parts, const std::string& worker_id,
                         uint64_t agreed_round, const std::string& agreed_hash,
                         const shoal::v1::AuditRequest& request) {
  shoal::v1::ReportAuditRequest report;
  report.set_worker_id(worker_id);
  report.set_round(request.round());
  report.set_audit_id(request.audit_id());
  const absl::Time t0 = parts.clock->Now();
  if (agreed_round != request.base_model_round() || agreed_hash != request.base_model_hash()) {
    report.set_error(absl::StrCat("this worker holds the model of round ", agreed_round,
                                  ", not the round's base (round ", request.base_model_round(),
                                  ")"));
  } else {
    const std::vector<shoal::v1::SampleRange> samples(request.samples().begin(),
                                                      request.samples().end());
    absl::StatusOr<std::string> hash =
        parts.trainer->Replay(parts.memory->snapshot(), samples, request.round());
    if (hash.ok()) {
      report.set_replay_hash(*hash);
    } else {
      report.set_error(std::string(hash.status().message()));
    }
  }
  report.set_replay_seconds(absl::ToDoubleSeconds(parts.clock->Now() - t0));
  if (report.error().empty()) {
    SHOAL_LOG(INFO) << "round " << request.round() << ": replayed the work of "
                    << request.participant() << " (audit " << request.audit_id() << ") in "
                    << absl::StrFormat("%.2fs", report.replay_seconds());
  } else {
    SHOAL_LOG(WARNING) << "round " << request.round() << ": cannot replay the work of "
                       << request.participant() << ": " << report.error();
  }
  absl::Status s = parts.coordinator->ReportAudit(report);
  if (!s.ok()) {
    SHOAL_LOG(WARNING) << "round " << request.round()
                       << ": the audit report was not taken: " << s.message();
  }
  return s;
}

}  // namespace shoal::worker
