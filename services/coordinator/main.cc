// shoal-coordinator: membership, rounds, shard plans and run status.
#include <cstdio>
#include <optional>
#include <random>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/flags_usage.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/model_file.h"
#include "common/mutex_mode.h"
#include "common/run_config.h"
#include "common/run_config_file.h"
#include "common/run_config_flags.h"
#include "common/run_options.h"
#include "common/sha256.h"
#include "common/signals.h"
#include "common/tls_flags.h"
#include "common/version.h"
#include "services/coordinator/coordinator_server.h"
#include "services/coordinator/core/run_settings.h"
#include "services/worker/core/torchscript_model.h"

ABSL_FLAG(std::string, config, "",
          "The run config file (YAML, or JSON: a .json name or text starting with '{'): keys "
          "are the run config's fields nested by group (model, training, sync or gossip, "
          "exchange, topology, timeouts, checkpoints, trust; docs/CONFIG.md). Flags given on the "
          "command line override its keys; flags left at their default do not.");
ABSL_FLAG(bool, check_config, false,
          "Check the run config (--config merged with the flags, a TorchScript file included), "
          "print the effective config as JSON and exit: 0 when it is valid, 2 otherwise.");
ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "Address to serve on (host:port; port 0 picks a free port).");
ABSL_FLAG(std::string, metrics_listen, "",
          "Serve Prometheus metrics at http://HOST:PORT/metrics (port 0 picks a free port); "
          "empty = off.");
ABSL_FLAG(std::string, http_listen, "",
          "Serve the live web page of the run at http://HOST:PORT/ (with /api/status, "
          "/api/history and /metrics; port 0 picks a free port); the same address as "
          "--metrics_listen = one server for both; empty = off.");
ABSL_FLAG(std::string, run_id, "", "Run id; empty generates one (run-<time>-<random>).");
ABSL_FLAG(std::string, state_dir, "",
          "Directory for the durable run record; a restarted coordinator on the same directory "
          "continues the run (round numbering, worker ids). Empty = not persisted.");
ABSL_FLAG(std::string, etcd, "",
          "Coordinator replicas: etcd members host:port[,host:port...]. The run record lives in "
          "etcd and the replicas elect a leader; only the leader runs rounds (docs/REPLICAS.md). "
          "Exclusive with --state_dir.");
ABSL_FLAG(std::string, etcd_prefix, "/shoal/",
          "With --etcd: prefix of this run's keys (several runs can share one etcd).");
ABSL_FLAG(absl::Duration, lease_ttl, absl::Seconds(3),
          "With --etcd: the leader's lease; a standby takes over within about this long after the "
          "leader dies (whole seconds, at least 1s).");
ABSL_FLAG(std::string, advertise, "",
          "With --etcd: the address workers dial to reach this coordinator (the leader hint "
          "standbys give); empty = the --listen address with the bound port.");
ABSL_FLAG(absl::Duration, probe_joiners_timeout, absl::Seconds(1),
          "Each joining worker's Peer address is probed with a TCP connect this long; a worker "
          "that cannot be reached takes part with outbound connections only (behind NAT: owns "
          "no slice, pushes its contributions; docs/SUPERNODES.md). 0 = no probe.");
ABSL_FLAG(uint32_t, max_members, 0,
          "Largest number of members at once; a new worker past it gets RESOURCE_EXHAUSTED "
          "(members re-joining under their id are not new). 0 = no limit.");
ABSL_FLAG(uint32_t, max_pending_joins, 256,
          "Members that joined and opened no session yet, at most; a new worker's Join past "
          "it gets UNAVAILABLE (workers retry). Bounds what Joins never followed up add to "
          "the status (docs/SECURITY.md \"Limits\"). 0 = no limit.");
ABSL_FLAG(uint32_t, max_departed_shown, 50,
          "Members removed from the run that the status still lists (the latest); it counts "
          "the others (departed_not_shown).");
ABSL_FLAG(uint32_t, max_joins_per_minute, 0,
          "Joins allowed per caller address and minute (a token bucket: that many at once, "
          "then one every 60/N s); past it RESOURCE_EXHAUSTED, other addresses unaffected. "
          "0 = no limit. Workers on one machine share an address.");
ABSL_FLAG(uint32_t, relay_max_members, 4096,
          "Members whose sessions one supernode's Relay stream carries at once; a member's "
          "Hello past it ends that relayed session with RESOURCE_EXHAUSTED "
          "(docs/SUPERNODES.md \"Relay\").");
ABSL_FLAG(uint32_t, relay_max_batch, 4096,
          "Entries (session messages, calls, gone notices) in one RelayUp; a larger one ends "
          "the Relay stream with RESOURCE_EXHAUSTED.");
ABSL_FLAG(std::string, upload_key_file, "",
          "File holding a secret shared with the checkpoint store's --upload_key_file (never "
          "given to workers; not the run token): each checkpoint request then carries an upload "
          "grant signed with it, and the store accepts only uploads with a valid grant. Empty = "
          "no grants (docs/SECURITY.md).");
ABSL_FLAG(std::string, audit_seed, "",
          "Tests only: a fixed secret for the audit draw (default: 32 random bytes at each "
          "start, so that nobody can tell which rounds will be audited).");

namespace {

using shoal::v1::RunConfig;

// The TorchScript file of the run: read, checked with LibTorch, its digest,
// size and (when the config gives none) --input_shape recorded in `c`.
// Returns the file's bytes ("" for the built-in models).
absl::StatusOr<std::string> LoadModelFile(RunConfig* c) {
  shoal::v1::ModelConfig* m = c->mutable_model();
  if (m->name() != "torchscript") return std::string();
  const std::string& path = m->file();
  if (path.empty()) {
    return absl::InvalidArgumentError(
        "model.name torchscript needs model.file (--model=torchscript:PATH)");
  }
  if (m->input_shape_size() == 0) {
    absl::StatusOr<std::vector<int64_t>> shape =
        shoal::ParseInputShape(shoal::CurrentFlagText("input_shape"));
    if (!shape.ok()) return shape.status();
    for (int64_t d : *shape) m->add_input_shape(static_cast<uint32_t>(d));
  }
  const std::vector<int64_t> shape(m->input_shape().begin(), m->input_shape().end());
  absl::StatusOr<std::string> bytes = shoal::worker::ReadModelFile(path);
  if (!bytes.ok()) {
    return absl::Status(bytes.status().code(),
                        absl::StrCat("model.file ", path, ": ", bytes.status().message()));
  }
  if (bytes->size() > shoal::kMaxModelFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, " has ", bytes->size(),
                                                   " bytes, more than the limit of ",
                                                   shoal::kMaxModelFileBytes));
  }
  absl::StatusOr<shoal::worker::TorchScriptSummary> summary =
      shoal::worker::CheckTorchScriptModel(*bytes, shape, path);
  if (!summary.ok()) return summary.status();
  const std::string sha = shoal::Sha256Hex(bytes->data(), bytes->size());
  if (!m->file_sha256().empty() && m->file_sha256() != sha) {
    return absl::InvalidArgumentError(absl::StrCat("model.file_sha256 is ", m->file_sha256(),
                                                   " but ", path, " has SHA-256 ", sha));
  }
  if (m->file_bytes() != 0 && m->file_bytes() != bytes->size()) {
    return absl::InvalidArgumentError(absl::StrCat("model.file_bytes is ", m->file_bytes(), " but ",
                                                   path, " has ", bytes->size(), " bytes"));
  }
  m->set_file_sha256(sha);
  m->set_file_bytes(bytes->size());
  SHOAL_LOG(INFO) << "TorchScript model " << path << ": " << bytes->size() << " bytes, SHA-256 "
                  << sha << ", " << summary->parameter_tensors << " trainable tensors ("
                  << summary->parameters << " parameters), " << summary->float_buffers
                  << " float buffers, " << summary->integer_buffers << " integer buffers, "
                  << summary->output_shape.back() << " outputs";
  return *std::move(bytes);
}

// The effective run config: the flags' defaults, --config, the flags given;
// then the model file; then the one validator.
absl::StatusOr<RunConfig> EffectiveRunConfig(std::string* model_file) {
  std::optional<shoal::RunConfigFile> file;
  if (const std::string path = absl::GetFlag(FLAGS_config); !path.empty()) {
    absl::StatusOr<shoal::RunConfigFile> read = shoal::ReadRunConfigFile(path);
    if (!read.ok()) return read.status();
    file = *std::move(read);
  }
  absl::StatusOr<shoal::MergedRunConfig> merged =
      shoal::MergeRunConfig(shoal::RunConfigFlagsFromCommandLine(), file ? &*file : nullptr);
  if (!merged.ok()) return merged.status();
  for (const std::string& note : merged->notes) SHOAL_LOG(WARNING) << note;
  RunConfig c = std::move(merged->config);
  absl::StatusOr<std::string> bytes = LoadModelFile(&c);
  if (!bytes.ok()) return bytes.status();
  if (absl::Status s = shoal::ValidateRunConfig(c); !s.ok()) return s;
  *model_file = *std::move(bytes);
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  shoal::DisableMutexDeadlockDetection();
  absl::SetProgramUsageMessage(
      "keeps membership, rounds and status of a Shoal training run.\n"
      "Usage: shoal-coordinator --listen=127.0.0.1:50051 --min_participants=3 --local_steps=50 "
      "--rounds=20\n"
      "       shoal-coordinator --config=run.yaml [flags overriding its keys]\n"
      "       shoal-coordinator --config=run.yaml --check_config");
  shoal::UseFlagsOfFileForHelp(__FILE__, {shoal::TlsFlagsFile(), shoal::RunConfigFlagsFile()});
  shoal::ParseFlagsOrExit(argc, argv, shoal::VersionLine("shoal-coordinator"));
  shoal::Metrics::SetBuildInfo("coordinator", shoal::ShoalVersion(), shoal::ShoalCommit());
  shoal::SetLogTag("coordinator");

  std::string model_file;
  absl::StatusOr<RunConfig> config = EffectiveRunConfig(&model_file);
  if (absl::GetFlag(FLAGS_check_config)) {
    if (!config.ok()) {
      std::fprintf(stderr, "invalid run config: %s\n",
                   std::string(config.status().message()).c_str());
      return 2;
    }
    std::printf("%s\n", shoal::RunConfigJson(*config).c_str());
    return 0;
  }
  if (!config.ok()) {
    SHOAL_LOG(ERROR) << "cannot start: " << config.status().message();
    return 2;
  }

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

  shoal::coordinator::CoordinatorOptions options;
  options.gate = shoal::TokenGate(*token, "");
  // With the run token, members also get credentials that peers check
  // (common/member_credentials.h): a former member reads no more.
  options.engine.member_credentials = !token->empty();
  if (const std::string path = absl::GetFlag(FLAGS_upload_key_file); !path.empty()) {
    absl::StatusOr<std::string> key = shoal::ReadTokenFile(path);
    if (!key.ok()) {
      SHOAL_LOG(ERROR) << "cannot start: --upload_key_file: " << key.status().message();
      return 2;
    }
    if (*key == *token) {
      SHOAL_LOG(ERROR) << "cannot start: the upload key must differ from the run token (every "
                          "member holds the run token)";
      return 2;
    }
    options.engine.upload_key = *std::move(key);
  }
  options.listen = absl::GetFlag(FLAGS_listen);
  options.state_dir = absl::GetFlag(FLAGS_state_dir);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.http_listen = absl::GetFlag(FLAGS_http_listen);
  if (const std::string etcd = absl::GetFlag(FLAGS_etcd); !etcd.empty()) {
    absl::StatusOr<std::vector<std::string>> endpoints = shoal::ParseEndpoints(etcd, "etcd");
    if (!endpoints.ok()) {
      SHOAL_LOG(ERROR) << "cannot start: " << endpoints.status().message();
      return 2;
    }
    options.etcd = *endpoints;
  }
  options.etcd_prefix = absl::GetFlag(FLAGS_etcd_prefix);
  options.lease_ttl = absl::GetFlag(FLAGS_lease_ttl);
  options.advertise = absl::GetFlag(FLAGS_advertise);
  auto& engine = options.engine;
  engine.run_id = absl::GetFlag(FLAGS_run_id);
  options.run_id_from_flag = !engine.run_id.empty();
  if (engine.run_id.empty()) {
    std::random_device rd;
    engine.run_id = absl::StrFormat(
        "run-%d-%04x", absl::ToUnixSeconds(shoal::RealClock::Get()->Now()), rd() & 0xFFFF);
  }
  engine.max_members = absl::GetFlag(FLAGS_max_members);
  engine.max_pending_joins = absl::GetFlag(FLAGS_max_pending_joins);
  engine.max_departed_shown = absl::GetFlag(FLAGS_max_departed_shown);
  engine.audit_secret = absl::GetFlag(FLAGS_audit_seed);
  engine.join_probe_timeout = absl::GetFlag(FLAGS_probe_joiners_timeout);
  options.max_joins_per_minute = absl::GetFlag(FLAGS_max_joins_per_minute);
  options.relay.max_members = absl::GetFlag(FLAGS_relay_max_members);
  options.relay.max_batch = absl::GetFlag(FLAGS_relay_max_batch);
  engine.config = *std::move(config);
  shoal::coordinator::ApplyRunSettings(engine.config, &engine);
  options.model_file = std::move(model_file);

  auto server = shoal::coordinator::CoordinatorServer::Start(options, shoal::RealClock::Get());
  if (!server.ok()) {
    SHOAL_LOG(ERROR) << "cannot start: " << server.status().message();
    return 2;
  }
  // The effective config: a resumed run's is its record's (timeouts and
  // checkpoints as given); a standby shows the one it was given.
  shoal::coordinator::RoundEngine* active = (*server)->active_engine();
  const RunConfig effective = active != nullptr ? active->Status().config() : engine.config;
  SHOAL_LOG(INFO) << "shoal-coordinator listening on " << (*server)->address()
                  << " run_id=" << engine.run_id << " mode=" << shoal::ModeName(effective);
  for (const std::string& line : shoal::RunConfigLines(effective)) {
    SHOAL_LOG(INFO) << "config " << line;
  }
  while (!shoal::ShutdownSignal::WaitFor(absl::Seconds(1))) {
  }
  (*server)->Shutdown(absl::Seconds(2));
  if (shoal::coordinator::RoundEngine* e = (*server)->active_engine()) {
    SHOAL_LOG(INFO) << "stopped after round " << e->last_completed_round();
  } else {
    SHOAL_LOG(INFO) << "stopped (a standby replica)";
  }
  return 0;
}
