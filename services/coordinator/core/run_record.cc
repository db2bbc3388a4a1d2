#include "services/coordinator/core/run_record.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace shoal::coordinator {
namespace {

absl::Status ErrnoStatus(const std::string& what) {
  const int e = errno;
  const std::string msg = absl::StrCat(what, ": ", std::strerror(e));
  if (e == ENOSPC || e == EDQUOT) return absl::ResourceExhaustedError(msg);
  return absl::FailedPreconditionError(msg);
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("cannot create " + tmp);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = ErrnoStatus("cannot write " + tmp);
      close(fd);
      return s;
    }
    done += n;
  }
  if (fsync(fd) != 0) {
    absl::Status s = ErrnoStatus("cannot fsync " + tmp);
    close(fd);
    return s;
  }
  close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0) return ErrnoStatus("cannot rename " + tmp);
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int dfd = open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return absl::OkStatus();
}

absl::Status RunRecordStore::Open() {
  if (!enabled()) return absl::OkStatus();
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state_dir ", dir_, " cannot be created: ", ec.message()));
  }
  if (access(dir_.c_str(), W_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("--state_dir ", dir_, " is not writable"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<shoal::v1::RunRecord>> RunRecordStore::Load() const {
  if (!enabled()) return std::optional<shoal::v1::RunRecord>();
  std::ifstream in(path(), std::ios::binary);
  if (!in) return std::optional<shoal::v1::RunRecord>();
  std::stringstream ss;
  ss << in.rdbuf();
  shoal::v1::RunRecord record;
  if (!record.ParseFromString(ss.str()) || record.run_id().empty()) {
    return absl::DataLossError(absl::StrCat(path(), " is not a valid run record"));
  }
  // Round numbers count up from here: leave them room (a record claiming
  // round 2^64-1 would make the next round 0).
  constexpr uint64_t kMaxRound = uint64_t{1} << 62;
  if (record.last_completed_round() > kMaxRound || record.checkpoint_round() > kMaxRound) {
    return absl::DataLossError(absl::StrCat(path(), " names round ", record.last_completed_round(),
                                            ", past the largest round this coordinator runs"));
  }
  // Worker numbers likewise (the next id after w(2^64-1) would be w0).
  constexpr uint64_t kMaxWorkerNumber = uint64_t{1} << 62;
  if (record.next_worker_number() > kMaxWorkerNumber) {
    return absl::DataLossError(absl::StrCat(path(), " names worker number ",
                                            record.next_worker_number(),
                                            ", past the largest this coordinator hands out"));
  }
  return std::optional<shoal::v1::RunRecord>(record);
}

absl::Status RunRecordStore::Save(const shoal::v1::RunRecord& record) const {
  if (!enabled()) return absl::OkStatus();
  return WriteFileAtomically(path(), record.SerializeAsString());
}

}  // namespace shoal::coordinator
