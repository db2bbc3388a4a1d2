#include "common/run_config.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/run_options.h"
#include "google/protobuf/util/json_util.h"

namespace shoal {
namespace {

using shoal::v1::RunConfig;

absl::Status Refuse(absl::string_view message) { return absl::InvalidArgumentError(message); }

// "key (--flag): <what the parser said>".
absl::Status Unparsed(absl::string_view key, const absl::Status& parsed) {
  return absl::InvalidArgumentError(absl::StrCat(key, ": ", parsed.message()));
}

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

absl::Status ValidateRunConfig(const RunConfig& c) {
  // ---- Single keys, group by group.
  const shoal::v1::ModelConfig& model = c.model();
  const std::string& name = model.name();
  if (name != "mlp" && name != "cnn" && name != "torchscript" && name != "module") {
    return Refuse(absl::StrCat(
        "model.name (--model) must be mlp, cnn, torchscript or module, got '", name, "'"));
  }
  const bool torchscript = name == "torchscript";
  if (torchscript && model.file_sha256().empty()) {
    return Refuse("model.name torchscript needs its file: model.file (--model=torchscript:PATH)");
  }
  if (!torchscript && (!model.file().empty() || !model.file_sha256().empty() ||
                       model.file_bytes() != 0 || model.input_shape_size() != 0)) {
    return Refuse(
        absl::StrCat("model.file, model.file_sha256, model.file_bytes and "
                     "model.input_shape are for model.name torchscript only, not '",
                     name, "'"));
  }
  if (torchscript && model.input_shape_size() != 3) {
    return Refuse(
        "model.input_shape (--input_shape) must have 3 numbers (channels, height, width)");
  }
  for (uint32_t d : model.input_shape()) {
    if (d < 1 || d > kMaxInputDim) {
      return Refuse(absl::StrCat("model.input_shape (--input_shape) values must be in [1, ",
                                 kMaxInputDim, "], got ", d));
    }
  }

  const shoal::v1::TrainingConfig& t = c.training();
  if (const std::string& o = t.optimizer();
      !o.empty() && o != "sgd" && o != "adam" && o != "adamw") {
    return Refuse(
        absl::StrCat("training.optimizer (--optimizer) must be sgd, adam or adamw, got '", o, "'"));
  }
  if (!(t.learning_rate() > 0) || !std::isfinite(t.learning_rate())) {
    return Refuse("training.learning_rate (--learning_rate) must be a number > 0");
  }
  if (!(t.momentum() >= 0 && t.momentum() < 1)) {
    return Refuse("training.momentum (--momentum) must be in [0, 1)");
  }
  if (t.batch_size() == 0) return Refuse("training.batch_size (--batch_size) must be > 0");
  if (t.local_steps() == 0) return Refuse("training.local_steps (--local_steps) must be > 0");
  if (t.eval_every() == 0) return Refuse("training.eval_every (--eval_every) must be > 0");
  if (absl::Status s = ParseDataSplit(t.data_split()).status(); !s.ok()) {
    return Unparsed("training.data_split (--data_split)", s);
  }

  const bool gossip = IsGossip(c);
  const shoal::v1::SyncMode& sync = c.sync();
  if (!gossip && sync.min_participants() == 0) {
    return Refuse("sync.min_participants (--min_participants) must be > 0");
  }
  if (t.sample_ledger()) {
    if (gossip) return Refuse("training.sample_ledger (--sample_ledger) needs synchronous rounds");
    absl::StatusOr<DataSplit> split = ParseDataSplit(t.data_split());
    if (split.ok() && split->label_skew) {
      return Refuse(
          "training.sample_ledger (--sample_ledger) needs training.data_split (--data_split) iid: "
          "the ledger draws every round's samples from the whole training set");
    }
    if (name == "module") {
      return Refuse(
          "training.sample_ledger (--sample_ledger) needs the built-in trainer: a Python "
          "training loop (model.name module) chooses its own samples");
    }
  } else if (t.epochs() > 0) {
    return Refuse("training.epochs (--epochs) needs training.sample_ledger (--sample_ledger)");
  }
  const shoal::v1::TrustConfig& trust = c.trust();
  if (!(trust.audit_rate() >= 0 && trust.audit_rate() <= 1)) {
    return Refuse("trust.audit_rate (--audit_rate) must be in [0, 1]");
  }
  if (trust.audit_rate() > 0) {
    if (gossip) {
      return Refuse(
          "trust.audit_rate (--audit_rate) needs synchronous rounds: a replay starts from the "
          "round's common base model, which gossip has not");
    }
    if (name == "module") {
      return Refuse(
          "trust.audit_rate (--audit_rate) needs the built-in trainer: a Python training loop "
          "(model.name module) cannot be replayed by another member");
    }
  }
  if (trust.audit_threads() > 256) {
    return Refuse("trust.audit_threads (--audit_threads) must be at most 256");
  }
  if (!(trust.ban_below() >= 0 && trust.ban_below() <= 1)) {
    return Refuse("trust.ban_below (--ban_below) must be in [0, 1]");
  }
  // After min_participants: it is data_shards' default.
  if (t.data_shards() == 0) return Refuse("training.data_shards (--data_shards) must be > 0");
  if (!gossip && sync.max_staleness() > kMaxStalenessLimit) {
    return Refuse(
        absl::StrCat("sync.max_staleness (--max_staleness) must be at most ", kMaxStalenessLimit));
  }

  const shoal::v1::GossipMode& g = c.gossip();
  if (gossip && !(g.fetch_probability() >= 0 && g.fetch_probability() <= 1)) {
    return Refuse(
        absl::StrCat("gossip.fetch_probability (--fetch_probability) must be in [0, 1], "
                     "got ",
                     g.fetch_probability()));
  }
  if (gossip) {
    if (absl::Status s = ParseInterpolationSpec(g.interpolation()).status(); !s.ok()) {
      return Unparsed("gossip.interpolation (--interpolation)", s);
    }
  }
  if (gossip && (!(g.divergence_threshold() >= 0) || !std::isfinite(g.divergence_threshold()))) {
    return Refuse(
        "gossip.divergence_threshold (--divergence_threshold) must be >= 0 (0 turns it "
        "off)");
  }

  const shoal::v1::ExchangeConfig& x = c.exchange();
  absl::StatusOr<CodecSpec> codec = ParseCodecSpec(x.codec());
  if (!codec.ok()) return Unparsed("exchange.codec (--codec)", codec.status());
  const shoal::v1::OuterOptimizerConfig& outer = x.outer_optimizer();
  absl::StatusOr<OuterOptimizer> outer_kind = ParseOuterOptimizer(outer.kind());
  if (!outer_kind.ok()) {
    return Unparsed("exchange.outer_optimizer.kind (--outer_optimizer)", outer_kind.status());
  }
  if (*outer_kind != OuterOptimizer::kNone && !(outer.lr() > 0 && outer.lr() <= 10)) {
    return Refuse("exchange.outer_optimizer.lr (--outer_lr) must be in (0, 10]");
  }
  if (!(outer.momentum() >= 0 && outer.momentum() < 1)) {
    return Refuse("exchange.outer_optimizer.momentum (--outer_momentum) must be in [0, 1)");
  }
  absl::StatusOr<AggregationSpec> aggregation = ParseAggregation(x.aggregation());
  if (!aggregation.ok()) {
    return Unparsed("exchange.aggregation (--aggregation)", aggregation.status());
  }

  if (x.fragments() > kMaxFragments) {
    return Refuse(absl::StrCat("exchange.fragments (--fragments) must be at most ", kMaxFragments,
                               ", is ", x.fragments()));
  }
  const bool fragments = x.fragments() > 1;
  absl::StatusOr<OverlapStart> overlap_start = ParseOverlapStart(x.overlap_start());
  if (!overlap_start.ok()) {
    return Unparsed("exchange.overlap_start (--overlap_start)", overlap_start.status());
  }

  const shoal::v1::TimeoutsConfig& to = c.timeouts();
  if (to.heartbeat_interval_ms() == 0) {
    return Refuse("timeouts.heartbeat_interval_ms (--heartbeat_interval) must be > 0");
  }
  if (to.heartbeat_lease_ms() <= to.heartbeat_interval_ms()) {
    return Refuse(
        "timeouts.heartbeat_lease_ms (--heartbeat_lease) must be longer than "
        "timeouts.heartbeat_interval_ms (--heartbeat_interval)");
  }
  if (to.round_timeout_ms() == 0) {
    return Refuse("timeouts.round_timeout_ms (--round_timeout) must be > 0");
  }
  if (to.connection_timeout_ms() == 0) {
    return Refuse("timeouts.connection_timeout_ms (--connection_timeout) must be > 0");
  }
  if (to.checkpoint_timeout_ms() == 0) {
    return Refuse("timeouts.checkpoint_timeout_ms (--checkpoint_timeout) must be > 0");
  }
  if (const shoal::v1::AdaptiveDeadlineConfig& a = to.adaptive_deadline();
      a.enabled() && (!(a.factor() >= 1) || !std::isfinite(a.factor()))) {
    return Refuse("timeouts.adaptive_deadline.factor (--deadline_factor) must be a number >= 1");
  }
  const shoal::v1::ElectionConfig& e = to.election();
  if (!(e.switch_factor() > 1) || !std::isfinite(e.switch_factor())) {
    return Refuse(
        "timeouts.election.switch_factor (--supernode_switch_factor) must be a number "
        "> 1");
  }
  if (e.switch_rounds() < 1) {
    return Refuse("timeouts.election.switch_rounds (--supernode_switch_rounds) must be at least 1");
  }
  if (c.checkpoints().checkpointers() < 1) {
    return Refuse("checkpoints.checkpointers (--checkpointers) must be at least 1");
  }

  // ---- Combinations the run refuses, one line each, only where they have
  // no meaning: every codec, outer optimizer, aggregation rule and
  // topology of the synchronous mode compose (one averaging pipeline:
  // services/worker/exchanger.h), and gossip pulls travel in any codec.
  const bool no_outer = *outer_kind == OuterOptimizer::kNone;
  const bool mean = aggregation->kind == AggregationSpec::Kind::kMean;
  const bool hierarchy = c.topology().hierarchy();
  const struct {
    bool refused;
    std::string message;
  } kCombinations[] = {
      {!gossip && MinContributions(*aggregation) > sync.min_participants(),
       absl::StrCat("exchange.aggregation (--aggregation) ", x.aggregation(), " drops ",
                    aggregation->trim, " values at each end, so it needs at least ",
                    MinContributions(*aggregation),
                    " participants per round; "
                    "sync.min_participants (--min_participants) is ",
                    sync.min_participants())},
      {gossip && hierarchy,
       "topology.hierarchy (--hierarchy=on) shapes the rounds of sync mode; gossip (--mode=gossip) "
       "has no rounds"},
      {gossip && !no_outer,
       "exchange.outer_optimizer (--outer_optimizer) steps from a round's agreed base; gossip "
       "(--mode=gossip) has no rounds and no agreed base: use none"},
      {gossip && x.overlap(),
       "exchange.overlap (--overlap=on) overlaps a round's training with the last round's "
       "averaging; gossip (--mode=gossip) has no rounds"},
      {!x.overlap() && overlap_start->extrapolate > 0,
       "exchange.overlap_start (--overlap_start) places the steps trained ahead of their round; "
       "without exchange.overlap (--overlap=on) none are"},
      {!x.overlap() && x.overlap_stale_steps() > 0,
       "exchange.overlap_stale_steps (--overlap_stale_steps) says when the steps trained ahead "
       "take the last round's average; without exchange.overlap (--overlap=on) none are"},
      {x.overlap() && t.sample_ledger(),
       "exchange.overlap (--overlap=on) trains round N+1 before the coordinator names its "
       "samples; training.sample_ledger (--sample_ledger, and --audit_rate, which needs it) "
       "names them at the round's start"},
      {x.overlap() && c.model().name() == "module",
       "exchange.overlap (--overlap=on) trains on a second copy of the model inside "
       "shoal-worker; a Python training loop (model.name module) trains its own module"},
      {gossip && fragments,
       "exchange.fragments (--fragments) syncs one fragment per round; gossip (--mode=gossip) has "
       "no rounds"},
      {fragments && c.trust().audit_rate() > 0,
       "exchange.fragments (--fragments) makes a contribution of progress kept on the worker "
       "since its fragment's last round; an audit (trust.audit_rate, --audit_rate) replays a "
       "round from the agreed model alone"},
      {fragments && c.model().name() == "module",
       "exchange.fragments (--fragments) keeps a local model apart from the agreed one inside "
       "shoal-worker; a Python training loop (model.name module) trains its own module"},
      {gossip && !mean,
       "exchange.aggregation (--aggregation) shapes the synchronous exchange's slice owners; "
       "gossip (--mode=gossip) has none: use mean"},
  };
  for (const auto& combination : kCombinations) {
    if (combination.refused) return Refuse(combination.message);
  }
  return absl::OkStatus();
}

std::string RunConfigJson(const RunConfig& config) { return Json(config, /*pretty=*/true); }

std::vector<std::string> RunConfigLines(const RunConfig& c) {
  std::vector<std::string> lines;
  lines.push_back(absl::StrCat("model: ", Json(c.model(), false)));
  lines.push_back(absl::StrCat("training: ", Json(c.training(), false)));
  if (IsGossip(c)) {
    lines.push_back(absl::StrCat("gossip: ", Json(c.gossip(), false)));
  } else {
    lines.push_back(absl::StrCat("sync: ", Json(c.sync(), false)));
  }
  lines.push_back(absl::StrCat("exchange: ", Json(c.exchange(), false)));
  lines.push_back(absl::StrCat("topology: ", Json(c.topology(), false)));
  lines.push_back(absl::StrCat("timeouts: ", Json(c.timeouts(), false)));
  lines.push_back(absl::StrCat("checkpoints: ", Json(c.checkpoints(), false)));
  return lines;
}

}  // namespace shoal
