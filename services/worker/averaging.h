// The synchronous exchange's parts for a run: the outer optimizer, what
// travels (ExchangeParts: the model itself, or its change through the
// run's codec) and the Averager, the one averaging pipeline for flat and
// hierarchical plans (exchanger.h). The host builds them once, from the run
// configuration, in MakeAverager; the synchronous runner (sync_runner.h)
// uses them. The codec is the host's (gossip pulls travel in it too).
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
  // The run's codec (the host's; fp32 at least).
  const Codec* codec = nullptr;
  std::unique_ptr<OuterStep> outer;
  EncodedStore* encoded_store = nullptr;
  // Set when changes travel (a codec or an outer optimizer): the outer
  // state is then published with every committed round.
  ExchangeParts encoded;
  AggregationSpec aggregation;
  // The averaging pipeline (declared last: it points at what comes before).
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
  // The run's codec (MakeCodec).
  const Codec* codec = nullptr;
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

// The run's averaging, from its configuration (outer optimizer,
// aggregation) and codec. INVALID_ARGUMENT names a bad setting.
absl::StatusOr<std::unique_ptr<Averaging>> MakeAverager(const shoal::v1::RunConfig& config,
                                                        const AveragerDeps& deps);

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_AVERAGING_H_
