// Progress of a long transfer where a person waits (a checkpoint export, a
// late joiner's model pull): bytes done of the total, the rate so far and
// the time left at that rate.
//
// On a terminal the progress is one line redrawn in place ("\r") at most
// every `refresh`; anywhere else (a log file, a pipe, a test's stream) it is
// one line per step (a layer), so a log keeps a readable history instead of
// carriage returns.
//
// Not thread-safe: one owner updates it.
#ifndef SHOAL_COMMON_PROGRESS_H_
#define SHOAL_COMMON_PROGRESS_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace shoal {

// "1.5 KiB", "12.3 MiB", "2.0 GiB" (binary units), "512 B".
std::string FormatBytes(uint64_t bytes);

// "12.3 MiB of 45.6 MiB (27%), 8.1 MiB/s, 4.0s left" ("done in 5.6s, 8.1
// MiB/s" once done == total; "rate unknown" before any time or byte passed).
std::string FormatProgressFigures(uint64_t done, uint64_t total, absl::Duration elapsed);
// "<what>: " and the figures.
std::string FormatProgress(absl::string_view what, uint64_t done, uint64_t total,
                           absl::Duration elapsed);

class ProgressLine {
 public:
  enum class Style {
    kTerminal,  // one line redrawn in place
    kLines,     // a line per step
  };
  // kTerminal when `fd` is a terminal, kLines otherwise.
  static Style StyleFor(int fd);

  ProgressLine(std::ostream* out, Style style, std::string what, uint64_t total,
               const Clock* clock = RealClock::Get(),
               absl::Duration refresh = absl::Milliseconds(200));

  // Bytes done so far (terminal: redrawn when `refresh` has passed).
  void Update(uint64_t done);
  // A step (e.g. a layer named `step`) is complete at `done` bytes:
  // terminal: redrawn; lines: "<what>: <step> done; <figures>".
  void Step(uint64_t done, absl::string_view step);
  // The transfer ended (terminal: the last figures and a newline).
  void Finish(uint64_t done);

 private:
  void Draw(uint64_t done);

  std::ostream* const out_;
  const Style style_;
  const std::string what_;
  const uint64_t total_;
  const Clock* const clock_;
  const absl::Duration refresh_;
  const absl::Time start_;
  absl::Time last_draw_ = absl::InfinitePast();
  size_t drawn_width_ = 0;
  bool finished_ = false;
};

}  // namespace shoal

#endif  // SHOAL_COMMON_PROGRESS_H_
