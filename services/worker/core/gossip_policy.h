// The pure decisions of gossip mode (dpwa, docs/GOSSIP.md): the gossip
// configuration taken from the run config, the interpolation factor
// (constant, clock, loss) with the divergence threshold, the clock update,
// the flow-control choice of the next partner, and the fixed random
// projection of a model that the run's consensus distance is computed from.
//
// No gRPC, no threads. PeerChooser takes an injected Clock and a seed, so
// tests drive it with a fake clock and fixed randomness. PeerChooser is not
// thread-safe (the worker's main thread owns it); the free functions are.
#ifndef SHOAL_SERVICES_WORKER_CORE_GOSSIP_POLICY_H_
#define SHOAL_SERVICES_WORKER_CORE_GOSSIP_POLICY_H_

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::worker {

enum class Interpolation { kConstant, kClock, kLoss };

// Gossip knobs of a run (RunConfig.gossip), with defaults filled in,
// and the run's other settings that gossip mode uses: the one place where
// gossip reads the run configuration.
struct GossipConfig {
  uint32_t gossip_every = 10;
  double fetch_probability = 1.0;
  absl::Duration timeout = absl::Seconds(5);
  Interpolation interpolation = Interpolation::kConstant;
  double constant = 0.5;            // for kConstant
  double divergence_threshold = 0;  // 0 = off
  uint64_t steps = 0;               // 0 = until stopped
  // The --interpolation text as configured (for logs).
  std::string interpolation_text;
  // --gossip_final_average (with steps) and how long each of its waits may
  // last (RunConfig.timeouts.round_timeout_ms, at least 1 s).
  bool final_average = false;
  absl::Duration final_wait = absl::Seconds(1);
  // Local steps between two checkpoints of the checkpointer (0 = never).
  uint32_t checkpoint_every = 0;
  // Evaluate every N publications; the consensus every N (0 = off).
  uint32_t eval_every = 1;
  uint32_t consensus_eval_every = 0;
  // Samples per step: the gossip clock's unit.
  double batch = 1;
  uint64_t seed = 0;
  // The session's heartbeat period (at least 100 ms).
  absl::Duration heartbeat_period = absl::Milliseconds(100);
  std::string model;
};

// True when the run is in gossip mode ("gossip"); "" and "sync" are
// synchronous rounds.
bool IsGossipMode(const shoal::v1::RunConfig& config);

// The run's gossip knobs; INVALID_ARGUMENT names the bad one (a mode other
// than sync/gossip, a probability outside [0, 1], a constant outside (0, 1],
// an unknown interpolation, a negative threshold). Unset (0) knobs take the
// defaults of GossipConfig.
absl::StatusOr<GossipConfig> ParseGossipConfig(const shoal::v1::RunConfig& config);
// "constant:0.5", "clock", "loss" -> the method and constant.
absl::Status ParseInterpolation(const std::string& text, GossipConfig* out);

// What a model's state says about it (dpwa): clock = training samples it
// has seen, loss = its latest training loss.
struct GossipState {
  double clock = 0;
  double loss = 0;
};

// The factor a of params += a * (peer - base) (see docs/GOSSIP.md):
//  - constant: the configured value;
//  - clock: peer.clock / (self.clock + peer.clock) (0.5 when both are 0);
//  - loss: self.loss / (self.loss + peer.loss) (0.5 when both are 0), so the
//    peer weighs more when its loss is lower (as dpwa defines it).
// Then, when divergence_threshold > 0 and self.loss < threshold, a is
// multiplied by self.loss / threshold. Always within [0, 1].
double InterpolationFactor(const GossipConfig& config, const GossipState& self,
                           const GossipState& peer);

// The clock after interpolating with factor `a` a fetch that started when
// the clock was `clock_at_start`, keeping the samples trained since:
// clock + a * (peer_clock - clock_at_start).
double InterpolateClock(double clock, double clock_at_start, double peer_clock, double a);

// params[i] += a * (peer[i] - base[i]) for i < n: the interpolation with
// the peer's model that keeps the steps taken since `base` (the model when
// the fetch started) was published.
void ApplyInterpolation(float* params, const float* base, const float* peer, uint64_t n, double a);

// Flow-control choice of the next partner (dpwa): each peer has a score in
// [kMinScore, 1]; a timed-out fetch halves it, a successful one raises it
// by kSuccessStep; a score recovers towards 1 with a half-life of
// `recovery_half_life` since the peer's last timeout. The choice draws a
// peer with probability proportional to its score (the random term), so a
// peer that keeps timing out is picked rarely (kMinScore / sum), never
// never.
class PeerChooser {
 public:
  static constexpr double kMinScore = 0.05;
  static constexpr double kSuccessStep = 0.25;

  PeerChooser(const Clock* clock, uint64_t seed,
              absl::Duration recovery_half_life = absl::Seconds(60));

  // The peers to choose from (id -> address), this worker excluded by the
  // caller. Known peers keep their scores; others start at 1.
  void SetPeers(const std::map<std::string, std::string>& peers);
  // The next partner (id), or nullopt when there is no peer.
  std::optional<std::string> Choose();
  void OnSuccess(const std::string& id);
  void OnTimeout(const std::string& id);
  // The score as the next Choose() sees it (1 for an unknown peer).
  double Score(const std::string& id) const;
  std::string Address(const std::string& id) const;
  size_t size() const { return peers_.size(); }

 private:
  struct Peer {
    std::string address;
    double score = 1;
    absl::Time last_timeout = absl::InfinitePast();
  };
  double Effective(const Peer& p) const;

  const Clock* const clock_;
  const absl::Duration half_life_;
  std::mt19937_64 rng_;
  std::map<std::string, Peer> peers_;  // ordered: the same seed picks the same peers
};

// The fixed random projection of a model to `dims` numbers: entry (j, i)
// of the matrix is +-1/sqrt(dims), chosen by a hash of (seed, j, i), so
// every worker of a run (same seed) projects with the same matrix without
// storing it, and distances between projections estimate distances between
// models (Johnson-Lindenstrauss). O(n * dims).
std::vector<float> ProjectModel(const float* params, uint64_t n, uint64_t seed, int dims = 32);

// Gossip checkpoints (docs/GOSSIP.md, "Checkpoints"): the checkpointer
// uploads at the first publication at or past each multiple of `every` of
// its local steps. Given the steps trained at the latest upload (or when it
// became the checkpointer), the step at or past which the next upload is
// due: the next multiple of `every` after `steps`. 0 when `every` is 0
// (never).
uint64_t NextCheckpointStep(uint64_t steps, uint32_t every);
// True when an upload is due after `steps` local steps (`due` from
// NextCheckpointStep; 0 = never).
inline bool CheckpointDue(uint64_t steps, uint64_t due) { return due > 0 && steps >= due; }

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_GOSSIP_POLICY_H_
