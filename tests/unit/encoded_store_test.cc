// What Peer.ReadEncoded serves (services/worker/core/encoded_store.h):
// UNAVAILABLE for what is not published yet (a later round or attempt, or
// this one before it is there), FAILED_PRECONDITION for an older round or
// attempt, INVALID_ARGUMENT for a request without a kind or with an empty
// or reversed range; the previous round's averages outlive one BeginRound;
// the outer optimizer state is served for its round only.
#include "services/worker/core/encoded_store.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace shoal::worker {
namespace {

using shoal::v1::AVERAGED;
using shoal::v1::CONTRIBUTION;
using shoal::v1::SNAPSHOT;

shoal::v1::ReadEncodedRequest Req(uint64_t round, uint32_t attempt, shoal::v1::SliceKind kind,
                                  uint64_t begin = 0, uint64_t end = 10) {
  shoal::v1::ReadEncodedRequest r;
  r.set_round(round);
  r.set_attempt(attempt);
  r.set_kind(kind);
  r.set_begin(begin);
  r.set_end(end);
  return r;
}

Blob B(const std::string& s) { return std::make_shared<const std::string>(s); }

absl::StatusCode Code(const EncodedStore& s, const shoal::v1::ReadEncodedRequest& r) {
  return s.Find(r).status().code();
}

TEST(EncodedStoreTest, NothingBeforeTheFirstRoundIsUnavailable) {
  EncodedStore s;
  EXPECT_EQ(Code(s, Req(1, 0, CONTRIBUTION)), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Code(s, Req(0, 0, SNAPSHOT)), absl::StatusCode::kUnavailable);
  // Publishing before BeginRound is ignored.
  s.Publish(1, 0, CONTRIBUTION, 0, 10, B("x"));
  EXPECT_EQ(Code(s, Req(1, 0, CONTRIBUTION)), absl::StatusCode::kUnavailable);
}

TEST(EncodedStoreTest, ServesWhatWasPublishedForItsRoundAndAttempt) {
  EncodedStore s;
  s.BeginRound(3, 0);
  const Blob blob = B("contribution");
  s.Publish(3, 0, CONTRIBUTION, 0, 10, blob);
  absl::StatusOr<Blob> got = s.Find(Req(3, 0, CONTRIBUTION));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, blob);  // shared, not copied
  // This round, not there yet: ask again.
  EXPECT_EQ(Code(s, Req(3, 0, CONTRIBUTION, 10, 20)), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Code(s, Req(3, 0, AVERAGED)), absl::StatusCode::kUnavailable);
  // Later rounds and attempts: not yet.
  EXPECT_EQ(Code(s, Req(4, 0, CONTRIBUTION)), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Code(s, Req(3, 1, CONTRIBUTION)), absl::StatusCode::kUnavailable);
  // Publishing for another round or attempt is ignored.
  s.Publish(4, 0, CONTRIBUTION, 0, 10, B("early"));
  s.Publish(3, 1, CONTRIBUTION, 0, 10, B("early"));
  EXPECT_EQ(Code(s, Req(4, 0, CONTRIBUTION)), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Code(s, Req(3, 1, CONTRIBUTION)), absl::StatusCode::kUnavailable);
  // Older rounds: gone for good.
  EXPECT_EQ(Code(s, Req(2, 0, CONTRIBUTION)), absl::StatusCode::kFailedPrecondition);
}

TEST(EncodedStoreTest, ANewAttemptOrRoundDropsTheOldOnesButTheLastAverages) {
  EncodedStore s;
  s.BeginRound(5, 0);
  s.Publish(5, 0, CONTRIBUTION, 0, 10, B("c0"));
  s.BeginRound(5, 1);
  EXPECT_EQ(Code(s, Req(5, 0, CONTRIBUTION)), absl::StatusCode::kFailedPrecondition);
  s.Publish(5, 1, CONTRIBUTION, 0, 10, B("c1"));
  s.Publish(5, 1, AVERAGED, 0, 10, B("a1"));
  s.BeginRound(6, 0);
  // Slow readers may still gather round 5's averages, not its contributions.
  absl::StatusOr<Blob> avg = s.Find(Req(5, 1, AVERAGED));
  ASSERT_TRUE(avg.ok()) << avg.status();
  EXPECT_EQ(**avg, "a1");
  EXPECT_EQ(Code(s, Req(5, 1, CONTRIBUTION)), absl::StatusCode::kFailedPrecondition);
  s.BeginRound(7, 0);
  EXPECT_EQ(Code(s, Req(5, 1, AVERAGED)), absl::StatusCode::kFailedPrecondition);
}

TEST(EncodedStoreTest, BadRequestsAreInvalidArgument) {
  EncodedStore s;
  s.BeginRound(1, 0);
  s.Publish(1, 0, CONTRIBUTION, 0, 10, B("c"));
  EXPECT_EQ(Code(s, Req(1, 0, shoal::v1::SLICE_KIND_UNSPECIFIED)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Code(s, Req(1, 0, CONTRIBUTION, 10, 10)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Code(s, Req(1, 0, CONTRIBUTION, 10, 0)), absl::StatusCode::kInvalidArgument);
}

// Found by the read_encoded_request fuzz target (corpus crash-unknown-kind):
// a kind this store never holds was UNAVAILABLE for the current round, so a
// reader asked again until its deadline for what never comes.
TEST(EncodedStoreTest, AKindNeverPublishedHereIsInvalidArgument) {
  EncodedStore s;
  s.BeginRound(1, 0);
  for (int kind : {5, 99, -3, static_cast<int>(shoal::v1::GOSSIP)}) {
    SCOPED_TRACE(kind);
    EXPECT_EQ(Code(s, Req(1, 0, static_cast<shoal::v1::SliceKind>(kind))),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(Code(s, Req(2, 0, static_cast<shoal::v1::SliceKind>(kind))),
              absl::StatusCode::kInvalidArgument);
  }
  // The kinds it holds still wait for what is not there yet.
  EXPECT_EQ(Code(s, Req(1, 0, shoal::v1::STAGE_MODEL)), absl::StatusCode::kUnavailable);
}

TEST(EncodedStoreTest, OuterStateIsServedForItsRoundOnly) {
  EncodedStore s;
  s.SetState(4, B("m4"));
  absl::StatusOr<Blob> got = s.Find(Req(4, 0, SNAPSHOT));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(**got, "m4");
  EXPECT_EQ(Code(s, Req(5, 0, SNAPSHOT)), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Code(s, Req(3, 0, SNAPSHOT)), absl::StatusCode::kFailedPrecondition);
  s.SetState(5, B("m5"));
  EXPECT_EQ(Code(s, Req(4, 0, SNAPSHOT)), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(**s.Find(Req(5, 0, SNAPSHOT)), "m5");
}

}  // namespace
}  // namespace shoal::worker

namespace shoal::worker {
namespace {

// Stages of a hierarchical round (ReadEncodedRequest.stage): a stage the
// worker has not reached waits (UNAVAILABLE, like a slice not averaged
// yet); what a stage published stays served after the worker moved on (a
// slower member of the group may still read it); what a passed stage never
// published is refused for good (FAILED_PRECONDITION).
shoal::v1::ReadEncodedRequest StageReq(uint32_t stage, shoal::v1::SliceKind kind,
                                       uint64_t begin = 0, uint64_t end = 10) {
  shoal::v1::ReadEncodedRequest r = Req(7, 2, kind, begin, end);
  r.set_stage(stage);
  return r;
}

TEST(EncodedStoreStageTest, ALaterStageWaitsUntilReached) {
  EncodedStore s;
  s.BeginRound(7, 2);
  s.ReachStage(7, 2, 1);
  s.Publish(7, 2, CONTRIBUTION, 0, 10, B("stage1"), 1);
  EXPECT_TRUE(s.Find(StageReq(1, CONTRIBUTION)).ok());
  // Stage 2 is not reached: ask again.
  EXPECT_EQ(Code(s, StageReq(2, shoal::v1::STAGE_MODEL)), absl::StatusCode::kUnavailable);
  // Stage 1's average is not there yet either, and the stage is current.
  EXPECT_EQ(Code(s, StageReq(1, AVERAGED)), absl::StatusCode::kUnavailable);
  // The flat exchange's key (stage 0) is another blob.
  EXPECT_EQ(Code(s, Req(7, 2, CONTRIBUTION)), absl::StatusCode::kFailedPrecondition);
  s.ReachStage(7, 2, 2);
  const Blob model = B("model");
  s.Publish(7, 2, shoal::v1::STAGE_MODEL, 0, 10, model, 2);
  absl::StatusOr<Blob> got = s.Find(StageReq(2, shoal::v1::STAGE_MODEL));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, model);
  // The same range of another stage is another blob.
  EXPECT_EQ(Code(s, StageReq(3, shoal::v1::STAGE_MODEL)), absl::StatusCode::kUnavailable);
}

TEST(EncodedStoreStageTest, APassedStageServesWhatItPublishedAndRefusesTheRest) {
  EncodedStore s;
  s.BeginRound(7, 2);
  s.ReachStage(7, 2, 1);
  s.Publish(7, 2, CONTRIBUTION, 0, 10, B("c"), 1);
  s.ReachStage(7, 2, 3);
  s.ReachStage(7, 2, 2);  // stages only go up
  // A slow reader of stage 1 still gets its slice.
  EXPECT_TRUE(s.Find(StageReq(1, CONTRIBUTION)).ok());
  // What stage 1 and 2 never published will never come.
  EXPECT_EQ(Code(s, StageReq(1, AVERAGED)), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Code(s, StageReq(2, shoal::v1::STAGE_MODEL)), absl::StatusCode::kFailedPrecondition);
  // The current stage still waits.
  EXPECT_EQ(Code(s, StageReq(3, AVERAGED)), absl::StatusCode::kUnavailable);
  // Another attempt's stages: ignored when reached or published.
  s.ReachStage(7, 1, 9);
  EXPECT_EQ(Code(s, StageReq(4, AVERAGED)), absl::StatusCode::kUnavailable);
  // A new attempt starts from stage 0 and drops the old stages.
  s.BeginRound(7, 3);
  shoal::v1::ReadEncodedRequest old = StageReq(1, CONTRIBUTION);
  EXPECT_EQ(Code(s, old), absl::StatusCode::kFailedPrecondition);
  old.set_attempt(3);
  EXPECT_EQ(Code(s, old), absl::StatusCode::kUnavailable);
}

// Waits (EncodedStore::Await, what a parked Peer.ReadEncoded holds): a
// piece already there or refused for good answers at once; one not there
// yet is answered by the Publish, ReachStage or BeginRound that decides it,
// exactly once; a cancelled wait is never answered.
struct Answers {
  std::vector<absl::StatusOr<Blob>> got;
  EncodedStore::Waiter Waiter() {
    return [this](absl::StatusOr<Blob> b) { got.push_back(std::move(b)); };
  }
};

// Found by the soak (issue 30): a leader killed during a hierarchical
// exchange, and the new leader planned the round again with the same
// attempt number. A worker that had passed every stage still served the old
// plan's stage averages, a peer read one before the new one was published,
// and the peers ended with different models. Withdraw (the session lost,
// the pending average void) drops the round's blobs and makes its reads
// wait; a second BeginRound of the same round and attempt starts empty.
TEST(EncodedStoreStageTest, AVoidPlanIsNeverServedToTheNextPlanOfTheSameAttempt) {
  EncodedStore s;
  s.BeginRound(6, 1);
  s.Publish(6, 1, AVERAGED, 0, 10, B("round 6"));
  s.BeginRound(7, 2);
  s.ReachStage(7, 2, 1);
  s.Publish(7, 2, CONTRIBUTION, 0, 10, B("old plan, stage 1"), 1);
  s.ReachStage(7, 2, 2);
  s.Publish(7, 2, AVERAGED, 0, 10, B("old plan, stage 2"), 2);
  s.ReachStage(7, 2, 3);
  s.Withdraw();
  // Not the old bytes, and not refused for good: the new plan's come later.
  EXPECT_EQ(Code(s, StageReq(2, AVERAGED)), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Code(s, StageReq(1, CONTRIBUTION)), absl::StatusCode::kUnavailable);
  // Publishing for the void plan is ignored until the next plan starts.
  s.Publish(7, 2, AVERAGED, 0, 10, B("late write of the old plan"), 2);
  EXPECT_EQ(Code(s, StageReq(2, AVERAGED)), absl::StatusCode::kUnavailable);
  // The round before's averages stay for slow readers.
  EXPECT_TRUE(s.Find(Req(6, 1, AVERAGED)).ok());
  // A wait parked meanwhile gets the new plan's bytes.
  Answers a;
  ASSERT_NE(s.Await(StageReq(2, AVERAGED), a.Waiter()), 0u);
  s.BeginRound(7, 2);
  s.ReachStage(7, 2, 2);
  EXPECT_TRUE(a.got.empty());
  s.Publish(7, 2, AVERAGED, 0, 10, B("new plan, stage 2"), 2);
  ASSERT_EQ(a.got.size(), 1u);
  ASSERT_TRUE(a.got[0].ok()) << a.got[0].status();
  EXPECT_EQ(**a.got[0], "new plan, stage 2");
}

TEST(EncodedStoreTest, ASecondStartOfTheSameRoundAndAttemptStartsEmpty) {
  EncodedStore s;
  s.BeginRound(3, 1);
  s.Publish(3, 1, CONTRIBUTION, 0, 10, B("first plan"));
  s.BeginRound(3, 1);
  EXPECT_EQ(Code(s, Req(3, 1, CONTRIBUTION)), absl::StatusCode::kUnavailable);
  s.Publish(3, 1, CONTRIBUTION, 0, 10, B("second plan"));
  absl::StatusOr<Blob> got = s.Find(Req(3, 1, CONTRIBUTION));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(**got, "second plan");
  // Withdraw before any round, or twice, changes nothing.
  EncodedStore fresh;
  fresh.Withdraw();
  EXPECT_EQ(Code(fresh, Req(1, 0, CONTRIBUTION)), absl::StatusCode::kUnavailable);
}

TEST(EncodedStoreWaitTest, WhatIsThereOrNeverComesAnswersAtOnce) {
  EncodedStore s;
  s.BeginRound(7, 2);
  s.Publish(7, 2, CONTRIBUTION, 0, 10, B("c"));
  Answers a;
  EXPECT_EQ(s.Await(Req(7, 2, CONTRIBUTION), a.Waiter()), 0u);
  EXPECT_EQ(s.Await(Req(6, 2, CONTRIBUTION), a.Waiter()), 0u);        // an older round
  EXPECT_EQ(s.Await(Req(7, 2, CONTRIBUTION, 5, 5), a.Waiter()), 0u);  // empty range
  ASSERT_EQ(a.got.size(), 3u);
  EXPECT_TRUE(a.got[0].ok());
  EXPECT_EQ(a.got[1].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.got[2].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.waiting(), 0u);
}

TEST(EncodedStoreWaitTest, APublishAnswersTheWaitOnceAndOthersKeepWaiting) {
  EncodedStore s;
  s.BeginRound(7, 2);
  Answers a;
  EXPECT_NE(s.Await(Req(7, 2, AVERAGED, 0, 10), a.Waiter()), 0u);
  EXPECT_NE(s.Await(Req(7, 2, AVERAGED, 10, 20), a.Waiter()), 0u);
  EXPECT_EQ(s.waiting(), 2u);
  s.Publish(7, 2, CONTRIBUTION, 0, 10, B("not this kind"));
  EXPECT_TRUE(a.got.empty());
  const Blob avg = B("avg");
  s.Publish(7, 2, AVERAGED, 0, 10, avg);
  ASSERT_EQ(a.got.size(), 1u);
  ASSERT_TRUE(a.got[0].ok()) << a.got[0].status();
  EXPECT_EQ(*a.got[0], avg);
  EXPECT_EQ(s.waiting(), 1u);
  s.Publish(7, 2, AVERAGED, 0, 10, B("again"));  // answered already: not twice
  EXPECT_EQ(a.got.size(), 1u);
}

TEST(EncodedStoreWaitTest, ANewAttemptOrAPassedStageEndsTheWaitRefused) {
  EncodedStore s;
  s.BeginRound(7, 2);
  Answers a;
  EXPECT_NE(s.Await(Req(7, 2, AVERAGED), a.Waiter()), 0u);
  s.BeginRound(7, 3);  // the attempt it waits for is gone
  ASSERT_EQ(a.got.size(), 1u);
  EXPECT_EQ(a.got[0].status().code(), absl::StatusCode::kFailedPrecondition);
  s.ReachStage(7, 3, 1);
  EXPECT_EQ(s.Await(StageReq(1, AVERAGED), a.Waiter()), 0u);  // attempt 2: refused at once
  ASSERT_EQ(a.got.size(), 2u);
  shoal::v1::ReadEncodedRequest r = StageReq(1, AVERAGED);
  r.set_attempt(3);
  EXPECT_NE(s.Await(r, a.Waiter()), 0u);
  s.ReachStage(7, 3, 2);  // stage 1 passed without this average
  ASSERT_EQ(a.got.size(), 3u);
  EXPECT_EQ(a.got[2].status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(EncodedStoreWaitTest, ALaterRoundAndTheOuterStateAreWaitedFor) {
  EncodedStore s;
  Answers a;
  EXPECT_NE(s.Await(Req(3, 0, CONTRIBUTION), a.Waiter()), 0u);
  EXPECT_NE(s.Await(Req(3, 0, SNAPSHOT), a.Waiter()), 0u);
  s.BeginRound(3, 0);
  EXPECT_TRUE(a.got.empty());
  s.Publish(3, 0, CONTRIBUTION, 0, 10, B("c"));
  s.SetState(3, B("state"));
  ASSERT_EQ(a.got.size(), 2u);
  EXPECT_TRUE(a.got[0].ok());
  EXPECT_TRUE(a.got[1].ok());
}

TEST(EncodedStoreWaitTest, ACancelledWaitIsNeverAnswered) {
  EncodedStore s;
  s.BeginRound(7, 2);
  Answers a;
  const uint64_t ticket = s.Await(Req(7, 2, AVERAGED), a.Waiter());
  ASSERT_NE(ticket, 0u);
  EXPECT_TRUE(s.CancelWait(ticket));
  EXPECT_FALSE(s.CancelWait(ticket));
  s.Publish(7, 2, AVERAGED, 0, 10, B("avg"));
  EXPECT_TRUE(a.got.empty());
  EXPECT_EQ(s.waiting(), 0u);
}

}  // namespace
}  // namespace shoal::worker
