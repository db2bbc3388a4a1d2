// shoalctl: the operator CLI.
//   shoalctl status --coordinator=ADDR [--json]
//   shoalctl watch  --coordinator=ADDR [--timeout=10m]
//   shoalctl config --coordinator=ADDR
//   shoalctl checkpoints list|show|export|delete --store=ADDR ...
#include <cstdio>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/flags_usage.h"
#include "common/grpc_util.h"
#include "common/run_config.h"
#include "common/signals.h"
#include "common/status_util.h"
#include "common/tls_flags.h"
#include "shoal/v1/coordinator.grpc.pb.h"
#include "tools/shoalctl/checkpoints_cmd.h"
#include "tools/shoalctl/status_format.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:50051",
          "Coordinator address (host:port), or the replicas' addresses separated by commas "
          "(the leader answers; a standby's view when none does).");
ABSL_FLAG(bool, json, false, "status: print the RunStatus as JSON.");
ABSL_FLAG(absl::Duration, rpc_timeout, absl::Seconds(5), "Deadline of each call.");
ABSL_FLAG(absl::Duration, timeout, absl::Minutes(30),
          "watch: give up (exit 1) when the run has not finished after this long.");
ABSL_FLAG(absl::Duration, interval, absl::Milliseconds(250), "watch: polling interval.");

namespace {

constexpr char kUsage[] =
    "shoalctl: operate a Shoal training run.\n"
    "  shoalctl status --coordinator=ADDR [--json]   the run's status as a table or JSON\n"
    "  shoalctl config --coordinator=ADDR   the run's effective config as JSON (a --config file)\n"
    "  shoalctl watch --coordinator=ADDR [--timeout=30m]\n"
    "      prints one line per completed round until the run finishes, then a summary line\n"
    "      with test_accuracy=<value>\n"
    "  shoalctl checkpoints list --store=ADDR [--json] [--run_id=RUN]\n"
    "  shoalctl checkpoints show --store=ADDR --id=ID [--json]\n"
    "  shoalctl checkpoints export --store=ADDR --id=ID --out=FILE   (torch.load-able state dict)\n"
    "  shoalctl checkpoints delete --store=ADDR --id=ID";

// The coordinators named by --coordinator: one address, several separated by
// commas (replicas, docs/REPLICAS.md), or a DNS name.
struct Coordinators {
  std::vector<std::unique_ptr<shoal::v1::Coordinator::Stub>> stubs;
};

absl::StatusOr<shoal::v1::RunStatus> GetStatusFrom(shoal::v1::Coordinator::Stub* stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(shoal::DeadlineIn(absl::GetFlag(FLAGS_rpc_timeout)));
  shoal::v1::RunStatus status;
  grpc::Status s = stub->GetRunStatus(&ctx, shoal::v1::GetRunStatusRequest(), &status);
  if (!s.ok()) return shoal::FromGrpcStatus(s);
  return status;
}

// The leader's status when one of the replicas leads (or the only
// coordinator's); else the first standby's view (replica_role "standby").
absl::StatusOr<shoal::v1::RunStatus> GetStatus(Coordinators* c) {
  absl::StatusOr<shoal::v1::RunStatus> standby = absl::UnavailableError("no coordinator");
  absl::Status last = absl::UnavailableError("no coordinator address");
  for (auto& stub : c->stubs) {
    absl::StatusOr<shoal::v1::RunStatus> s = GetStatusFrom(stub.get());
    if (!s.ok()) {
      last = s.status();
      continue;
    }
    if (s->replica_role() != "standby") return s;
    if (!standby.ok()) standby = s;
  }
  if (standby.ok()) return standby;
  return last;
}

int Status(Coordinators* stub) {
  auto status = GetStatus(stub);
  if (!status.ok()) {
    std::cerr << "shoalctl: cannot get status from " << absl::GetFlag(FLAGS_coordinator) << ": "
              << status.status() << "\n";
    return 1;
  }
  std::cout << (absl::GetFlag(FLAGS_json) ? shoal::ctl::FormatStatusJson(*status)
                                          : shoal::ctl::FormatStatusTable(*status));
  return 0;
}

// The run's effective config (RunStatus.config), as the JSON a coordinator's
// --config reads back (docs/CONFIG.md).
int Config(Coordinators* stub) {
  auto status = GetStatus(stub);
  if (!status.ok()) {
    std::cerr << "shoalctl: cannot get status from " << absl::GetFlag(FLAGS_coordinator) << ": "
              << status.status() << "\n";
    return 1;
  }
  std::cout << shoal::RunConfigJson(status->config()) << "\n";
  return 0;
}

int Watch(Coordinators* stub, const shoal::Clock* clock) {
  const absl::Time start = clock->Now();
  const absl::Time give_up = start + absl::GetFlag(FLAGS_timeout);
  uint64_t printed = 0;
  std::string last_error;
  std::string last_detail;
  std::string last_gossip_line;
  absl::Time next_gossip_line = absl::InfinitePast();
  while (true) {
    auto status = GetStatus(stub);
    if (!status.ok()) {
      const std::string err = status.status().ToString();
      if (err != last_error) std::cerr << "shoalctl: coordinator: " << err << " (retrying)\n";
      last_error = err;
    } else {
      last_error.clear();
      if (printed == 0 && status->last_completed_round() == 0 && status->detail() != last_detail) {
        std::cout << "waiting: phase " << shoal::ctl::PhaseName(status->phase()) << ", "
                  << status->detail() << std::endl;
        last_detail = status->detail();
      }
      if (shoal::ctl::IsGossip(*status) && clock->Now() >= next_gossip_line) {
        const std::string line = shoal::ctl::FormatGossipLine(*status);
        if (line != last_gossip_line) std::cout << line << std::endl;
        last_gossip_line = line;
        next_gossip_line = clock->Now() + absl::Seconds(5);
      }
      for (const auto& r : status->recent_rounds()) {
        if (r.round() <= printed) continue;
        std::cout << shoal::ctl::FormatRoundLine(r, status->config().sync().rounds()) << std::endl;
        printed = r.round();
      }
      if (status->phase() == shoal::v1::FINISHED) {
        std::cout << shoal::ctl::FormatSummaryLine(*status,
                                                   absl::ToDoubleSeconds(clock->Now() - start))
                  << std::endl;
        return shoal::ctl::HashesAgree(*status) ? 0 : 3;
      }
    }
    if (clock->Now() >= give_up) {
      std::cerr << "shoalctl: the run did not finish within " << absl::GetFlag(FLAGS_timeout)
                << "\n";
      return 1;
    }
    if (shoal::ShutdownSignal::WaitFor(absl::GetFlag(FLAGS_interval))) return 130;
  }
}

}  // namespace

int main(int argc, char** argv) {
  // `checkpoints` parses its own --key=value arguments.
  if (argc >= 2 && std::string(argv[1]) == "checkpoints") {
    return shoal::ctl::RunCheckpointsCommand(std::vector<std::string>(argv + 2, argv + argc));
  }
  absl::SetProgramUsageMessage(kUsage);
  shoal::UseFlagsOfFileForHelp(__FILE__, {shoal::TlsFlagsFile()});
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2) {
    std::cerr << kUsage << "\n";
    return 2;
  }
  const std::string command = args[1];
  if (absl::Status tls = shoal::ApplyTlsFlags(); !tls.ok()) {
    std::cerr << "shoalctl: " << tls << "\n";
    return 2;
  }
  // The run token (status, list, export) or the store's admin token
  // (checkpoints delete); sent with every call.
  if (absl::StatusOr<std::string> token = shoal::ApplyTokenFlag(); !token.ok()) {
    std::cerr << "shoalctl: --token_file: " << token.status().message() << "\n";
    return 2;
  }
  shoal::ShutdownSignal::Install();
  Coordinators coordinators;
  for (absl::string_view a :
       absl::StrSplit(absl::GetFlag(FLAGS_coordinator), ',', absl::SkipWhitespace())) {
    coordinators.stubs.push_back(
        shoal::v1::Coordinator::NewStub(shoal::MakeChannel(std::string(a))));
  }
  if (coordinators.stubs.empty()) {
    std::cerr << "shoalctl: --coordinator names no address\n";
    return 2;
  }
  if (command == "status") return Status(&coordinators);
  if (command == "watch") return Watch(&coordinators, shoal::RealClock::Get());
  if (command == "config") return Config(&coordinators);
  std::cerr << "shoalctl: unknown command '" << command << "'\n" << kUsage << "\n";
  return 2;
}
