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
#include "common/auth.h"
#include "common/progress.h"
#include "common/tls.h"
#include "tools/shoalctl/export_torch.h"

namespace shoal::ctl {

using shoal::checkpoint::CheckpointClient;
using shoal::v1::CheckpointInfo;
using shoal::v1::Manifest;

const char kCheckpointsUsage[] =
    "shoalctl checkpoints: checkpoints of a shoal-checkpoint store.\n"
    "  shoalctl checkpoints list   --store=ADDR [--json] [--run_id=RUN]\n"
    "      newest first; --json prints an array of {id, run_id, round, created, bytes, ...}\n"
    "  shoalctl checkpoints show   --store=ADDR --id=ID [--json]\n"
    "      the manifest: run, round, model, layers (name, dtype, shape, bytes, sha256)\n"
    "  shoalctl checkpoints export --store=ADDR --id=ID --out=FILE\n"
    "      every layer, checked against its SHA-256, into FILE; in Python\n"
    "      torch.load(FILE) returns a dict name -> tensor\n"
    "  shoalctl checkpoints delete --store=ADDR --id=ID\n"
    "  Options: --store defaults to 127.0.0.1:50052; --timeout=10s is each call's deadline;\n"
    "  --tls_cert, --tls_key, --tls_ca, --tls_server_name as for the other commands;\n"
    "  --token_file=FILE: the run token (list, show, export) or the store's admin token "
    "(delete).";

namespace {

std::string Json(absl::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", c);
        } else {
          out += c;
        }
    }
  }
  out += "\"";
  return out;
}

std::string Created(int64_t unix_ms) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixMillis(unix_ms),
                          absl::UTCTimeZone());
}

std::string Shape(const shoal::v1::LayerEntry& l) {
  return absl::StrCat("[", absl::StrJoin(l.shape(), ", "), "]");
}

// `--key=value` options; `--key` alone is "true".
struct Options {
  std::string command;
  std::map<std::string, std::string> values;

  std::string Get(const std::string& key, const std::string& fallback = "") const {
    auto it = values.find(key);
    return it == values.end() ? fallback : it->second;
  }
};

absl::StatusOr<Options> Parse(const std::vector<std::string>& args) {
  static const std::set<std::string> kKnown = {
      "store",   "json",   "run_id",          "id",        "out", "timeout", "tls_cert",
      "tls_key", "tls_ca", "tls_server_name", "token_file"};
  Options o;
  for (const std::string& a : args) {
    if (!absl::StartsWith(a, "--")) {
      if (!o.command.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", a, "'"));
      }
      o.command = a;
      continue;
    }
    const size_t eq = a.find('=');
    const std::string key = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    if (kKnown.count(key) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("unknown option '--", key, "'"));
    }
    o.values[key] = eq == std::string::npos ? "true" : a.substr(eq + 1);
  }
  if (o.command.empty()) return absl::InvalidArgumentError("no command given");
  return o;
}

absl::StatusOr<bool> Bool(const Options& o, const std::string& key) {
  const std::string v = o.Get(key, "false");
  if (v == "true" || v == "1") return true;
  if (v == "false" || v == "0") return false;
  return absl::InvalidArgumentError(
      absl::StrCat("--", key, " must be true or false, got '", v, "'"));
}

absl::StatusOr<std::string> Required(const Options& o, const std::string& key) {
  const std::string v = o.Get(key);
  if (v.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(o.command, " needs --", key, "=..."));
  }
  return v;
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
  err << "shoalctl checkpoints: " << s << "\n";
  return 1;
}

int Usage(std::ostream& err, const absl::Status& s) {
  err << "shoalctl checkpoints: " << s.message() << "\n" << kCheckpointsUsage << "\n";
  return 2;
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
      absl::StrCat("export ", id), all);
  for (int i = 0; i < model_layers; ++i) {
    absl::Status s = shoal::checkpoint::ReadWholeLayer(
        client, id, *m, static_cast<uint32_t>(i), &buffers[i],
        [&](uint64_t layer_bytes) { progress.Update(total + layer_bytes); });
    if (!s.ok()) {
      progress.Finish(total);
      return Fail(err, s);
    }
    progress.Step(total + m->layers(i).bytes(), absl::StrCat("layer '", m->layers(i).name(), "'"));
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
    absl::StrAppend(&out, i == 0 ? "\n" : ",\n", "  {\"id\": ", Json(c.id()),
                    ", \"run_id\": ", Json(c.run_id()), ", \"round\": ", c.round(),
                    ", \"created\": ", Json(Created(c.created_unix_ms())),
                    ", \"created_unix_ms\": ", c.created_unix_ms(), ", \"bytes\": ", c.bytes(),
                    ", \"layers\": ", c.layers(), ", \"damage\": ", Json(c.damage()), "}");
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
  std::string out = absl::StrCat(
      "{\n  \"id\": ", Json(m.id()), ",\n  \"run_id\": ", Json(m.run_id()),
      ",\n  \"round\": ", m.round(), ",\n  \"epoch\": ", m.epoch(),
      ",\n  \"model\": ", Json(m.model()), ",\n  \"model_sha256\": ", Json(m.model_sha256()),
      ",\n  \"created\": ", Json(Created(m.created_unix_ms())),
      ",\n  \"created_unix_ms\": ", m.created_unix_ms(), ",\n  \"bytes\": ", total,
      ",\n  \"damage\": ", Json(damage), ",\n  \"layers\": [");
  if (m.gossip()) {
    // Inserted before the layers so that the layers stay the last member.
    const size_t at = out.rfind(",\n  \"layers\": [");
    out.insert(at, absl::StrCat(",\n  \"gossip\": true, \"worker_id\": ", Json(m.worker_id()),
                                ", \"gossip_clock\": ", m.gossip_clock(),
                                ", \"gossip_steps\": ", m.gossip_steps()));
  }
  for (int i = 0; i < m.layers_size(); ++i) {
    const auto& l = m.layers(i);
    absl::StrAppend(&out, i == 0 ? "\n" : ",\n", "    {\"name\": ", Json(l.name()),
                    ", \"dtype\": ", Json(l.dtype()), ", \"shape\": [",
                    absl::StrJoin(l.shape(), ", "), "], \"bytes\": ", l.bytes(),
                    ", \"sha256\": ", Json(l.sha256()),
                    l.optimizer_state() ? ", \"optimizer_state\": true}" : "}");
  }
  absl::StrAppend(&out, m.layers().empty() ? "]\n}\n" : "\n  ]\n}\n");
  return out;
}

int RunCheckpointsCommand(const std::vector<std::string>& args,
                          const CheckpointClientFactory& make_client, std::ostream& out,
                          std::ostream& err) {
  absl::StatusOr<Options> o = Parse(args);
  if (!o.ok()) return Usage(err, o.status());
  if (o->command == "help") {
    out << kCheckpointsUsage << "\n";
    return 0;
  }
  static const std::set<std::string> kCommands = {"list", "show", "export", "delete"};
  if (kCommands.count(o->command) == 0) {
    return Usage(err,
                 absl::InvalidArgumentError(absl::StrCat("unknown command '", o->command, "'")));
  }
  absl::StatusOr<bool> json = Bool(*o, "json");
  if (!json.ok()) return Usage(err, json.status());
  absl::Duration timeout = absl::Seconds(10);
  if (const std::string t = o->Get("timeout"); !t.empty() && !absl::ParseDuration(t, &timeout)) {
    return Usage(err, absl::InvalidArgumentError(absl::StrCat("bad --timeout '", t, "'")));
  }
  std::string id;
  if (o->command != "list") {
    absl::StatusOr<std::string> v = Required(*o, "id");
    if (!v.ok()) return Usage(err, v.status());
    id = *v;
  }
  std::string path;
  if (o->command == "export") {
    absl::StatusOr<std::string> v = Required(*o, "out");
    if (!v.ok()) return Usage(err, v.status());
    path = *v;
  }
  // The store's channel speaks TLS with these (common/tls.h), as --tls_* do
  // for the other commands.
  TlsFiles tls_files{o->Get("tls_cert"), o->Get("tls_key"), o->Get("tls_ca"),
                     o->Get("tls_server_name")};
  absl::StatusOr<TlsConfig> tls = LoadTls(tls_files);
  if (!tls.ok()) return Usage(err, tls.status());
  if (tls->enabled()) SetProcessTls(*std::move(tls));
  // The run token lists, shows and exports; `delete` needs the store's admin
  // token (common/auth.h).
  if (const std::string token_file = o->Get("token_file"); !token_file.empty()) {
    absl::StatusOr<std::string> token = ReadTokenFile(token_file);
    if (!token.ok()) return Usage(err, token.status());
    SetProcessToken(*std::move(token));
  }
  std::unique_ptr<CheckpointClient> client =
      make_client(o->Get("store", "127.0.0.1:50052"), timeout);

  if (o->command == "list") {
    auto list = client->List(o->Get("run_id"));
    if (!list.ok()) return Fail(err, list.status());
    out << (*json ? FormatCheckpointsJson(*list) : FormatCheckpointTable(*list));
    return 0;
  }
  if (o->command == "show") {
    auto m = client->GetManifest(id);
    if (!m.ok()) return Fail(err, m.status());
    const std::string damage = DamageOf(client.get(), *m);
    out << (*json ? FormatManifestJson(*m, damage) : FormatManifest(*m, damage));
    return 0;
  }
  if (o->command == "export") return Export(client.get(), id, path, out, err);
  // delete
  if (absl::Status s = client->Delete(id); !s.ok()) return Fail(err, s);
  out << "deleted " << id << "\n";
  return 0;
}

int RunCheckpointsCommand(const std::vector<std::string>& args) {
  return RunCheckpointsCommand(
      args,
      [](const std::string& store, absl::Duration timeout) {
        shoal::checkpoint::CheckpointClientOptions options;
        options.call_timeout = timeout;
        return std::make_unique<shoal::checkpoint::GrpcCheckpointClient>(store, options);
      },
      std::cout, std::cerr);
}

}  // namespace shoal::ctl
