#include "services/coordinator/core/zone_election.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/zone.h"

namespace shoal::coordinator {

namespace {

// Pre-order of zone paths: "eu" < "eu/paris" < "eu/paris/rack1" < "eu-west"
// ('/' sorts before every character a segment may hold).
bool PreOrderLess(const std::string& a, const std::string& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (a[i] == b[i]) continue;
    if (a[i] == '/') return true;
    if (b[i] == '/') return false;
    return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[i]);
  }
  return a.size() < b.size();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  const double hi = v[mid];
  if (v.size() % 2 == 1) return hi;
  return (*std::max_element(v.begin(), v.begin() + mid) + hi) / 2;
}

bool Measured(const ElectionMember& m) { return m.step_seconds > 0 || m.bandwidth_bps > 0; }

struct Candidate {
  const ElectionMember* member = nullptr;
  int child = -1;  // index of the child zone it heads, -1 = a direct member
  int heir = -1;   // index of the child zone it stands by for (a standby only)
  double score = 0;
  bool measured = false;
};

bool RankLess(const Candidate& a, const Candidate& b) {
  if (a.measured != b.measured) return a.measured;
  if (a.score != b.score) return a.score > b.score;
  return IdLess(a.member->id, b.member->id);
}

std::string Ratio(double v) { return absl::StrFormat("%.2gx", v); }

// "w7: 2.1x the zone's median bandwidth, 0.9x its median step time".
std::string Explain(const Candidate& c, const ZoneMedians& med, bool alone,
                    const std::vector<std::string>& paths) {
  const ElectionMember& m = *c.member;
  std::string out = absl::StrCat(m.id, ": ");
  if (alone) {
    absl::StrAppend(&out, "the zone's only candidate");
  } else if (!c.measured) {
    absl::StrAppend(&out, "no measurements yet (ties go to the smallest id)");
  } else {
    std::vector<std::string> parts;
    if (m.bandwidth_bps > 0 && med.bandwidth_bps > 0) {
      parts.push_back(
          absl::StrCat(Ratio(m.bandwidth_bps / med.bandwidth_bps), " the zone's median bandwidth"));
    } else {
      parts.push_back("bandwidth not measured");
    }
    if (m.step_seconds > 0 && med.step_seconds > 0) {
      parts.push_back(
          absl::StrCat(Ratio(m.step_seconds / med.step_seconds), " its median step time"));
    } else {
      parts.push_back("step time not measured");
    }
    absl::StrAppend(&out, parts[0], ", ", parts[1], absl::StrFormat(" (score %.3g)", c.score));
  }
  if (c.child >= 0) absl::StrAppend(&out, "; supernode of ", paths[c.child]);
  if (c.heir >= 0) absl::StrAppend(&out, "; standby of ", paths[c.heir]);
  return out;
}

}  // namespace

const ZoneElection* ElectionResult::Find(absl::string_view path) const {
  for (const ZoneElection& z : zones) {
    if (z.path == path) return &z;
  }
  return nullptr;
}

bool SameShown(const ZoneElection& a, const ZoneElection& b) {
  return a.path == b.path && a.supernode == b.supernode && a.standby == b.standby &&
         a.reason == b.reason && a.standby_reason == b.standby_reason && a.cause == b.cause &&
         a.elected_at == b.elected_at && a.direct_members == b.direct_members &&
         a.workers == b.workers && a.changes == b.changes && a.challenger == b.challenger &&
         a.challenger_streak == b.challenger_streak;
}

bool IdLess(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return a.size() < b.size();
  return a < b;
}

double ElectionScore(const ElectionMember& m, const ZoneMedians& med,
                     const ElectionOptions& options) {
  double log_score = 0;
  if (m.bandwidth_bps > 0 && med.bandwidth_bps > 0) {
    log_score += options.bandwidth_weight * std::log(m.bandwidth_bps / med.bandwidth_bps);
  }
  if (m.step_seconds > 0 && med.step_seconds > 0) {
    log_score += options.compute_weight * std::log(med.step_seconds / m.step_seconds);
  }
  return std::exp(log_score);
}

namespace {

const Candidate* FindCandidate(const std::vector<Candidate>& candidates, const std::string& id) {
  for (const Candidate& c : candidates) {
    if (c.member->id == id) return &c;
  }
  return nullptr;
}

// The zone tree: every zone with a member, its ancestors and the root, in
// pre-order, with each zone's children by index.
struct ZoneTree {
  std::vector<std::string> paths;
  std::vector<std::vector<int>> children;
};

ZoneTree BuildZoneTree(
    const absl::flat_hash_map<std::string, std::vector<const ElectionMember*>>& direct) {
  ZoneTree tree;
  absl::flat_hash_map<std::string, int> index;
  for (const auto& [zone, list] : direct) {
    std::string z = zone;
    while (!index.contains(z)) {
      index[z] = 0;
      tree.paths.push_back(z);
      if (z.empty()) break;
      z = ParentZone(z);
    }
  }
  std::sort(tree.paths.begin(), tree.paths.end(), PreOrderLess);
  for (size_t i = 0; i < tree.paths.size(); ++i) index[tree.paths[i]] = static_cast<int>(i);
  tree.children.resize(tree.paths.size());
  for (size_t i = 1; i < tree.paths.size(); ++i) {
    tree.children[index[ParentZone(tree.paths[i])]].push_back(static_cast<int>(i));
  }
  return tree;
}

// A zone's candidates (its direct members, its child zones' supernodes),
// scored against their medians (set in zone->medians) and ranked.
std::vector<Candidate> RankCandidates(
    const std::vector<const ElectionMember*>& own, const std::vector<int>& children,
    const ElectionResult& result,
    const absl::flat_hash_map<std::string, const ElectionMember*>& by_id,
    const ElectionOptions& options, ZoneElection* zone) {
  std::vector<Candidate> candidates;
  for (const ElectionMember* m : own) candidates.push_back({m});
  for (int c : children) candidates.push_back({by_id.at(result.zones[c].supernode), c});
  std::vector<double> steps, bandwidths;
  for (const Candidate& c : candidates) {
    if (c.member->step_seconds > 0) steps.push_back(c.member->step_seconds);
    if (c.member->bandwidth_bps > 0) bandwidths.push_back(c.member->bandwidth_bps);
  }
  zone->medians = {Median(std::move(steps)), Median(std::move(bandwidths))};
  for (Candidate& c : candidates) {
    c.measured = Measured(*c.member);
    c.score = ElectionScore(*c.member, zone->medians, options);
  }
  std::sort(candidates.begin(), candidates.end(), RankLess);
  return candidates;
}

// The incumbent `kept` stays unless the first measurements re-choose freely
// or a challenger beat it long enough (hysteresis); returns the head.
const Candidate* KeepOrReplaceIncumbent(const Candidate* kept, const ZoneElection& prev,
                                        const std::vector<Candidate>& candidates,
                                        const ElectionOptions& options, ElectionTrigger trigger,
                                        absl::Time now, ZoneElection* zone) {
  const Candidate* head = kept;
  zone->cause = prev.cause;
  zone->elected_at = prev.elected_at;
  zone->changes = prev.changes;
  zone->measured_choice = prev.measured_choice;
  const Candidate& best = candidates[0];
  const bool beaten = &best != kept && best.measured && kept->measured &&
                      best.score > options.switch_factor * kept->score;
  if (trigger == ElectionTrigger::kMeasurements && !prev.measured_choice && kept->measured) {
    // Chosen by id before anyone was measured: the first measurements
    // elect freely, once.
    zone->measured_choice = true;
    if (&best != kept) {
      zone->cause = absl::StrCat("first measurements: ", best.member->id, " ranks first (",
                                 prev.supernode, " was chosen by id)");
      head = &best;
      zone->elected_at = now;
      ++zone->changes;
    }
  } else if (trigger == ElectionTrigger::kMeasurements) {
    if (beaten) {
      zone->challenger = best.member->id;
      zone->challenger_streak = prev.challenger == best.member->id ? prev.challenger_streak + 1 : 1;
    }
  } else if (!prev.challenger.empty() && FindCandidate(candidates, prev.challenger) != nullptr) {
    zone->challenger = prev.challenger;
    zone->challenger_streak = prev.challenger_streak;
  }
  if (!zone->challenger.empty() && zone->challenger_streak >= options.switch_evaluations &&
      now - zone->elected_at >= options.min_tenure) {
    const Candidate* winner = FindCandidate(candidates, zone->challenger);
    zone->cause =
        absl::StrFormat("%s beat %s by %.2gx in %d evaluations", zone->challenger, prev.supernode,
                        winner->score / kept->score, zone->challenger_streak);
    head = winner;
    zone->elected_at = now;
    ++zone->changes;
    zone->challenger.clear();
    zone->challenger_streak = 0;
  }
  return head;
}

// The zone's supernode: the incumbent (KeepOrReplaceIncumbent), its standby
// when it is gone, or the first ranked.
const Candidate* ChooseSupernode(
    const ZoneElection* prev, const std::vector<Candidate>& candidates,
    const absl::flat_hash_map<std::string, const ElectionMember*>& by_id,
    const ElectionOptions& options, ElectionTrigger trigger, absl::Time now, ZoneElection* zone) {
  const Candidate* head = &candidates[0];
  const std::string incumbent = prev != nullptr ? prev->supernode : std::string();
  if (const Candidate* kept = incumbent.empty() ? nullptr : FindCandidate(candidates, incumbent);
      kept != nullptr) {
    return KeepOrReplaceIncumbent(kept, *prev, candidates, options, trigger, now, zone);
  }
  if (!incumbent.empty()) {
    auto gone = by_id.find(incumbent);
    std::string why = gone == by_id.end()    ? absl::StrCat(incumbent, " left")
                      : !gone->second->alive ? absl::StrCat(incumbent, " died")
                                             : absl::StrCat(incumbent, " is no longer a candidate");
    if (const Candidate* standby = FindCandidate(candidates, prev->standby); standby != nullptr) {
      head = standby;
      zone->cause = absl::StrCat(why, ": standby ", prev->standby, " took over");
    } else {
      zone->cause = absl::StrCat(why, ": ", head->member->id, " elected (",
                                 prev->standby.empty() ? "no standby"
                                                       : absl::StrCat("standby ", prev->standby,
                                                                      " is no candidate either"),
                                 ")");
    }
    zone->elected_at = now;
    zone->changes = prev->changes + 1;
    zone->measured_choice = head->measured;
    return head;
  }
  zone->cause = "first election";
  zone->elected_at = now;
  zone->changes = prev != nullptr ? prev->changes : 0;
  zone->measured_choice = head->measured;
  return head;
}

// The standby: the other candidates, and the standby of the child zone the
// supernode heads (it heads that child when the supernode goes); the
// previous standby stays unless clearly beaten.
void ChooseStandby(const Candidate* head, const std::vector<Candidate>& candidates,
                   const ZoneElection* prev, const ElectionResult& result,
                   const absl::flat_hash_map<std::string, const ElectionMember*>& by_id,
                   const ElectionOptions& options, const std::vector<std::string>& paths,
                   ZoneElection* zone) {
  std::vector<Candidate> pool;
  for (const Candidate& c : candidates) {
    if (&c != head) pool.push_back(c);
  }
  if (head->child >= 0) {
    const std::string& heir = result.zones[head->child].standby;
    if (!heir.empty() && FindCandidate(candidates, heir) == nullptr) {
      Candidate c{by_id.at(heir)};
      c.heir = head->child;
      c.measured = Measured(*c.member);
      c.score = ElectionScore(*c.member, zone->medians, options);
      pool.push_back(c);
    }
  }
  if (pool.empty()) return;
  std::sort(pool.begin(), pool.end(), RankLess);
  const Candidate* standby = &pool[0];
  if (prev != nullptr && !prev->standby.empty()) {
    for (const Candidate& c : pool) {
      if (c.member->id != prev->standby) continue;
      const bool beaten =
          standby->measured && c.measured && standby->score > options.switch_factor * c.score;
      if (!beaten) standby = &c;
    }
  }
  zone->standby = standby->member->id;
  zone->standby_reason = Explain(*standby, zone->medians, false, paths);
}

}  // namespace

ElectionResult ElectZones(const std::vector<ElectionMember>& members,
                          const ElectionResult& previous, const ElectionOptions& options,
                          ElectionTrigger trigger, const Clock& clock) {
  const absl::Time now = clock.Now();
  absl::flat_hash_map<std::string, const ElectionMember*> by_id;
  absl::flat_hash_map<std::string, std::vector<const ElectionMember*>> direct;
  for (const ElectionMember& m : members) {
    by_id[m.id] = &m;
    if (m.alive) direct[m.zone].push_back(&m);
  }
  ElectionResult result;
  if (direct.empty()) return result;
  const ZoneTree tree = BuildZoneTree(direct);
  absl::flat_hash_map<std::string, const ZoneElection*> before;
  for (const ZoneElection& z : previous.zones) before[z.path] = &z;

  result.zones.resize(tree.paths.size());
  // Bottom-up: in reverse pre-order every child comes before its parent.
  for (int i = static_cast<int>(tree.paths.size()) - 1; i >= 0; --i) {
    ZoneElection& zone = result.zones[i];
    zone.path = tree.paths[i];
    auto d = direct.find(zone.path);
    const std::vector<const ElectionMember*> none;
    const std::vector<const ElectionMember*>& own = d == direct.end() ? none : d->second;
    zone.direct_members = static_cast<uint32_t>(own.size());
    zone.workers = zone.direct_members;
    for (int c : tree.children[i]) zone.workers += result.zones[c].workers;
    auto b = before.find(zone.path);
    const ZoneElection* prev = b == before.end() ? nullptr : b->second;
    if (zone.path.empty() && (own.empty() || tree.children[i].empty())) {
      zone.reason = own.empty() ? "no direct members: the child zones' supernodes meet as peers"
                                : "no child zones: a flat run has no supernode";
      if (prev != nullptr) zone.changes = prev->changes;
      continue;
    }
    const std::vector<Candidate> candidates =
        RankCandidates(own, tree.children[i], result, by_id, options, &zone);
    const Candidate* head = ChooseSupernode(prev, candidates, by_id, options, trigger, now, &zone);
    zone.supernode = head->member->id;
    zone.supernode_score = head->score;
    zone.reason = Explain(*head, zone.medians, candidates.size() == 1, tree.paths);
    ChooseStandby(head, candidates, prev, result, by_id, options, tree.paths, &zone);
  }
  return result;
}

}  // namespace shoal::coordinator
