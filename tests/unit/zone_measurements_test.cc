// Unit tests of the worker's measurements for the supernode election.
#include "services/worker/core/zone_measurements.h"

#include <cmath>

#include "gtest/gtest.h"

namespace shoal::worker {
namespace {

TEST(ZoneMeasurementsTest, NothingMeasuredIsZero) {
  ZoneMeasurements m;
  EXPECT_EQ(m.step_seconds(), 0);
  EXPECT_EQ(m.bandwidth_bytes_per_second(), 0);
  // Rounds with nothing to measure leave it so.
  m.AddTraining(0, 10);
  m.AddTraining(1.0, 0);
  m.AddTraining(std::nan(""), 10);
  m.AddTransfer(0, 1.0);
  m.AddTransfer(1000, 0);
  m.AddTransfer(1000, -1);
  EXPECT_EQ(m.step_seconds(), 0);
  EXPECT_EQ(m.bandwidth_bytes_per_second(), 0);
}

TEST(ZoneMeasurementsTest, MediansOfTheRecentRounds) {
  ZoneMeasurements m(3);
  m.AddTraining(1.0, 100);  // 10 ms a step
  EXPECT_DOUBLE_EQ(m.step_seconds(), 0.010);
  m.AddTraining(9.0, 100);  // one slow round
  m.AddTraining(1.2, 100);
  EXPECT_DOUBLE_EQ(m.step_seconds(), 0.012);  // median of 10, 90, 12 ms
  m.AddTraining(1.4, 100);                    // the 10 ms round falls out
  m.AddTraining(1.6, 100);                    // and the 90 ms one
  EXPECT_DOUBLE_EQ(m.step_seconds(), 0.014);
  m.AddTransfer(100'000'000, 1.0);
  m.AddTransfer(50'000'000, 1.0);
  EXPECT_DOUBLE_EQ(m.bandwidth_bytes_per_second(), 75e6);  // even count: the mean of the middle
}

}  // namespace
}  // namespace shoal::worker
