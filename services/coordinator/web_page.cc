#include "services/coordinator/web_page.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/metrics.h"
#include "tools/shoalctl/status_format.h"

namespace shoal::coordinator {
namespace web {
// web_assets.cc, generated from services/coordinator/web/ (embed.cmake).
extern const absl::string_view k_index_html;
extern const absl::string_view k_app_js;
extern const absl::string_view k_app_css;
}  // namespace web

namespace {

HttpResponse Asset(absl::string_view type, absl::string_view body) {
  HttpResponse r;
  r.content_type = std::string(type);
  r.body = std::string(body);
  return r;
}

// A JSON number, or null for NaN and infinities (a diverged loss).
std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  return absl::StrFormat("%.6g", v);
}

// Ids and hashes are printable ASCII; escape what JSON requires anyway.
std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// RFC 9110's Date: the page's clock for the run's elapsed time.
std::string DateHeader(absl::Time now) {
  return absl::StrCat("Date: ",
                      absl::FormatTime("%a, %d %b %Y %H:%M:%S GMT", now, absl::UTCTimeZone()));
}

}  // namespace

WebPage::WebPage(Source source, const Clock* clock) : clock_(clock), source_(std::move(source)) {}

std::shared_ptr<WebPage::Snapshot> WebPage::Current() {
  const absl::Time now = clock_->Now();
  if (snapshot_ != nullptr && now - snapshot_->built < kMaxAge) {
    // 0 (a standby replica's view): reused for kMaxAge all the same.
    if (source_.version() == snapshot_->version) return snapshot_;
  }
  auto s = std::make_shared<Snapshot>();
  s->status = source_.status(&s->version);
  s->built = now;
  // The first snapshot of a restarted coordinator holds the rounds it
  // resumed: when they completed is unknown.
  const int64_t seen_unix_ms = snapshot_ == nullptr ? 0 : absl::ToUnixMillis(now);
  // Every report of a round not yet in the history, kept until it is: a
  // worker reporting the next round before a snapshot saw this one complete
  // still counts (each snapshot sees each worker's latest report only).
  const uint64_t kept = rounds_.empty() ? 0 : rounds_.back().summary.round();
  for (const shoal::v1::WorkerStatus& w : s->status.workers()) {
    if (w.wire_round() > kept) wire_[w.wire_round()][w.id()] = w.bytes_received();
  }
  for (const shoal::v1::RoundSummary& r : s->status.recent_rounds()) {
    if (!rounds_.empty() && r.round() <= rounds_.back().summary.round()) continue;
    Round round;
    round.summary = r;
    // The page shows a short hash; keeps the history small.
    round.summary.set_model_hash(r.model_hash().substr(0, kHashChars));
    round.unix_ms = seen_unix_ms;
    // The wire of this round: what its participants received, from the
    // reports seen (scaled up to the participants when some were not: every
    // participant of a round receives about as much).
    auto it = wire_.find(r.round());
    if (it != wire_.end() && !it->second.empty()) {
      uint64_t bytes = 0;
      for (const auto& [id, b] : it->second) bytes += b;
      const uint64_t reported = it->second.size();
      round.wire_bytes = static_cast<int64_t>(
          reported >= r.participants() ? bytes : bytes * r.participants() / reported);
    }
    rounds_.push_back(std::move(round));
  }
  if (!rounds_.empty()) {
    wire_.erase(wire_.begin(), wire_.upper_bound(rounds_.back().summary.round()));
  }
  while (rounds_.size() > kMaxRounds) rounds_.pop_front();
  const std::string& id = s->status.checkpoint_id();
  if (!id.empty() && (checkpoints_.empty() || checkpoints_.back().id != id)) {
    checkpoints_.push_back({id, s->status.checkpoint_round(), absl::ToUnixMillis(now)});
    while (checkpoints_.size() > kMaxCheckpoints) checkpoints_.pop_front();
  }
  snapshot_ = std::move(s);
  return snapshot_;
}

void WebPage::Update() {
  absl::MutexLock lock(&mu_);
  // Only when the status changed: a round completes with a change.
  if (snapshot_ != nullptr && snapshot_->version != 0 && source_.version() == snapshot_->version) {
    return;
  }
  Current();
}

HttpResponse WebPage::Status() {
  std::shared_ptr<Snapshot> s;
  std::string json;
  {
    absl::MutexLock lock(&mu_);
    s = Current();
    // Rendered once per snapshot, whatever the number of pages polling.
    if (s->json.empty()) s->json = shoal::ctl::FormatStatusJson(s->status);
    json = s->json;
  }
  HttpResponse r;
  r.content_type = "application/json";
  r.body = std::move(json);
  r.headers.push_back("Cache-Control: no-store");
  r.headers.push_back(DateHeader(clock_->Now()));
  return r;
}

HttpResponse WebPage::History(const HttpRequest& request) {
  uint64_t after = 0;
  for (absl::string_view part : absl::StrSplit(request.query, '&')) {
    if (absl::ConsumePrefix(&part, "after=") && !absl::SimpleAtoi(part, &after)) {
      HttpResponse bad;
      bad.code = 400;
      bad.body = "after= must be a round number\n";
      return bad;
    }
  }
  std::string out = "{\"rounds\":[";
  {
    absl::MutexLock lock(&mu_);
    Current();
    bool first = true;
    for (const Round& round : rounds_) {
      const shoal::v1::RoundSummary& r = round.summary;
      if (r.round() <= after) continue;
      absl::StrAppend(
          &out, first ? "" : ",", "{\"round\":", r.round(), ",\"participants\":", r.participants(),
          ",\"seconds\":", JsonNumber(r.seconds()), ",\"train_loss\":", JsonNumber(r.train_loss()),
          ",\"evaluated\":", r.evaluated() ? "true" : "false",
          ",\"test_accuracy\":", JsonNumber(r.test_accuracy()),
          ",\"test_loss\":", JsonNumber(r.test_loss()),
          ",\"exchange_seconds\":", JsonNumber(r.exchange_seconds()),
          ",\"model_hash\":", JsonString(r.model_hash()),
          ",\"wire_bytes\":", round.wire_bytes < 0 ? "null" : absl::StrCat(round.wire_bytes),
          ",\"unix_ms\":", round.unix_ms, "}");
      first = false;
    }
    absl::StrAppend(&out, "],\"last_round\":", rounds_.empty() ? 0 : rounds_.back().summary.round(),
                    ",\"checkpoints\":[");
    first = true;
    for (const Checkpoint& c : checkpoints_) {
      absl::StrAppend(&out, first ? "" : ",", "{\"id\":", JsonString(c.id), ",\"round\":", c.round,
                      ",\"seen_unix_ms\":", c.seen_unix_ms, "}");
      first = false;
    }
  }
  out += "]}";
  HttpResponse r;
  r.content_type = "application/json";
  r.body = std::move(out);
  r.headers.push_back("Cache-Control: no-store");
  r.headers.push_back(DateHeader(clock_->Now()));
  return r;
}

std::map<std::string, HttpEndpoint::Handler> WebPage::Routes(bool with_metrics) {
  std::map<std::string, HttpEndpoint::Handler> routes = {
      {"/",
       [](const HttpRequest&) { return Asset("text/html; charset=utf-8", web::k_index_html); }},
      {"/index.html",
       [](const HttpRequest&) { return Asset("text/html; charset=utf-8", web::k_index_html); }},
      {"/app.js",
       [](const HttpRequest&) { return Asset("text/javascript; charset=utf-8", web::k_app_js); }},
      {"/app.css",
       [](const HttpRequest&) { return Asset("text/css; charset=utf-8", web::k_app_css); }},
      {"/api/status", [this](const HttpRequest&) { return Status(); }},
      {"/api/history", [this](const HttpRequest& r) { return History(r); }},
  };
  if (with_metrics) routes["/metrics"] = &Metrics::Handle;
  return routes;
}

}  // namespace shoal::coordinator
