// The states of a worker in RunStatus.workers (WorkerStatus.state) that mean
// it is no longer a member, and how it went (protos/shoal/v1/coordinator.proto):
// "left" (it said so), "lost" (it crashed or was cut off), "finished" (the
// run or its own work was done), "evicted" (the coordinator removed it).
// Every reader of the status (shoalctl, tests, the soak) asks here rather
// than listing the states itself.
#ifndef SHOAL_COMMON_WORKER_STATE_H_
#define SHOAL_COMMON_WORKER_STATE_H_

#include <string_view>

namespace shoal {

inline bool DepartedState(std::string_view state) {
  return state == "left" || state == "lost" || state == "finished" || state == "evicted";
}

}  // namespace shoal

#endif  // SHOAL_COMMON_WORKER_STATE_H_
