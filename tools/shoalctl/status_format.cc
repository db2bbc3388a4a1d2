#include "tools/shoalctl/status_format.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/worker_state.h"

namespace shoal::ctl {

std::string PhaseName(shoal::v1::Phase phase) { return shoal::v1::Phase_Name(phase); }

std::string JsonQuote(absl::string_view s) {
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

namespace {
// The worker as a row names it: its id, and its --name when it gave one.
std::string Who(const shoal::v1::WorkerStatus& w) {
  return w.name().empty() ? w.id() : absl::StrCat(w.id(), " (", w.name(), ")");
}

// Width of the ID column: the longest id with its name, at least 5.
int WhoWidth(const shoal::v1::RunStatus& s) {
  size_t width = 5;
  for (const auto& w : s.workers()) width = std::max(width, Who(w).size());
  return static_cast<int>(width);
}

// The workers in the order the tables list them: members first, then the
// departed; each by the number in its id (w2 before w10).
std::vector<const shoal::v1::WorkerStatus*> SortedWorkers(const shoal::v1::RunStatus& s) {
  std::vector<const shoal::v1::WorkerStatus*> out;
  for (const auto& w : s.workers()) out.push_back(&w);
  const auto key = [](const shoal::v1::WorkerStatus* w) {
    uint64_t n = 0;
    if (w->id().size() < 2 || !absl::SimpleAtoi(w->id().substr(1), &n)) n = UINT64_MAX;
    return std::make_tuple(DepartedState(w->state()), n, w->id());
  };
  std::stable_sort(out.begin(), out.end(),
                   [&](const auto* a, const auto* b) { return key(a) < key(b); });
  return out;
}

// Gossip mode: no rounds or agreed hash; per worker its clock, loss,
// accuracy, fetches and last partner, and the run's consensus distance.
std::string FormatGossipTable(const shoal::v1::RunStatus& s) {
  std::string out = absl::StrFormat("run %s  phase %s  mode gossip  members %d\n", s.run_id(),
                                    PhaseName(s.phase()), s.members());
  if (!s.detail().empty()) absl::StrAppend(&out, "  ", s.detail(), "\n");
  absl::StrAppend(&out, "  ", FormatConsensus(s), "\n");
  if (!s.final_average().empty())
    absl::StrAppend(&out, "  final average: ", s.final_average(), "\n");
  if (!s.config().checkpoints().store().empty()) {
    absl::StrAppend(&out, "  checkpointer ", s.checkpointer().empty() ? "-" : s.checkpointer(),
                    " (every ", s.config().gossip().checkpoint_every(), " local steps)  latest ",
                    s.checkpoint_id().empty() ? "-" : s.checkpoint_id());
    if (!s.checkpoint_worker().empty()) {
      absl::StrAppend(&out, absl::StrFormat(" by %s at %d steps, clock %.0f", s.checkpoint_worker(),
                                            s.checkpoint_steps(), s.checkpoint_clock()));
    }
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppend(
      &out, absl::StrFormat("%-*s %-22s %-9s %-8s %-10s %-8s %-9s %-13s %-8s %-7s "
                            "%-8s %s\n",
                            WhoWidth(s), "ID", "ADDRESS", "STATE", "STEPS", "CLOCK", "LOSS",
                            "TEST_ACC", "FETCH_OK/TO/X", "PARTNER", "FACTOR", "SEEN", "REASON"));
  for (const shoal::v1::WorkerStatus* row : SortedWorkers(s)) {
    const shoal::v1::WorkerStatus& w = *row;
    const bool active = !DepartedState(w.state());
    absl::StrAppend(
        &out,
        absl::StrFormat(
            "%-*s %-22s %-9s %-8d %-10.0f %-8.4f %-9s %-13s %-8s %-7s %-8s %s\n", WhoWidth(s),
            Who(w), w.address(), w.state(), w.gossip_steps(), w.gossip_clock(), w.gossip_loss(),
            w.eval_clock() > 0 ? absl::StrFormat("%.4f", w.test_accuracy()) : "-",
            absl::StrCat(w.fetches_done(), "/", w.fetches_timed_out(), "/", w.fetches_failed()),
            w.last_partner().empty() ? "-" : w.last_partner(),
            w.last_partner().empty() ? "-" : absl::StrFormat("%.3f", w.last_factor()),
            active ? absl::StrCat(w.last_seen_ms_ago(), "ms") : "-", w.reason()));
  }
  return out;
}

// Mean of the workers' latest test accuracy / loss (those that evaluated).
void GossipAccuracy(const shoal::v1::RunStatus& s, double* accuracy, double* loss, int* n) {
  *accuracy = *loss = 0;
  *n = 0;
  for (const auto& w : s.workers()) {
    if (w.state() == "evicted" || w.eval_clock() <= 0) continue;
    *accuracy += w.test_accuracy();
    *loss += w.test_loss();
    ++*n;
  }
  if (*n > 0) {
    *accuracy /= *n;
    *loss /= *n;
  }
}

// The final average's hash when every worker that reported one holds the
// same (empty: none reported, or they differ).
std::string FinalHash(const shoal::v1::RunStatus& s) {
  std::string hash;
  for (const auto& w : s.workers()) {
    if (w.state() == "evicted" || w.model_hash().empty()) continue;
    if (!hash.empty() && w.model_hash() != hash) return "";
    hash = w.model_hash();
  }
  return hash;
}
}  // namespace

bool IsGossip(const shoal::v1::RunStatus& s) { return s.config().has_gossip(); }

std::string FormatConsensus(const shoal::v1::RunStatus& s) {
  std::string out =
      s.consensus_distance() < 0 || s.consensus_workers() < 2
          ? absl::StrCat("consensus_distance - (", s.consensus_workers(), " projections)")
          : absl::StrFormat("consensus_distance %.5f (%d workers)", s.consensus_distance(),
                            s.consensus_workers());
  if (s.consensus_models() > 0) {
    absl::StrAppend(&out, absl::StrFormat("  consensus_accuracy %.4f (%d models, by %s)",
                                          s.consensus_test_accuracy(), s.consensus_models(),
                                          s.consensus_worker()));
  }
  return out;
}

std::string FormatGossipLine(const shoal::v1::RunStatus& s) {
  std::string out = "gossip:";
  for (const auto& w : s.workers()) {
    if (DepartedState(w.state()) || !w.gossip()) continue;
    absl::StrAppend(
        &out, absl::StrFormat(" %s[steps=%d acc=%s fetches=%d]", w.id(), w.gossip_steps(),
                              w.eval_clock() > 0 ? absl::StrFormat("%.4f", w.test_accuracy()) : "-",
                              w.fetches_done()));
  }
  absl::StrAppend(&out, "  ", FormatConsensus(s));
  return out;
}

namespace {

// TRAIN, READY and the like: "1.25s", or "-" when not measured.
std::string Seconds(double v) { return v > 0 ? absl::StrFormat("%.2fs", v) : "-"; }

// The run's lines above the tables: phase and round, what it waits for or
// why it stopped, aggregation, replica, agreed hash, checkpoints, the
// sample ledger and the ready deadline.
std::string FormatRunLines(const shoal::v1::RunStatus& s) {
  std::string out = absl::StrFormat(
      "run %s  phase %s  round %d  last_completed_round %d  min_participants %d  members %d\n",
      s.run_id(), PhaseName(s.phase()), s.round(), s.last_completed_round(), s.min_participants(),
      s.members());
  if (!s.detail().empty()) absl::StrAppend(&out, "  ", s.detail(), "\n");
  if (!s.error().empty()) absl::StrAppend(&out, "  STOPPED: ", s.error(), "\n");
  if (!s.base_fallback().empty()) absl::StrAppend(&out, "  went back: ", s.base_fallback(), "\n");
  // Robust aggregation (issue 14): shown when it is not the plain mean.
  if (const std::string& agg = s.config().exchange().aggregation(); !agg.empty() && agg != "mean") {
    absl::StrAppend(&out, "  aggregation ", agg, " at slice owners\n");
  }
  if (!s.replica_role().empty()) {
    absl::StrAppend(&out, "  replica ", s.replica_role(), "  leader ",
                    s.leader().empty() ? "(none)" : s.leader(),
                    s.replica_role() == "standby" ? "  (a standby's view from the run record)" : "",
                    "\n");
  }
  if (!s.model_hash().empty()) {
    absl::StrAppend(&out, "  model_hash ", s.model_hash(), " (round ", s.last_completed_round(),
                    ")\n");
  }
  // Checkpoints: the latest and the one being uploaded.
  if (!s.config().checkpoints().store().empty() || !s.checkpoint_id().empty()) {
    absl::StrAppend(&out, "  checkpoint ", s.checkpoint_id().empty() ? "-" : s.checkpoint_id());
    if (s.checkpoint_round() > 0) absl::StrAppend(&out, " (round ", s.checkpoint_round(), ")");
    if (!s.config().checkpoints().store().empty()) {
      absl::StrAppend(&out, "  store ", s.config().checkpoints().store(), " every ",
                      s.config().checkpoints().every(), " rounds");
    }
    if (!s.checkpoint_pending().empty())
      absl::StrAppend(&out, "  uploading ", s.checkpoint_pending());
    absl::StrAppend(&out, "\n");
  }
  if (s.has_ledger()) {
    const shoal::v1::SampleLedger& l = s.ledger();
    uint64_t pool = 0;
    for (const auto& r : l.pool()) pool += r.count();
    absl::StrAppend(
        &out, absl::StrFormat("  ledger epoch %d at %d/%d  epochs_done %d  trained %d  lost %d  "
                              "redone %d  waiting %d  in_flight %d\n",
                              l.epoch(), l.offset(), l.dataset_samples(), l.epochs_done(),
                              l.samples_trained(), l.samples_lost(), l.samples_redone(), pool,
                              l.samples_in_flight()));
  }
  if (!s.ready_deadline_reason().empty()) {
    absl::StrAppend(&out, absl::StrFormat("  ready_deadline %.1fs after the round start (%s)\n",
                                          s.ready_deadline_seconds(), s.ready_deadline_reason()));
  }
  return out;
}

// The workers table. TRAIN: median train_seconds of its recent rounds;
// READY: median time from RoundStart to its ready report; LATE: rounds sat
// out for the adaptive deadline. Unless `wide`, workers that left, were
// lost or evicted are folded into one "departed" line (those that finished
// the run stay rows), and so are the departed the status no longer lists.
std::string FormatWorkersTable(const shoal::v1::RunStatus& s, bool wide) {
  const auto folded = [wide](const shoal::v1::WorkerStatus& w) {
    return !wide && DepartedState(w.state()) && w.state() != "finished";
  };
  std::string out = "workers:\n";
  absl::StrAppend(
      &out, absl::StrFormat("%-*s %-22s %-9s %-11s %-14s %-9s %-9s %-8s %-8s %-8s "
                            "%-5s %s\n",
                            WhoWidth(s), "ID", "ADDRESS", "STATE", "MODEL_ROUND", "MODEL_HASH",
                            "TEST_ACC", "TEST_LOSS", "TRAIN", "READY", "SEEN", "LATE", "REASON"));
  std::vector<std::string> departed;
  for (const shoal::v1::WorkerStatus* row : SortedWorkers(s)) {
    const shoal::v1::WorkerStatus& w = *row;
    const bool active = !DepartedState(w.state());
    if (folded(w)) {
      departed.push_back(absl::StrCat(
          Who(w), " ", w.state(), w.reason().empty() ? "" : absl::StrCat(" (", w.reason(), ")")));
      continue;
    }
    absl::StrAppend(
        &out, absl::StrFormat("%-*s %-22s %-9s %-11d %-14s %-9s %-9s %-8s %-8s %-8s %-5d %s\n",
                              WhoWidth(s), Who(w), w.address(), w.state(), w.model_round(),
                              w.model_hash().empty() ? "-" : w.model_hash().substr(0, 12),
                              w.metrics_round() ? absl::StrFormat("%.4f", w.test_accuracy()) : "-",
                              w.metrics_round() ? absl::StrFormat("%.4f", w.test_loss()) : "-",
                              Seconds(w.train_seconds_median()), Seconds(w.ready_seconds_median()),
                              active ? absl::StrCat(w.last_seen_ms_ago(), "ms") : "-",
                              w.rounds_late(), w.reason()));
  }
  if (!departed.empty()) {
    absl::StrAppend(&out, "departed (", departed.size(),
                    "; -o wide lists them): ", absl::StrJoin(departed, ", "), "\n");
  }
  if (s.departed_not_shown() > 0) {
    absl::StrAppend(&out, "departed earlier, no longer listed: ", s.departed_not_shown(), "\n");
  }
  if (s.pending_joins() > 0) {
    absl::StrAppend(&out, "joined, no session yet: ", s.pending_joins(), "\n");
  }
  return out;
}

// Bytes on the wire of each worker's latest exchange: members, and the
// workers that finished the run (its last exchange); not those that left,
// were lost or evicted.
std::string FormatWireTable(const shoal::v1::RunStatus& s) {
  const auto shows_wire = [](const shoal::v1::WorkerStatus& w) {
    return w.wire_round() > 0 && (!DepartedState(w.state()) || w.state() == "finished");
  };
  bool wire = false;
  for (const auto& w : s.workers()) wire |= shows_wire(w);
  if (!wire) return "";
  std::string out = "wire (each worker's latest exchange):\n";
  absl::StrAppend(&out, absl::StrFormat("%-5s %-11s %-12s %-12s %s\n", "ID", "WIRE_ROUND",
                                        "BYTES_IN", "BYTES_OUT", "RATIO"));
  for (const shoal::v1::WorkerStatus* row : SortedWorkers(s)) {
    const shoal::v1::WorkerStatus& w = *row;
    if (!shows_wire(w)) continue;
    absl::StrAppend(&out,
                    absl::StrFormat("%-5s %-11d %-12d %-12d %.4f\n", w.id(), w.wire_round(),
                                    w.bytes_received(), w.bytes_sent(), w.compression_ratio()));
  }
  return out;
}

// Where each worker's round time goes (issue 27): training, its exchange,
// idle (waiting for the others); only once a round completed.
std::string FormatTimeShares(const shoal::v1::RunStatus& s, bool wide) {
  bool shares = false;
  for (const auto& w : s.workers()) {
    shares |= w.train_share() + w.exchange_share() + w.idle_share() > 0;
  }
  if (!shares) return "";
  std::string out = "time (share of each worker's recent rounds):\n";
  absl::StrAppend(&out, absl::StrFormat("%-*s %-6s %-9s %-6s %s\n", WhoWidth(s), "ID", "TRAIN",
                                        "EXCHANGE", "IDLE", "IN_FLIGHT"));
  for (const shoal::v1::WorkerStatus* row : SortedWorkers(s)) {
    const shoal::v1::WorkerStatus& w = *row;
    if (w.train_share() + w.exchange_share() + w.idle_share() <= 0) continue;
    if (DepartedState(w.state()) && !wide) continue;
    absl::StrAppend(&out, absl::StrFormat("%-*s %-6s %-9s %-6s %d\n", WhoWidth(s), Who(w),
                                          absl::StrFormat("%.0f%%", 100 * w.train_share()),
                                          absl::StrFormat("%.0f%%", 100 * w.exchange_share()),
                                          absl::StrFormat("%.0f%%", 100 * w.idle_share()),
                                          w.rounds_in_flight()));
  }
  return out;
}

// Bandwidth-proportional slices (issue 49): each member's measured
// exchange rate and the share of the model its slice held in the latest
// plan. Shown when the run sizes slices by bandwidth, and with -o wide
// once a rate is measured.
std::string FormatSlices(const shoal::v1::RunStatus& s, bool wide) {
  const std::string& sizing = s.config().exchange().slice_sizing();
  bool measured = false;
  for (const auto& w : s.workers()) measured |= w.exchange_rate_bytes_per_second() > 0;
  if (sizing != "bandwidth" && !(wide && measured)) return "";
  std::string out = absl::StrCat("slices (--slice_sizing=", sizing.empty() ? "equal" : sizing,
                                 "; rate: what its peers read from it, smoothed):\n");
  absl::StrAppend(&out,
                  absl::StrFormat("%-*s %-12s %s\n", WhoWidth(s), "ID", "RATE", "SLICE_SHARE"));
  for (const shoal::v1::WorkerStatus* row : SortedWorkers(s)) {
    const shoal::v1::WorkerStatus& w = *row;
    if (DepartedState(w.state()) && w.state() != "finished") continue;
    const double rate = w.exchange_rate_bytes_per_second();
    absl::StrAppend(
        &out, absl::StrFormat("%-*s %-12s %.1f%%\n", WhoWidth(s), Who(w),
                              rate > 0 ? absl::StrFormat("%.2f MB/s", rate / 1e6) : "-",
                              100 * w.slice_share()));
  }
  return out;
}

// Audits, scores and bans (issue 28, docs/SECURITY.md): the run's audit
// counts, then every member whose score moved, with why.
std::string FormatTrust(const shoal::v1::RunStatus& s, bool wide) {
  const shoal::v1::TrustConfig& trust = s.config().trust();
  bool scores = false;
  for (const auto& w : s.workers()) scores |= w.score_reasons_size() > 0;
  if (trust.audit_rate() <= 0 && !scores && s.bans_size() == 0) return "";
  std::string out = absl::StrFormat(
      "trust (--audit_rate=%g, --ban_below=%g): audits performed %d  "
      "failed %d  dropped %d\n",
      trust.audit_rate(), trust.ban_below(), s.audits_performed(), s.audits_failed(),
      s.audits_dropped());
  for (const shoal::v1::WorkerStatus* row : SortedWorkers(s)) {
    const shoal::v1::WorkerStatus& w = *row;
    if (w.score_reasons_size() == 0 && w.audits_passed() + w.audits_failed() == 0) continue;
    if (DepartedState(w.state()) && !wide && w.score_reasons_size() == 0) continue;
    absl::StrAppend(
        &out, absl::StrFormat("  %-*s score %.2f  audited %d (failed %d)  replayed %d", WhoWidth(s),
                              Who(w), w.score(), w.audits_passed() + w.audits_failed(),
                              w.audits_failed(), w.audits_replayed()));
    if (w.score_reasons_size() > 0) absl::StrAppend(&out, "  last: ", w.score_reasons(0));
    absl::StrAppend(&out, "\n");
  }
  for (const shoal::v1::Ban& b : s.bans()) {
    absl::StrAppend(
        &out, "  BANNED ", b.worker_id(), b.name().empty() ? "" : " (" + b.name() + ")", " until ",
        absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixSeconds(b.until_unix_seconds()),
                         absl::UTCTimeZone()),
        ": ", b.reason(), "\n");
  }
  return out;
}

// Workers behind NAT (outbound connections only; docs/SUPERNODES.md).
std::string FormatNat(const shoal::v1::RunStatus& s) {
  std::string out;
  for (const auto& w : s.workers()) {
    if (!w.outbound_only()) continue;
    absl::StrAppend(&out, "behind NAT: ", w.id(), " (", w.outbound_reason(), ")\n");
  }
  for (const auto& w : s.workers()) {
    if (w.pushes_merged() > 0) {
      absl::StrAppend(&out, w.id(), " merged ", w.pushes_merged(),
                      " models pushed from behind NAT\n");
    }
  }
  return out;
}

// Stragglers: per worker its measured round time (the median ready time;
// for a worker late in every round, its own measure of its late
// training), the deadline it was last held to and its late work folded
// into later rounds (docs/MEMBERSHIP.md). Only when some worker was late:
// a deadline that everyone met is noise.
std::string FormatLateWork(const shoal::v1::RunStatus& s) {
  bool any_late = false;
  for (const auto& w : s.workers()) any_late |= w.rounds_late() > 0 || w.folded_updates() > 0;
  if (!any_late) return "";
  std::string out = absl::StrCat(
      "late work (--fold_late_work=", s.config().sync().fold_late_work() ? "true" : "false",
      ", --max_staleness=", s.config().sync().max_staleness(), "):\n");
  for (const shoal::v1::WorkerStatus* row : SortedWorkers(s)) {
    const shoal::v1::WorkerStatus& w = *row;
    if (DepartedState(w.state())) continue;
    std::string last = "-";
    if (w.folded_updates() > 0) {
      last = absl::StrFormat("into round %d, staleness %d, weight %.3f, trained in %s",
                             w.last_fold_round(), w.last_fold_staleness(), w.last_fold_weight(),
                             Seconds(w.last_fold_train_seconds()));
    }
    absl::StrAppend(&out, absl::StrFormat("  %-5s round_time %-8s deadline %-8s late %-4d "
                                          "folded %-4d last_fold %s\n",
                                          w.id(), Seconds(w.ready_seconds_median()),
                                          Seconds(w.deadline_seconds()), w.rounds_late(),
                                          w.folded_updates(), last));
  }
  return out;
}

}  // namespace

std::string FormatStatusTable(const shoal::v1::RunStatus& s, bool wide) {
  if (IsGossip(s)) return FormatGossipTable(s);
  return absl::StrCat(FormatRunLines(s), FormatWorkersTable(s, wide), FormatWireTable(s),
                      FormatTimeShares(s, wide), FormatSlices(s, wide), FormatTrust(s, wide),
                      FormatNat(s),
                      FormatLateWork(s), FormatZoneTree(s));
}

std::string FormatZoneTree(const shoal::v1::RunStatus& s) {
  // Active workers (a role) with their zone and measurements; those that
  // left have no role and are not listed.
  bool zoned = false, measured = false;
  int active = 0;
  for (const auto& z : s.zones()) zoned |= !z.path().empty() || !z.supernode().empty();
  for (const auto& w : s.workers()) {
    if (w.role().empty()) continue;
    ++active;
    measured |= w.step_seconds() > 0 || w.bandwidth_bytes_per_second() > 0;
  }
  if (!zoned && !measured) return "";
  std::string out;
  if (zoned) {
    absl::StrAppend(&out, "zones (supernode, standby; --supernode_switch_factor/_rounds):\n");
    for (const auto& z : s.zones()) {
      const size_t depth =
          z.path().empty() ? 0 : 1 + std::count(z.path().begin(), z.path().end(), '/');
      const std::string indent(2 + 2 * depth, ' ');
      const std::string name =
          z.path().empty() ? "(root)" : z.path().substr(z.path().rfind('/') + 1);
      absl::StrAppend(&out, indent, name, "  ", z.workers(),
                      z.workers() == 1 ? " worker" : " workers", " (", z.direct_members(),
                      " direct)");
      if (z.supernode().empty()) {
        absl::StrAppend(&out, "  no supernode: ", z.reason(), "\n");
        continue;
      }
      absl::StrAppend(&out, "  supernode ", z.supernode(), "  standby ",
                      z.standby().empty() ? "-" : z.standby());
      if (z.elected_unix_ms() > 0) {
        absl::StrAppend(&out, "  since ",
                        absl::FormatTime("%H:%M:%S", absl::FromUnixMillis(z.elected_unix_ms()),
                                         absl::UTCTimeZone()),
                        " UTC");
      }
      absl::StrAppend(&out, " (", z.cause(), ")\n");
      absl::StrAppend(&out, indent, "    why ", z.reason(), "\n");
      if (!z.challenger().empty()) {
        absl::StrAppend(&out, indent, "    challenger ", z.challenger(), " ahead for ",
                        z.challenger_rounds(), " round(s)\n");
      }
    }
  }
  if (active == 0) return out;
  absl::StrAppend(&out, "members by zone (role, measured step time and bandwidth):\n");
  absl::StrAppend(&out, absl::StrFormat("%-5s %-24s %-9s %-10s %s\n", "ID", "ZONE", "ROLE", "STEP",
                                        "BANDWIDTH"));
  for (const shoal::v1::WorkerStatus* row : SortedWorkers(s)) {
    const shoal::v1::WorkerStatus& w = *row;
    if (w.role().empty()) continue;  // departed
    absl::StrAppend(
        &out, absl::StrFormat(
                  "%-5s %-24s %-9s %-10s %s%s\n", w.id(), w.zone().empty() ? "(root)" : w.zone(),
                  w.role(),
                  w.step_seconds() > 0 ? absl::StrFormat("%.2fms", w.step_seconds() * 1e3) : "-",
                  w.bandwidth_bytes_per_second() > 0
                      ? absl::StrFormat("%.1f MB/s", w.bandwidth_bytes_per_second() / 1e6)
                      : "-",
                  // --relay=on: whose relay carries its session.
                  w.relayed_by().empty() ? "" : absl::StrCat("  session via ", w.relayed_by())));
  }
  return out;
}

std::string FormatStatusJson(const shoal::v1::RunStatus& s) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(s, &json, options);
  return json;
}

std::string FormatRoundLine(const shoal::v1::RoundSummary& r, uint64_t total_rounds) {
  return absl::StrFormat(
      "round %d%s  participants=%d  train_loss=%.4f  test_accuracy=%s  test_loss=%s  "
      "time=%.2fs  exchange=%.3fs  hash=%s",
      r.round(), total_rounds ? absl::StrCat("/", total_rounds) : "", r.participants(),
      r.train_loss(), r.evaluated() ? absl::StrFormat("%.4f", r.test_accuracy()) : "-",
      r.evaluated() ? absl::StrFormat("%.4f", r.test_loss()) : "-", r.seconds(),
      r.exchange_seconds(), r.model_hash().substr(0, 12));
}

std::string FormatRoundJsonLine(const shoal::v1::RoundSummary& r, uint64_t total_rounds) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(r, &json, options);
  // {"event":"round","total_rounds":N, <the RoundSummary's fields>}
  return absl::StrCat("{\"event\":\"round\",\"total_rounds\":", total_rounds,
                      json.size() > 2 ? "," : "", json.substr(1));
}

namespace {
// The test accuracy and loss of the newest evaluated round (0 when none).
void LastEvaluated(const shoal::v1::RunStatus& s, double* accuracy, double* loss) {
  for (auto it = s.recent_rounds().rbegin(); it != s.recent_rounds().rend(); ++it) {
    if (it->evaluated()) {
      *accuracy = it->test_accuracy();
      *loss = it->test_loss();
      return;
    }
  }
}

// Workers that reported the last completed round (also those that left
// after it, as every worker does when the run finishes), evicted ones aside.
bool ReportedLastRound(const shoal::v1::RunStatus& s, const shoal::v1::WorkerStatus& w) {
  return w.state() != "evicted" && s.last_completed_round() > 0 &&
         w.model_round() == s.last_completed_round();
}
}  // namespace

bool HashesAgree(const shoal::v1::RunStatus& s) {
  // Gossip models differ by design: there is no agreed hash to check.
  if (IsGossip(s)) return true;
  int reporting = 0;
  for (const auto& w : s.workers()) {
    if (!ReportedLastRound(s, w)) continue;
    if (w.model_hash() != s.model_hash()) return false;
    ++reporting;
  }
  return reporting > 0;
}

std::string FormatSummaryLine(const shoal::v1::RunStatus& s, double elapsed_seconds) {
  if (IsGossip(s)) {
    double accuracy = 0, loss = 0;
    int n = 0;
    GossipAccuracy(s, &accuracy, &loss, &n);
    if (s.config().gossip().final_average() && !s.final_average().empty()) {
      // The run ended with one model: every worker evaluated the same one.
      const std::string hash = FinalHash(s);
      return absl::StrFormat(
          "summary: run_id=%s phase=%s mode=gossip workers=%d test_accuracy=%.4f test_loss=%.4f "
          "(the final average) hashes_agree=%s model_hash=%s elapsed=%.1fs",
          s.run_id(), PhaseName(s.phase()), n, accuracy, loss, hash.empty() ? "false" : "true",
          hash.substr(0, 16), elapsed_seconds);
    }
    return absl::StrFormat(
        "summary: run_id=%s phase=%s mode=gossip workers=%d test_accuracy=%.4f test_loss=%.4f "
        "(mean of the workers' last evaluations) elapsed=%.1fs",
        s.run_id(), PhaseName(s.phase()), n, accuracy, loss, elapsed_seconds);
  }
  double accuracy = 0, loss = 0;
  LastEvaluated(s, &accuracy, &loss);
  int active = 0;
  for (const auto& w : s.workers()) active += ReportedLastRound(s, w);
  return absl::StrFormat(
      "summary: run_id=%s phase=%s rounds=%d workers=%d test_accuracy=%.4f test_loss=%.4f "
      "hashes_agree=%s model_hash=%s elapsed=%.1fs",
      s.run_id(), PhaseName(s.phase()), s.last_completed_round(), active, accuracy, loss,
      HashesAgree(s) ? "true" : "false", s.model_hash().substr(0, 16), elapsed_seconds);
}

std::string FormatFinishedJsonLine(const shoal::v1::RunStatus& s, double elapsed_seconds) {
  double accuracy = 0, loss = 0;
  LastEvaluated(s, &accuracy, &loss);
  int workers = 0;
  for (const auto& w : s.workers()) workers += ReportedLastRound(s, w);
  if (IsGossip(s)) {
    int n = 0;
    GossipAccuracy(s, &accuracy, &loss, &n);
    workers = n;
  }
  // Gossip without a final average ends with a model per worker: null.
  const char* agree = HashesAgree(s) ? "true" : "false";
  if (IsGossip(s)) {
    agree = !s.config().gossip().final_average() ? "null" : FinalHash(s).empty() ? "false" : "true";
  }
  return absl::StrFormat(
      "{\"event\":\"finished\",\"run_id\":%s,\"phase\":%s,\"mode\":%s,\"rounds\":%d,"
      "\"workers\":%d,\"test_accuracy\":%.6f,\"test_loss\":%.6f,\"hashes_agree\":%s,"
      "\"model_hash\":%s,\"elapsed_seconds\":%.3f}",
      JsonQuote(s.run_id()), JsonQuote(PhaseName(s.phase())),
      JsonQuote(IsGossip(s) ? "gossip" : "sync"), s.last_completed_round(), workers, accuracy, loss,
      agree, JsonQuote(IsGossip(s) ? FinalHash(s) : s.model_hash()), elapsed_seconds);
}

}  // namespace shoal::ctl
