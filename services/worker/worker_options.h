// What a worker is started with: main.cc copies its flags into it; tests
// set it directly (with test seams main.cc never sets).
#ifndef SHOAL_SERVICES_WORKER_WORKER_OPTIONS_H_
#define SHOAL_SERVICES_WORKER_WORKER_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "common/auth.h"
#include "common/cancellation.h"
#include "common/clock.h"
#include "services/worker/coordinator_client.h"
#include "services/worker/core/trainer.h"
#include "services/worker/exchanger.h"
#include "services/worker/model_syncer.h"

namespace shoal::worker {

struct WorkerOptions {
  std::string coordinator = "127.0.0.1:50051";
  // Who may read from this worker's Peer service (--token_file: the run
  // token; common/auth.h). The token this worker sends is process-wide
  // (SetProcessToken). Open by default.
  TokenGate gate;
  std::string listen = "127.0.0.1:50060";
  // Address peers use to reach us; empty = the listen host and bound port.
  std::string advertise;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  // --dataset: "" (Fashion-MNIST in data_dir), "idx:DIR" or "npy:DIR" (core/dataset.h).
  std::string dataset;
  std::string name;
  // The build (Shoal's version and commit, common/version.h), part of the
  // replay fingerprint audits pair members by; set by the binaries' mains.
  std::string build;
  // What else a replay of this worker's training runs (a trainer made by
  // make_trainer): unset for the built-in trainer; for a Python loop, the
  // digest of the step and optimizer it handed Shoal (python/shoal,
  // "python-step:..."), appended to the fingerprint, or "" when it handed
  // none: the fingerprint is then empty, so nobody audits it or is audited
  // by it, and an audited run refuses its join (docs/PYTHON.md "Audits").
  std::optional<std::string> replay_step;
  // --zone: where this worker sits (common/zone.h); empty = the root.
  std::string zone;
  // --outbound_only: this worker cannot accept connections (behind NAT).
  bool outbound_only = false;
  int torch_threads = 1;
  // Caps the bytes per second this worker serves to peers (0 = no cap).
  double upload_rate_mbps = 0;
  // Reads one caller host may run at once on the Peer service; 0 = no limit.
  uint32_t max_reads_per_peer = 0;
  uint32_t eval_limit = 0;
  // Give up when the coordinator cannot be reached at start for this long.
  absl::Duration connect_timeout = absl::Seconds(60);
  absl::Duration rpc_timeout = absl::Seconds(10);
  // Time to reach each peer of a plan before reporting it unreachable.
  absl::Duration probe_timeout = absl::Seconds(3);
  ExchangeOptions exchange;
  SyncOptions sync;
  // Serves Prometheus metrics on this "host:port" (port 0 = any); empty = off.
  std::string metrics_listen;
  // Time source of the protocol, the exchange and the syncer (the real
  // clock when null).
  const Clock* clock = nullptr;
  // Cancelled to stop Run() gracefully (tests; may be null). The shutdown
  // signal (SIGTERM, SIGINT) stops it too.
  CancellationToken* stop = nullptr;
  // Test seam, never set by shoal-worker: rewrites this worker's freshly
  // trained model (all `n` elements) right before it becomes readable as its
  // contribution of `round`. The misbehaving peer of the poisoning test
  // (tests/support/poison_worker.cc) scales it; the exchange then overwrites
  // the model with the round's averages as for any worker.
  std::function<void(uint64_t round, float* params, uint64_t n)> contribution_transform;
  // Test seam, never set by shoal-worker: the coordinator client to use
  // instead of the routed gRPC client to `coordinator` (a fake that the
  // test drives).
  std::shared_ptr<CoordinatorClient> coordinator_client;
  // The trainer seam (core/trainer.h), set by the Python module
  // (python/shoal): makes the trainer once the first join gave the run's
  // configuration, instead of the built-in one; the dataset (data_dir) is
  // then not read. `layout`, `initial_model_hash` and `train_samples`, known
  // before joining, are declared with the first join (JoinRequest.layout,
  // JoinRequest.train_samples: a sample-ledger run checks the training set's
  // size there).
  std::function<absl::StatusOr<std::unique_ptr<Trainer>>(const TrainerOptions&)> make_trainer;
  std::optional<shoal::v1::ModelLayout> layout;
  std::string initial_model_hash;
  uint64_t train_samples = 0;
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_WORKER_OPTIONS_H_
