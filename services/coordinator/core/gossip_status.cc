#include "services/coordinator/core/gossip_status.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace shoal::coordinator {

double ConsensusDistance(
    const std::vector<const google::protobuf::RepeatedField<float>*>& projections, uint32_t* used) {
  size_t dims = 0;
  for (const auto* p : projections) {
    if (p != nullptr && p->size() > 0) {
      dims = p->size();
      break;
    }
  }
  std::vector<const google::protobuf::RepeatedField<float>*> ok;
  for (const auto* p : projections) {
    if (p != nullptr && dims > 0 && static_cast<size_t>(p->size()) == dims) ok.push_back(p);
  }
  *used = ok.size();
  if (ok.size() < 2) return -1;
  std::vector<double> mean(dims, 0.0);
  for (const auto* p : ok) {
    for (size_t j = 0; j < dims; ++j) mean[j] += p->Get(j);
  }
  for (double& m : mean) m /= ok.size();
  double sum = 0;
  for (const auto* p : ok) {
    for (size_t j = 0; j < dims; ++j) {
      const double d = p->Get(j) - mean[j];
      sum += d * d;
    }
  }
  return std::sqrt(sum / ok.size());
}

GossipCheckpointerDecision DecideGossipCheckpointer(
    const std::string& current, absl::Span<const GossipCheckpointerCandidate> members) {
  GossipCheckpointerDecision d;
  const GossipCheckpointerCandidate* first = nullptr;
  for (const GossipCheckpointerCandidate& m : members) {
    if (!m.gossiping) continue;
    if (!current.empty() && m.worker_id == current) {
      d.worker_id = current;
      d.reason = absl::StrCat(current, " still gossips");
      return d;
    }
    if (first == nullptr) first = &m;
  }
  if (first == nullptr) {
    d.changed = !current.empty();
    d.reason = "no member gossips";
    return d;
  }
  d.worker_id = first->worker_id;
  d.changed = true;
  d.reason = current.empty()
                 ? absl::StrCat(d.worker_id, " is the first gossiping member")
                 : absl::StrCat(current, " left; ", d.worker_id, " is the first gossiping member");
  return d;
}

ConsensusEvaluatorDecision DecideConsensusEvaluator(
    const std::string& current, absl::Span<const ConsensusCandidate> candidates) {
  const ConsensusCandidate* held = nullptr;
  const ConsensusCandidate* best = nullptr;
  for (const ConsensusCandidate& c : candidates) {
    if (c.worker_id == current) held = &c;
    if (best == nullptr || c.steps > best->steps) best = &c;
  }
  ConsensusEvaluatorDecision d;
  d.worker_id = current;
  if (held == nullptr) {
    // None yet, or it left: the most trained (or none).
    d.worker_id = best == nullptr ? std::string() : best->worker_id;
  } else if (best != held && best->steps > 1.5 * held->steps + 10) {
    d.worker_id = best->worker_id;
  }
  d.changed = d.worker_id != current;
  if (best != nullptr && d.worker_id == best->worker_id) {
    d.reason = absl::StrCat(best->steps, " steps, the most trained");
  } else if (held != nullptr) {
    d.reason = absl::StrCat(held->steps, " steps; the most trained has ", best->steps,
                            ", not 1.5 x + 10 more");
  }
  return d;
}

}  // namespace shoal::coordinator
