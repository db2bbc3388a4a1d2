// Membership on its own (services/coordinator/core/membership.h): ids and
// data ranks, the member limit, leases, departures and member credentials.
// No engine and no lock: the part is called as RoundEngine calls it, with
// time from a FakeClock. (round_engine_membership_test.cc's MembershipTest
// is membership through the facade.)
#include "services/coordinator/core/membership.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shoal::coordinator {
namespace {

using ::shoal::v1::CoordinatorMessage;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class MembershipPartTest : public ::testing::Test {
 protected:
  MembershipPartTest() { Make(); }

  void Make() {
    options_.run_id = "run-m";
    options_.heartbeat_lease = absl::Seconds(10);
    options_.session_grace = absl::Seconds(5);
    members_ = std::make_unique<Membership>(options_, &clock_, &versions_, clock_.Now());
  }

  static v1::JoinRequest Request(int port, const std::string& previous = "") {
    v1::JoinRequest r;
    r.set_peer_address(absl::StrCat("127.0.0.1:", port));
    r.set_previous_worker_id(previous);
    return r;
  }

  // Adds a member at `port` as Join does (Add, then Refresh).
  Member* Add(int port, const std::string& previous = "") {
    const v1::JoinRequest r = Request(port, previous);
    absl::StatusOr<Member*> added = members_->Add(r, /*round=*/1);
    EXPECT_TRUE(added.ok()) << added.status();
    if (!added.ok()) return nullptr;
    members_->Refresh(**added, r, /*unreachable=*/"");
    return *added;
  }

  void Remove(const std::string& id, Directives* out) {
    v1::WorkerStatus gone;
    gone.set_id(id);
    gone.set_state("left");
    members_->Remove(id, MemberState::kLeft, "test", gone, /*round=*/1, out);
  }

  FakeClock clock_;
  EngineOptions options_;
  EngineVersions versions_;
  std::unique_ptr<Membership> members_;
};

TEST_F(MembershipPartTest, IdsAreSequentialAndAFreedDataRankIsReused) {
  Member* a = Add(9001);
  Member* b = Add(9002);
  Member* c = Add(9003);
  EXPECT_EQ(a->id, "w1");
  EXPECT_EQ(b->id, "w2");
  EXPECT_EQ(c->id, "w3");
  EXPECT_EQ(a->data_rank, 0u);
  EXPECT_EQ(b->data_rank, 1u);
  EXPECT_EQ(c->data_rank, 2u);
  Directives out;
  Remove("w2", &out);
  // The next worker gets a new id but the smallest free rank (w2's).
  Member* d = Add(9004);
  EXPECT_EQ(d->id, "w4");
  EXPECT_EQ(d->data_rank, 1u);
  EXPECT_EQ(members_->next_worker_number(), 5u);
  EXPECT_TRUE(members_->ConsistentForTesting());
}

TEST_F(MembershipPartTest, AfterARestartAWorkerKeepsItsIdButNotARemovedOne) {
  Member* kept = Add(9001, "w7");
  EXPECT_EQ(kept->id, "w7");
  // The numbering moves past it, so that no later worker is given w7.
  EXPECT_EQ(members_->next_worker_number(), 8u);
  Directives out;
  Remove("w7", &out);
  // A removed member's id is not handed back to a worker claiming it.
  EXPECT_EQ(Add(9002, "w7")->id, "w8");
  // Ids not of the engine's form are ignored.
  EXPECT_EQ(Add(9003, "w07")->id, "w9");
  EXPECT_EQ(Add(9004, "x3")->id, "w10");
}

TEST_F(MembershipPartTest, AddingMarksTheRecordChangedBecauseTheNumberingIsDurable) {
  versions_.Commit();
  const uint64_t before = versions_.record_version();
  Add(9001);
  versions_.Commit();
  EXPECT_EQ(versions_.record_version(), before + 1);
  // Connecting is no record change.
  members_->Connect(members_->At("w1"));
  versions_.Commit();
  EXPECT_EQ(versions_.record_version(), before + 1);
}

TEST_F(MembershipPartTest, PastMaxMembersAJoinIsRefusedWithResourceExhausted) {
  options_.max_members = 2;
  Make();
  Add(9001);
  Add(9002);
  absl::StatusOr<Member*> third = members_->Add(Request(9003), 1);
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.status().message(), HasSubstr("--max_members=2"));
  EXPECT_EQ(members_->size(), 2u);
}

TEST_F(MembershipPartTest, CheckJoinRequestRefusesBadAddressesZonesAndHashes) {
  EXPECT_TRUE(Membership::CheckJoinRequest(Request(9001)).ok());
  v1::JoinRequest bad = Request(9001);
  bad.set_peer_address("localhost:0");
  EXPECT_EQ(Membership::CheckJoinRequest(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = Request(9001);
  bad.set_model_hash("ABC");
  EXPECT_EQ(Membership::CheckJoinRequest(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = Request(9001);
  bad.set_zone("/bad//zone");
  EXPECT_EQ(Membership::CheckJoinRequest(bad).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(MembershipPartTest, FindActiveSaysWhyAnIdIsUnknown) {
  Add(9001);
  EXPECT_TRUE(members_->FindActive("w1").ok());
  EXPECT_EQ(members_->FindActive("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(members_->FindActive("w2").status().code(), absl::StatusCode::kNotFound);
  Directives out;
  Remove("w1", &out);
  EXPECT_EQ(members_->FindActive("w1").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(members_->Find("w1"), nullptr);
}

TEST_F(MembershipPartTest, LeasesExpireWithoutASessionOrWithoutHeartbeats) {
  Member* idle = Add(9001);    // never opens its session
  Member* active = Add(9002);  // opens it and heartbeats
  members_->Connect(*active);
  EXPECT_THAT(members_->ExpiredLeases(clock_.Now()), IsEmpty());
  clock_.Advance(absl::Seconds(6));  // past session_grace
  active->last_seen = clock_.Now();  // what a heartbeat does
  std::vector<std::pair<std::string, std::string>> expired = members_->ExpiredLeases(clock_.Now());
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].first, idle->id);
  clock_.Advance(absl::Seconds(11));  // past the heartbeat lease
  expired = members_->ExpiredLeases(clock_.Now());
  ASSERT_EQ(expired.size(), 2u);
  EXPECT_EQ(expired[1].first, active->id);
  EXPECT_FALSE(expired[1].second.empty());
}

TEST_F(MembershipPartTest, AliveNeedsAnOpenSessionAndARecentHeartbeat) {
  options_.config.mutable_timeouts()->set_heartbeat_interval_ms(1000);
  Make();
  Member* m = Add(9001);
  EXPECT_FALSE(members_->Alive(*m, clock_.Now()));  // no session yet
  members_->Connect(*m);
  EXPECT_TRUE(members_->Alive(*m, clock_.Now()));
  clock_.Advance(absl::Seconds(4));  // more than three intervals without a heartbeat
  EXPECT_FALSE(members_->Alive(*m, clock_.Now()));
}

TEST_F(MembershipPartTest, RemovedMembersAreCountedAndOnlyTheNewestAreShown) {
  options_.max_departed_shown = 2;
  Make();
  Directives out;
  for (int i = 0; i < 3; ++i) Add(9001 + i);
  Remove("w1", &out);
  Remove("w2", &out);
  Remove("w3", &out);
  EXPECT_EQ(members_->departures(), 3u);
  ASSERT_EQ(members_->departed().size(), 2u);
  EXPECT_EQ(members_->departed()[0].id(), "w2");
  EXPECT_EQ(members_->departed()[1].id(), "w3");
  EXPECT_EQ(members_->size(), 0u);
  // Removing an unknown id changes nothing.
  Remove("w9", &out);
  EXPECT_EQ(members_->departures(), 3u);
}

TEST_F(MembershipPartTest, TakeProgressMarksTheStatusOnlyWhenTheProgressMoved) {
  Member* m = Add(9001);
  versions_.Commit();
  const uint64_t before = versions_.status_version();
  v1::Heartbeat h;
  h.set_syncing(true);
  h.set_sync_bytes_done(10);
  h.set_sync_bytes_total(100);
  members_->TakeProgress(*m, h);
  versions_.Commit();
  EXPECT_EQ(versions_.status_version(), before + 1);
  members_->TakeProgress(*m, h);  // the same progress again
  versions_.Commit();
  EXPECT_EQ(versions_.status_version(), before + 1);
  v1::WorkerStatus w;
  members_->FillWorker(*m, /*active=*/true, clock_.Now(), &w);
  EXPECT_EQ(w.state(), "syncing");
  EXPECT_EQ(w.sync_bytes_done(), 10u);
}

TEST_F(MembershipPartTest, AnUnreachableJoinerIsOutboundOnlyWithTheProbesReason) {
  const v1::JoinRequest r = Request(9001);
  absl::StatusOr<Member*> added = members_->Add(r, 1);
  ASSERT_TRUE(added.ok());
  members_->Refresh(**added, r, "connection refused");
  EXPECT_TRUE((*added)->outbound_only);
  EXPECT_EQ((*added)->outbound_reason, "probe: connection refused");
  // A re-join that reaches it is direct again, with its session to reopen.
  members_->Connect(**added);
  members_->Refresh(**added, r, "");
  EXPECT_FALSE((*added)->outbound_only);
  EXPECT_FALSE((*added)->connected);
}

TEST_F(MembershipPartTest, CredentialsAreAnnouncedOnIssueAndRevokedOnRemoval) {
  options_.member_credentials = true;
  int n = 0;
  options_.credential_secret = [&n] { return absl::StrCat("secret-", ++n); };
  Make();
  Directives out;
  // Without credentials nothing is issued; with them, every issue goes to
  // every open session.
  Member* a = Add(9001);
  EXPECT_FALSE(members_->IssueCredential(a->id, &out).empty());
  EXPECT_THAT(out, IsEmpty());  // nobody has a session yet
  members_->Connect(*a);
  Member* b = Add(9002);
  out.clear();
  EXPECT_FALSE(members_->IssueCredential(b->id, &out).empty());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].worker_id, "w1");
  EXPECT_EQ(out[0].message->kind_case(), CoordinatorMessage::kMemberUpdate);
  ASSERT_NE(members_->MemberList("w1"), nullptr);
  EXPECT_EQ(members_->MemberList("w1")->member_update().entries_size(), 2);
  out.clear();
  Remove("w2", &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].worker_id, "w1");
  EXPECT_EQ(members_->MemberList("w2"), nullptr);
  EXPECT_EQ(members_->MemberList("w1")->member_update().entries_size(), 1);
}

TEST_F(MembershipPartTest, EndRunTellsEveryMemberAndSetsThemWaiting) {
  Add(9001)->state = MemberState::kTraining;
  Add(9002)->state = MemberState::kSharing;
  CoordinatorMessage msg;
  msg.mutable_run_finished()->set_reason("done");
  Directives out;
  members_->EndRun(Share(msg), &out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].worker_id, "w1");
  EXPECT_EQ(out[1].worker_id, "w2");
  for (const auto& [id, m] : members_->members()) EXPECT_EQ(m.state, MemberState::kWaiting);
}

TEST_F(MembershipPartTest, ModelFileHoldersAreOpenDirectSessionsOtherThanTheJoiner) {
  Member* a = Add(9001);
  Member* b = Add(9002);
  Member* joiner = Add(9003);
  members_->Connect(*a);  // b has no session: not offered
  members_->Connect(*joiner);
  v1::JoinResponse r;
  members_->AddModelFileHolders(*joiner, &r);
  EXPECT_THAT(r.model_file_holders(), ElementsAre(a->address));
  (void)b;
}

}  // namespace
}  // namespace shoal::coordinator
