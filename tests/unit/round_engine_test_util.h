// Helpers shared by the round engine's unit tests (round_engine_test.cc,
// round_engine_membership_test.cc): directive kinds, well-formed values and
// lookups into Directives and RunStatus.
#ifndef SHOAL_TESTS_UNIT_ROUND_ENGINE_TEST_UTIL_H_
#define SHOAL_TESTS_UNIT_ROUND_ENGINE_TEST_UTIL_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/coordinator/core/round_engine.h"

namespace shoal::coordinator::test_util {

using ::shoal::v1::CoordinatorMessage;

constexpr uint64_t kTotal = 1000;
constexpr auto kStart = CoordinatorMessage::kRoundStart;
constexpr auto kPlan = CoordinatorMessage::kRoundPlan;
constexpr auto kComplete = CoordinatorMessage::kRoundComplete;
constexpr auto kFinished = CoordinatorMessage::kRunFinished;
constexpr auto kAborted = CoordinatorMessage::kRoundAborted;
constexpr auto kStartSharing = CoordinatorMessage::kStartSharing;
constexpr auto kRetry = CoordinatorMessage::kRetryConnections;
constexpr auto kConnFail = CoordinatorMessage::kConnectionFail;
constexpr auto kMissed = CoordinatorMessage::kRoundMissed;
constexpr auto kLeave = CoordinatorMessage::kLeaveRequested;
constexpr auto kCheckpoint = CoordinatorMessage::kCheckpointRequest;

// A well-formed SHA-256 hex digest made of one repeated digit.
inline std::string Hash(char c) { return std::string(64, c); }

inline std::string Address(int port) { return absl::StrCat("127.0.0.1:", port); }

// Recipients of the directives of one kind, in order.
inline std::vector<std::string> To(const Directives& ds, CoordinatorMessage::KindCase kind) {
  std::vector<std::string> ids;
  for (const Directive& d : ds) {
    if (d.message->kind_case() == kind) ids.push_back(d.worker_id);
  }
  return ids;
}

// The directive of `kind` for `id`; fails the test when there is none.
inline CoordinatorMessage MessageFor(const Directives& ds, const std::string& id,
                                     CoordinatorMessage::KindCase kind) {
  for (const Directive& d : ds) {
    if (d.worker_id == id && d.message->kind_case() == kind) return *d.message;
  }
  ADD_FAILURE() << "no directive of kind " << kind << " for " << id;
  return CoordinatorMessage();
}

inline std::optional<shoal::v1::WorkerStatus> FindWorker(const shoal::v1::RunStatus& status,
                                                         const std::string& id) {
  for (const shoal::v1::WorkerStatus& w : status.workers()) {
    if (w.id() == id) return w;
  }
  return std::nullopt;
}

inline std::vector<std::string> Participants(const shoal::v1::RunStatus& status) {
  return {status.participants().begin(), status.participants().end()};
}

}  // namespace shoal::coordinator::test_util

#endif  // SHOAL_TESTS_UNIT_ROUND_ENGINE_TEST_UTIL_H_
