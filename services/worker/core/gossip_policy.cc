#include "services/worker/core/gossip_policy.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/run_options.h"

namespace shoal::worker {

bool IsGossipMode(const shoal::v1::RunConfig& config) { return config.has_gossip(); }

absl::Status ParseInterpolation(const std::string& text, GossipConfig* out) {
  absl::StatusOr<InterpolationSpec> spec = ParseInterpolationSpec(text);
  if (!spec.ok()) return spec.status();
  switch (spec->kind) {
    case InterpolationSpec::Kind::kConstant:
      out->interpolation = Interpolation::kConstant;
      out->constant = spec->constant;
      break;
    case InterpolationSpec::Kind::kClock:
      out->interpolation = Interpolation::kClock;
      break;
    case InterpolationSpec::Kind::kLoss:
      out->interpolation = Interpolation::kLoss;
      break;
  }
  return absl::OkStatus();
}

absl::StatusOr<GossipConfig> ParseGossipConfig(const shoal::v1::RunConfig& config) {
  GossipConfig g;
  if (config.gossip().every() > 0) g.gossip_every = config.gossip().every();
  if (config.gossip().fetch_probability() < 0 || config.gossip().fetch_probability() > 1 ||
      std::isnan(config.gossip().fetch_probability())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fetch_probability ", config.gossip().fetch_probability(), " is not within [0, 1]"));
  }
  g.fetch_probability = config.gossip().fetch_probability();
  if (config.gossip().timeout_ms() > 0)
    g.timeout = absl::Milliseconds(config.gossip().timeout_ms());
  if (absl::Status s = ParseInterpolation(config.gossip().interpolation(), &g); !s.ok()) return s;
  if (config.gossip().divergence_threshold() < 0 ||
      std::isnan(config.gossip().divergence_threshold())) {
    return absl::InvalidArgumentError(absl::StrCat("divergence_threshold ",
                                                   config.gossip().divergence_threshold(),
                                                   " is negative (0 turns it off)"));
  }
  g.divergence_threshold = config.gossip().divergence_threshold();
  g.steps = config.gossip().steps();
  g.interpolation_text = config.gossip().interpolation();
  g.final_average = config.gossip().final_average();
  g.final_wait = absl::Milliseconds(std::max<uint32_t>(1000, config.timeouts().round_timeout_ms()));
  g.checkpoint_every = config.gossip().checkpoint_every();
  g.eval_every = std::max<uint32_t>(1, config.training().eval_every());
  g.consensus_eval_every = config.gossip().consensus_eval_every();
  g.batch = std::max<uint32_t>(1, config.training().batch_size());
  g.seed = config.training().seed();
  g.heartbeat_period =
      absl::Milliseconds(std::max<uint32_t>(100, config.timeouts().heartbeat_interval_ms()));
  g.model = config.model().name();
  return g;
}

double InterpolationFactor(const GossipConfig& config, const GossipState& self,
                           const GossipState& peer) {
  double a = 0.5;
  switch (config.interpolation) {
    case Interpolation::kConstant:
      a = config.constant;
      break;
    case Interpolation::kClock: {
      const double sum = std::max(0.0, self.clock) + std::max(0.0, peer.clock);
      a = sum > 0 ? std::max(0.0, peer.clock) / sum : 0.5;
      break;
    }
    case Interpolation::kLoss: {
      const double sum = std::max(0.0, self.loss) + std::max(0.0, peer.loss);
      a = sum > 0 ? std::max(0.0, self.loss) / sum : 0.5;
      break;
    }
  }
  if (config.divergence_threshold > 0 && self.loss >= 0 &&
      self.loss < config.divergence_threshold) {
    a *= self.loss / config.divergence_threshold;
  }
  if (!(a >= 0)) a = 0;  // NaN from a hostile peer state
  return std::min(1.0, a);
}

double InterpolateClock(double clock, double clock_at_start, double peer_clock, double a) {
  return clock + a * (peer_clock - clock_at_start);
}

void ApplyInterpolation(float* params, const float* base, const float* peer, uint64_t n, double a) {
  const float af = static_cast<float>(a);
  for (uint64_t i = 0; i < n; ++i) params[i] += af * (peer[i] - base[i]);
}

PeerChooser::PeerChooser(const Clock* clock, uint64_t seed, absl::Duration recovery_half_life)
    : clock_(clock), half_life_(recovery_half_life), rng_(seed) {}

void PeerChooser::SetPeers(const std::map<std::string, std::string>& peers) {
  std::map<std::string, Peer> next;
  for (const auto& [id, address] : peers) {
    auto it = peers_.find(id);
    Peer p = it != peers_.end() ? it->second : Peer{};
    p.address = address;
    next.emplace(id, std::move(p));
  }
  peers_ = std::move(next);
}

double PeerChooser::Effective(const Peer& p) const {
  double s = p.score;
  if (p.last_timeout != absl::InfinitePast() && half_life_ > absl::ZeroDuration()) {
    const double halves = (clock_->Now() - p.last_timeout) / half_life_;
    if (halves > 0) s = 1 - (1 - s) * std::exp2(-halves);
  }
  return std::clamp(s, kMinScore, 1.0);
}

std::optional<std::string> PeerChooser::Choose() {
  if (peers_.empty()) return std::nullopt;
  double total = 0;
  for (const auto& [id, p] : peers_) total += Effective(p);
  std::uniform_real_distribution<double> u(0, total);
  double x = u(rng_);
  for (const auto& [id, p] : peers_) {
    x -= Effective(p);
    if (x < 0) return id;
  }
  return peers_.rbegin()->first;
}

void PeerChooser::OnSuccess(const std::string& id) {
  auto it = peers_.find(id);
  if (it == peers_.end()) return;
  it->second.score = std::min(1.0, Effective(it->second) + kSuccessStep);
  it->second.last_timeout = absl::InfinitePast();
}

void PeerChooser::OnTimeout(const std::string& id) {
  auto it = peers_.find(id);
  if (it == peers_.end()) return;
  it->second.score = std::max(kMinScore, Effective(it->second) / 2);
  it->second.last_timeout = clock_->Now();
}

double PeerChooser::Score(const std::string& id) const {
  auto it = peers_.find(id);
  return it == peers_.end() ? 1.0 : Effective(it->second);
}

std::string PeerChooser::Address(const std::string& id) const {
  auto it = peers_.find(id);
  return it == peers_.end() ? "" : it->second.address;
}

namespace {
uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

std::vector<float> ProjectModel(const float* params, uint64_t n, uint64_t seed, int dims) {
  std::vector<double> acc(dims, 0.0);
  const uint64_t key = SplitMix(seed ^ 0x5ea1c0de5ea1c0deULL);
  for (uint64_t i = 0; i < n; ++i) {
    // One 64-bit draw gives the signs of 64 rows for element i.
    const double v = params[i];
    for (int j0 = 0; j0 < dims; j0 += 64) {
      const uint64_t bits = SplitMix(key ^ SplitMix(i * 1315423911ULL + j0));
      const int end = std::min(dims, j0 + 64);
      for (int j = j0; j < end; ++j) acc[j] += ((bits >> (j - j0)) & 1) ? v : -v;
    }
  }
  std::vector<float> out(dims);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dims));
  for (int j = 0; j < dims; ++j) out[j] = static_cast<float>(acc[j] * scale);
  return out;
}

uint64_t NextCheckpointStep(uint64_t steps, uint32_t every) {
  if (every == 0) return 0;
  return (steps / every + 1) * every;
}

}  // namespace shoal::worker
