// shoal-coordinator: membership, rounds, shard plans and run status.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/flags_usage.h"
#include "common/logging.h"
#include "common/model_file.h"
#include "common/mutex_mode.h"
#include "common/run_options.h"
#include "common/sha256.h"
#include "common/signals.h"
#include "common/tls_flags.h"
#include "services/coordinator/coordinator_server.h"
#include "services/coordinator/core/gossip_status.h"
#include "services/worker/core/torchscript_model.h"

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
          "Model every worker trains: mlp or cnn (built in), or torchscript:PATH (a file written "
          "by torch.jit.script(model).save(PATH); checked here at start, served to the workers, "
          "which verify its SHA-256).");
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
ABSL_FLAG(uint32_t, checkpointers, 1,
          "Workers tried, one after the other, for each checkpoint upload before giving up.");
ABSL_FLAG(absl::Duration, checkpoint_timeout, absl::Seconds(120),
          "An upload not reported within this time moves to another worker.");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Seconds(1),
          "Heartbeat period the workers keep on their session.");
ABSL_FLAG(std::string, codec, "fp32",
          "How each round's change travels between workers: fp32, fp16, bf16, int8 (a scale per "
          "256 elements), topk:F or randomk:F (a fraction F of the elements, error feedback). "
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
ABSL_FLAG(std::string, hierarchy, "off",
          "on: a round whose participants sit in more than one zone (the workers' --zone) "
          "averages inside each zone first, then among the zones' heads only, then copies the "
          "result back down, so long links carry one model per zone (docs/SUPERNODES.md). Needs "
          "--codec=fp32, --outer_optimizer=none and --aggregation=mean. off: every round is flat.");
ABSL_FLAG(std::string, relay, "off",
          "on: the members of a zone with an elected supernode open their session and make their "
          "round calls through that supernode, which carries them over one Relay stream; a "
          "member whose relay fails goes back to a direct session (docs/SUPERNODES.md "
          "\"Relay\"). Synchronous mode only. off: every worker talks to the coordinator "
          "directly.");
ABSL_FLAG(std::string, data_split, "iid",
          "How training data is split across data ranks: iid or label_skew:ALPHA (Dirichlet).");
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

int main(int argc, char** argv) {
  shoal::DisableMutexDeadlockDetection();
  absl::SetProgramUsageMessage(
      "keeps membership, rounds and status of a Shoal training run.\n"
      "Usage: shoal-coordinator --listen=127.0.0.1:50051 --min_participants=3 --local_steps=50 "
      "--rounds=20");
  shoal::UseFlagsOfFileForHelp(__FILE__, {shoal::TlsFlagsFile()});
  absl::ParseCommandLine(argc, argv);
  shoal::SetLogTag("coordinator");
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
    engine.run_id = absl::StrFormat("run-%d-%04x", absl::ToUnixSeconds(absl::Now()), rd() & 0xFFFF);
  }
  engine.heartbeat_lease = absl::GetFlag(FLAGS_heartbeat_lease);
  engine.session_grace = absl::GetFlag(FLAGS_heartbeat_lease);
  engine.round_timeout = absl::GetFlag(FLAGS_round_timeout);
  engine.connection_timeout = absl::GetFlag(FLAGS_connection_timeout);
  engine.max_connection_retry = absl::GetFlag(FLAGS_max_connection_retry);
  engine.max_missed_rounds = absl::GetFlag(FLAGS_max_missed_rounds);
  engine.max_members = absl::GetFlag(FLAGS_max_members);
  engine.join_probe_timeout = absl::GetFlag(FLAGS_probe_joiners_timeout);
  options.max_joins_per_minute = absl::GetFlag(FLAGS_max_joins_per_minute);
  options.relay.max_members = absl::GetFlag(FLAGS_relay_max_members);
  options.relay.max_batch = absl::GetFlag(FLAGS_relay_max_batch);
  engine.adaptive_deadline.enabled = absl::GetFlag(FLAGS_adaptive_deadline);
  engine.adaptive_deadline.after_rounds = absl::GetFlag(FLAGS_adaptive_deadline_rounds);
  engine.adaptive_deadline.factor = absl::GetFlag(FLAGS_deadline_factor);
  engine.adaptive_deadline.floor = absl::GetFlag(FLAGS_deadline_floor);
  engine.checkpointers = absl::GetFlag(FLAGS_checkpointers);
  engine.checkpoint_timeout = absl::GetFlag(FLAGS_checkpoint_timeout);
  engine.election.switch_factor = absl::GetFlag(FLAGS_supernode_switch_factor);
  engine.election.switch_evaluations = absl::GetFlag(FLAGS_supernode_switch_rounds);
  engine.election.min_tenure = absl::GetFlag(FLAGS_supernode_min_tenure);
  if (!(engine.election.switch_factor > 1) || !std::isfinite(engine.election.switch_factor) ||
      engine.election.switch_evaluations < 1 ||
      engine.election.min_tenure < absl::ZeroDuration()) {
    SHOAL_LOG(ERROR) << "--supernode_switch_factor must be a number > 1, "
                        "--supernode_switch_rounds at least 1 and --supernode_min_tenure not "
                        "negative";
    return 2;
  }
  auto& c = engine.config;
  c.set_model(absl::GetFlag(FLAGS_model));
  c.set_optimizer(absl::GetFlag(FLAGS_optimizer));
  if (absl::StartsWith(c.model(), "torchscript:")) {
    const std::string path = c.model().substr(strlen("torchscript:"));
    absl::StatusOr<std::vector<int64_t>> parsed_shape =
        shoal::ParseInputShape(absl::GetFlag(FLAGS_input_shape));
    if (!parsed_shape.ok()) {
      SHOAL_LOG(ERROR) << parsed_shape.status().message();
      return 2;
    }
    const std::vector<int64_t>& shape = *parsed_shape;
    absl::StatusOr<std::string> bytes = shoal::worker::ReadModelFile(path);
    if (!bytes.ok()) {
      SHOAL_LOG(ERROR) << "cannot start: --model=torchscript:" << path << ": "
                       << bytes.status().message();
      return 2;
    }
    if (bytes->size() > shoal::kMaxModelFileBytes) {
      SHOAL_LOG(ERROR) << "cannot start: " << path << " has " << bytes->size()
                       << " bytes, more than the limit of " << shoal::kMaxModelFileBytes;
      return 2;
    }
    absl::StatusOr<shoal::worker::TorchScriptSummary> summary =
        shoal::worker::CheckTorchScriptModel(*bytes, shape, path);
    if (!summary.ok()) {
      SHOAL_LOG(ERROR) << "cannot start: " << summary.status().message();
      return 2;
    }
    c.set_model("torchscript");
    c.set_model_file_sha256(shoal::Sha256Hex(bytes->data(), bytes->size()));
    c.set_model_file_bytes(bytes->size());
    for (int64_t v : shape) c.add_input_shape(static_cast<uint32_t>(v));
    SHOAL_LOG(INFO) << "TorchScript model " << path << ": " << bytes->size() << " bytes, SHA-256 "
                    << c.model_file_sha256() << ", " << summary->parameter_tensors
                    << " trainable tensors (" << summary->parameters << " parameters), "
                    << summary->float_buffers << " float buffers, " << summary->integer_buffers
                    << " integer buffers, " << summary->output_shape.back() << " outputs";
    options.model_file = std::move(*bytes);
  }
  c.set_learning_rate(absl::GetFlag(FLAGS_learning_rate));
  c.set_momentum(absl::GetFlag(FLAGS_momentum));
  c.set_batch_size(absl::GetFlag(FLAGS_batch_size));
  c.set_local_steps(absl::GetFlag(FLAGS_local_steps));
  c.set_min_participants(absl::GetFlag(FLAGS_min_participants));
  c.set_rounds(absl::GetFlag(FLAGS_rounds));
  c.set_seed(absl::GetFlag(FLAGS_seed));
  const uint32_t shards = absl::GetFlag(FLAGS_data_shards);
  c.set_data_shards(shards == 0 ? c.min_participants() : shards);
  c.set_eval_every(absl::GetFlag(FLAGS_eval_every));
  c.set_checkpoint_store(absl::GetFlag(FLAGS_checkpoint_store));
  c.set_checkpoint_every(absl::GetFlag(FLAGS_checkpoint_every));
  c.set_connection_timeout_ms(absl::ToInt64Milliseconds(absl::GetFlag(FLAGS_connection_timeout)));
  c.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(absl::GetFlag(FLAGS_heartbeat_interval)));
  c.set_codec(absl::GetFlag(FLAGS_codec));
  c.set_outer_optimizer(absl::GetFlag(FLAGS_outer_optimizer));
  c.set_outer_lr(absl::GetFlag(FLAGS_outer_lr));
  c.set_outer_momentum(absl::GetFlag(FLAGS_outer_momentum));
  c.set_data_split(absl::GetFlag(FLAGS_data_split));
  c.set_aggregation(absl::GetFlag(FLAGS_aggregation));
  const std::string hierarchy = absl::GetFlag(FLAGS_hierarchy);
  if (hierarchy != "on" && hierarchy != "off") {
    SHOAL_LOG(ERROR) << "--hierarchy=" << hierarchy << " is not one of on, off";
    return 2;
  }
  c.set_hierarchy(hierarchy == "on");
  const std::string relay = absl::GetFlag(FLAGS_relay);
  if (relay != "on" && relay != "off") {
    SHOAL_LOG(ERROR) << "--relay=" << relay << " is not one of on, off";
    return 2;
  }
  c.set_relay(relay == "on");
  c.set_fold_late_work(absl::GetFlag(FLAGS_fold_late_work));
  c.set_max_staleness(absl::GetFlag(FLAGS_max_staleness));

  c.set_mode(absl::GetFlag(FLAGS_mode));
  if (c.mode() != "sync" && c.mode() != "gossip") {
    SHOAL_LOG(ERROR) << "--mode=" << c.mode() << " is not one of sync, gossip";
    return 2;
  }
  if (c.mode() == "gossip") {
    c.set_gossip_every(std::max<uint32_t>(1, absl::GetFlag(FLAGS_gossip_every)));
    c.set_fetch_probability(absl::GetFlag(FLAGS_fetch_probability));
    c.set_gossip_timeout_ms(
        std::max<int64_t>(1, absl::ToInt64Milliseconds(absl::GetFlag(FLAGS_gossip_timeout))));
    c.set_interpolation(absl::GetFlag(FLAGS_interpolation));
    c.set_divergence_threshold(absl::GetFlag(FLAGS_divergence_threshold));
    c.set_gossip_steps(absl::GetFlag(FLAGS_gossip_steps));
    c.set_gossip_final_average(c.gossip_steps() > 0 && absl::GetFlag(FLAGS_gossip_final_average));
    c.set_consensus_eval_every(absl::GetFlag(FLAGS_consensus_eval_every));
    c.set_gossip_final_wait_ms(static_cast<uint32_t>(std::clamp<int64_t>(
        absl::ToInt64Milliseconds(absl::GetFlag(FLAGS_round_timeout)), 1, 1LL << 31)));
    // One field, two units: rounds in synchronous mode, the checkpointer's
    // local steps in gossip mode.
    c.set_checkpoint_every(absl::GetFlag(FLAGS_gossip_checkpoint_every));
    if (absl::Status s = shoal::coordinator::ValidateGossipConfig(c); !s.ok()) {
      SHOAL_LOG(ERROR) << s.message();
      return 2;
    }
  }

  auto server = shoal::coordinator::CoordinatorServer::Start(options, shoal::RealClock::Get());
  if (!server.ok()) {
    SHOAL_LOG(ERROR) << "cannot start: " << server.status().message();
    return 2;
  }
  SHOAL_LOG(INFO) << "shoal-coordinator listening on " << (*server)->address()
                  << " run_id=" << engine.run_id << " model=" << c.model()
                  << " min_participants=" << c.min_participants()
                  << " local_steps=" << c.local_steps() << " rounds=" << c.rounds()
                  << " codec=" << c.codec() << " outer_optimizer=" << c.outer_optimizer()
                  << " data_split=" << c.data_split() << " aggregation=" << c.aggregation()
                  << " hierarchy=" << (c.hierarchy() ? "on" : "off")
                  << " relay=" << (c.relay() ? "on" : "off") << " mode=" << c.mode();
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
