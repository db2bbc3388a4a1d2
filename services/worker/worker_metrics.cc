#include "services/worker/worker_metrics.h"

namespace shoal::worker {

const WorkerMetrics& M() {
  static const WorkerMetrics* m = new WorkerMetrics();
  return *m;
}

}  // namespace shoal::worker
