// shoal-checkpoint: the durable checkpoint store (content-addressed layer
// blobs + manifests in --data_dir).
#include <algorithm>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/flags_usage.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/mutex_mode.h"
#include "common/signals.h"
#include "common/tls_flags.h"
#include "common/version.h"
#include "services/checkpoint/checkpoint_server.h"
#include "services/checkpoint/malloc_tuning.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50052",
          "Address to serve on (host:port; port 0 picks a free port).");
ABSL_FLAG(std::string, metrics_listen, "",
          "Serve Prometheus metrics at http://HOST:PORT/metrics (port 0 picks a free port); "
          "empty = off.");
ABSL_FLAG(std::string, data_dir, "",
          "Directory of the store (required; created if missing). One server per directory.");
ABSL_FLAG(uint32_t, retain, 0,
          "Keep the last N checkpoints (highest rounds) of each run, deleting older ones after "
          "each upload and at start; 0 keeps all.");
ABSL_FLAG(std::string, admin_token_file, "",
          "File holding the store's admin token: it may also delete checkpoints (the run token "
          "of --token_file may only list, read and upload). Empty = no admin token: with "
          "--token_file set, nobody may delete (docs/SECURITY.md).");
ABSL_FLAG(std::string, upload_key_file, "",
          "File holding the secret shared with the coordinator's --upload_key_file: every upload "
          "then needs the coordinator's grant for its run and round (PERMISSION_DENIED "
          "otherwise). Empty = uploads need the run token only (docs/SECURITY.md).");
ABSL_FLAG(bool, verify_on_start, true,
          "Re-hash every blob at start and mark checkpoints with corrupted blobs as damaged "
          "(reads fail with DATA_LOSS). When false only blob sizes are checked.");
ABSL_FLAG(absl::Duration, trim_interval, absl::Seconds(1),
          "Every this long, give the kernel back the free pages inside the heap that a burst "
          "of transfers left (malloc_trim); 0 = never (bench/RESULTS.md, \"The checkpoint "
          "store's memory\", has its cost).");

int main(int argc, char** argv) {
  // Before anything starts a thread (gRPC): see malloc_tuning.h.
  shoal::checkpoint::ReturnChunkBuffersToTheKernel();
  shoal::DisableMutexDeadlockDetection();
  absl::SetProgramUsageMessage(
      "durable checkpoints of Shoal runs.\n"
      "Usage: shoal-checkpoint --data_dir=/var/lib/shoal/checkpoints [--listen=127.0.0.1:50052] "
      "[--retain=5] [--verify_on_start=true]");
  shoal::UseFlagsOfFileForHelp(__FILE__, {shoal::TlsFlagsFile()});
  shoal::ParseFlagsOrExit(argc, argv, shoal::VersionLine("shoal-checkpoint"));
  shoal::Metrics::SetBuildInfo("checkpoint", shoal::ShoalVersion(), shoal::ShoalCommit());
  shoal::SetLogTag("checkpoint");
  if (absl::Status tls = shoal::ApplyTlsFlags(); !tls.ok()) {
    SHOAL_LOG(ERROR) << "cannot start: " << tls;
    return 2;
  }
  absl::StatusOr<std::string> token = shoal::ApplyTokenFlag();
  if (!token.ok()) {
    SHOAL_LOG(ERROR) << "cannot start: " << token.status().message();
    return 2;
  }
  std::string admin_token;
  if (const std::string path = absl::GetFlag(FLAGS_admin_token_file); !path.empty()) {
    absl::StatusOr<std::string> admin = shoal::ReadTokenFile(path);
    if (!admin.ok()) {
      SHOAL_LOG(ERROR) << "cannot start: --admin_token_file: " << admin.status().message();
      return 2;
    }
    if (*admin == *token) {
      SHOAL_LOG(ERROR) << "cannot start: the admin token must differ from the run token";
      return 2;
    }
    admin_token = *std::move(admin);
  }
  std::string upload_key;
  if (const std::string path = absl::GetFlag(FLAGS_upload_key_file); !path.empty()) {
    absl::StatusOr<std::string> key = shoal::ReadTokenFile(path);
    if (!key.ok()) {
      SHOAL_LOG(ERROR) << "cannot start: --upload_key_file: " << key.status().message();
      return 2;
    }
    if (*key == *token || *key == admin_token) {
      SHOAL_LOG(ERROR) << "cannot start: the upload key must differ from the run and admin tokens";
      return 2;
    }
    upload_key = *std::move(key);
  }
  shoal::ShutdownSignal::Install();

  shoal::checkpoint::CheckpointServerOptions options;
  options.upload_key = std::move(upload_key);
  options.gate = shoal::TokenGate(*token, admin_token);
  options.listen = absl::GetFlag(FLAGS_listen);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.store.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.store.retain = absl::GetFlag(FLAGS_retain);
  options.store.verify_on_start = absl::GetFlag(FLAGS_verify_on_start);
  if (options.store.data_dir.empty()) {
    SHOAL_LOG(ERROR) << "--data_dir is required";
    return 2;
  }

  auto server = shoal::checkpoint::CheckpointServer::Start(options);
  if (!server.ok()) {
    SHOAL_LOG(ERROR) << "cannot start: " << server.status();
    return 2;
  }
  SHOAL_LOG(INFO) << "shoal-checkpoint listening on " << (*server)->address()
                  << " data_dir=" << options.store.data_dir
                  << " checkpoints=" << (*server)->store().size()
                  << " retain=" << options.store.retain;
  const absl::Duration trim_interval = absl::GetFlag(FLAGS_trim_interval);
  const bool trim = trim_interval > absl::ZeroDuration();
  const absl::Duration tick = trim ? std::min(trim_interval, absl::Seconds(1)) : absl::Seconds(1);
  absl::Time next_trim = absl::Now() + trim_interval;
  while (!shoal::ShutdownSignal::WaitFor(tick)) {
    if (trim && absl::Now() >= next_trim) {
      shoal::checkpoint::ReturnFreedHeapPages();
      next_trim = absl::Now() + trim_interval;
    }
  }
  (*server)->Shutdown(absl::Seconds(5));
  SHOAL_LOG(INFO) << "stopped";
  return 0;
}
