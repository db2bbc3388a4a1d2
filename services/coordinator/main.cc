// shoal-coordinator: membership, rounds, shard plans and run status.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <random>

#include "absl/flags/flag.h"
#include "absl/flags/internal/parse.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/flags_usage.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/model_file.h"
#include "common/mutex_mode.h"
#include "common/run_config.h"
#include "common/run_config_file.h"
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
          "exchange, topology, timeouts, checkpoints; docs/CONFIG.md). Flags given on the "
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
ABSL_FLAG(std::string, model, "mlp",
          "Model every worker trains: mlp or cnn (built in), torchscript:PATH (a file written "
          "by torch.jit.script(model).save(PATH); checked here at start, served to the workers, "
          "which verify its SHA-256), or module (any model of Python workers: the first member "
          "declares its layout, docs/PYTHON.md).");
ABSL_FLAG(std::string, optimizer, "sgd",
          "Local optimizer of every worker: sgd (with --momentum), adam or adamw (state stays "
          "local).");
ABSL_FLAG(std::string, input_shape, "1,28,28",
          "Shape of one input image (channels,height,width) a --model=torchscript:PATH file is "
          "checked with; workers refuse a dataset of another shape.");
ABSL_FLAG(double, learning_rate, 0.05, "SGD learning rate.");
ABSL_FLAG(double, momentum, 0.9, "SGD momentum (the momentum buffer stays local).");
ABSL_FLAG(uint32_t, batch_size, 64, "Mini-batch size of local SGD.");
ABSL_FLAG(uint32_t, local_steps, 50, "Local SGD steps per round before averaging.");
ABSL_FLAG(uint32_t, min_participants, 2, "Minimum participants for a round to start.");
ABSL_FLAG(uint64_t, rounds, 0, "Rounds to run; 0 = until the coordinator is stopped.");
ABSL_FLAG(uint64_t, seed, 1, "Run seed: model initialisation and data order.");
ABSL_FLAG(uint32_t, data_shards, 0,
          "Disjoint training-data shards; 0 = --min_participants. A worker trains on "
          "shard (data_rank % data_shards).");
ABSL_FLAG(uint32_t, eval_every, 1, "Workers evaluate on the test set every N rounds.");
ABSL_FLAG(absl::Duration, heartbeat_lease, absl::Seconds(10),
          "A worker whose session is silent this long is removed.");
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
ABSL_FLAG(absl::Duration, round_timeout, absl::Seconds(120),
          "Participants not ready this long after a round starts sit it out (and catch up); the "
          "same deadline applies to the exchange.");
ABSL_FLAG(absl::Duration, connection_timeout, absl::Seconds(10),
          "Time for every participant to reach its peers after a plan.");
ABSL_FLAG(uint32_t, max_connection_retry, 3,
          "Peer-connection retries of a plan before failing peers are evicted.");
ABSL_FLAG(absl::Duration, probe_joiners_timeout, absl::Seconds(1),
          "Each joining worker's Peer address is probed with a TCP connect this long; a worker "
          "that cannot be reached takes part with outbound connections only (behind NAT: owns "
          "no slice, pushes its contributions; docs/SUPERNODES.md). 0 = no probe.");
ABSL_FLAG(uint32_t, max_members, 0,
          "Largest number of members at once; a new worker past it gets RESOURCE_EXHAUSTED "
          "(members re-joining under their id are not new). 0 = no limit.");
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
ABSL_FLAG(uint32_t, max_missed_rounds, 5,
          "A worker that misses this many rounds in a row is asked to leave (0 = never).");
ABSL_FLAG(bool, adaptive_deadline, true,
          "Bound the wait for ready reports by the participants' measured ready times "
          "(--deadline_factor x their median, at least --deadline_floor, at most "
          "--round_timeout); a live worker that misses it sits the round out without it "
          "counting towards --max_missed_rounds. false = wait up to --round_timeout.");
ABSL_FLAG(uint32_t, adaptive_deadline_rounds, 3,
          "Rounds a participant must have been measured in before its ready time counts "
          "for the adaptive deadline.");
ABSL_FLAG(double, deadline_factor, 2.0, "Adaptive deadline: multiple of the median ready time.");
ABSL_FLAG(absl::Duration, deadline_floor, absl::Seconds(2),
          "Adaptive deadline: never shorter than this.");
ABSL_FLAG(bool, fold_late_work, true,
          "Late work is folded into a later round: a worker that misses the ready deadline "
          "keeps its update (trained minus base) and adds it, weighted 1 / (1 + staleness), to "
          "its contribution of the next round it reaches (docs/MEMBERSHIP.md). false = late "
          "work is dropped.");
ABSL_FLAG(uint32_t, max_staleness, 4,
          "Late work staler than this many rounds is dropped instead of folded (0 = fold only "
          "into a re-run of the same base).");
ABSL_FLAG(double, supernode_switch_factor, 1.5,
          "Supernode election (docs/SUPERNODES.md): a worker replaces its zone's supernode only "
          "when its score beats the supernode's by more than this factor (> 1) in "
          "--supernode_switch_rounds consecutive completed rounds; a supernode that leaves or "
          "dies is replaced by its standby at once.");
ABSL_FLAG(uint32_t, supernode_switch_rounds, 3,
          "Supernode election: consecutive completed rounds a challenger must beat the "
          "supernode by --supernode_switch_factor (at least 1).");
ABSL_FLAG(absl::Duration, supernode_min_tenure, absl::Seconds(30),
          "A supernode keeps its seat at least this long before a challenger that beat it "
          "(--supernode_switch_factor, --supernode_switch_rounds) takes over; a head that "
          "leaves or dies is replaced at once. 0 = no minimum.");
ABSL_FLAG(std::string, checkpoint_store, "",
          "Address of shoal-checkpoint; empty = no checkpoints. With --run_id and an empty "
          "--state_dir, a run that has checkpoints there resumes from the newest one.");
ABSL_FLAG(std::string, upload_key_file, "",
          "File holding a secret shared with the checkpoint store's --upload_key_file (never "
          "given to workers; not the run token): each checkpoint request then carries an upload "
          "grant signed with it, and the store accepts only uploads with a valid grant. Empty = "
          "no grants (docs/SECURITY.md).");
ABSL_FLAG(uint32_t, checkpoint_every, 10,
          "Upload a checkpoint every N rounds (and after the last round); 0 = never. "
          "Synchronous mode only: --mode=gossip takes --gossip_checkpoint_every.");
ABSL_FLAG(
    uint32_t, checkpointers, 1,
    "Workers tried one after the other for each checkpoint upload: the checkpoint is given up "
    "after max(1, N) + 2 failed attempts, each by a worker not tried yet.");
ABSL_FLAG(absl::Duration, checkpoint_timeout, absl::Seconds(120),
          "An upload not reported within this time moves to another worker.");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Seconds(1),
          "Heartbeat period the workers keep on their session.");
ABSL_FLAG(std::string, codec, "fp32",
          "How each round's change travels between workers: fp32, fp16, bf16, int8 (a scale per "
          "256 elements), topk:F or randomk:F (a fraction F of the elements, error feedback), "
          "sparse:F (the fraction F of DCT coefficients at 2 bits with coded positions: "
          "sparse:0.06 sends about 1/80 of fp32's bytes). "
          "See docs/COMPRESSION.md.");
ABSL_FLAG(std::string, outer_optimizer, "none",
          "What the averaged change of a round does to the model: none (the average is the new "
          "model), sgd or nesterov (DiLoCo's outer step).");
ABSL_FLAG(double, outer_lr, 0.7, "Outer optimizer step size (sgd, nesterov).");
ABSL_FLAG(double, outer_momentum, 0.9, "Outer optimizer momentum (nesterov).");
ABSL_FLAG(std::string, aggregation, "mean",
          "How the owner of each slice combines the participants' contributions, element by "
          "element: mean, trimmed_mean:K (drop the K lowest and K highest values, average the "
          "rest; needs 2K + 1 <= --min_participants, and a round left with fewer participants "
          "takes the median) or median. The robust rules bound what a misbehaving member can do "
          "to the model (docs/SECURITY.md); they are unweighted, like the mean.");
ABSL_FLAG(std::string, overlap, "off",
          "on: a worker trains round N+1 while round N is exchanged and averaged (on a local "
          "copy of the model); round N+1's contribution is round N's agreed model plus that "
          "local progress, so the link's time hides behind compute (docs/OVERLAP.md). "
          "Synchronous mode with the built-in trainer, without --sample_ledger or audits. off: "
          "train, then exchange.");
ABSL_FLAG(uint32_t, fragments, 1,
          "Streaming fragments: the model is cut into this many contiguous fragments of equal "
          "bytes and round r averages fragment r mod K only, while the others keep training on "
          "each worker's local model, so the link carries 1/K of the model each round "
          "(docs/OVERLAP.md, \"Fragments\"). Each fragment is then synced every K rounds: "
          "--local_steps=H/K keeps H local steps between its syncs. Composes with --overlap. "
          "1: the whole model every round.");
ABSL_FLAG(std::string, overlap_start, "contribution",
          "With --overlap=on, where a round's steps trained ahead start on the fragment the last "
          "round averaged: contribution (this worker's own contribution, as reported), or "
          "extrapolate[:B] (the agreed model moved once more by B times its last move, B in "
          "(0, 2], 1 without a number: a prediction of the average, so that the steps that run "
          "before it comes are less stale; docs/OVERLAP.md).");
ABSL_FLAG(uint32_t, overlap_stale_steps, 0,
          "With --overlap=on, the steps ahead take the last round's average after exactly this "
          "many steps, waiting for it there and holding one that comes sooner: how many steps "
          "train on a stale model then depends neither on the link nor on the machine's load "
          "(runs to compare; on a slow link, a bound that costs waiting). 0: as soon as it "
          "comes.");
ABSL_FLAG(std::string, hierarchy, "off",
          "on: a round whose participants sit in more than one zone (the workers' --zone) "
          "averages inside each zone first, then among the zones' heads only, then copies the "
          "result back down, so long links carry one model per zone (docs/SUPERNODES.md). Composes "
          "with every codec, outer optimizer and aggregation rule. off: every round is flat.");
ABSL_FLAG(std::string, relay, "off",
          "on: the members of a zone with an elected supernode open their session and make their "
          "round calls through that supernode, which carries them over one Relay stream; a "
          "member whose relay fails goes back to a direct session (docs/SUPERNODES.md "
          "\"Relay\"). Synchronous mode only. off: every worker talks to the coordinator "
          "directly.");
ABSL_FLAG(std::string, data_split, "iid",
          "How training data is split across data ranks: iid or label_skew:ALPHA (Dirichlet).");
ABSL_FLAG(bool, sample_ledger, false,
          "Synchronous rounds: the coordinator hands every participant the samples it trains "
          "in each round from a ledger of the run's epochs, and the samples of lost work "
          "(evicted, killed, sitting out, aborted rounds) are trained again in a later round: "
          "every sample is trained exactly once per epoch (docs/DATA.md). Needs the built-in "
          "trainer and --data_split=iid; turns --fold_late_work off.");
ABSL_FLAG(uint32_t, epochs, 0,
          "With --sample_ledger: finish the run once this many epochs are trained (0 = no "
          "limit; --rounds still applies).");
ABSL_FLAG(double, audit_rate, 0,
          "Audits by replay (docs/SECURITY.md \"Audits, scores and bans\"): the probability "
          "that a participant's round is replayed by another member and its contribution hash "
          "compared. Synchronous rounds with the built-in trainer; turns --sample_ledger on. "
          "0 = off.");
ABSL_FLAG(uint32_t, audit_threads, 0,
          "Torch intra-op threads every worker of an audited run trains and replays with "
          "(0 = 1 when audits are on).");
ABSL_FLAG(double, ban_below, 0,
          "A member whose score (1 at the start; a failed audit costs 1) falls below this is "
          "banned from the run for --ban_seconds. 0 = 0.5 in audited runs, never otherwise.");
ABSL_FLAG(uint32_t, ban_seconds, 0, "How long a ban lasts (0 = 3600).");
ABSL_FLAG(std::string, audit_seed, "",
          "Tests only: a fixed secret for the audit draw (default: 32 random bytes at each "
          "start, so that nobody can tell which rounds will be audited).");
ABSL_FLAG(std::string, mode, "sync",
          "sync: synchronous rounds. gossip: no rounds; workers train without stopping and "
          "average pair-wise with peers (dpwa, docs/GOSSIP.md); the coordinator keeps "
          "membership and status.");
ABSL_FLAG(uint32_t, gossip_every, 10,
          "Gossip: a worker publishes its model and may start a fetch every N local steps.");
ABSL_FLAG(double, fetch_probability, 1.0,
          "Gossip: probability of starting a fetch of a peer's model every --gossip_every "
          "steps.");
ABSL_FLAG(absl::Duration, gossip_timeout, absl::Seconds(5),
          "Gossip: a whole fetch of a peer's model must end within this.");
ABSL_FLAG(std::string, interpolation, "constant:0.5",
          "Gossip: factor a of params += a * (peer - params): constant:A (0 < A <= 1), clock "
          "(peer_clock / (clock + peer_clock)) or loss (loss / (loss + peer_loss)).");
ABSL_FLAG(double, divergence_threshold, 0,
          "Gossip: when > 0 and a worker's loss is below it, a is scaled by loss / threshold "
          "(0 = off).");
ABSL_FLAG(uint32_t, gossip_checkpoint_every, 1000,
          "Gossip with --checkpoint_store: the checkpointer (one gossiping worker the "
          "coordinator picks) uploads its current model every N of its local steps, at the "
          "first publication at or past each multiple of N; 0 = never.");
ABSL_FLAG(uint64_t, gossip_steps, 0,
          "Gossip: local steps each worker trains before it leaves (0 = until stopped).");
ABSL_FLAG(uint32_t, consensus_eval_every, 0,
          "Gossip: every N of its publications, one worker (the one that trained the most "
          "steps) fetches every peer's current model and evaluates their average (the "
          "consensus model; status: consensus_test_accuracy); 0 = off.");
ABSL_FLAG(bool, gossip_final_average, true,
          "Gossip with --gossip_steps: the run ends with one model: when every worker trained "
          "its steps, each averages all workers' final models in the same order, so all hold "
          "the same bits (a done worker waits at most --round_timeout for the others). "
          "false = each worker leaves with its own model.");

namespace {

using shoal::RunConfigFlag;
using shoal::v1::RunConfig;
using Mode = RunConfigFlag::Mode;

absl::StatusOr<uint32_t> Ms(const char* flag, absl::Duration d) {
  if (d < absl::ZeroDuration() || d > absl::Milliseconds(std::numeric_limits<uint32_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", absl::FormatDuration(d), " must be between 0 and 49 days"));
  }
  return static_cast<uint32_t>(absl::ToInt64Milliseconds(d));
}

absl::StatusOr<bool> OnOff(const char* flag, const std::string& v) {
  if (v != "on" && v != "off") {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", v, " is not one of on, off"));
  }
  return v == "on";
}

// A flag that sets a run-config key: `set` gets the flag's current value.
template <typename T, typename Set>
RunConfigFlag Key(const absl::Flag<T>& flag, std::string key, Mode mode, Set set) {
  const std::string name(absl::GetFlagReflectionHandle(flag).Name());
  RunConfigFlag f;
  f.flag = name;
  f.key = std::move(key);
  f.mode = mode;
  // Abseil 20220623 has no public "was this flag given" (the method of
  // CommandLineFlag is private); this is what its own --flagfile handling
  // asks, and it counts flags from a --flagfile too.
  f.given = absl::flags_internal::WasPresentOnCommandLine(name);
  f.apply = [&flag, set](RunConfig* c) -> absl::Status { return set(c, absl::GetFlag(flag)); };
  return f;
}

template <typename T, typename Set>
RunConfigFlag Key(const absl::Flag<T>& flag, std::string key, Set set) {
  return Key(flag, std::move(key), Mode::kAny, set);
}

// Every flag that sets a key of the run config (docs/CONFIG.md has the same
// table for operators).
std::vector<RunConfigFlag> RunConfigFlags() {
  return {
      Key(FLAGS_mode, "mode",
          [](RunConfig* c, const std::string& v) {
            if (v == "gossip") {
              c->mutable_gossip();
            } else if (v == "sync") {
              c->mutable_sync();
            } else {
              return absl::InvalidArgumentError(
                  absl::StrCat("--mode=", v, " is not one of sync, gossip"));
            }
            return absl::OkStatus();
          }),
      Key(FLAGS_model, "model.name",
          [](RunConfig* c, const std::string& v) {
            shoal::v1::ModelConfig* m = c->mutable_model();
            constexpr absl::string_view kTorchScript = "torchscript:";
            if (absl::StartsWith(v, kTorchScript)) {
              m->set_name("torchscript");
              m->set_file(v.substr(kTorchScript.size()));
            } else {
              m->set_name(v);
              m->clear_file();
            }
            // Computed from the file at start.
            m->clear_file_sha256();
            m->clear_file_bytes();
            return absl::OkStatus();
          }),
      Key(FLAGS_input_shape, "model.input_shape",
          [](RunConfig* c, const std::string& v) -> absl::Status {
            // Only a TorchScript model has one; a file that names one and
            // gives no shape takes the flag's (see main).
            if (c->model().name() != "torchscript") return absl::OkStatus();
            absl::StatusOr<std::vector<int64_t>> shape = shoal::ParseInputShape(v);
            if (!shape.ok()) return shape.status();
            c->mutable_model()->clear_input_shape();
            for (int64_t d : *shape) c->mutable_model()->add_input_shape(static_cast<uint32_t>(d));
            return absl::OkStatus();
          }),
      Key(FLAGS_optimizer, "training.optimizer",
          [](RunConfig* c, const std::string& v) {
            c->mutable_training()->set_optimizer(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_learning_rate, "training.learning_rate",
          [](RunConfig* c, double v) {
            c->mutable_training()->set_learning_rate(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_momentum, "training.momentum",
          [](RunConfig* c, double v) {
            c->mutable_training()->set_momentum(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_batch_size, "training.batch_size",
          [](RunConfig* c, uint32_t v) {
            c->mutable_training()->set_batch_size(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_local_steps, "training.local_steps",
          [](RunConfig* c, uint32_t v) {
            c->mutable_training()->set_local_steps(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_seed, "training.seed",
          [](RunConfig* c, uint64_t v) {
            c->mutable_training()->set_seed(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_data_shards, "training.data_shards",
          [](RunConfig* c, uint32_t v) {
            // 0: sync.min_participants (NormalizeRunConfig). Gossip has no
            // quorum; there --min_participants keeps meaning the shards, as
            // it did before the run config had groups.
            if (v == 0 && c->has_gossip()) v = absl::GetFlag(FLAGS_min_participants);
            c->mutable_training()->set_data_shards(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_data_split, "training.data_split",
          [](RunConfig* c, const std::string& v) {
            c->mutable_training()->set_data_split(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_sample_ledger, "training.sample_ledger",
          [](RunConfig* c, bool v) {
            c->mutable_training()->set_sample_ledger(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_epochs, "training.epochs",
          [](RunConfig* c, uint32_t v) {
            c->mutable_training()->set_epochs(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_audit_rate, "trust.audit_rate",
          [](RunConfig* c, double v) {
            c->mutable_trust()->set_audit_rate(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_audit_threads, "trust.audit_threads",
          [](RunConfig* c, uint32_t v) {
            c->mutable_trust()->set_audit_threads(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_ban_below, "trust.ban_below",
          [](RunConfig* c, double v) {
            c->mutable_trust()->set_ban_below(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_ban_seconds, "trust.ban_seconds",
          [](RunConfig* c, uint32_t v) {
            c->mutable_trust()->set_ban_seconds(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_eval_every, "training.eval_every",
          [](RunConfig* c, uint32_t v) {
            c->mutable_training()->set_eval_every(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_min_participants, "sync.min_participants", Mode::kSync,
          [](RunConfig* c, uint32_t v) {
            c->mutable_sync()->set_min_participants(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_rounds, "sync.rounds", Mode::kSync,
          [](RunConfig* c, uint64_t v) {
            c->mutable_sync()->set_rounds(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_fold_late_work, "sync.fold_late_work", Mode::kSync,
          [](RunConfig* c, bool v) {
            c->mutable_sync()->set_fold_late_work(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_max_staleness, "sync.max_staleness", Mode::kSync,
          [](RunConfig* c, uint32_t v) {
            c->mutable_sync()->set_max_staleness(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_gossip_every, "gossip.every", Mode::kGossip,
          [](RunConfig* c, uint32_t v) {
            c->mutable_gossip()->set_every(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_fetch_probability, "gossip.fetch_probability", Mode::kGossip,
          [](RunConfig* c, double v) {
            c->mutable_gossip()->set_fetch_probability(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_gossip_timeout, "gossip.timeout_ms", Mode::kGossip,
          [](RunConfig* c, absl::Duration v) -> absl::Status {
            absl::StatusOr<uint32_t> v_ms = Ms("gossip_timeout", v);
            if (!v_ms.ok()) return v_ms.status();
            c->mutable_gossip()->set_timeout_ms(*v_ms);
            return absl::OkStatus();
          }),
      Key(FLAGS_interpolation, "gossip.interpolation", Mode::kGossip,
          [](RunConfig* c, const std::string& v) {
            c->mutable_gossip()->set_interpolation(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_divergence_threshold, "gossip.divergence_threshold", Mode::kGossip,
          [](RunConfig* c, double v) {
            c->mutable_gossip()->set_divergence_threshold(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_gossip_steps, "gossip.steps", Mode::kGossip,
          [](RunConfig* c, uint64_t v) {
            c->mutable_gossip()->set_steps(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_gossip_final_average, "gossip.final_average", Mode::kGossip,
          [](RunConfig* c, bool v) {
            c->mutable_gossip()->set_final_average(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_consensus_eval_every, "gossip.consensus_eval_every", Mode::kGossip,
          [](RunConfig* c, uint32_t v) {
            c->mutable_gossip()->set_consensus_eval_every(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_gossip_checkpoint_every, "gossip.checkpoint_every", Mode::kGossip,
          [](RunConfig* c, uint32_t v) {
            c->mutable_gossip()->set_checkpoint_every(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_codec, "exchange.codec",
          [](RunConfig* c, const std::string& v) {
            c->mutable_exchange()->set_codec(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_outer_optimizer, "exchange.outer_optimizer.kind",
          [](RunConfig* c, const std::string& v) {
            c->mutable_exchange()->mutable_outer_optimizer()->set_kind(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_outer_lr, "exchange.outer_optimizer.lr",
          [](RunConfig* c, double v) {
            c->mutable_exchange()->mutable_outer_optimizer()->set_lr(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_outer_momentum, "exchange.outer_optimizer.momentum",
          [](RunConfig* c, double v) {
            c->mutable_exchange()->mutable_outer_optimizer()->set_momentum(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_aggregation, "exchange.aggregation",
          [](RunConfig* c, const std::string& v) {
            c->mutable_exchange()->set_aggregation(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_overlap, "exchange.overlap",
          [](RunConfig* c, const std::string& v) -> absl::Status {
            absl::StatusOr<bool> on = OnOff("overlap", v);
            if (!on.ok()) return on.status();
            c->mutable_exchange()->set_overlap(*on);
            return absl::OkStatus();
          }),
      Key(FLAGS_fragments, "exchange.fragments",
          [](RunConfig* c, uint32_t v) {
            c->mutable_exchange()->set_fragments(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_overlap_start, "exchange.overlap_start",
          [](RunConfig* c, const std::string& v) {
            c->mutable_exchange()->set_overlap_start(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_overlap_stale_steps, "exchange.overlap_stale_steps",
          [](RunConfig* c, uint32_t v) {
            c->mutable_exchange()->set_overlap_stale_steps(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_hierarchy, "topology.hierarchy",
          [](RunConfig* c, const std::string& v) -> absl::Status {
            absl::StatusOr<bool> on = OnOff("hierarchy", v);
            if (!on.ok()) return on.status();
            c->mutable_topology()->set_hierarchy(*on);
            return absl::OkStatus();
          }),
      Key(FLAGS_relay, "topology.relay",
          [](RunConfig* c, const std::string& v) -> absl::Status {
            absl::StatusOr<bool> on = OnOff("relay", v);
            if (!on.ok()) return on.status();
            c->mutable_topology()->set_relay(*on);
            return absl::OkStatus();
          }),
      Key(FLAGS_heartbeat_interval, "timeouts.heartbeat_interval_ms",
          [](RunConfig* c, absl::Duration v) -> absl::Status {
            absl::StatusOr<uint32_t> v_ms = Ms("heartbeat_interval", v);
            if (!v_ms.ok()) return v_ms.status();
            c->mutable_timeouts()->set_heartbeat_interval_ms(*v_ms);
            return absl::OkStatus();
          }),
      Key(FLAGS_heartbeat_lease, "timeouts.heartbeat_lease_ms",
          [](RunConfig* c, absl::Duration v) -> absl::Status {
            absl::StatusOr<uint32_t> v_ms = Ms("heartbeat_lease", v);
            if (!v_ms.ok()) return v_ms.status();
            c->mutable_timeouts()->set_heartbeat_lease_ms(*v_ms);
            return absl::OkStatus();
          }),
      Key(FLAGS_connection_timeout, "timeouts.connection_timeout_ms",
          [](RunConfig* c, absl::Duration v) -> absl::Status {
            absl::StatusOr<uint32_t> v_ms = Ms("connection_timeout", v);
            if (!v_ms.ok()) return v_ms.status();
            c->mutable_timeouts()->set_connection_timeout_ms(*v_ms);
            return absl::OkStatus();
          }),
      Key(FLAGS_round_timeout, "timeouts.round_timeout_ms",
          [](RunConfig* c, absl::Duration v) -> absl::Status {
            absl::StatusOr<uint32_t> v_ms = Ms("round_timeout", v);
            if (!v_ms.ok()) return v_ms.status();
            c->mutable_timeouts()->set_round_timeout_ms(*v_ms);
            return absl::OkStatus();
          }),
      Key(FLAGS_max_connection_retry, "timeouts.max_connection_retry",
          [](RunConfig* c, uint32_t v) {
            c->mutable_timeouts()->set_max_connection_retry(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_max_missed_rounds, "timeouts.max_missed_rounds",
          [](RunConfig* c, uint32_t v) {
            c->mutable_timeouts()->set_max_missed_rounds(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_adaptive_deadline, "timeouts.adaptive_deadline.enabled",
          [](RunConfig* c, bool v) {
            c->mutable_timeouts()->mutable_adaptive_deadline()->set_enabled(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_adaptive_deadline_rounds, "timeouts.adaptive_deadline.rounds",
          [](RunConfig* c, uint32_t v) {
            c->mutable_timeouts()->mutable_adaptive_deadline()->set_rounds(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_deadline_factor, "timeouts.adaptive_deadline.factor",
          [](RunConfig* c, double v) {
            c->mutable_timeouts()->mutable_adaptive_deadline()->set_factor(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_deadline_floor, "timeouts.adaptive_deadline.floor_ms",
          [](RunConfig* c, absl::Duration v) -> absl::Status {
            absl::StatusOr<uint32_t> v_ms = Ms("deadline_floor", v);
            if (!v_ms.ok()) return v_ms.status();
            c->mutable_timeouts()->mutable_adaptive_deadline()->set_floor_ms(*v_ms);
            return absl::OkStatus();
          }),
      Key(FLAGS_checkpoint_timeout, "timeouts.checkpoint_timeout_ms",
          [](RunConfig* c, absl::Duration v) -> absl::Status {
            absl::StatusOr<uint32_t> v_ms = Ms("checkpoint_timeout", v);
            if (!v_ms.ok()) return v_ms.status();
            c->mutable_timeouts()->set_checkpoint_timeout_ms(*v_ms);
            return absl::OkStatus();
          }),
      Key(FLAGS_supernode_switch_factor, "timeouts.election.switch_factor",
          [](RunConfig* c, double v) {
            c->mutable_timeouts()->mutable_election()->set_switch_factor(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_supernode_switch_rounds, "timeouts.election.switch_rounds",
          [](RunConfig* c, uint32_t v) {
            c->mutable_timeouts()->mutable_election()->set_switch_rounds(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_supernode_min_tenure, "timeouts.election.min_tenure_ms",
          [](RunConfig* c, absl::Duration v) -> absl::Status {
            absl::StatusOr<uint32_t> v_ms = Ms("supernode_min_tenure", v);
            if (!v_ms.ok()) return v_ms.status();
            c->mutable_timeouts()->mutable_election()->set_min_tenure_ms(*v_ms);
            return absl::OkStatus();
          }),
      Key(FLAGS_checkpoint_store, "checkpoints.store",
          [](RunConfig* c, const std::string& v) {
            c->mutable_checkpoints()->set_store(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_checkpoint_every, "checkpoints.every",
          [](RunConfig* c, uint32_t v) {
            c->mutable_checkpoints()->set_every(v);
            return absl::OkStatus();
          }),
      Key(FLAGS_checkpointers, "checkpoints.checkpointers",
          [](RunConfig* c, uint32_t v) {
            c->mutable_checkpoints()->set_checkpointers(v);
            return absl::OkStatus();
          }),
  };
}

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
        shoal::ParseInputShape(absl::GetFlag(FLAGS_input_shape));
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
      shoal::MergeRunConfig(RunConfigFlags(), file ? &*file : nullptr);
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
  shoal::UseFlagsOfFileForHelp(__FILE__, {shoal::TlsFlagsFile()});
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
