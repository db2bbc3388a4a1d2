#include "tools/shoalctl/checkpoints_cmd.h"

#include <unistd.h>

#include <iostream>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/printable.h"
#include "common/progress.h"
#include "tools/shoalctl/export_torch.h"
#include "tools/shoalctl/status_format.h"
#include "tools/shoalctl/terminal_text.h"
#include "tools/shoalctl/yaml_output.h"

namespace shoal::ctl {

using shoal::checkpoint::CheckpointClient;
using shoal::v1::CheckpointInfo;
using shoal::v1::Manifest;

namespace {

std::string Created(int64_t unix_ms) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixMillis(unix_ms),
                          absl::UTCTimeZone());
}

std::string Shape(const shoal::v1::LayerEntry& l) {
  return absl::StrCat("[", absl::StrJoin(l.shape(), ", "), "]");
}

// The damage note of checkpoint `id` (List knows it, GetManifest does not).
std::string DamageOf(CheckpointClient* client, const Manifest& m) {
  auto list = client->List(m.run_id());
  if (!list.ok()) return "";
  for (const auto& info : *list) {
    if (info.id() == m.id()) return info.damage();
  }
  return "";
}

int Fail(std::ostream& err, const absl::Status& s) {
  err << "shoalctl checkpoints: " << TerminalText(s.ToString()) << "\n";
  return 1;
}

int Usage(std::ostream& err, const absl::Status& s, absl::string_view command) {
  err << "shoalctl: " << TerminalText(s.message()) << "\nRun 'shoalctl help " << command
      << "' for its usage.\n";
  return 2;
}

// YAML from the JSON form; on a table/wide request the table. What a store
// holds came from workers: escaped for the terminal (terminal_text.h).
std::string Render(OutputFormat format, const std::string& json, const std::string& table) {
  if (format == OutputFormat::kJson) return DocumentText(json);
  if (format == OutputFormat::kYaml) {
    absl::StatusOr<std::string> yaml = JsonToYaml(json);
    return DocumentText(yaml.ok() ? *yaml : json);
  }
  return TerminalText(table);
}

int Export(CheckpointClient* client, const std::string& id, const std::string& path,
           std::ostream& out, std::ostream& err) {
  absl::StatusOr<Manifest> m = client->GetManifest(id);
  if (!m.ok()) return Fail(err, m.status());
  // The model alone: the outer optimizer's state layers stay in the store.
  const int model_layers = shoal::checkpoint::ModelLayerCount(*m);
  std::vector<std::vector<uint8_t>> buffers(model_layers);
  std::vector<ExportTensor> tensors;
  uint64_t total = 0;
  uint64_t all = 0;
  for (int i = 0; i < model_layers; ++i) all += m->layers(i).bytes();
  // Progress on stderr: redrawn in place on a terminal, a line per layer
  // otherwise (a log, a pipe).
  ProgressLine progress(
      &err,
      &err == &std::cerr ? ProgressLine::StyleFor(STDERR_FILENO) : ProgressLine::Style::kLines,
      absl::StrCat("export ", EscapeUnprintable(id)), all);
  for (int i = 0; i < model_layers; ++i) {
    absl::Status s = shoal::checkpoint::ReadWholeLayer(
        client, id, *m, static_cast<uint32_t>(i), &buffers[i],
        [&](uint64_t layer_bytes) { progress.Update(total + layer_bytes); });
    if (!s.ok()) {
      progress.Finish(total);
      return Fail(err, s);
    }
    progress.Step(total + m->layers(i).bytes(),
                  absl::StrCat("layer '", EscapeUnprintable(m->layers(i).name()), "'"));
    const auto& l = m->layers(i);
    tensors.push_back(ExportTensor{l.name(),
                                   l.dtype(),
                                   {l.shape().begin(), l.shape().end()},
                                   buffers[i].data(),
                                   buffers[i].size()});
    total += l.bytes();
  }
  progress.Finish(total);
  if (absl::Status s = WriteTorchFile(path, tensors); !s.ok()) return Fail(err, s);
  out << "exported " << id << ": " << tensors.size() << " layers, " << FormatBytes(total) << " to "
      << path << "\n";
  return 0;
}

}  // namespace

std::string FormatCheckpointTable(const std::vector<CheckpointInfo>& checkpoints) {
  if (checkpoints.empty()) return "no checkpoints\n";
  size_t id_w = 2, run_w = 3;
  for (const auto& c : checkpoints) {
    id_w = std::max(id_w, c.id().size());
    run_w = std::max(run_w, c.run_id().size());
  }
  std::string out = absl::StrFormat("%-*s  %-*s  %6s  %-24s  %6s  %10s  %s\n", id_w, "ID", run_w,
                                    "RUN", "ROUND", "CREATED", "LAYERS", "SIZE", "STATUS");
  for (const auto& c : checkpoints) {
    absl::StrAppendFormat(&out, "%-*s  %-*s  %6d  %-24s  %6d  %10s  %s\n", id_w, c.id(), run_w,
                          c.run_id(), c.round(), Created(c.created_unix_ms()), c.layers(),
                          FormatBytes(c.bytes()),
                          c.damage().empty() ? std::string("ok") : "DAMAGED: " + c.damage());
  }
  return out;
}

std::string FormatCheckpointsJson(const std::vector<CheckpointInfo>& checkpoints) {
  std::string out = "[";
  for (size_t i = 0; i < checkpoints.size(); ++i) {
    const CheckpointInfo& c = checkpoints[i];
    absl::StrAppend(&out, i == 0 ? "\n" : ",\n", "  {\"id\": ", JsonQuote(c.id()),
                    ", \"run_id\": ", JsonQuote(c.run_id()), ", \"round\": ", c.round(),
                    ", \"created\": ", JsonQuote(Created(c.created_unix_ms())),
                    ", \"created_unix_ms\": ", c.created_unix_ms(), ", \"bytes\": ", c.bytes(),
                    ", \"layers\": ", c.layers(), ", \"damage\": ", JsonQuote(c.damage()), "}");
  }
  absl::StrAppend(&out, checkpoints.empty() ? "]\n" : "\n]\n");
  return out;
}

std::string FormatManifest(const Manifest& m, const std::string& damage) {
  uint64_t total = 0;
  for (const auto& l : m.layers()) total += l.bytes();
  std::string out;
  absl::StrAppend(&out, "checkpoint  ", m.id(), "\n");
  absl::StrAppend(&out, "run         ", m.run_id(), "\n");
  if (m.gossip()) {
    // A gossip run has no rounds: the sequence number, and whose model it is.
    absl::StrAppend(&out, "sequence    ", m.round(), " (gossip)\n");
    absl::StrAppendFormat(&out, "gossip      worker %s, clock %.0f, %d steps\n", m.worker_id(),
                          m.gossip_clock(), m.gossip_steps());
  } else {
    absl::StrAppend(&out, "round       ", m.round(), "\n");
    absl::StrAppend(&out, "epoch       ", m.epoch(), "\n");
  }
  absl::StrAppend(&out, "model       ", m.model().empty() ? "-" : m.model(), "\n");
  absl::StrAppend(&out, "model hash  ", m.model_sha256().empty() ? "-" : m.model_sha256(), "\n");
  absl::StrAppend(&out, "created     ", Created(m.created_unix_ms()), "\n");
  absl::StrAppend(&out, "size        ", FormatBytes(total), " (", total, " bytes) in ",
                  m.layers_size(), " layers\n");
  absl::StrAppend(&out, "status      ", damage.empty() ? "ok" : "DAMAGED: " + damage, "\n");
  size_t name_w = 4, shape_w = 5;
  for (const auto& l : m.layers()) {
    name_w = std::max(name_w, l.name().size());
    shape_w = std::max(shape_w, Shape(l).size());
  }
  absl::StrAppendFormat(&out, "\n%3s  %-*s  %-7s  %-*s  %12s  %s\n", "#", name_w, "NAME", "DTYPE",
                        shape_w, "SHAPE", "BYTES", "SHA256");
  for (int i = 0; i < m.layers_size(); ++i) {
    const auto& l = m.layers(i);
    absl::StrAppendFormat(&out, "%3d  %-*s  %-7s  %-*s  %12d  %s%s\n", i, name_w, l.name(),
                          l.dtype(), shape_w, Shape(l), l.bytes(), l.sha256(),
                          l.optimizer_state() ? "  (optimizer state, not exported)" : "");
  }
  return out;
}

std::string FormatManifestJson(const Manifest& m, const std::string& damage) {
  uint64_t total = 0;
  for (const auto& l : m.layers()) total += l.bytes();
  std::string out =
      absl::StrCat("{\n  \"id\": ", JsonQuote(m.id()), ",\n  \"run_id\": ", JsonQuote(m.run_id()),
                   ",\n  \"round\": ", m.round(), ",\n  \"epoch\": ", m.epoch(),
                   ",\n  \"model\": ", JsonQuote(m.model()),
                   ",\n  \"model_sha256\": ", JsonQuote(m.model_sha256()),
                   ",\n  \"created\": ", JsonQuote(Created(m.created_unix_ms())),
                   ",\n  \"created_unix_ms\": ", m.created_unix_ms(), ",\n  \"bytes\": ", total,
                   ",\n  \"damage\": ", JsonQuote(damage), ",\n  \"layers\": [");
  if (m.gossip()) {
    // Inserted before the layers so that the layers stay the last member.
    const size_t at = out.rfind(",\n  \"layers\": [");
    out.insert(at, absl::StrCat(",\n  \"gossip\": true, \"worker_id\": ", JsonQuote(m.worker_id()),
                                ", \"gossip_clock\": ", m.gossip_clock(),
                                ", \"gossip_steps\": ", m.gossip_steps()));
  }
  for (int i = 0; i < m.layers_size(); ++i) {
    const auto& l = m.layers(i);
    absl::StrAppend(&out, i == 0 ? "\n" : ",\n", "    {\"name\": ", JsonQuote(l.name()),
                    ", \"dtype\": ", JsonQuote(l.dtype()), ", \"shape\": [",
                    absl::StrJoin(l.shape(), ", "), "], \"bytes\": ", l.bytes(),
                    ", \"sha256\": ", JsonQuote(l.sha256()),
                    l.optimizer_state() ? ", \"optimizer_state\": true}" : "}");
  }
  absl::StrAppend(&out, m.layers().empty() ? "]\n}\n" : "\n  ]\n}\n");
  return out;
}

int RunCheckpointsCommand(const Invocation& inv, const CheckpointClientFactory& make_client,
                          std::ostream& out, std::ostream& err) {
  const std::string name = inv.CommandName();
  if (absl::Status s = CheckOutput(inv); !s.ok()) return Usage(err, s, name);
  absl::StatusOr<absl::Duration> timeout = DurationFlag(inv, "rpc_timeout", absl::Seconds(10));
  if (!timeout.ok()) return Usage(err, timeout.status(), name);
  const std::string command = inv.command.size() > 1 ? inv.command[1] : "";
  std::string id = inv.Get("id");
  if (!inv.operands.empty()) {
    if (!id.empty() && id != inv.operands[0]) {
      return Usage(err,
                   absl::InvalidArgumentError(absl::StrCat("two checkpoints given: --id=", id,
                                                           " and '", inv.operands[0], "'")),
                   name);
    }
    id = inv.operands[0];
  }
  if (command != "list" && id.empty()) {
    return Usage(
        err, absl::InvalidArgumentError(absl::StrCat(name, " needs a checkpoint: ID or --id=ID")),
        name);
  }
  const std::string path = inv.Get("out");
  if (command == "export" && path.empty()) {
    return Usage(err, absl::InvalidArgumentError("checkpoints export needs --out=FILE"), name);
  }
  std::unique_ptr<CheckpointClient> client = make_client(inv.Get("store"), *timeout);

  if (command == "list") {
    auto list = client->List(inv.Get("run_id"));
    if (!list.ok()) return Fail(err, list.status());
    std::vector<CheckpointInfo> shown;
    for (const CheckpointInfo& c : *list) shown.push_back(ForTerminal(c));
    out << Render(inv.output, FormatCheckpointsJson(*list), FormatCheckpointTable(shown));
    return 0;
  }
  if (command == "show") {
    auto m = client->GetManifest(id);
    if (!m.ok()) return Fail(err, m.status());
    const std::string damage = DamageOf(client.get(), *m);
    out << Render(inv.output, FormatManifestJson(*m, damage),
                  FormatManifest(ForTerminal(*m), EscapeUnprintable(damage)));
    return 0;
  }
  if (command == "export") return Export(client.get(), id, path, out, err);
  // delete
  if (absl::Status s = client->Delete(id); !s.ok()) return Fail(err, s);
  out << TerminalText(absl::StrCat("deleted ", id, "\n"));
  return 0;
}

int RunCheckpointsCommand(const std::vector<std::string>& args,
                          const CheckpointClientFactory& make_client, std::ostream& out,
                          std::ostream& err) {
  std::vector<std::string> line = {"checkpoints"};
  line.insert(line.end(), args.begin(), args.end());
  absl::StatusOr<Invocation> inv =
      ParseCommandLine(line, [](const std::string&) { return std::optional<std::string>(); });
  if (!inv.ok()) return Usage(err, inv.status(), "checkpoints");
  if (inv->help) {
    out << *HelpText(inv->command);
    return 0;
  }
  return RunCheckpointsCommand(*inv, make_client, out, err);
}

int RunCheckpointsCommand(const Invocation& inv) {
  return RunCheckpointsCommand(
      inv,
      [](const std::string& store, absl::Duration timeout) {
        shoal::checkpoint::CheckpointClientOptions options;
        options.call_timeout = timeout;
        return std::make_unique<shoal::checkpoint::GrpcCheckpointClient>(store, options);
      },
      std::cout, std::cerr);
}

}  // namespace shoal::ctl
