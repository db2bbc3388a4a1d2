// common/metrics: the handles and the /metrics exposer (a scrape of its own
// exposer on 127.0.0.1:0; the one unit test here that opens a socket, since
// serving is what the helper is for).
#include "common/metrics.h"

#include "gtest/gtest.h"
#include "tests/support/http_get.h"

namespace shoal {
namespace {

TEST(MetricsTest, ExposerServesRegisteredNames) {
  MetricCounter ops = Metrics::Counter("shoal_test_ops_total", "Test operations.", {{"kind", "a"}});
  MetricGauge round = Metrics::Gauge("shoal_test_round", "Test round.");
  MetricHistogram seconds = Metrics::Histogram("shoal_test_duration_seconds", "Test durations.",
                                               Metrics::SecondsBuckets());
  ops.Add();
  ops.Add(2);
  round.Set(7);
  seconds.Observe(0.3);
  absl::StatusOr<std::unique_ptr<Metrics>> m = Metrics::Start("127.0.0.1:0");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_GT((*m)->port(), 0);
  EXPECT_EQ((*m)->address(), "127.0.0.1:" + std::to_string((*m)->port()));
  const std::string body = testing::HttpGet((*m)->port(), "/metrics");
  EXPECT_NE(body.find("shoal_test_ops_total{kind=\"a\"} 3"), std::string::npos) << body;
  EXPECT_NE(body.find("shoal_test_round 7"), std::string::npos) << body;
  EXPECT_NE(body.find("shoal_test_duration_seconds_count 1"), std::string::npos) << body;
  EXPECT_NE(body.find("shoal_test_duration_seconds_bucket{le=\"0.5\"} 1"), std::string::npos)
      << body;
  EXPECT_NE(body.find("# TYPE shoal_test_ops_total counter"), std::string::npos) << body;
}

TEST(MetricsTest, SameNameAndLabelsIsOneSeries) {
  Metrics::Counter("shoal_test_shared_total", "Shared.").Add();
  Metrics::Counter("shoal_test_shared_total", "Shared.").Add();
  EXPECT_NE(Metrics::Render().find("shoal_test_shared_total 2"), std::string::npos)
      << Metrics::Render();
}

TEST(MetricsTest, DefaultHandlesDoNothing) {
  MetricCounter c;
  MetricGauge g;
  MetricHistogram h;
  c.Add();
  g.Set(1);
  h.Observe(1);
}

TEST(MetricsTest, BadAddressesAreRefused) {
  EXPECT_EQ(Metrics::Start("no-port").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Metrics::Start("127.0.0.1:99999").status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::unique_ptr<Metrics>> first = Metrics::Start("127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<Metrics>> taken =
      Metrics::Start("127.0.0.1:" + std::to_string((*first)->port()));
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kUnavailable) << taken.status();
}

}  // namespace
}  // namespace shoal
