// The order of the training set in each epoch of the sample ledger
// (RunConfig.training.sample_ledger, docs/DATA.md): epoch e trains
// positions 0..N-1 of a permutation of the N training samples drawn from
// the run seed and e. Every worker computes the same permutation, so a
// range of positions the coordinator hands out names the same samples on
// every worker, and an auditor can replay them.
//
// Portable: std::mt19937_64 (fully specified by the standard) and a
// Fisher-Yates shuffle with Lemire's multiply-shift bounded draw (with its
// rejection step) written out here, not std::shuffle, whose use of the
// generator is left to the standard library.
//
// No Torch. Not thread-safe (the trainer's thread owns it).
#ifndef SHOAL_SERVICES_WORKER_CORE_SAMPLE_ORDER_H_
#define SHOAL_SERVICES_WORKER_CORE_SAMPLE_ORDER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "shoal/v1/common.pb.h"

namespace shoal::worker {

// The permutation of [0, n) for `epoch` of the run seeded `seed`.
std::vector<int64_t> EpochPermutation(uint64_t seed, uint64_t epoch, int64_t n);

// "e0:[0,1280) e1:[0,64)": ranges as the worker logs them.
std::string FormatRanges(absl::Span<const shoal::v1::SampleRange> ranges);

class SampleOrder {
 public:
  SampleOrder(uint64_t seed, int64_t n) : seed_(seed), n_(n) {}
  // The samples (indices into the training set) at `ranges`, in order.
  // INVALID_ARGUMENT for a range past the training set.
  absl::StatusOr<std::vector<int64_t>> Rows(absl::Span<const shoal::v1::SampleRange> ranges);

 private:
  const std::vector<int64_t>& Permutation(uint64_t epoch);
  const uint64_t seed_;
  const int64_t n_;
  // The last two epochs' permutations (a round may span two).
  std::map<uint64_t, std::vector<int64_t>> cache_;
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_SAMPLE_ORDER_H_
