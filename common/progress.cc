#include "common/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shoal {
namespace {

std::string FormatSeconds(double s) {
  if (s < 60) return absl::StrFormat("%.1fs", s);
  const int64_t whole = static_cast<int64_t>(std::llround(s));
  if (whole < 3600) return absl::StrFormat("%dm%02ds", whole / 60, whole % 60);
  return absl::StrFormat("%dh%02dm", whole / 3600, (whole % 3600) / 60);
}

}  // namespace

std::string FormatBytes(uint64_t bytes) {
  if (bytes >= (uint64_t{1} << 30)) return absl::StrFormat("%.1f GiB", bytes / double(1ull << 30));
  if (bytes >= (uint64_t{1} << 20)) return absl::StrFormat("%.1f MiB", bytes / double(1ull << 20));
  if (bytes >= (uint64_t{1} << 10)) return absl::StrFormat("%.1f KiB", bytes / double(1ull << 10));
  return absl::StrCat(bytes, " B");
}

std::string FormatProgressFigures(uint64_t done, uint64_t total, absl::Duration elapsed) {
  const double seconds = std::max(0.0, absl::ToDoubleSeconds(elapsed));
  // Floored: 100% only when everything is there.
  const double percent = total == 0 ? 100.0 : std::floor(100.0 * static_cast<double>(done) / total);
  std::string out = absl::StrFormat("%s of %s (%.0f%%)", FormatBytes(done), FormatBytes(total),
                                    std::min(100.0, percent));
  if (total > 0 && done >= total) {
    absl::StrAppend(&out, ", done in ", FormatSeconds(seconds));
    if (seconds > 0) absl::StrAppend(&out, ", ", FormatBytes(done / seconds), "/s");
    return out;
  }
  if (seconds <= 0 || done == 0) return absl::StrCat(out, ", rate unknown");
  const double rate = done / seconds;
  absl::StrAppend(&out, ", ", FormatBytes(static_cast<uint64_t>(rate)), "/s, ",
                  FormatSeconds((total - done) / rate), " left");
  return out;
}

std::string FormatProgress(absl::string_view what, uint64_t done, uint64_t total,
                           absl::Duration elapsed) {
  return absl::StrCat(what, ": ", FormatProgressFigures(done, total, elapsed));
}

ProgressLine::Style ProgressLine::StyleFor(int fd) {
  return isatty(fd) == 1 ? Style::kTerminal : Style::kLines;
}

ProgressLine::ProgressLine(std::ostream* out, Style style, std::string what, uint64_t total,
                           const Clock* clock, absl::Duration refresh)
    : out_(out),
      style_(style),
      what_(std::move(what)),
      total_(total),
      clock_(clock),
      refresh_(refresh),
      start_(clock->Now()) {}

void ProgressLine::Draw(uint64_t done) {
  const std::string line = FormatProgress(what_, done, total_, clock_->Now() - start_);
  // Pad over the end of a longer line drawn before.
  const size_t pad = drawn_width_ > line.size() ? drawn_width_ - line.size() : 0;
  *out_ << '\r' << line << std::string(pad, ' ') << std::flush;
  drawn_width_ = line.size();
  last_draw_ = clock_->Now();
}

void ProgressLine::Update(uint64_t done) {
  if (style_ != Style::kTerminal || finished_) return;
  if (clock_->Now() - last_draw_ < refresh_) return;
  Draw(done);
}

void ProgressLine::Step(uint64_t done, absl::string_view step) {
  if (finished_) return;
  if (style_ == Style::kTerminal) {
    Draw(done);
    return;
  }
  *out_ << what_ << ": " << step << " done; "
        << FormatProgressFigures(done, total_, clock_->Now() - start_) << "\n";
}

void ProgressLine::Finish(uint64_t done) {
  if (finished_) return;
  finished_ = true;
  if (style_ == Style::kTerminal) {
    Draw(done);
    *out_ << "\n" << std::flush;
  }
}

}  // namespace shoal
