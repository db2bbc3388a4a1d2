#include "services/coordinator/core/round_trust.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/sha256.h"

namespace shoal::coordinator {
namespace {

constexpr size_t kReasonsKept = 5;

// SHA-256 of the parts (each length-prefixed), its first 8 bytes as a
// number in [0, 1).
double HashUnit(const std::string& secret, uint64_t round, const std::string& id,
                const std::string& salt) {
  Sha256 h;
  for (const std::string* part : {&secret, &id, &salt}) {
    const uint64_t n = part->size();
    h.Update(&n, sizeof(n));
    h.Update(part->data(), part->size());
  }
  h.Update(&round, sizeof(round));
  const std::string hex = h.HexDigest();
  uint64_t v = 0;
  for (size_t i = 0; i < 16; ++i) {
    const char c = hex[i];
    v = v * 16 + static_cast<uint64_t>(c <= '9' ? c - '0' : c - 'a' + 10);
  }
  return static_cast<double>(v >> 11) / static_cast<double>(uint64_t{1} << 53);
}

}  // namespace

double ScoreChange(TrustEvent event) {
  switch (event) {
    case TrustEvent::kAuditPassed:
      return 0.02;
    case TrustEvent::kAuditFailed:
      return -1.0;
    case TrustEvent::kHashMinority:
      return -0.25;
    case TrustEvent::kMissedDeadline:
      return -0.02;
    case TrustEvent::kEvicted:
      return -0.1;
    case TrustEvent::kRoundCompleted:
      return 0.01;
    case TrustEvent::kBadChunks:
      return -0.25;
  }
  return 0;
}

const char* TrustEventName(TrustEvent event) {
  switch (event) {
    case TrustEvent::kAuditPassed:
      return "passed audit";
    case TrustEvent::kAuditFailed:
      return "failed audit";
    case TrustEvent::kHashMinority:
      return "hash-vote minority";
    case TrustEvent::kMissedDeadline:
      return "missed the ready deadline";
    case TrustEvent::kEvicted:
      return "evicted";
    case TrustEvent::kRoundCompleted:
      return "completed round";
    case TrustEvent::kBadChunks:
      return "bad chunks";
  }
  return "?";
}

bool AuditDrawn(const std::string& secret, uint64_t round, const std::string& worker_id,
                double rate) {
  if (!(rate > 0)) return false;
  return HashUnit(secret, round, worker_id, "audit") < rate;
}

RoundTrust::RoundTrust(const shoal::v1::TrustConfig& config, std::string secret)
    : config_(config), secret_(std::move(secret)) {}

void RoundTrust::Resume(const shoal::v1::RunRecord& record, absl::Time now) {
  bans_.assign(record.bans().begin(), record.bans().end());
  ForgetExpired(now);
}

void RoundTrust::ForgetExpired(absl::Time now) {
  const int64_t t = absl::ToUnixSeconds(now);
  bans_.erase(std::remove_if(bans_.begin(), bans_.end(),
                             [t](const shoal::v1::Ban& b) { return b.until_unix_seconds() <= t; }),
              bans_.end());
}

absl::Status RoundTrust::CheckJoin(const shoal::v1::JoinRequest& request, absl::Time now) {
  ForgetExpired(now);
  for (const shoal::v1::Ban& b : bans_) {
    const bool by_id =
        !request.previous_worker_id().empty() && request.previous_worker_id() == b.worker_id();
    const bool by_name = !request.name().empty() && request.name() == b.name();
    if (!by_id && !by_name) continue;
    return absl::PermissionDeniedError(absl::StrCat(
        "banned from this run until ",
        absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixSeconds(b.until_unix_seconds()),
                         absl::UTCTimeZone()),
        " (", by_id ? "worker " : "name ", by_id ? b.worker_id() : b.name(), "): ", b.reason()));
  }
  if (audits_on() && request.replay_fingerprint().empty()) {
    // Nobody could replay its rounds: it would train unchecked.
    return absl::FailedPreconditionError(
        "this run is audited (--audit_rate): every member's rounds must be replayable, and this "
        "one declares no replay fingerprint; a Python training loop hands Shoal its step and "
        "optimizer (shoal.Worker(..., step=..., optimizer=...) and w.run(dataset), "
        "docs/PYTHON.md \"Audits\")");
  }
  return absl::OkStatus();
}

void RoundTrust::OnJoined(const std::string& worker_id, const shoal::v1::JoinRequest& request) {
  fingerprints_[worker_id] = request.replay_fingerprint();
  scores_.try_emplace(worker_id);
}

void RoundTrust::Forget(const std::string& worker_id) {
  LeaveRound(worker_id);
  fingerprints_.erase(worker_id);
}

void RoundTrust::StartRound(uint64_t round) {
  round_ = round;
  ready_.clear();
  dropped_ += out_.size();
  out_.clear();
  assigned_ = false;
  bad_chunks_.clear();
}

void RoundTrust::OnReady(const std::string& worker_id, const shoal::v1::ReportReadyRequest& request,
                         std::vector<shoal::v1::SampleRange> samples) {
  if (!audits_on()) return;
  Ready& r = ready_[worker_id];
  r.contribution_hash = request.contribution_hash();
  r.samples = std::move(samples);
}

void RoundTrust::LeaveRound(const std::string& worker_id) {
  ready_.erase(worker_id);
  for (auto it = out_.begin(); it != out_.end();) {
    if (it->second.participant == worker_id || it->second.auditor == worker_id) {
      ++dropped_;
      it = out_.erase(it);
    } else {
      ++it;
    }
  }
}

std::string RoundTrust::PickAuditor(const std::string& participant,
                                    const std::vector<std::string>& exclude,
                                    const std::map<std::string, int>& load) const {
  auto f = fingerprints_.find(participant);
  if (f == fingerprints_.end() || f->second.empty()) return "";
  std::string best;
  int best_load = 0;
  double best_key = 0;
  for (const auto& [a, ready] : ready_) {
    if (a == participant || std::find(exclude.begin(), exclude.end(), a) != exclude.end()) {
      continue;
    }
    auto fa = fingerprints_.find(a);
    if (fa == fingerprints_.end() || fa->second != f->second) continue;
    auto l = load.find(a);
    const int n = l == load.end() ? 0 : l->second;
    const double key = HashUnit(secret_, round_, absl::StrCat(participant, "/", a), "auditor");
    if (best.empty() || n < best_load || (n == best_load && key < best_key)) {
      best = a;
      best_load = n;
      best_key = key;
    }
  }
  return best;
}

std::vector<RoundTrust::Assignment> RoundTrust::Assign(
    uint64_t base_round, const std::string& base_hash,
    const std::vector<std::string>& participants) {
  std::vector<Assignment> out;
  if (!audits_on() || assigned_) return out;
  assigned_ = true;
  std::map<std::string, int> load;  // audits each auditor runs
  for (const std::string& p : participants) {
    auto ready = ready_.find(p);
    // Work carried from an earlier session, folds and sit-outs report no
    // hash: nothing to compare.
    if (ready == ready_.end() || ready->second.contribution_hash.empty()) continue;
    if (!AuditDrawn(secret_, round_, p, config_.audit_rate())) continue;
    const std::string auditor = PickAuditor(p, {}, load);
    if (auditor.empty()) {
      ++dropped_;
      continue;
    }
    ++load[auditor];
    Assignment a;
    a.auditor = auditor;
    shoal::v1::AuditRequest& req = a.request;
    req.set_audit_id(next_audit_id_++);
    req.set_round(round_);
    req.set_participant(p);
    req.set_base_model_round(base_round);
    req.set_base_model_hash(base_hash);
    for (const shoal::v1::SampleRange& s : ready->second.samples) *req.add_samples() = s;
    Out o;
    o.participant = p;
    o.auditor = auditor;
    o.request = req;
    out_[req.audit_id()] = std::move(o);
    out.push_back(std::move(a));
  }
  return out;
}

bool RoundTrust::Pending() const { return !out_.empty(); }

absl::StatusOr<RoundTrust::Verdict> RoundTrust::OnReport(
    const std::string& auditor, const shoal::v1::ReportAuditRequest& report) {
  auto it = out_.find(report.audit_id());
  if (report.round() != round_ || it == out_.end()) {
    return absl::NotFoundError(absl::StrCat("audit ", report.audit_id(), " of round ",
                                            report.round(), " is not out (round ", round_, ")"));
  }
  if (it->second.auditor != auditor) {
    return absl::PermissionDeniedError(absl::StrCat("audit ", report.audit_id(), " was asked of ",
                                                    it->second.auditor, ", not of ", auditor));
  }
  Out o = std::move(it->second);
  out_.erase(it);
  Verdict v;
  v.participant = o.participant;
  v.auditor = auditor;
  if (!report.error().empty()) {
    ++dropped_;
    v.kind = Verdict::Kind::kDropped;
    v.reason = absl::StrCat("audit of ", v.participant, " by ", auditor,
                            " dropped: the auditor could not replay: ", report.error());
    return v;
  }
  auto ready = ready_.find(v.participant);
  const std::string expected = ready == ready_.end() ? "" : ready->second.contribution_hash;
  const std::string& got = report.replay_hash();
  ++scores_[auditor].replayed;
  if (!expected.empty() && got == expected) {
    ++performed_;
    if (!o.first_auditor.empty()) {
      // The second opinion sides with the participant: the first replay
      // was wrong.
      v.kind = Verdict::Kind::kAuditorWrong;
      v.auditor = o.first_auditor;
      // The work that did not replay is the auditor's own replay.
      ++failed_;
      ++scores_[o.first_auditor].failed;
      v.reason = absl::StrCat("audit of ", v.participant, " passed on a second opinion by ",
                              auditor, ": ", o.first_auditor, "'s replay gave ",
                              o.first_hash.substr(0, 12), ", which nobody else did");
      ++scores_[v.participant].passed;
      return v;
    }
    v.kind = Verdict::Kind::kPassed;
    v.reason = absl::StrCat("audit of ", v.participant, " by ", auditor, " passed");
    ++scores_[v.participant].passed;
    return v;
  }
  if (o.first_auditor.empty()) {
    // A disagreement: ask another member before anyone is blamed.
    std::map<std::string, int> load;
    for (const auto& [id, other] : out_) ++load[other.auditor];
    const std::string second = PickAuditor(v.participant, {auditor}, load);
    if (!second.empty()) {
      v.kind = Verdict::Kind::kSecondOpinion;
      v.reason = absl::StrCat("the replay of ", v.participant, "'s work by ", auditor, " gives ",
                              got.substr(0, 12), ", its contribution hashes to ",
                              expected.substr(0, 12), ": asking ", second, " for a second opinion");
      Out next;
      next.participant = v.participant;
      next.auditor = second;
      next.first_auditor = auditor;
      next.first_hash = got;
      next.request = o.request;
      next.request.set_audit_id(next_audit_id_++);
      v.second.auditor = second;
      v.second.request = next.request;
      out_[next.request.audit_id()] = std::move(next);
      return v;
    }
  } else if (got != o.first_hash) {
    // Three different hashes: the replays themselves disagree.
    ++dropped_;
    v.kind = Verdict::Kind::kDropped;
    v.reason = absl::StrCat("audit of ", v.participant, " dropped: ", o.first_auditor, " and ",
                            auditor, " replayed it to different models (",
                            o.first_hash.substr(0, 12), ", ", got.substr(0, 12),
                            "), neither its contribution: the replays are not deterministic");
    return v;
  }
  ++performed_;
  ++failed_;
  ++scores_[v.participant].failed;
  v.kind = Verdict::Kind::kFailed;
  v.reason = absl::StrCat("failed audit by ",
                          o.first_auditor.empty() ? auditor : o.first_auditor + " and " + auditor,
                          ": the replay of its samples gives ", got.substr(0, 12),
                          ", its contribution hashes to ", expected.substr(0, 12));
  return v;
}

std::vector<RoundTrust::Verdict> RoundTrust::DropPending(const std::string& why) {
  std::vector<RoundTrust::Verdict> out;
  for (const auto& [id, o] : out_) {
    Verdict v;
    v.participant = o.participant;
    v.auditor = o.auditor;
    v.reason = absl::StrCat("audit of ", o.participant, " by ", o.auditor, " dropped: ", why);
    out.push_back(std::move(v));
    ++dropped_;
  }
  out_.clear();
  return out;
}

std::string RoundTrust::Record(const std::string& worker_id, TrustEvent event,
                               const std::string& detail) {
  Score& s = scores_[worker_id];
  if (event == TrustEvent::kMissedDeadline) {
    // A run of missed deadlines costs once: a member cut off for many rounds
    // (its site's supernode frozen, its link down) is absent, not lying, and
    // absence has its own remedies (leases, eviction). Found by the soak:
    // four honest members of a site whose supernode was stopped for 15 s
    // missed 25 rounds in a row and were banned.
    if (s.missing) return "";
    s.missing = true;
  } else if (event == TrustEvent::kRoundCompleted) {
    s.missing = false;
  }
  const double before = s.score;
  // Kept on a grid of 1e-6 so that steps like 0.02 add up exactly (25 of
  // them from 1 are 0.5, not 0.4999999999999999 printed as "0.50 below
  // 0.50").
  s.score = std::min(1.0, std::round((s.score + ScoreChange(event)) * 1e6) / 1e6);
  if (s.score == before) return "";                     // a pass at the top moves nothing
  if (event == TrustEvent::kRoundCompleted) return "";  // too common to list
  s.reasons.push_front(absl::StrFormat("round %d: %s%s%s %+.2f", round_, TrustEventName(event),
                                       detail.empty() ? "" : " ", detail, s.score - before));
  while (s.reasons.size() > kReasonsKept) s.reasons.pop_back();
  if (config_.ban_below() > 0 && s.score < config_.ban_below() && before >= config_.ban_below()) {
    return absl::StrFormat("score %.2f below %.2f after round %d: %s%s%s", s.score,
                           config_.ban_below(), round_, TrustEventName(event),
                           detail.empty() ? "" : " ", detail);
  }
  return "";
}

void RoundTrust::Ban(const std::string& worker_id, const std::string& name,
                     const std::string& reason, absl::Time now) {
  shoal::v1::Ban b;
  b.set_worker_id(worker_id);
  b.set_name(name);
  b.set_reason(reason);
  b.set_until_unix_seconds(absl::ToUnixSeconds(now) + std::max<int64_t>(1, config_.ban_seconds()));
  bans_.push_back(std::move(b));
}

bool RoundTrust::OnBadChunks(const std::string& reporter, const std::string& accused,
                             std::string* reporters) {
  if (reporter == accused) return false;
  std::vector<std::string>& by = bad_chunks_[accused];
  if (std::find(by.begin(), by.end(), reporter) != by.end()) return false;
  by.push_back(reporter);
  if (reporters != nullptr) {
    *reporters = "";
    for (const std::string& r : by) absl::StrAppend(reporters, reporters->empty() ? "" : ", ", r);
  }
  return by.size() == 2;
}

void RoundTrust::FillStatus(shoal::v1::RunStatus* s, absl::Time now) const {
  s->set_audits_performed(performed_);
  s->set_audits_failed(failed_);
  s->set_audits_dropped(dropped_);
  const int64_t t = absl::ToUnixSeconds(now);
  for (const shoal::v1::Ban& b : bans_) {
    if (b.until_unix_seconds() > t) *s->add_bans() = b;
  }
}

void RoundTrust::FillWorker(const std::string& worker_id, shoal::v1::WorkerStatus* w) const {
  auto it = scores_.find(worker_id);
  if (it == scores_.end()) {
    w->set_score(1);
    return;
  }
  const Score& s = it->second;
  w->set_score(s.score);
  for (const std::string& r : s.reasons) w->add_score_reasons(r);
  w->set_audits_passed(s.passed);
  w->set_audits_failed(s.failed);
  w->set_audits_replayed(s.replayed);
}

void RoundTrust::FillRecord(shoal::v1::RunRecord* r, absl::Time now) const {
  const int64_t t = absl::ToUnixSeconds(now);
  for (const shoal::v1::Ban& b : bans_) {
    if (b.until_unix_seconds() > t) *r->add_bans() = b;
  }
}

}  // namespace shoal::coordinator
