// SampleLedger: ranges handed out, trained, lost and handed out again.
#include "services/coordinator/core/sample_ledger.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace shoal::coordinator {

SampleLedger::SampleLedger(uint64_t per_round, uint32_t epochs)
    : per_round_(per_round), epochs_(epochs) {}

void SampleLedger::Resume(const shoal::v1::SampleLedger& saved) {
  dataset_ = saved.dataset_samples();
  epoch_ = saved.epoch();
  offset_ = saved.offset();
  trained_ = saved.samples_trained();
  lost_ = saved.samples_lost();
  redone_ = saved.samples_redone();
  epochs_done_ = saved.epochs_done();
  counted_from_ = saved.trained_from_epoch();
  trained_per_epoch_.assign(saved.trained_per_epoch().begin(), saved.trained_per_epoch().end());
  pool_.clear();
  for (const shoal::v1::SampleRange& r : saved.pool()) pool_.push_back({r, true});
  in_flight_.clear();
  // A ledger saved before trained_from_epoch existed lists every epoch.
  CloseFinishedEpochs();
}

absl::Status SampleLedger::CheckDataset(uint64_t samples) {
  if (samples == 0) {
    return absl::FailedPreconditionError(
        "the run keeps a sample ledger (--sample_ledger) and this worker does not say how many "
        "training samples it has, so it cannot follow the ledger (a Python worker declares them: "
        "shoal.Worker(..., train_samples=len(dataset)), docs/PYTHON.md)");
  }
  if (dataset_ == 0) {
    dataset_ = samples;
    return absl::OkStatus();
  }
  if (samples != dataset_) {
    return absl::FailedPreconditionError(
        absl::StrCat("this worker's training set has ", samples, " samples, the run's has ",
                     dataset_, ": the sample ledger needs the same training set on every worker"));
  }
  return absl::OkStatus();
}

std::vector<shoal::v1::SampleRange> SampleLedger::Assign(const std::string& worker) {
  Lost(worker);  // anything still held (not expected)
  std::vector<Entry>& mine = in_flight_[worker];
  uint64_t need = per_round_;
  while (need > 0 && !pool_.empty()) {
    Entry& front = pool_.front();
    Entry taken = front;
    if (front.range.count() <= need) {
      pool_.pop_front();
    } else {
      taken.range.set_count(need);
      front.range.set_begin(front.range.begin() + need);
      front.range.set_count(front.range.count() - need);
    }
    need -= taken.range.count();
    mine.push_back(std::move(taken));
  }
  while (need > 0 && dataset_ > 0 && (epochs_ == 0 || epoch_ < epochs_)) {
    const uint64_t n = std::min(need, dataset_ - offset_);
    Entry fresh;
    fresh.range.set_epoch(epoch_);
    fresh.range.set_begin(offset_);
    fresh.range.set_count(n);
    mine.push_back(std::move(fresh));
    need -= n;
    offset_ += n;
    if (offset_ == dataset_) {
      ++epoch_;
      offset_ = 0;
    }
  }
  std::vector<shoal::v1::SampleRange> out;
  out.reserve(mine.size());
  for (const Entry& e : mine) out.push_back(e.range);
  if (mine.empty()) in_flight_.erase(worker);
  return out;
}

std::vector<shoal::v1::SampleRange> SampleLedger::InFlight(const std::string& worker) const {
  std::vector<shoal::v1::SampleRange> out;
  auto it = in_flight_.find(worker);
  if (it == in_flight_.end()) return out;
  for (const Entry& e : it->second) out.push_back(e.range);
  return out;
}

void SampleLedger::Trained(const std::string& worker) {
  auto it = in_flight_.find(worker);
  if (it == in_flight_.end()) return;
  for (const Entry& e : it->second) {
    const uint64_t epoch = e.range.epoch();
    // An epoch before counted_from_ is done: none of its positions can be
    // in flight (each is handed out again only after it was lost).
    if (epoch >= counted_from_) {
      const uint64_t i = epoch - counted_from_;
      if (trained_per_epoch_.size() <= i) trained_per_epoch_.resize(i + 1, 0);
      trained_per_epoch_[i] += e.range.count();
    }
    trained_ += e.range.count();
    if (e.redo) redone_ += e.range.count();
  }
  in_flight_.erase(it);
  CloseFinishedEpochs();
}

void SampleLedger::CloseFinishedEpochs() {
  if (dataset_ == 0) return;
  while (epochs_done_ < counted_from_ + trained_per_epoch_.size() &&
         (epochs_done_ < counted_from_ ||
          trained_per_epoch_[epochs_done_ - counted_from_] >= dataset_)) {
    ++epochs_done_;
  }
  while (counted_from_ < epochs_done_ && !trained_per_epoch_.empty()) {
    trained_per_epoch_.pop_front();
    ++counted_from_;
  }
  counted_from_ = std::max(counted_from_, epochs_done_);
}

void SampleLedger::Lost(const std::string& worker) {
  auto it = in_flight_.find(worker);
  if (it == in_flight_.end()) return;
  for (Entry& e : it->second) {
    lost_ += e.range.count();
    e.redo = true;
    pool_.push_back(std::move(e));
  }
  in_flight_.erase(it);
}

bool SampleLedger::Finished() const { return epochs_ > 0 && epochs_done_ >= epochs_; }

shoal::v1::SampleLedger SampleLedger::Fill(bool in_flight_to_pool) const {
  shoal::v1::SampleLedger s;
  s.set_dataset_samples(dataset_);
  s.set_epoch(epoch_);
  s.set_offset(offset_);
  s.set_samples_trained(trained_);
  s.set_samples_lost(lost_);
  s.set_samples_redone(redone_);
  s.set_epochs_done(epochs_done_);
  s.set_trained_from_epoch(counted_from_);
  for (uint64_t n : trained_per_epoch_) s.add_trained_per_epoch(n);
  for (const Entry& e : pool_) *s.add_pool() = e.range;
  uint64_t in_flight = 0;
  for (const auto& [worker, entries] : in_flight_) {
    for (const Entry& e : entries) {
      in_flight += e.range.count();
      if (in_flight_to_pool) *s.add_pool() = e.range;
    }
  }
  if (!in_flight_to_pool) s.set_samples_in_flight(in_flight);
  return s;
}

shoal::v1::SampleLedger SampleLedger::Status() const { return Fill(false); }
shoal::v1::SampleLedger SampleLedger::Durable() const { return Fill(true); }

}  // namespace shoal::coordinator
