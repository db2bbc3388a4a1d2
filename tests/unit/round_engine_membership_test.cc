// Unit tests of the round engine's membership transitions: join windows,
// minimum participants, the peer-connection barrier and its retries, leases,
// round deadlines, missed rounds, model holders, restart from a RunRecord and
// the durable record. No sockets, no sleeps: time only moves when the test
// advances the FakeClock.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/coordinator/core/round_engine.h"
#include "tests/unit/round_engine_test_util.h"

namespace shoal::coordinator {
namespace {

using ::shoal::v1::CoordinatorMessage;
using ::shoal::v1::RunStatus;
using ::shoal::v1::WorkerStatus;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

using namespace test_util;  // NOLINT(build/namespaces): the shared test vocabulary

std::vector<std::string> Strings(const google::protobuf::RepeatedPtrField<std::string>& r) {
  return {r.begin(), r.end()};
}

struct Options {
  uint32_t min_participants = 2;
  uint64_t rounds = 0;
  absl::Duration round_timeout = absl::Seconds(60);
  absl::Duration connection_timeout = absl::Seconds(5);
  uint32_t max_connection_retry = 2;
  uint32_t max_missed_rounds = 3;
  std::optional<v1::RunRecord> resume = std::nullopt;
  std::string checkpoint_store = "";
  uint32_t checkpoint_every = 0;
  bool adaptive_deadline = true;
  uint32_t adaptive_deadline_rounds = 3;
  bool fold_late_work = true;
  uint32_t max_staleness = 4;
  bool hierarchy = false;
};

struct JoinArgs {
  std::string previous_worker_id = "";
  uint64_t model_round = 0;
  std::string model_hash = "";
  std::optional<uint32_t> previous_data_rank = std::nullopt;
  std::string zone = "";
};

class MembershipTest : public ::testing::Test {
 protected:
  // The engine keeps O(1) barrier counters and participant/queue sets next
  // to the members' flags; every helper below checks them against a full
  // recount, so every test of this file also tests them.
  void TearDown() override {
    if (engine_ != nullptr) ExpectConsistent();
  }
  void ExpectConsistent() {
    EXPECT_TRUE(engine_->CountersConsistentForTesting()) << engine_->Status().DebugString();
  }

  void Start(const Options& o = Options()) {
    EngineOptions options;
    options.config.mutable_model()->set_name("mlp");
    options.config.mutable_sync()->set_min_participants(o.min_participants);
    options.config.mutable_sync()->set_rounds(o.rounds);
    options.config.mutable_training()->set_seed(7);
    options.run_id = "run-m";
    options.heartbeat_lease = absl::Seconds(10);
    options.session_grace = absl::Seconds(10);
    options.round_timeout = o.round_timeout;
    options.connection_timeout = o.connection_timeout;
    options.max_connection_retry = o.max_connection_retry;
    options.max_missed_rounds = o.max_missed_rounds;
    options.adaptive_deadline.enabled = o.adaptive_deadline;
    options.adaptive_deadline.after_rounds = o.adaptive_deadline_rounds;
    options.adaptive_deadline.factor = 2.0;
    options.adaptive_deadline.floor = absl::Seconds(2);
    options.resume = o.resume;
    options.config.mutable_checkpoints()->set_store(o.checkpoint_store);
    options.config.mutable_checkpoints()->set_every(o.checkpoint_every);
    options.config.mutable_sync()->set_fold_late_work(o.fold_late_work);
    options.config.mutable_sync()->set_max_staleness(o.max_staleness);
    options.config.mutable_topology()->set_hierarchy(o.hierarchy);
    options.checkpoint_timeout = absl::Seconds(30);
    engine_ = std::make_unique<RoundEngine>(options, &clock_);
  }

  absl::StatusOr<JoinResult> Join(int port, const JoinArgs& args = {}) {
    v1::JoinRequest request;
    request.set_peer_address(Address(port));
    request.set_name(absl::StrCat("worker-", port));
    request.set_previous_worker_id(args.previous_worker_id);
    request.set_model_round(args.model_round);
    request.set_model_hash(args.model_hash);
    request.set_zone(args.zone);
    if (args.previous_data_rank.has_value()) {
      request.set_previous_data_rank(*args.previous_data_rank);
    }
    return engine_->Join(request);
  }

  // Joins and opens the session; returns the join response.
  v1::JoinResponse AddMemberResponse(int port, const JoinArgs& args = {}) {
    absl::StatusOr<JoinResult> joined = Join(port, args);
    EXPECT_TRUE(joined.ok()) << joined.status();
    if (!joined.ok()) return {};
    EXPECT_TRUE(engine_->Connect(joined->response.worker_id()).ok());
    ExpectConsistent();
    return joined->response;
  }

  std::string AddMember(int port, const JoinArgs& args = {}) {
    return AddMemberResponse(port, args).worker_id();
  }

  Directives JoinRoundOk(const std::string& id, uint64_t round, uint64_t expected_admitted) {
    Directives out;
    absl::StatusOr<uint64_t> admitted = engine_->JoinRound(id, round, &out);
    ExpectConsistent();
    EXPECT_TRUE(admitted.ok()) << admitted.status();
    if (admitted.ok()) {
      EXPECT_EQ(*admitted, expected_admitted) << id;
    }
    return out;
  }

  absl::Status Ready(const std::string& id, uint64_t round, Directives* out) {
    v1::ReportReadyRequest request;
    request.set_worker_id(id);
    request.set_round(round);
    request.set_total_elements(kTotal);
    request.set_train_loss(0.5);
    const absl::Status s = engine_->ReportReady(request, out);
    ExpectConsistent();
    return s;
  }

  Directives ReadyOk(const std::string& id, uint64_t round) {
    Directives out;
    const absl::Status s = Ready(id, round, &out);
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }

  absl::Status Connected(const std::string& id, uint64_t round, uint32_t attempt,
                         const std::vector<std::string>& unreachable, Directives* out) {
    v1::ConnectionsReadyRequest request;
    request.set_worker_id(id);
    request.set_round(round);
    request.set_attempt(attempt);
    for (const std::string& u : unreachable) request.add_unreachable(u);
    const absl::Status s = engine_->ConnectionsReady(request, out);
    ExpectConsistent();
    return s;
  }

  Directives ConnectedOk(const std::string& id, uint64_t round, uint32_t attempt,
                         const std::vector<std::string>& unreachable = {}) {
    Directives out;
    const absl::Status s = Connected(id, round, attempt, unreachable, &out);
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }

  // Every participant passes the connection barrier of the current attempt;
  // returns the directives of the last report.
  Directives AllConnected(uint64_t round) {
    const RunStatus status = engine_->Status();
    Directives last;
    for (const std::string& id : status.participants()) {
      last = ConnectedOk(id, round, status.attempt());
    }
    return last;
  }

  // Every id reports ready; returns the directives of the last report.
  Directives AllReadyNoBarrier(const std::vector<std::string>& ids, uint64_t round) {
    Directives last;
    for (const std::string& id : ids) last = ReadyOk(id, round);
    return last;
  }

  // Every id reports ready, then every participant passes the barrier.
  void AllReady(const std::vector<std::string>& ids, uint64_t round) {
    AllReadyNoBarrier(ids, round);
    EXPECT_EQ(engine_->Status().phase(), v1::SHARING);
    EXPECT_THAT(To(AllConnected(round), kStartSharing), ::testing::Not(IsEmpty()));
  }

  absl::Status Done(const std::string& id, uint64_t round, const std::string& hash,
                    Directives* out) {
    v1::ReportRoundDoneRequest request;
    request.set_worker_id(id);
    request.set_round(round);
    request.set_model_hash(hash);
    const absl::Status s = engine_->ReportRoundDone(request, out);
    ExpectConsistent();
    return s;
  }

  Directives DoneOk(const std::string& id, uint64_t round, const std::string& hash) {
    Directives out;
    const absl::Status s = Done(id, round, hash, &out);
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }

  Directives AllDone(const std::vector<std::string>& ids, uint64_t round, const std::string& hash) {
    Directives last;
    for (const std::string& id : ids) last = DoneOk(id, round, hash);
    return last;
  }

  // Ready, barrier and done for `round`; returns the last done's directives.
  Directives RunRound(const std::vector<std::string>& ids, uint64_t round,
                      const std::string& hash) {
    AllReady(ids, round);
    return AllDone(ids, round, hash);
  }

  // Members at ports 9001.. all join round 1 (min_participants <= n).
  std::vector<std::string> StartRoundOne(int n) {
    std::vector<std::string> ids;
    for (int i = 0; i < n; ++i) ids.push_back(AddMember(9001 + i));
    for (const std::string& id : ids) JoinRoundOk(id, 1, 1);
    EXPECT_EQ(engine_->Status().phase(), v1::TRAINING);
    EXPECT_THAT(Participants(engine_->Status()), ::testing::ElementsAreArray(ids));
    return ids;
  }

  // Advances the clock by `d` in steps of at most 5 s; after each step every
  // id in `alive` heartbeats and Tick runs. Returns every Tick directive.
  Directives Pass(absl::Duration d, const std::vector<std::string>& alive) {
    Directives all;
    while (d > absl::ZeroDuration()) {
      const absl::Duration step = std::min(d, absl::Seconds(5));
      clock_.Advance(step);
      d -= step;
      for (const std::string& id : alive) (void)engine_->Heartbeat(id);
      for (Directive& x : engine_->Tick()) all.push_back(std::move(x));
      ExpectConsistent();
    }
    return all;
  }

  static v1::RunRecord Record(uint64_t last_completed, const std::string& hash,
                              uint64_t next_worker_number) {
    v1::RunRecord r;
    r.set_run_id("run-m");
    r.mutable_config()->mutable_model()->set_name("mlp");
    r.set_last_completed_round(last_completed);
    r.set_model_hash(hash);
    r.set_next_worker_number(next_worker_number);
    return r;
  }

  FakeClock clock_;
  std::unique_ptr<RoundEngine> engine_;
};

// ---------------------------------------------------------------- Join windows

TEST_F(MembershipTest, JoinWindowIsTheRunningRoundUntilTheFirstReady) {
  Start();
  const std::vector<std::string> ids = StartRoundOne(2);

  // Before anyone is ready a newcomer takes part in the running round.
  const v1::JoinResponse j3 = AddMemberResponse(9003);
  EXPECT_EQ(j3.next_round(), 1u);
  const Directives in = JoinRoundOk(j3.worker_id(), 1, 1);
  EXPECT_THAT(To(in, kStart), ElementsAre(j3.worker_id()));
  EXPECT_EQ(MessageFor(in, j3.worker_id(), kStart).round_start().round(), 1u);

  // After the first ready report the window is closed: next round.
  ReadyOk(ids[0], 1);
  const v1::JoinResponse j4 = AddMemberResponse(9004);
  EXPECT_EQ(j4.next_round(), 2u);
  EXPECT_THAT(JoinRoundOk(j4.worker_id(), 1, 2), IsEmpty());
  RunStatus status = engine_->Status();
  EXPECT_THAT(Participants(status), ElementsAre(ids[0], ids[1], j3.worker_id()));
  EXPECT_EQ(status.queued(), 1u);
  EXPECT_EQ(FindWorker(status, j4.worker_id())->state(), "waiting");

  // Also closed while sharing.
  AllReady({ids[1], j3.worker_id()}, 1);
  const v1::JoinResponse j5 = AddMemberResponse(9005);
  EXPECT_EQ(j5.next_round(), 2u);
  EXPECT_THAT(JoinRoundOk(j5.worker_id(), 2, 2), IsEmpty());
  EXPECT_EQ(engine_->Status().queued(), 2u);

  const Directives done = AllDone({ids[0], ids[1], j3.worker_id()}, 1, Hash('a'));
  EXPECT_THAT(To(done, kComplete), ElementsAre(ids[0], ids[1], j3.worker_id()));
  EXPECT_THAT(To(done, kStart),
              ElementsAre(ids[0], ids[1], j3.worker_id(), j4.worker_id(), j5.worker_id()));
  status = engine_->Status();
  EXPECT_EQ(status.round(), 2u);
  EXPECT_EQ(status.queued(), 0u);
  EXPECT_EQ(status.participants_size(), 5);
}

TEST_F(MembershipTest, RoundCanHaveMoreThanMinParticipants) {
  Start({.min_participants = 2});
  const std::vector<std::string> ids = StartRoundOne(2);  // starts with two
  const std::string w3 = AddMember(9003);
  const std::string w4 = AddMember(9004);
  JoinRoundOk(w3, 1, 1);
  JoinRoundOk(w4, 1, 1);
  const std::vector<std::string> all = {ids[0], ids[1], w3, w4};
  EXPECT_THAT(Participants(engine_->Status()), ::testing::ElementsAreArray(all));

  const Directives plan = AllReadyNoBarrier(all, 1);
  EXPECT_THAT(To(plan, kPlan), ::testing::ElementsAreArray(all));
  EXPECT_EQ(MessageFor(plan, w4, kPlan).round_plan().slices_size(), 4);
  AllConnected(1);
  const Directives done = AllDone(all, 1, Hash('a'));
  EXPECT_THAT(To(done, kComplete), ::testing::ElementsAreArray(all));
  EXPECT_THAT(To(done, kStart), ::testing::ElementsAreArray(all));
  EXPECT_EQ(engine_->Status().recent_rounds(0).participants(), 4u);
}

TEST_F(MembershipTest, PlansCarryTheParticipantListOnlyToSessionsThatLackIt) {
  Start({.min_participants = 2});
  const std::vector<std::string> ids = StartRoundOne(2);
  const Directives p1 = AllReadyNoBarrier(ids, 1);
  const uint64_t v1 = MessageFor(p1, ids[0], kPlan).round_plan().participants_version();
  EXPECT_NE(v1, 0u);
  for (const std::string& id : ids) {
    const v1::RoundPlan plan = MessageFor(p1, id, kPlan).round_plan();
    EXPECT_EQ(plan.slices_size(), 2) << id;
    EXPECT_EQ(plan.participants_version(), v1) << id;
  }
  AllConnected(1);
  AllDone(ids, 1, Hash('a'));

  // Same list: the plan carries its version, not the list.
  const Directives p2 = AllReadyNoBarrier(ids, 2);
  for (const std::string& id : ids) {
    const v1::RoundPlan plan = MessageFor(p2, id, kPlan).round_plan();
    EXPECT_EQ(plan.slices_size(), 0) << id;
    EXPECT_EQ(plan.participants_version(), v1) << id;
    EXPECT_EQ(plan.total_elements(), kTotal);
    EXPECT_EQ(plan.round(), 2u);
    EXPECT_EQ(plan.attempt(), 1u);
  }
  AllConnected(2);
  AllDone(ids, 2, Hash('b'));

  // A new session (the worker process may be new): it alone gets the list.
  ASSERT_TRUE(engine_->Connect(ids[1]).ok());
  const Directives p3 = AllReadyNoBarrier(ids, 3);
  EXPECT_EQ(MessageFor(p3, ids[0], kPlan).round_plan().slices_size(), 0);
  EXPECT_EQ(MessageFor(p3, ids[1], kPlan).round_plan().slices_size(), 2);
  EXPECT_EQ(MessageFor(p3, ids[1], kPlan).round_plan().participants_version(), v1);
  AllConnected(3);
  AllDone(ids, 3, Hash('c'));

  // A joiner changes the list: a new version, with the list, for everyone.
  const std::string w3 = AddMember(9003);
  JoinRoundOk(w3, 4, 4);
  const std::vector<std::string> all = {ids[0], ids[1], w3};
  const Directives p4 = AllReadyNoBarrier(all, 4);
  for (const std::string& id : all) {
    const v1::RoundPlan plan = MessageFor(p4, id, kPlan).round_plan();
    EXPECT_EQ(plan.slices_size(), 3) << id;
    EXPECT_GT(plan.participants_version(), v1) << id;
  }
  // A lost participant changes it again: the re-plan carries the new list.
  const uint64_t v2 = MessageFor(p4, w3, kPlan).round_plan().participants_version();
  const Directives replan = engine_->Disconnect(w3, "crashed");
  for (const std::string& id : ids) {
    const v1::RoundPlan plan = MessageFor(replan, id, kPlan).round_plan();
    EXPECT_EQ(plan.attempt(), 2u);
    EXPECT_EQ(plan.slices_size(), 2) << id;
    EXPECT_GT(plan.participants_version(), v2) << id;
  }
}

TEST_F(MembershipTest, ParticipantListVersionsOfTwoCoordinatorStartsDiffer) {
  Start({.min_participants = 1});
  const std::vector<std::string> a = StartRoundOne(1);
  const uint64_t first =
      MessageFor(AllReadyNoBarrier(a, 1), a[0], kPlan).round_plan().participants_version();
  clock_.Advance(absl::Seconds(1));
  Start({.min_participants = 1});  // a restarted coordinator
  const std::vector<std::string> b = StartRoundOne(1);
  const uint64_t second =
      MessageFor(AllReadyNoBarrier(b, 1), b[0], kPlan).round_plan().participants_version();
  EXPECT_NE(first, second);
}

// ---------------------------------------------------------------- Minimum

TEST_F(MembershipTest, BelowMinimumWaitsForMembersAndResumes) {
  Start({.min_participants = 3});
  const std::vector<std::string> ids = StartRoundOne(3);
  RunRound(ids, 1, Hash('a'));
  ASSERT_EQ(engine_->Status().phase(), v1::TRAINING);

  // A started round goes on below the minimum...
  EXPECT_THAT(engine_->Disconnect(ids[2], "stopped"), IsEmpty());
  RunStatus status = engine_->Status();
  EXPECT_EQ(status.phase(), v1::TRAINING);
  EXPECT_THAT(Participants(status), ElementsAre(ids[0], ids[1]));
  const Directives done = RunRound({ids[0], ids[1]}, 2, Hash('b'));
  EXPECT_THAT(To(done, kComplete), ElementsAre(ids[0], ids[1]));
  EXPECT_THAT(To(done, kStart), IsEmpty());

  // ...but the next one waits for enough members.
  status = engine_->Status();
  EXPECT_EQ(status.phase(), v1::WAITING_FOR_MEMBERS);
  EXPECT_EQ(status.round(), 3u);
  EXPECT_EQ(status.last_completed_round(), 2u);
  EXPECT_EQ(status.queued(), 2u);
  EXPECT_THAT(status.detail(), HasSubstr("2 of 3 participants needed for round 3"));
  EXPECT_THAT(status.detail(), HasSubstr("(2 members joined"));

  // A member joining without asking for a round counts as a member only.
  const v1::JoinResponse j4 = AddMemberResponse(9004);
  EXPECT_EQ(j4.next_round(), 3u);
  EXPECT_THAT(engine_->Status().detail(), HasSubstr("(3 members joined"));
  EXPECT_EQ(engine_->Status().phase(), v1::WAITING_FOR_MEMBERS);

  const Directives start = JoinRoundOk(j4.worker_id(), 3, 3);
  EXPECT_THAT(To(start, kStart), ElementsAre(ids[0], ids[1], j4.worker_id()));
  EXPECT_EQ(MessageFor(start, j4.worker_id(), kStart).round_start().round(), 3u);
  EXPECT_EQ(MessageFor(start, j4.worker_id(), kStart).round_start().base_model_round(), 2u);
  EXPECT_EQ(MessageFor(start, j4.worker_id(), kStart).round_start().base_model_hash(), Hash('b'));
  EXPECT_EQ(engine_->Status().phase(), v1::TRAINING);
}

// ---------------------------------------------------------------- Barrier

TEST_F(MembershipTest, SharingStartsOnlyWhenEveryParticipantIsConnected) {
  Start({.min_participants = 3});
  const std::vector<std::string> ids = StartRoundOne(3);
  const Directives plan = AllReadyNoBarrier(ids, 1);
  EXPECT_THAT(To(plan, kPlan), ElementsAre(ids[0], ids[1], ids[2]));
  EXPECT_EQ(MessageFor(plan, ids[0], kPlan).round_plan().attempt(), 1u);
  RunStatus status = engine_->Status();
  EXPECT_EQ(status.phase(), v1::SHARING);
  EXPECT_EQ(status.attempt(), 1u);
  EXPECT_THAT(status.detail(), HasSubstr("connecting: 0/3"));

  EXPECT_THAT(ConnectedOk(ids[0], 1, 1), IsEmpty());
  EXPECT_THAT(ConnectedOk(ids[1], 1, 1), IsEmpty());
  EXPECT_THAT(ConnectedOk(ids[0], 1, 1), IsEmpty());  // repeated
  EXPECT_THAT(engine_->Status().detail(), HasSubstr("connecting: 2/3"));
  // No exchange, so no done report, before the barrier.
  Directives out;
  EXPECT_EQ(Done(ids[0], 1, Hash('a'), &out).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(out, IsEmpty());

  const Directives start = ConnectedOk(ids[2], 1, 1);
  EXPECT_THAT(To(start, kStartSharing), ElementsAre(ids[0], ids[1], ids[2]));
  EXPECT_EQ(start.size(), 3u);
  for (const std::string& id : ids) {
    EXPECT_EQ(MessageFor(start, id, kStartSharing).start_sharing().round(), 1u);
    EXPECT_EQ(MessageFor(start, id, kStartSharing).start_sharing().attempt(), 1u);
  }
  EXPECT_THAT(engine_->Status().detail(), HasSubstr("0/3 participants done sharing"));
  // A retried report after the start changes nothing.
  EXPECT_THAT(ConnectedOk(ids[1], 1, 1), IsEmpty());
  const Directives done = AllDone(ids, 1, Hash('a'));
  EXPECT_THAT(To(done, kComplete), ElementsAre(ids[0], ids[1], ids[2]));
}

TEST_F(MembershipTest, ConnectionsReadyForStaleAttemptIsFailedPrecondition) {
  Start();
  const std::vector<std::string> ids = StartRoundOne(3);
  Directives out;
  // Not sharing yet: there is no attempt to report for.
  EXPECT_EQ(Connected(ids[0], 1, 1, {}, &out).code(), absl::StatusCode::kFailedPrecondition);
  AllReadyNoBarrier(ids, 1);
  // Losing ids[2] makes attempt 2 the current plan.
  EXPECT_THAT(To(engine_->Disconnect(ids[2], "gone"), kPlan), ElementsAre(ids[0], ids[1]));
  ASSERT_EQ(engine_->Status().attempt(), 2u);

  const absl::Status stale = Connected(ids[0], 1, 1, {}, &out);
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(stale.message(), HasSubstr("attempt"));
  EXPECT_EQ(Connected(ids[0], 1, 3, {}, &out).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Connected(ids[0], 2, 2, {}, &out).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Connected(ids[0], 0, 2, {}, &out).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Connected(ids[2], 1, 2, {}, &out).code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(out, IsEmpty());
  EXPECT_THAT(engine_->Status().detail(), HasSubstr("connecting: 0/2"));

  EXPECT_THAT(ConnectedOk(ids[0], 1, 2), IsEmpty());
  EXPECT_THAT(To(ConnectedOk(ids[1], 1, 2), kStartSharing), ElementsAre(ids[0], ids[1]));
}

TEST_F(MembershipTest, UnreachableNonParticipantIsInvalidArgument) {
  Start();
  const std::vector<std::string> ids = StartRoundOne(2);
  ReadyOk(ids[0], 1);
  const std::string w3 = AddMember(9003);  // a member, queued for round 2
  JoinRoundOk(w3, 1, 2);
  ReadyOk(ids[1], 1);

  Directives out;
  EXPECT_EQ(Connected(ids[0], 1, 1, {"w99"}, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Connected(ids[0], 1, 1, {w3}, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Connected(ids[0], 1, 1, {ids[1], ""}, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out, IsEmpty());
  // The rejected report did not count: ids[1] alone does not pass the barrier.
  EXPECT_THAT(ConnectedOk(ids[1], 1, 1), IsEmpty());
  EXPECT_THAT(engine_->Status().detail(), HasSubstr("connecting: 1/2"));
  EXPECT_THAT(To(ConnectedOk(ids[0], 1, 1), kStartSharing), ElementsAre(ids[0], ids[1]));
}

// ---------------------------------------------------------------- Retries

TEST_F(MembershipTest, ConnectionTimeoutRetriesThenEvictsTheFailingPeer) {
  Start({.min_participants = 3, .connection_timeout = absl::Seconds(5), .max_connection_retry = 2});
  const std::vector<std::string> ids = StartRoundOne(3);
  AllReadyNoBarrier(ids, 1);
  ConnectedOk(ids[0], 1, 1);
  ConnectedOk(ids[1], 1, 1);  // ids[2] never reports

  EXPECT_THAT(Pass(absl::Milliseconds(4999), ids), IsEmpty());
  for (uint32_t retry = 1; retry <= 2; ++retry) {
    // Retry 1 at the plan's deadline, retry 2 one connection_timeout later.
    const Directives out = Pass(retry == 1 ? absl::Milliseconds(1) : absl::Seconds(5), ids);
    EXPECT_THAT(To(out, kRetry), ElementsAre(ids[0], ids[1], ids[2])) << "retry " << retry;
    for (const std::string& id : ids) {
      const v1::RetryPeerConnections r = MessageFor(out, id, kRetry).retry_connections();
      EXPECT_EQ(r.round(), 1u);
      EXPECT_EQ(r.attempt(), 1u);
      EXPECT_EQ(r.retry(), retry);
      EXPECT_THAT(Strings(r.failing()), ElementsAre(ids[2]));
    }
    const RunStatus status = engine_->Status();
    EXPECT_EQ(status.connection_retries(), retry);
    EXPECT_EQ(status.attempt(), 1u);
    EXPECT_THAT(status.detail(), HasSubstr(absl::StrCat("retry ", retry, "/2")));
    // After a retry everyone reports again.
    EXPECT_THAT(status.detail(), HasSubstr("connecting: 0/3"));
    EXPECT_EQ(status.members(), 3u);
    ConnectedOk(ids[0], 1, 1);
    ConnectedOk(ids[1], 1, 1);
  }

  // Out of retries: ids[2] fails, the other two get a new plan.
  const Directives out = Pass(absl::Seconds(5), ids);
  EXPECT_THAT(To(out, kConnFail), ElementsAre(ids[2]));
  EXPECT_EQ(MessageFor(out, ids[2], kConnFail).connection_fail().round(), 1u);
  EXPECT_THAT(MessageFor(out, ids[2], kConnFail).connection_fail().reason(), HasSubstr("connect"));
  EXPECT_THAT(To(out, kPlan), ElementsAre(ids[0], ids[1]));
  EXPECT_THAT(To(out, kRetry), IsEmpty());
  const v1::RoundPlan plan = MessageFor(out, ids[0], kPlan).round_plan();
  EXPECT_EQ(plan.round(), 1u);
  EXPECT_EQ(plan.attempt(), 2u);
  ASSERT_EQ(plan.slices_size(), 2);
  EXPECT_EQ(plan.slices(1).end(), kTotal);

  RunStatus status = engine_->Status();
  EXPECT_EQ(status.members(), 2u);
  EXPECT_EQ(status.attempt(), 2u);
  EXPECT_THAT(Participants(status), ElementsAre(ids[0], ids[1]));
  const WorkerStatus failed = *FindWorker(status, ids[2]);
  EXPECT_EQ(failed.state(), "evicted");
  EXPECT_THAT(failed.reason(), HasSubstr("connect"));
  EXPECT_EQ(engine_->Heartbeat(ids[2]).code(), absl::StatusCode::kNotFound);

  EXPECT_THAT(To(AllConnected(1), kStartSharing), ElementsAre(ids[0], ids[1]));
  const Directives done = AllDone({ids[0], ids[1]}, 1, Hash('a'));
  EXPECT_THAT(To(done, kComplete), ElementsAre(ids[0], ids[1]));
  EXPECT_EQ(engine_->last_completed_round(), 1u);
}

TEST_F(MembershipTest, UnreachableReportRetriesWithoutWaitingForTheDeadline) {
  Start({.connection_timeout = absl::Seconds(5), .max_connection_retry = 1});
  const std::vector<std::string> ids = StartRoundOne(2);
  AllReadyNoBarrier(ids, 1);
  EXPECT_THAT(ConnectedOk(ids[0], 1, 1, {ids[1]}), IsEmpty());
  // Everyone reported and someone named a peer: retry at once.
  const Directives retry = ConnectedOk(ids[1], 1, 1, {ids[0]});
  EXPECT_THAT(To(retry, kRetry), ElementsAre(ids[0], ids[1]));
  EXPECT_THAT(To(retry, kStartSharing), IsEmpty());
  EXPECT_EQ(MessageFor(retry, ids[0], kRetry).retry_connections().retry(), 1u);
  EXPECT_EQ(engine_->Status().connection_retries(), 1u);
  // This time they reach each other.
  ConnectedOk(ids[0], 1, 1);
  EXPECT_THAT(To(ConnectedOk(ids[1], 1, 1), kStartSharing), ElementsAre(ids[0], ids[1]));
}

// One worker that reaches nobody (and that nobody reaches) among three is
// the one that fails, not the peers it names.
TEST_F(MembershipTest, StrictMajorityDecidesWhichPeerFails) {
  Start({.min_participants = 3, .max_connection_retry = 1});
  const std::vector<std::string> ids = StartRoundOne(3);
  AllReadyNoBarrier(ids, 1);
  ConnectedOk(ids[0], 1, 1, {ids[2]});
  ConnectedOk(ids[1], 1, 1, {ids[2]});
  Directives out = ConnectedOk(ids[2], 1, 1, {ids[0], ids[1]});
  EXPECT_THAT(To(out, kRetry), ElementsAre(ids[0], ids[1], ids[2]));
  EXPECT_THAT(Strings(MessageFor(out, ids[0], kRetry).retry_connections().failing()),
              ElementsAre(ids[2]));

  ConnectedOk(ids[0], 1, 1, {ids[2]});
  ConnectedOk(ids[1], 1, 1, {ids[2]});
  out = ConnectedOk(ids[2], 1, 1, {ids[0], ids[1]});
  EXPECT_THAT(To(out, kConnFail), ElementsAre(ids[2]));
  EXPECT_THAT(To(out, kPlan), ElementsAre(ids[0], ids[1]));
  EXPECT_EQ(MessageFor(out, ids[0], kPlan).round_plan().attempt(), 2u);
  const RunStatus status = engine_->Status();
  EXPECT_EQ(FindWorker(status, ids[2])->state(), "evicted");
  EXPECT_EQ(FindWorker(status, ids[0])->state(), "sharing");
  EXPECT_EQ(FindWorker(status, ids[1])->state(), "sharing");
}

// The same, when only the isolated worker notices: the two peers it names
// reach everyone, so it alone must be blamed.
TEST_F(MembershipTest, WorkerThatReachesNobodyDoesNotDragDownItsPeers) {
  Start({.min_participants = 3, .max_connection_retry = 1});
  const std::vector<std::string> ids = StartRoundOne(3);
  AllReadyNoBarrier(ids, 1);
  ConnectedOk(ids[0], 1, 1);
  ConnectedOk(ids[1], 1, 1);
  Directives out = ConnectedOk(ids[2], 1, 1, {ids[0], ids[1]});
  // Nobody is named by a majority: the worker that reaches nobody is blamed.
  EXPECT_THAT(To(out, kRetry), ElementsAre(ids[0], ids[1], ids[2]));
  EXPECT_THAT(Strings(MessageFor(out, ids[0], kRetry).retry_connections().failing()),
              ElementsAre(ids[2]));

  ConnectedOk(ids[0], 1, 1);
  ConnectedOk(ids[1], 1, 1);
  out = ConnectedOk(ids[2], 1, 1, {ids[0], ids[1]});
  EXPECT_THAT(To(out, kConnFail), ElementsAre(ids[2]));
  EXPECT_THAT(To(out, kPlan), ElementsAre(ids[0], ids[1]));
  const RunStatus status = engine_->Status();
  EXPECT_EQ(FindWorker(status, ids[0])->state(), "sharing");
  EXPECT_EQ(FindWorker(status, ids[1])->state(), "sharing");
}

// ---------------------------------------------------------------- Leases

TEST_F(MembershipTest, LeaseExpiryWhileTrainingLetsTheRoundGoOn) {
  Start({.min_participants = 3});
  const std::vector<std::string> ids = StartRoundOne(3);
  ReadyOk(ids[0], 1);
  EXPECT_THAT(Pass(absl::Seconds(10), {ids[0], ids[1]}), IsEmpty());
  const Directives out = Pass(absl::Seconds(1), {ids[0], ids[1]});
  EXPECT_THAT(out, IsEmpty());
  RunStatus status = engine_->Status();
  EXPECT_EQ(FindWorker(status, ids[2])->state(), "lost");  // its lease expired
  EXPECT_THAT(FindWorker(status, ids[2])->reason(), HasSubstr("heartbeat"));
  EXPECT_EQ(status.phase(), v1::TRAINING);
  EXPECT_THAT(Participants(status), ElementsAre(ids[0], ids[1]));

  const Directives plan = ReadyOk(ids[1], 1);
  EXPECT_THAT(To(plan, kPlan), ElementsAre(ids[0], ids[1]));
  EXPECT_EQ(MessageFor(plan, ids[0], kPlan).round_plan().attempt(), 1u);
  EXPECT_EQ(MessageFor(plan, ids[0], kPlan).round_plan().slices_size(), 2);
}

TEST_F(MembershipTest, LeaseExpiryWhileConnectingReplans) {
  // A long connection timeout, so that only the lease matters.
  Start({.min_participants = 3, .connection_timeout = absl::Seconds(60)});
  const std::vector<std::string> ids = StartRoundOne(3);
  AllReadyNoBarrier(ids, 1);
  ConnectedOk(ids[0], 1, 1);
  const Directives out = Pass(absl::Seconds(15), {ids[0], ids[1]});
  EXPECT_THAT(To(out, kPlan), ElementsAre(ids[0], ids[1]));
  EXPECT_THAT(To(out, kRetry), IsEmpty());
  EXPECT_THAT(To(out, kAborted), IsEmpty());
  const v1::RoundPlan plan = MessageFor(out, ids[1], kPlan).round_plan();
  EXPECT_EQ(plan.round(), 1u);
  EXPECT_EQ(plan.attempt(), 2u);
  EXPECT_EQ(plan.slices_size(), 2);
  RunStatus status = engine_->Status();
  EXPECT_EQ(FindWorker(status, ids[2])->state(), "lost");  // its lease expired
  EXPECT_EQ(status.attempt(), 2u);
  // The report for attempt 1 does not carry over.
  EXPECT_THAT(status.detail(), HasSubstr("connecting: 0/2"));

  AllConnected(1);
  EXPECT_THAT(To(AllDone({ids[0], ids[1]}, 1, Hash('a')), kComplete), ElementsAre(ids[0], ids[1]));
}

TEST_F(MembershipTest, LeaseExpiryWhileExchangingReplansWithNextAttempt) {
  Start({.min_participants = 3});
  const std::vector<std::string> ids = StartRoundOne(3);
  AllReady(ids, 1);
  DoneOk(ids[0], 1, Hash('a'));
  const Directives out = Pass(absl::Seconds(15), {ids[0], ids[1]});
  EXPECT_THAT(To(out, kPlan), ElementsAre(ids[0], ids[1]));
  EXPECT_EQ(MessageFor(out, ids[0], kPlan).round_plan().attempt(), 2u);
  EXPECT_THAT(To(out, kAborted), IsEmpty());
  EXPECT_EQ(FindWorker(engine_->Status(), ids[2])->state(), "lost");  // its lease expired

  // Attempt 2 passes its own barrier; the attempt-1 done report is void.
  AllConnected(1);
  EXPECT_THAT(DoneOk(ids[1], 1, Hash('b')), IsEmpty());
  EXPECT_THAT(To(DoneOk(ids[0], 1, Hash('b')), kComplete), ElementsAre(ids[0], ids[1]));
  EXPECT_EQ(engine_->Status().model_hash(), Hash('b'));
}

TEST_F(MembershipTest, DoneReportOfASupersededAttemptIsFailedPrecondition) {
  Start({.min_participants = 2});
  const std::vector<std::string> ids = StartRoundOne(3);
  AllReady(ids, 1);
  engine_->Disconnect(ids[2], "crashed");  // attempt 2 among ids[0], ids[1]
  AllConnected(1);
  ASSERT_EQ(engine_->Status().attempt(), 2u);
  // ids[0] finished attempt 1 before it heard of attempt 2.
  v1::ReportRoundDoneRequest late;
  late.set_worker_id(ids[0]);
  late.set_round(1);
  late.set_attempt(1);
  late.set_model_hash(Hash('e'));
  Directives out;
  const absl::Status s = engine_->ReportRoundDone(late, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("attempt 1 is not current"));
  EXPECT_THAT(out, IsEmpty());
  // The report of attempt 2 counts; the refused one left nothing behind.
  late.set_attempt(2);
  late.set_model_hash(Hash('b'));
  ASSERT_TRUE(engine_->ReportRoundDone(late, &out).ok());
  EXPECT_THAT(To(DoneOk(ids[1], 1, Hash('b')), kComplete), ElementsAre(ids[0], ids[1]));
}

TEST_F(MembershipTest, ReplanThenAbortRollsBackTheEarlierDoneReport) {
  Start({.min_participants = 2});
  const std::vector<std::string> ids = StartRoundOne(3);
  RunRound(ids, 1, Hash('a'));
  // Round 2: ids[0] finishes attempt 1, then ids[2] is lost.
  AllReady(ids, 2);
  DoneOk(ids[0], 2, Hash('e'));
  engine_->Disconnect(ids[2], "crashed");
  AllConnected(2);
  // Nobody finishes attempt 2: the round is aborted and everyone rolls back
  // to round 1's model, so both survivors hold the base of the restart.
  const Directives out = Pass(absl::Seconds(60), {ids[0], ids[1]});
  EXPECT_THAT(To(out, kAborted), ElementsAre(ids[0], ids[1]));
  EXPECT_THAT(To(out, kStart), ElementsAre(ids[0], ids[1]));
  const RunStatus status = engine_->Status();
  // The done report of the voided attempt was rolled back at the re-plan.
  EXPECT_EQ(FindWorker(status, ids[0])->model_round(), 1u);
  EXPECT_EQ(FindWorker(status, ids[0])->model_hash(), Hash('a'));
  EXPECT_EQ(FindWorker(status, ids[1])->model_round(), 1u);
  // Both count as holders of the base: no holder list, no catch-up.
  EXPECT_THAT(MessageFor(out, ids[0], kStart).round_start().holders(), IsEmpty());
  EXPECT_THAT(MessageFor(out, ids[1], kStart).round_start().holders(), IsEmpty());
}

// ---------------------------------------------------------------- Deadlines

TEST_F(MembershipTest, StragglerMissesTheRoundAndTakesPartInTheNext) {
  Start({.min_participants = 2, .round_timeout = absl::Seconds(60)});
  const std::vector<std::string> ids = StartRoundOne(3);
  ReadyOk(ids[0], 1);
  ReadyOk(ids[1], 1);
  EXPECT_THAT(Pass(absl::Seconds(59), ids), IsEmpty());

  const Directives out = Pass(absl::Seconds(1), ids);
  EXPECT_THAT(To(out, kMissed), ElementsAre(ids[2]));
  const v1::RoundMissed missed = MessageFor(out, ids[2], kMissed).round_missed();
  EXPECT_EQ(missed.round(), 1u);
  EXPECT_THAT(missed.reason(), HasSubstr("round_timeout"));
  EXPECT_THAT(To(out, kPlan), ElementsAre(ids[0], ids[1]));
  EXPECT_EQ(MessageFor(out, ids[0], kPlan).round_plan().slices_size(), 2);

  RunStatus status = engine_->Status();
  EXPECT_THAT(Participants(status), ElementsAre(ids[0], ids[1]));
  EXPECT_EQ(status.queued(), 1u);
  const WorkerStatus late = *FindWorker(status, ids[2]);
  EXPECT_EQ(late.state(), "waiting");
  EXPECT_EQ(late.rounds_missed(), 1u);
  EXPECT_THAT(late.missed_reason(), HasSubstr("round 1"));
  EXPECT_THAT(late.missed_reason(), HasSubstr("round_timeout"));

  // Its late ready report is refused, and it stays queued.
  Directives ignored;
  const absl::Status s = Ready(ids[2], 1, &ignored);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("round 1"));
  EXPECT_THAT(ignored, IsEmpty());
  EXPECT_THAT(JoinRoundOk(ids[2], 2, 2), IsEmpty());

  AllConnected(1);
  const Directives done = AllDone({ids[0], ids[1]}, 1, Hash('a'));
  EXPECT_THAT(To(done, kComplete), ElementsAre(ids[0], ids[1]));
  EXPECT_THAT(To(done, kStart), ElementsAre(ids[0], ids[1], ids[2]));
  EXPECT_THAT(Participants(engine_->Status()), ElementsAre(ids[0], ids[1], ids[2]));

  // Completing round 2 clears its count.
  RunRound(ids, 2, Hash('b'));
  status = engine_->Status();
  EXPECT_EQ(FindWorker(status, ids[2])->rounds_missed(), 0u);
  EXPECT_EQ(FindWorker(status, ids[2])->rounds_completed(), 1u);
}

TEST_F(MembershipTest, NobodyReadyAtTheDeadlineKeepsWaiting) {
  Start({.min_participants = 2, .round_timeout = absl::Seconds(60)});
  const std::vector<std::string> ids = StartRoundOne(2);
  EXPECT_THAT(Pass(absl::Seconds(130), ids), IsEmpty());
  const RunStatus status = engine_->Status();
  EXPECT_EQ(status.phase(), v1::TRAINING);
  EXPECT_THAT(Participants(status), ElementsAre(ids[0], ids[1]));
  for (const std::string& id : ids) EXPECT_EQ(FindWorker(status, id)->rounds_missed(), 0u);
  ReadyOk(ids[0], 1);
  EXPECT_THAT(To(ReadyOk(ids[1], 1), kPlan), ElementsAre(ids[0], ids[1]));
}

TEST_F(MembershipTest, ExchangeDeadlineCompletesWithThoseDone) {
  Start({.min_participants = 2, .round_timeout = absl::Seconds(60)});
  const std::vector<std::string> ids = StartRoundOne(3);
  AllReady(ids, 1);
  DoneOk(ids[0], 1, Hash('a'));
  DoneOk(ids[1], 1, Hash('a'));
  EXPECT_THAT(Pass(absl::Seconds(59), ids), IsEmpty());

  const Directives out = Pass(absl::Seconds(1), ids);
  EXPECT_THAT(To(out, kMissed), ElementsAre(ids[2]));
  EXPECT_THAT(MessageFor(out, ids[2], kMissed).round_missed().reason(), HasSubstr("sharing"));
  EXPECT_THAT(To(out, kComplete), ElementsAre(ids[0], ids[1]));
  EXPECT_THAT(To(out, kStart), ElementsAre(ids[0], ids[1], ids[2]));
  const RunStatus status = engine_->Status();
  EXPECT_EQ(status.last_completed_round(), 1u);
  EXPECT_EQ(status.model_hash(), Hash('a'));
  EXPECT_EQ(status.recent_rounds(0).participants(), 2u);
  EXPECT_EQ(FindWorker(status, ids[2])->rounds_missed(), 1u);
  EXPECT_THAT(FindWorker(status, ids[2])->missed_reason(), HasSubstr("sharing"));
  // A late done report for the completed round is refused.
  Directives ignored;
  EXPECT_EQ(Done(ids[2], 1, Hash('a'), &ignored).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(MembershipTest, ExchangeDeadlineWithNobodyDoneAbortsTheRound) {
  Start({.min_participants = 2, .round_timeout = absl::Seconds(60)});
  const std::vector<std::string> ids = StartRoundOne(2);
  AllReady(ids, 1);
  const Directives out = Pass(absl::Seconds(60), ids);
  EXPECT_THAT(To(out, kAborted), ElementsAre(ids[0], ids[1]));
  EXPECT_THAT(To(out, kMissed), IsEmpty());
  EXPECT_THAT(To(out, kStart), ElementsAre(ids[0], ids[1]));
  EXPECT_EQ(MessageFor(out, ids[0], kStart).round_start().round(), 1u);
  EXPECT_EQ(engine_->Status().last_completed_round(), 0u);
}

TEST_F(MembershipTest, MissingTooManyRoundsInARowEvicts) {
  Start({.min_participants = 2, .round_timeout = absl::Seconds(60), .max_missed_rounds = 2});
  const std::vector<std::string> ids = StartRoundOne(3);
  // Round 1: ids[2] is never ready.
  ReadyOk(ids[0], 1);
  ReadyOk(ids[1], 1);
  Directives out = Pass(absl::Seconds(60), ids);
  EXPECT_THAT(To(out, kMissed), ElementsAre(ids[2]));
  EXPECT_THAT(To(out, kLeave), IsEmpty());
  AllConnected(1);
  out = AllDone({ids[0], ids[1]}, 1, Hash('a'));
  EXPECT_THAT(To(out, kStart), ElementsAre(ids[0], ids[1], ids[2]));

  // Round 2: again. The second miss in a row asks it to leave.
  ReadyOk(ids[0], 2);
  ReadyOk(ids[1], 2);
  out = Pass(absl::Seconds(60), ids);
  EXPECT_THAT(To(out, kLeave), ElementsAre(ids[2]));
  EXPECT_THAT(To(out, kMissed), IsEmpty());
  EXPECT_THAT(MessageFor(out, ids[2], kLeave).leave_requested().reason(),
              HasSubstr("2 rounds in a row"));
  EXPECT_THAT(To(out, kPlan), ElementsAre(ids[0], ids[1]));
  const RunStatus status = engine_->Status();
  EXPECT_EQ(status.members(), 2u);
  EXPECT_EQ(status.queued(), 0u);
  EXPECT_EQ(FindWorker(status, ids[2])->state(), "evicted");
  EXPECT_THAT(FindWorker(status, ids[2])->reason(), HasSubstr("missed 2 rounds"));
  EXPECT_EQ(engine_->Heartbeat(ids[2]).code(), absl::StatusCode::kNotFound);
}

// ------------------------------------------------------ Adaptive deadline

TEST_F(MembershipTest, SlowWorkerSitsOutAtTheAdaptiveDeadlineAndIsNeverEvicted) {
  Start({.min_participants = 2, .round_timeout = absl::Seconds(60), .max_missed_rounds = 2});
  const std::vector<std::string> ids = StartRoundOne(3);
  for (uint64_t r = 1; r <= 3; ++r) {
    EXPECT_THAT(Pass(absl::Seconds(3), ids), IsEmpty());
    RunRound(ids, r, Hash(static_cast<char>('0' + r)));
  }
  // Round 4: measured 3 s each, so 2 x 3 s = 6 s.
  RunStatus status = engine_->Status();
  EXPECT_EQ(status.round(), 4u);
  EXPECT_TRUE(status.ready_deadline_adaptive());
  EXPECT_DOUBLE_EQ(status.ready_deadline_seconds(), 6);
  EXPECT_THAT(status.ready_deadline_reason(), HasSubstr("2 x median ready time 3s"));
  EXPECT_DOUBLE_EQ(FindWorker(status, ids[2])->ready_seconds_median(), 3);

  // ids[2] is slow from now on; more rounds than max_missed_rounds pass.
  for (uint64_t r = 4; r <= 7; ++r) {
    EXPECT_THAT(Pass(absl::Seconds(3), ids), IsEmpty());
    ReadyOk(ids[0], r);
    ReadyOk(ids[1], r);
    EXPECT_THAT(Pass(absl::Seconds(2), ids), IsEmpty()) << r;
    const Directives out = Pass(absl::Seconds(1), ids);  // 6 s after the start
    EXPECT_THAT(To(out, kMissed), ElementsAre(ids[2])) << r;
    EXPECT_THAT(To(out, kLeave), IsEmpty()) << r;
    EXPECT_THAT(MessageFor(out, ids[2], kMissed).round_missed().reason(),
                HasSubstr("adaptive deadline"));
    EXPECT_THAT(To(out, kPlan), ElementsAre(ids[0], ids[1]));
    AllConnected(r);
    const Directives done = AllDone({ids[0], ids[1]}, r, Hash(static_cast<char>('0' + r)));
    // It is admitted to the next round again.
    EXPECT_THAT(To(done, kStart), ElementsAre(ids[0], ids[1], ids[2])) << r;
  }
  status = engine_->Status();
  const WorkerStatus slow = *FindWorker(status, ids[2]);
  EXPECT_EQ(slow.state(), "training");
  EXPECT_EQ(slow.rounds_missed(), 0u);
  EXPECT_EQ(slow.rounds_late(), 4u);
  EXPECT_THAT(slow.missed_reason(), HasSubstr("round 7: not ready within the adaptive deadline"));
  EXPECT_EQ(status.members(), 3u);
  EXPECT_EQ(status.last_completed_round(), 7u);

  // A dead slow worker still goes at once: its session breaks.
  engine_->Disconnect(ids[2], "crashed");
  status = engine_->Status();
  EXPECT_EQ(status.members(), 2u);
  EXPECT_THAT(Participants(status), ElementsAre(ids[0], ids[1]));
}

TEST_F(MembershipTest, LateWorkFoldedIntoACompletedRoundAppearsInStatus) {
  Start({.min_participants = 2, .round_timeout = absl::Seconds(60)});
  const std::vector<std::string> ids = StartRoundOne(3);
  for (uint64_t r = 1; r <= 3; ++r) {
    EXPECT_THAT(Pass(absl::Seconds(3), ids), IsEmpty());
    RunRound(ids, r, Hash(static_cast<char>('0' + r)));
  }
  // Round 4 (deadline 6 s): ids[2] is late.
  EXPECT_THAT(Pass(absl::Seconds(3), ids), IsEmpty());
  ReadyOk(ids[0], 4);
  ReadyOk(ids[1], 4);
  Directives out = Pass(absl::Seconds(3), ids);
  EXPECT_THAT(To(out, kMissed), ElementsAre(ids[2]));
  AllConnected(4);
  AllDone({ids[0], ids[1]}, 4, Hash('4'));
  EXPECT_DOUBLE_EQ(FindWorker(engine_->Status(), ids[2])->deadline_seconds(), 6);
  // Its late report of round 4 is refused as too late.
  Directives refused;
  EXPECT_EQ(Ready(ids[2], 4, &refused).code(), absl::StatusCode::kFailedPrecondition);

  // Round 5 (base 4): it folds the update trained from base 3.
  v1::ReportReadyRequest fold;
  fold.set_worker_id(ids[2]);
  fold.set_round(5);
  fold.set_total_elements(kTotal);
  fold.set_folded(true);
  fold.set_folded_base_round(3);
  fold.set_folded_trained_round(4);
  fold.set_folded_train_seconds(11.5);
  fold.set_folded_weight(0.25);  // not the rule's weight for staleness 1
  Directives ignored;
  const absl::Status wrong = engine_->ReportReady(fold, &ignored);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.message(), HasSubstr("rule's 0.5"));
  fold.set_folded_weight(0.5);
  EXPECT_TRUE(engine_->ReportReady(fold, &ignored).ok());
  // Not counted before the round completes.
  EXPECT_EQ(FindWorker(engine_->Status(), ids[2])->folded_updates(), 0u);
  // A fold says nothing of its speed: its ready time is not sampled.
  EXPECT_DOUBLE_EQ(FindWorker(engine_->Status(), ids[2])->ready_seconds_median(), 3);
  ReadyOk(ids[0], 5);
  ReadyOk(ids[1], 5);
  AllConnected(5);
  AllDone(ids, 5, Hash('5'));
  const WorkerStatus slow = *FindWorker(engine_->Status(), ids[2]);
  EXPECT_EQ(slow.folded_updates(), 1u);
  EXPECT_EQ(slow.last_fold_round(), 5u);
  EXPECT_EQ(slow.last_fold_staleness(), 1u);
  EXPECT_DOUBLE_EQ(slow.last_fold_weight(), 0.5);
  EXPECT_DOUBLE_EQ(slow.last_fold_train_seconds(), 11.5);
  EXPECT_EQ(slow.rounds_late(), 1u);
  EXPECT_EQ(FindWorker(engine_->Status(), ids[0])->folded_updates(), 0u);
}

TEST_F(MembershipTest, FoldRefusedWhenTheRunDropsLateWork) {
  Start({.min_participants = 2, .round_timeout = absl::Seconds(60), .fold_late_work = false});
  const std::vector<std::string> ids = StartRoundOne(2);
  RunRound(ids, 1, Hash('1'));
  v1::ReportReadyRequest fold;
  fold.set_worker_id(ids[0]);
  fold.set_round(2);
  fold.set_total_elements(kTotal);
  fold.set_folded(true);
  fold.set_folded_base_round(0);
  fold.set_folded_trained_round(1);
  fold.set_folded_weight(0.5);
  Directives out;
  const absl::Status s = engine_->ReportReady(fold, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("--fold_late_work=false"));
  // The server keeps serving: a normal report goes through.
  ReadyOk(ids[0], 2);
}

TEST_F(MembershipTest, StoppedWorkerMissCountsAndItsLeaseStillRemovesIt) {
  Start({.min_participants = 2, .round_timeout = absl::Seconds(60)});
  const std::vector<std::string> ids = StartRoundOne(3);
  for (uint64_t r = 1; r <= 3; ++r) {
    EXPECT_THAT(Pass(absl::Seconds(3), ids), IsEmpty());
    RunRound(ids, r, Hash(static_cast<char>('0' + r)));
  }
  // Round 4 (deadline 6 s): ids[2] is stopped and sends no heartbeats, so
  // it is not merely slow: the miss counts.
  const std::vector<std::string> running = {ids[0], ids[1]};
  EXPECT_THAT(Pass(absl::Seconds(3), running), IsEmpty());
  ReadyOk(ids[0], 4);
  ReadyOk(ids[1], 4);
  const Directives out = Pass(absl::Seconds(3), running);
  EXPECT_THAT(To(out, kMissed), ElementsAre(ids[2]));
  RunStatus status = engine_->Status();
  EXPECT_EQ(FindWorker(status, ids[2])->rounds_missed(), 1u);
  EXPECT_EQ(FindWorker(status, ids[2])->rounds_late(), 0u);
  EXPECT_EQ(status.members(), 3u);
  // Its lease still removes it.
  Pass(absl::Seconds(10), running);
  status = engine_->Status();
  EXPECT_EQ(status.members(), 2u);
  EXPECT_EQ(FindWorker(status, ids[2])->state(), "lost");  // its lease expired
}

TEST_F(MembershipTest, RetriedReadyReportIsMeasuredOnce) {
  Start({.min_participants = 2, .round_timeout = absl::Seconds(60)});
  const std::vector<std::string> ids = StartRoundOne(2);
  EXPECT_THAT(Pass(absl::Seconds(3), ids), IsEmpty());
  ReadyOk(ids[0], 1);
  EXPECT_THAT(Pass(absl::Seconds(2), ids), IsEmpty());
  ReadyOk(ids[0], 1);  // the same report again
  EXPECT_DOUBLE_EQ(FindWorker(engine_->Status(), ids[0])->ready_seconds_median(), 3);
}

TEST_F(MembershipTest, EveryoneSlowerThisRoundIsNotLeftOut) {
  Start({.min_participants = 2, .round_timeout = absl::Seconds(60)});
  const std::vector<std::string> ids = StartRoundOne(3);
  for (uint64_t r = 1; r <= 3; ++r) {
    EXPECT_THAT(Pass(absl::Seconds(1), ids), IsEmpty());
    RunRound(ids, r, Hash(static_cast<char>('0' + r)));
  }
  // Deadline 2 s (floor); nobody is ready by then: wait on.
  EXPECT_THAT(Pass(absl::Seconds(5), ids), IsEmpty());
  RunStatus status = engine_->Status();
  EXPECT_FALSE(status.ready_deadline_adaptive());
  EXPECT_DOUBLE_EQ(status.ready_deadline_seconds(), 60);
  // The first report after 5 s sets 10 s; the others make it at 9 s.
  ReadyOk(ids[0], 4);
  status = engine_->Status();
  EXPECT_TRUE(status.ready_deadline_adaptive());
  EXPECT_DOUBLE_EQ(status.ready_deadline_seconds(), 10);
  EXPECT_THAT(Pass(absl::Seconds(4), ids), IsEmpty());
  ReadyOk(ids[1], 4);
  EXPECT_THAT(To(ReadyOk(ids[2], 4), kPlan), ElementsAre(ids[0], ids[1], ids[2]));
}

TEST_F(MembershipTest, AdaptiveDeadlineOffWaitsForRoundTimeout) {
  Start({.min_participants = 2, .round_timeout = absl::Seconds(60), .adaptive_deadline = false});
  const std::vector<std::string> ids = StartRoundOne(3);
  for (uint64_t r = 1; r <= 3; ++r) RunRound(ids, r, Hash(static_cast<char>('0' + r)));
  ReadyOk(ids[0], 4);
  ReadyOk(ids[1], 4);
  EXPECT_THAT(Pass(absl::Seconds(59), ids), IsEmpty());
  const Directives out = Pass(absl::Seconds(1), ids);
  EXPECT_THAT(To(out, kMissed), ElementsAre(ids[2]));
  EXPECT_THAT(MessageFor(out, ids[2], kMissed).round_missed().reason(),
              HasSubstr("--round_timeout=1m"));
  const RunStatus status = engine_->Status();
  EXPECT_EQ(FindWorker(status, ids[2])->rounds_missed(), 1u);
  EXPECT_EQ(FindWorker(status, ids[2])->rounds_late(), 0u);
  EXPECT_THAT(status.ready_deadline_reason(), HasSubstr("adaptive deadline off"));
}

// ---------------------------------------------------------------- Holders

TEST_F(MembershipTest, HoldersAreTheMembersWithTheAgreedModel) {
  Start({.min_participants = 2});
  const std::vector<std::string> ids = StartRoundOne(2);
  AllReady(ids, 1);
  const Directives done = AllDone(ids, 1, Hash('a'));
  const v1::RoundStart start = MessageFor(done, ids[0], kStart).round_start();
  EXPECT_EQ(start.round(), 2u);
  EXPECT_EQ(start.base_model_round(), 1u);
  EXPECT_EQ(start.base_model_hash(), Hash('a'));
  // Both hold the base model: their RoundStart leaves the list out.
  EXPECT_THAT(start.holders(), IsEmpty());
  EXPECT_THAT(MessageFor(done, ids[1], kStart).round_start().holders(), IsEmpty());

  // A joiner with the initial model is no holder; it is told who holds it.
  const v1::JoinResponse j3 = AddMemberResponse(9003);
  EXPECT_EQ(j3.model_round(), 1u);
  EXPECT_EQ(j3.model_hash(), Hash('a'));
  EXPECT_THAT(Strings(j3.holders()), UnorderedElementsAre(Address(9001), Address(9002)));
  // A joiner with round 1 but another hash is no holder either.
  const v1::JoinResponse j4 = AddMemberResponse(9004, {.model_round = 1, .model_hash = Hash('f')});
  EXPECT_THAT(Strings(j4.holders()), UnorderedElementsAre(Address(9001), Address(9002)));
  // One with the agreed model is; its own response leaves it out.
  const v1::JoinResponse j5 = AddMemberResponse(9005, {.model_round = 1, .model_hash = Hash('a')});
  EXPECT_THAT(Strings(j5.holders()), UnorderedElementsAre(Address(9001), Address(9002)));

  const Directives in = JoinRoundOk(j3.worker_id(), 2, 2);
  EXPECT_THAT(Strings(MessageFor(in, j3.worker_id(), kStart).round_start().holders()),
              UnorderedElementsAre(Address(9001), Address(9002), Address(9005)));
}

TEST_F(MembershipTest, JoinResponseBeforeAnyRoundHasNoHolders) {
  Start();
  const v1::JoinResponse j1 = AddMemberResponse(9001);
  EXPECT_EQ(j1.model_round(), 0u);
  EXPECT_EQ(j1.model_hash(), "");
  EXPECT_THAT(j1.holders(), IsEmpty());
  const std::string w2 = AddMember(9002);
  JoinRoundOk(j1.worker_id(), 1, 1);
  const Directives start = JoinRoundOk(w2, 1, 1);
  EXPECT_EQ(MessageFor(start, w2, kStart).round_start().base_model_hash(), "");
  EXPECT_THAT(MessageFor(start, w2, kStart).round_start().holders(), IsEmpty());
}

// ---------------------------------------------------------------- Resume

TEST_F(MembershipTest, ResumeContinuesRoundNumberingIdsAndRanks) {
  Start({.min_participants = 2, .resume = Record(7, Hash('c'), 5)});
  RunStatus status = engine_->Status();
  EXPECT_EQ(status.phase(), v1::WAITING_FOR_MEMBERS);
  EXPECT_EQ(status.round(), 8u);
  EXPECT_EQ(status.last_completed_round(), 7u);
  EXPECT_EQ(status.model_hash(), Hash('c'));

  // Workers of the previous coordinator keep their ids and data ranks.
  const v1::JoinResponse a = AddMemberResponse(9001, {.previous_worker_id = "w2",
                                                      .model_round = 7,
                                                      .model_hash = Hash('c'),
                                                      .previous_data_rank = 1});
  EXPECT_EQ(a.worker_id(), "w2");
  EXPECT_EQ(a.data_rank(), 1u);
  EXPECT_EQ(a.next_round(), 8u);
  EXPECT_EQ(a.model_round(), 7u);
  EXPECT_EQ(a.model_hash(), Hash('c'));
  EXPECT_THAT(a.holders(), IsEmpty());  // only itself holds it
  const v1::JoinResponse b = AddMemberResponse(9002, {.previous_worker_id = "w4",
                                                      .model_round = 7,
                                                      .model_hash = Hash('c'),
                                                      .previous_data_rank = 0});
  EXPECT_EQ(b.worker_id(), "w4");
  EXPECT_EQ(b.data_rank(), 0u);
  EXPECT_THAT(Strings(b.holders()), ElementsAre(Address(9001)));
  // A taken data rank is not kept: the lowest free one is given.
  const v1::JoinResponse c =
      AddMemberResponse(9003, {.previous_worker_id = "w3", .previous_data_rank = 1});
  EXPECT_EQ(c.worker_id(), "w3");
  EXPECT_EQ(c.data_rank(), 2u);
  // New workers get ids above the record's next_worker_number.
  EXPECT_EQ(AddMember(9004), "w5");
  // An invalid previous id is not kept.
  EXPECT_EQ(AddMember(9005, {.previous_worker_id = "bogus"}), "w6");
  EXPECT_EQ(AddMember(9006, {.previous_worker_id = "w0"}), "w7");
  // A kept id above the counter moves the counter past it.
  EXPECT_EQ(AddMember(9007, {.previous_worker_id = "w9"}), "w9");
  EXPECT_EQ(AddMember(9008), "w10");
  EXPECT_EQ(engine_->Record().next_worker_number(), 11u);

  // The next round is 8, from the record's model.
  JoinRoundOk("w2", 8, 8);
  const Directives start = JoinRoundOk("w4", 8, 8);
  const v1::RoundStart rs = MessageFor(start, "w2", kStart).round_start();
  EXPECT_EQ(rs.round(), 8u);
  EXPECT_EQ(rs.base_model_round(), 7u);
  EXPECT_EQ(rs.base_model_hash(), Hash('c'));
  // Both hold that model: no holder list.
  EXPECT_THAT(rs.holders(), IsEmpty());
  EXPECT_THAT(MessageFor(start, "w4", kStart).round_start().holders(), IsEmpty());
  const Directives done = RunRound({"w2", "w4"}, 8, Hash('d'));
  EXPECT_EQ(MessageFor(done, "w2", kComplete).round_complete().round(), 8u);
  EXPECT_EQ(engine_->Record().last_completed_round(), 8u);
}

TEST_F(MembershipTest, DepartedIdIsNotReclaimedAfterResume) {
  Start({.min_participants = 2, .resume = Record(3, Hash('c'), 4)});
  EXPECT_EQ(AddMember(9001, {.previous_worker_id = "w1"}), "w1");
  engine_->Disconnect("w1", "stopped");
  EXPECT_EQ(AddMember(9002, {.previous_worker_id = "w1"}), "w4");
}

TEST_F(MembershipTest, ZoneIsCheckedKeptAndShown) {
  Start();
  const std::string w = AddMember(9001, {.zone = "eu/paris"});
  const std::string root = AddMember(9002);
  for (const char* bad : {"eu//paris", "/eu", "EU", "eu/..", "eu/paris/"}) {
    absl::StatusOr<JoinResult> joined = Join(9003, {.zone = bad});
    EXPECT_EQ(joined.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  std::map<std::string, std::string> zones;
  const v1::RunStatus status = engine_->Status();
  for (const v1::WorkerStatus& s : status.workers()) zones[s.id()] = s.zone();
  EXPECT_EQ(zones[w], "eu/paris");
  EXPECT_EQ(zones[root], "");
  EXPECT_EQ(zones.size(), 2u);
}

// The zone tree and the supernode election in status (docs/SUPERNODES.md):
// membership re-elects at the next Tick, measurements once per completed
// round with hysteresis, a lost supernode's standby takes over at once.
TEST_F(MembershipTest, ZoneTreeAndElectionInStatus) {
  Start({.min_participants = 3});
  const std::string a = AddMember(9001, {.zone = "eu/paris"});
  const std::string b = AddMember(9002, {.zone = "eu/paris"});
  const std::string c = AddMember(9003, {.zone = "us"});
  // Joins only mark the election stale: the next Tick elects.
  EXPECT_EQ(engine_->Status().zones_size(), 0);
  Pass(absl::Milliseconds(250), {a, b, c});
  RunStatus status = engine_->Status();
  ASSERT_EQ(status.zones_size(), 4) << status.DebugString();
  EXPECT_EQ(status.zones(0).path(), "");
  EXPECT_EQ(status.zones(0).supernode(), "");
  EXPECT_EQ(status.zones(0).workers(), 3u);
  EXPECT_EQ(status.zones(1).path(), "eu");
  EXPECT_EQ(status.zones(1).supernode(), a);
  EXPECT_EQ(status.zones(1).direct_members(), 0u);
  EXPECT_EQ(status.zones(2).path(), "eu/paris");
  EXPECT_EQ(status.zones(2).supernode(), a);
  EXPECT_EQ(status.zones(2).standby(), b);
  EXPECT_EQ(status.zones(2).direct_members(), 2u);
  EXPECT_EQ(status.zones(2).cause(), "first election");
  EXPECT_EQ(status.zones(2).elected_unix_ms(), absl::ToUnixMillis(clock_.Now()));
  EXPECT_EQ(status.zones(3).path(), "us");
  EXPECT_EQ(status.zones(3).supernode(), c);
  EXPECT_EQ(FindWorker(status, a)->role(), "supernode");
  EXPECT_EQ(FindWorker(status, b)->role(), "standby");
  EXPECT_EQ(FindWorker(status, c)->role(), "supernode");

  // Round 1 measures everyone alike (a stays: the first measurements
  // re-choose freely, and a ties for first); then b measures 8x a's
  // bandwidth: b takes over paris (and eu) after three more completed
  // rounds, not before.
  for (const std::string& id : {a, b, c}) JoinRoundOk(id, 1, 1);
  for (uint64_t round = 1; round <= 4; ++round) {
    AllReady({a, b, c}, round);
    for (const std::string& id : {a, b, c}) {
      v1::ReportRoundDoneRequest done;
      done.set_worker_id(id);
      done.set_round(round);
      done.set_model_hash(Hash('a'));
      done.set_step_seconds(0.01);
      done.set_bandwidth_bytes_per_second(id == b && round > 1 ? 800e6 : 100e6);
      Directives out;
      ASSERT_TRUE(engine_->ReportRoundDone(done, &out).ok());
    }
    status = engine_->Status();
    ASSERT_EQ(status.last_completed_round(), round);
    EXPECT_EQ(status.zones(2).supernode(), round < 4 ? a : b) << round;
    EXPECT_EQ(status.zones(2).challenger_rounds(), round < 4 ? round - 1 : 0u) << round;
  }
  EXPECT_EQ(status.zones(1).supernode(), b);  // eu follows paris
  EXPECT_THAT(status.zones(2).cause(), HasSubstr("beat " + a));
  EXPECT_THAT(status.zones(2).reason(), HasSubstr("the zone's median bandwidth"));
  EXPECT_EQ(FindWorker(status, b)->bandwidth_bytes_per_second(), 800e6);
  EXPECT_EQ(FindWorker(status, b)->step_seconds(), 0.01);
  EXPECT_EQ(FindWorker(status, a)->role(), "standby");

  // The supernode's session breaks: its standby takes over at once, before
  // any Tick.
  engine_->Disconnect(b, "session closed");
  status = engine_->Status();
  EXPECT_EQ(status.zones(2).supernode(), a);
  EXPECT_EQ(status.zones(2).cause(), b + " left: standby " + a + " took over");
  EXPECT_EQ(status.zones(1).supernode(), a);
  EXPECT_EQ(FindWorker(status, b)->role(), "");
  EXPECT_EQ(engine_->Election().Find("eu/paris")->supernode, a);
}

TEST_F(MembershipTest, BadMeasurementsAreRefused) {
  Start();
  const std::vector<std::string> ids = StartRoundOne(2);
  AllReady(ids, 1);
  for (double bad : {-1.0, std::nan(""), HUGE_VAL}) {
    v1::ReportRoundDoneRequest done;
    done.set_worker_id(ids[0]);
    done.set_round(1);
    done.set_model_hash(Hash('a'));
    done.set_step_seconds(bad);
    Directives out;
    EXPECT_EQ(engine_->ReportRoundDone(done, &out).code(), absl::StatusCode::kInvalidArgument);
    done.set_step_seconds(0);
    done.set_bandwidth_bytes_per_second(bad);
    const absl::Status s = engine_->ReportRoundDone(done, &out);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("bandwidth_bytes_per_second"));
  }
  // The round goes on with good reports.
  AllDone(ids, 1, Hash('a'));
  EXPECT_EQ(engine_->Status().last_completed_round(), 1u);
}

// --hierarchy=on: a round over two zones carries the stages, in the full
// plan and in the compact one that names the list by version; one zone
// stays flat.
TEST_F(MembershipTest, HierarchyTravelsWithFullAndCompactPlans) {
  Start({.min_participants = 4, .hierarchy = true});
  std::vector<std::string> ids;
  const char* zones[] = {"eu", "us", "eu", "us"};
  for (int i = 0; i < 4; ++i) ids.push_back(AddMember(9001 + i, {.zone = zones[i]}));
  for (const std::string& id : ids) JoinRoundOk(id, 1, 1);
  const Directives p1 = AllReadyNoBarrier(ids, 1);
  for (const std::string& id : ids) {
    const v1::RoundPlan plan = MessageFor(p1, id, kPlan).round_plan();
    EXPECT_EQ(plan.slices_size(), 4) << id;
    ASSERT_EQ(plan.hierarchy().stages_size(), 3) << id;
    const auto& leaf = plan.hierarchy().stages(0);
    ASSERT_EQ(leaf.groups_size(), 2);
    EXPECT_THAT(leaf.groups(0).members(), ::testing::ElementsAre(0, 2));  // eu
    EXPECT_THAT(leaf.groups(1).members(), ::testing::ElementsAre(1, 3));  // us
    EXPECT_THAT(plan.hierarchy().stages(1).groups(0).weights(), ::testing::ElementsAre(2, 2));
  }
  AllConnected(1);
  AllDone(ids, 1, Hash('a'));
  const Directives p2 = AllReadyNoBarrier(ids, 2);
  for (const std::string& id : ids) {
    const v1::RoundPlan plan = MessageFor(p2, id, kPlan).round_plan();
    EXPECT_EQ(plan.slices_size(), 0) << id;
    EXPECT_EQ(plan.hierarchy().stages_size(), 3) << id;
  }
}

TEST_F(MembershipTest, HierarchyOverOneZoneIsFlat) {
  Start({.min_participants = 2, .hierarchy = true});
  std::vector<std::string> ids = {AddMember(9001, {.zone = "eu"}), AddMember(9002, {.zone = "eu"})};
  for (const std::string& id : ids) JoinRoundOk(id, 1, 1);
  const Directives p1 = AllReadyNoBarrier(ids, 1);
  for (const std::string& id : ids) {
    EXPECT_FALSE(MessageFor(p1, id, kPlan).round_plan().has_hierarchy()) << id;
  }
}

TEST_F(MembershipTest, ResumedFinishedRunRefusesJoins) {
  v1::RunRecord record = Record(5, Hash('c'), 3);
  record.set_finished(true);
  Start({.resume = record});
  EXPECT_TRUE(engine_->finished());
  EXPECT_EQ(engine_->Status().phase(), v1::FINISHED);
  EXPECT_EQ(Join(9001).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(MembershipTest, JoinerWithNewerRoundFastForwardsAfterRestart) {
  Start({.min_participants = 2, .resume = Record(7, Hash('c'), 3)});
  const uint64_t v0 = engine_->record_version();
  const v1::JoinResponse a = AddMemberResponse(
      9001, {.previous_worker_id = "w1", .model_round = 7, .model_hash = Hash('c')});
  EXPECT_EQ(engine_->last_completed_round(), 7u);
  // Without a hash a newer round is not adopted.
  AddMember(9002, {.previous_worker_id = "w2", .model_round = 8});
  EXPECT_EQ(engine_->last_completed_round(), 7u);
  const uint64_t v1 = engine_->record_version();
  EXPECT_GT(v1, v0);

  // The coordinator died after round 8 completed but before it was saved.
  const v1::JoinResponse c = AddMemberResponse(
      9003, {.previous_worker_id = "w3", .model_round = 8, .model_hash = Hash('d')});
  EXPECT_EQ(c.model_round(), 8u);
  EXPECT_EQ(c.model_hash(), Hash('d'));
  EXPECT_EQ(c.next_round(), 9u);
  EXPECT_THAT(c.holders(), IsEmpty());
  RunStatus status = engine_->Status();
  EXPECT_EQ(status.round(), 9u);
  EXPECT_EQ(status.last_completed_round(), 8u);
  EXPECT_EQ(status.model_hash(), Hash('d'));
  EXPECT_GT(engine_->record_version(), v1);
  EXPECT_EQ(engine_->Record().last_completed_round(), 8u);
  EXPECT_EQ(engine_->Record().model_hash(), Hash('d'));

  // Round 9 starts from it, with w3 as the only holder.
  JoinRoundOk(a.worker_id(), 9, 9);
  const Directives start = JoinRoundOk(c.worker_id(), 9, 9);
  const v1::RoundStart rs = MessageFor(start, a.worker_id(), kStart).round_start();
  EXPECT_EQ(rs.round(), 9u);
  EXPECT_EQ(rs.base_model_round(), 8u);
  EXPECT_EQ(rs.base_model_hash(), Hash('d'));
  EXPECT_THAT(Strings(rs.holders()), ElementsAre(Address(9003)));

  // Not while a round runs.
  AddMember(9004, {.previous_worker_id = "w4", .model_round = 20, .model_hash = Hash('e')});
  EXPECT_EQ(engine_->last_completed_round(), 8u);
  EXPECT_EQ(engine_->Status().round(), 9u);
}

TEST_F(MembershipTest, NoFastForwardOnceARoundCompletedSinceStart) {
  Start({.min_participants = 1, .resume = Record(7, Hash('c'), 2)});
  const std::string w1 = AddMember(9001, {.previous_worker_id = "w1"});
  JoinRoundOk(w1, 8, 8);
  RunRound({w1}, 8, Hash('d'));
  ASSERT_EQ(engine_->last_completed_round(), 8u);
  engine_->Disconnect(w1, "stopped");
  ASSERT_EQ(engine_->Status().phase(), v1::WAITING_FOR_MEMBERS);

  const v1::JoinResponse j = AddMemberResponse(9002, {.model_round = 20, .model_hash = Hash('e')});
  EXPECT_EQ(j.model_round(), 8u);
  EXPECT_EQ(j.model_hash(), Hash('d'));
  EXPECT_EQ(engine_->last_completed_round(), 8u);
  EXPECT_EQ(engine_->Status().round(), 9u);
}

// ---------------------------------------------------------------- Record

TEST_F(MembershipTest, RecordReflectsTheRunAndItsVersionTracksChanges) {
  Start({.min_participants = 2, .rounds = 2});
  v1::RunRecord r = engine_->Record();
  EXPECT_EQ(r.run_id(), "run-m");
  EXPECT_EQ(r.config().model().name(), "mlp");
  EXPECT_EQ(r.config().sync().rounds(), 2u);
  EXPECT_EQ(r.last_completed_round(), 0u);
  EXPECT_EQ(r.model_hash(), "");
  EXPECT_EQ(r.next_worker_number(), 1u);
  EXPECT_EQ(r.updated_unix_ms(), absl::ToUnixMillis(clock_.Now()));
  EXPECT_FALSE(r.finished());

  uint64_t v = engine_->record_version();
  const std::string w1 = AddMember(9001);
  EXPECT_EQ(engine_->record_version(), v + 1);  // a new worker id
  EXPECT_EQ(engine_->Record().next_worker_number(), 2u);
  const std::string w2 = AddMember(9002);
  EXPECT_EQ(engine_->record_version(), v + 2);
  v = engine_->record_version();

  // Re-joining with the active id, starting a round, readiness, the barrier
  // and heartbeats change nothing durable.
  EXPECT_EQ(AddMember(9001, {.previous_worker_id = w1}), w1);
  JoinRoundOk(w1, 1, 1);
  JoinRoundOk(w2, 1, 1);
  AllReady({w1, w2}, 1);
  ASSERT_TRUE(engine_->Heartbeat(w1).ok());
  EXPECT_EQ(engine_->record_version(), v);

  clock_.Advance(absl::Seconds(3));
  AllDone({w1, w2}, 1, Hash('a'));
  EXPECT_EQ(engine_->record_version(), v + 1);  // round completed
  r = engine_->Record();
  EXPECT_EQ(r.last_completed_round(), 1u);
  EXPECT_EQ(r.model_hash(), Hash('a'));
  EXPECT_EQ(r.updated_unix_ms(), absl::ToUnixMillis(clock_.Now()));
  EXPECT_FALSE(r.finished());
  v = engine_->record_version();

  const Directives out = RunRound({w1, w2}, 2, Hash('b'));
  EXPECT_THAT(To(out, kFinished), UnorderedElementsAre(w1, w2));
  // Round completed and run finished in the same call: one change.
  EXPECT_EQ(engine_->record_version(), v + 1);
  r = engine_->Record();
  EXPECT_EQ(r.last_completed_round(), 2u);
  EXPECT_EQ(r.model_hash(), Hash('b'));
  EXPECT_TRUE(r.finished());
}

// ---------------------------------------------------------------- Sync

TEST_F(MembershipTest, HeartbeatSyncProgressShowsInStatus) {
  Start();
  const std::string w1 = AddMember(9001);
  const std::string w2 = AddMember(9002);
  v1::Heartbeat hb;
  hb.set_syncing(true);
  hb.set_sync_bytes_done(1024);
  hb.set_sync_bytes_total(4096);
  hb.set_sync_sources(2);
  ASSERT_TRUE(engine_->Heartbeat(w1, hb).ok());

  RunStatus status = engine_->Status();
  WorkerStatus s1 = *FindWorker(status, w1);
  EXPECT_EQ(s1.state(), "syncing");
  EXPECT_EQ(s1.sync_bytes_done(), 1024u);
  EXPECT_EQ(s1.sync_bytes_total(), 4096u);
  EXPECT_EQ(s1.sync_sources(), 2u);
  const WorkerStatus s2 = *FindWorker(status, w2);
  EXPECT_EQ(s2.state(), "waiting");
  EXPECT_EQ(s2.sync_bytes_total(), 0u);

  // Progress updates, then the sync ends.
  hb.set_sync_bytes_done(4096);
  ASSERT_TRUE(engine_->Heartbeat(w1, hb).ok());
  EXPECT_EQ(FindWorker(engine_->Status(), w1)->sync_bytes_done(), 4096u);
  ASSERT_TRUE(engine_->Heartbeat(w1).ok());
  s1 = *FindWorker(engine_->Status(), w1);
  EXPECT_EQ(s1.state(), "waiting");
  EXPECT_EQ(s1.sync_bytes_done(), 0u);
  EXPECT_EQ(s1.sync_bytes_total(), 0u);
}

// ---------------------------------------------------------------- Checkpoints

TEST_F(MembershipTest, CheckpointIsAssignedEveryKRoundsToTheFirstHolder) {
  Start({.checkpoint_store = "127.0.0.1:50052", .checkpoint_every = 2});
  const std::vector<std::string> ids = StartRoundOne(2);
  EXPECT_THAT(To(RunRound(ids, 1, Hash('a')), kCheckpoint), IsEmpty());
  const Directives out = RunRound(ids, 2, Hash('b'));
  ASSERT_THAT(To(out, kCheckpoint), ElementsAre(ids[0]));
  const v1::CheckpointRequest req = MessageFor(out, ids[0], kCheckpoint).checkpoint_request();
  EXPECT_EQ(req.round(), 2u);
  EXPECT_EQ(req.model_hash(), Hash('b'));
  EXPECT_EQ(req.run_id(), "run-m");
  EXPECT_EQ(engine_->Status().checkpoint_pending(), "round 2 by " + ids[0]);

  const uint64_t version = engine_->record_version();
  v1::ReportCheckpointRequest report;
  report.set_worker_id(ids[0]);
  report.set_round(2);
  report.set_checkpoint_id("run-m-r2");
  Directives none;
  ASSERT_TRUE(engine_->ReportCheckpoint(report, &none).ok());
  EXPECT_GT(engine_->record_version(), version);
  const RunStatus status = engine_->Status();
  EXPECT_EQ(status.checkpoint_id(), "run-m-r2");
  EXPECT_EQ(status.checkpoint_round(), 2u);
  EXPECT_EQ(status.checkpoint_pending(), "");
  EXPECT_EQ(engine_->Record().checkpoint_id(), "run-m-r2");
  EXPECT_EQ(engine_->Record().checkpoint_round(), 2u);
  // Joiners and the next round learn where the fallback copy is.
  EXPECT_EQ(AddMemberResponse(9009).checkpoint_id(), "run-m-r2");
}

TEST_F(MembershipTest, FailedOrLostUploadMovesToAnotherHolder) {
  Start({.checkpoint_store = "127.0.0.1:50052", .checkpoint_every = 1});
  const std::vector<std::string> ids = StartRoundOne(3);
  Directives out = RunRound(ids, 1, Hash('a'));
  ASSERT_THAT(To(out, kCheckpoint), ElementsAre(ids[0]));
  // The first one fails: the next holder is asked.
  v1::ReportCheckpointRequest report;
  report.set_worker_id(ids[0]);
  report.set_round(1);
  report.set_error("disk full");
  out.clear();
  ASSERT_TRUE(engine_->ReportCheckpoint(report, &out).ok());
  ASSERT_THAT(To(out, kCheckpoint), ElementsAre(ids[1]));
  // A report from someone not asked is refused.
  report.set_error("");
  report.set_checkpoint_id("x");
  Directives none;
  EXPECT_EQ(engine_->ReportCheckpoint(report, &none).code(), absl::StatusCode::kFailedPrecondition);
  // The second one dies: the third takes over.
  out = engine_->Disconnect(ids[1], "killed");
  for (Directive& d : Pass(absl::Seconds(1), {ids[0], ids[2]})) out.push_back(d);
  EXPECT_THAT(To(out, kCheckpoint), ElementsAre(ids[2]));
}

TEST_F(MembershipTest, ResumedRecordKeepsTheCheckpoint) {
  v1::RunRecord record;
  record.set_run_id("run-m");
  record.set_last_completed_round(6);
  record.set_model_hash(Hash('f'));
  record.set_checkpoint_id("run-m-r6");
  record.set_checkpoint_round(6);
  record.set_next_worker_number(3);
  Start({.resume = record});
  const v1::JoinResponse joined = AddMemberResponse(9001);
  EXPECT_EQ(joined.model_round(), 6u);
  EXPECT_EQ(joined.model_hash(), Hash('f'));
  EXPECT_EQ(joined.checkpoint_id(), "run-m-r6");
  EXPECT_EQ(joined.checkpoint_round(), 6u);
  EXPECT_THAT(joined.holders(), IsEmpty());
  EXPECT_EQ(joined.next_round(), 7u);
}

// ---------------------------------------------------------------- Scaling

// The barrier counters (ready / connected / unreachable / done) and the
// participant and queue sets follow every way a worker enters or leaves a
// round; the phase detail is printed from the counters.
TEST_F(MembershipTest, CountersStayConsistentThroughJoinsLeavesEvictionsAndReplans) {
  Start({.min_participants = 2, .connection_timeout = absl::Seconds(5), .max_connection_retry = 1});
  std::vector<std::string> ids = StartRoundOne(3);
  // A newcomer joins the running round before anyone is ready.
  const std::string late = AddMember(9004);
  JoinRoundOk(late, 1, 1);
  ids.push_back(late);
  EXPECT_THAT(engine_->Status().detail(), HasSubstr("0/4 participants ready"));
  ReadyOk(ids[0], 1);
  ReadyOk(ids[1], 1);
  EXPECT_THAT(engine_->Status().detail(), HasSubstr("2/4 participants ready"));
  // A ready participant leaves before the plan: it no longer counts.
  engine_->Disconnect(ids[1], "left");
  ExpectConsistent();
  EXPECT_THAT(engine_->Status().detail(), HasSubstr("1/3 participants ready"));
  // A queued joiner (after the first ready) does not count either.
  const std::string queued = AddMember(9005);
  JoinRoundOk(queued, 1, 2);
  ReadyOk(ids[2], 1);
  const Directives plan = ReadyOk(ids[3], 1);
  EXPECT_THAT(To(plan, kPlan), ElementsAre(ids[0], ids[2], ids[3]));
  EXPECT_THAT(engine_->Status().detail(), HasSubstr("connecting: 0/3"));

  // Attempt 1: one reports an unreachable peer, one reports nothing.
  ConnectedOk(ids[0], 1, 1, {ids[3]});
  ConnectedOk(ids[2], 1, 1, {ids[3]});
  EXPECT_THAT(engine_->Status().detail(), HasSubstr("connecting: 2/3"));
  // The deadline resets the barrier (retry 1 of 1) ...
  Directives out = Pass(absl::Seconds(5), {ids[0], ids[2], ids[3], queued});
  EXPECT_THAT(To(out, kRetry), ElementsAre(ids[0], ids[2], ids[3]));
  EXPECT_THAT(engine_->Status().detail(), HasSubstr("connecting: 0/3"));
  // ... a report that names nobody now replaces one that named a peer ...
  ConnectedOk(ids[0], 1, 1, {ids[3]});
  ConnectedOk(ids[0], 1, 1);
  ConnectedOk(ids[2], 1, 1, {ids[3]});
  // ... and after the last retry the peer named by the majority is evicted
  // and the others get attempt 2.
  out = Pass(absl::Seconds(5), {ids[0], ids[2], ids[3], queued});
  EXPECT_THAT(To(out, kConnFail), ElementsAre(ids[3]));
  EXPECT_THAT(To(out, kPlan), ElementsAre(ids[0], ids[2]));
  EXPECT_EQ(engine_->Status().attempt(), 2u);
  EXPECT_THAT(engine_->Status().detail(), HasSubstr("connecting: 0/2"));

  // Attempt 2 starts sharing; one is done, then the other is lost: re-plan.
  AllConnected(1);
  DoneOk(ids[0], 1, Hash('a'));
  EXPECT_THAT(engine_->Status().detail(), HasSubstr("1/2 participants done sharing"));
  const std::string extra = AddMember(9006);
  JoinRoundOk(extra, 1, 2);
  out = engine_->Disconnect(ids[2], "crashed");
  ExpectConsistent();
  EXPECT_THAT(To(out, kPlan), ElementsAre(ids[0]));
  EXPECT_THAT(engine_->Status().detail(), HasSubstr("connecting: 0/1"));
  AllConnected(1);
  EXPECT_THAT(engine_->Status().detail(), HasSubstr("0/1 participants done sharing"));
  out = DoneOk(ids[0], 1, Hash('a'));
  EXPECT_THAT(To(out, kComplete), ElementsAre(ids[0]));

  // Round 2: the survivor and the queued joiners; one straggler misses it.
  EXPECT_THAT(To(out, kStart), ElementsAre(ids[0], queued, extra));
  ReadyOk(ids[0], 2);
  ReadyOk(queued, 2);
  out = Pass(absl::Seconds(60), {ids[0], queued, extra});
  EXPECT_THAT(To(out, kMissed), ElementsAre(extra));
  EXPECT_THAT(To(out, kPlan), ElementsAre(ids[0], queued));
  AllConnected(2);
  // Hashes disagree with no majority: the round is aborted and restarts.
  DoneOk(ids[0], 2, Hash('b'));
  out = DoneOk(queued, 2, Hash('c'));
  EXPECT_THAT(To(out, kAborted), ElementsAre(ids[0], queued));
  EXPECT_THAT(To(out, kStart), ElementsAre(ids[0], queued, extra));
  EXPECT_THAT(engine_->Status().detail(), HasSubstr("0/3 participants ready"));
  RunRound({ids[0], queued, extra}, 2, Hash('d'));
  EXPECT_EQ(engine_->last_completed_round(), 2u);
}

TEST_F(MembershipTest, BroadcastsShareOneMessageObject) {
  Start({.min_participants = 3});
  const std::vector<std::string> ids = StartRoundOne(3);
  AllReadyNoBarrier({ids[0], ids[1]}, 1);
  const Directives plan = ReadyOk(ids[2], 1);
  ASSERT_EQ(To(plan, kPlan).size(), 3u);
  // One RoundPlan listing every participant, pointed at by every directive.
  for (const Directive& d : plan) EXPECT_EQ(d.message.get(), plan[0].message.get());
  EXPECT_EQ(plan[0].message->round_plan().slices_size(), 3);
  const Directives sharing = AllConnected(1);
  ASSERT_EQ(To(sharing, kStartSharing).size(), 3u);
  for (const Directive& d : sharing) EXPECT_EQ(d.message.get(), sharing[0].message.get());
  const Directives done = AllDone(ids, 1, Hash('a'));
  std::vector<const CoordinatorMessage*> starts, completes;
  for (const Directive& d : done) {
    if (d.message->has_round_start()) starts.push_back(d.message.get());
    if (d.message->has_round_complete()) completes.push_back(d.message.get());
  }
  ASSERT_EQ(starts.size(), 3u);
  ASSERT_EQ(completes.size(), 3u);
  EXPECT_THAT(starts, ::testing::Each(starts[0]));
  EXPECT_THAT(completes, ::testing::Each(completes[0]));
}

TEST_F(MembershipTest, StatusVersionMovesWithTheStatusButNotWithPlainHeartbeats) {
  Start({.min_participants = 2});
  uint64_t v = engine_->status_version();
  const std::string w1 = AddMember(9001);
  EXPECT_GT(engine_->status_version(), v);
  const std::string w2 = AddMember(9002);
  // The next Tick elects the new members' zones: a change of the status.
  v = engine_->status_version();
  Pass(absl::Milliseconds(250), {w1, w2});
  EXPECT_GT(engine_->status_version(), v);

  // A heartbeat that only refreshes last_seen leaves the version.
  v = engine_->status_version();
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(engine_->Heartbeat(w1).ok());
  EXPECT_EQ(engine_->status_version(), v);
  // Sync progress is shown: it moves the version, once per change.
  v1::Heartbeat syncing;
  syncing.set_syncing(true);
  syncing.set_sync_bytes_done(10);
  syncing.set_sync_bytes_total(100);
  ASSERT_TRUE(engine_->Heartbeat(w1, syncing).ok());
  EXPECT_GT(engine_->status_version(), v);
  v = engine_->status_version();
  ASSERT_TRUE(engine_->Heartbeat(w1, syncing).ok());
  EXPECT_EQ(engine_->status_version(), v);
  ASSERT_TRUE(engine_->Heartbeat(w1).ok());  // sync over
  EXPECT_GT(engine_->status_version(), v);

  // Round reports move it; a quiet Tick does not.
  v = engine_->status_version();
  JoinRoundOk(w1, 1, 1);
  EXPECT_GT(engine_->status_version(), v);
  JoinRoundOk(w2, 1, 1);
  v = engine_->status_version();
  EXPECT_THAT(Pass(absl::Seconds(1), {w1, w2}), IsEmpty());
  EXPECT_EQ(engine_->status_version(), v);
  ReadyOk(w1, 1);
  EXPECT_GT(engine_->status_version(), v);
  v = engine_->status_version();
  // A refused report changes nothing.
  Directives none;
  EXPECT_FALSE(Ready(w1, 7, &none).ok());
  EXPECT_EQ(engine_->status_version(), v);

  // Status(&version) hands out the version it reflects.
  uint64_t seen = 0;
  const RunStatus status = engine_->Status(&seen);
  EXPECT_EQ(seen, engine_->status_version());
  EXPECT_THAT(status.detail(), HasSubstr("1/2 participants ready"));

  // An eviction by the lease is a change.
  v = engine_->status_version();
  Pass(absl::Seconds(15), {w1});
  EXPECT_GT(engine_->status_version(), v);
  EXPECT_EQ(engine_->Status().members(), 1u);
}

TEST_F(MembershipTest, DeparturesCountEveryRemoval) {
  Start({.min_participants = 2});
  const std::string w1 = AddMember(9001);
  const std::string w2 = AddMember(9002);
  const std::string w3 = AddMember(9003);
  EXPECT_EQ(engine_->departures(), 0u);
  engine_->Disconnect(w1, "left");
  EXPECT_EQ(engine_->departures(), 1u);
  engine_->Disconnect(w1, "again");  // unknown by now: nothing removed
  EXPECT_EQ(engine_->departures(), 1u);
  AddMember(9002);  // a new worker at w2's address replaces it
  EXPECT_FALSE(engine_->IsActive(w2));
  EXPECT_EQ(engine_->departures(), 2u);
  Pass(absl::Seconds(15), {});  // leases expire
  EXPECT_FALSE(engine_->IsActive(w3));
  EXPECT_EQ(engine_->departures(), 4u);
}

}  // namespace
}  // namespace shoal::coordinator
