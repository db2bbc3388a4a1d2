// shoal-poison-worker: the misbehaving peer of the poisoning test (issue 14,
// tests/e2e/robust_test.cc). A real worker (the same Worker class, protocol,
// exchange and peer service as shoal-worker) that multiplies its trained
// model by --scale right before it becomes its contribution of each round,
// through WorkerOptions::contribution_transform, a seam shoal-worker never
// sets. Built only with the tests; not a flag of the real worker.
//
// Everything else it does honestly: as the owner of a slice it combines the
// contributions (its own scaled one included) by the run's aggregation, and
// it applies the other owners' averages, so it reports the same model hash
// as everyone else.
#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/flags_usage.h"
#include "common/logging.h"
#include "common/mutex_mode.h"
#include "common/signals.h"
#include "services/worker/malloc_tuning.h"
#include "services/worker/worker.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:50051", "Coordinator address (host:port).");
ABSL_FLAG(std::string, listen, "127.0.0.1:0", "Address of this worker's Peer service.");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "Directory with the Fashion-MNIST IDX files.");
ABSL_FLAG(std::string, name, "poisoner", "Name shown in logs and status.");
ABSL_FLAG(uint32_t, eval_limit, 0, "Evaluate on at most this many test images (0 = all).");
ABSL_FLAG(double, scale, 1000.0, "Every contribution is the trained model times this.");
ABSL_FLAG(std::string, zone, "", "Where the worker sits (a zone path; empty = the root).");
ABSL_FLAG(absl::Duration, exchange_timeout, absl::Seconds(120),
          "Deadline of one round's weight exchange.");

int main(int argc, char** argv) {
  shoal::worker::TuneMallocForTensorStreams();
  shoal::DisableMutexDeadlockDetection();
  absl::SetProgramUsageMessage(
      "a test-only worker that serves every contribution scaled by --scale.\nUsage: "
      "shoal-poison-worker --coordinator=127.0.0.1:50051 --scale=1000");
  shoal::UseFlagsOfFileForHelp(__FILE__);
  absl::ParseCommandLine(argc, argv);
  shoal::SetLogTag("poison");
  shoal::ShutdownSignal::Install();

  shoal::worker::WorkerOptions options;
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  options.listen = absl::GetFlag(FLAGS_listen);
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.name = absl::GetFlag(FLAGS_name);
  options.zone = absl::GetFlag(FLAGS_zone);
  options.eval_limit = absl::GetFlag(FLAGS_eval_limit);
  options.exchange.timeout = absl::GetFlag(FLAGS_exchange_timeout);
  const float scale = static_cast<float>(absl::GetFlag(FLAGS_scale));
  options.contribution_transform = [scale](uint64_t round, float* params, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) params[i] *= scale;
    SHOAL_LOG(INFO) << "round " << round << ": contribution scaled by " << scale;
  };

  auto worker = shoal::worker::Worker::Start(options);
  if (!worker.ok()) {
    SHOAL_LOG(ERROR) << "cannot start: " << worker.status();
    return 2;
  }
  SHOAL_LOG(INFO) << "shoal-poison-worker listening on " << (*worker)->address();
  absl::Status s = (*worker)->Run();
  if (!s.ok()) {
    SHOAL_LOG(ERROR) << s;
    return 1;
  }
  return 0;
}
