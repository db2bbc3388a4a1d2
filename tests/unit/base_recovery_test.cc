// The decision when a participant cannot load its round's base
// (services/coordinator/core/base_recovery.h).
#include "services/coordinator/core/base_recovery.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shoal::coordinator {
namespace {

using Action = BaseUnavailableDecision::Action;
using ::testing::HasSubstr;

shoal::v1::CheckpointRef Ref(uint64_t round) {
  shoal::v1::CheckpointRef ref;
  ref.set_id(absl::StrCat("r-r", round));
  ref.set_round(round);
  ref.set_model_hash(absl::StrCat("hash", round));
  return ref;
}

BaseUnavailableInput Input() {
  BaseUnavailableInput in;
  in.worker_id = "w3";
  in.round = 9;
  in.base_round = 8;
  in.checkpoint_id = "r-r8";
  in.checkpoint_round = 8;
  in.why = "blob 12ab is corrupted";
  in.checkpoint_damaged = true;
  return in;
}

TEST(BaseRecoveryTest, AHolderOrTheSeedModelMeansTheWorkerOnlySitsOut) {
  BaseUnavailableInput in = Input();
  in.base_held = true;
  BaseUnavailableDecision d = DecideBaseUnavailable(in, {Ref(8), Ref(4)});
  EXPECT_EQ(d.action, Action::kSitOut);
  EXPECT_THAT(d.reason, HasSubstr("catches up from a holder"));
  in = Input();
  in.base_round = 0;
  EXPECT_EQ(DecideBaseUnavailable(in, {}).action, Action::kSitOut);
}

TEST(BaseRecoveryTest, AnIntactCheckpointOfTheBaseIsReadAgainNextRound) {
  BaseUnavailableInput in = Input();
  in.checkpoint_damaged = false;  // the store was unreachable
  const BaseUnavailableDecision d = DecideBaseUnavailable(in, {Ref(8), Ref(4)});
  EXPECT_EQ(d.action, Action::kSitOut);
  EXPECT_THAT(d.reason, HasSubstr("reads checkpoint r-r8 again"));
}

TEST(BaseRecoveryTest, ADamagedCheckpointGoesBackToTheNewestIntactOneNotNewerThanTheBase) {
  const BaseUnavailableDecision d = DecideBaseUnavailable(Input(), {Ref(8), Ref(6), Ref(4)});
  ASSERT_EQ(d.action, Action::kGoBack);
  EXPECT_EQ(d.to.id(), "r-r6");
  EXPECT_EQ(d.to.model_hash(), "hash6");
  EXPECT_EQ(d.reason,
            "round 9: no member holds round 8's model and checkpoint r-r8 is damaged (blob 12ab "
            "is corrupted); the run went back to checkpoint r-r6 of round 6 and trains rounds "
            "7-8 again");
}

TEST(BaseRecoveryTest, EveryHolderGoneWithoutACheckpointOfTheBaseGoesBackToTheLatest) {
  BaseUnavailableInput in = Input();
  in.checkpoint_id = "r-r6";
  in.checkpoint_round = 6;
  in.checkpoint_damaged = false;
  in.why = "no peer holds the model of round 8";
  const BaseUnavailableDecision d = DecideBaseUnavailable(in, {Ref(6), Ref(4)});
  ASSERT_EQ(d.action, Action::kGoBack);
  EXPECT_EQ(d.to.id(), "r-r6");
  EXPECT_THAT(d.reason, HasSubstr("no checkpoint is of round 8"));
}

TEST(BaseRecoveryTest, NothingToGoBackToStopsTheRunNamingTheCheckpoint) {
  BaseUnavailableDecision d = DecideBaseUnavailable(Input(), {Ref(8)});
  EXPECT_EQ(d.action, Action::kStop);
  EXPECT_THAT(d.reason, HasSubstr("checkpoint r-r8 is damaged"));
  EXPECT_THAT(d.reason, HasSubstr("Restore checkpoint r-r8"));
  // Without any checkpoint, every holder gone.
  BaseUnavailableInput in = Input();
  in.checkpoint_id.clear();
  in.checkpoint_round = 0;
  in.checkpoint_damaged = false;
  d = DecideBaseUnavailable(in, {});
  EXPECT_EQ(d.action, Action::kStop);
  EXPECT_THAT(d.reason, HasSubstr("no checkpoint is of round 8"));
  EXPECT_THAT(d.reason, HasSubstr("Start the workers that hold it"));
}

TEST(BaseRecoveryTest, TheKnownListKeepsTheNewestFourAndForgetsWhatIsRedone) {
  std::vector<shoal::v1::CheckpointRef> known;
  for (uint64_t round = 2; round <= 12; round += 2) RememberCheckpoint(Ref(round), &known);
  ASSERT_EQ(known.size(), kKnownCheckpoints);
  EXPECT_EQ(known[0].id(), "r-r12");
  EXPECT_EQ(known[3].id(), "r-r6");
  // The same id again (a round trained again after going back) replaces it.
  shoal::v1::CheckpointRef again = Ref(10);
  again.set_model_hash("other");
  RememberCheckpoint(again, &known);
  ASSERT_EQ(known.size(), kKnownCheckpoints);
  EXPECT_EQ(known[0].model_hash(), "other");
  EXPECT_EQ(known[1].id(), "r-r12");
  ForgetAfter(Ref(8), "r-r10", &known);
  ASSERT_EQ(known.size(), 2u);
  EXPECT_EQ(known[0].id(), "r-r8");
  EXPECT_EQ(known[1].id(), "r-r6");
}

}  // namespace
}  // namespace shoal::coordinator
