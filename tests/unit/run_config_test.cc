// The run config (issue 25, docs/CONFIG.md): the one validator and each of
// its refusals, the YAML/JSON file, its merge with the flags, and what the
// coordinator keeps of a recorded config when a run resumes.
#include "common/run_config.h"

#include <functional>
#include <string>
#include <vector>

#include "common/run_config_file.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "services/coordinator/core/run_settings.h"

namespace shoal {
namespace {

using shoal::v1::RunConfig;
using ::testing::HasSubstr;

bool Same(const RunConfig& a, const RunConfig& b) {
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}

// What the coordinator's flags give at their defaults.
RunConfig Defaults() {
  RunConfig c;
  c.mutable_model()->set_name("mlp");
  auto* t = c.mutable_training();
  t->set_optimizer("sgd");
  t->set_learning_rate(0.05);
  t->set_momentum(0.9);
  t->set_batch_size(64);
  t->set_local_steps(50);
  t->set_seed(1);
  t->set_data_split("iid");
  t->set_eval_every(1);
  c.mutable_sync()->set_min_participants(2);
  c.mutable_sync()->set_fold_late_work(true);
  c.mutable_sync()->set_max_staleness(4);
  c.mutable_exchange()->set_codec("fp32");
  c.mutable_exchange()->mutable_outer_optimizer()->set_kind("none");
  c.mutable_exchange()->mutable_outer_optimizer()->set_lr(0.7);
  c.mutable_exchange()->mutable_outer_optimizer()->set_momentum(0.9);
  c.mutable_exchange()->set_aggregation("mean");
  auto* to = c.mutable_timeouts();
  to->set_heartbeat_interval_ms(1000);
  to->set_heartbeat_lease_ms(10000);
  to->set_connection_timeout_ms(10000);
  to->set_round_timeout_ms(120000);
  to->set_max_connection_retry(3);
  to->set_max_missed_rounds(5);
  to->mutable_adaptive_deadline()->set_enabled(true);
  to->mutable_adaptive_deadline()->set_rounds(3);
  to->mutable_adaptive_deadline()->set_factor(2);
  to->mutable_adaptive_deadline()->set_floor_ms(2000);
  to->set_checkpoint_timeout_ms(120000);
  to->mutable_election()->set_switch_factor(1.5);
  to->mutable_election()->set_switch_rounds(3);
  to->mutable_election()->set_min_tenure_ms(30000);
  c.mutable_checkpoints()->set_every(10);
  c.mutable_checkpoints()->set_checkpointers(1);
  NormalizeRunConfig(&c);
  return c;
}

RunConfig Gossip() {
  RunConfig c = Defaults();
  auto* g = c.mutable_gossip();
  g->set_every(10);
  g->set_fetch_probability(1);
  g->set_timeout_ms(5000);
  g->set_interpolation("constant:0.5");
  return c;
}

TEST(ValidateRunConfigTest, TheFlagDefaultsAreValidInBothModes) {
  EXPECT_TRUE(ValidateRunConfig(Defaults()).ok()) << ValidateRunConfig(Defaults());
  EXPECT_TRUE(ValidateRunConfig(Gossip()).ok()) << ValidateRunConfig(Gossip());
  EXPECT_STREQ(ModeName(Defaults()), "sync");
  EXPECT_STREQ(ModeName(Gossip()), "gossip");
  EXPECT_STREQ(ModeName(RunConfig()), "sync");  // unset = sync
}

struct Refusal {
  const char* name;
  std::function<void(RunConfig*)> change;
  // The message, whole or its start, naming the key and the flag.
  const char* message;
  bool gossip = false;
};

// Every refusal of the validator, one message per case.
TEST(ValidateRunConfigTest, EachRefusalNamesTheKeyAndTheFlag) {
  const std::vector<Refusal> cases = {
      {"model", [](RunConfig* c) { c->mutable_model()->set_name("resnet"); },
       "model.name (--model) must be mlp, cnn, torchscript or module, got 'resnet'"},
      {"torchscript without file",
       [](RunConfig* c) {
         c->mutable_model()->set_name("torchscript");
         c->mutable_model()->add_input_shape(1);
       },
       "model.name torchscript needs its file: model.file (--model=torchscript:PATH)"},
      {"file for mlp", [](RunConfig* c) { c->mutable_model()->set_file("m.pt"); },
       "model.file, model.file_sha256, model.file_bytes and model.input_shape are for model.name "
       "torchscript only, not 'mlp'"},
      {"input shape arity",
       [](RunConfig* c) {
         c->mutable_model()->set_name("torchscript");
         c->mutable_model()->set_file_sha256("ab");
         c->mutable_model()->add_input_shape(1);
       },
       "model.input_shape (--input_shape) must have 3 numbers (channels, height, width)"},
      {"input shape range",
       [](RunConfig* c) {
         c->mutable_model()->set_name("torchscript");
         c->mutable_model()->set_file_sha256("ab");
         for (uint32_t d : {1u, 0u, 28u}) c->mutable_model()->add_input_shape(d);
       },
       "model.input_shape (--input_shape) values must be in [1, 65536], got 0"},
      {"optimizer", [](RunConfig* c) { c->mutable_training()->set_optimizer("lamb"); },
       "training.optimizer (--optimizer) must be sgd, adam or adamw, got 'lamb'"},
      {"learning rate", [](RunConfig* c) { c->mutable_training()->set_learning_rate(0); },
       "training.learning_rate (--learning_rate) must be a number > 0"},
      {"momentum", [](RunConfig* c) { c->mutable_training()->set_momentum(1); },
       "training.momentum (--momentum) must be in [0, 1)"},
      {"batch", [](RunConfig* c) { c->mutable_training()->set_batch_size(0); },
       "training.batch_size (--batch_size) must be > 0"},
      {"steps", [](RunConfig* c) { c->mutable_training()->set_local_steps(0); },
       "training.local_steps (--local_steps) must be > 0"},
      {"shards", [](RunConfig* c) { c->mutable_training()->set_data_shards(0); },
       "training.data_shards (--data_shards) must be > 0"},
      {"eval", [](RunConfig* c) { c->mutable_training()->set_eval_every(0); },
       "training.eval_every (--eval_every) must be > 0"},
      {"split", [](RunConfig* c) { c->mutable_training()->set_data_split("skew"); },
       "training.data_split (--data_split): unknown data split 'skew'"},
      {"min participants", [](RunConfig* c) { c->mutable_sync()->set_min_participants(0); },
       "sync.min_participants (--min_participants) must be > 0"},
      {"staleness", [](RunConfig* c) { c->mutable_sync()->set_max_staleness(1001); },
       "sync.max_staleness (--max_staleness) must be at most 1000"},
      {"fetch probability", [](RunConfig* c) { c->mutable_gossip()->set_fetch_probability(1.5); },
       "gossip.fetch_probability (--fetch_probability) must be in [0, 1], got 1.5", true},
      {"interpolation", [](RunConfig* c) { c->mutable_gossip()->set_interpolation("nearest"); },
       "gossip.interpolation (--interpolation): interpolation 'nearest' is not one of", true},
      {"divergence", [](RunConfig* c) { c->mutable_gossip()->set_divergence_threshold(-1); },
       "gossip.divergence_threshold (--divergence_threshold) must be >= 0", true},
      {"codec", [](RunConfig* c) { c->mutable_exchange()->set_codec("zip"); },
       "exchange.codec (--codec): unknown codec 'zip'"},
      {"outer kind",
       [](RunConfig* c) { c->mutable_exchange()->mutable_outer_optimizer()->set_kind("adam"); },
       "exchange.outer_optimizer.kind (--outer_optimizer): unknown outer optimizer 'adam'"},
      {"outer lr",
       [](RunConfig* c) {
         c->mutable_exchange()->mutable_outer_optimizer()->set_kind("sgd");
         c->mutable_exchange()->mutable_outer_optimizer()->set_lr(11);
       },
       "exchange.outer_optimizer.lr (--outer_lr) must be in (0, 10]"},
      {"outer momentum",
       [](RunConfig* c) { c->mutable_exchange()->mutable_outer_optimizer()->set_momentum(-0.1); },
       "exchange.outer_optimizer.momentum (--outer_momentum) must be in [0, 1)"},
      {"aggregation", [](RunConfig* c) { c->mutable_exchange()->set_aggregation("mode"); },
       "exchange.aggregation (--aggregation): unknown aggregation 'mode'"},
      {"heartbeat", [](RunConfig* c) { c->mutable_timeouts()->set_heartbeat_interval_ms(0); },
       "timeouts.heartbeat_interval_ms (--heartbeat_interval) must be > 0"},
      {"lease", [](RunConfig* c) { c->mutable_timeouts()->set_heartbeat_lease_ms(1000); },
       "timeouts.heartbeat_lease_ms (--heartbeat_lease) must be longer than "
       "timeouts.heartbeat_interval_ms (--heartbeat_interval)"},
      {"round timeout", [](RunConfig* c) { c->mutable_timeouts()->set_round_timeout_ms(0); },
       "timeouts.round_timeout_ms (--round_timeout) must be > 0"},
      {"connection timeout",
       [](RunConfig* c) { c->mutable_timeouts()->set_connection_timeout_ms(0); },
       "timeouts.connection_timeout_ms (--connection_timeout) must be > 0"},
      {"checkpoint timeout",
       [](RunConfig* c) { c->mutable_timeouts()->set_checkpoint_timeout_ms(0); },
       "timeouts.checkpoint_timeout_ms (--checkpoint_timeout) must be > 0"},
      {"deadline factor",
       [](RunConfig* c) { c->mutable_timeouts()->mutable_adaptive_deadline()->set_factor(0.5); },
       "timeouts.adaptive_deadline.factor (--deadline_factor) must be a number >= 1"},
      {"switch factor",
       [](RunConfig* c) { c->mutable_timeouts()->mutable_election()->set_switch_factor(1); },
       "timeouts.election.switch_factor (--supernode_switch_factor) must be a number > 1"},
      {"switch rounds",
       [](RunConfig* c) { c->mutable_timeouts()->mutable_election()->set_switch_rounds(0); },
       "timeouts.election.switch_rounds (--supernode_switch_rounds) must be at least 1"},
      {"checkpointers", [](RunConfig* c) { c->mutable_checkpoints()->set_checkpointers(0); },
       "checkpoints.checkpointers (--checkpointers) must be at least 1"},
      // The combinations of the ledger and the audits.
      {"ledger in gossip", [](RunConfig* c) { c->mutable_training()->set_sample_ledger(true); },
       "training.sample_ledger (--sample_ledger) needs synchronous rounds", true},
      {"ledger with label skew",
       [](RunConfig* c) {
         c->mutable_training()->set_sample_ledger(true);
         c->mutable_training()->set_data_split("label_skew:0.5");
       },
       "training.sample_ledger (--sample_ledger) needs training.data_split (--data_split) iid"},
      {"epochs without ledger", [](RunConfig* c) { c->mutable_training()->set_epochs(2); },
       "training.epochs (--epochs) needs training.sample_ledger (--sample_ledger)"},
      {"audits in gossip", [](RunConfig* c) { c->mutable_trust()->set_audit_rate(0.5); },
       "trust.audit_rate (--audit_rate) needs synchronous rounds", true},
      {"audit rate", [](RunConfig* c) { c->mutable_trust()->set_audit_rate(2); },
       "trust.audit_rate (--audit_rate) must be in [0, 1]"},
      {"audit threads", [](RunConfig* c) { c->mutable_trust()->set_audit_threads(300); },
       "trust.audit_threads (--audit_threads) must be at most 256"},
      {"ban line", [](RunConfig* c) { c->mutable_trust()->set_ban_below(2); },
       "trust.ban_below (--ban_below) must be in [0, 1]"},
      // The combinations, one line each in the validator.
      {"trimmed mean quorum",
       [](RunConfig* c) { c->mutable_exchange()->set_aggregation("trimmed_mean:1"); },
       "exchange.aggregation (--aggregation) trimmed_mean:1 drops 1 values at each end, so it "
       "needs at least 3 participants per round; sync.min_participants (--min_participants) is 2"},
      {"gossip hierarchy", [](RunConfig* c) { c->mutable_topology()->set_hierarchy(true); },
       "topology.hierarchy (--hierarchy=on) shapes the rounds of sync mode; gossip "
       "(--mode=gossip) has no rounds",
       true},
      {"gossip outer",
       [](RunConfig* c) { c->mutable_exchange()->mutable_outer_optimizer()->set_kind("sgd"); },
       "exchange.outer_optimizer (--outer_optimizer) steps from a round's agreed base; gossip "
       "(--mode=gossip) has no rounds and no agreed base: use none",
       true},
      {"gossip aggregation", [](RunConfig* c) { c->mutable_exchange()->set_aggregation("median"); },
       "exchange.aggregation (--aggregation) shapes the synchronous exchange's slice owners; "
       "gossip (--mode=gossip) has none: use mean",
       true},
      {"slice sizing", [](RunConfig* c) { c->mutable_exchange()->set_slice_sizing("fast"); },
       "exchange.slice_sizing (--slice_sizing) must be equal or bandwidth, is 'fast'"},
      {"gossip slice sizing",
       [](RunConfig* c) { c->mutable_exchange()->set_slice_sizing("bandwidth"); },
       "exchange.slice_sizing (--slice_sizing) bandwidth sizes the synchronous exchange's "
       "slices; gossip (--mode=gossip) has none: use equal",
       true},
      {"gossip overlap", [](RunConfig* c) { c->mutable_exchange()->set_overlap(true); },
       "exchange.overlap (--overlap=on) overlaps a round's training with the last round's "
       "averaging; gossip (--mode=gossip) has no rounds",
       true},
      {"overlap ledger",
       [](RunConfig* c) {
         c->mutable_exchange()->set_overlap(true);
         c->mutable_training()->set_sample_ledger(true);
       },
       "exchange.overlap (--overlap=on) trains round N+1 before the coordinator names its "
       "samples"},
      {"gossip fragments", [](RunConfig* c) { c->mutable_exchange()->set_fragments(4); },
       "exchange.fragments (--fragments) syncs one fragment per round; gossip (--mode=gossip) has "
       "no rounds",
       true},
      {"fragments audits",
       [](RunConfig* c) {
         c->mutable_exchange()->set_fragments(4);
         c->mutable_training()->set_sample_ledger(true);
         c->mutable_trust()->set_audit_rate(0.1);
       },
       "exchange.fragments (--fragments) makes a contribution of progress kept on the worker"},
      {"too many fragments", [](RunConfig* c) { c->mutable_exchange()->set_fragments(5000); },
       "exchange.fragments (--fragments) must be at most 4096, is 5000"},
      {"overlap start", [](RunConfig* c) { c->mutable_exchange()->set_overlap_start("guess"); },
       "exchange.overlap_start (--overlap_start): overlap start 'guess' is not one of "
       "contribution, extrapolate, extrapolate:B"},
      {"overlap start factor",
       [](RunConfig* c) { c->mutable_exchange()->set_overlap_start("extrapolate:3"); },
       "exchange.overlap_start (--overlap_start): overlap start 'extrapolate:3': B of "
       "extrapolate:B must be a number in (0, 2]"},
      {"overlap start without overlap",
       [](RunConfig* c) { c->mutable_exchange()->set_overlap_start("extrapolate"); },
       "exchange.overlap_start (--overlap_start) places the steps trained ahead of their round; "
       "without exchange.overlap (--overlap=on) none are"},
      {"stale steps without overlap",
       [](RunConfig* c) { c->mutable_exchange()->set_overlap_stale_steps(5); },
       "exchange.overlap_stale_steps (--overlap_stale_steps) says when the steps trained ahead "
       "take the last round's average; without exchange.overlap (--overlap=on) none are"},
  };
  // One case per entry of the validator's table.
  EXPECT_GE(cases.size(), RunConfigRuleDocs().size());
  for (const Refusal& r : cases) {
    RunConfig c = r.gossip ? Gossip() : Defaults();
    r.change(&c);
    const absl::Status s = ValidateRunConfig(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << r.name;
    EXPECT_THAT(std::string(s.message()), ::testing::StartsWith(r.message)) << r.name;
  }
}

TEST(ValidateRunConfigTest, APythonLoopOverlapsRoundsAndSyncsFragments) {
  // Its module is the local model (docs/PYTHON.md, "Overlap and fragments").
  RunConfig c = Defaults();
  c.mutable_model()->set_name("module");
  c.mutable_exchange()->set_overlap(true);
  c.mutable_exchange()->set_fragments(4);
  EXPECT_TRUE(ValidateRunConfig(c).ok());
}

TEST(ValidateRunConfigTest, TheRobustRulesAndTheHierarchyPassWhereTheyFit) {
  RunConfig c = Defaults();
  c.mutable_sync()->set_min_participants(3);
  c.mutable_exchange()->set_aggregation("trimmed_mean:1");
  EXPECT_TRUE(ValidateRunConfig(c).ok());
  c = Defaults();
  c.mutable_topology()->set_hierarchy(true);
  c.mutable_topology()->set_relay(true);
  EXPECT_TRUE(ValidateRunConfig(c).ok());
  // Everything of the synchronous exchange composes with the hierarchy
  // (issue 25), and gossip pulls travel in any codec.
  c.mutable_sync()->set_min_participants(3);
  c.mutable_exchange()->set_codec("int8");
  c.mutable_exchange()->mutable_outer_optimizer()->set_kind("nesterov");
  c.mutable_exchange()->set_aggregation("trimmed_mean:1");
  EXPECT_TRUE(ValidateRunConfig(c).ok()) << ValidateRunConfig(c);
  // Overlapped rounds and fragments compose with all of it (issue 27).
  c.mutable_exchange()->set_overlap(true);
  EXPECT_TRUE(ValidateRunConfig(c).ok()) << ValidateRunConfig(c);
  c.mutable_exchange()->set_fragments(4);
  EXPECT_TRUE(ValidateRunConfig(c).ok()) << ValidateRunConfig(c);
  c.mutable_exchange()->set_overlap_start("extrapolate:0.5");
  c.mutable_exchange()->set_overlap_stale_steps(10);
  EXPECT_TRUE(ValidateRunConfig(c).ok()) << ValidateRunConfig(c);
  c.mutable_exchange()->set_overlap_start("contribution");
  c.mutable_exchange()->set_overlap_stale_steps(0);
  // Fragments alone keep the sample ledger (each round's steps are its
  // samples; only the replay of an audit needs more than the agreed model).
  c.mutable_exchange()->set_overlap(false);
  c.mutable_training()->set_sample_ledger(true);
  EXPECT_TRUE(ValidateRunConfig(c).ok()) << ValidateRunConfig(c);
  RunConfig g = Gossip();
  g.mutable_exchange()->set_codec("int8");
  EXPECT_TRUE(ValidateRunConfig(g).ok()) << ValidateRunConfig(g);
  // Gossip knobs are not checked in sync mode (the group is not the run's).
  c = Defaults();
  c.mutable_sync()->set_max_staleness(4);
  EXPECT_TRUE(ValidateRunConfig(c).ok());
}

TEST(NormalizeRunConfigTest, FillsWhatTheCoordinatorDerives) {
  RunConfig c;
  NormalizeRunConfig(&c);
  EXPECT_TRUE(c.has_sync());  // unset mode = sync
  c.mutable_sync()->set_min_participants(3);
  NormalizeRunConfig(&c);
  EXPECT_EQ(c.training().data_shards(), 3u);
  c.mutable_training()->set_data_shards(5);
  NormalizeRunConfig(&c);
  EXPECT_EQ(c.training().data_shards(), 5u);
  RunConfig g;
  g.mutable_gossip()->set_final_average(true);
  NormalizeRunConfig(&g);
  EXPECT_EQ(g.gossip().every(), 1u);
  EXPECT_EQ(g.gossip().timeout_ms(), 1u);
  EXPECT_FALSE(g.gossip().final_average());  // only with steps
  g.mutable_gossip()->set_steps(100);
  g.mutable_gossip()->set_final_average(true);
  NormalizeRunConfig(&g);
  EXPECT_TRUE(g.gossip().final_average());
  // Fragments drop late work: folded into the next round it would land in
  // another fragment's round.
  RunConfig f;
  f.mutable_sync()->set_fold_late_work(true);
  f.mutable_exchange()->set_fragments(4);
  NormalizeRunConfig(&f);
  EXPECT_FALSE(f.sync().fold_late_work());
}

constexpr char kYaml[] = R"(# the example of docs/CONFIG.md
model: {name: mlp}
training:
  learning_rate: 0.05
  batch_size: 64
  local_steps: 50
  seed: 1
sync: {min_participants: 3, rounds: 20, fold_late_work: false}
exchange: {codec: int8, outer_optimizer: {kind: nesterov, lr: 0.7, momentum: 0.9}}
topology: {hierarchy: off}
)";

constexpr char kJson[] = R"({
  "model": {"name": "mlp"},
  "training": {"learning_rate": 0.05, "batch_size": 64, "local_steps": 50, "seed": "1"},
  "sync": {"min_participants": 3, "rounds": 20, "fold_late_work": false},
  "exchange": {"codec": "int8",
               "outer_optimizer": {"kind": "nesterov", "lr": 0.7, "momentum": 0.9}},
  "topology": {"hierarchy": false}
})";

TEST(RunConfigFileTest, YamlAndJsonReadTheSameKeys) {
  absl::StatusOr<RunConfigFile> yaml = ParseRunConfigFile(kYaml, "run.yaml");
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  absl::StatusOr<RunConfigFile> json = ParseRunConfigFile(kJson, "run.json");
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_TRUE(Same(yaml->config, json->config))
      << yaml->config.DebugString() << " vs " << json->config.DebugString();
  const RunConfig& c = yaml->config;
  EXPECT_EQ(c.model().name(), "mlp");
  EXPECT_DOUBLE_EQ(c.training().learning_rate(), 0.05);
  EXPECT_EQ(c.training().batch_size(), 64u);
  EXPECT_EQ(c.training().seed(), 1u);
  ASSERT_TRUE(c.has_sync());
  EXPECT_EQ(c.sync().min_participants(), 3u);
  EXPECT_EQ(c.sync().rounds(), 20u);
  EXPECT_EQ(c.exchange().codec(), "int8");
  EXPECT_EQ(c.exchange().outer_optimizer().kind(), "nesterov");
  EXPECT_DOUBLE_EQ(c.exchange().outer_optimizer().momentum(), 0.9);
}

TEST(RunConfigFileTest, ThePrintedEffectiveConfigReadsBackAsAFile) {
  RunConfig c = Defaults();
  c.mutable_sync()->set_rounds(20);  // a uint64: printed as a string
  absl::StatusOr<RunConfigFile> back = ParseRunConfigFile(RunConfigJson(c), "printed.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(Same(back->config, c));
  absl::StatusOr<RunConfigFile> gossip = ParseRunConfigFile(RunConfigJson(Gossip()), "g.json");
  ASSERT_TRUE(gossip.ok()) << gossip.status();
  EXPECT_TRUE(Same(gossip->config, Gossip()));
  EXPECT_EQ(RunConfigLines(Gossip())[2].rfind("gossip: {", 0), 0u);
}

void ExpectRefused(const std::string& text, const std::string& message) {
  absl::StatusOr<RunConfigFile> f = ParseRunConfigFile(text, "run.yaml");
  ASSERT_FALSE(f.ok()) << text;
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << text;
  EXPECT_THAT(std::string(f.status().message()), HasSubstr(message)) << text;
}

TEST(RunConfigFileTest, UnknownKeysAreRefusedWithTheirPath) {
  ExpectRefused("exchange:\n  codecc: int8\n", "run.yaml:2: unknown key 'exchange.codecc'");
  ExpectRefused("exchange:\n  codecc: int8\n",
                "(keys here: codec, outer_optimizer, aggregation, overlap, fragments, "
                "overlap_start, overlap_stale_steps, slice_sizing)");
  ExpectRefused("trainin: {seed: 1}\n", "run.yaml:1: unknown key 'trainin'");
  ExpectRefused("exchange: {outer_optimizer: {kind: sgd, learning_rate: 1}}\n",
                "unknown key 'exchange.outer_optimizer.learning_rate'");
  // The flat keys of the old RunConfig are not keys of the file.
  ExpectRefused("learning_rate: 0.1\n", "unknown key 'learning_rate'");
  // JSON names (lowerCamelCase) are not either: the keys are the field names.
  ExpectRefused(R"({"training": {"learningRate": 0.1}})", "unknown key 'training.learningRate'");
}

TEST(RunConfigFileTest, WrongTypesAreRefusedWithTheKeysPath) {
  ExpectRefused("training: {batch_size: lots}\n",
                "run.yaml:1: key 'training.batch_size' must be an integer in [0, 4294967295], got "
                "'lots'");
  ExpectRefused("training: {batch_size: -4}\n", "key 'training.batch_size' must be an integer");
  ExpectRefused("training: {batch_size: 1.5}\n", "key 'training.batch_size' must be an integer");
  ExpectRefused("training: {learning_rate: fast}\n",
                "key 'training.learning_rate' must be a number, got 'fast'");
  ExpectRefused("sync: {fold_late_work: maybe}\n",
                "key 'sync.fold_late_work' must be true or false, got 'maybe'");
  ExpectRefused("exchange: {codec: [int8]}\n", "key 'exchange.codec' must be a string, not a list");
  ExpectRefused("training: 5\n", "key 'training' must be a mapping of keys");
  ExpectRefused("model: {input_shape: 1}\n", "key 'model.input_shape' must be a list");
  ExpectRefused("exchange: {codec: }\n", "key 'exchange.codec' has no value");
  ExpectRefused("- model\n", "the file must be a mapping of groups");
  ExpectRefused("training: {seed: 1\n", "run.yaml:");  // a syntax error, with its place
}

TEST(RunConfigFileTest, DuplicatesAndBothModesAreRefused) {
  ExpectRefused("training: {seed: 1}\ntraining: {seed: 2}\n", "duplicate key 'training'");
  ExpectRefused("sync: {rounds: 2}\ngossip: {steps: 5}\n",
                "'sync' and 'gossip' are exclusive: the run has one mode");
}

TEST(RunConfigFileTest, AnEmptyModeGroupChoosesTheMode) {
  absl::StatusOr<RunConfigFile> f = ParseRunConfigFile("gossip: {}\n", "run.yaml");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->config.has_gossip());
  f = ParseRunConfigFile("", "empty.yaml");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->config.mode_case(), RunConfig::MODE_NOT_SET);
}

TEST(RunConfigFileTest, AMissingFileIsNotFound) {
  EXPECT_EQ(ReadRunConfigFile("/nonexistent/run.yaml").status().code(),
            absl::StatusCode::kNotFound);
}

// A stand-in for the coordinator's flag table: each flag has a current value
// (its default unless `given`).
struct FakeFlags {
  uint32_t batch_size = 64;
  bool batch_given = false;
  double learning_rate = 0.05;
  bool learning_rate_given = false;
  bool fold_late_work = true;
  uint32_t min_participants = 2;
  bool min_given = false;
  uint32_t gossip_every = 10;
  bool gossip_every_given = false;
  std::string mode = "sync";
  bool mode_given = false;

  std::vector<RunConfigFlag> Flags() const {
    using Mode = RunConfigFlag::Mode;
    std::vector<RunConfigFlag> flags;
    flags.push_back({"mode", "mode", Mode::kAny, mode_given, [this](RunConfig* c) {
                       mode == "gossip" ? (void)c->mutable_gossip() : (void)c->mutable_sync();
                       return absl::OkStatus();
                     }});
    flags.push_back(
        {"batch_size", "training.batch_size", Mode::kAny, batch_given, [this](RunConfig* c) {
           c->mutable_training()->set_batch_size(batch_size);
           return absl::OkStatus();
         }});
    flags.push_back({"learning_rate", "training.learning_rate", Mode::kAny, learning_rate_given,
                     [this](RunConfig* c) {
                       c->mutable_training()->set_learning_rate(learning_rate);
                       return absl::OkStatus();
                     }});
    flags.push_back(
        {"fold_late_work", "sync.fold_late_work", Mode::kSync, false, [this](RunConfig* c) {
           c->mutable_sync()->set_fold_late_work(fold_late_work);
           return absl::OkStatus();
         }});
    flags.push_back(
        {"min_participants", "sync.min_participants", Mode::kSync, min_given, [this](RunConfig* c) {
           c->mutable_sync()->set_min_participants(min_participants);
           return absl::OkStatus();
         }});
    flags.push_back(
        {"gossip_every", "gossip.every", Mode::kGossip, gossip_every_given, [this](RunConfig* c) {
           c->mutable_gossip()->set_every(gossip_every);
           return absl::OkStatus();
         }});
    return flags;
  }
};

RunConfigFile File(const std::string& text) {
  absl::StatusOr<RunConfigFile> f = ParseRunConfigFile(text, "run.yaml");
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? *f : RunConfigFile();
}

TEST(MergeRunConfigTest, WithoutAFileTheFlagsAreTheConfig) {
  FakeFlags flags;
  flags.batch_size = 32;
  flags.batch_given = true;
  absl::StatusOr<MergedRunConfig> m = MergeRunConfig(flags.Flags(), nullptr);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->config.training().batch_size(), 32u);
  EXPECT_DOUBLE_EQ(m->config.training().learning_rate(), 0.05);
  EXPECT_EQ(m->config.sync().min_participants(), 2u);
  EXPECT_EQ(m->config.training().data_shards(), 2u);  // = min_participants
  EXPECT_TRUE(m->notes.empty());
}

TEST(MergeRunConfigTest, TheFileOverridesDefaultsAndGivenFlagsOverrideTheFile) {
  const RunConfigFile file = File(
      "training: {batch_size: 16, learning_rate: 0.2}\n"
      "sync: {min_participants: 4, fold_late_work: false}\n");
  FakeFlags flags;
  flags.learning_rate = 0.01;  // given: wins over the file
  flags.learning_rate_given = true;
  absl::StatusOr<MergedRunConfig> m = MergeRunConfig(flags.Flags(), &file);
  ASSERT_TRUE(m.ok()) << m.status();
  // --batch_size was not given: its default (64) does not override the file.
  EXPECT_EQ(m->config.training().batch_size(), 16u);
  EXPECT_DOUBLE_EQ(m->config.training().learning_rate(), 0.01);
  EXPECT_EQ(m->config.sync().min_participants(), 4u);
  EXPECT_EQ(m->config.training().data_shards(), 4u);
  // An explicit false in the file beats the flag's default true.
  EXPECT_FALSE(m->config.sync().fold_late_work());
}

TEST(MergeRunConfigTest, TheFilesModeKeepsTheFlagDefaultsOfThatMode) {
  const RunConfigFile file = File("gossip: {steps: 500}\n");
  FakeFlags flags;
  absl::StatusOr<MergedRunConfig> m = MergeRunConfig(flags.Flags(), &file);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(m->config.has_gossip());
  EXPECT_EQ(m->config.gossip().steps(), 500u);
  EXPECT_EQ(m->config.gossip().every(), 10u);  // --gossip_every's default
  // --gossip_every given overrides the file's mode group too.
  const RunConfigFile with_every = File("gossip: {steps: 500, every: 20}\n");
  flags.gossip_every = 5;
  flags.gossip_every_given = true;
  m = MergeRunConfig(flags.Flags(), &with_every);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->config.gossip().every(), 5u);
}

TEST(MergeRunConfigTest, AGivenModeFlagWinsAndTheOtherGroupIsNoted) {
  const RunConfigFile file = File("sync: {min_participants: 4}\n");
  FakeFlags flags;
  flags.mode = "gossip";
  flags.mode_given = true;
  flags.min_given = true;
  absl::StatusOr<MergedRunConfig> m = MergeRunConfig(flags.Flags(), &file);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->config.has_gossip());
  ASSERT_EQ(m->notes.size(), 2u);
  EXPECT_EQ(m->notes[0], "run.yaml: 'sync' ignored: --mode=gossip was given");
  EXPECT_EQ(m->notes[1], "--min_participants ignored: it applies to sync mode, the run is gossip");
}

TEST(MergeRunConfigTest, AFlagThatCannotApplyIsAnError) {
  FakeFlags flags;
  std::vector<RunConfigFlag> list = flags.Flags();
  list[0].apply = [](RunConfig*) { return absl::InvalidArgumentError("--mode=async is not one"); };
  EXPECT_EQ(MergeRunConfig(list, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RunSettingsTest, TheEnginesOptionsComeFromTheConfigAndGoBack) {
  RunConfig c = Defaults();
  c.mutable_timeouts()->set_round_timeout_ms(4000);
  c.mutable_timeouts()->mutable_election()->set_min_tenure_ms(0);
  c.mutable_checkpoints()->set_checkpointers(2);
  coordinator::EngineOptions o;
  coordinator::ApplyRunSettings(c, &o);
  EXPECT_EQ(o.round_timeout, absl::Seconds(4));
  EXPECT_EQ(o.heartbeat_lease, absl::Seconds(10));
  EXPECT_EQ(o.session_grace, absl::Seconds(10));
  EXPECT_EQ(o.adaptive_deadline.floor, absl::Seconds(2));
  EXPECT_EQ(o.election.switch_evaluations, 3u);
  EXPECT_EQ(o.checkpointers, 2u);
  RunConfig back = c;
  back.clear_timeouts();
  back.mutable_timeouts()->set_heartbeat_interval_ms(1000);  // the workers' own
  back.mutable_checkpoints()->set_checkpointers(0);
  coordinator::RecordRunSettings(o, &back);
  EXPECT_TRUE(Same(back, c)) << back.DebugString();
}

TEST(RunSettingsTest, AResumedRunKeepsItsRecordButTakesTimeoutsAndCheckpoints) {
  RunConfig recorded = Defaults();
  recorded.mutable_training()->set_learning_rate(0.1);
  recorded.mutable_checkpoints()->set_store("old:1");
  RunConfig given = Defaults();
  given.mutable_timeouts()->set_round_timeout_ms(600000);
  given.mutable_checkpoints()->set_store("new:1");
  std::string note;
  RunConfig out = coordinator::ResumedRunConfig(recorded, given, &note);
  EXPECT_DOUBLE_EQ(out.training().learning_rate(), 0.1);
  EXPECT_EQ(out.timeouts().round_timeout_ms(), 600000u);
  EXPECT_EQ(out.checkpoints().store(), "new:1");
  EXPECT_THAT(note, HasSubstr("continues with the recorded ones"));
  out = coordinator::ResumedRunConfig(given, given, &note);
  EXPECT_TRUE(note.empty());
}

TEST(RunSettingsTest, ARecordOfAnOlderBuildIsNotReadAsTheNewShape) {
  // The flat RunConfig of older builds: model = 1 ("mlp"), learning_rate = 2,
  // min_participants = 6, codec = 60 ("int8"), all reserved now.
  std::string old;
  old += std::string("\x0a\x03mlp", 5);
  old += std::string("\x11\x9a\x99\x99\x99\x99\x99\xa9\x3f", 9);  // 0.05
  old += std::string("\x30\x03", 2);
  old += std::string("\xe2\x03\x04int8", 7);
  RunConfig parsed;
  ASSERT_TRUE(parsed.ParseFromString(old));
  EXPECT_FALSE(parsed.has_model());
  EXPECT_FALSE(parsed.has_training());
  EXPECT_EQ(parsed.mode_case(), RunConfig::MODE_NOT_SET);
  std::string note;
  const RunConfig out = coordinator::ResumedRunConfig(parsed, Defaults(), &note);
  EXPECT_TRUE(Same(out, Defaults()));
  EXPECT_THAT(note, HasSubstr("written by an older build"));
}

}  // namespace
}  // namespace shoal
