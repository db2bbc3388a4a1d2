// Coordinator replicas on a fake etcd: election, lease loss, deposition,
// revision-checked record writes and the leader hint.
#include "services/coordinator/core/replica.h"

#include <gtest/gtest.h>

#include "tests/unit/fake_etcd.h"

namespace shoal::coordinator {
namespace {

using shoal::testing::FakeEtcd;

ReplicaOptions Opts(const std::string& self) {
  ReplicaOptions o;
  o.prefix = "/shoal/test/";
  o.self = self;
  o.lease_ttl = absl::Seconds(4);
  return o;
}

shoal::v1::RunRecord Record(uint64_t round) {
  shoal::v1::RunRecord r;
  r.set_run_id("run-1");
  r.set_last_completed_round(round);
  return r;
}

TEST(ReplicaTest, FirstCampaignerLeadsTheOtherFollowsWithAHint) {
  FakeClock clock;
  FakeEtcd etcd(&clock);
  Replica a(&etcd, Opts("a:1"), &clock);
  Replica b(&etcd, Opts("b:1"), &clock);
  EXPECT_EQ(a.Step(), ReplicaEvent::kElected);
  EXPECT_EQ(b.Step(), ReplicaEvent::kNone);
  EXPECT_TRUE(a.CanStartRounds());
  EXPECT_FALSE(b.CanStartRounds());
  EXPECT_EQ(b.state().role, ReplicaRole::kStandby);
  EXPECT_EQ(b.state().leader, "a:1");
  EXPECT_GT(a.state().term, 0);
  // Steps keep the roles.
  for (int i = 0; i < 5; ++i) {
    clock.Advance(absl::Seconds(1));
    EXPECT_EQ(a.Step(), ReplicaEvent::kNone);
    EXPECT_EQ(b.Step(), ReplicaEvent::kNone);
  }
  EXPECT_TRUE(a.CanStartRounds());
  EXPECT_EQ(b.state().leader, "a:1");
}

TEST(ReplicaTest, StandbyTakesOverWhenTheLeadersLeaseExpires) {
  FakeClock clock;
  FakeEtcd etcd(&clock);
  Replica a(&etcd, Opts("a:1"), &clock);
  Replica b(&etcd, Opts("b:1"), &clock);
  ASSERT_EQ(a.Step(), ReplicaEvent::kElected);
  ASSERT_EQ(b.Step(), ReplicaEvent::kNone);
  const int64_t first_term = a.state().term;
  // a dies (stops stepping); b keeps its own lease alive.
  for (int i = 0; i < 3; ++i) {
    clock.Advance(absl::Seconds(1));
    EXPECT_EQ(b.Step(), ReplicaEvent::kNone) << i;
  }
  clock.Advance(absl::Seconds(1));  // 4 s: a's lease is gone
  EXPECT_EQ(b.Step(), ReplicaEvent::kElected);
  EXPECT_TRUE(b.CanStartRounds());
  EXPECT_GT(b.state().term, first_term);
  // a wakes up: it cannot start rounds (its lease time is over) and etcd
  // tells it the lease is gone.
  EXPECT_FALSE(a.CanStartRounds());
  EXPECT_EQ(a.Step(), ReplicaEvent::kDeposed);
  EXPECT_EQ(a.state().role, ReplicaRole::kStandby);
  EXPECT_EQ(a.state().leader, "");
  a.Step();
  EXPECT_EQ(a.state().leader, "b:1");
}

TEST(ReplicaTest, RecordWritesCheckTheRevisionTheyRead) {
  FakeClock clock;
  FakeEtcd etcd(&clock);
  Replica a(&etcd, Opts("a:1"), &clock);
  ASSERT_EQ(a.Step(), ReplicaEvent::kElected);
  auto none = a.LoadRecord();
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->has_value());
  ASSERT_TRUE(a.SaveRecord(Record(1)).ok());
  ASSERT_TRUE(a.SaveRecord(Record(2)).ok());
  // Somebody else writes the record: the next write is refused and the
  // writer steps down instead of overwriting.
  etcd.PutRaw("/shoal/test/record", Record(7).SerializeAsString());
  absl::Status s = a.SaveRecord(Record(3));
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_EQ(a.state().role, ReplicaRole::kStandby);
  auto kv = etcd.Get("/shoal/test/record");
  ASSERT_TRUE(kv.ok() && kv->has_value());
  shoal::v1::RunRecord stored;
  ASSERT_TRUE(stored.ParseFromString((*kv)->value));
  EXPECT_EQ(stored.last_completed_round(), 7u);
}

// A write that timed out but that etcd applied (a member losing its raft
// leader commits it after the client's deadline) is not another writer: the
// leader keeps leading and writes on.
TEST(ReplicaTest, WriteAppliedAfterItsDeadlineIsRecognisedAsOurOwn) {
  FakeClock clock;
  FakeEtcd etcd(&clock);
  Replica a(&etcd, Opts("a:1"), &clock);
  ASSERT_EQ(a.Step(), ReplicaEvent::kElected);
  ASSERT_TRUE(a.LoadRecord().ok());
  ASSERT_TRUE(a.SaveRecord(Record(1), 1).ok());
  etcd.ApplyNextTxnButTimeOut();
  absl::Status timed_out = a.SaveRecord(Record(2), 2);
  EXPECT_TRUE(absl::IsDeadlineExceeded(timed_out)) << timed_out;
  // The engine writes again (the same record, or a newer one).
  ASSERT_TRUE(a.SaveRecord(Record(2), 2).ok());
  EXPECT_EQ(a.state().role, ReplicaRole::kLeader);
  etcd.ApplyNextTxnButTimeOut();
  EXPECT_FALSE(a.SaveRecord(Record(3), 3).ok());
  ASSERT_TRUE(a.SaveRecord(Record(4), 4).ok());
  EXPECT_EQ(a.state().role, ReplicaRole::kLeader);
  auto kv = etcd.Get("/shoal/test/record");
  ASSERT_TRUE(kv.ok() && kv->has_value());
  shoal::v1::RunRecord stored;
  ASSERT_TRUE(stored.ParseFromString((*kv)->value));
  EXPECT_EQ(stored.last_completed_round(), 4u);
  // A foreign write under our key is still refused.
  etcd.PutRaw("/shoal/test/record", Record(9).SerializeAsString());
  EXPECT_TRUE(absl::IsFailedPrecondition(a.SaveRecord(Record(5), 5)));
  EXPECT_EQ(a.state().role, ReplicaRole::kStandby);
}

// A replica that stepped down while its lease (and so the leader key) lived
// on takes the key back instead of leaving the run without a leader; the
// other replica keeps seeing it as the leader.
TEST(ReplicaTest, ReplicaThatSteppedDownOnItsOwnKeyTakesItBack) {
  FakeClock clock;
  FakeEtcd etcd(&clock);
  Replica a(&etcd, Opts("a:1"), &clock);
  Replica b(&etcd, Opts("b:1"), &clock);
  ASSERT_EQ(a.Step(), ReplicaEvent::kElected);
  const int64_t term = a.state().term;
  ASSERT_TRUE(a.LoadRecord().ok());
  etcd.PutRaw("/shoal/test/record", Record(9).SerializeAsString());
  ASSERT_FALSE(a.SaveRecord(Record(1), 1).ok());
  ASSERT_EQ(a.state().role, ReplicaRole::kStandby);
  EXPECT_EQ(b.Step(), ReplicaEvent::kNone);
  EXPECT_EQ(b.state().leader, "a:1");
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(a.Step(), ReplicaEvent::kElected);
  EXPECT_EQ(a.state().term, term);
  EXPECT_TRUE(a.CanStartRounds());
  // It reads the record again (as the server does when elected) and writes on.
  auto rec = a.LoadRecord();
  ASSERT_TRUE(rec.ok() && rec->has_value());
  EXPECT_EQ((*rec)->last_completed_round(), 9u);
  EXPECT_TRUE(a.SaveRecord(Record(10), 10).ok());
  EXPECT_EQ(b.Step(), ReplicaEvent::kNone);
}

TEST(ReplicaTest, DeposedLeaderNeverOverwritesItsSuccessor) {
  FakeClock clock;
  FakeEtcd etcd(&clock);
  Replica a(&etcd, Opts("a:1"), &clock);
  Replica b(&etcd, Opts("b:1"), &clock);
  ASSERT_EQ(a.Step(), ReplicaEvent::kElected);
  ASSERT_TRUE(a.LoadRecord().ok());
  ASSERT_TRUE(a.SaveRecord(Record(5)).ok());
  ASSERT_EQ(b.Step(), ReplicaEvent::kNone);
  // a's lease expires behind its back (a GC pause, a partition).
  etcd.ExpireLease(100);  // a's (the fake numbers leases from 100)
  ASSERT_EQ(b.Step(), ReplicaEvent::kElected);
  auto rec = b.LoadRecord();
  ASSERT_TRUE(rec.ok() && rec->has_value());
  EXPECT_EQ((*rec)->last_completed_round(), 5u);
  ASSERT_TRUE(b.SaveRecord(Record(6)).ok());
  // a still believes it leads; its write of round 6 (a repeat) is refused,
  // even though the record revision check alone would not tell.
  EXPECT_EQ(a.state().role, ReplicaRole::kLeader);
  absl::Status s = a.SaveRecord(Record(6));
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("b:1"), std::string::npos) << s;
  EXPECT_EQ(a.state().role, ReplicaRole::kStandby);
  auto after = b.LoadRecord();
  ASSERT_TRUE(after.ok() && after->has_value());
  EXPECT_EQ((*after)->last_completed_round(), 6u);
  ASSERT_TRUE(b.SaveRecord(Record(7)).ok());
}

TEST(ReplicaTest, LosingEtcdStopsRoundsAtTheLeaseEndAndResumesWhenBack) {
  FakeClock clock;
  FakeEtcd etcd(&clock);
  Replica a(&etcd, Opts("a:1"), &clock);
  Replica b(&etcd, Opts("b:1"), &clock);
  ASSERT_EQ(a.Step(), ReplicaEvent::kElected);
  ASSERT_EQ(b.Step(), ReplicaEvent::kNone);
  etcd.SetDown(true);
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(a.Step(), ReplicaEvent::kNone);
  EXPECT_TRUE(a.CanStartRounds());  // the lease renewed at t=0 lasts to t=4
  EXPECT_FALSE(a.state().etcd_error.empty());
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(a.Step(), ReplicaEvent::kNone);
  EXPECT_FALSE(a.CanStartRounds()) << "no round may start once the lease may have expired";
  EXPECT_EQ(a.state().role, ReplicaRole::kLeader);  // not deposed: nobody else can lead either
  EXPECT_TRUE(absl::IsUnavailable(a.SaveRecord(Record(1))));
  // 10 s without etcd; the standby cannot take over meanwhile.
  for (int i = 0; i < 6; ++i) {
    clock.Advance(absl::Seconds(1));
    EXPECT_EQ(b.Step(), ReplicaEvent::kNone);
    EXPECT_EQ(a.Step(), ReplicaEvent::kNone);
    EXPECT_FALSE(a.CanStartRounds());
    EXPECT_FALSE(b.CanStartRounds());
  }
  etcd.SetDown(false);  // etcd extends leases when it comes back
  EXPECT_EQ(a.Step(), ReplicaEvent::kNone);
  EXPECT_TRUE(a.CanStartRounds());
  EXPECT_EQ(b.Step(), ReplicaEvent::kNone);
  EXPECT_FALSE(b.CanStartRounds());
  EXPECT_EQ(b.state().leader, "a:1");
  EXPECT_TRUE(a.SaveRecord(Record(1)).ok());
}

TEST(ReplicaTest, ResignHandsOverAtOnce) {
  FakeClock clock;
  FakeEtcd etcd(&clock);
  Replica a(&etcd, Opts("a:1"), &clock);
  Replica b(&etcd, Opts("b:1"), &clock);
  ASSERT_EQ(a.Step(), ReplicaEvent::kElected);
  ASSERT_EQ(b.Step(), ReplicaEvent::kNone);
  a.Resign();
  EXPECT_FALSE(a.CanStartRounds());
  EXPECT_EQ(b.Step(), ReplicaEvent::kElected);
}

TEST(ReplicaTest, GarbageRecordIsDataLoss) {
  FakeClock clock;
  FakeEtcd etcd(&clock);
  Replica a(&etcd, Opts("a:1"), &clock);
  ASSERT_EQ(a.Step(), ReplicaEvent::kElected);
  etcd.PutRaw("/shoal/test/record", "not a protobuf \xff\xff");
  auto r = a.LoadRecord();
  EXPECT_TRUE(absl::IsDataLoss(r.status())) << r.status();
}

TEST(ReplicaTest, ParseEndpoints) {
  auto ok = ParseEndpoints("127.0.0.1:2379, etcd-1:2379", "etcd");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->size(), 2u);
  EXPECT_TRUE(absl::IsInvalidArgument(ParseEndpoints("", "etcd").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ParseEndpoints("host", "etcd").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ParseEndpoints("h:0", "etcd").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ParseEndpoints("h:99999", "etcd").status()));
}

}  // namespace
}  // namespace shoal::coordinator
