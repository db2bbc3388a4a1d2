#include "common/run_config.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/run_options.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"

namespace shoal {
namespace {

using shoal::v1::RunConfig;

absl::Status Refuse(absl::string_view message) { return absl::InvalidArgumentError(message); }

std::string Json(const google::protobuf::Message& m, bool pretty) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = pretty;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(m, &out, options);
  if (!pretty) return out;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

bool IsGossip(const RunConfig& config) { return config.has_gossip(); }

const char* ModeName(const RunConfig& config) { return IsGossip(config) ? "gossip" : "sync"; }

void NormalizeRunConfig(RunConfig* c) {
  if (c->mode_case() == RunConfig::MODE_NOT_SET) c->mutable_sync();
  if (c->training().data_shards() == 0 && c->has_sync()) {
    c->mutable_training()->set_data_shards(c->sync().min_participants());
  }
  if (c->trust().audit_rate() > 0 && c->has_sync()) {
    // A replay needs the participant's samples named (docs/SECURITY.md
    // "Audits, scores and bans").
    shoal::v1::TrustConfig* t = c->mutable_trust();
    c->mutable_training()->set_sample_ledger(true);
    if (t->audit_threads() == 0) t->set_audit_threads(1);
    if (t->ban_below() == 0) t->set_ban_below(0.5);
  }
  if (c->trust().ban_below() > 0 && c->trust().ban_seconds() == 0) {
    c->mutable_trust()->set_ban_seconds(3600);
  }
  if (c->training().sample_ledger() && c->has_sync()) {
    // A late update folded into a later round would train its samples
    // outside the ledger: they go back to the pool instead.
    c->mutable_sync()->set_fold_late_work(false);
  }
  if (c->exchange().fragments() > 1 && c->has_sync()) {
    // A round averages its fragment only: late work of round N (fragment
    // N mod K) folded into round N + 1 would land in another fragment's
    // round. It is dropped; the local model keeps the worker's progress on
    // the other fragments.
    c->mutable_sync()->set_fold_late_work(false);
  }
  if (c->has_gossip()) {
    shoal::v1::GossipMode* g = c->mutable_gossip();
    g->set_every(std::max<uint32_t>(1, g->every()));
    g->set_timeout_ms(std::max<uint32_t>(1, g->timeout_ms()));
    g->set_final_average(g->final_average() && g->steps() > 0);
  }
}

namespace {

// What the rules look at: the config and its strings, parsed once. A rule
// that needs a parsed value comes after the rule that refuses the string,
// so it only runs when the string parsed.
struct Checked {
  explicit Checked(const RunConfig& config)
      : c(config),
        gossip(IsGossip(config)),
        name(config.model().name()),
        split(ParseDataSplit(config.training().data_split())),
        codec(ParseCodecSpec(config.exchange().codec())),
        outer(ParseOuterOptimizer(config.exchange().outer_optimizer().kind())),
        aggregation(ParseAggregation(config.exchange().aggregation())),
        overlap_start(ParseOverlapStart(config.exchange().overlap_start())) {}
  const RunConfig& c;
  const bool gossip;
  const std::string& name;
  const absl::StatusOr<DataSplit> split;
  const absl::StatusOr<CodecSpec> codec;
  const absl::StatusOr<OuterOptimizer> outer;
  const absl::StatusOr<AggregationSpec> aggregation;
  const absl::StatusOr<OverlapStart> overlap_start;
  bool fragments() const { return c.exchange().fragments() > 1; }
};

using Kind = RunConfigRuleDoc::Kind;

// A refusal: its docs and its check (the message when `k` breaks it).
struct Rule {
  Kind kind;
  const char* refused;
  const char* why;
  std::string (*check)(const Checked& k);
};

// "key (--flag): <what the parser said>", or "" when it parsed.
template <typename T>
std::string ParseError(absl::string_view key, const absl::StatusOr<T>& parsed) {
  return parsed.ok() ? "" : absl::StrCat(key, ": ", parsed.status().message());
}

std::string If(bool refused, absl::string_view message) {
  return refused ? std::string(message) : "";
}

bool Finite(double v) { return std::isfinite(v); }

// Every refusal, in the order the validator checks them: single keys group
// by group, then the combinations that have no meaning.
const Rule kRules[] = {
    // ---- model
    {Kind::kKey, "`model.name` other than mlp, cnn, torchscript, module", "",
     [](const Checked& k) {
       return If(
           k.name != "mlp" && k.name != "cnn" && k.name != "torchscript" && k.name != "module",
           absl::StrCat("model.name (--model) must be mlp, cnn, torchscript or module, got '",
                        k.name, "'"));
     }},
    {Kind::kKey, "a TorchScript model without its file", "",
     [](const Checked& k) {
       return If(k.name == "torchscript" && k.c.model().file_sha256().empty(),
                 "model.name torchscript needs its file: model.file (--model=torchscript:PATH)");
     }},
    {Kind::kKey, "`model.file`, `file_sha256`, `file_bytes` or `input_shape` for another model", "",
     [](const Checked& k) {
       const shoal::v1::ModelConfig& m = k.c.model();
       return If(k.name != "torchscript" && (!m.file().empty() || !m.file_sha256().empty() ||
                                             m.file_bytes() != 0 || m.input_shape_size() != 0),
                 absl::StrCat("model.file, model.file_sha256, model.file_bytes and "
                              "model.input_shape are for model.name torchscript only, not '",
                              k.name, "'"));
     }},
    {Kind::kKey, "`model.input_shape` that is not 3 numbers in [1, 65536]", "",
     [](const Checked& k) {
       if (k.name == "torchscript" && k.c.model().input_shape_size() != 3) {
         return std::string(
             "model.input_shape (--input_shape) must have 3 numbers (channels, height, width)");
       }
       for (uint32_t d : k.c.model().input_shape()) {
         if (d < 1 || d > kMaxInputDim) {
           return absl::StrCat("model.input_shape (--input_shape) values must be in [1, ",
                               kMaxInputDim, "], got ", d);
         }
       }
       return std::string();
     }},
    // ---- training
    {Kind::kKey, "`training.optimizer` other than sgd, adam, adamw", "",
     [](const Checked& k) {
       const std::string& o = k.c.training().optimizer();
       return If(!o.empty() && o != "sgd" && o != "adam" && o != "adamw",
                 absl::StrCat("training.optimizer (--optimizer) must be sgd, adam or adamw, got '",
                              o, "'"));
     }},
    {Kind::kKey, "`training.learning_rate` <= 0", "",
     [](const Checked& k) {
       const double lr = k.c.training().learning_rate();
       return If(!(lr > 0) || !Finite(lr),
                 "training.learning_rate (--learning_rate) must be a number > 0");
     }},
    {Kind::kKey, "`training.momentum` outside [0, 1)", "",
     [](const Checked& k) {
       const double m = k.c.training().momentum();
       return If(!(m >= 0 && m < 1), "training.momentum (--momentum) must be in [0, 1)");
     }},
    {Kind::kKey, "`training.batch_size` of 0", "",
     [](const Checked& k) {
       return If(k.c.training().batch_size() == 0,
                 "training.batch_size (--batch_size) must be > 0");
     }},
    {Kind::kKey, "`training.local_steps` of 0", "",
     [](const Checked& k) {
       return If(k.c.training().local_steps() == 0,
                 "training.local_steps (--local_steps) must be > 0");
     }},
    {Kind::kKey, "`training.eval_every` of 0", "",
     [](const Checked& k) {
       return If(k.c.training().eval_every() == 0,
                 "training.eval_every (--eval_every) must be > 0");
     }},
    {Kind::kKey, "a `training.data_split` other than iid or label_skew:ALPHA", "",
     [](const Checked& k) { return ParseError("training.data_split (--data_split)", k.split); }},
    {Kind::kKey, "`sync.min_participants` of 0", "",
     [](const Checked& k) {
       return If(!k.gossip && k.c.sync().min_participants() == 0,
                 "sync.min_participants (--min_participants) must be > 0");
     }},
    {Kind::kCombination, "`training.sample_ledger` with gossip",
     "the ledger names the samples of a round; gossip has no rounds",
     [](const Checked& k) {
       return If(k.c.training().sample_ledger() && k.gossip,
                 "training.sample_ledger (--sample_ledger) needs synchronous rounds");
     }},
    {Kind::kCombination, "`training.sample_ledger` with `training.data_split` label_skew",
     "the ledger draws every round's samples from the whole training set",
     [](const Checked& k) {
       return If(k.c.training().sample_ledger() && k.split->label_skew,
                 "training.sample_ledger (--sample_ledger) needs training.data_split "
                 "(--data_split) iid: the ledger draws every round's samples from the whole "
                 "training set");
     }},
    {Kind::kCombination, "`training.epochs` > 0 without `training.sample_ledger`",
     "epochs are counted by the ledger",
     [](const Checked& k) {
       return If(!k.c.training().sample_ledger() && k.c.training().epochs() > 0,
                 "training.epochs (--epochs) needs training.sample_ledger (--sample_ledger)");
     }},
    // ---- trust
    {Kind::kKey, "`trust.audit_rate` outside [0, 1]", "",
     [](const Checked& k) {
       const double r = k.c.trust().audit_rate();
       return If(!(r >= 0 && r <= 1), "trust.audit_rate (--audit_rate) must be in [0, 1]");
     }},
    {Kind::kCombination, "audits (`trust.audit_rate` > 0) with gossip",
     "a replay starts from the round's common base model, which gossip has not",
     [](const Checked& k) {
       return If(k.c.trust().audit_rate() > 0 && k.gossip,
                 "trust.audit_rate (--audit_rate) needs synchronous rounds: a replay starts from "
                 "the round's common base model, which gossip has not");
     }},
    {Kind::kKey, "`trust.audit_threads` > 256", "",
     [](const Checked& k) {
       return If(k.c.trust().audit_threads() > 256,
                 "trust.audit_threads (--audit_threads) must be at most 256");
     }},
    {Kind::kKey, "`trust.ban_below` outside [0, 1]", "",
     [](const Checked& k) {
       const double b = k.c.trust().ban_below();
       return If(!(b >= 0 && b <= 1), "trust.ban_below (--ban_below) must be in [0, 1]");
     }},
    // After min_participants: it is data_shards' default.
    {Kind::kKey, "`training.data_shards` of 0", "",
     [](const Checked& k) {
       return If(k.c.training().data_shards() == 0,
                 "training.data_shards (--data_shards) must be > 0");
     }},
    {Kind::kKey, "`sync.max_staleness` > 1000", "",
     [](const Checked& k) {
       return If(!k.gossip && k.c.sync().max_staleness() > kMaxStalenessLimit,
                 absl::StrCat("sync.max_staleness (--max_staleness) must be at most ",
                              kMaxStalenessLimit));
     }},
    // ---- gossip
    {Kind::kKey, "`gossip.fetch_probability` outside [0, 1]", "",
     [](const Checked& k) {
       const double p = k.c.gossip().fetch_probability();
       return If(k.gossip && !(p >= 0 && p <= 1),
                 absl::StrCat("gossip.fetch_probability (--fetch_probability) must be in [0, 1], "
                              "got ",
                              p));
     }},
    {Kind::kKey, "a `gossip.interpolation` other than constant:A, clock, loss", "",
     [](const Checked& k) {
       if (!k.gossip) return std::string();
       return ParseError("gossip.interpolation (--interpolation)",
                         ParseInterpolationSpec(k.c.gossip().interpolation()));
     }},
    {Kind::kKey, "a negative `gossip.divergence_threshold`", "",
     [](const Checked& k) {
       const double t = k.c.gossip().divergence_threshold();
       return If(k.gossip && (!(t >= 0) || !Finite(t)),
                 "gossip.divergence_threshold (--divergence_threshold) must be >= 0 (0 turns it "
                 "off)");
     }},
    // ---- exchange
    {Kind::kKey, "an unknown `exchange.codec`", "",
     [](const Checked& k) { return ParseError("exchange.codec (--codec)", k.codec); }},
    {Kind::kKey, "an unknown `exchange.outer_optimizer.kind`", "",
     [](const Checked& k) {
       return ParseError("exchange.outer_optimizer.kind (--outer_optimizer)", k.outer);
     }},
    {Kind::kKey, "`exchange.outer_optimizer.lr` outside (0, 10] (unless `none`)", "",
     [](const Checked& k) {
       const double lr = k.c.exchange().outer_optimizer().lr();
       return If(*k.outer != OuterOptimizer::kNone && !(lr > 0 && lr <= 10),
                 "exchange.outer_optimizer.lr (--outer_lr) must be in (0, 10]");
     }},
    {Kind::kKey, "`exchange.outer_optimizer.momentum` outside [0, 1)", "",
     [](const Checked& k) {
       const double m = k.c.exchange().outer_optimizer().momentum();
       return If(!(m >= 0 && m < 1),
                 "exchange.outer_optimizer.momentum (--outer_momentum) must be in [0, 1)");
     }},
    {Kind::kKey, "an unknown `exchange.aggregation`", "",
     [](const Checked& k) {
       return ParseError("exchange.aggregation (--aggregation)", k.aggregation);
     }},
    {Kind::kKey, "`exchange.fragments` > 4096", "",
     [](const Checked& k) {
       return If(k.c.exchange().fragments() > kMaxFragments,
                 absl::StrCat("exchange.fragments (--fragments) must be at most ", kMaxFragments,
                              ", is ", k.c.exchange().fragments()));
     }},
    {Kind::kKey, "an `exchange.overlap_start` other than contribution, extrapolate[:B]", "",
     [](const Checked& k) {
       return ParseError("exchange.overlap_start (--overlap_start)", k.overlap_start);
     }},
    {Kind::kKey, "an `exchange.slice_sizing` other than equal, bandwidth", "",
     [](const Checked& k) {
       const std::string& v = k.c.exchange().slice_sizing();
       return If(!v.empty() && v != "equal" && v != "bandwidth",
                 absl::StrCat("exchange.slice_sizing (--slice_sizing) must be equal or "
                              "bandwidth, is '",
                              v, "'"));
     }},
    // ---- timeouts
    {Kind::kKey, "a zero `timeouts.heartbeat_interval_ms`", "",
     [](const Checked& k) {
       return If(k.c.timeouts().heartbeat_interval_ms() == 0,
                 "timeouts.heartbeat_interval_ms (--heartbeat_interval) must be > 0");
     }},
    {Kind::kKey, "a `timeouts.heartbeat_lease_ms` not longer than the heartbeat interval", "",
     [](const Checked& k) {
       return If(k.c.timeouts().heartbeat_lease_ms() <= k.c.timeouts().heartbeat_interval_ms(),
                 "timeouts.heartbeat_lease_ms (--heartbeat_lease) must be longer than "
                 "timeouts.heartbeat_interval_ms (--heartbeat_interval)");
     }},
    {Kind::kKey, "a zero `timeouts.round_timeout_ms`", "",
     [](const Checked& k) {
       return If(k.c.timeouts().round_timeout_ms() == 0,
                 "timeouts.round_timeout_ms (--round_timeout) must be > 0");
     }},
    {Kind::kKey, "a zero `timeouts.connection_timeout_ms`", "",
     [](const Checked& k) {
       return If(k.c.timeouts().connection_timeout_ms() == 0,
                 "timeouts.connection_timeout_ms (--connection_timeout) must be > 0");
     }},
    {Kind::kKey, "a zero `timeouts.checkpoint_timeout_ms`", "",
     [](const Checked& k) {
       return If(k.c.timeouts().checkpoint_timeout_ms() == 0,
                 "timeouts.checkpoint_timeout_ms (--checkpoint_timeout) must be > 0");
     }},
    {Kind::kKey, "an adaptive deadline `factor` below 1", "",
     [](const Checked& k) {
       const shoal::v1::AdaptiveDeadlineConfig& a = k.c.timeouts().adaptive_deadline();
       return If(a.enabled() && (!(a.factor() >= 1) || !Finite(a.factor())),
                 "timeouts.adaptive_deadline.factor (--deadline_factor) must be a number >= 1");
     }},
    {Kind::kKey, "an election `switch_factor` <= 1", "",
     [](const Checked& k) {
       const double f = k.c.timeouts().election().switch_factor();
       return If(!(f > 1) || !Finite(f),
                 "timeouts.election.switch_factor (--supernode_switch_factor) must be a number "
                 "> 1");
     }},
    {Kind::kKey, "an election `switch_rounds` of 0", "",
     [](const Checked& k) {
       return If(k.c.timeouts().election().switch_rounds() < 1,
                 "timeouts.election.switch_rounds (--supernode_switch_rounds) must be at least 1");
     }},
    // ---- checkpoints
    {Kind::kKey, "`checkpoints.checkpointers` of 0", "",
     [](const Checked& k) {
       return If(k.c.checkpoints().checkpointers() < 1,
                 "checkpoints.checkpointers (--checkpointers) must be at least 1");
     }},
    // ---- Combinations the run refuses, only where they have no meaning:
    // every codec, outer optimizer, aggregation rule and topology of the
    // synchronous mode compose (one averaging pipeline:
    // services/worker/exchanger.h), and gossip pulls travel in any codec.
    {Kind::kCombination, "`trimmed_mean:K` with `sync.min_participants` < 2K + 1",
     "a round of the minimum size could not trim",
     [](const Checked& k) {
       const uint32_t min = k.c.sync().min_participants();
       const uint32_t needed = MinContributions(*k.aggregation);
       return If(!k.gossip && needed > min,
                 absl::StrCat("exchange.aggregation (--aggregation) ", k.c.exchange().aggregation(),
                              " drops ", k.aggregation->trim,
                              " values at each end, so it needs at least ", needed,
                              " participants per round; sync.min_participants "
                              "(--min_participants) is ",
                              min));
     }},
    {Kind::kCombination, "gossip with `topology.hierarchy`", "gossip has no rounds",
     [](const Checked& k) {
       return If(k.gossip && k.c.topology().hierarchy(),
                 "topology.hierarchy (--hierarchy=on) shapes the rounds of sync mode; gossip "
                 "(--mode=gossip) has no rounds");
     }},
    {Kind::kCombination, "gossip with an outer optimizer",
     "the outer step starts from a round's agreed base; gossip has neither",
     [](const Checked& k) {
       return If(k.gossip && *k.outer != OuterOptimizer::kNone,
                 "exchange.outer_optimizer (--outer_optimizer) steps from a round's agreed base; "
                 "gossip (--mode=gossip) has no rounds and no agreed base: use none");
     }},
    {Kind::kCombination, "`exchange.overlap` with gossip",
     "gossip has no rounds (and already trains while it fetches)",
     [](const Checked& k) {
       return If(k.gossip && k.c.exchange().overlap(),
                 "exchange.overlap (--overlap=on) overlaps a round's training with the last "
                 "round's averaging; gossip (--mode=gossip) has no rounds");
     }},
    {Kind::kCombination,
     "`exchange.overlap_start` other than `contribution` without "
     "`exchange.overlap`",
     "no steps train ahead",
     [](const Checked& k) {
       return If(!k.c.exchange().overlap() && k.overlap_start->extrapolate > 0,
                 "exchange.overlap_start (--overlap_start) places the steps trained ahead of "
                 "their round; without exchange.overlap (--overlap=on) none are");
     }},
    {Kind::kCombination, "`exchange.overlap_stale_steps` > 0 without `exchange.overlap`",
     "no steps train ahead",
     [](const Checked& k) {
       return If(!k.c.exchange().overlap() && k.c.exchange().overlap_stale_steps() > 0,
                 "exchange.overlap_stale_steps (--overlap_stale_steps) says when the steps "
                 "trained ahead take the last round's average; without exchange.overlap "
                 "(--overlap=on) none are");
     }},
    {Kind::kCombination, "`exchange.overlap` with `training.sample_ledger` (or audits)",
     "the ledger names a round's samples at its start, after the steps ahead trained",
     [](const Checked& k) {
       return If(k.c.exchange().overlap() && k.c.training().sample_ledger(),
                 "exchange.overlap (--overlap=on) trains round N+1 before the coordinator names "
                 "its samples; training.sample_ledger (--sample_ledger, and --audit_rate, which "
                 "needs it) names them at the round's start");
     }},
    {Kind::kCombination, "`exchange.fragments` > 1 with gossip", "gossip has no rounds",
     [](const Checked& k) {
       return If(k.gossip && k.fragments(),
                 "exchange.fragments (--fragments) syncs one fragment per round; gossip "
                 "(--mode=gossip) has no rounds");
     }},
    {Kind::kCombination, "`exchange.fragments` > 1 with audits (`trust.audit_rate` > 0)",
     "a contribution carries progress kept on the worker since its fragment's last round; a "
     "replay starts from the agreed model",
     [](const Checked& k) {
       return If(k.fragments() && k.c.trust().audit_rate() > 0,
                 "exchange.fragments (--fragments) makes a contribution of progress kept on the "
                 "worker since its fragment's last round; an audit (trust.audit_rate, "
                 "--audit_rate) replays a round from the agreed model alone");
     }},
    {Kind::kCombination, "gossip with a robust aggregation", "gossip has no slice owners",
     [](const Checked& k) {
       return If(k.gossip && k.aggregation->kind != AggregationSpec::Kind::kMean,
                 "exchange.aggregation (--aggregation) shapes the synchronous exchange's slice "
                 "owners; gossip (--mode=gossip) has none: use mean");
     }},
    {Kind::kCombination, "gossip with bandwidth-proportional slices",
     "gossip has no slice owners",
     [](const Checked& k) {
       return If(k.gossip && k.c.exchange().slice_sizing() == "bandwidth",
                 "exchange.slice_sizing (--slice_sizing) bandwidth sizes the synchronous "
                 "exchange's slices; gossip (--mode=gossip) has none: use equal");
     }},
};

}  // namespace

std::vector<RunConfigRuleDoc> RunConfigRuleDocs() {
  std::vector<RunConfigRuleDoc> docs;
  for (const Rule& rule : kRules) docs.push_back({rule.kind, rule.refused, rule.why});
  return docs;
}

absl::Status ValidateRunConfig(const RunConfig& c) {
  const Checked checked(c);
  for (const Rule& rule : kRules) {
    if (std::string refused = rule.check(checked); !refused.empty()) return Refuse(refused);
  }
  return absl::OkStatus();
}

std::string RunConfigJson(const RunConfig& config) { return Json(config, /*pretty=*/true); }

std::vector<std::string> RunConfigLines(const RunConfig& c) {
  // Every group of the descriptor in its order; of the mode's, the run's.
  std::vector<std::string> lines;
  const google::protobuf::Descriptor* d = c.GetDescriptor();
  const google::protobuf::Reflection* r = c.GetReflection();
  const google::protobuf::OneofDescriptor* mode = d->FindOneofByName("mode");
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* group = d->field(i);
    if (group->containing_oneof() == mode && group->name() != ModeName(c)) continue;
    lines.push_back(absl::StrCat(group->name(), ": ", Json(r->GetMessage(c, group), false)));
  }
  return lines;
}

}  // namespace shoal
