// Unit tests of the serving rule (which reads a worker may serve in which
// state, with which code) and of the lending ledger, directly: no
// ModelState, no threads but the ledger's own waits.
#include "services/worker/core/serving_rule.h"

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "services/worker/core/lending_ledger.h"

namespace shoal::worker {
namespace {

using ::shoal::v1::AVERAGED;
using ::shoal::v1::CONTRIBUTION;
using ::shoal::v1::ReadSliceRequest;
using ::shoal::v1::SliceKind;
using ::shoal::v1::SNAPSHOT;

ReadSliceRequest Request(uint64_t round, uint64_t begin, uint64_t end, SliceKind kind,
                         uint32_t attempt = 0) {
  ReadSliceRequest r;
  r.set_round(round);
  r.set_begin(begin);
  r.set_end(end);
  r.set_kind(kind);
  r.set_attempt(attempt);
  return r;
}

// Round 3, trained, plan attempt 1 gives [40, 60), averaged; snapshot of
// round 2.
ServingState Serving() {
  ServingState s;
  s.bound = true;
  s.total_elements = 100;
  s.round = 3;
  s.ready = true;
  s.has_plan = true;
  s.attempt = 1;
  s.own_begin = 40;
  s.own_end = 60;
  s.averaged = true;
  s.has_snapshot = true;
  s.snapshot_valid = true;
  s.snapshot_round = 2;
  return s;
}

absl::StatusCode Code(const ServingState& s, const ReadSliceRequest& r) {
  return DecideRead(s, r).status.code();
}

TEST(ServingRuleTest, ServesEachKindFromItsBuffer) {
  const ServingState s = Serving();
  ServingDecision d = DecideRead(s, Request(3, 0, 100, CONTRIBUTION, 1));
  ASSERT_TRUE(d.status.ok()) << d.status;
  EXPECT_EQ(d.buffer, ModelBuffer::kParameters);
  d = DecideRead(s, Request(3, 40, 60, AVERAGED, 1));
  ASSERT_TRUE(d.status.ok()) << d.status;
  EXPECT_EQ(d.buffer, ModelBuffer::kParameters);
  d = DecideRead(s, Request(2, 0, 100, SNAPSHOT));
  ASSERT_TRUE(d.status.ok()) << d.status;
  EXPECT_EQ(d.buffer, ModelBuffer::kSnapshot);
}

TEST(ServingRuleTest, MalformedRequestsAreFinal) {
  const ServingState s = Serving();
  EXPECT_EQ(Code(s, Request(3, 5, 5, CONTRIBUTION, 1)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Code(s, Request(3, 6, 5, CONTRIBUTION, 1)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Code(s, Request(3, 0, 101, CONTRIBUTION, 1)), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(Code(s, Request(3, 0, 10, shoal::v1::SLICE_KIND_UNSPECIFIED, 1)),
            absl::StatusCode::kInvalidArgument);
}

TEST(ServingRuleTest, StagesOfAHierarchicalRoundAreNotLentMemory) {
  // Stages are immutable copies read with ReadEncoded; model memory is
  // never lent for them.
  ReadSliceRequest r = Request(3, 0, 100, CONTRIBUTION, 1);
  r.set_stage(1);
  const ServingDecision d = DecideRead(Serving(), r);
  EXPECT_EQ(d.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(d.may_wait);
  r.set_kind(shoal::v1::STAGE_MODEL);
  r.set_stage(0);
  EXPECT_EQ(Code(Serving(), r), absl::StatusCode::kInvalidArgument);
}

TEST(ServingRuleTest, UnboundOrShuttingDownIsUnavailable) {
  ServingState s = Serving();
  s.bound = false;
  EXPECT_EQ(Code(s, Request(3, 0, 10, CONTRIBUTION, 1)), absl::StatusCode::kUnavailable);
  s = Serving();
  s.shutting_down = true;
  for (SliceKind kind : {CONTRIBUTION, AVERAGED, SNAPSHOT}) {
    const ServingDecision d = DecideRead(s, Request(kind == SNAPSHOT ? 2 : 3, 40, 60, kind, 1));
    EXPECT_EQ(d.status.code(), absl::StatusCode::kUnavailable) << kind;
    EXPECT_FALSE(d.may_wait);
  }
}

TEST(ServingRuleTest, WrongRoundNotTrainedOrOtherAttemptIsFailedPrecondition) {
  ServingState s = Serving();
  EXPECT_EQ(Code(s, Request(2, 0, 10, CONTRIBUTION, 1)), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Code(s, Request(4, 0, 10, CONTRIBUTION, 1)), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Code(s, Request(3, 0, 10, CONTRIBUTION, 0)), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Code(s, Request(3, 40, 60, AVERAGED, 2)), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Code(s, Request(3, 30, 60, AVERAGED, 1)), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Code(s, Request(3, 40, 61, AVERAGED, 1)), absl::StatusCode::kFailedPrecondition);
  s.ready = false;
  EXPECT_EQ(Code(s, Request(3, 0, 10, CONTRIBUTION, 1)), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Code(s, Request(3, 40, 60, AVERAGED, 1)), absl::StatusCode::kFailedPrecondition);
}

TEST(ServingRuleTest, ContributionNeedsNoPlan) {
  ServingState s = Serving();
  s.has_plan = false;
  s.averaged = false;
  // Without a plan any attempt is accepted.
  EXPECT_EQ(Code(s, Request(3, 0, 100, CONTRIBUTION, 7)), absl::StatusCode::kOk);
}

TEST(ServingRuleTest, AveragedReadMayWaitForThePlanAndTheAverage) {
  ServingState s = Serving();
  s.has_plan = false;
  s.averaged = false;
  ServingDecision d = DecideRead(s, Request(3, 40, 60, AVERAGED, 0));
  EXPECT_EQ(d.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(d.may_wait);
  s = Serving();
  s.averaged = false;
  d = DecideRead(s, Request(3, 40, 60, AVERAGED, 1));
  EXPECT_EQ(d.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(d.may_wait);
  // Outside the owned slice waiting would not help.
  d = DecideRead(s, Request(3, 30, 60, AVERAGED, 1));
  EXPECT_EQ(d.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(d.may_wait);
}

TEST(ServingRuleTest, SnapshotReads) {
  ServingState s = Serving();
  // Independent of the round being trained.
  s.ready = false;
  s.round = 9;
  EXPECT_EQ(Code(s, Request(2, 0, 100, SNAPSHOT)), absl::StatusCode::kOk);
  EXPECT_EQ(Code(s, Request(3, 0, 100, SNAPSHOT)), absl::StatusCode::kFailedPrecondition);
  s.snapshot_valid = false;
  EXPECT_EQ(Code(s, Request(2, 0, 100, SNAPSHOT)), absl::StatusCode::kUnavailable);
  s = Serving();
  s.has_snapshot = false;
  EXPECT_EQ(Code(s, Request(2, 0, 100, SNAPSHOT)), absl::StatusCode::kUnavailable);
}

TEST(ServingRuleTest, Manifest) {
  ServingState s = Serving();
  EXPECT_TRUE(DecideManifest(s, 2).ok());
  EXPECT_EQ(DecideManifest(s, 3).code(), absl::StatusCode::kFailedPrecondition);
  s.snapshot_valid = false;
  EXPECT_EQ(DecideManifest(s, 2).code(), absl::StatusCode::kUnavailable);
  s = Serving();
  s.shutting_down = true;
  EXPECT_EQ(DecideManifest(s, 2).code(), absl::StatusCode::kUnavailable);
  s = Serving();
  s.has_snapshot = false;
  EXPECT_EQ(DecideManifest(s, 2).code(), absl::StatusCode::kUnavailable);
}

TEST(LendingLedgerTest, LendsOnlyInTheOpenWindow) {
  LendingLedger ledger;
  const uint64_t w = ledger.window(ModelBuffer::kParameters);
  EXPECT_TRUE(ledger.Lend(ModelBuffer::kParameters, w));
  EXPECT_EQ(ledger.lent(ModelBuffer::kParameters), 1);
  EXPECT_EQ(ledger.lent(ModelBuffer::kSnapshot), 0);
  ledger.CloseWindow(ModelBuffer::kParameters);
  EXPECT_FALSE(ledger.IsOpen(ModelBuffer::kParameters, w));
  EXPECT_FALSE(ledger.Lend(ModelBuffer::kParameters, w));
  EXPECT_EQ(ledger.lent(ModelBuffer::kParameters), 1);
  // Windows are per buffer.
  EXPECT_TRUE(ledger.Lend(ModelBuffer::kSnapshot, ledger.window(ModelBuffer::kSnapshot)));
  ledger.Return(ModelBuffer::kParameters);
  ledger.Return(ModelBuffer::kSnapshot);
  EXPECT_TRUE(ledger.AwaitAllReturned(absl::ZeroDuration()));
}

TEST(LendingLedgerTest, AwaitReturnedRevokesAfterTheGrace) {
  LendingLedger ledger;
  ledger.LendUnconditionally(ModelBuffer::kSnapshot);
  int revoked = 0;
  // The holder gives the chunk back when asked to cancel.
  EXPECT_TRUE(ledger.AwaitReturned(ModelBuffer::kSnapshot, absl::Seconds(5), [&] {
    ++revoked;
    ledger.Return(ModelBuffer::kSnapshot);
  }));
  EXPECT_EQ(revoked, 1);
  // Nothing lent: no revoke, at once.
  EXPECT_TRUE(ledger.AwaitReturned(ModelBuffer::kSnapshot, absl::Seconds(5), [&] { ++revoked; }));
  EXPECT_EQ(revoked, 1);
  // A holder that never returns: false after the timeout.
  ledger.LendUnconditionally(ModelBuffer::kParameters);
  EXPECT_FALSE(
      ledger.AwaitReturned(ModelBuffer::kParameters, absl::Milliseconds(20), [&] { ++revoked; }));
  EXPECT_EQ(revoked, 2);
  ledger.Return(ModelBuffer::kParameters);
}

}  // namespace
}  // namespace shoal::worker
