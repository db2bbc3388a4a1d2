// The owner's side of a reduce-scatter step (services/worker/fan_out.h):
// the contributions of the n - 1 other members to our slice arrive as
// chunks, each member's in order, on gRPC's threads; this combines them
// with our own contribution, 1 MiB cell by cell (the wire module's grid),
// in a bounded window of cells, and writes each cell's average into the
// output the moment its last contribution is in.
//
// Memory: a cell being combined lives in a slot of this window (the mean:
// one cell-sized sum; a robust rule or weights: every member's cell kept
// apart), never in the output. So the output holds, per element, either our
// own contribution (not averaged yet) or the average: never a partial sum.
// That is what lets the exchange reduce in place into the parameters
// without a copy of them, and what a new attempt of the round contributes
// (services/worker/core/model_memory.h). The window is bounded: a member
// whose stream runs `window_cells` cells ahead of the lowest unfinished
// cell is paused (Accept says ChunkNext::kPause) until the window moves;
// gRPC's flow control then holds its sender. A chunk bigger than the
// window (a blob decoded whole, a push from behind NAT) is taken whole:
// then the slots span the slice.
//
// Arithmetic: the mean sums, per cell, the other members' chunks as they
// arrive (the first one copied in, the next ones added) and at the end
// writes (own + sum) / n into the output in one pass: identical on every
// worker because only the owner computes it, possibly different in the
// last bit from run to run (arrival order). A robust rule or weights
// combine the cell's values in member order with CombineWeighted
// (core/aggregation.h), the same bits every run.
//
// Cells complete in order: each member delivers its chunks in order, so a
// cell is complete only once every member has passed it. The averaged
// prefix [own.begin, averaged_until()) grows cell by cell; the exchange
// publishes it as it grows (peers' gathers start before the whole slice is
// averaged).
//
// Thread-safe: Accept runs on gRPC's threads; Resume handles are called
// outside the lock.
#ifndef SHOAL_SERVICES_WORKER_CORE_REDUCE_WINDOW_H_
#define SHOAL_SERVICES_WORKER_CORE_REDUCE_WINDOW_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/run_options.h"
#include "common/shard_plan.h"
#include "common/tensor_wire.h"

namespace shoal::worker {

// How the reduce asks a paused member's stream to go on.
class ResumeHandle {
 public:
  virtual ~ResumeHandle() = default;
  virtual void Resume() = 0;
};

// The same promise as common/tensor_wire_grpc.h's ChunkNext, repeated here
// so that the core takes no gRPC header.
enum class ReduceNext { kRead, kPause };

struct ReduceWindowOptions {
  // Our slice, and the members of the step (`self` is us).
  SliceRange own;
  int members = 1;
  int self = 0;
  // Our contribution to our slice (own.end - own.begin elements), and where
  // its average goes (the same count); they may be the same memory.
  const float* own_input = nullptr;
  float* out = nullptr;
  // Combine the members' cells apart, in member order, with `rule` and
  // `weights` (one per member); false: the mean, summed as chunks arrive.
  bool apart = false;
  AggregationSpec rule;
  std::vector<uint32_t> weights;
  // Cells a member may run ahead of the lowest unfinished one.
  uint64_t window_cells = 16;
  // The averaged prefix grew to [own.begin, until): called outside the
  // lock, possibly from several threads (the latest may come first).
  std::function<void(uint64_t until)> on_prefix;
};

class ReduceWindow {
 public:
  explicit ReduceWindow(ReduceWindowOptions options);

  // A checked chunk of member `k`'s contribution (inside our slice, in
  // order for that member). INVALID_ARGUMENT for a chunk outside the slice
  // or one that overlaps what the member sent (a bug of the reader: resumed
  // reads start where the last chunk ended). `*next`: kPause when the member
  // is to wait for the window (it is resumed through its handle).
  absl::Status Accept(int k, const ChunkView& chunk, ReduceNext* next);
  // Member `k`'s stream, to resume it when the window moves; may come after
  // its first chunks (a pending resume is done at once).
  void SetHandle(int k, std::shared_ptr<ResumeHandle> handle);

  // After every member's stream ended OK: every cell must be averaged
  // (DATA_LOSS naming the first missing one otherwise). `applied` gets the
  // rule the cells were combined with.
  absl::Status Finish(AggregationSpec* applied);

  // Elements [own.begin, averaged_until()) hold the average.
  uint64_t averaged_until() const;
  // Slots in use right now and at most so far (tests, the memory table).
  size_t slots_in_use() const;
  size_t peak_slots() const;

 private:
  struct Slot {
    uint64_t cell = 0;
    uint64_t begin = 0;  // the cell's part of our slice, [begin, end)
    uint64_t end = 0;
    uint64_t missing = 0;  // elements still to come, over all members
    // The mean: the others' sum of [begin, filled); elements past `filled`
    // have no contribution yet (each member sends its cell in order, so
    // what some member sent is always a prefix).
    std::vector<float> sum;
    uint64_t filled = 0;
    std::vector<std::vector<float>> parts;  // apart: one per member
  };
  Slot* SlotFor(uint64_t cell) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Combines a complete slot into the output and frees it.
  absl::Status Complete(Slot* slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t CellBegin(uint64_t cell) const;
  uint64_t CellEnd(uint64_t cell) const;

  const ReduceWindowOptions options_;
  const uint64_t first_cell_;
  const uint64_t end_cell_;  // one past our slice's last cell

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Slot>> slots_ ABSL_GUARDED_BY(mu_);
  // Reused cell buffers (their pages stay mapped: no fault per round).
  std::vector<std::vector<float>> free_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> done_ ABSL_GUARDED_BY(mu_);      // per cell of our slice
  uint64_t low_ ABSL_GUARDED_BY(mu_);                // lowest unfinished cell
  std::vector<uint64_t> next_ ABSL_GUARDED_BY(mu_);  // per member
  std::vector<bool> paused_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> resume_wanted_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<ResumeHandle>> handles_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  AggregationSpec applied_ ABSL_GUARDED_BY(mu_);
  size_t peak_slots_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_REDUCE_WINDOW_H_
