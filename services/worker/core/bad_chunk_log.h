// The peers that sent this worker bad chunks (a slice or an encoded piece
// that failed its CRC-32C or did not parse: DATA_LOSS) since the last
// heartbeat. The exchange notes them; the next heartbeat carries them to
// the coordinator (Heartbeat.bad_chunks_from), where two members reporting
// the same peer in one round move its score (docs/SECURITY.md "Audits,
// scores and bans"). Thread-safe: the exchange's reader threads note, the
// session's heartbeat thread takes.
#ifndef SHOAL_SERVICES_WORKER_CORE_BAD_CHUNK_LOG_H_
#define SHOAL_SERVICES_WORKER_CORE_BAD_CHUNK_LOG_H_

#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace shoal::worker {

class BadChunkLog {
 public:
  void Note(const std::string& address) {
    absl::MutexLock lock(&mu_);
    if (addresses_.size() < kMax) addresses_.insert(address);
  }
  // The addresses noted since the last call, each once.
  std::vector<std::string> Take() {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> out(addresses_.begin(), addresses_.end());
    addresses_.clear();
    return out;
  }

 private:
  static constexpr size_t kMax = 64;
  absl::Mutex mu_;
  std::set<std::string> addresses_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_BAD_CHUNK_LOG_H_
