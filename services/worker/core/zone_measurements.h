// What a worker measures for the supernode election (docs/SUPERNODES.md,
// "Election"): its training step time and the inbound bandwidth of its
// exchanges, each the median of its recent rounds so that one slow round
// (a garbage collection, a busy link) does not move its zone's supernode.
// The worker reports both in ReportRoundDone (fields 110-111).
//
// Plain C++, no clock of its own (the caller measures); not thread-safe:
// the worker's main thread owns it.
#ifndef SHOAL_SERVICES_WORKER_CORE_ZONE_MEASUREMENTS_H_
#define SHOAL_SERVICES_WORKER_CORE_ZONE_MEASUREMENTS_H_

#include <cstddef>
#include <cstdint>
#include <deque>

namespace shoal::worker {

class ZoneMeasurements {
 public:
  // Keeps the latest `window` samples of each measurement.
  explicit ZoneMeasurements(size_t window = 5) : window_(window < 1 ? 1 : window) {}

  // A round's training: `train_seconds` for `steps` local steps. Ignored
  // when either is not positive (a round whose training was carried over,
  // or not timed).
  void AddTraining(double train_seconds, uint64_t steps);
  // A round's exchange: `bytes` received by reads that took `seconds` of
  // wall time together (reads in parallel count once). Ignored when either
  // is not positive (a round alone, or nothing read).
  void AddTransfer(uint64_t bytes, double seconds);

  // Medians of the kept samples; 0 = none yet.
  double step_seconds() const { return Median(steps_); }
  double bandwidth_bytes_per_second() const { return Median(rates_); }

 private:
  static double Median(const std::deque<double>& samples);
  void Add(std::deque<double>& samples, double value);

  const size_t window_;
  std::deque<double> steps_;
  std::deque<double> rates_;
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_ZONE_MEASUREMENTS_H_
