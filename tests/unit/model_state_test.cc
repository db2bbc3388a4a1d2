// Unit tests of ModelState::CheckRead: which slice reads a worker may serve
// in which state of its round, and with which status code otherwise; and of
// the lending of model memory to the zero-copy peer service (windows,
// precomputed CRCs, AwaitReturned, observers).
#include "services/worker/core/model_state.h"

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "common/crc32c.h"
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

// ---------------------------------------------------------------- lending

using Buffer = ModelState::Buffer;

TEST_F(ModelStateTest, WaitingIsOfferedOnlyForAveragedReadsThatMaySucceedLater) {
  ReadyForRound3(false);
  ModelState::ReadGrant grant;
  bool may_wait = false;
  EXPECT_TRUE(
      absl::IsUnavailable(state_.CheckRead(Request(3, 40, 60, AVERAGED), &grant, &may_wait)));
  EXPECT_TRUE(may_wait) << "no plan yet";
  state_.SetPlan(3, 0, 40, 60);
  EXPECT_TRUE(
      absl::IsUnavailable(state_.CheckRead(Request(3, 40, 60, AVERAGED), &grant, &may_wait)));
  EXPECT_TRUE(may_wait) << "not averaged yet";
  EXPECT_FALSE(state_.CheckRead(Request(3, 0, 10, AVERAGED), &grant, &may_wait).ok());
  EXPECT_FALSE(may_wait) << "not its slice: final";
  state_.MarkAveraged(3);
  EXPECT_TRUE(state_.CheckRead(Request(3, 40, 60, AVERAGED), &grant, &may_wait).ok());
  EXPECT_FALSE(may_wait);
  state_.BeginTraining(4);
  EXPECT_FALSE(state_.CheckRead(Request(4, 40, 60, AVERAGED), &grant, &may_wait).ok());
  EXPECT_FALSE(may_wait) << "not trained: final";
  state_.SetReady(4);
  state_.SetPlan(4, 0, 40, 60);
  state_.SetShuttingDown();
  EXPECT_TRUE(
      absl::IsUnavailable(state_.CheckRead(Request(4, 40, 60, AVERAGED), &grant, &may_wait)));
  EXPECT_FALSE(may_wait) << "shutting down";
}

TEST_F(ModelStateTest, ChunksAreLentOnlyWhileTheirWindowIsOpen) {
  ReadyForRound3(true);
  ModelState::ReadGrant grant;
  ASSERT_TRUE(state_.CheckRead(Request(3, 0, 10, CONTRIBUTION), &grant, nullptr).ok());
  EXPECT_EQ(grant.buffer, Buffer::kParameters);
  absl::StatusOr<ModelState::LentChunk> lent = state_.LendChunk(grant, 5, 5);
  ASSERT_TRUE(lent.ok()) << lent.status();
  EXPECT_EQ(lent->data, params_.data() + 5);
  EXPECT_EQ(state_.chunks_lent(Buffer::kParameters), 1);
  // Changes within the window keep it open.
  state_.SetPlan(3, 0, 40, 60);  // the same attempt again (the Exchanger does this)
  state_.MarkAveraged(3);
  state_.SetReady(3);
  EXPECT_TRUE(state_.IsCurrent(grant));
  ASSERT_TRUE(state_.LendChunk(grant, 0, 5).ok());
  state_.ReturnChunk(Buffer::kParameters);

  state_.BeginTraining(4);
  EXPECT_FALSE(state_.IsCurrent(grant));
  EXPECT_EQ(state_.LendChunk(grant, 0, 5).status().code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(state_.AwaitReturned(Buffer::kParameters, absl::Milliseconds(30)))
      << "one chunk is still lent";
  state_.ReturnChunk(Buffer::kParameters);
  EXPECT_TRUE(state_.AwaitReturned(Buffer::kParameters, absl::Milliseconds(30)));
  EXPECT_EQ(state_.chunks_lent(Buffer::kParameters), 0);
}

TEST_F(ModelStateTest, EveryRewriteOfTheParametersClosesTheirWindow) {
  const std::vector<std::function<void(ModelState*)>> closers = {
      [](ModelState* s) { s->BeginTraining(4); }, [](ModelState* s) { s->Unready(); },
      [](ModelState* s) { s->Abort(3); },
      [](ModelState* s) { s->SetPlan(3, /*attempt=*/1, 0, 20); },  // a new attempt
  };
  for (size_t i = 0; i < closers.size(); ++i) {
    ModelState state(params_.data(), kTotal, "mlp");
    state.BeginTraining(3);
    state.SetReady(3);
    state.SetPlan(3, 0, 40, 60);
    ModelState::ReadGrant grant;
    ASSERT_TRUE(state.CheckRead(Request(3, 0, 10, CONTRIBUTION), &grant, nullptr).ok());
    closers[i](&state);
    EXPECT_FALSE(state.IsCurrent(grant)) << "closer " << i;
    EXPECT_EQ(state.LendChunk(grant, 0, 10).status().code(), absl::StatusCode::kAborted)
        << "closer " << i;
  }
}

TEST_F(ModelStateTest, SnapshotChunksAreLentUntilTheSnapshotChanges) {
  std::vector<float> snapshot(kTotal, 2.0f);
  state_.BindSnapshot(snapshot.data());
  state_.SetSnapshot(1);
  shoal::v1::ReadSliceRequest r = Request(1, 0, kTotal, shoal::v1::SNAPSHOT);
  ModelState::ReadGrant grant;
  ASSERT_TRUE(state_.CheckRead(r, &grant, nullptr).ok());
  EXPECT_EQ(grant.buffer, Buffer::kSnapshot);
  absl::StatusOr<ModelState::LentChunk> lent = state_.LendChunk(grant, 10, 20);
  ASSERT_TRUE(lent.ok()) << lent.status();
  EXPECT_EQ(lent->data, snapshot.data() + 10);
  EXPECT_FALSE(lent->has_crc) << "snapshot chunks are checksummed when sent";
  state_.BeginSnapshotUpdate();
  EXPECT_EQ(state_.LendChunk(grant, 30, 20).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(state_.chunks_lent(Buffer::kSnapshot), 1);
  EXPECT_EQ(state_.chunks_lent(Buffer::kParameters), 0);
  state_.ReturnChunk(Buffer::kSnapshot);
  EXPECT_TRUE(state_.AwaitReturned(Buffer::kSnapshot, absl::Milliseconds(10)));
}

TEST_F(ModelStateTest, NothingIsLentWhileShuttingDown) {
  ReadyForRound3(true);
  ModelState::ReadGrant grant;
  ASSERT_TRUE(state_.CheckRead(Request(3, 0, 10, CONTRIBUTION), &grant, nullptr).ok());
  state_.SetShuttingDown();
  EXPECT_EQ(state_.LendChunk(grant, 0, 10).status().code(), absl::StatusCode::kUnavailable);
}

// A model of 2.5 cells: whole cells carry their CRC, computed when the
// contribution became readable and, for the owned slice, when it was
// averaged.
TEST(ModelStateCrcTest, WholeCellsCarryTheirPrecomputedCrc) {
  constexpr uint64_t kCell = ModelState::kCellElements;
  constexpr uint64_t kN = 2 * kCell + kCell / 2;
  std::vector<float> params(kN);
  for (uint64_t i = 0; i < kN; ++i) params[i] = static_cast<float>(i % 977) * 0.5f;
  ModelState state(params.data(), kN, "mlp");
  state.BeginTraining(1);
  state.SetReady(1);
  state.SetPlan(1, 0, kCell, kN);  // owns cells 1 and 2 (the last one partial)
  auto crc_of = [&](uint64_t begin, uint64_t count) {
    return Crc32c(params.data() + begin, count * sizeof(float));
  };
  ModelState::ReadGrant contribution;
  ASSERT_TRUE(state.CheckRead(Request(1, 0, kN, CONTRIBUTION), &contribution, nullptr).ok());
  for (auto [begin, count] : std::vector<std::pair<uint64_t, uint64_t>>{
           {0, kCell}, {kCell, kCell}, {2 * kCell, kN - 2 * kCell}}) {
    absl::StatusOr<ModelState::LentChunk> lent = state.LendChunk(contribution, begin, count);
    ASSERT_TRUE(lent.ok());
    EXPECT_TRUE(lent->has_crc) << begin;
    EXPECT_EQ(lent->crc, crc_of(begin, count)) << begin;
    state.ReturnChunk(Buffer::kParameters);
  }
  // Not a whole cell: computed by the sender.
  for (auto [begin, count] :
       std::vector<std::pair<uint64_t, uint64_t>>{{1, kCell - 1}, {0, kCell - 1}, {kCell, 10}}) {
    absl::StatusOr<ModelState::LentChunk> lent = state.LendChunk(contribution, begin, count);
    ASSERT_TRUE(lent.ok());
    EXPECT_FALSE(lent->has_crc) << begin << "+" << count;
    state.ReturnChunk(Buffer::kParameters);
  }
  // The owned slice is averaged in place: its cells get new CRCs.
  for (uint64_t i = kCell; i < kN; ++i) params[i] = params[i] / 3.0f + 1.0f;
  state.MarkAveraged(1);
  ModelState::ReadGrant averaged;
  ASSERT_TRUE(state.CheckRead(Request(1, kCell, kN, AVERAGED), &averaged, nullptr).ok());
  for (auto [begin, count] :
       std::vector<std::pair<uint64_t, uint64_t>>{{kCell, kCell}, {2 * kCell, kN - 2 * kCell}}) {
    absl::StatusOr<ModelState::LentChunk> lent = state.LendChunk(averaged, begin, count);
    ASSERT_TRUE(lent.ok());
    EXPECT_TRUE(lent->has_crc);
    EXPECT_EQ(lent->crc, crc_of(begin, count)) << begin;
    state.ReturnChunk(Buffer::kParameters);
  }
  // A new round: the cells are computed again at SetReady.
  state.BeginTraining(2);
  for (uint64_t i = 0; i < kCell; ++i) params[i] += 1.0f;
  state.SetReady(2);
  ModelState::ReadGrant next;
  ASSERT_TRUE(state.CheckRead(Request(2, 0, kCell, CONTRIBUTION), &next, nullptr).ok());
  absl::StatusOr<ModelState::LentChunk> lent = state.LendChunk(next, 0, kCell);
  ASSERT_TRUE(lent.ok());
  EXPECT_EQ(lent->crc, crc_of(0, kCell));
  state.ReturnChunk(Buffer::kParameters);
}

// Counts notifications; reference-counted like the peer service's reads.
class CountingObserver : public ModelState::Observer {
 public:
  void OnServingChange(bool revoke) override { ++(revoke ? revokes : changes); }
  void AddRef() override { ++refs; }
  void Release() override { --refs; }
  std::atomic<int> changes{0}, revokes{0}, refs{0};
};

TEST_F(ModelStateTest, ObserversHearEveryChangeUntilRemoved) {
  CountingObserver o;
  state_.AddObserver(&o);
  EXPECT_EQ(o.refs, 1);
  ReadyForRound3(true);  // BeginTraining, SetReady, SetPlan
  EXPECT_EQ(o.changes, 3);
  state_.MarkAveraged(3);
  state_.Abort(3);
  state_.SetShuttingDown();
  EXPECT_EQ(o.changes, 6);
  EXPECT_EQ(o.revokes, 0);
  EXPECT_EQ(o.refs, 1) << "references taken for a notification are given back";
  state_.RemoveObserver(&o);
  EXPECT_EQ(o.refs, 0);
  state_.RemoveObserver(&o);  // again: no effect
  EXPECT_EQ(o.refs, 0);
  state_.BeginTraining(4);
  EXPECT_EQ(o.changes, 6);
}

TEST_F(ModelStateTest, AwaitReturnedAsksStreamsToLetGoAfterAGrace) {
  ReadyForRound3(true);
  ModelState::ReadGrant grant;
  ASSERT_TRUE(state_.CheckRead(Request(3, 0, 10, CONTRIBUTION), &grant, nullptr).ok());
  ASSERT_TRUE(state_.LendChunk(grant, 0, 10).ok());
  // The "stream" gives its chunk back when asked to revoke.
  class Revoker : public CountingObserver {
   public:
    explicit Revoker(ModelState* s) : state(s) {}
    void OnServingChange(bool revoke) override {
      CountingObserver::OnServingChange(revoke);
      if (revoke) state->ReturnChunk(Buffer::kParameters);
    }
    ModelState* state;
  } revoker(&state_);
  state_.AddObserver(&revoker);
  state_.BeginTraining(4);
  // True (not a timeout), after the one revoke; how soon is not the test's
  // business (a loaded machine).
  EXPECT_TRUE(state_.AwaitReturned(Buffer::kParameters, absl::Seconds(30)));
  EXPECT_EQ(revoker.revokes, 1);
  state_.RemoveObserver(&revoker);
}

TEST_F(ModelStateTest, AwaitReturnedIsImmediateWhenNothingIsLent) {
  CountingObserver o;
  state_.AddObserver(&o);
  // Immediate: true with no time to wait.
  EXPECT_TRUE(state_.AwaitReturned(Buffer::kParameters, absl::ZeroDuration()));
  EXPECT_TRUE(state_.AwaitReturned(Buffer::kSnapshot, absl::ZeroDuration()));
  EXPECT_EQ(o.revokes, 0);
  state_.RemoveObserver(&o);
}

}  // namespace
}  // namespace shoal::worker
