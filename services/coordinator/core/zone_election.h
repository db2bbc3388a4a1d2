// Supernode election (docs/SUPERNODES.md, "Election"): for every zone of the
// run's zone tree, the worker that heads it (its supernode) and the one that
// takes over when the head goes (its standby), chosen from what the workers
// measure (their training step time and the bandwidth of their exchanges),
// each with a readable reason.
//
// A pure decision: members, the previous result, options and a Clock in, the
// new result out. No gRPC, no threads; the round engine calls it under its
// own mutex (RoundEngine keeps the result and decides when to re-elect).
//
// The rules, bottom-up so that the hierarchy is consistent:
// - The zone tree holds every zone with a member in its subtree and all
//   their ancestors, up to the root "".
// - A zone's candidates are its direct members and the supernodes of its
//   child zones. Its supernode is the best candidate, so the head of "eu" is
//   also the head of one of its children or a direct member of "eu". The
//   root has a supernode only when it has direct members and children (with
//   children only, their supernodes meet as peers; with members only, the
//   run is flat).
// - Score (ElectionScore): a weighted geometric mean of the candidate's
//   bandwidth and speed relative to the medians of the zone's candidates,
//   (bw / median bw)^wb * (median step / step)^ws, wb = 2/3, ws = 1/3 by
//   default: a head carries a zone's traffic, so bandwidth weighs twice as
//   much as compute. A missing measurement counts as the median (ratio 1).
//   Ranking: measured candidates first, then higher score, then the smaller
//   id (IdLess: w2 before w10). Without any measurement the choice is the
//   smallest id.
// - Stickiness: a supernode stays while it is a candidate. A challenger
//   replaces it only after beating its score by more than switch_factor in
//   switch_evaluations consecutive measurement evaluations (both measured),
//   and not before it has held the seat for min_tenure.
//   Membership evaluations neither count nor break such a streak. One
//   exception: a supernode chosen before anyone was measured (by id) is
//   re-chosen freely, once, at the first measurement evaluation where it
//   is measured itself (the id had nothing to go on); until it is
//   measured it keeps its seat.
// - Takeover: when the supernode is no longer a candidate (it left, died,
//   or stopped heading the child zone it came from), the standby takes over
//   at once if it is a candidate; otherwise the best candidate.
// - Standby: the best of the other candidates, plus, when the supernode
//   came from a child zone, that child's standby (who becomes a candidate if
//   the supernode dies). The previous standby stays while it is still one
//   of those and within switch_factor of the best. Empty when alone.
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_ZONE_ELECTION_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_ZONE_ELECTION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace shoal::coordinator {

// One worker as the election sees it. A zero measurement means "not
// measured yet".
struct ElectionMember {
  std::string id;
  std::string zone;          // a valid zone path (common/zone.h); "" = the root
  double step_seconds = 0;   // median training step time, seconds
  double bandwidth_bps = 0;  // measured inbound bandwidth, bytes per second
  bool alive = true;         // false: it is gone (never a candidate)
};

struct ElectionOptions {
  // A challenger must beat the supernode's score by more than this factor...
  double switch_factor = 1.5;
  // ...in this many consecutive measurement evaluations...
  uint32_t switch_evaluations = 3;
  // ...and not before the supernode has held its seat this long (the
  // streak may grow meanwhile; the first measurement evaluation after it
  // switches). Very short rounds measure noisily: without it a zone of
  // look-alike workers changed heads every few seconds.
  absl::Duration min_tenure = absl::ZeroDuration();
  // Exponents of the bandwidth and speed ratios in the score.
  double bandwidth_weight = 2.0 / 3.0;
  double compute_weight = 1.0 / 3.0;
};

// What prompted an evaluation. Only kMeasurements (new measurements, e.g.
// once per completed round) advances a challenger's streak.
enum class ElectionTrigger { kMembership, kMeasurements };

// The medians of a zone's candidates (0 = none measured).
struct ZoneMedians {
  double step_seconds = 0;
  double bandwidth_bps = 0;
};

struct ZoneElection {
  std::string path;       // "" = the root
  std::string supernode;  // empty: the zone has none (the root, see above)
  std::string standby;    // empty when the supernode is alone
  // Why the supernode ranks first, e.g. "w7: 2.1x the zone's median
  // bandwidth, 0.9x its median step time", and likewise for the standby.
  std::string reason;
  std::string standby_reason;
  // Why the supernode is the one it is since elected_at: "first election",
  // "w3 is gone: standby w7 took over", "w5 beat w7 by 1.8x in 3
  // evaluations".
  std::string cause;
  absl::Time elected_at = absl::InfinitePast();
  uint32_t direct_members = 0;  // alive members whose zone is this path
  uint32_t workers = 0;         // alive members in the subtree
  uint64_t changes = 0;         // how often the supernode changed
  // A challenger beating the supernode by more than switch_factor, and in
  // how many consecutive measurement evaluations so far.
  std::string challenger;
  uint32_t challenger_streak = 0;
  ZoneMedians medians;
  double supernode_score = 0;
  // Whether the supernode was chosen with measurements (false: by id).
  bool measured_choice = false;
};

// Whether two zones show the same (everything but the scores' inputs).
bool SameShown(const ZoneElection& a, const ZoneElection& b);

struct ElectionResult {
  // Zones in pre-order (a parent before its children, siblings by name).
  std::vector<ZoneElection> zones;
  // The ZoneElection of `path`, or null.
  const ZoneElection* Find(absl::string_view path) const;
};

// Worker ids in natural order: shorter first, then by bytes ("w2" < "w10").
bool IdLess(absl::string_view a, absl::string_view b);

// The score of a candidate against its zone's medians (see above).
double ElectionScore(const ElectionMember& m, const ZoneMedians& medians,
                     const ElectionOptions& options);

// Elects every zone's supernode and standby. Dead members (alive = false)
// are ignored except in the cause texts. O(N log N) in the members.
ElectionResult ElectZones(const std::vector<ElectionMember>& members,
                          const ElectionResult& previous, const ElectionOptions& options,
                          ElectionTrigger trigger, const Clock& clock);

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_ZONE_ELECTION_H_
