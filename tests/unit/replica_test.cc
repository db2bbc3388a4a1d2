// Coordinator replicas on a fake etcd: election, lease loss, deposition,
// revision-checked record writes and the leader hint.
#include "services/coordinator/core/replica.h"

#include <gtest/gtest.h>

#include "services/coordinator/core/round_engine.h"
#include "tests/unit/fake_etcd.h"
#include "tests/unit/round_engine_test_util.h"

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

TEST(ReplicaTest, StandbySeesTheLeaderKeyGoneBeforeItsNextStep) {
  FakeClock clock;
  FakeEtcd etcd(&clock);
  Replica a(&etcd, Opts("a:1"), &clock);
  Replica b(&etcd, Opts("b:1"), &clock);
  ASSERT_EQ(a.Step(), ReplicaEvent::kElected);
  ASSERT_EQ(b.Step(), ReplicaEvent::kNone);
  EXPECT_FALSE(a.LeaderGone());  // a leader never campaigns
  EXPECT_FALSE(b.LeaderGone());
  // a dies; its lease (4 s) runs out while b only looks (b's own lease,
  // renewed at its steps, outlives a's).
  clock.Advance(absl::Seconds(2));
  ASSERT_EQ(b.Step(), ReplicaEvent::kNone);
  clock.Advance(absl::Seconds(1));
  EXPECT_FALSE(b.LeaderGone());
  clock.Advance(absl::Seconds(1));
  EXPECT_TRUE(b.LeaderGone());
  EXPECT_EQ(b.Step(), ReplicaEvent::kElected);
  EXPECT_FALSE(b.LeaderGone());
  // etcd unreachable: nothing is concluded.
  Replica c(&etcd, Opts("c:1"), &clock);
  etcd.SetDown(true);
  EXPECT_FALSE(c.LeaderGone());
}

// The round engine of each leader as coordinator_replica.cc wires it: a
// round starts only once the record is written under the leader's term.
EngineOptions LeaderEngine(Replica* replica, std::optional<shoal::v1::RunRecord> resume) {
  EngineOptions eo;
  eo.run_id = "run-1";
  eo.config.mutable_sync()->set_min_participants(2);
  eo.config.mutable_training()->set_local_steps(10);
  eo.resume = std::move(resume);
  eo.before_round_start = [replica](const shoal::v1::RunRecord& record, uint64_t version) {
    return replica->CanStartRounds() && replica->SaveRecord(record, version).ok();
  };
  return eo;
}

shoal::v1::JoinRequest JoinAs(int port, const std::string& previous = "", uint64_t model_round = 0,
                              const std::string& hash = "") {
  shoal::v1::JoinRequest j;
  j.set_peer_address(test_util::Address(port));
  j.set_previous_worker_id(previous);
  j.set_model_round(model_round);
  j.set_model_hash(hash);
  return j;
}

void Ready(RoundEngine& e, const std::string& id, uint64_t round, Directives* out) {
  shoal::v1::ReportReadyRequest r;
  r.set_worker_id(id);
  r.set_round(round);
  r.set_total_elements(test_util::kTotal);
  ASSERT_TRUE(e.ReportReady(r, out).ok()) << id << " round " << round;
}

// Connections and the exchange of `round` (plan attempt 1) for `ids`, all
// ending with `hash`.
void Exchange(RoundEngine& e, const std::vector<std::string>& ids, uint64_t round,
              const std::string& hash, Directives* out) {
  for (const std::string& id : ids) {
    shoal::v1::ConnectionsReadyRequest c;
    c.set_worker_id(id);
    c.set_round(round);
    c.set_attempt(1);
    ASSERT_TRUE(e.ConnectionsReady(c, out).ok()) << id;
  }
  for (const std::string& id : ids) {
    shoal::v1::ReportRoundDoneRequest d;
    d.set_worker_id(id);
    d.set_round(round);
    d.set_attempt(1);
    d.set_model_hash(hash);
    ASSERT_TRUE(e.ReportRoundDone(d, out).ok()) << id;
  }
}

TEST(ReplicaFailoverTest, NewLeaderReopensTheInterruptedRoundAndTakesTheCarriedWork) {
  using test_util::kPlan;
  using test_util::kStart;
  FakeClock clock;
  FakeEtcd etcd(&clock);
  Replica a(&etcd, Opts("a:1"), &clock);
  Replica b(&etcd, Opts("b:1"), &clock);
  ASSERT_EQ(a.Step(), ReplicaEvent::kElected);
  ASSERT_EQ(b.Step(), ReplicaEvent::kNone);
  RoundEngine old_leader(LeaderEngine(&a, std::nullopt), &clock);
  std::vector<std::string> ids;
  Directives out;
  for (int port : {7001, 7002, 7003}) {
    absl::StatusOr<JoinResult> joined = old_leader.Join(JoinAs(port));
    ASSERT_TRUE(joined.ok());
    ids.push_back(joined->response.worker_id());
    ASSERT_TRUE(old_leader.Connect(ids.back()).ok());
  }
  for (const std::string& id : ids) ASSERT_TRUE(old_leader.JoinRound(id, 0, &out).ok());
  for (const std::string& id : ids) Ready(old_leader, id, 1, &out);
  Exchange(old_leader, ids, 1, test_util::Hash('1'), &out);
  ASSERT_EQ(old_leader.last_completed_round(), 1u);
  // Round 2 is under way (its start wrote the record: round 1, hash 1);
  // w1 even reported ready to the old leader. Then the old leader dies.
  Ready(old_leader, ids[0], 2, &out);
  bool gone = false;
  for (int i = 0; i < 6 && !gone; ++i) {
    clock.Advance(absl::Seconds(1));
    gone = b.LeaderGone();
    if (!gone) {
      ASSERT_EQ(b.Step(), ReplicaEvent::kNone);
    }
  }
  ASSERT_TRUE(gone);
  ASSERT_EQ(b.Step(), ReplicaEvent::kElected);
  absl::StatusOr<std::optional<shoal::v1::RunRecord>> record = b.LoadRecord();
  ASSERT_TRUE(record.ok() && record->has_value());
  EXPECT_EQ((*record)->last_completed_round(), 1u);
  RoundEngine new_leader(LeaderEngine(&b, **record), &clock);

  // The workers re-join with their ids and model, carrying round 2's work.
  out.clear();
  for (int k = 0; k < 2; ++k) {
    absl::StatusOr<JoinResult> joined =
        new_leader.Join(JoinAs(7001 + k, ids[k], 1, test_util::Hash('1')));
    ASSERT_TRUE(joined.ok());
    EXPECT_EQ(joined->response.worker_id(), ids[k]);
    EXPECT_EQ(joined->response.model_round(), 1u);
    ASSERT_TRUE(new_leader.Connect(ids[k]).ok());
    absl::StatusOr<uint64_t> admitted = new_leader.JoinRound(ids[k], 0, &out, /*carried=*/2);
    ASSERT_TRUE(admitted.ok());
    EXPECT_EQ(*admitted, 2u);
  }
  // Round 2 is reopened from round 1's model: no gap, no repeat.
  ASSERT_EQ(test_util::To(out, kStart).size(), 2u);
  const shoal::v1::RoundStart start = test_util::MessageFor(out, ids[0], kStart).round_start();
  EXPECT_EQ(start.round(), 2u);
  EXPECT_EQ(start.base_model_round(), 1u);
  EXPECT_EQ(start.base_model_hash(), test_util::Hash('1'));
  // The re-joined workers report ready at once; the third one, late, still
  // joins the round because it carries its work too.
  out.clear();
  clock.Advance(absl::Milliseconds(900));
  Ready(new_leader, ids[0], 2, &out);
  absl::StatusOr<JoinResult> late = new_leader.Join(JoinAs(7003, ids[2], 1, test_util::Hash('1')));
  ASSERT_TRUE(late.ok());
  ASSERT_TRUE(new_leader.Connect(ids[2]).ok());
  absl::StatusOr<uint64_t> admitted = new_leader.JoinRound(ids[2], 0, &out, /*carried=*/2);
  ASSERT_TRUE(admitted.ok());
  EXPECT_EQ(*admitted, 2u);
  EXPECT_EQ(test_util::To(out, kStart), std::vector<std::string>{ids[2]});
  Ready(new_leader, ids[1], 2, &out);
  EXPECT_TRUE(test_util::To(out, kPlan).empty());
  Ready(new_leader, ids[2], 2, &out);
  const shoal::v1::RoundPlan plan = test_util::MessageFor(out, ids[2], kPlan).round_plan();
  EXPECT_EQ(plan.round(), 2u);
  EXPECT_EQ(plan.slices_size(), 3);
  Exchange(new_leader, ids, 2, test_util::Hash('2'), &out);
  EXPECT_EQ(new_leader.last_completed_round(), 2u);
  const shoal::v1::RunStatus status = new_leader.Status();
  ASSERT_EQ(status.recent_rounds_size(), 1);
  EXPECT_EQ(status.recent_rounds(0).round(), 2u);
  EXPECT_EQ(status.recent_rounds(0).participants(), 3u);
  // Carried ready reports were not trained under this leader: they are no
  // ready-time samples (the adaptive deadline would shrink to nothing).
  for (const std::string& id : ids) {
    EXPECT_EQ(test_util::FindWorker(status, id)->ready_seconds_median(), 0.0) << id;
  }
  // Round 3's start writes round 2 under the new term; the old leader's
  // write is refused.
  ASSERT_EQ(new_leader.Status().round(), 3u);
  ASSERT_TRUE(b.SaveRecord(new_leader.Record(), new_leader.record_version()).ok());
  record = b.LoadRecord();
  ASSERT_TRUE(record.ok() && record->has_value());
  EXPECT_EQ((*record)->last_completed_round(), 2u);
  EXPECT_EQ((*record)->model_hash(), test_util::Hash('2'));
  EXPECT_FALSE(a.SaveRecord(old_leader.Record(), old_leader.record_version() + 100).ok());
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

// A record as a run has it: a config, a layout, checkpoints with their
// ledgers; only the round's fields change from round to round.
shoal::v1::RunRecord FullRecord(uint64_t round, int checkpoints) {
  shoal::v1::RunRecord r = Record(round);
  r.set_model_hash(std::string(64, 'a' + static_cast<char>(round % 26)));
  r.mutable_config()->mutable_training()->set_local_steps(20);
  r.mutable_config()->mutable_exchange()->set_codec("int8");
  r.mutable_config()->mutable_checkpoints()->set_store("10.78.0.1:50060");
  for (int i = 0; i < 6; ++i) {
    shoal::v1::TensorSpec* t = r.mutable_layout()->add_tensors();
    t->set_name("layer" + std::to_string(i) + ".weight");
    t->add_shape(256);
    t->add_shape(784);
    t->set_dtype("float32");
  }
  for (int i = 0; i < checkpoints; ++i) {
    shoal::v1::CheckpointRef* c = r.add_checkpoints();
    c->set_id("run-1-r" + std::to_string(i * 5));
    c->set_round(i * 5);
    c->set_model_hash(std::string(64, 'c'));
    c->mutable_ledger()->set_dataset_samples(60000);
  }
  r.mutable_ledger()->set_dataset_samples(60000);
  r.mutable_ledger()->set_offset(round * 1280 % 60000);
  return r;
}

// The write of every round is small: the rarely changing parts (config,
// layout, checkpoints, bans) go under a key of their own, written only when
// they change, and a load puts the record back together. (A soak's 5.6 KB
// record written every round filled etcd's in-memory raft log.)
TEST(ReplicaTest, TheRoundsWriteLeavesTheRarePartsAlone) {
  FakeClock clock;
  FakeEtcd etcd(&clock);
  Replica a(&etcd, Opts("a:1"), &clock);
  ASSERT_EQ(a.Step(), ReplicaEvent::kElected);
  ASSERT_TRUE(a.LoadRecord().ok());
  ASSERT_TRUE(a.SaveRecord(FullRecord(1, 2), 1).ok());
  auto rare = etcd.Get("/shoal/test/record-rare");
  ASSERT_TRUE(rare.ok() && rare->has_value());
  const int64_t rare_revision = (*rare)->mod_revision;
  for (uint64_t round = 2; round < 5; ++round) {
    ASSERT_TRUE(a.SaveRecord(FullRecord(round, 2), round).ok());
  }
  rare = etcd.Get("/shoal/test/record-rare");
  EXPECT_EQ((*rare)->mod_revision, rare_revision);
  auto progress = etcd.Get("/shoal/test/record");
  ASSERT_TRUE(progress.ok() && progress->has_value());
  EXPECT_LT((*progress)->value.size(), FullRecord(4, 2).ByteSizeLong() / 3);
  // A new checkpoint changes the rare part: it is written with that round.
  ASSERT_TRUE(a.SaveRecord(FullRecord(5, 3), 5).ok());
  rare = etcd.Get("/shoal/test/record-rare");
  EXPECT_GT((*rare)->mod_revision, rare_revision);
  EXPECT_EQ((*rare)->mod_revision, (*etcd.Get("/shoal/test/record"))->mod_revision);
  // The next leader reads the whole record back, and its first write puts
  // both keys again.
  Replica b(&etcd, Opts("b:1"), &clock);
  a.Resign();
  ASSERT_EQ(b.Step(), ReplicaEvent::kElected);
  auto loaded = b.LoadRecord();
  ASSERT_TRUE(loaded.ok() && loaded->has_value()) << loaded.status();
  EXPECT_EQ((*loaded)->SerializeAsString(), FullRecord(5, 3).SerializeAsString());
  ASSERT_TRUE(b.SaveRecord(FullRecord(6, 3), 1).ok());
  EXPECT_EQ((*etcd.Get("/shoal/test/record-rare"))->mod_revision,
            (*etcd.Get("/shoal/test/record"))->mod_revision);
}

// A standby steps every TTL / 4 for the life of the run. While another
// replica leads it writes nothing (a transaction with a put is a raft entry
// in etcd even when its comparison fails), and its look at an unchanged
// record is one read.
TEST(ReplicaTest, AStandbyWritesNothingAndReadsAnUnchangedRecordOnce) {
  FakeClock clock;
  FakeEtcd etcd(&clock);
  Replica a(&etcd, Opts("a:1"), &clock);
  Replica b(&etcd, Opts("b:1"), &clock);
  ASSERT_EQ(a.Step(), ReplicaEvent::kElected);
  ASSERT_TRUE(a.LoadRecord().ok());
  ASSERT_TRUE(a.SaveRecord(FullRecord(1, 2), 1).ok());
  ASSERT_EQ(b.Step(), ReplicaEvent::kNone);
  ASSERT_TRUE(b.LoadRecord().ok());
  const int proposals = etcd.proposals();
  for (int i = 0; i < 20; ++i) {
    clock.Advance(absl::Seconds(1));
    ASSERT_EQ(a.Step(), ReplicaEvent::kNone);
    ASSERT_EQ(b.Step(), ReplicaEvent::kNone);
    EXPECT_EQ(b.state().leader, "a:1");
    const int calls = etcd.calls();
    auto loaded = b.LoadRecord();
    ASSERT_TRUE(loaded.ok() && loaded->has_value()) << loaded.status();
    EXPECT_EQ((*loaded)->last_completed_round(), 1u);
    EXPECT_EQ(etcd.calls() - calls, 1) << "step " << i;
  }
  EXPECT_EQ(etcd.proposals(), proposals);
  // A new round's write is read in full (the rare part with it).
  ASSERT_TRUE(a.SaveRecord(FullRecord(2, 3), 2).ok());
  auto loaded = b.LoadRecord();
  ASSERT_TRUE(loaded.ok() && loaded->has_value());
  EXPECT_EQ((*loaded)->SerializeAsString(), FullRecord(2, 3).SerializeAsString());
  // The leader gone, the standby campaigns (a write) and wins.
  a.Resign();
  EXPECT_EQ(b.Step(), ReplicaEvent::kElected);
  EXPECT_GT(etcd.proposals(), proposals + 1);
}

// Between its steps a standby watches the leader key from the revision its
// last step read: a deletion after it (the leader resigned, or its lease
// expired), even one followed by another replica's election, ends the wait.
TEST(ReplicaTest, AStandbyWatchesTheLeaderKeyFromTheRevisionItRead) {
  FakeClock clock;
  FakeEtcd etcd(&clock);
  Replica a(&etcd, Opts("a:1"), &clock);
  Replica b(&etcd, Opts("b:1"), &clock);
  Replica c(&etcd, Opts("c:1"), &clock);
  ASSERT_EQ(a.Step(), ReplicaEvent::kElected);
  EXPECT_EQ(a.leader_watch_revision(), 0);  // a leader watches nothing
  ASSERT_EQ(b.Step(), ReplicaEvent::kNone);
  ASSERT_EQ(c.Step(), ReplicaEvent::kNone);
  const int64_t revision = b.leader_watch_revision();
  ASSERT_GT(revision, 0);
  EXPECT_FALSE(b.AwaitLeaderGone(revision, absl::Seconds(1)));
  EXPECT_FALSE(b.AwaitLeaderGone(0, absl::Seconds(1)));
  // a resigns and c wins before b's watch looks: the deletion in between
  // still ends it.
  a.Resign();
  ASSERT_EQ(c.Step(), ReplicaEvent::kElected);
  EXPECT_TRUE(b.AwaitLeaderGone(revision, absl::Seconds(1)));
  ASSERT_EQ(b.Step(), ReplicaEvent::kNone);  // c holds it now
  EXPECT_EQ(b.state().leader, "c:1");
  EXPECT_GT(b.leader_watch_revision(), revision);
  EXPECT_FALSE(b.AwaitLeaderGone(b.leader_watch_revision(), absl::Seconds(1)));
  // c's lease runs out: the key goes, and b's watch sees it.
  const int64_t from = b.leader_watch_revision();
  clock.Advance(absl::Seconds(5));
  EXPECT_TRUE(b.AwaitLeaderGone(from, absl::Seconds(1)));
  EXPECT_EQ(b.Step(), ReplicaEvent::kElected);
  EXPECT_EQ(b.leader_watch_revision(), 0);
}

// A record written before the split (everything under one key) loads as it
// is, and the next write splits it.
TEST(ReplicaTest, ARecordInOneKeyStillLoads) {
  FakeClock clock;
  FakeEtcd etcd(&clock);
  etcd.PutRaw("/shoal/test/record", FullRecord(7, 2).SerializeAsString());
  Replica a(&etcd, Opts("a:1"), &clock);
  ASSERT_EQ(a.Step(), ReplicaEvent::kElected);
  auto loaded = a.LoadRecord();
  ASSERT_TRUE(loaded.ok() && loaded->has_value()) << loaded.status();
  EXPECT_EQ((*loaded)->SerializeAsString(), FullRecord(7, 2).SerializeAsString());
  ASSERT_TRUE(a.SaveRecord(FullRecord(8, 2), 1).ok());
  loaded = a.LoadRecord();
  ASSERT_TRUE(loaded.ok() && loaded->has_value());
  EXPECT_EQ((*loaded)->SerializeAsString(), FullRecord(8, 2).SerializeAsString());
  // A rare key that is not a record part is data loss, not a silent
  // record without its config.
  // (Written, as every writer does, with the progress key: a load that
  // finds the progress key unchanged reads nothing else.)
  etcd.PutRaw("/shoal/test/record-rare", "not a protobuf \xff\xff");
  etcd.PutRaw("/shoal/test/record", (*etcd.Get("/shoal/test/record"))->value);
  EXPECT_TRUE(absl::IsDataLoss(a.LoadRecord().status()));
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
