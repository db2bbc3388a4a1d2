// shoal-worker: trains with LibTorch and averages its model with its peers.
#include <cmath>
#include <memory>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/flags_usage.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/mutex_mode.h"
#include "common/signals.h"
#include "common/tls_flags.h"
#include "common/version.h"
#include "common/zone.h"
#include "services/worker/malloc_tuning.h"
#include "services/worker/uplink_pacer.h"
#include "services/worker/worker.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:50051",
          "Coordinator address (host:port), or the addresses of coordinator replicas separated "
          "by commas (a standby's leader hint is followed; docs/REPLICAS.md).");
ABSL_FLAG(std::string, listen, "127.0.0.1:50060",
          "Address of this worker's Peer service (port 0 picks a free port).");
ABSL_FLAG(std::string, metrics_listen, "",
          "Serve Prometheus metrics at http://HOST:PORT/metrics (port 0 picks a free port); "
          "empty = off.");
ABSL_FLAG(std::string, advertise, "",
          "Address peers use to reach this worker; empty = the listen host with the bound port.");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "Directory with the Fashion-MNIST IDX files (Debian's dataset-fashion-mnist).");
ABSL_FLAG(std::string, dataset, "",
          "Dataset: empty or fashion-mnist (the IDX files in --data_dir), idx:DIR (any "
          "MNIST-family quadruple train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], "
          "t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz]) or npy:DIR "
          "(train_images.npy, train_labels.npy, test_images.npy, test_labels.npy: uint8 images "
          "[N, H, W], integer labels [N]). Checked at start.");
ABSL_FLAG(std::string, name, "", "Name shown in logs and status.");
ABSL_FLAG(bool, outbound_only, false,
          "This worker cannot accept connections (behind NAT): it pushes its contributions to "
          "the slice owners and reads the averages, owns no slice and serves no late joiner. "
          "Without it the coordinator finds out by probing --advertise. docs/SUPERNODES.md.");
ABSL_FLAG(std::string, zone, "",
          "Where this worker sits, as a path such as eu/paris/rack1 (segments of a-z 0-9 . _ -; "
          "nested zones nest the hierarchy of --hierarchy=on runs). Empty = the root zone. "
          "docs/SUPERNODES.md.");
ABSL_FLAG(uint32_t, max_reads_per_peer, 0,
          "Reads (ReadSlice streams) one caller address may have running at once on this "
          "worker's Peer service; past it RESOURCE_EXHAUSTED (the caller retries). 0 = no "
          "limit. Workers on one machine share an address.");
ABSL_FLAG(double, upload_rate_mbps, 0,
          "Caps how fast this worker serves its model to peers, in megabits per second, over "
          "all peers together (0 = no cap). For shared links.");
ABSL_FLAG(double, uplink_mbps, 0,
          "This worker's uplink in megabits per second: before each exchange step its "
          "connections are paced in the kernel so that the peers reading from it at once share "
          "this rate (0 = unpaced). Set it a little below a shaped or slow uplink so its queue "
          "never overflows. Every connection counts. docs/OVERLAP.md.");
ABSL_FLAG(absl::Duration, probe_timeout, absl::Seconds(3),
          "Time to reach each peer of a round's plan before reporting it unreachable.");
ABSL_FLAG(int, torch_threads, 1, "LibTorch intra-op threads.");
ABSL_FLAG(uint32_t, eval_limit, 0, "Evaluate on at most this many test images (0 = all 10000).");
ABSL_FLAG(std::string, predictions_out, "",
          "When the run ends, write the final model's predicted class of the first 100 test images "
          "to this file (to check an export against the worker; examples/torchscript).");
ABSL_FLAG(absl::Duration, connect_timeout, absl::Seconds(60),
          "Give up when the coordinator stays unreachable this long.");
ABSL_FLAG(absl::Duration, rpc_timeout, absl::Seconds(10), "Deadline of each coordinator call.");
ABSL_FLAG(absl::Duration, exchange_timeout, absl::Seconds(120),
          "Deadline of one round's weight exchange.");

int main(int argc, char** argv) {
  // Before anything starts a thread (gRPC, LibTorch): see malloc_tuning.h.
  shoal::worker::TuneMallocForTensorStreams();
  shoal::DisableMutexDeadlockDetection();
  absl::SetProgramUsageMessage(
      "trains a model on its shard of Fashion-MNIST and averages it with its "
      "peers.\nUsage: shoal-worker --coordinator=127.0.0.1:50051 --listen=127.0.0.1:0 "
      "--data_dir=/usr/share/datasets/fashion-mnist");
  shoal::UseFlagsOfFileForHelp(__FILE__, {shoal::TlsFlagsFile()});
  shoal::ParseFlagsOrExit(argc, argv, shoal::VersionLine("shoal-worker"));
  shoal::Metrics::SetBuildInfo("worker", shoal::ShoalVersion(), shoal::ShoalCommit());
  shoal::SetLogTag("worker");
  if (absl::Status tls = shoal::ApplyTlsFlags(); !tls.ok()) {
    SHOAL_LOG(ERROR) << "cannot start: " << tls;
    return 2;
  }
  absl::StatusOr<std::string> token = shoal::ApplyTokenFlag();
  if (!token.ok()) {
    SHOAL_LOG(ERROR) << "cannot start: " << token.status().message();
    return 2;
  }
  shoal::ShutdownSignal::Install();

  shoal::worker::WorkerOptions options;
  options.gate = shoal::TokenGate(*token, "");
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  options.listen = absl::GetFlag(FLAGS_listen);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.advertise = absl::GetFlag(FLAGS_advertise);
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.dataset = absl::GetFlag(FLAGS_dataset);
  options.name = absl::GetFlag(FLAGS_name);
  options.build = absl::StrCat(shoal::ShoalVersion(), " ", shoal::ShoalCommit());
  options.zone = absl::GetFlag(FLAGS_zone);
  options.outbound_only = absl::GetFlag(FLAGS_outbound_only);
  if (absl::Status s = shoal::ParseZone(options.zone).status(); !s.ok()) {
    SHOAL_LOG(ERROR) << "cannot start: --zone: " << s.message();
    return 2;
  }
  options.torch_threads = absl::GetFlag(FLAGS_torch_threads);
  options.upload_rate_mbps = absl::GetFlag(FLAGS_upload_rate_mbps);
  options.max_reads_per_peer = absl::GetFlag(FLAGS_max_reads_per_peer);
  std::unique_ptr<shoal::worker::UplinkPacer> pacer;
  if (const double uplink = absl::GetFlag(FLAGS_uplink_mbps); uplink != 0) {
    if (!(uplink > 0) || !std::isfinite(uplink)) {
      SHOAL_LOG(ERROR) << "cannot start: --uplink_mbps must be a rate above 0 (0 = unpaced), got "
                       << uplink;
      return 2;
    }
    pacer = std::make_unique<shoal::worker::UplinkPacer>(uplink);
    options.exchange.pacer = pacer.get();
  }
  options.probe_timeout = absl::GetFlag(FLAGS_probe_timeout);
  options.eval_limit = absl::GetFlag(FLAGS_eval_limit);
  options.connect_timeout = absl::GetFlag(FLAGS_connect_timeout);
  options.rpc_timeout = absl::GetFlag(FLAGS_rpc_timeout);
  options.exchange.timeout = absl::GetFlag(FLAGS_exchange_timeout);

  if (options.coordinator.empty() || options.coordinator.find(':') == std::string::npos) {
    SHOAL_LOG(ERROR) << "cannot start: --coordinator must be host:port, got '"
                     << options.coordinator << "'";
    return 2;
  }
  auto worker = shoal::worker::Worker::Start(options);
  if (!worker.ok()) {
    SHOAL_LOG(ERROR) << "cannot start: " << worker.status();
    return 2;
  }
  SHOAL_LOG(INFO) << "shoal-worker listening on " << (*worker)->address();
  absl::Status s = (*worker)->Run();
  if (!s.ok()) {
    SHOAL_LOG(ERROR) << s;
    return 1;
  }
  if (const std::string path = absl::GetFlag(FLAGS_predictions_out); !path.empty()) {
    if (absl::Status w = (*worker)->WritePredictions(path, 100); !w.ok()) {
      SHOAL_LOG(ERROR) << "--predictions_out: " << w;
      return 1;
    }
  }
  return 0;
}
