// The synchronous exchange's parts for a run: the codec, the outer
// optimizer, the store of encoded blobs it publishes, and the Averager
// (the flat sharded exchange, wrapped by the hierarchical one with
// --hierarchy=on). The host builds them once, from the run configuration,
// in MakeAverager; the synchronous runner (sync_runner.h) uses them.
//
// Not thread-safe: the runner's thread uses it (the Averager's own threads
// aside); peers read the EncodedStore, which is.
#ifndef SHOAL_SERVICES_WORKER_AVERAGING_H_
#define SHOAL_SERVICES_WORKER_AVERAGING_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/run_options.h"
#include "services/worker/core/averager.h"
#include "services/worker/core/codec.h"
#include "services/worker/core/encoded_store.h"
#include "services/worker/core/model_state.h"
#include "services/worker/core/outer_optimizer.h"
#include "services/worker/core/push_box.h"
#include "services/worker/exchanger.h"
#include "services/worker/peer_client.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::worker {

struct Averaging {
  // Declared in the order they are needed: the averagers point at what
  // comes before them (and are destroyed first).
  std::unique_ptr<Codec> codec;
  std::unique_ptr<OuterStep> outer;
  EncodedStore* encoded_store = nullptr;
  // The encoded exchange's parts (store null: the raw exchange).
  EncodedExchange encoded;
  AggregationSpec aggregation;
  // The flat sharded exchange, which `averager` wraps when the run has
  // --hierarchy=on.
  std::unique_ptr<Averager> flat;
  std::unique_ptr<Averager> averager;

  bool is_encoded() const { return encoded.store != nullptr; }
  // Serves the outer momentum as the state of the model of `round`
  // (encoded exchange; catch-ups pull it with the model).
  void PublishOuterState(uint64_t round);
  // One line for the log: "sharded/fp32 by mean encoded, outer ...".
  std::string Describe(const shoal::v1::RunConfig& config) const;
};

// What MakeAverager builds on; all of it outlives the Averaging.
struct AveragerDeps {
  PeerClient* peers = nullptr;
  ModelState* state = nullptr;
  EncodedStore* encoded_store = nullptr;
  PushBox* push_box = nullptr;
  // The agreed model (the snapshot buffer): the encoded exchange's base.
  const float* snapshot = nullptr;
  uint64_t elements = 0;
  // The worker's exchange options (timeouts, clock); the aggregation and
  // the push box come from the run and `push_box`.
  ExchangeOptions exchange;
};

// The run's averaging, from its configuration (codec, outer optimizer,
// aggregation, hierarchy). INVALID_ARGUMENT names a bad setting.
absl::StatusOr<std::unique_ptr<Averaging>> MakeAverager(const shoal::v1::RunConfig& config,
                                                        const AveragerDeps& deps);

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_AVERAGING_H_
