// Durable storage of the coordinator's RunRecord: written with temp file +
// fsync + rename (+ directory fsync), so a kill -9 leaves either the old or
// the new record, never a torn one.
#ifndef SHOAL_BENCH_PROTO_COORDINATOR_CORE_RUN_RECORD_H_
#define SHOAL_BENCH_PROTO_COORDINATOR_CORE_RUN_RECORD_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

class RunRecordStore {
 public:
  // `dir` is created if missing. Empty `dir` = no persistence (all no-ops).
  explicit RunRecordStore(std::string dir) : dir_(std::move(dir)) {}

  // Creates the directory; FAILED_PRECONDITION when it cannot be used.
  absl::Status Open();
  // nullopt when no record exists yet; DATA_LOSS when it is unreadable.
  absl::StatusOr<std::optional<shoal::v1::RunRecord>> Load() const;
  absl::Status Save(const shoal::v1::RunRecord& record) const;

  bool enabled() const { return !dir_.empty(); }
  std::string path() const { return dir_ + "/run_record.pb"; }

 private:
  std::string dir_;
};

// Writes `bytes` to `path` atomically (temp + fsync + rename + dir fsync).
absl::Status WriteFileAtomically(const std::string& path, const std::string& bytes);

}  // namespace shoal::coordinator

#endif  // SHOAL_BENCH_PROTO_COORDINATOR_CORE_RUN_RECORD_H_
