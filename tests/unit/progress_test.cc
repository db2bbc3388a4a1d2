// Progress lines of long transfers: figures, terminal redraws, a line per
// step elsewhere.
#include "common/progress.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>

namespace shoal {
namespace {

using ::testing::HasSubstr;

TEST(ProgressTest, FiguresGiveRateAndTimeLeft) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(uint64_t{3} << 30), "3.0 GiB");
  // 25 MiB of 100 MiB in 5 s: 5 MiB/s, 75 MiB left = 15 s.
  EXPECT_EQ(FormatProgress("pull", 25 << 20, 100 << 20, absl::Seconds(5)),
            "pull: 25.0 MiB of 100.0 MiB (25%), 5.0 MiB/s, 15.0s left");
  EXPECT_EQ(FormatProgressFigures(1 << 20, 600ull << 20, absl::Seconds(1)),
            "1.0 MiB of 600.0 MiB (0%), 1.0 MiB/s, 9m59s left");
  EXPECT_EQ(FormatProgressFigures(0, 10, absl::Seconds(1)), "0 B of 10 B (0%), rate unknown");
  EXPECT_EQ(FormatProgressFigures(10 << 20, 10 << 20, absl::Seconds(2)),
            "10.0 MiB of 10.0 MiB (100%), done in 2.0s, 5.0 MiB/s");
  EXPECT_EQ(FormatProgressFigures(0, 0, absl::ZeroDuration()), "0 B of 0 B (100%), rate unknown");
}

TEST(ProgressTest, LinesStyleWritesALinePerStepAndNothingOnUpdate) {
  FakeClock clock;
  std::ostringstream out;
  ProgressLine p(&out, ProgressLine::Style::kLines, "export c1", 4 << 20, &clock);
  clock.Advance(absl::Seconds(1));
  p.Update(1 << 20);
  EXPECT_EQ(out.str(), "");
  p.Step(2 << 20, "layer 'a'");
  clock.Advance(absl::Seconds(1));
  p.Step(4 << 20, "layer 'b'");
  p.Finish(4 << 20);
  EXPECT_EQ(out.str(),
            "export c1: layer 'a' done; 2.0 MiB of 4.0 MiB (50%), 2.0 MiB/s, 1.0s left\n"
            "export c1: layer 'b' done; 4.0 MiB of 4.0 MiB (100%), done in 2.0s, 2.0 MiB/s\n");
}

TEST(ProgressTest, TerminalStyleRedrawsInPlaceAtMostEveryRefresh) {
  FakeClock clock;
  std::ostringstream out;
  ProgressLine p(&out, ProgressLine::Style::kTerminal, "pull", 100, &clock,
                 absl::Milliseconds(200));
  clock.Advance(absl::Seconds(1));
  p.Update(10);
  p.Update(20);  // within 200 ms of the last draw: not drawn
  EXPECT_EQ(out.str(), "\rpull: 10 B of 100 B (10%), 10 B/s, 9.0s left");
  clock.Advance(absl::Milliseconds(250));
  p.Update(50);
  EXPECT_THAT(out.str(), HasSubstr("\rpull: 50 B of 100 B (50%)"));
  p.Finish(100);
  const std::string s = out.str();
  EXPECT_EQ(s.back(), '\n');
  EXPECT_THAT(s, HasSubstr("\rpull: 100 B of 100 B (100%), done in 1.2s"));
  // A finished line is not drawn again.
  p.Update(100);
  EXPECT_EQ(out.str(), s);
}

}  // namespace
}  // namespace shoal
