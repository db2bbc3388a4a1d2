// The write side of raw server streams (the coordinator's Session and
// Relay, a supernode's relayed member sessions): serialized messages queued
// by any thread and written one at a time, then the stream's end once they
// are out.
#ifndef SHOAL_COMMON_QUEUED_STREAM_H_
#define SHOAL_COMMON_QUEUED_STREAM_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>

#include <deque>

#include "absl/synchronization/mutex.h"
#include "common/reactor_handoff.h"

namespace shoal {

// A ServerBidiReactor over raw bytes whose writes go through a queue.
// Enqueue and Close are thread-safe; the subclass owns the read side and
// OnDone. Copies of a ByteBuffer share its slices, so a broadcast queued on
// many streams is serialized once.
class QueuedStream : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // `msg` goes out after the messages queued before it (dropped once the
  // stream is closing and finished, or broken).
  void Enqueue(grpc::ByteBuffer msg) {
    Next next = Next::kNothing;
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      queue_.push_back(std::move(msg));
      if (!writing_) next = TakeNextLocked();
    }
    Run(next);
  }

  // Ends the stream with `status` once queued writes are out.
  void Close(const grpc::Status& status) {
    Next next = Next::kNothing;
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      close_status_ = status;
      closing_ = true;
      if (!writing_) next = TakeNextLocked();
    }
    Run(next);
  }

  void OnWriteDone(bool ok) final {
    ReactionScope reaction(this, &out_);
    Next next = Next::kNothing;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) {
        // The stream is broken: nothing more goes out. If the read side
        // already saw it (Close while this write was in flight), the stream
        // ends here; otherwise OnReadDone(false) follows and ends it. Not
        // finishing here would leave the reactor alive for good, and the
        // server's shutdown (Server::Wait) waiting for it.
        queue_.clear();
      }
      next = TakeNextLocked();
    }
    Run(next);
  }

 private:
  // What the stream does next, decided under mu_ and started after it is
  // released: StartWrite runs the transport's write (sendmsg) inline, and
  // holding mu_ through it made OnWriteDone of this stream (on the other
  // callback thread) block on mu_ for that long.
  enum class Next { kNothing, kWrite, kFinish };

  // With no write in flight: the next queued write (writing_ set, out_
  // filled; only the caller that gets kWrite touches out_ until the next
  // OnWriteDone), else the end of the stream once closing.
  Next TakeNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!queue_.empty()) {
      out_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      return Next::kWrite;
    }
    if (closing_ && !finished_) {
      finished_ = true;
      return Next::kFinish;
    }
    return Next::kNothing;
  }

  void Run(Next next) ABSL_LOCKS_EXCLUDED(mu_) {
    switch (next) {
      case Next::kWrite:
        BeforeStart(&out_);
        StartWrite(&out_);
        break;
      case Next::kFinish:
        // close_status_ no longer changes once finished_ is set.
        Finish(close_status_);
        break;
      case Next::kNothing:
        break;
    }
  }

  absl::Mutex mu_;
  std::deque<grpc::ByteBuffer> queue_ ABSL_GUARDED_BY(mu_);
  // Written under mu_ by whoever sets writing_, read by gRPC until
  // OnWriteDone (see TakeNextLocked).
  grpc::ByteBuffer out_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  // Set under mu_ while !finished_; read by Run(kFinish) after that.
  grpc::Status close_status_;
};

}  // namespace shoal

#endif  // SHOAL_COMMON_QUEUED_STREAM_H_
