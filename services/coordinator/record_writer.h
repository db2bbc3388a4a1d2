// The thread the coordinator's run record is written on, so that no gRPC
// thread waits on a write (an fsync in --state_dir, an etcd transaction with
// --etcd): a call whose engine step changed the record queues its directives
// and its answer behind the write (CoordinatorService::Deliver), and they go
// out from here once the record that produced them is written, in the order
// they were queued.
#ifndef SHOAL_SERVICES_COORDINATOR_RECORD_WRITER_H_
#define SHOAL_SERVICES_COORDINATOR_RECORD_WRITER_H_

#include <deque>
#include <functional>
#include <thread>

#include "absl/synchronization/mutex.h"

namespace shoal::coordinator {

// Thread-safe. Tasks run one at a time, in the order posted, outside the
// writer's lock.
class RecordWriter {
 public:
  RecordWriter();
  ~RecordWriter();
  RecordWriter(const RecordWriter&) = delete;
  RecordWriter& operator=(const RecordWriter&) = delete;

  // Runs `task` after the tasks posted before it. Once stopped, on the
  // caller's thread (a call that waits on it is still answered).
  void Post(std::function<void()> task);

  // Runs what is queued, then joins the thread. Idempotent.
  void Stop();

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_RECORD_WRITER_H_
