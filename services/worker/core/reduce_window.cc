#include "services/worker/core/reduce_window.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/worker/core/aggregation.h"

namespace shoal::worker {

ReduceWindow::ReduceWindow(ReduceWindowOptions options)
    : options_(std::move(options)),
      first_cell_(options_.own.begin / kCellElements),
      end_cell_(options_.own.end > options_.own.begin ? (options_.own.end - 1) / kCellElements + 1
                                                      : first_cell_) {
  absl::MutexLock lock(&mu_);
  done_.assign(end_cell_ - first_cell_, false);
  low_ = first_cell_;
  next_.assign(options_.members, options_.own.begin);
  paused_.assign(options_.members, false);
  resume_wanted_.assign(options_.members, false);
  handles_.resize(options_.members);
  applied_ = options_.rule;
}

uint64_t ReduceWindow::CellBegin(uint64_t cell) const {
  return std::max(options_.own.begin, cell * kCellElements);
}

uint64_t ReduceWindow::CellEnd(uint64_t cell) const {
  return std::min(options_.own.end, (cell + 1) * kCellElements);
}

ReduceWindow::Slot* ReduceWindow::SlotFor(uint64_t cell) {
  for (auto& s : slots_) {
    if (s->cell == cell) return s.get();
  }
  auto slot = std::make_unique<Slot>();
  slot->cell = cell;
  slot->begin = CellBegin(cell);
  slot->end = CellEnd(cell);
  const uint64_t len = slot->end - slot->begin;
  slot->missing = len * static_cast<uint64_t>(options_.members - 1);
  const float* own = options_.own_input + (slot->begin - options_.own.begin);
  auto take = [this, len]() {
    std::vector<float> v;
    if (!free_.empty()) {
      v = std::move(free_.back());
      free_.pop_back();
    }
    v.resize(len);
    return v;
  };
  if (options_.apart) {
    slot->parts.resize(options_.members);
    for (int m = 0; m < options_.members; ++m) slot->parts[m] = take();
    std::memcpy(slot->parts[options_.self].data(), own, len * sizeof(float));
  } else {
    slot->sum = take();
    slot->filled = slot->begin;
  }
  slots_.push_back(std::move(slot));
  peak_slots_ = std::max(peak_slots_, slots_.size());
  return slots_.back().get();
}

absl::Status ReduceWindow::Complete(Slot* slot) {
  const uint64_t len = slot->end - slot->begin;
  float* out = options_.out + (slot->begin - options_.own.begin);
  absl::Status s;
  if (options_.apart) {
    std::vector<const float*> inputs(options_.members);
    for (int m = 0; m < options_.members; ++m) inputs[m] = slot->parts[m].data();
    absl::StatusOr<AggregationSpec> r =
        CombineWeighted(options_.rule, inputs, options_.weights, len, out);
    if (r.ok()) {
      applied_ = *r;
    } else {
      s = r.status();
    }
    for (auto& p : slot->parts) free_.push_back(std::move(p));
  } else {
    const float* own = options_.own_input + (slot->begin - options_.own.begin);
    if (own != out) std::memcpy(out, own, len * sizeof(float));
    // Alone, the mean is our own contribution.
    if (options_.members > 1) {
      AverageInto(out, slot->sum.data(), len, static_cast<float>(options_.members));
    }
    free_.push_back(std::move(slot->sum));
  }
  // Keep at most a window's worth of buffers for reuse.
  const size_t keep = options_.window_cells * (options_.apart ? options_.members : 1);
  while (free_.size() > keep) free_.pop_back();
  done_[slot->cell - first_cell_] = true;
  slots_.erase(std::find_if(slots_.begin(), slots_.end(),
                            [slot](const std::unique_ptr<Slot>& p) { return p.get() == slot; }));
  return s;
}

absl::Status ReduceWindow::Accept(int k, const ChunkView& chunk, ReduceNext* next) {
  *next = ReduceNext::kRead;
  std::vector<std::shared_ptr<ResumeHandle>> resume;
  uint64_t prefix = 0;
  bool grew = false;
  {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
    const uint64_t b = chunk.begin;
    const uint64_t e = chunk.begin + chunk.count;
    if (k < 0 || k >= options_.members || k == options_.self) {
      return absl::InvalidArgumentError(absl::StrCat("no member ", k, " contributes here"));
    }
    if (b != next_[k] || e > options_.own.end || chunk.count == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("member ", k, " sent [", b, ", ", e, "), expected a chunk from ", next_[k],
                       " within [", options_.own.begin, ", ", options_.own.end, ")"));
    }
    std::vector<BytePiece> storage, part_storage;
    for (uint64_t at = b; at < e;) {
      const uint64_t cell = at / kCellElements;
      const uint64_t upto = std::min(e, CellEnd(cell));
      Slot* slot = SlotFor(cell);
      const ChunkView piece = chunk.Range(at, upto - at, &storage);
      const uint64_t offset = at - slot->begin;
      if (options_.apart) {
        piece.CopyTo(slot->parts[k].data() + offset);
      } else {
        // What another member sent already is added to; the rest is the
        // first contribution there (copied: no pass to zero it first).
        const uint64_t added = std::min(upto, std::max(at, slot->filled));
        if (added > at) {
          piece.Range(at, added - at, &part_storage).AddTo(slot->sum.data() + offset);
        }
        if (upto > added) {
          piece.Range(added, upto - added, &part_storage)
              .CopyTo(slot->sum.data() + (added - slot->begin));
        }
        slot->filled = std::max(slot->filled, upto);
      }
      slot->missing -= upto - at;
      if (slot->missing == 0) {
        if (absl::Status s = Complete(slot); !s.ok()) {
          error_ = s;
          return s;
        }
      }
      at = upto;
    }
    next_[k] = e;
    const uint64_t old_low = low_;
    while (low_ < end_cell_ && done_[low_ - first_cell_]) ++low_;
    if (low_ != old_low) {
      grew = true;
      prefix = low_ == end_cell_ ? options_.own.end : CellBegin(low_);
      for (int m = 0; m < options_.members; ++m) {
        if (paused_[m] && next_[m] / kCellElements < low_ + options_.window_cells) {
          paused_[m] = false;
          if (handles_[m] != nullptr) {
            resume.push_back(handles_[m]);
          } else {
            resume_wanted_[m] = true;
          }
        }
      }
    }
    if (e < options_.own.end && e / kCellElements >= low_ + options_.window_cells) {
      paused_[k] = true;
      *next = ReduceNext::kPause;
    }
  }
  for (auto& h : resume) h->Resume();
  if (grew && options_.on_prefix) options_.on_prefix(prefix);
  return absl::OkStatus();
}

void ReduceWindow::SetHandle(int k, std::shared_ptr<ResumeHandle> handle) {
  bool resume = false;
  {
    absl::MutexLock lock(&mu_);
    if (k < 0 || k >= options_.members) return;
    handles_[k] = handle;
    resume = resume_wanted_[k];
    resume_wanted_[k] = false;
  }
  if (resume && handle != nullptr) handle->Resume();
}

absl::Status ReduceWindow::Finish(AggregationSpec* applied) {
  bool grew = false;
  uint64_t prefix = 0;
  absl::Status result;
  {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
    if (options_.members == 1) {
      // Nobody else contributes: each cell is ours alone.
      for (uint64_t cell = low_; cell < end_cell_; ++cell) {
        if (done_[cell - first_cell_]) continue;
        if (absl::Status s = Complete(SlotFor(cell)); !s.ok()) return s;
      }
      grew = low_ != end_cell_;
      low_ = end_cell_;
      prefix = options_.own.end;
    }
    for (uint64_t cell = first_cell_; cell < end_cell_; ++cell) {
      if (!done_[cell - first_cell_]) {
        result =
            absl::DataLossError(absl::StrCat("the reduce ended with elements [", CellBegin(cell),
                                             ", ", CellEnd(cell), ") of our slice not averaged"));
        break;
      }
    }
    if (applied != nullptr) *applied = applied_;
  }
  if (grew && options_.on_prefix) options_.on_prefix(prefix);
  return result;
}

uint64_t ReduceWindow::averaged_until() const {
  absl::MutexLock lock(&mu_);
  return low_ == end_cell_ ? options_.own.end : CellBegin(low_);
}

size_t ReduceWindow::slots_in_use() const {
  absl::MutexLock lock(&mu_);
  return slots_.size();
}

size_t ReduceWindow::peak_slots() const {
  absl::MutexLock lock(&mu_);
  return peak_slots_;
}

}  // namespace shoal::worker
