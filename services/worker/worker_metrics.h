// The worker's Prometheus series (common/metrics.h), shared by the host and
// its runners. Thread-safe (the series are).
#ifndef SHOAL_SERVICES_WORKER_WORKER_METRICS_H_
#define SHOAL_SERVICES_WORKER_WORKER_METRICS_H_

#include "common/metrics.h"

namespace shoal::worker {

// The worker's Prometheus series, updated once per action (never per chunk:
// the exchange's hot path stays free of metric calls).
struct WorkerMetrics {
  MetricHistogram train_seconds = Metrics::Histogram(
      "shoal_train_duration_seconds", "Local training of one round (all its local steps).",
      Metrics::SecondsBuckets());
  // Where the worker's time goes (issue 27): rate() of these is the share
  // of wall time spent training (the compute utilization) and in
  // exchanges; the rest is idle (docs/OPERATIONS.md).
  MetricCounter seconds_training = Metrics::Counter(
      "shoal_worker_seconds_total", "Seconds this worker spent, by part.", {{"part", "train"}});
  MetricCounter seconds_exchanging = Metrics::Counter(
      "shoal_worker_seconds_total", "Seconds this worker spent, by part.", {{"part", "exchange"}});
  // Replaying other members' rounds for audits (docs/SECURITY.md): its
  // rate over part="train"'s is the audits' extra compute.
  MetricCounter seconds_auditing = Metrics::Counter(
      "shoal_worker_seconds_total", "Seconds this worker spent, by part.", {{"part", "audit"}});
  // Rounds with this worker's work in flight: 1 from its ready report to
  // its exchange's end; overlapped rounds (--overlap=on) add the round it
  // trains ahead meanwhile (docs/OVERLAP.md).
  MetricGauge rounds_in_flight = Metrics::Gauge(
      "shoal_worker_rounds_in_flight",
      "Rounds with this worker's work in flight (2: overlapped, the next one trains meanwhile).");
  MetricGauge train_loss =
      Metrics::Gauge("shoal_train_loss", "Mean training loss of this worker's latest round.");
  MetricGauge test_accuracy = Metrics::Gauge(
      "shoal_test_accuracy", "Test accuracy (0..1) of the averaged model, latest evaluation.");
  MetricGauge test_loss =
      Metrics::Gauge("shoal_test_loss", "Test loss of the averaged model, latest evaluation.");
  MetricGauge model_round =
      Metrics::Gauge("shoal_worker_round", "Round of the latest exchange this worker reported.");
  MetricHistogram exchange_seconds = Metrics::Histogram(
      "shoal_exchange_duration_seconds",
      "A successful sharded exchange (reduce-scatter and all-gather) of one round.",
      Metrics::SecondsBuckets());
  MetricCounter exchanges_ok =
      Metrics::Counter("shoal_exchanges_total", "Exchanges by result.", {{"result", "ok"}});
  MetricCounter exchanges_failed =
      Metrics::Counter("shoal_exchanges_total", "Exchanges by result.", {{"result", "error"}});
  MetricCounter received_bytes = Metrics::Counter("shoal_exchange_received_bytes_total",
                                                  "Model bytes received from peers in exchanges.");
  MetricCounter sent_exchange = Metrics::Counter(
      "shoal_peer_sent_bytes_total",
      "Model bytes this worker served to peers (written to their streams), by what was read.",
      {{"kind", "exchange"}});
  MetricCounter sent_snapshot = Metrics::Counter(
      "shoal_peer_sent_bytes_total",
      "Model bytes this worker served to peers (written to their streams), by what was read.",
      {{"kind", "snapshot"}});
  MetricCounter sent_model_file = Metrics::Counter(
      "shoal_peer_sent_bytes_total",
      "Model bytes this worker served to peers (written to their streams), by what was read.",
      {{"kind", "model_file"}});
  MetricCounter retries = Metrics::Counter("shoal_exchange_retries_total",
                                           "Slice reads retried (resumed) during exchanges.");
  MetricHistogram catchup_seconds = Metrics::Histogram(
      "shoal_catchup_duration_seconds",
      "A catch-up (late join or missed round): the model pulled from peers or the store.",
      Metrics::SecondsBuckets());
  MetricCounter catchup_bytes = Metrics::Counter("shoal_catchup_received_bytes_total",
                                                 "Model bytes pulled by successful catch-ups.");
  MetricCounter catchups_ok =
      Metrics::Counter("shoal_catchups_total", "Catch-ups by result.", {{"result", "ok"}});
  MetricCounter catchups_failed =
      Metrics::Counter("shoal_catchups_total", "Catch-ups by result.", {{"result", "error"}});
  MetricHistogram upload_seconds = Metrics::Histogram(
      "shoal_checkpoint_upload_duration_seconds",
      "A checkpoint upload by this worker to the store.", Metrics::SecondsBuckets());
  MetricCounter uploads_ok =
      Metrics::Counter("shoal_checkpoint_uploads_total",
                       "Checkpoint uploads by this worker, by result.", {{"result", "ok"}});
  MetricCounter uploads_failed =
      Metrics::Counter("shoal_checkpoint_uploads_total",
                       "Checkpoint uploads by this worker, by result.", {{"result", "error"}});
};

// The series, registered at the first call (the host calls it when it
// starts serving metrics, so that every series is listed from the first
// scrape on).
const WorkerMetrics& M();

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_WORKER_METRICS_H_
