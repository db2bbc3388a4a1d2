// CheckpointPlanner on its own (services/coordinator/core/checkpoint_planner.h):
// which rounds are checkpointed, who uploads, a failed or stalled upload
// moving to the next holder, the grant each request carries, and the gossip
// checkpointer with its reports. Members from a real Membership; time from a
// FakeClock.
#include "services/coordinator/core/checkpoint_planner.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/upload_grant.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shoal::coordinator {
namespace {

using ::shoal::v1::CoordinatorMessage;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kKey[] = "upload-key";

class CheckpointPlannerTest : public ::testing::Test {
 protected:
  CheckpointPlannerTest() {
    options_.run_id = "run-c";
    options_.config.mutable_checkpoints()->set_store("127.0.0.1:7000");
    options_.config.mutable_checkpoints()->set_every(2);
    options_.checkpoint_timeout = absl::Seconds(30);
    options_.checkpointers = 1;
    Make();
  }

  void Make() {
    members_ = std::make_unique<Membership>(options_, &clock_, &versions_, clock_.Now());
    planner_ = std::make_unique<CheckpointPlanner>(options_, &clock_, &versions_, members_.get());
    for (int port = 9001; port <= 9003; ++port) {
      v1::JoinRequest r;
      r.set_peer_address(absl::StrCat("127.0.0.1:", port));
      absl::StatusOr<Member*> added = members_->Add(r, 1);
      ASSERT_TRUE(added.ok());
      members_->Refresh(**added, r, "");
    }
  }

  static v1::ReportCheckpointRequest Report(const std::string& id, uint64_t round,
                                            const std::string& checkpoint_id,
                                            const std::string& error = "") {
    v1::ReportCheckpointRequest r;
    r.set_worker_id(id);
    r.set_round(round);
    r.set_checkpoint_id(checkpoint_id);
    r.set_error(error);
    return r;
  }

  FakeClock clock_;
  EngineOptions options_;
  EngineVersions versions_;
  std::unique_ptr<Membership> members_;
  std::unique_ptr<CheckpointPlanner> planner_;
  // w1 does not hold the agreed model; w2 and w3 do.
  const std::vector<CheckpointCandidate> holders_ = {{"w1", false}, {"w2", true}, {"w3", true}};
  const std::string hash_ = std::string(64, 'a');
};

TEST_F(CheckpointPlannerTest, DueEveryNthRoundAndTheLastOnlyWithAStore) {
  EXPECT_FALSE(planner_->Due(1, false));
  EXPECT_TRUE(planner_->Due(2, false));
  EXPECT_FALSE(planner_->Due(3, false));
  EXPECT_TRUE(planner_->Due(3, /*last=*/true));
  options_.config.mutable_checkpoints()->clear_store();
  Make();
  EXPECT_FALSE(planner_->Due(2, true));
}

TEST_F(CheckpointPlannerTest, TheFirstHolderUploadsAndItsReportBecomesTheCheckpoint) {
  Directives out;
  planner_->StartUpload(2, hash_, holders_, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].worker_id, "w2");
  const v1::CheckpointRequest& request = out[0].message->checkpoint_request();
  EXPECT_EQ(request.round(), 2u);
  EXPECT_EQ(request.model_hash(), hash_);
  EXPECT_TRUE(request.upload_grant().empty());  // no upload key
  v1::RunStatus s;
  planner_->FillStatus(&s);
  EXPECT_EQ(s.checkpoint_pending(), "round 2 by w2");

  // Only the upload in progress is taken.
  bool reassign = false;
  EXPECT_EQ(planner_->ReportUpload(Report("w3", 2, "ck-2"), &reassign).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(planner_->ReportUpload(Report("w2", 1, "ck-1"), &reassign).code(),
            absl::StatusCode::kFailedPrecondition);
  versions_.Commit();
  const uint64_t record = versions_.record_version();
  ASSERT_TRUE(planner_->ReportUpload(Report("w2", 2, "ck-2"), &reassign).ok());
  EXPECT_FALSE(reassign);
  EXPECT_EQ(planner_->checkpoint_id(), "ck-2");
  EXPECT_EQ(planner_->checkpoint_round(), 2u);
  versions_.Commit();
  EXPECT_EQ(versions_.record_version(), record + 1);
  v1::RunRecord r;
  planner_->FillRecord(&r);
  EXPECT_EQ(r.checkpoint_id(), "ck-2");
  EXPECT_EQ(r.checkpoint_round(), 2u);
  // Nothing is pending any more.
  EXPECT_EQ(planner_->StalledUpload(clock_.Now() + absl::Hours(1)), 0u);
}

TEST_F(CheckpointPlannerTest, AFailedUploadMovesToTheNextUntriedHolder) {
  Directives out;
  planner_->StartUpload(2, hash_, holders_, &out);
  bool reassign = false;
  ASSERT_TRUE(planner_->ReportUpload(Report("w2", 2, "", "store down"), &reassign).ok());
  EXPECT_TRUE(reassign);
  EXPECT_TRUE(planner_->checkpoint_id().empty());
  out.clear();
  planner_->AssignUpload(2, hash_, holders_, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].worker_id, "w3");
  // Both holders tried: none left (w1 lacks the model), nothing pending.
  ASSERT_TRUE(planner_->ReportUpload(Report("w3", 2, "", "store down"), &reassign).ok());
  out.clear();
  planner_->AssignUpload(2, hash_, holders_, &out);
  EXPECT_THAT(out, IsEmpty());
  v1::RunStatus s;
  planner_->FillStatus(&s);
  EXPECT_TRUE(s.checkpoint_pending().empty());
  // A new round starts over with the first holder.
  planner_->StartUpload(4, hash_, holders_, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].worker_id, "w2");
}

TEST_F(CheckpointPlannerTest, AnUploadStallsAfterTheTimeoutOrWhenItsWorkerIsGone) {
  Directives out;
  planner_->StartUpload(2, hash_, holders_, &out);
  EXPECT_EQ(planner_->StalledUpload(clock_.Now() + absl::Seconds(29)), 0u);
  EXPECT_EQ(planner_->StalledUpload(clock_.Now() + absl::Seconds(31)), 2u);
  // Its worker leaves: the upload moves at once.
  members_->Remove("w2", MemberState::kLeft, "test", v1::WorkerStatus(), 2, &out);
  EXPECT_EQ(planner_->StalledUpload(clock_.Now()), 2u);
}

TEST_F(CheckpointPlannerTest, WithAnUploadKeyEachRequestCarriesAGrantForItsRoundOnly) {
  options_.upload_key = kKey;
  Make();
  Directives out;
  planner_->StartUpload(4, hash_, holders_, &out);
  ASSERT_EQ(out.size(), 1u);
  absl::StatusOr<UploadGrant> grant =
      VerifyUploadGrant(kKey, out[0].message->checkpoint_request().upload_grant(), clock_.Now());
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_EQ(grant->worker_id, "w2");
  EXPECT_TRUE(GrantCovers(*grant, "run-c", 4).ok());
  EXPECT_FALSE(GrantCovers(*grant, "run-c", 6).ok());
  // Valid for the timeout and a minute of skew, not longer.
  EXPECT_FALSE(VerifyUploadGrant(kKey, out[0].message->checkpoint_request().upload_grant(),
                                 clock_.Now() + absl::Seconds(91))
                   .ok());
}

TEST_F(CheckpointPlannerTest, GossipCheckpointerIsOneGossipingMemberToldOnce) {
  options_.config.mutable_gossip()->set_checkpoint_every(100);
  options_.upload_key = kKey;
  Make();
  Directives out;
  // Nobody gossips yet: no checkpointer.
  planner_->AssignGossipCheckpointer({{"w1", false}, {"w2", false}}, &out);
  EXPECT_THAT(out, IsEmpty());
  planner_->AssignGossipCheckpointer({{"w1", false}, {"w2", true}}, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].worker_id, "w2");
  const v1::CheckpointRequest& request = out[0].message->checkpoint_request();
  EXPECT_TRUE(request.gossip());
  EXPECT_EQ(request.round(), 1u);
  absl::StatusOr<UploadGrant> grant = VerifyUploadGrant(kKey, request.upload_grant(), clock_.Now());
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_TRUE(GrantCovers(*grant, "run-c", 1000).ok());  // every later sequence
  // Unchanged on the next peer-list change while it still gossips.
  out.clear();
  planner_->AssignGossipCheckpointer({{"w1", true}, {"w2", true}}, &out);
  EXPECT_THAT(out, IsEmpty());
  v1::RunStatus s;
  planner_->FillStatus(&s);
  EXPECT_EQ(s.checkpointer(), "w2");
}

TEST_F(CheckpointPlannerTest, GossipReportsComeFromTheCheckpointerWithGrowingSequences) {
  options_.config.mutable_gossip()->set_checkpoint_every(100);
  Make();
  Directives out;
  planner_->AssignGossipCheckpointer({{"w1", true}, {"w2", true}}, &out);
  ASSERT_EQ(out.size(), 1u);
  const std::string checkpointer = out[0].worker_id;
  const std::string other = checkpointer == "w1" ? "w2" : "w1";
  absl::Status s = planner_->ReportGossip(Report(other, 1, "g-1"));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("not the checkpointer"));
  // A failed upload keeps the role and changes nothing.
  EXPECT_TRUE(planner_->ReportGossip(Report(checkpointer, 1, "", "disk full")).ok());
  EXPECT_TRUE(planner_->checkpoint_id().empty());
  v1::ReportCheckpointRequest ok = Report(checkpointer, 3, "g-3");
  ok.set_gossip_clock(12.5);
  ok.set_gossip_steps(300);
  clock_.Advance(absl::Seconds(7));
  ASSERT_TRUE(planner_->ReportGossip(ok).ok());
  EXPECT_EQ(planner_->checkpoint_round(), 3u);
  EXPECT_EQ(planner_->ReportGossip(Report(checkpointer, 3, "g-3b")).code(),
            absl::StatusCode::kFailedPrecondition);
  v1::RunStatus status;
  planner_->FillStatus(&status);
  EXPECT_EQ(status.checkpoint_id(), "g-3");
  EXPECT_DOUBLE_EQ(status.checkpoint_clock(), 12.5);
  EXPECT_EQ(status.checkpoint_steps(), 300u);
  EXPECT_EQ(status.checkpoint_worker(), checkpointer);
  EXPECT_EQ(status.checkpoint_unix_ms(), absl::ToUnixMillis(clock_.Now()));
}

TEST_F(CheckpointPlannerTest, NoGossipCheckpointerWithoutAPeriod) {
  Directives out;
  planner_->AssignGossipCheckpointer({{"w1", true}}, &out);
  EXPECT_THAT(out, IsEmpty());
  EXPECT_EQ(planner_->ReportGossip(Report("w1", 1, "g-1")).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(CheckpointPlannerTest, AResumedRunKeepsItsCheckpoint) {
  v1::RunRecord record;
  record.set_checkpoint_id("ck-8");
  record.set_checkpoint_round(8);
  planner_->Resume(record);
  EXPECT_EQ(planner_->checkpoint_id(), "ck-8");
  EXPECT_EQ(planner_->checkpoint_round(), 8u);
}

}  // namespace
}  // namespace shoal::coordinator
