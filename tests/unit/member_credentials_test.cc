// Member credentials (common/member_credentials.h): the coordinator's
// roster, a peer's set and its check, and the RoundEngine issuing and
// revoking them (fake clock, no sockets).
#include "common/member_credentials.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/upload_grant.h"
#include "gtest/gtest.h"
#include "services/coordinator/core/round_engine.h"

namespace shoal {
namespace {

using shoal::v1::MemberUpdate;

// Deterministic secrets: "aaaa...", "bbbb...", ...
std::function<std::string()> Secrets() {
  auto next = std::make_shared<char>('a');
  return [next] { return std::string(64, (*next)++); };
}

std::optional<absl::string_view> Header(const std::string& value) { return value; }

TEST(ParseCredentialTest, AcceptsOnlyEpochVersionAndSixtyFourHexDigits) {
  const std::string hex(64, 'f');
  ASSERT_TRUE(ParseCredential(absl::StrCat("7.3.", hex)).ok());
  EXPECT_EQ(ParseCredential(absl::StrCat("7.3.", hex))->version, 3u);
  for (const std::string& bad :
       {std::string(), absl::StrCat("7.", hex), absl::StrCat("0.3.", hex),
        absl::StrCat("7.0.", hex), absl::StrCat("7.3.", hex, "0"), absl::StrCat("x.3.", hex),
        absl::StrCat("7.3.", std::string(63, 'f'), "g"), absl::StrCat("7.3.4.", hex)}) {
    EXPECT_FALSE(ParseCredential(bad).ok()) << bad;
  }
  EXPECT_EQ(RandomCredentialSecret().size(), 64u);
  EXPECT_NE(RandomCredentialSecret(), RandomCredentialSecret());
}

class MemberSetTest : public ::testing::Test {
 protected:
  MemberSetTest() : roster_(42, Secrets()) { set_.Enable(); }
  // Issues a credential and delivers its change to the set.
  std::string Issue(const std::string& id) {
    MemberUpdate u;
    std::string c = roster_.Issue(id, &u);
    set_.Apply(u);
    return c;
  }
  MemberRoster roster_;
  MemberSet set_;
};

TEST_F(MemberSetTest, OffUntilEnabledThenNeedsAList) {
  MemberSet off;
  EXPECT_TRUE(off.CheckHeader(std::nullopt).ok());  // no checking: today's behaviour
  off.Enable();
  MemberUpdate u;
  const std::string c = roster_.Issue("w1", &u);
  EXPECT_TRUE(absl::IsUnavailable(off.Check("w1", c))) << "no list yet: retry, not a denial";
  off.Apply(roster_.Full());
  EXPECT_TRUE(off.Check("w1", c).ok());
}

TEST_F(MemberSetTest, CurrentMembersPassOthersAreDenied) {
  set_.Apply(roster_.Full());
  const std::string c1 = Issue("w1");
  const std::string c2 = Issue("w2");
  EXPECT_TRUE(set_.Check("w1", c1).ok());
  EXPECT_TRUE(set_.CheckHeader(Header("w2:" + c2)).ok());
  // Someone else's credential, a made-up one, none, a malformed header.
  EXPECT_TRUE(absl::IsPermissionDenied(set_.Check("w1", c2)));
  EXPECT_TRUE(absl::IsPermissionDenied(set_.Check("w3", c2)));
  EXPECT_TRUE(absl::IsPermissionDenied(set_.Check("w1", "not-a-credential")));
  EXPECT_TRUE(absl::IsPermissionDenied(set_.CheckHeader(std::nullopt)));
  EXPECT_TRUE(absl::IsPermissionDenied(set_.CheckHeader(Header(c1))));
  // A forged secret with the right epoch and version.
  std::string forged = c1;
  forged.back() = forged.back() == '0' ? '1' : '0';
  EXPECT_TRUE(absl::IsPermissionDenied(set_.Check("w1", forged)));
}

TEST_F(MemberSetTest, RemovedAndReplacedCredentialsStopWorking) {
  set_.Apply(roster_.Full());
  const std::string old = Issue("w1");
  const std::string renewed = Issue("w1");  // a re-join
  EXPECT_TRUE(absl::IsPermissionDenied(set_.Check("w1", old)));
  EXPECT_TRUE(set_.Check("w1", renewed).ok());
  MemberUpdate u;
  ASSERT_TRUE(roster_.Revoke("w1", &u));
  EXPECT_FALSE(roster_.Revoke("w1", &u)) << "nothing left to revoke";
  set_.Apply(u);
  const absl::Status s = set_.Check("w1", renewed);
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_NE(s.message().find("removed"), std::string::npos) << s;
  EXPECT_EQ(s.message().find(renewed), std::string::npos) << "never echo a credential";
}

TEST_F(MemberSetTest, ANewerCredentialIsRetriedNotDenied) {
  set_.Apply(roster_.Full());
  // w5 joined; this peer has not heard of it yet (its update is late).
  MemberUpdate late;
  const std::string c = roster_.Issue("w5", &late);
  EXPECT_TRUE(absl::IsUnavailable(set_.Check("w5", c)));
  set_.Apply(late);
  EXPECT_TRUE(set_.Check("w5", c).ok());
  // Another coordinator start (restart, failover): retry until this peer's
  // session brings that start's list.
  MemberRoster next(43, Secrets());
  MemberUpdate u;
  const std::string other = next.Issue("w5", &u);
  EXPECT_TRUE(absl::IsUnavailable(set_.Check("w5", other)));
  set_.Apply(u);  // a change of another start cannot be placed: ignored
  EXPECT_TRUE(absl::IsUnavailable(set_.Check("w5", other)));
  set_.Apply(next.Full());
  EXPECT_TRUE(set_.Check("w5", other).ok());
  EXPECT_TRUE(absl::IsPermissionDenied(set_.Check("w5", c))) << "the earlier start's credential";
}

TEST_F(MemberSetTest, UpdatesApplyInAnyOrder) {
  MemberUpdate join1, join2, leave1;
  const std::string c1 = roster_.Issue("w1", &join1);
  const std::string c2 = roster_.Issue("w2", &join2);
  ASSERT_TRUE(roster_.Revoke("w1", &leave1));
  const MemberUpdate full = roster_.Full();
  MemberUpdate join3;
  const std::string c3 = roster_.Issue("w3", &join3);
  // The newest change first, the full list late, stale changes last.
  set_.Apply(join3);
  set_.Apply(full);
  set_.Apply(leave1);
  set_.Apply(join1);
  set_.Apply(join2);
  EXPECT_TRUE(absl::IsPermissionDenied(set_.Check("w1", c1)));
  EXPECT_TRUE(set_.Check("w2", c2).ok());
  EXPECT_TRUE(set_.Check("w3", c3).ok());
  EXPECT_EQ(set_.size(), 2u);
  EXPECT_EQ(set_.version(), roster_.version());
}

TEST(MemberCredentialHolderTest, SendsWorkerIdAndCredential) {
  MemberCredentialHolder h;
  EXPECT_EQ(h.Value(), "");
  h.Set("w3", "1.2.abc");
  EXPECT_EQ(h.Value(), "w3:1.2.abc");
}

// ---- The RoundEngine issues and revokes.

class EngineCredentialsTest : public ::testing::Test {
 protected:
  void Start(bool credentials) {
    coordinator::EngineOptions o;
    o.config.mutable_model()->set_name("mlp");
    o.config.mutable_sync()->set_min_participants(2);
    o.run_id = "run-c";
    o.member_credentials = credentials;
    o.credential_secret = Secrets();
    engine_ = std::make_unique<coordinator::RoundEngine>(o, &clock_);
  }
  coordinator::JoinResult Join(int port, const std::string& previous = "") {
    v1::JoinRequest r;
    r.set_peer_address(absl::StrCat("127.0.0.1:", port));
    r.set_previous_worker_id(previous);
    absl::StatusOr<coordinator::JoinResult> j = engine_->Join(r);
    EXPECT_TRUE(j.ok()) << j.status();
    return *std::move(j);
  }
  // A member's session opens and hears the full list; later changes reach
  // it through the directives.
  void Connect(const std::string& id, MemberSet* set) {
    ASSERT_TRUE(engine_->Connect(id).ok());
    coordinator::SharedMessage list = engine_->MemberList(id);
    ASSERT_NE(list, nullptr);
    ASSERT_TRUE(list->member_update().full());
    set->Enable();
    set->Apply(list->member_update());
  }
  static void Deliver(const coordinator::Directives& ds, const std::string& to, MemberSet* set) {
    for (const coordinator::Directive& d : ds) {
      if (d.worker_id == to && d.message->has_member_update()) {
        set->Apply(d.message->member_update());
      }
    }
  }
  FakeClock clock_;
  std::unique_ptr<coordinator::RoundEngine> engine_;
};

TEST_F(EngineCredentialsTest, OffWithoutTheOption) {
  Start(false);
  coordinator::JoinResult j = Join(5001);
  EXPECT_TRUE(j.response.member_credential().empty());
  EXPECT_EQ(engine_->MemberList(j.response.worker_id()), nullptr);
}

TEST_F(EngineCredentialsTest, JoinIssuesLeaveRevokesRejoinReplaces) {
  Start(true);
  MemberSet peer;  // w1's Peer service
  coordinator::JoinResult j1 = Join(5001);
  const std::string w1 = j1.response.worker_id();
  ASSERT_FALSE(j1.response.member_credential().empty());
  Connect(w1, &peer);

  // w2 joins: w1 hears of it with the Join's directives.
  coordinator::JoinResult j2 = Join(5002);
  const std::string w2 = j2.response.worker_id();
  const std::string c2 = j2.response.member_credential();
  EXPECT_TRUE(absl::IsUnavailable(peer.Check(w2, c2))) << "not delivered yet: retry";
  Deliver(j2.directives, w1, &peer);
  EXPECT_TRUE(peer.Check(w2, c2).ok());

  // w2 re-joins under its id (a lost session): a new credential, the old
  // one dies.
  coordinator::JoinResult again = Join(5002, w2);
  ASSERT_EQ(again.response.worker_id(), w2);
  const std::string renewed = again.response.member_credential();
  ASSERT_NE(renewed, c2);
  Deliver(again.directives, w1, &peer);
  EXPECT_TRUE(absl::IsPermissionDenied(peer.Check(w2, c2)));
  EXPECT_TRUE(peer.Check(w2, renewed).ok());

  // w2's session breaks: it is removed, and its credential stops working.
  coordinator::Directives gone = engine_->Disconnect(w2, "session stream closed");
  Deliver(gone, w1, &peer);
  EXPECT_TRUE(absl::IsPermissionDenied(peer.Check(w2, renewed)));
  EXPECT_TRUE(peer.Check(w1, j1.response.member_credential()).ok());
}

TEST_F(EngineCredentialsTest, ExpiredLeaseRevokesAndLateSessionsGetTheFullList) {
  Start(true);
  MemberSet peer1;
  const coordinator::JoinResult j1 = Join(5001);
  Connect(j1.response.worker_id(), &peer1);
  const coordinator::JoinResult j2 = Join(5002);  // never opens a session
  Deliver(j2.directives, j1.response.worker_id(), &peer1);
  // A third member connecting later hears about both in its full list.
  const coordinator::JoinResult j3 = Join(5003);
  MemberSet peer3;
  Connect(j3.response.worker_id(), &peer3);
  EXPECT_TRUE(peer3.Check(j2.response.worker_id(), j2.response.member_credential()).ok());
  EXPECT_TRUE(peer3.Check(j1.response.worker_id(), j1.response.member_credential()).ok());
  // w2's session grace passes: evicted, revoked on both peers. The others
  // keep heartbeating.
  for (int i = 0; i < 12; ++i) {
    clock_.Advance(absl::Seconds(1));
    ASSERT_TRUE(engine_->Heartbeat(j1.response.worker_id()).ok());
    ASSERT_TRUE(engine_->Heartbeat(j3.response.worker_id()).ok());
    const coordinator::Directives ds = engine_->Tick();
    Deliver(ds, j1.response.worker_id(), &peer1);
    Deliver(ds, j3.response.worker_id(), &peer3);
  }
  ASSERT_FALSE(engine_->IsActive(j2.response.worker_id()));
  EXPECT_TRUE(absl::IsPermissionDenied(
      peer1.Check(j2.response.worker_id(), j2.response.member_credential())));
  EXPECT_TRUE(absl::IsPermissionDenied(
      peer3.Check(j2.response.worker_id(), j2.response.member_credential())));
}

TEST_F(EngineCredentialsTest, CheckpointRequestsCarryAGrantTheStoreAccepts) {
  coordinator::EngineOptions o;
  o.config.mutable_model()->set_name("mlp");
  o.config.mutable_gossip()->set_checkpoint_every(100);
  o.config.mutable_checkpoints()->set_store("127.0.0.1:50052");
  o.run_id = "run-g";
  o.upload_key = "upload-key-0123456789abcdef";
  o.gossip_grant_ttl = absl::Hours(1);
  coordinator::RoundEngine engine(o, &clock_);
  v1::JoinRequest r;
  r.set_peer_address("127.0.0.1:6001");
  absl::StatusOr<coordinator::JoinResult> j = engine.Join(r);
  ASSERT_TRUE(j.ok()) << j.status();
  const std::string id = j->response.worker_id();
  ASSERT_TRUE(engine.Connect(id).ok());
  coordinator::Directives out;
  ASSERT_TRUE(engine.JoinRound(id, 0, &out).ok());
  std::string grant;
  for (const coordinator::Directive& d : out) {
    if (d.message->has_checkpoint_request()) grant = d.message->checkpoint_request().upload_grant();
  }
  ASSERT_FALSE(grant.empty());
  absl::StatusOr<UploadGrant> v = VerifyUploadGrant(o.upload_key, grant, clock_.Now());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->worker_id, id);
  // Gossip: this sequence and every later one, for gossip_grant_ttl.
  EXPECT_TRUE(GrantCovers(*v, "run-g", 1).ok());
  EXPECT_TRUE(GrantCovers(*v, "run-g", 1000).ok());
  EXPECT_TRUE(absl::IsPermissionDenied(GrantCovers(*v, "run-g", 0)));
  clock_.Advance(absl::Hours(1));
  EXPECT_TRUE(
      absl::IsPermissionDenied(VerifyUploadGrant(o.upload_key, grant, clock_.Now()).status()));
}

// ---- Upload grants (common/upload_grant.h), at a fake time.

TEST(UploadGrantTest, SignedCoveredAndNotExpired) {
  FakeClock clock;
  const UploadGrant g{"run-1", "w2", 10, 10, clock.Now() + absl::Seconds(60)};
  const std::string text = SignUploadGrant("key-0123456789abcdef", g);
  EXPECT_EQ(text.find("key-0123456789abcdef"), std::string::npos);
  absl::StatusOr<UploadGrant> v = VerifyUploadGrant("key-0123456789abcdef", text, clock.Now());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->worker_id, "w2");
  EXPECT_TRUE(GrantCovers(*v, "run-1", 10).ok());
  EXPECT_TRUE(absl::IsPermissionDenied(GrantCovers(*v, "run-1", 11)));
  EXPECT_TRUE(absl::IsPermissionDenied(GrantCovers(*v, "run-2", 10)));
  // Another key, an edited field, nothing, garbage.
  EXPECT_TRUE(absl::IsPermissionDenied(
      VerifyUploadGrant("other-key-0123456789", text, clock.Now()).status()));
  std::string edited = text;
  edited.replace(edited.find("|w2|"), 4, "|w3|");
  EXPECT_TRUE(absl::IsPermissionDenied(
      VerifyUploadGrant("key-0123456789abcdef", edited, clock.Now()).status()));
  EXPECT_TRUE(absl::IsPermissionDenied(
      VerifyUploadGrant("key-0123456789abcdef", "", clock.Now()).status()));
  EXPECT_TRUE(absl::IsPermissionDenied(
      VerifyUploadGrant("key-0123456789abcdef", "a|b|c", clock.Now()).status()));
  // It expires.
  clock.Advance(absl::Seconds(59));
  EXPECT_TRUE(VerifyUploadGrant("key-0123456789abcdef", text, clock.Now()).ok());
  clock.Advance(absl::Seconds(1));
  const absl::Status expired =
      VerifyUploadGrant("key-0123456789abcdef", text, clock.Now()).status();
  EXPECT_TRUE(absl::IsPermissionDenied(expired));
  EXPECT_NE(expired.message().find("expired"), std::string::npos) << expired;
}

}  // namespace
}  // namespace shoal
