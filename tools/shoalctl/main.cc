// shoalctl: the operator CLI. Commands, flags, environment variables and
// help are cli.cc's table (`shoalctl help`); this file runs them.
//   shoalctl status [-o table|wide|json|yaml]
//   shoalctl watch [-o json] [--timeout=30m]
//   shoalctl config [-o yaml]
//   shoalctl checkpoints list|show|export|delete ...
#include <iostream>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/auth.h"
#include "common/clock.h"
#include "common/grpc_util.h"
#include "common/run_config.h"
#include "common/signals.h"
#include "common/status_util.h"
#include "common/tcp_prober.h"
#include "common/tls.h"
#include "common/version.h"
#include "common/worker_state.h"
#include "services/checkpoint/checkpoint_client.h"
#include "shoal/v1/coordinator.grpc.pb.h"
#include "tools/shoalctl/checkpoints_cmd.h"
#include "tools/shoalctl/cli.h"
#include "tools/shoalctl/diagnose.h"
#include "tools/shoalctl/status_format.h"
#include "tools/shoalctl/terminal_text.h"
#include "tools/shoalctl/yaml_output.h"

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
  std::string address;  // as given
  absl::Duration rpc_timeout;
  std::vector<std::unique_ptr<shoal::v1::Coordinator::Stub>> stubs;
};

using shoal::ctl::DocumentText;
using shoal::ctl::ForTerminal;
using shoal::ctl::Invocation;
using shoal::ctl::OutputFormat;
using shoal::ctl::TerminalText;

absl::StatusOr<shoal::v1::RunStatus> GetStatusFrom(shoal::v1::Coordinator::Stub* stub,
                                                   absl::Duration rpc_timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(shoal::DeadlineIn(rpc_timeout));
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
    absl::StatusOr<shoal::v1::RunStatus> s = GetStatusFrom(stub.get(), c->rpc_timeout);
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

// "cannot get status from ADDR: ...", with what to check when nothing
// answered.
std::string CannotReach(const Coordinators& c, const absl::Status& s) {
  std::string out = absl::StrCat("cannot get status from ", c.address, ": ", s.ToString());
  if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) {
    absl::StrAppend(&out,
                    " (is a coordinator running there? --coordinator or SHOAL_COORDINATOR "
                    "names it)");
  }
  // The error's message may quote what the server was sent or holds.
  return TerminalText(out);
}

// The document in the asked format (json or yaml from the JSON form), every
// character that is not shown as an escape (terminal_text.h).
std::string Document(OutputFormat format, const std::string& json) {
  if (format != OutputFormat::kYaml) return DocumentText(json);
  absl::StatusOr<std::string> yaml = shoal::ctl::JsonToYaml(json);
  return DocumentText(yaml.ok() ? *yaml : json);
}

int Status(Coordinators* c, const Invocation& inv) {
  auto status = GetStatus(c);
  if (!status.ok()) {
    std::cerr << "shoalctl: " << CannotReach(*c, status.status()) << "\n";
    return 1;
  }
  switch (inv.output) {
    case OutputFormat::kJson:
    case OutputFormat::kYaml:
      std::cout << Document(inv.output, shoal::ctl::FormatStatusJson(*status));
      break;
    case OutputFormat::kTable:
    case OutputFormat::kWide:
      // Each string escaped before the layout, the lines once more.
      std::cout << TerminalText(
          shoal::ctl::FormatStatusTable(ForTerminal(*status), inv.output == OutputFormat::kWide));
      break;
  }
  return 0;
}

// The run's effective config (RunStatus.config), as the file a
// coordinator's --config reads back (docs/CONFIG.md).
int Config(Coordinators* c, const Invocation& inv) {
  auto status = GetStatus(c);
  if (!status.ok()) {
    std::cerr << "shoalctl: " << CannotReach(*c, status.status()) << "\n";
    return 1;
  }
  std::cout << Document(inv.output, shoal::RunConfigJson(status->config()) + "\n");
  return 0;
}

// Table: progress lines for people; json: one object per line (status_format.h).
int Watch(Coordinators* c, const Invocation& inv, const shoal::Clock* clock) {
  const bool json = inv.output == OutputFormat::kJson;
  absl::StatusOr<absl::Duration> timeout =
      shoal::ctl::DurationFlag(inv, "timeout", absl::Minutes(30));
  absl::StatusOr<absl::Duration> interval =
      shoal::ctl::DurationFlag(inv, "interval", absl::Milliseconds(250));
  if (!timeout.ok() || !interval.ok()) {
    std::cerr << "shoalctl: " << (timeout.ok() ? interval.status() : timeout.status()).message()
              << "\n";
    return 2;
  }
  const absl::Time start = clock->Now();
  const absl::Time give_up = start + *timeout;
  uint64_t printed = 0;
  std::string last_detail;
  std::string last_gossip_line;
  absl::Time next_gossip_line = absl::InfinitePast();
  // While the coordinator cannot be reached: a line at once, then every 10 s.
  absl::Time unreachable_since = absl::InfinitePast();
  absl::Time next_unreachable_line = absl::InfinitePast();
  // Every line: JSON with escapes, or text escaped for the terminal.
  const auto line = [json](const std::string& text) {
    return json ? DocumentText(text) : TerminalText(text);
  };
  while (true) {
    auto status = GetStatus(c);
    if (status.ok() && !json) *status = ForTerminal(*std::move(status));
    if (!status.ok()) {
      const absl::Time now = clock->Now();
      if (unreachable_since == absl::InfinitePast()) unreachable_since = now;
      if (now >= next_unreachable_line) {
        const double for_seconds = absl::ToDoubleSeconds(now - unreachable_since);
        if (json) {
          std::cout << line(absl::StrFormat(
                           "{\"event\":\"unreachable\",\"coordinator\":%s,\"seconds\":%.1f,"
                           "\"error\":%s}",
                           shoal::ctl::JsonQuote(c->address), for_seconds,
                           shoal::ctl::JsonQuote(status.status().ToString())))
                    << std::endl;
        } else {
          std::cerr << "shoalctl: " << CannotReach(*c, status.status())
                    << absl::StrFormat(
                           "; for %.0fs, retrying until --timeout (%s left)\n", for_seconds,
                           absl::FormatDuration(absl::Trunc(give_up - now, absl::Seconds(1))));
        }
        next_unreachable_line = now + absl::Seconds(10);
      }
    } else {
      unreachable_since = next_unreachable_line = absl::InfinitePast();
      if (printed == 0 && status->last_completed_round() == 0 && status->detail() != last_detail) {
        if (json) {
          std::cout << line(absl::StrCat(
                           "{\"event\":\"waiting\",\"phase\":",
                           shoal::ctl::JsonQuote(shoal::ctl::PhaseName(status->phase())),
                           ",\"detail\":", shoal::ctl::JsonQuote(status->detail()), "}"))
                    << std::endl;
        } else {
          std::cout << line(absl::StrCat("waiting: phase ", shoal::ctl::PhaseName(status->phase()),
                                         ", ", status->detail()))
                    << std::endl;
        }
        last_detail = status->detail();
      }
      if (shoal::ctl::IsGossip(*status) && clock->Now() >= next_gossip_line) {
        const std::string gossip = shoal::ctl::FormatGossipLine(*status);
        if (gossip != last_gossip_line) {
          std::cout << line(json ? absl::StrCat("{\"event\":\"gossip\",\"line\":",
                                                shoal::ctl::JsonQuote(gossip), "}")
                                 : gossip)
                    << std::endl;
        }
        last_gossip_line = gossip;
        next_gossip_line = clock->Now() + absl::Seconds(5);
      }
      for (const auto& r : status->recent_rounds()) {
        if (r.round() <= printed) continue;
        const uint64_t total = status->config().sync().rounds();
        std::cout << line(json ? shoal::ctl::FormatRoundJsonLine(r, total)
                               : shoal::ctl::FormatRoundLine(r, total))
                  << std::endl;
        printed = r.round();
      }
      if (status->phase() == shoal::v1::FINISHED) {
        const double elapsed = absl::ToDoubleSeconds(clock->Now() - start);
        std::cout << line(json ? shoal::ctl::FormatFinishedJsonLine(*status, elapsed)
                               : shoal::ctl::FormatSummaryLine(*status, elapsed))
                  << std::endl;
        return shoal::ctl::HashesAgree(*status) ? 0 : 3;
      }
    }
    if (clock->Now() >= give_up) {
      std::cerr << "shoalctl: the run did not finish within " << *timeout << "\n";
      return 1;
    }
    if (shoal::ShutdownSignal::WaitFor(*interval)) return 130;
  }
}

// This host's TCP handshake to each address (id -> host:port), all at once,
// each within `timeout`.
struct ProbeResults {
  std::map<std::string, absl::Status> status;
  size_t want = 0;
  static bool Done(ProbeResults* r) { return r->status.size() >= r->want; }
};

std::map<std::string, absl::Status> ProbeAll(const std::map<std::string, std::string>& addresses,
                                             absl::Duration timeout) {
  absl::Mutex mu;
  ProbeResults results;
  results.want = addresses.size();
  {
    absl::StatusOr<std::unique_ptr<shoal::TcpProber>> prober =
        shoal::TcpProber::Start(shoal::RealClock::Get());
    if (!prober.ok()) return {};
    for (const auto& [id, address] : addresses) {
      (*prober)->Probe(address, timeout, [&mu, &results, id = id](absl::Status s) {
        absl::MutexLock lock(&mu);
        results.status[id] = std::move(s);
      });
    }
    {
      absl::MutexLock lock(&mu);
      mu.AwaitWithTimeout(absl::Condition(&ProbeResults::Done, &results),
                          timeout + absl::Seconds(2));
    }
    // Runs what is still in flight (CANCELLED) before `results` goes.
    (*prober)->Shutdown();
  }
  absl::MutexLock lock(&mu);
  return results.status;
}

int Explain(Coordinators* c, const Invocation& inv) {
  auto status = GetStatus(c);
  if (!status.ok()) {
    std::cerr << "shoalctl: " << CannotReach(*c, status.status()) << "\n";
    return 1;
  }
  // Findings quote names and reasons: escaped before they are laid out.
  if (inv.output == OutputFormat::kTable) *status = ForTerminal(*std::move(status));
  const std::string& who = inv.operands[0];
  std::optional<absl::Status> reachable;
  for (const auto& w : status->workers()) {
    if ((w.id() == who || (!w.name().empty() && w.name() == who)) && !w.address().empty()) {
      auto probed = ProbeAll({{w.id(), w.address()}}, absl::Seconds(3));
      if (auto it = probed.find(w.id()); it != probed.end()) reachable = it->second;
    }
  }
  absl::StatusOr<std::vector<shoal::ctl::Finding>> findings =
      shoal::ctl::ExplainWorker(*status, who, reachable);
  if (!findings.ok()) {
    std::cerr << "shoalctl: " << TerminalText(findings.status().message()) << "\n";
    return 1;
  }
  std::cout << (inv.output == OutputFormat::kTable
                    ? TerminalText(shoal::ctl::FormatFindings(*findings))
                    : Document(inv.output, shoal::ctl::FormatFindingsJson(*findings)));
  return shoal::ctl::AnyProblem(*findings) ? 1 : 0;
}

int Doctor(Coordinators* c, const Invocation& inv) {
  shoal::ctl::DoctorFacts facts;
  facts.coordinator_address = c->address;
  facts.client_tls = !inv.Get("tls_ca").empty();
  facts.client_token = !inv.Get("token_file").empty();
  shoal::v1::RunStatus status;
  absl::StatusOr<shoal::v1::RunStatus> got = GetStatus(c);
  facts.local_unix_ms = absl::ToUnixMillis(absl::Now());
  if (got.ok()) {
    status = *std::move(got);
    if (inv.output == OutputFormat::kTable) status = ForTerminal(std::move(status));
  } else {
    facts.coordinator = got.status();
  }
  std::map<std::string, std::string> addresses;
  for (const auto& w : status.workers()) {
    if (!shoal::DepartedState(w.state()) && !w.address().empty()) addresses[w.id()] = w.address();
  }
  facts.member_reachable = ProbeAll(addresses, absl::Seconds(3));
  // The run's store, else --store when given (the default names none).
  facts.store_address = status.config().checkpoints().store();
  if (facts.store_address.empty() && inv.given.count("store"))
    facts.store_address = inv.Get("store");
  if (!facts.store_address.empty()) {
    shoal::checkpoint::CheckpointClientOptions options;
    options.call_timeout = c->rpc_timeout;
    shoal::checkpoint::GrpcCheckpointClient store(facts.store_address, options);
    auto list = store.List(status.run_id());
    facts.store = list.ok() ? absl::OkStatus() : list.status();
    if (list.ok()) facts.checkpoints = *std::move(list);
  }
  const std::vector<shoal::ctl::Finding> findings = shoal::ctl::Doctor(status, facts);
  const bool problem = shoal::ctl::AnyProblem(findings);
  if (inv.output != OutputFormat::kTable) {
    std::cout << Document(inv.output, shoal::ctl::FormatFindingsJson(findings));
    return problem ? 1 : 0;
  }
  std::cout << TerminalText(shoal::ctl::FormatFindings(findings));
  std::cout << (problem ? "doctor: something is wrong (the PROBLEM lines)\n"
                        : "doctor: no problem found\n");
  return problem ? 1 : 0;
}

// TLS and the token of every call, from the global flags.
absl::Status ApplySecurity(const Invocation& inv) {
  shoal::TlsFiles files{inv.Get("tls_cert"), inv.Get("tls_key"), inv.Get("tls_ca"),
                        inv.Get("tls_server_name")};
  absl::StatusOr<shoal::TlsConfig> tls = shoal::LoadTls(files);
  if (!tls.ok()) return tls.status();
  if (tls->enabled()) shoal::SetProcessTls(*std::move(tls));
  if (const std::string file = inv.Get("token_file"); !file.empty()) {
    absl::StatusOr<std::string> token = shoal::ReadTokenFile(file);
    if (!token.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--token_file: ", token.status().message()));
    }
    shoal::SetProcessToken(*std::move(token));
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<Invocation> inv = shoal::ctl::ParseCommandLine(
      std::vector<std::string>(argv + 1, argv + argc), shoal::ctl::ProcessEnv());
  if (!inv.ok()) {
    std::cerr << "shoalctl: " << inv.status().message() << "\nRun 'shoalctl help' for usage.\n";
    return 2;
  }
  const std::vector<std::string>& command = inv->command;
  if (inv->version || command == std::vector<std::string>{"version"}) {
    std::cout << shoal::VersionLine("shoalctl") << "\n";
    return 0;
  }
  if (inv->help || command.empty() || command[0] == "help") {
    const std::vector<std::string> topic =
        !command.empty() && command[0] == "help" ? inv->operands : command;
    absl::StatusOr<std::string> text = shoal::ctl::HelpText(topic);
    if (!text.ok()) {
      std::cerr << "shoalctl: " << text.status().message() << "\n";
      return 2;
    }
    // `shoalctl` alone is a usage error; asking for help is not.
    if (command.empty() && !inv->help) {
      std::cerr << *text;
      return 2;
    }
    std::cout << *text;
    return 0;
  }
  if (command[0] == "completion") {
    std::cout << shoal::ctl::BashCompletion();
    return 0;
  }
  if (absl::Status s = shoal::ctl::CheckOutput(*inv); !s.ok()) {
    std::cerr << "shoalctl: " << s.message() << "\n";
    return 2;
  }
  if (absl::Status s = ApplySecurity(*inv); !s.ok()) {
    std::cerr << "shoalctl: " << s.message() << "\n";
    return 2;
  }
  shoal::ShutdownSignal::Install();
  if (command[0] == "checkpoints") return shoal::ctl::RunCheckpointsCommand(*inv);

  Coordinators coordinators;
  coordinators.address = inv->Get("coordinator");
  absl::StatusOr<absl::Duration> rpc_timeout =
      shoal::ctl::DurationFlag(*inv, "rpc_timeout", absl::Seconds(5));
  if (!rpc_timeout.ok()) {
    std::cerr << "shoalctl: " << rpc_timeout.status().message() << "\n";
    return 2;
  }
  coordinators.rpc_timeout = *rpc_timeout;
  for (absl::string_view a : absl::StrSplit(coordinators.address, ',', absl::SkipWhitespace())) {
    coordinators.stubs.push_back(
        shoal::v1::Coordinator::NewStub(shoal::MakeChannel(std::string(a))));
  }
  if (coordinators.stubs.empty()) {
    std::cerr << "shoalctl: --coordinator names no address\n";
    return 2;
  }
  if (command[0] == "status") return Status(&coordinators, *inv);
  if (command[0] == "watch") return Watch(&coordinators, *inv, shoal::RealClock::Get());
  if (command[0] == "config") return Config(&coordinators, *inv);
  if (command[0] == "explain") return Explain(&coordinators, *inv);
  if (command[0] == "doctor") return Doctor(&coordinators, *inv);
  std::cerr << "shoalctl: command '" << inv->CommandName() << "' has no runner\n";
  return 2;
}
