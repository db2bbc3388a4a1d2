#include "services/coordinator/core/slice_sizing.h"

#include <algorithm>
#include <cmath>

namespace shoal::coordinator {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

bool Usable(double rate) { return std::isfinite(rate) && rate > 0; }

}  // namespace

absl::flat_hash_map<std::string, double> RoundRates(const std::vector<ReadSample>& reads) {
  absl::flat_hash_map<std::string, std::vector<double>> by_source;
  for (const ReadSample& r : reads) {
    if (r.bytes == 0 || !(r.seconds > 0) || !std::isfinite(r.seconds) || r.reader == r.source) {
      continue;
    }
    by_source[r.source].push_back(static_cast<double>(r.bytes) / r.seconds);
  }
  absl::flat_hash_map<std::string, double> rates;
  for (auto& [source, seen] : by_source) {
    const double readers = static_cast<double>(seen.size());
    rates[source] = Median(std::move(seen)) * readers;
  }
  return rates;
}

std::vector<uint32_t> SizeSlices(const std::vector<double>& rates,
                                 const std::vector<bool>& outbound_only,
                                 const std::vector<uint32_t>& current,
                                 const SliceSizingOptions& options) {
  const size_t n = rates.size();
  std::vector<uint32_t> none(n, 0);
  std::vector<size_t> owners;
  std::vector<double> measured;
  for (size_t k = 0; k < n; ++k) {
    if (k < outbound_only.size() && outbound_only[k]) continue;
    owners.push_back(k);
    if (Usable(rates[k])) measured.push_back(rates[k]);
  }
  if (owners.empty() || measured.empty()) return none;
  const double median = Median(measured);
  const double count = static_cast<double>(owners.size());
  // Proportional fractions, with the floor by water-filling: an owner
  // below the floor gets the floor and the rest is shared again in
  // proportion among the others, until nobody is below it.
  const double floor = std::clamp(options.min_fraction, 0.0, 1.0) / count;
  std::vector<double> rate(owners.size());
  for (size_t i = 0; i < owners.size(); ++i) {
    rate[i] = Usable(rates[owners[i]]) ? rates[owners[i]] : median;
  }
  std::vector<double> fraction(owners.size(), 0);
  std::vector<bool> floored(owners.size(), false);
  for (size_t pass = 0; pass <= owners.size(); ++pass) {
    double free_mass = 1, free_rate = 0;
    for (size_t i = 0; i < owners.size(); ++i) {
      if (floored[i]) {
        free_mass -= floor;
      } else {
        free_rate += rate[i];
      }
    }
    bool changed = false;
    for (size_t i = 0; i < owners.size(); ++i) {
      if (floored[i]) {
        fraction[i] = floor;
        continue;
      }
      fraction[i] = free_rate > 0 ? free_mass * rate[i] / free_rate : floor;
      if (fraction[i] < floor) {
        floored[i] = true;
        changed = true;
      }
    }
    if (!changed) break;
  }
  // Hysteresis against the current shares (all zero: the even slices).
  if (current.size() == n) {
    uint64_t current_sum = 0;
    size_t current_positive = 0;
    for (size_t k : owners) {
      current_sum += current[k];
      current_positive += current[k] > 0;
    }
    if (current_positive == 0 || current_positive == owners.size()) {
      bool keep = true;
      for (size_t i = 0; keep && i < owners.size(); ++i) {
        const double was = current_positive == 0
                               ? 1 / count
                               : static_cast<double>(current[owners[i]]) / current_sum;
        keep = std::abs(fraction[i] - was) <= options.hysteresis * was;
      }
      if (keep) {
        std::vector<uint32_t> kept(n, 0);
        for (size_t k : owners) kept[k] = current[k];
        return kept;
      }
    }
  }
  std::vector<uint32_t> shares(n, 0);
  for (size_t i = 0; i < owners.size(); ++i) {
    shares[owners[i]] =
        std::max<uint32_t>(1, static_cast<uint32_t>(std::llround(fraction[i] * options.scale)));
  }
  return shares;
}

void SliceSizer::AddRound(const std::vector<ReadSample>& reads) {
  for (const auto& [id, rate] : RoundRates(reads)) {
    auto [it, fresh] = rates_.try_emplace(id, rate);
    if (!fresh) it->second = options_.smoothing * rate + (1 - options_.smoothing) * it->second;
  }
}

void SliceSizer::Forget(const std::string& worker_id) {
  rates_.erase(worker_id);
  shares_.erase(worker_id);
}

double SliceSizer::Rate(const std::string& worker_id) const {
  auto it = rates_.find(worker_id);
  return it == rates_.end() ? 0 : it->second;
}

std::vector<uint32_t> SliceSizer::Decide(const std::vector<std::string>& participants,
                                         const std::vector<bool>& outbound_only) {
  std::vector<double> rates(participants.size());
  std::vector<uint32_t> current(participants.size());
  for (size_t k = 0; k < participants.size(); ++k) {
    rates[k] = Rate(participants[k]);
    auto it = shares_.find(participants[k]);
    current[k] = it == shares_.end() ? 0 : it->second;
  }
  std::vector<uint32_t> shares = SizeSlices(rates, outbound_only, current, options_);
  for (size_t k = 0; k < participants.size(); ++k) shares_[participants[k]] = shares[k];
  return shares;
}

}  // namespace shoal::coordinator
