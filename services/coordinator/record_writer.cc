#include "services/coordinator/record_writer.h"

#include <utility>

namespace shoal::coordinator {

RecordWriter::RecordWriter() : thread_([this] { Loop(); }) {}

RecordWriter::~RecordWriter() { Stop(); }

void RecordWriter::Post(std::function<void()> task) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      tasks_.push_back(std::move(task));
      return;
    }
  }
  task();
}

void RecordWriter::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void RecordWriter::Loop() {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !tasks_.empty(); };
      // Idle until a task comes or Stop (which wakes it).
      mu_.Await(absl::Condition(&ready));
      // Stopping: what was queued still runs (calls wait on it).
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace shoal::coordinator
