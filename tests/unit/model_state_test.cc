// Unit tests of ModelState::CheckRead: which slice reads a worker may serve
// in which state of its round, and with which status code otherwise.
#include "services/worker/core/model_state.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace shoal::worker {
namespace {

using ::shoal::v1::AVERAGED;
using ::shoal::v1::CONTRIBUTION;
using ::shoal::v1::ReadSliceRequest;
using ::shoal::v1::SLICE_KIND_UNSPECIFIED;
using ::shoal::v1::SliceKind;

constexpr uint64_t kTotal = 100;

ReadSliceRequest Request(uint64_t round, uint64_t begin, uint64_t end, SliceKind kind) {
  ReadSliceRequest r;
  r.set_round(round);
  r.set_begin(begin);
  r.set_end(end);
  r.set_kind(kind);
  r.set_reader_id("w9");
  return r;
}

absl::StatusCode Code(const ModelState& s, uint64_t round, uint64_t begin, uint64_t end,
                      SliceKind kind) {
  return s.CheckRead(Request(round, begin, end, kind)).code();
}

class ModelStateTest : public ::testing::Test {
 protected:
  ModelStateTest() : params_(kTotal, 1.0f), state_(params_.data(), kTotal, "mlp") {}

  // Round 3 trained and ready; owns [40, 60) once `plan` is set.
  void ReadyForRound3(bool plan) {
    state_.BeginTraining(3);
    state_.SetReady(3);
    if (plan) state_.SetPlan(3, /*attempt=*/0, 40, 60);
  }

  std::vector<float> params_;
  ModelState state_;
};

TEST(ModelStateUnboundTest, UnboundIsUnavailable) {
  ModelState state;
  EXPECT_EQ(Code(state, 0, 0, 1, CONTRIBUTION), absl::StatusCode::kUnavailable);
  state.BeginTraining(1);
  state.SetReady(1);
  EXPECT_EQ(Code(state, 1, 0, 1, CONTRIBUTION), absl::StatusCode::kUnavailable);
  EXPECT_EQ(state.parameters(), nullptr);
  EXPECT_EQ(state.total_elements(), 0u);
}

TEST(ModelStateUnboundTest, BindLater) {
  std::vector<float> params(10);
  ModelState state;
  state.Bind(params.data(), params.size(), "cnn");
  state.BeginTraining(1);
  state.SetReady(1);
  EXPECT_EQ(Code(state, 1, 0, 10, CONTRIBUTION), absl::StatusCode::kOk);
  EXPECT_EQ(state.parameters(), params.data());
  EXPECT_EQ(state.total_elements(), 10u);
}

TEST_F(ModelStateTest, EmptyOrReversedRangeIsInvalidArgument) {
  ReadyForRound3(true);
  EXPECT_EQ(Code(state_, 3, 5, 5, CONTRIBUTION), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Code(state_, 3, 6, 5, CONTRIBUTION), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Code(state_, 3, 0, 0, CONTRIBUTION), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Code(state_, 3, 50, 50, AVERAGED), absl::StatusCode::kInvalidArgument);
}

TEST_F(ModelStateTest, PastTheEndIsOutOfRange) {
  ReadyForRound3(true);
  EXPECT_EQ(Code(state_, 3, 0, kTotal + 1, CONTRIBUTION), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(Code(state_, 3, kTotal, kTotal + 5, CONTRIBUTION), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(Code(state_, 3, 0, kTotal, CONTRIBUTION), absl::StatusCode::kOk);
  EXPECT_EQ(Code(state_, 3, kTotal - 1, kTotal, CONTRIBUTION), absl::StatusCode::kOk);
}

TEST_F(ModelStateTest, UnspecifiedKindIsInvalidArgument) {
  ReadyForRound3(true);
  EXPECT_EQ(Code(state_, 3, 0, 10, SLICE_KIND_UNSPECIFIED), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Code(state_, 3, 0, 10, static_cast<SliceKind>(7)), absl::StatusCode::kInvalidArgument);
}

TEST_F(ModelStateTest, StaleOrFutureRoundIsFailedPrecondition) {
  ReadyForRound3(true);
  state_.MarkAveraged(3);
  EXPECT_EQ(Code(state_, 2, 0, 10, CONTRIBUTION), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Code(state_, 4, 0, 10, CONTRIBUTION), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Code(state_, 2, 40, 60, AVERAGED), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Code(state_, 4, 40, 60, AVERAGED), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Code(state_, 3, 40, 60, AVERAGED), absl::StatusCode::kOk);
}

TEST_F(ModelStateTest, NotReadyIsFailedPrecondition) {
  state_.BeginTraining(3);
  EXPECT_EQ(Code(state_, 3, 0, 10, CONTRIBUTION), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Code(state_, 3, 40, 60, AVERAGED), absl::StatusCode::kFailedPrecondition);
  state_.SetPlan(3, /*attempt=*/0, 40, 60);
  EXPECT_EQ(Code(state_, 3, 40, 60, AVERAGED), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ModelStateTest, ContributionIsServedOnceReady) {
  ReadyForRound3(false);
  EXPECT_EQ(Code(state_, 3, 0, kTotal, CONTRIBUTION), absl::StatusCode::kOk);
  EXPECT_EQ(Code(state_, 3, 10, 20, CONTRIBUTION), absl::StatusCode::kOk);
  // Independent of the plan and of what the worker owns.
  state_.SetPlan(3, /*attempt=*/0, 40, 60);
  EXPECT_EQ(Code(state_, 3, 0, 10, CONTRIBUTION), absl::StatusCode::kOk);
  state_.MarkAveraged(3);
  EXPECT_EQ(Code(state_, 3, 0, 10, CONTRIBUTION), absl::StatusCode::kOk);
}

TEST_F(ModelStateTest, AveragedBeforePlanIsUnavailable) {
  ReadyForRound3(false);
  EXPECT_EQ(Code(state_, 3, 40, 60, AVERAGED), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Code(state_, 3, 0, 10, AVERAGED), absl::StatusCode::kUnavailable);
}

TEST_F(ModelStateTest, PlanForAnotherRoundIsIgnored) {
  ReadyForRound3(false);
  state_.SetPlan(2, /*attempt=*/0, 40, 60);
  EXPECT_EQ(Code(state_, 3, 40, 60, AVERAGED), absl::StatusCode::kUnavailable);
  state_.SetPlan(3, /*attempt=*/0, 40, 60);
  state_.MarkAveraged(2);  // wrong round: still not averaged
  EXPECT_EQ(Code(state_, 3, 40, 60, AVERAGED), absl::StatusCode::kUnavailable);
}

TEST_F(ModelStateTest, AveragedOutsideOwnSliceIsFailedPrecondition) {
  ReadyForRound3(true);
  EXPECT_EQ(Code(state_, 3, 0, 10, AVERAGED), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Code(state_, 3, 39, 60, AVERAGED), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Code(state_, 3, 40, 61, AVERAGED), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Code(state_, 3, 60, 70, AVERAGED), absl::StatusCode::kFailedPrecondition);
  state_.MarkAveraged(3);
  EXPECT_EQ(Code(state_, 3, 0, 10, AVERAGED), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Code(state_, 3, 30, 50, AVERAGED), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ModelStateTest, OwnSliceUnavailableUntilAveraged) {
  ReadyForRound3(true);
  EXPECT_EQ(Code(state_, 3, 40, 60, AVERAGED), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Code(state_, 3, 45, 50, AVERAGED), absl::StatusCode::kUnavailable);
  state_.MarkAveraged(3);
  EXPECT_EQ(Code(state_, 3, 40, 60, AVERAGED), absl::StatusCode::kOk);
  EXPECT_EQ(Code(state_, 3, 45, 50, AVERAGED), absl::StatusCode::kOk);
  EXPECT_EQ(Code(state_, 3, 59, 60, AVERAGED), absl::StatusCode::kOk);
}

TEST_F(ModelStateTest, AbortStopsServingTheRound) {
  ReadyForRound3(true);
  state_.MarkAveraged(3);
  ASSERT_EQ(Code(state_, 3, 40, 60, AVERAGED), absl::StatusCode::kOk);
  state_.Abort(2);  // another round: no effect
  EXPECT_EQ(Code(state_, 3, 40, 60, AVERAGED), absl::StatusCode::kOk);
  state_.Abort(3);
  EXPECT_EQ(Code(state_, 3, 40, 60, AVERAGED), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Code(state_, 3, 0, 10, CONTRIBUTION), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ModelStateTest, NewRoundForgetsThePreviousPlan) {
  ReadyForRound3(true);
  state_.MarkAveraged(3);
  state_.BeginTraining(4);
  state_.SetReady(4);
  EXPECT_EQ(Code(state_, 4, 0, 10, CONTRIBUTION), absl::StatusCode::kOk);
  EXPECT_EQ(Code(state_, 4, 40, 60, AVERAGED), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Code(state_, 3, 40, 60, AVERAGED), absl::StatusCode::kFailedPrecondition);
  state_.SetPlan(4, /*attempt=*/0, 0, 20);
  EXPECT_EQ(Code(state_, 4, 40, 60, AVERAGED), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Code(state_, 4, 0, 20, AVERAGED), absl::StatusCode::kUnavailable);
}

TEST_F(ModelStateTest, ShuttingDownIsUnavailable) {
  ReadyForRound3(true);
  state_.MarkAveraged(3);
  state_.SetShuttingDown();
  EXPECT_EQ(Code(state_, 3, 0, 10, CONTRIBUTION), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Code(state_, 3, 40, 60, AVERAGED), absl::StatusCode::kUnavailable);
  // Rejections that do not depend on the state stay what they are.
  EXPECT_EQ(Code(state_, 3, 5, 5, CONTRIBUTION), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Code(state_, 3, 0, kTotal + 1, CONTRIBUTION), absl::StatusCode::kOutOfRange);
}

TEST_F(ModelStateTest, ErrorMessagesExplain) {
  ReadyForRound3(true);
  absl::Status s = state_.CheckRead(Request(2, 0, 10, CONTRIBUTION));
  EXPECT_NE(s.message().find("stale"), std::string::npos) << s;
  s = state_.CheckRead(Request(3, 0, 10, AVERAGED));
  EXPECT_NE(s.message().find("[40, 60)"), std::string::npos) << s;
}

TEST_F(ModelStateTest, Info) {
  shoal::v1::PeerInfo info = state_.Info();
  EXPECT_EQ(info.worker_id(), "");
  EXPECT_EQ(info.model_round(), 0u);
  EXPECT_EQ(info.model_hash(), "");
  EXPECT_EQ(info.total_elements(), kTotal);
  EXPECT_EQ(info.model(), "mlp");

  state_.SetWorkerId("w3");
  state_.SetModel(7, "abcdef");
  info = state_.Info();
  EXPECT_EQ(info.worker_id(), "w3");
  EXPECT_EQ(info.model_round(), 7u);
  EXPECT_EQ(info.model_hash(), "abcdef");
  EXPECT_EQ(info.total_elements(), kTotal);
  EXPECT_EQ(info.model(), "mlp");
  EXPECT_EQ(state_.parameters(), params_.data());
  EXPECT_EQ(state_.total_elements(), kTotal);
}

}  // namespace
}  // namespace shoal::worker
