#include "services/worker/core/zone_measurements.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace shoal::worker {

void ZoneMeasurements::AddTraining(double train_seconds, uint64_t steps) {
  if (!(train_seconds > 0) || !std::isfinite(train_seconds) || steps == 0) return;
  Add(steps_, train_seconds / static_cast<double>(steps));
}

void ZoneMeasurements::AddTransfer(uint64_t bytes, double seconds) {
  if (bytes == 0 || !(seconds > 0) || !std::isfinite(seconds)) return;
  Add(rates_, static_cast<double>(bytes) / seconds);
}

void ZoneMeasurements::Add(std::deque<double>& samples, double value) {
  samples.push_back(value);
  while (samples.size() > window_) samples.pop_front();
}

double ZoneMeasurements::Median(const std::deque<double>& samples) {
  if (samples.empty()) return 0;
  std::vector<double> v(samples.begin(), samples.end());
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace shoal::worker
