#include "services/coordinator/core/final_average.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shoal::coordinator {

namespace {

std::string Short(const std::string& hash) { return hash.substr(0, 12); }

}  // namespace

FinalAverageDecision DecideFinalAverage(const std::vector<FinalAverageMember>& members,
                                        bool sent) {
  FinalAverageDecision d;
  if (!sent) {
    std::vector<std::string> training;
    size_t done = 0;
    for (const FinalAverageMember& m : members) {
      if (m.done) {
        ++done;
      } else {
        training.push_back(m.worker_id);
      }
    }
    if (done == 0) return d;
    if (!training.empty()) {
      d.summary = absl::StrCat("waiting: ", done, " of ", members.size(),
                               " workers done, still training: ", absl::StrJoin(training, ", "));
      return d;
    }
    for (const FinalAverageMember& m : members) {
      if (!m.outbound_only && !m.address.empty()) d.sources.push_back(m);
    }
    if (d.sources.empty()) {
      d.action = FinalAverageDecision::Action::kFinish;
      d.summary = "no final average: no member can be fetched from (all behind NAT)";
      return d;
    }
    d.action = FinalAverageDecision::Action::kSend;
    d.summary = absl::StrCat("averaging the final models of ", d.sources.size(), " workers");
    return d;
  }

  std::vector<std::string> waiting;
  std::vector<std::string> failed;
  std::map<std::string, std::vector<std::string>> by_hash;
  uint32_t models = 0;
  size_t recipients = 0;
  for (const FinalAverageMember& m : members) {
    if (!m.recipient) continue;
    ++recipients;
    if (!m.error.empty()) {
      failed.push_back(absl::StrCat(m.worker_id, ": ", m.error));
    } else if (!m.hash.empty()) {
      by_hash[m.hash].push_back(m.worker_id);
      models = m.models;
    } else {
      waiting.push_back(m.worker_id);
    }
  }
  if (!waiting.empty()) {
    d.summary = absl::StrCat("averaging: ", recipients - waiting.size(), " of ", recipients,
                             " workers reported, waiting for ", absl::StrJoin(waiting, ", "));
    return d;
  }
  d.action = FinalAverageDecision::Action::kFinish;
  d.agree = failed.empty() && by_hash.size() == 1;
  if (d.agree) {
    d.summary = absl::StrCat(models, " final models averaged by ", recipients,
                             " workers; hashes agree (", Short(by_hash.begin()->first), ")");
    return d;
  }
  std::vector<std::string> parts;
  for (const auto& [hash, ids] : by_hash) {
    parts.push_back(absl::StrCat(Short(hash), " held by ", absl::StrJoin(ids, ", ")));
  }
  for (const std::string& f : failed) parts.push_back(absl::StrCat("failed ", f));
  d.summary = recipients == 0 ? "final average: every recipient left"
                              : absl::StrCat("final average: hashes DIFFER: ",
                                             absl::StrJoin(parts, "; "));
  return d;
}

}  // namespace shoal::coordinator
