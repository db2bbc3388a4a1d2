#include "tools/shoalctl/diagnose.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/worker_state.h"
#include "tools/shoalctl/status_format.h"

namespace shoal::ctl {
namespace {

using shoal::v1::RunStatus;
using shoal::v1::WorkerStatus;
using Level = Finding::Level;

std::string Who(const WorkerStatus& w) {
  return w.name().empty() ? w.id() : absl::StrCat(w.id(), " (", w.name(), ")");
}

std::string Seconds(double s) { return absl::StrFormat("%.1fs", s); }

// The heartbeat lease: a member silent for longer is lost.
double LeaseSeconds(const RunStatus& s) {
  const uint32_t ms = s.config().timeouts().heartbeat_lease_ms();
  return ms > 0 ? ms / 1000.0 : 10.0;
}

// Silent long enough to be worth a word: three missed heartbeats (at least
// 2 s), well before the lease counts it lost.
double SilenceSeconds(const RunStatus& s) {
  const uint32_t beat = s.config().timeouts().heartbeat_interval_ms();
  return std::max(2.0, beat > 0 ? 3 * beat / 1000.0 : 3.0);
}

// Active members in `state`, by id.
std::vector<std::string> MembersIn(const RunStatus& s, absl::string_view state) {
  std::vector<std::string> out;
  for (const auto& w : s.workers()) {
    if (w.state() == state) out.push_back(w.id());
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool IsParticipant(const RunStatus& s, const std::string& id) {
  return std::find(s.participants().begin(), s.participants().end(), id) != s.participants().end();
}

void Add(std::vector<Finding>* out, Level level, std::string subject, std::string text) {
  out->push_back(Finding{level, std::move(subject), std::move(text)});
}

// A refused or failed call, in words, with what to check.
std::string CallAdvice(const absl::Status& st, bool client_tls, bool client_token,
                       absl::string_view what) {
  const std::string msg(st.message());
  const std::string lower = absl::AsciiStrToLower(msg);
  const auto mentions = [&lower](absl::string_view word) { return absl::StrContains(lower, word); };
  if (absl::IsUnauthenticated(st)) {
    return client_token ? absl::StrCat(what, " refuses this client's token: ", msg,
                                       " (is --token_file / SHOAL_TOKEN_FILE the run's token?)")
                        : absl::StrCat(what, " requires a token: ", msg,
                                       " (give the run's token: --token_file or SHOAL_TOKEN_FILE)");
  }
  if (absl::IsPermissionDenied(st)) return absl::StrCat(what, " refuses this client: ", msg);
  if (absl::IsUnimplemented(st)) {
    return absl::StrCat(what, " is another kind of server: ", msg, " (check the address)");
  }
  const bool tls_words =
      mentions("ssl") || mentions("handshake") || mentions("certificate") || mentions("tls");
  if (tls_words) {
    return absl::StrCat(what, ": TLS failed: ", msg,
                        client_tls ? " (do --tls_ca / SHOAL_TLS_CA and the server's certificate "
                                     "belong to one CA? --tls_server_name?)"
                                   : " (the server speaks TLS: give --tls_ca, or SHOAL_TLS_CA)");
  }
  if (absl::IsUnavailable(st) && !client_tls && mentions("socket closed")) {
    return absl::StrCat(what, " closed the connection: ", msg,
                        " (a TLS server answering plain text? give --tls_ca)");
  }
  if (absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st)) {
    return absl::StrCat(what, " is not reachable: ", msg,
                        " (is it running? is the address right?)");
  }
  return absl::StrCat(what, ": ", st.ToString());
}

}  // namespace

const char* LevelName(Level level) {
  switch (level) {
    case Level::kOk:
      return "ok";
    case Level::kNote:
      return "note";
    case Level::kProblem:
      return "PROBLEM";
  }
  return "note";
}

bool AnyProblem(const std::vector<Finding>& findings) {
  return std::any_of(findings.begin(), findings.end(),
                     [](const Finding& f) { return f.level == Level::kProblem; });
}

std::string FormatFindings(const std::vector<Finding>& findings) {
  size_t width = 7;
  for (const Finding& f : findings) width = std::max(width, f.subject.size());
  std::string out;
  for (const Finding& f : findings) {
    absl::StrAppendFormat(&out, "%-7s  %-*s  %s\n", LevelName(f.level), static_cast<int>(width),
                          f.subject, f.text);
  }
  return out;
}

std::string FormatFindingsJson(const std::vector<Finding>& findings) {
  std::string out =
      absl::StrCat("{\"problem\": ", AnyProblem(findings) ? "true" : "false", ", \"findings\": [");
  for (size_t i = 0; i < findings.size(); ++i) {
    const Finding& f = findings[i];
    absl::StrAppend(&out, i == 0 ? "\n" : ",\n", "  {\"level\": ", JsonQuote(LevelName(f.level)),
                    ", \"subject\": ", JsonQuote(f.subject), ", \"text\": ", JsonQuote(f.text),
                    "}");
  }
  absl::StrAppend(&out, findings.empty() ? "]}\n" : "\n]}\n");
  return out;
}

namespace {

// The worker called `worker` (an id or a --name), or NOT_FOUND naming the
// run's workers.
absl::StatusOr<const WorkerStatus*> FindWorker(const RunStatus& s, const std::string& worker) {
  const WorkerStatus* w = nullptr;
  for (const auto& candidate : s.workers()) {
    if (candidate.id() == worker || (!candidate.name().empty() && candidate.name() == worker)) {
      w = &candidate;
    }
  }
  if (w != nullptr) return w;
  std::vector<std::string> known;
  for (const auto& c : s.workers()) known.push_back(Who(c));
  return absl::NotFoundError(
      absl::StrCat("no worker '", worker, "' in run ", s.run_id(),
                   known.empty() ? " (it has none)" : "; workers: ", absl::StrJoin(known, ", ")));
}

// What it is doing, by state: always one finding, the first.
void ExplainState(const RunStatus& s, const WorkerStatus* w, std::vector<Finding>* found) {
  const std::string who = Who(*w);
  const std::string& state = w->state();
  const uint64_t round = s.round();
  const std::string reason = w->reason().empty() ? "" : absl::StrCat(": ", w->reason());
  const bool gossip = s.config().has_gossip();
  if (state == "finished") {
    Add(found, Level::kOk, who,
        absl::StrCat(
            "finished the run holding round ", w->model_round(),
            w->model_hash().empty() ? "" : " (hash " + w->model_hash().substr(0, 12) + ")"));
  } else if (state == "left") {
    Add(found, Level::kNote, who,
        absl::StrCat("left the run", reason,
                     " (a clean leave: it said goodbye, e.g. on SIGTERM or Ctrl-C)"));
  } else if (state == "lost") {
    Add(found, Level::kProblem, who,
        absl::StrCat("lost", reason,
                     ": it went away without a goodbye (a crash, kill -9, a broken link or a "
                     "silence past the ",
                     Seconds(LeaseSeconds(s)),
                     " heartbeat lease); its work of the round it was in was not counted"));
  } else if (state == "evicted") {
    Add(found, Level::kProblem, who, absl::StrCat("evicted", reason));
  } else if (state == "syncing") {
    const double pct =
        w->sync_bytes_total() > 0 ? 100.0 * w->sync_bytes_done() / w->sync_bytes_total() : 0.0;
    Add(found, Level::kNote, who,
        absl::StrFormat("catching up: pulling the run's model from %d peer(s), %d of %d bytes "
                        "(%.0f%%); it trains once it holds it",
                        w->sync_sources(), w->sync_bytes_done(), w->sync_bytes_total(), pct));
  } else if (s.phase() == shoal::v1::WAITING_FOR_MEMBERS) {
    Add(found, Level::kNote, who,
        absl::StrCat("waits with the run for members: ", s.members(), " of the ",
                     s.min_participants(), " needed to start a round"));
  } else if (gossip) {
    Add(found, Level::kOk, who,
        absl::StrFormat("gossiping: %d local steps, %d fetches done (%d timed out, %d failed)",
                        w->gossip_steps(), w->fetches_done(), w->fetches_timed_out(),
                        w->fetches_failed()));
  } else if (!IsParticipant(s, w->id()) && s.phase() != shoal::v1::FINISHED) {
    Add(found, Level::kNote, who,
        absl::StrCat("not a participant of round ", round,
                     ": it joined after the round was planned or sat the round out, and takes "
                     "part from the next round"));
  } else if (state == "training") {
    Add(found, Level::kOk, who,
        absl::StrCat("training round ", round, " (its median training time ",
                     Seconds(w->train_seconds_median()), ")"));
  } else if (state == "ready") {
    std::vector<std::string> training = MembersIn(s, "training");
    Add(found, Level::kNote, who,
        absl::StrCat("finished its local steps of round ", round, " and waits for the others",
                     training.empty()
                         ? ""
                         : absl::StrCat("; still training: ", absl::StrJoin(training, ", "))));
  } else if (state == "sharing") {
    std::vector<std::string> sharing = MembersIn(s, "sharing");
    Add(found, Level::kOk, who,
        absl::StrCat("exchanging round ", round, "'s slices with its peers (still exchanging: ",
                     absl::StrJoin(sharing, ", "), ")"));
  } else if (state == "waiting") {
    Add(found, Level::kNote, who,
        absl::StrCat("waiting: ", s.detail().empty() ? "between rounds" : s.detail()));
  } else {
    Add(found, Level::kNote, who, absl::StrCat("state ", state, reason));
  }
}

// Silence past the lease, and a stale or disagreeing model.
void ExplainHealth(const RunStatus& s, const WorkerStatus* w, std::vector<Finding>* found) {
  std::vector<Finding>& out = *found;
  const std::string who = Who(*w);
  const std::string& state = w->state();
  const bool gossip = s.config().has_gossip();
  const bool active = !DepartedState(state);
  // Silence: the state above is only the last one it reported.
  const double silent = w->last_seen_ms_ago() / 1000.0;
  if (active && silent > SilenceSeconds(s)) {
    out.front().level = Level::kNote;
    out.front().text = absl::StrCat("last known: ", out.front().text);
    Add(found, Level::kProblem, who,
        absl::StrCat("not heard from for ", Seconds(silent), " (lease ", Seconds(LeaseSeconds(s)),
                     "): frozen (SIGSTOP), overloaded or cut off; the coordinator counts it lost "
                     "when the lease runs out"));
  }
  // A stale or disagreeing model.
  if (active && !gossip && state != "syncing" && s.last_completed_round() > 0 &&
      w->model_round() + 1 < s.last_completed_round()) {
    Add(found, Level::kProblem, who,
        absl::StrCat("holds round ", w->model_round(), "'s model; the run completed round ",
                     s.last_completed_round(), " (", s.last_completed_round() - w->model_round(),
                     " behind)"));
  }
  if (!gossip && state != "evicted" && w->model_round() == s.last_completed_round() &&
      !w->model_hash().empty() && !s.model_hash().empty() && w->model_hash() != s.model_hash()) {
    Add(found, Level::kProblem, who,
        absl::StrCat("its model of round ", w->model_round(), " hashes to ",
                     w->model_hash().substr(0, 12), ", the run agreed on ",
                     s.model_hash().substr(0, 12)));
  }
}

// Lateness and missed rounds.
void ExplainLateness(const WorkerStatus* w, std::vector<Finding>* found) {
  const std::string who = Who(*w);
  if (w->rounds_late() > 0) {
    Add(found, Level::kNote, who,
        absl::StrCat(
            "sat out ", w->rounds_late(), " round(s) for the adaptive deadline: its ready time ",
            Seconds(w->ready_seconds_median()), " against a deadline of ",
            Seconds(w->deadline_seconds()),
            w->folded_updates() > 0 ? absl::StrCat("; ", w->folded_updates(),
                                                   " late update(s) folded into later rounds")
                                    : ""));
  }
  if (w->rounds_missed() > 0) {
    Add(found, Level::kNote, who,
        absl::StrCat("missed ", w->rounds_missed(), " round(s)",
                     w->missed_reason().empty() ? "" : ": " + w->missed_reason()));
  }
}

// Its link, not its compute, bounds the rounds (issue 49): peers read from it
// at less than half the median rate of the other measured members, and its
// exchange takes more of its rounds than its training does. Rates are the
// coordinator's smoothed measurements (WorkerStatus.exchange_rate_bytes_per_second,
// measured in every run); the advice names --slice_sizing=bandwidth when the
// run cuts equal slices.
void ExplainLink(const RunStatus& s, const WorkerStatus* w, std::vector<Finding>* found) {
  if (DepartedState(w->state()) || w->exchange_rate_bytes_per_second() <= 0) return;
  std::vector<double> others;
  for (const WorkerStatus& o : s.workers()) {
    if (o.id() == w->id() || DepartedState(o.state())) continue;
    if (o.exchange_rate_bytes_per_second() > 0)
      others.push_back(o.exchange_rate_bytes_per_second());
  }
  if (others.empty()) return;
  std::sort(others.begin(), others.end());
  const size_t n = others.size();
  const double median = n % 2 == 1 ? others[n / 2] : (others[n / 2 - 1] + others[n / 2]) / 2;
  const double rate = w->exchange_rate_bytes_per_second();
  if (rate >= 0.5 * median || w->exchange_share() <= w->train_share()) return;
  const bool bandwidth = s.config().exchange().slice_sizing() == "bandwidth";
  Add(found, Level::kNote, Who(*w),
      absl::StrCat(
          "its link, not its compute, bounds the rounds: peers read from it at ",
          absl::StrFormat("%.2f MB/s", rate / 1e6), " against a median of ",
          absl::StrFormat("%.2f MB/s", median / 1e6), " for the other ", n,
          " member(s), and its exchange takes ",
          absl::StrFormat("%.0f%%", 100 * w->exchange_share()), " of its rounds against ",
          absl::StrFormat("%.0f%%", 100 * w->train_share()), " training; ",
          bandwidth
              ? absl::StrFormat("its slice holds %.1f%% of the model (--slice_sizing="
                                "bandwidth sizes it by the rate)",
                                100 * w->slice_share())
              : "--slice_sizing=bandwidth would give it a smaller slice (docs/ARCHITECTURE.md "
                "\"Bandwidth-proportional slices\")"));
}

// Topology: NAT, relay, zone role, and its address as seen from this host.
void ExplainTopology(const WorkerStatus* w, const std::optional<absl::Status>& reachable,
                     std::vector<Finding>* found) {
  const std::string who = Who(*w);
  const bool active = !DepartedState(w->state());
  if (w->outbound_only()) {
    Add(found, Level::kNote, who,
        absl::StrCat(
            "behind NAT, in push mode: ",
            w->outbound_reason().empty() ? "outbound connections only" : w->outbound_reason(),
            "; it owns no slice and pushes its contribution to a peer"));
  }
  if (!w->relayed_by().empty()) {
    Add(found, Level::kNote, who,
        absl::StrCat("its coordinator session goes through the relay on ", w->relayed_by()));
  }
  if (w->role() == "supernode" || w->role() == "standby") {
    Add(found, Level::kNote, who,
        absl::StrCat(w->role(), " of zone ", w->zone().empty() ? "(root)" : w->zone()));
  }
  if (reachable.has_value() && active) {
    if (reachable->ok()) {
      Add(found, Level::kOk, who,
          absl::StrCat("its advertised address ", w->address(), " is reachable from this host"));
    } else {
      Add(found, w->outbound_only() ? Level::kNote : Level::kProblem, who,
          absl::StrCat("its advertised address ", w->address(),
                       " is not reachable from this host: ", reachable->message(),
                       w->outbound_only() ? " (expected behind NAT)"
                                          : " (peers must reach it: check --advertise and "
                                            "firewalls)"));
    }
  }
}

}  // namespace

absl::StatusOr<std::vector<Finding>> ExplainWorker(const RunStatus& s, const std::string& worker,
                                                   const std::optional<absl::Status>& reachable) {
  absl::StatusOr<const WorkerStatus*> w = FindWorker(s, worker);
  if (!w.ok()) return w.status();
  std::vector<Finding> out;
  ExplainState(s, *w, &out);
  ExplainHealth(s, *w, &out);
  ExplainLateness(*w, &out);
  ExplainLink(s, *w, &out);
  ExplainTopology(*w, reachable, &out);
  return out;
}

std::vector<Finding> Doctor(const RunStatus& s, const DoctorFacts& f) {
  std::vector<Finding> out;
  const std::string coordinator = "coordinator";
  if (!f.coordinator.ok()) {
    Add(&out, Level::kProblem, coordinator,
        CallAdvice(f.coordinator, f.client_tls, f.client_token, f.coordinator_address));
  } else {
    Add(&out, Level::kOk, coordinator,
        absl::StrCat(f.coordinator_address, " answers: run ", s.run_id(), ", phase ",
                     shoal::v1::Phase_Name(s.phase()), ", round ", s.round(), ", ", s.members(),
                     " member(s); TLS ", f.client_tls ? "on" : "off", ", token ",
                     f.client_token ? "sent" : "not sent"));
    if (s.replica_role() == "standby") {
      Add(&out, Level::kNote, coordinator,
          absl::StrCat("answered as a standby replica; leader: ",
                       s.leader().empty() ? "none elected" : s.leader()));
    }
    if (!s.error().empty()) Add(&out, Level::kProblem, "run", absl::StrCat("stopped: ", s.error()));
    if (!s.base_fallback().empty()) {
      Add(&out, Level::kNote, "run", absl::StrCat("went back: ", s.base_fallback()));
    }
    // Audits (docs/SECURITY.md "Audits, scores and bans"): a ban is a
    // member whose work did not replay; dropped audits with none performed
    // mean the members cannot replay each other.
    for (const shoal::v1::Ban& b : s.bans()) {
      Add(&out, Level::kProblem, b.name().empty() ? b.worker_id() : b.name(),
          absl::StrCat("banned from the run: ", b.reason()));
    }
    if (s.config().trust().audit_rate() > 0 && s.audits_dropped() > 0 &&
        s.audits_performed() == 0) {
      Add(&out, Level::kProblem, "run",
          absl::StrCat(s.audits_dropped(),
                       " audits dropped and none performed: no two members share a replay "
                       "fingerprint (the same build, Torch CPU kernels and BLAS core), or the "
                       "auditors cannot replay (see the workers' logs)"));
    }
    if (s.phase() == shoal::v1::WAITING_FOR_MEMBERS) {
      Add(&out, Level::kNote, "run",
          absl::StrCat("waiting for members: ", s.members(), " of ", s.min_participants(),
                       " needed to start a round"));
    }
    // Members: heard from, reachable from here, agreeing.
    int reachable = 0, checked = 0;
    for (const auto& w : s.workers()) {
      if (DepartedState(w.state())) continue;
      const double silent = w.last_seen_ms_ago() / 1000.0;
      if (silent > SilenceSeconds(s)) {
        Add(&out, Level::kProblem, Who(w),
            absl::StrCat("not heard from for ", Seconds(silent), " (lease ",
                         Seconds(LeaseSeconds(s)), "): frozen, overloaded or cut off"));
      }
      auto it = f.member_reachable.find(w.id());
      if (it != f.member_reachable.end()) {
        ++checked;
        if (it->second.ok()) {
          ++reachable;
        } else {
          Add(&out, w.outbound_only() ? Level::kNote : Level::kProblem, Who(w),
              absl::StrCat("advertised address ", w.address(),
                           " is not reachable from this host: ", it->second.message(),
                           w.outbound_only() ? " (behind NAT: expected)" : ""));
        }
      }
      if (w.outbound_only()) {
        Add(&out, Level::kNote, Who(w),
            absl::StrCat("behind NAT, in push mode: ", w.outbound_reason()));
      }
      if (!s.config().has_gossip() && w.model_round() == s.last_completed_round() &&
          !w.model_hash().empty() && !s.model_hash().empty() && w.model_hash() != s.model_hash()) {
        Add(&out, Level::kProblem, Who(w),
            absl::StrCat("holds a model of round ", w.model_round(),
                         " that differs from the agreed one"));
      }
      ExplainLink(s, &w, &out);
    }
    if (checked > 0) {
      Add(&out, reachable == checked ? Level::kOk : Level::kNote, "members",
          absl::StrCat(reachable, " of ", checked,
                       " members' advertised addresses reachable from this host"));
    }
    std::vector<std::string> gone;
    for (const auto& w : s.workers()) {
      if (w.state() == "lost" || w.state() == "evicted") {
        gone.push_back(absl::StrCat(Who(w), " ", w.state(),
                                    w.reason().empty() ? "" : " (" + w.reason() + ")"));
      }
    }
    if (!gone.empty()) {
      Add(&out, Level::kNote, "departed",
          absl::StrCat(gone.size(), " lost or evicted: ", absl::StrJoin(gone, ", ")));
    }
    // Clock: a server timestamp in this host's future.
    int64_t newest = std::max<int64_t>(s.started_unix_ms(), s.checkpoint_unix_ms());
    for (const auto& z : s.zones()) newest = std::max<int64_t>(newest, z.elected_unix_ms());
    if (f.local_unix_ms > 0 && newest > f.local_unix_ms + 2000) {
      Add(&out, Level::kProblem, "clock",
          absl::StrFormat("this host's clock is at least %.1fs behind the coordinator's "
                          "(its newest timestamp is in our future): check NTP",
                          (newest - f.local_unix_ms) / 1000.0));
    } else if (f.local_unix_ms > 0 && newest > 0) {
      Add(&out, Level::kOk, "clock",
          "no timestamp of the coordinator's is in this host's future (a clock ahead of the "
          "coordinator's cannot be seen from here)");
    }
  }
  // The store.
  if (f.store_address.empty()) {
    Add(&out, Level::kNote, "store", "the run has no checkpoint store (--checkpoint_store)");
  } else if (f.store.has_value() && !f.store->ok()) {
    Add(&out, Level::kProblem, "store",
        CallAdvice(*f.store, f.client_tls, f.client_token, f.store_address));
  } else if (f.store.has_value()) {
    int damaged = 0;
    for (const auto& c : f.checkpoints) {
      if (!c.damage().empty()) {
        ++damaged;
        Add(&out, Level::kProblem, "store",
            absl::StrCat("checkpoint ", c.id(), " is damaged: ", c.damage()));
      }
    }
    Add(&out, Level::kOk, "store",
        absl::StrCat(f.store_address, " answers: ", f.checkpoints.size(), " checkpoint(s) of run ",
                     s.run_id(), damaged > 0 ? absl::StrCat(", ", damaged, " damaged") : ""));
    const uint32_t every = s.config().checkpoints().every();
    const uint64_t done = s.last_completed_round();
    if (f.coordinator.ok() && every > 0 && done >= 2ull * every &&
        done - s.checkpoint_round() > 2ull * every) {
      Add(&out, Level::kProblem, "store",
          absl::StrCat("the latest checkpoint is of round ", s.checkpoint_round(), ", ",
                       done - s.checkpoint_round(), " rounds behind round ", done, " (every ",
                       every,
                       "): uploads are failing (the store's disk full? its log and the "
                       "coordinator's say why)"));
    } else if (f.coordinator.ok() && every > 0 && s.checkpoint_round() > 0) {
      Add(&out, Level::kOk, "store",
          absl::StrCat("takes checkpoints: the latest is of round ", s.checkpoint_round(),
                       " (every ", every, " rounds)"));
    }
  }
  return out;
}

}  // namespace shoal::ctl
