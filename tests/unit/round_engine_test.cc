// Unit tests of the coordinator's round state machine. No sockets, no sleeps:
// time only moves when the test advances the FakeClock.
#include "services/coordinator/core/round_engine.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/shard_plan.h"
#include "common/worker_state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/coordinator/core/versioned_cache.h"
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

class RoundEngineTest : public ::testing::Test {
 protected:
  void Start(uint32_t min_participants, uint64_t rounds = 0, size_t max_departed_shown = 50,
             uint32_t max_members = 0) {
    EngineOptions options;
    options.max_members = max_members;
    options.config.mutable_model()->set_name("mlp");
    options.config.mutable_sync()->set_min_participants(min_participants);
    options.config.mutable_sync()->set_rounds(rounds);
    options.config.mutable_training()->set_seed(7);
    options.config.mutable_exchange()->set_fragments(fragments_);
    options.config.mutable_exchange()->set_slice_sizing(slice_sizing_);
    options.run_id = "run-test";
    options.heartbeat_lease = absl::Seconds(10);
    options.session_grace = absl::Seconds(10);
    options.max_departed_shown = max_departed_shown;
    options.max_pending_joins = max_pending_joins_;
    engine_ = std::make_unique<RoundEngine>(options, &clock_);
  }

  // RunConfig.exchange.fragments of the next Start.
  uint32_t fragments_ = 0;
  // RunConfig.exchange.slice_sizing of the next Start.
  std::string slice_sizing_;
  // EngineOptions::max_pending_joins of the next Start.
  size_t max_pending_joins_ = 256;

  absl::StatusOr<JoinResult> Join(int port, const std::string& previous_worker_id = "") {
    v1::JoinRequest request;
    request.set_peer_address(Address(port));
    request.set_name(absl::StrCat("worker-", port));
    request.set_previous_worker_id(previous_worker_id);
    return engine_->Join(request);
  }

  // Joins a worker at 127.0.0.1:port and opens its session.
  std::string AddMember(int port) {
    absl::StatusOr<JoinResult> joined = Join(port);
    EXPECT_TRUE(joined.ok()) << joined.status();
    if (!joined.ok()) return "";
    EXPECT_TRUE(engine_->Connect(joined->response.worker_id()).ok());
    return joined->response.worker_id();
  }

  Directives JoinRoundOk(const std::string& id, uint64_t round, uint64_t expected_admitted) {
    Directives out;
    absl::StatusOr<uint64_t> admitted = engine_->JoinRound(id, round, &out);
    EXPECT_TRUE(admitted.ok()) << admitted.status();
    if (admitted.ok()) {
      EXPECT_EQ(*admitted, expected_admitted);
    }
    return out;
  }

  absl::Status Ready(const std::string& id, uint64_t round, uint64_t total, Directives* out,
                     double loss = 0.5) {
    v1::ReportReadyRequest request;
    request.set_worker_id(id);
    request.set_round(round);
    request.set_total_elements(total);
    request.set_train_loss(loss);
    return engine_->ReportReady(request, out);
  }

  Directives ReadyOk(const std::string& id, uint64_t round, double loss = 0.5) {
    Directives out;
    absl::Status s = Ready(id, round, kTotal, &out, loss);
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }

  absl::Status Done(const std::string& id, uint64_t round, const std::string& hash, Directives* out,
                    const v1::Metrics& metrics = {}, double exchange_seconds = 0) {
    v1::ReportRoundDoneRequest request;
    request.set_worker_id(id);
    request.set_round(round);
    request.set_model_hash(hash);
    *request.mutable_metrics() = metrics;
    request.set_exchange_seconds(exchange_seconds);
    return engine_->ReportRoundDone(request, out);
  }

  Directives DoneOk(const std::string& id, uint64_t round, const std::string& hash) {
    Directives out;
    absl::Status s = Done(id, round, hash, &out);
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }

  // Adds `n` members (ports 9001..) and has them all join round 1; with
  // min_participants == n the round starts.
  std::vector<std::string> StartRoundOne(int n) {
    std::vector<std::string> ids;
    for (int i = 0; i < n; ++i) ids.push_back(AddMember(9001 + i));
    for (const std::string& id : ids) JoinRoundOk(id, 1, 1);
    EXPECT_EQ(engine_->Status().phase(), v1::TRAINING);
    return ids;
  }

  // Every participant reports that it reached its peers (the barrier before
  // weight sharing); returns the directives of the last report.
  Directives AllConnected(uint64_t round) {
    const v1::RunStatus status = engine_->Status();
    Directives last;
    for (const std::string& id : status.participants()) {
      v1::ConnectionsReadyRequest request;
      request.set_worker_id(id);
      request.set_round(round);
      request.set_attempt(status.attempt());
      last.clear();
      absl::Status s = engine_->ConnectionsReady(request, &last);
      EXPECT_TRUE(s.ok()) << s;
    }
    return last;
  }

  // Every id reports ready for `round`, then all pass the connection
  // barrier; returns the directives of the last ready report (the plan).
  Directives AllReady(const std::vector<std::string>& ids, uint64_t round) {
    Directives last;
    for (const std::string& id : ids) last = ReadyOk(id, round);
    EXPECT_EQ(engine_->Status().phase(), v1::SHARING);
    AllConnected(round);
    return last;
  }

  // Every id reports `hash` for `round`; returns the directives of the last.
  Directives AllDone(const std::vector<std::string>& ids, uint64_t round, const std::string& hash) {
    Directives last;
    for (const std::string& id : ids) last = DoneOk(id, round, hash);
    return last;
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
    }
    return all;
  }

  FakeClock clock_;
  std::unique_ptr<RoundEngine> engine_;
};

// ---------------------------------------------------------------- Join

TEST_F(RoundEngineTest, JoinAssignsSequentialIdsAndDataRanks) {
  Start(3);
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<JoinResult> joined = Join(9001 + i);
    ASSERT_TRUE(joined.ok()) << joined.status();
    const v1::JoinResponse& r = joined->response;
    EXPECT_EQ(r.worker_id(), absl::StrCat("w", i + 1));
    EXPECT_EQ(r.data_rank(), static_cast<uint32_t>(i));
    EXPECT_EQ(r.run_id(), "run-test");
    EXPECT_EQ(r.config().sync().min_participants(), 3u);
    EXPECT_EQ(r.config().training().seed(), 7u);
    EXPECT_EQ(r.next_round(), 1u);
    EXPECT_EQ(r.model_round(), 0u);
    EXPECT_THAT(joined->directives, IsEmpty());
  }
  const RunStatus status = engine_->Status();
  EXPECT_EQ(status.members(), 3u);
  ASSERT_EQ(status.workers_size(), 3);
  for (const WorkerStatus& w : status.workers()) EXPECT_EQ(w.state(), "waiting");
}

TEST_F(RoundEngineTest, JoinRejectsBadPeerAddress) {
  Start(1);
  for (const std::string address : {"", "localhost", "localhost:", "localhost:0", ":9000",
                                    "localhost:65536", "localhost:http", "localhost:-1"}) {
    v1::JoinRequest request;
    request.set_peer_address(address);
    absl::StatusOr<JoinResult> joined = engine_->Join(request);
    EXPECT_EQ(joined.status().code(), absl::StatusCode::kInvalidArgument)
        << "address '" << address << "'";
  }
  EXPECT_EQ(engine_->Status().members(), 0u);
  // Rejected joins consume no id.
  absl::StatusOr<JoinResult> joined = Join(9001);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->response.worker_id(), "w1");
}

TEST_F(RoundEngineTest, JoinAtAddressOfActiveMemberReplacesIt) {
  Start(3);
  const std::string w1 = AddMember(9001);
  const std::string w2 = AddMember(9002);
  JoinRoundOk(w1, 1, 1);

  absl::StatusOr<JoinResult> joined = Join(9001);  // w1's port, a new process
  ASSERT_TRUE(joined.ok()) << joined.status();
  const std::string w3 = joined->response.worker_id();
  EXPECT_EQ(w3, "w3");
  EXPECT_EQ(joined->response.data_rank(), 0u);  // w1's rank is free again

  const RunStatus status = engine_->Status();
  EXPECT_EQ(status.members(), 2u);
  const auto old = FindWorker(status, w1);
  ASSERT_TRUE(old.has_value());
  EXPECT_EQ(old->state(), "lost");  // its process is gone without a Leave
  EXPECT_THAT(old->reason(), HasSubstr("replaced"));
  EXPECT_EQ(FindWorker(status, w3)->address(), Address(9001));
  EXPECT_EQ(engine_->Connect(w1).code(), absl::StatusCode::kNotFound);

  // w1 no longer counts towards round 1: two more are needed.
  EXPECT_TRUE(engine_->Connect(w3).ok());
  EXPECT_THAT(JoinRoundOk(w2, 1, 1), IsEmpty());
  EXPECT_EQ(engine_->Status().phase(), v1::WAITING_FOR_MEMBERS);
  EXPECT_THAT(To(JoinRoundOk(w3, 1, 1), kStart), IsEmpty());
  EXPECT_EQ(engine_->Status().phase(), v1::WAITING_FOR_MEMBERS);
}

// How a member departed shows in its state: a Leave is "left", a broken
// session "lost" (a crash reads as one), and any departure once the run
// has finished "finished". --name is shown beside the id.
TEST_F(RoundEngineTest, DepartedStatesTellALeaveFromACrashAndTheNameIsShown) {
  Start(3);
  v1::JoinRequest request;
  request.set_peer_address(Address(9001));
  request.set_name("alice");
  absl::StatusOr<JoinResult> joined = engine_->Join(request);
  ASSERT_TRUE(joined.ok()) << joined.status();
  const std::string named = joined->response.worker_id();
  const std::string w2 = AddMember(9002);
  const std::string w3 = AddMember(9003);
  EXPECT_EQ(FindWorker(engine_->Status(), named)->name(), "alice");
  EXPECT_EQ(FindWorker(engine_->Status(), w2)->name(), "worker-9002");  // AddMember names it

  engine_->Disconnect(w2, "worker shut down", RoundEngine::SessionEnd::kLeave);
  engine_->Disconnect(named, "session stream closed", RoundEngine::SessionEnd::kBroken);
  const RunStatus status = engine_->Status();
  EXPECT_EQ(FindWorker(status, w2)->state(), "left");
  EXPECT_EQ(FindWorker(status, w2)->reason(), "worker shut down");
  EXPECT_EQ(FindWorker(status, named)->state(), "lost");
  EXPECT_EQ(FindWorker(status, named)->reason(), "session stream closed");
  EXPECT_EQ(FindWorker(status, named)->name(), "alice");  // kept after it departed
  EXPECT_TRUE(DepartedState("lost"));
  EXPECT_TRUE(DepartedState("finished"));
  EXPECT_FALSE(DepartedState("syncing"));
  EXPECT_EQ(FindWorker(status, w3)->state(), "waiting");
}

TEST_F(RoundEngineTest, RejoinWithPreviousWorkerIdKeepsIdAndRank) {
  Start(2);
  const std::string w1 = AddMember(9001);
  AddMember(9002);
  absl::StatusOr<JoinResult> joined = Join(9003, w1);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->response.worker_id(), w1);
  EXPECT_EQ(joined->response.data_rank(), 0u);
  const RunStatus status = engine_->Status();
  EXPECT_EQ(status.members(), 2u);
  EXPECT_EQ(FindWorker(status, w1)->address(), Address(9003));
}

TEST_F(RoundEngineTest, MaxMembersRefusesNewWorkersButNotRejoins) {
  Start(2, 0, 50, /*max_members=*/2);
  const std::string w1 = AddMember(9001);
  AddMember(9002);
  absl::StatusOr<JoinResult> third = Join(9003);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted) << third.status();
  EXPECT_NE(third.status().message().find("--max_members=2"), std::string::npos);
  // A member re-joining under its id is not a new member.
  absl::StatusOr<JoinResult> again = Join(9004, w1);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->response.worker_id(), w1);
  EXPECT_EQ(engine_->Status().members(), 2u);
  // Once a member leaves there is room again.
  Directives out = engine_->Disconnect(w1, "left");
  EXPECT_TRUE(Join(9005).ok());
}

// ---------------------------------------------------------------- Round start

TEST_F(RoundEngineTest, WaitsForMinParticipantsThenStartsRoundOne) {
  Start(3);
  const std::string w1 = AddMember(9001);
  const std::string w2 = AddMember(9002);
  const std::string w3 = AddMember(9003);

  EXPECT_THAT(JoinRoundOk(w1, 1, 1), IsEmpty());
  EXPECT_THAT(JoinRoundOk(w2, 1, 1), IsEmpty());
  RunStatus status = engine_->Status();
  EXPECT_EQ(status.phase(), v1::WAITING_FOR_MEMBERS);
  EXPECT_EQ(status.round(), 1u);
  EXPECT_THAT(status.detail(), HasSubstr("2 of 3"));
  EXPECT_THAT(JoinRoundOk(w1, 1, 1), IsEmpty());  // repeated: still waiting

  const Directives out = JoinRoundOk(w3, 1, 1);
  EXPECT_THAT(To(out, kStart), UnorderedElementsAre(w1, w2, w3));
  EXPECT_EQ(out.size(), 3u);
  for (const std::string& id : {w1, w2, w3}) {
    const CoordinatorMessage msg = MessageFor(out, id, kStart);
    EXPECT_EQ(msg.round_start().round(), 1u);
    EXPECT_EQ(msg.round_start().base_model_round(), 0u);
  }
  status = engine_->Status();
  EXPECT_EQ(status.phase(), v1::TRAINING);
  EXPECT_EQ(status.round(), 1u);
  EXPECT_THAT(Participants(status), ElementsAre(w1, w2, w3));
  for (const WorkerStatus& w : status.workers()) EXPECT_EQ(w.state(), "training");
  // A participant asking again is told its round, with no new directive.
  EXPECT_THAT(JoinRoundOk(w2, 1, 1), IsEmpty());
}

TEST_F(RoundEngineTest, NewcomerJoinsRunningRoundBeforeAnyoneIsReady) {
  Start(2);
  const std::vector<std::string> ids = StartRoundOne(2);

  absl::StatusOr<JoinResult> joined = Join(9003);
  ASSERT_TRUE(joined.ok());
  EXPECT_EQ(joined->response.next_round(), 1u);
  const std::string w3 = joined->response.worker_id();
  ASSERT_TRUE(engine_->Connect(w3).ok());

  const Directives out = JoinRoundOk(w3, 1, 1);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].worker_id, w3);
  ASSERT_EQ(out[0].message->kind_case(), kStart);
  EXPECT_EQ(out[0].message->round_start().round(), 1u);
  EXPECT_EQ(out[0].message->round_start().base_model_round(), 0u);
  EXPECT_THAT(Participants(engine_->Status()), ElementsAre(ids[0], ids[1], w3));

  // The plan now waits for the newcomer as well.
  EXPECT_THAT(ReadyOk(ids[0], 1), IsEmpty());
  EXPECT_THAT(ReadyOk(ids[1], 1), IsEmpty());
  const Directives plan = ReadyOk(w3, 1);
  EXPECT_THAT(To(plan, kPlan), ElementsAre(ids[0], ids[1], w3));
  EXPECT_EQ(MessageFor(plan, w3, kPlan).round_plan().slices_size(), 3);
}

TEST_F(RoundEngineTest, NewcomerAfterFirstReadyIsAdmittedToNextRound) {
  Start(2);
  const std::vector<std::string> ids = StartRoundOne(2);
  EXPECT_THAT(ReadyOk(ids[0], 1), IsEmpty());

  absl::StatusOr<JoinResult> joined = Join(9003);
  ASSERT_TRUE(joined.ok());
  EXPECT_EQ(joined->response.next_round(), 2u);
  const std::string w3 = joined->response.worker_id();
  ASSERT_TRUE(engine_->Connect(w3).ok());

  EXPECT_THAT(JoinRoundOk(w3, 1, 2), IsEmpty());
  EXPECT_THAT(JoinRoundOk(w3, 2, 2), IsEmpty());  // repeated
  EXPECT_THAT(Participants(engine_->Status()), ElementsAre(ids[0], ids[1]));
  EXPECT_EQ(FindWorker(engine_->Status(), w3)->state(), "waiting");

  // The newcomer is no participant of round 1: the plan has two slices.
  const Directives plan = ReadyOk(ids[1], 1);
  EXPECT_THAT(To(plan, kPlan), ElementsAre(ids[0], ids[1]));
  EXPECT_EQ(MessageFor(plan, ids[0], kPlan).round_plan().slices_size(), 2);
  EXPECT_THAT(To(AllConnected(1), kStartSharing), ElementsAre(ids[0], ids[1]));

  DoneOk(ids[0], 1, Hash('a'));
  const Directives out = DoneOk(ids[1], 1, Hash('a'));
  EXPECT_THAT(To(out, kComplete), ElementsAre(ids[0], ids[1]));
  EXPECT_THAT(To(out, kStart), ElementsAre(ids[0], ids[1], w3));
  const CoordinatorMessage start = MessageFor(out, w3, kStart);
  EXPECT_EQ(start.round_start().round(), 2u);
  EXPECT_EQ(start.round_start().base_model_round(), 1u);
  EXPECT_THAT(Participants(engine_->Status()), ElementsAre(ids[0], ids[1], w3));
}

// Streaming fragments: the plan names round r's fragment (r mod K) and
// cuts the slices inside it; the compact plan of the next round carries
// the next fragment.
TEST_F(RoundEngineTest, AFragmentRunPlansEachRoundInsideItsFragment) {
  fragments_ = 4;
  Start(2);
  const std::vector<std::string> ids = StartRoundOne(2);
  // A model smaller than the fragments cannot be cut.
  Directives refused;
  EXPECT_EQ(Ready(ids[0], 1, 3, &refused).code(), absl::StatusCode::kFailedPrecondition);
  ReadyOk(ids[0], 1);
  const Directives plan = ReadyOk(ids[1], 1);
  const v1::RoundPlan p1 = MessageFor(plan, ids[0], kPlan).round_plan();
  const SliceRange f1 = FragmentOf(kTotal, 4, 1);  // [250, 500)
  EXPECT_EQ(p1.fragment_begin(), f1.begin);
  EXPECT_EQ(p1.fragment_end(), f1.end);
  ASSERT_EQ(p1.slices_size(), 2);
  EXPECT_EQ(p1.slices(0).begin(), 250u);
  EXPECT_EQ(p1.slices(0).end(), 375u);
  EXPECT_EQ(p1.slices(1).begin(), 375u);
  EXPECT_EQ(p1.slices(1).end(), 500u);
  AllConnected(1);
  DoneOk(ids[0], 1, Hash('a'));
  DoneOk(ids[1], 1, Hash('a'));
  ReadyOk(ids[0], 2);
  const v1::RoundPlan p2 = MessageFor(ReadyOk(ids[1], 2), ids[0], kPlan).round_plan();
  EXPECT_EQ(p2.fragment_begin(), 500u);
  EXPECT_EQ(p2.fragment_end(), 750u);
  EXPECT_EQ(p2.slices_size(), 0);  // the same list: the worker cuts it
}

// Bandwidth-proportional slices (issue 49): the round's first plan is
// even (nothing measured); the reads the done reports carry size the next
// round's slices, never the current round's, and a re-plan within a round
// cuts by the shares of the round's start.
TEST_F(RoundEngineTest, BandwidthSlicesChangeOnlyBetweenRounds) {
  slice_sizing_ = "bandwidth";
  Start(3);
  const std::vector<std::string> ids = StartRoundOne(3);
  // Every reader reads 400 bytes from each other member at these rates.
  auto done_with_reads = [&](uint64_t round, const std::vector<double>& rate) {
    for (const std::string& reader : ids) {
      v1::ReportRoundDoneRequest request;
      request.set_worker_id(reader);
      request.set_round(round);
      request.set_model_hash(Hash(static_cast<char>('a' + round)));
      for (size_t k = 0; k < ids.size(); ++k) {
        if (ids[k] == reader) continue;
        v1::PeerRead* r = request.add_peer_reads();
        r->set_worker_id(ids[k]);
        r->set_bytes(400);
        r->set_seconds(400 / rate[k]);
      }
      Directives out;
      ASSERT_TRUE(engine_->ReportRoundDone(request, &out).ok());
    }
  };
  auto owned = [](const v1::RoundPlan& plan, int k) {
    return plan.slices(k).end() - plan.slices(k).begin();
  };
  const Directives round1 = AllReady(ids, 1);
  const v1::RoundPlan p1 = MessageFor(round1, ids[0], kPlan).round_plan();
  ASSERT_EQ(p1.slices_size(), 3);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(p1.slices(k).share(), 0u) << "nothing measured yet";
  EXPECT_EQ(owned(p1, 2), kTotal - 2 * (kTotal / 3));
  // Round 1's reads: the third member serves at a tenth of the others'.
  done_with_reads(1, {10000, 10000, 1000});
  EXPECT_EQ(engine_->last_completed_round(), 1u);
  RunStatus status = engine_->Status();
  EXPECT_DOUBLE_EQ(FindWorker(status, ids[2])->exchange_rate_bytes_per_second(), 2000);
  EXPECT_DOUBLE_EQ(FindWorker(status, ids[0])->exchange_rate_bytes_per_second(), 20000);

  // Round 2's plan: shares in proportion, a new list (full plan).
  const v1::RoundPlan p2 = MessageFor(AllReady(ids, 2), ids[0], kPlan).round_plan();
  ASSERT_EQ(p2.slices_size(), 3);
  EXPECT_GT(p2.participants_version(), p1.participants_version());
  EXPECT_EQ(p2.slices(0).share(), p2.slices(1).share());
  EXPECT_NEAR(static_cast<double>(owned(p2, 2)), kTotal * 2.0 / 42, 1.5);
  EXPECT_EQ(p2.slices(2).end(), kTotal);
  status = engine_->Status();
  const double share2 = FindWorker(status, ids[2])->slice_share();
  EXPECT_NEAR(share2, owned(p2, 2) / static_cast<double>(kTotal), 1e-9);
  // Its link recovers: the reports of round 2 change round 3's plan, not
  // round 2's (the status still shows round 2's slices until then).
  for (size_t i = 0; i + 1 < ids.size(); ++i) {
    v1::ReportRoundDoneRequest request;
    request.set_worker_id(ids[i]);
    request.set_round(2);
    request.set_model_hash(Hash('c'));
    v1::PeerRead* r = request.add_peer_reads();
    r->set_worker_id(ids[2]);
    r->set_bytes(400);
    r->set_seconds(0.04);
    Directives out;
    ASSERT_TRUE(engine_->ReportRoundDone(request, &out).ok());
    EXPECT_THAT(To(out, kPlan), IsEmpty());
  }
  EXPECT_DOUBLE_EQ(FindWorker(engine_->Status(), ids[2])->slice_share(), share2);
  EXPECT_DOUBLE_EQ(FindWorker(engine_->Status(), ids[2])->exchange_rate_bytes_per_second(), 2000);
  DoneOk(ids[2], 2, Hash('c'));
  EXPECT_EQ(engine_->last_completed_round(), 2u);
  // 0.5 * (2 readers * 10000 B/s) + 0.5 * 2000.
  EXPECT_DOUBLE_EQ(FindWorker(engine_->Status(), ids[2])->exchange_rate_bytes_per_second(), 11000);
  const v1::RoundPlan p3 = MessageFor(AllReady(ids, 3), ids[0], kPlan).round_plan();
  ASSERT_EQ(p3.slices_size(), 3);
  EXPECT_GT(owned(p3, 2), owned(p2, 2));
}

// ---------------------------------------------------------------- Ready barrier

TEST_F(RoundEngineTest, PlanIsSentOnlyWhenEveryParticipantIsReady) {
  Start(3);
  const std::vector<std::string> ids = StartRoundOne(3);

  EXPECT_THAT(ReadyOk(ids[0], 1), IsEmpty());
  RunStatus status = engine_->Status();
  EXPECT_EQ(status.phase(), v1::TRAINING);
  EXPECT_EQ(FindWorker(status, ids[0])->state(), "ready");
  EXPECT_THAT(status.detail(), HasSubstr("1/3"));
  EXPECT_THAT(ReadyOk(ids[1], 1), IsEmpty());
  EXPECT_THAT(ReadyOk(ids[0], 1), IsEmpty());  // retried

  const Directives out = ReadyOk(ids[2], 1);
  EXPECT_THAT(To(out, kPlan), ElementsAre(ids[0], ids[1], ids[2]));
  EXPECT_EQ(out.size(), 3u);
  for (const std::string& id : ids) {
    const v1::RoundPlan plan = MessageFor(out, id, kPlan).round_plan();
    EXPECT_EQ(plan.round(), 1u);
    EXPECT_EQ(plan.attempt(), 1u);
    EXPECT_EQ(plan.total_elements(), kTotal);
    ASSERT_EQ(plan.slices_size(), 3);
    uint64_t next = 0;
    for (int k = 0; k < plan.slices_size(); ++k) {
      const v1::SliceAssignment& s = plan.slices(k);
      EXPECT_EQ(s.worker_id(), ids[k]);
      EXPECT_EQ(s.peer_address(), Address(9001 + k));
      EXPECT_EQ(s.begin(), next);
      EXPECT_GT(s.end(), s.begin());
      next = s.end();
    }
    EXPECT_EQ(next, kTotal);
  }
  status = engine_->Status();
  EXPECT_EQ(status.phase(), v1::SHARING);
  for (const WorkerStatus& w : status.workers()) EXPECT_EQ(w.state(), "sharing");
  // A retried ready report during sharing is accepted and changes nothing.
  EXPECT_THAT(ReadyOk(ids[0], 1), IsEmpty());
  EXPECT_EQ(engine_->Status().phase(), v1::SHARING);
}

// ---------------------------------------------------------------- Round end

TEST_F(RoundEngineTest, AgreeingHashesCompleteRoundAndNextStartsWithSameParticipants) {
  Start(3);
  const std::vector<std::string> ids = StartRoundOne(3);
  AllReady(ids, 1);

  EXPECT_THAT(DoneOk(ids[0], 1, Hash('a')), IsEmpty());
  EXPECT_THAT(DoneOk(ids[1], 1, Hash('a')), IsEmpty());
  EXPECT_THAT(engine_->Status().detail(), HasSubstr("2/3"));
  EXPECT_EQ(engine_->last_completed_round(), 0u);

  const Directives out = DoneOk(ids[2], 1, Hash('a'));
  EXPECT_THAT(To(out, kComplete), ElementsAre(ids[0], ids[1], ids[2]));
  EXPECT_THAT(To(out, kStart), ElementsAre(ids[0], ids[1], ids[2]));
  for (const std::string& id : ids) {
    EXPECT_EQ(MessageFor(out, id, kComplete).round_complete().round(), 1u);
    EXPECT_EQ(MessageFor(out, id, kComplete).round_complete().model_hash(), Hash('a'));
    EXPECT_EQ(MessageFor(out, id, kStart).round_start().round(), 2u);
    EXPECT_EQ(MessageFor(out, id, kStart).round_start().base_model_round(), 1u);
  }
  EXPECT_EQ(engine_->last_completed_round(), 1u);
  const RunStatus status = engine_->Status();
  EXPECT_EQ(status.phase(), v1::TRAINING);
  EXPECT_EQ(status.round(), 2u);
  EXPECT_EQ(status.model_hash(), Hash('a'));
  EXPECT_THAT(Participants(status), ElementsAre(ids[0], ids[1], ids[2]));

  // A retried report for the completed round is accepted.
  EXPECT_THAT(DoneOk(ids[0], 1, Hash('a')), IsEmpty());

  // Round 2 runs the same way.
  AllReady(ids, 2);
  const Directives out2 = AllDone(ids, 2, Hash('b'));
  EXPECT_THAT(To(out2, kComplete), ElementsAre(ids[0], ids[1], ids[2]));
  EXPECT_EQ(engine_->last_completed_round(), 2u);
  EXPECT_EQ(engine_->Status().round(), 3u);
}

TEST_F(RoundEngineTest, HashDisagreementEvictsMinority) {
  Start(2);
  const std::vector<std::string> ids = StartRoundOne(2);
  const std::string w3 = AddMember(9003);
  JoinRoundOk(w3, 1, 1);  // nobody ready yet: joins round 1
  AllReady({ids[0], ids[1], w3}, 1);

  DoneOk(ids[0], 1, Hash('a'));
  DoneOk(ids[1], 1, Hash('b'));
  const Directives out = DoneOk(w3, 1, Hash('a'));
  EXPECT_THAT(To(out, kComplete), ElementsAre(ids[0], w3));
  EXPECT_THAT(To(out, kLeave), ElementsAre(ids[1]));
  EXPECT_THAT(MessageFor(out, ids[1], kLeave).leave_requested().reason(), HasSubstr("hash"));
  EXPECT_EQ(MessageFor(out, w3, kComplete).round_complete().model_hash(), Hash('a'));
  EXPECT_THAT(To(out, kStart), ElementsAre(ids[0], w3));

  const RunStatus status = engine_->Status();
  EXPECT_EQ(status.last_completed_round(), 1u);
  EXPECT_EQ(status.model_hash(), Hash('a'));
  EXPECT_EQ(status.members(), 2u);
  const auto evicted = FindWorker(status, ids[1]);
  ASSERT_TRUE(evicted.has_value());
  EXPECT_EQ(evicted->state(), "evicted");
  EXPECT_THAT(evicted->reason(), HasSubstr("hash"));
  // The round removed it (an intent the engine carried out): what the
  // round and its figures showed of it stays in the status.
  EXPECT_EQ(evicted->model_hash(), Hash('b'));
  EXPECT_EQ(evicted->model_round(), 1u);
  EXPECT_DOUBLE_EQ(evicted->train_loss(), 0.5);
  EXPECT_EQ(evicted->address(), "127.0.0.1:9002");
  ASSERT_EQ(status.recent_rounds_size(), 1);
  EXPECT_EQ(status.recent_rounds(0).model_hash(), Hash('a'));
  EXPECT_EQ(status.recent_rounds(0).participants(), 2u);
  EXPECT_THAT(Participants(status), ElementsAre(ids[0], w3));
  EXPECT_EQ(engine_->Heartbeat(ids[1]).code(), absl::StatusCode::kNotFound);
}

TEST_F(RoundEngineTest, RoundsLimitFinishesRun) {
  Start(2, /*rounds=*/2);
  const std::vector<std::string> ids = StartRoundOne(2);
  AllReady(ids, 1);
  const std::string w3 = AddMember(9003);  // queued for round 2
  JoinRoundOk(w3, 1, 2);
  const std::string w4 = AddMember(9004);  // a member that never asks for a round
  AllDone(ids, 1, Hash('a'));
  EXPECT_EQ(engine_->Status().phase(), v1::TRAINING);
  EXPECT_THAT(Participants(engine_->Status()), ElementsAre(ids[0], ids[1], w3));
  EXPECT_FALSE(engine_->finished());

  const std::vector<std::string> all = {ids[0], ids[1], w3};
  AllReady(all, 2);
  const Directives out = AllDone(all, 2, Hash('b'));
  EXPECT_THAT(To(out, kComplete), ElementsAre(ids[0], ids[1], w3));
  EXPECT_THAT(To(out, kFinished), UnorderedElementsAre(ids[0], ids[1], w3, w4));
  EXPECT_THAT(To(out, kStart), IsEmpty());
  EXPECT_EQ(MessageFor(out, w4, kFinished).run_finished().last_round(), 2u);
  EXPECT_THAT(MessageFor(out, w4, kFinished).run_finished().reason(), HasSubstr("2 rounds"));

  EXPECT_TRUE(engine_->finished());
  const RunStatus status = engine_->Status();
  EXPECT_EQ(status.phase(), v1::FINISHED);
  EXPECT_EQ(status.last_completed_round(), 2u);
  EXPECT_THAT(status.detail(), HasSubstr("finished"));

  EXPECT_EQ(Join(9009).status().code(), absl::StatusCode::kFailedPrecondition);
  Directives ignored;
  EXPECT_EQ(engine_->JoinRound(ids[0], 3, &ignored).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A retried report for the last round is still accepted.
  EXPECT_THAT(DoneOk(ids[0], 2, Hash('b')), IsEmpty());

  // Every worker's session ends now: each shows as finished, not lost.
  engine_->Disconnect(ids[0], "session stream closed", RoundEngine::SessionEnd::kBroken);
  engine_->Disconnect(w4, "worker shut down", RoundEngine::SessionEnd::kLeave);
  EXPECT_EQ(FindWorker(engine_->Status(), ids[0])->state(), "finished");
  EXPECT_EQ(FindWorker(engine_->Status(), w4)->state(), "finished");
}

// ---------------------------------------------------------------- Bad input

TEST_F(RoundEngineTest, UnknownWorkerIdIsNotFound) {
  Start(2);
  const std::vector<std::string> ids = StartRoundOne(2);
  Directives out;

  EXPECT_EQ(engine_->JoinRound("w99", 1, &out).status().code(), absl::StatusCode::kNotFound);
  JoinRoundOk(ids[0], 1, 1);

  EXPECT_EQ(Ready("w99", 1, kTotal, &out).code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(ReadyOk(ids[0], 1), IsEmpty());

  EXPECT_EQ(engine_->Heartbeat("w99").code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(engine_->Heartbeat(ids[0]).ok());

  EXPECT_EQ(engine_->Connect("w99").code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(engine_->Connect(ids[0]).ok());

  EXPECT_THAT(To(ReadyOk(ids[1], 1), kPlan), ElementsAre(ids[0], ids[1]));
  v1::ConnectionsReadyRequest connected;
  connected.set_worker_id("w99");
  connected.set_round(1);
  connected.set_attempt(1);
  EXPECT_EQ(engine_->ConnectionsReady(connected, &out).code(), absl::StatusCode::kNotFound);
  AllConnected(1);
  EXPECT_EQ(Done("w99", 1, Hash('a'), &out).code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(out, IsEmpty());
  DoneOk(ids[0], 1, Hash('a'));
  EXPECT_THAT(To(DoneOk(ids[1], 1, Hash('a')), kComplete), ElementsAre(ids[0], ids[1]));

  // Unknown ids leaving or expiring change nothing.
  EXPECT_THAT(engine_->Disconnect("w99", "gone"), IsEmpty());
  EXPECT_EQ(engine_->Status().members(), 2u);
}

TEST_F(RoundEngineTest, StaleAndFutureRoundsAreFailedPrecondition) {
  Start(2);
  const std::vector<std::string> ids = StartRoundOne(2);
  AllReady(ids, 1);
  AllDone(ids, 1, Hash('a'));
  ASSERT_EQ(engine_->Status().round(), 2u);
  const std::string w3 = AddMember(9003);
  Directives out;

  EXPECT_EQ(engine_->JoinRound(w3, 1, &out).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine_->JoinRound(w3, 4, &out).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(out, IsEmpty());
  EXPECT_THAT(To(JoinRoundOk(w3, 2, 2), kStart), ElementsAre(w3));

  EXPECT_EQ(Ready(ids[0], 1, kTotal, &out).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Ready(ids[0], 3, kTotal, &out).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(out, IsEmpty());
  ReadyOk(ids[0], 2);

  // Done reports before sharing, for a round the worker did not finish, or
  // for a future round.
  EXPECT_EQ(Done(ids[0], 2, Hash('b'), &out).code(), absl::StatusCode::kFailedPrecondition);
  ReadyOk(ids[1], 2);
  ReadyOk(w3, 2);
  EXPECT_EQ(Done(w3, 1, Hash('a'), &out).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Done(ids[0], 3, Hash('b'), &out).code(), absl::StatusCode::kFailedPrecondition);
  // The plan is out but the connection barrier is not passed yet.
  EXPECT_EQ(Done(ids[0], 2, Hash('b'), &out).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(out, IsEmpty());
  AllConnected(2);
  const Directives done = AllDone({ids[0], ids[1], w3}, 2, Hash('b'));
  EXPECT_THAT(To(done, kComplete), ElementsAre(ids[0], ids[1], w3));
}

TEST_F(RoundEngineTest, NonParticipantReportsAreFailedPrecondition) {
  Start(2);
  const std::string w1 = AddMember(9001);
  const std::string w2 = AddMember(9002);
  const std::string w3 = AddMember(9003);
  Directives out;

  // Before round 1 starts nobody is a participant.
  JoinRoundOk(w1, 1, 1);
  EXPECT_EQ(Ready(w1, 1, kTotal, &out).code(), absl::StatusCode::kFailedPrecondition);
  JoinRoundOk(w2, 1, 1);
  ReadyOk(w1, 1);

  // w3 is queued for round 2.
  JoinRoundOk(w3, 1, 2);
  EXPECT_EQ(Ready(w3, 1, kTotal, &out).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(out, IsEmpty());
  EXPECT_THAT(To(ReadyOk(w2, 1), kPlan), ElementsAre(w1, w2));
  v1::ConnectionsReadyRequest connected;
  connected.set_worker_id(w3);
  connected.set_round(1);
  connected.set_attempt(1);
  EXPECT_EQ(engine_->ConnectionsReady(connected, &out).code(),
            absl::StatusCode::kFailedPrecondition);
  AllConnected(1);
  EXPECT_EQ(Done(w3, 1, Hash('a'), &out).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(out, IsEmpty());
  DoneOk(w1, 1, Hash('a'));
  EXPECT_THAT(To(DoneOk(w2, 1, Hash('a')), kComplete), ElementsAre(w1, w2));
}

TEST_F(RoundEngineTest, BadTotalElementsIsInvalidArgument) {
  Start(2);
  const std::vector<std::string> ids = StartRoundOne(2);
  Directives out;

  EXPECT_EQ(Ready(ids[0], 1, 0, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FindWorker(engine_->Status(), ids[0])->state(), "training");
  ReadyOk(ids[0], 1);
  EXPECT_EQ(Ready(ids[1], 1, kTotal - 1, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Ready(ids[1], 1, kTotal + 1, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out, IsEmpty());
  EXPECT_EQ(engine_->Status().phase(), v1::TRAINING);

  const Directives plan = ReadyOk(ids[1], 1);
  EXPECT_EQ(MessageFor(plan, ids[1], kPlan).round_plan().total_elements(), kTotal);
}

TEST_F(RoundEngineTest, MalformedModelHashIsInvalidArgument) {
  Start(2);
  const std::vector<std::string> ids = StartRoundOne(2);
  AllReady(ids, 1);
  Directives out;

  std::string upper = Hash('a');
  upper[10] = 'A';
  for (const std::string& bad :
       {std::string(), std::string("abc"), Hash('g'), upper, std::string(63, 'a'),
        std::string(65, 'a'), std::string(32, 'a') + std::string(32, ' ')}) {
    EXPECT_EQ(Done(ids[0], 1, bad, &out).code(), absl::StatusCode::kInvalidArgument)
        << "hash '" << bad << "'";
  }
  EXPECT_THAT(out, IsEmpty());
  EXPECT_EQ(FindWorker(engine_->Status(), ids[0])->model_round(), 0u);

  DoneOk(ids[0], 1, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef");
  const Directives done =
      DoneOk(ids[1], 1, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef");
  EXPECT_THAT(To(done, kComplete), ElementsAre(ids[0], ids[1]));
}

// ---------------------------------------------------------------- Leaving

TEST_F(RoundEngineTest, DisconnectDuringTrainingLetsRoundGoOn) {
  Start(3);
  const std::vector<std::string> ids = StartRoundOne(3);
  ReadyOk(ids[0], 1);
  ReadyOk(ids[1], 1);

  const Directives out = engine_->Disconnect(ids[2], "worker stopped");
  EXPECT_THAT(To(out, kPlan), ElementsAre(ids[0], ids[1]));
  EXPECT_EQ(out.size(), 2u);
  const v1::RoundPlan plan = MessageFor(out, ids[0], kPlan).round_plan();
  ASSERT_EQ(plan.slices_size(), 2);
  EXPECT_EQ(plan.slices(0).begin(), 0u);
  EXPECT_EQ(plan.slices(0).end(), plan.slices(1).begin());
  EXPECT_EQ(plan.slices(1).end(), kTotal);
  EXPECT_EQ(plan.slices(1).worker_id(), ids[1]);

  RunStatus status = engine_->Status();
  EXPECT_EQ(status.phase(), v1::SHARING);
  EXPECT_EQ(status.members(), 2u);
  EXPECT_EQ(FindWorker(status, ids[2])->state(), "left");
  EXPECT_EQ(FindWorker(status, ids[2])->reason(), "worker stopped");
  EXPECT_EQ(engine_->Heartbeat(ids[2]).code(), absl::StatusCode::kNotFound);

  // The round completes with two; round 2 then needs a third participant.
  EXPECT_THAT(To(AllConnected(1), kStartSharing), ElementsAre(ids[0], ids[1]));
  const Directives done = AllDone({ids[0], ids[1]}, 1, Hash('c'));
  EXPECT_THAT(To(done, kComplete), ElementsAre(ids[0], ids[1]));
  EXPECT_THAT(To(done, kStart), IsEmpty());
  status = engine_->Status();
  EXPECT_EQ(status.phase(), v1::WAITING_FOR_MEMBERS);
  EXPECT_EQ(status.round(), 2u);
  EXPECT_EQ(status.last_completed_round(), 1u);

  const std::string w4 = AddMember(9004);
  EXPECT_THAT(To(JoinRoundOk(w4, 2, 2), kStart), ElementsAre(ids[0], ids[1], w4));
}

TEST_F(RoundEngineTest, DisconnectOfUnreadyParticipantSendsPlan) {
  Start(2);
  const std::vector<std::string> ids = StartRoundOne(2);
  EXPECT_THAT(engine_->Disconnect(ids[0], "bye"), IsEmpty());  // nobody ready yet
  EXPECT_EQ(engine_->Status().phase(), v1::TRAINING);
  const Directives plan = ReadyOk(ids[1], 1);
  EXPECT_THAT(To(plan, kPlan), ElementsAre(ids[1]));
  const v1::RoundPlan p = MessageFor(plan, ids[1], kPlan).round_plan();
  ASSERT_EQ(p.slices_size(), 1);
  EXPECT_EQ(p.slices(0).begin(), 0u);
  EXPECT_EQ(p.slices(0).end(), kTotal);
}

TEST_F(RoundEngineTest, DisconnectDuringSharingReplansWithSurvivors) {
  Start(2);
  const std::vector<std::string> ids = StartRoundOne(2);
  const std::string w3 = AddMember(9003);
  JoinRoundOk(w3, 1, 1);
  AllReady({ids[0], ids[1], w3}, 1);
  DoneOk(ids[0], 1, Hash('a'));

  // The survivors exchange again, same round, with a new plan (attempt 2);
  // nothing is aborted and no round restarts.
  const Directives out = engine_->Disconnect(w3, "crashed");
  EXPECT_THAT(To(out, kPlan), ElementsAre(ids[0], ids[1]));
  EXPECT_THAT(To(out, kAborted), IsEmpty());
  EXPECT_THAT(To(out, kStart), IsEmpty());
  ASSERT_EQ(out.size(), 2u);
  for (const std::string& id : ids) {
    const v1::RoundPlan plan = MessageFor(out, id, kPlan).round_plan();
    EXPECT_EQ(plan.round(), 1u);
    EXPECT_EQ(plan.attempt(), 2u);
    ASSERT_EQ(plan.slices_size(), 2);
    EXPECT_EQ(plan.slices(0).worker_id(), ids[0]);
    EXPECT_EQ(plan.slices(1).worker_id(), ids[1]);
    EXPECT_EQ(plan.slices(0).begin(), 0u);
    EXPECT_EQ(plan.slices(1).end(), kTotal);
  }

  RunStatus status = engine_->Status();
  EXPECT_EQ(status.phase(), v1::SHARING);
  EXPECT_EQ(status.round(), 1u);
  EXPECT_EQ(status.attempt(), 2u);
  EXPECT_EQ(status.last_completed_round(), 0u);
  EXPECT_THAT(Participants(status), ElementsAre(ids[0], ids[1]));
  EXPECT_EQ(FindWorker(status, w3)->state(), "left");

  // The done report of the previous attempt does not count, and the new
  // attempt waits for its own connection barrier.
  Directives ignored;
  EXPECT_EQ(Done(ids[1], 1, Hash('d'), &ignored).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(To(AllConnected(1), kStartSharing), ElementsAre(ids[0], ids[1]));
  EXPECT_THAT(DoneOk(ids[0], 1, Hash('d')), IsEmpty());
  EXPECT_THAT(To(DoneOk(ids[1], 1, Hash('d')), kComplete), ElementsAre(ids[0], ids[1]));
  EXPECT_EQ(engine_->last_completed_round(), 1u);
  EXPECT_EQ(engine_->Status().model_hash(), Hash('d'));
}

TEST_F(RoundEngineTest, AbortWithTooFewSurvivorsWaitsForMembers) {
  Start(3);
  const std::vector<std::string> ids = StartRoundOne(3);
  AllReady(ids, 1);

  // Losing a participant re-plans with the two survivors, below the minimum.
  const Directives out = engine_->Disconnect(ids[1], "crashed");
  EXPECT_THAT(To(out, kPlan), ElementsAre(ids[0], ids[2]));
  EXPECT_THAT(To(out, kAborted), IsEmpty());
  EXPECT_EQ(engine_->Status().phase(), v1::SHARING);
  AllConnected(1);

  // Nobody finishes the exchange in time: the round is aborted, and the two
  // survivors are too few to restart it.
  const Directives aborted = Pass(absl::Seconds(120), {ids[0], ids[2]});
  EXPECT_THAT(To(aborted, kAborted), ElementsAre(ids[0], ids[2]));
  EXPECT_THAT(To(aborted, kStart), IsEmpty());
  EXPECT_EQ(engine_->Status().phase(), v1::WAITING_FOR_MEMBERS);
  EXPECT_EQ(engine_->Status().round(), 1u);

  const std::string w4 = AddMember(9004);
  const Directives start = JoinRoundOk(w4, 1, 1);
  EXPECT_THAT(To(start, kStart), ElementsAre(ids[0], ids[2], w4));
  EXPECT_EQ(MessageFor(start, w4, kStart).round_start().round(), 1u);
}

TEST_F(RoundEngineTest, LastParticipantLostDuringSharingAbortsRound) {
  Start(2);
  const std::vector<std::string> ids = StartRoundOne(2);
  AllReady(ids, 1);
  EXPECT_THAT(To(engine_->Disconnect(ids[0], "crashed"), kPlan), ElementsAre(ids[1]));
  // No survivor: nobody to tell, the round waits for members again.
  EXPECT_THAT(engine_->Disconnect(ids[1], "crashed"), IsEmpty());
  const RunStatus status = engine_->Status();
  EXPECT_EQ(status.phase(), v1::WAITING_FOR_MEMBERS);
  EXPECT_EQ(status.round(), 1u);
  EXPECT_EQ(status.last_completed_round(), 0u);
  EXPECT_THAT(Participants(status), IsEmpty());
}

// ---------------------------------------------------------------- Leases

TEST_F(RoundEngineTest, SilentConnectedMemberIsLostByTick) {
  Start(2);
  const std::string w1 = AddMember(9001);
  const std::string w2 = AddMember(9002);

  clock_.Advance(absl::Seconds(6));
  ASSERT_TRUE(engine_->Heartbeat(w1).ok());
  clock_.Advance(absl::Seconds(4));  // w2 silent for exactly the lease
  EXPECT_THAT(engine_->Tick(), IsEmpty());
  EXPECT_EQ(engine_->Status().members(), 2u);

  clock_.Advance(absl::Seconds(1));
  engine_->Tick();
  RunStatus status = engine_->Status();
  EXPECT_EQ(status.members(), 1u);
  EXPECT_EQ(FindWorker(status, w2)->state(), "lost");  // its lease expired
  EXPECT_THAT(FindWorker(status, w2)->reason(), HasSubstr("heartbeat"));
  EXPECT_EQ(FindWorker(status, w1)->state(), "waiting");
  EXPECT_EQ(FindWorker(status, w1)->last_seen_ms_ago(), 5000);
  EXPECT_EQ(engine_->Heartbeat(w2).code(), absl::StatusCode::kNotFound);

  // A member that keeps heartbeating stays.
  for (int i = 0; i < 10; ++i) {
    clock_.Advance(absl::Seconds(5));
    ASSERT_TRUE(engine_->Heartbeat(w1).ok());
    engine_->Tick();
  }
  EXPECT_EQ(FindWorker(engine_->Status(), w1)->state(), "waiting");
}

TEST_F(RoundEngineTest, LeaseExpiryDuringSharingReplans) {
  Start(2);
  // Round 1 starts with two; the third joins it before anyone is ready.
  const std::vector<std::string> ids = StartRoundOne(3);
  AllReady(ids, 1);
  clock_.Advance(absl::Seconds(8));
  ASSERT_TRUE(engine_->Heartbeat(ids[0]).ok());
  ASSERT_TRUE(engine_->Heartbeat(ids[1]).ok());
  clock_.Advance(absl::Seconds(3));  // ids[2] silent for 11 s

  const Directives out = engine_->Tick();
  EXPECT_THAT(To(out, kPlan), ElementsAre(ids[0], ids[1]));
  EXPECT_EQ(MessageFor(out, ids[0], kPlan).round_plan().attempt(), 2u);
  EXPECT_EQ(MessageFor(out, ids[0], kPlan).round_plan().round(), 1u);
  EXPECT_THAT(To(out, kAborted), IsEmpty());
  EXPECT_THAT(To(out, kStart), IsEmpty());
  EXPECT_EQ(FindWorker(engine_->Status(), ids[2])->state(), "lost");  // its lease expired

  AllConnected(1);
  const Directives done = AllDone({ids[0], ids[1]}, 1, Hash('a'));
  EXPECT_THAT(To(done, kComplete), ElementsAre(ids[0], ids[1]));
}

TEST_F(RoundEngineTest, MemberWithoutSessionIsRemovedAfterGrace) {
  Start(2);
  const std::string w1 = AddMember(9001);
  absl::StatusOr<JoinResult> joined = Join(9002);  // never opens a session
  ASSERT_TRUE(joined.ok());
  const std::string w2 = joined->response.worker_id();

  clock_.Advance(absl::Seconds(5));
  ASSERT_TRUE(engine_->Heartbeat(w1).ok());
  EXPECT_THAT(engine_->Tick(), IsEmpty());
  clock_.Advance(absl::Seconds(5));  // exactly the grace
  engine_->Tick();
  EXPECT_EQ(engine_->Status().members(), 2u);

  clock_.Advance(absl::Milliseconds(1));
  engine_->Tick();
  const RunStatus status = engine_->Status();
  EXPECT_EQ(status.members(), 1u);
  EXPECT_EQ(FindWorker(status, w2)->state(), "lost");  // its lease expired
  EXPECT_THAT(FindWorker(status, w2)->reason(), HasSubstr("session"));
  EXPECT_EQ(FindWorker(status, w1)->state(), "waiting");
}

// ---------------------------------------------------------------- Status

TEST_F(RoundEngineTest, StatusDescribesRunWorkersAndRounds) {
  Start(2);
  RunStatus status = engine_->Status();
  EXPECT_EQ(status.run_id(), "run-test");
  EXPECT_EQ(status.phase(), v1::WAITING_FOR_MEMBERS);
  EXPECT_EQ(status.round(), 1u);
  EXPECT_EQ(status.last_completed_round(), 0u);
  EXPECT_EQ(status.min_participants(), 2u);
  EXPECT_EQ(status.members(), 0u);
  EXPECT_EQ(status.config().model().name(), "mlp");
  EXPECT_EQ(status.started_unix_ms(), absl::ToUnixMillis(clock_.Now()));
  EXPECT_THAT(status.workers(), IsEmpty());
  EXPECT_THAT(status.recent_rounds(), IsEmpty());

  const std::vector<std::string> ids = StartRoundOne(2);
  clock_.Advance(absl::Seconds(2));
  ReadyOk(ids[0], 1, /*loss=*/1.0);
  ReadyOk(ids[1], 1, /*loss=*/3.0);
  AllConnected(1);
  clock_.Advance(absl::Seconds(1));
  v1::Metrics metrics;
  metrics.set_evaluated(true);
  metrics.set_test_accuracy(0.8);
  metrics.set_test_loss(0.5);
  Directives out;
  ASSERT_TRUE(Done(ids[0], 1, Hash('e'), &out, metrics, /*exchange_seconds=*/0.2).ok());
  ASSERT_TRUE(Done(ids[1], 1, Hash('e'), &out, {}, /*exchange_seconds=*/0.4).ok());

  status = engine_->Status();
  EXPECT_EQ(status.phase(), v1::TRAINING);
  EXPECT_EQ(status.round(), 2u);
  EXPECT_EQ(status.last_completed_round(), 1u);
  EXPECT_EQ(status.model_hash(), Hash('e'));
  EXPECT_EQ(status.members(), 2u);
  ASSERT_EQ(status.workers_size(), 2);

  const WorkerStatus w1 = *FindWorker(status, ids[0]);
  EXPECT_EQ(w1.address(), Address(9001));
  EXPECT_EQ(w1.state(), "training");
  EXPECT_EQ(w1.model_hash(), Hash('e'));
  EXPECT_EQ(w1.model_round(), 1u);
  EXPECT_DOUBLE_EQ(w1.test_accuracy(), 0.8);
  EXPECT_DOUBLE_EQ(w1.test_loss(), 0.5);
  EXPECT_EQ(w1.metrics_round(), 1u);
  EXPECT_DOUBLE_EQ(w1.train_loss(), 1.0);
  EXPECT_EQ(w1.data_rank(), 0u);
  EXPECT_EQ(w1.rounds_completed(), 1u);
  EXPECT_EQ(w1.last_seen_ms_ago(), 0);
  EXPECT_EQ(w1.reason(), "");

  const WorkerStatus w2 = *FindWorker(status, ids[1]);
  EXPECT_EQ(w2.address(), Address(9002));
  EXPECT_EQ(w2.data_rank(), 1u);
  EXPECT_EQ(w2.model_round(), 1u);
  EXPECT_EQ(w2.metrics_round(), 0u);  // did not evaluate
  EXPECT_DOUBLE_EQ(w2.test_accuracy(), 0.0);

  ASSERT_EQ(status.recent_rounds_size(), 1);
  const v1::RoundSummary& r1 = status.recent_rounds(0);
  EXPECT_EQ(r1.round(), 1u);
  EXPECT_EQ(r1.participants(), 2u);
  EXPECT_DOUBLE_EQ(r1.seconds(), 3.0);
  EXPECT_DOUBLE_EQ(r1.train_loss(), 2.0);
  EXPECT_TRUE(r1.evaluated());
  EXPECT_DOUBLE_EQ(r1.test_accuracy(), 0.8);
  EXPECT_DOUBLE_EQ(r1.test_loss(), 0.5);
  EXPECT_EQ(r1.model_hash(), Hash('e'));
  EXPECT_DOUBLE_EQ(r1.exchange_seconds(), 0.3);

  // Round 2 without evaluation carries the latest test metrics forward.
  AllReady(ids, 2);
  AllDone(ids, 2, Hash('f'));
  status = engine_->Status();
  ASSERT_EQ(status.recent_rounds_size(), 2);
  const v1::RoundSummary& r2 = status.recent_rounds(1);
  EXPECT_EQ(r2.round(), 2u);
  EXPECT_FALSE(r2.evaluated());
  EXPECT_DOUBLE_EQ(r2.test_accuracy(), 0.8);
  EXPECT_EQ(r2.model_hash(), Hash('f'));
  EXPECT_EQ(FindWorker(status, ids[0])->rounds_completed(), 2u);
  EXPECT_EQ(FindWorker(status, ids[0])->metrics_round(), 1u);
}

TEST_F(RoundEngineTest, DepartedMembersShownUpToLimit) {
  Start(1, 0, /*max_departed_shown=*/2);
  for (int i = 0; i < 5; ++i) {
    const std::string id = AddMember(9001 + i);
    engine_->Disconnect(id, absl::StrCat("leave ", i));
  }
  const RunStatus status = engine_->Status();
  ASSERT_EQ(status.workers_size(), 2);
  EXPECT_EQ(status.workers(0).id(), "w4");
  EXPECT_EQ(status.workers(1).id(), "w5");
}

// The departed the status no longer lists are counted (issue 50): the
// status's size does not grow with the members that left.
TEST_F(RoundEngineTest, DepartedNotShownAreCounted) {
  Start(1, 0, /*max_departed_shown=*/2);
  for (int i = 0; i < 5; ++i) engine_->Disconnect(AddMember(9001 + i), "bye");
  const RunStatus status = engine_->Status();
  EXPECT_EQ(status.workers_size(), 2);
  EXPECT_EQ(status.departed_not_shown(), 3u);
}

// Joins never followed by a session are capped (--max_pending_joins): past
// the cap a new worker is UNAVAILABLE (it retries), a member re-joining
// under its id is not refused, and a slot frees when a pending member opens
// its session or session_grace removes it.
TEST_F(RoundEngineTest, PendingJoinsAreCapped) {
  max_pending_joins_ = 3;
  Start(1);
  std::vector<std::string> pending;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<JoinResult> joined = Join(9100 + i);
    ASSERT_TRUE(joined.ok()) << joined.status();
    pending.push_back(joined->response.worker_id());
  }
  EXPECT_EQ(engine_->Status().pending_joins(), 3u);
  absl::StatusOr<JoinResult> refused = Join(9200);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.status().message(), HasSubstr("--max_pending_joins=3"));
  // A pending member re-joining under its id is not new.
  EXPECT_TRUE(Join(9100, pending[0]).ok());
  // One opens its session: a slot frees.
  ASSERT_TRUE(engine_->Connect(pending[1]).ok());
  EXPECT_EQ(engine_->Status().pending_joins(), 2u);
  EXPECT_TRUE(Join(9201).ok());
  EXPECT_EQ(Join(9202).status().code(), absl::StatusCode::kUnavailable);
  // The grace runs out for those that never opened one: all slots free.
  clock_.Advance(absl::Seconds(11));
  engine_->Tick();
  EXPECT_EQ(engine_->Status().pending_joins(), 0u);
  EXPECT_TRUE(Join(9203).ok());
}

// Members evicted for a hash mismatch count against max_departed_shown too.
TEST_F(RoundEngineTest, HashEvictionRespectsMaxDepartedShown) {
  Start(2, 0, /*max_departed_shown=*/1);
  const std::vector<std::string> ids = StartRoundOne(2);
  const std::string w3 = AddMember(9003);
  const std::string w4 = AddMember(9004);
  JoinRoundOk(w3, 1, 1);
  JoinRoundOk(w4, 1, 1);
  engine_->Disconnect(w4, "left");  // departed: w4
  AllReady({ids[0], ids[1], w3}, 1);
  DoneOk(ids[0], 1, Hash('a'));
  DoneOk(ids[1], 1, Hash('a'));
  DoneOk(w3, 1, Hash('b'));  // evicted: departed would be w4, w3

  const RunStatus status = engine_->Status();
  int departed = 0;
  for (const WorkerStatus& w : status.workers()) {
    if (DepartedState(w.state())) ++departed;
  }
  EXPECT_LE(departed, 1);
  EXPECT_EQ(FindWorker(status, w3)->state(), "evicted");  // the newest stays
}

TEST_F(RoundEngineTest, HashTieWithoutMajorityAbortsTheRound) {
  Start(2, 0);
  const std::vector<std::string> ids = StartRoundOne(2);
  AllReady(ids, 1);
  DoneOk(ids[0], 1, Hash('a'));
  Directives out;
  shoal::v1::ReportRoundDoneRequest done;
  done.set_worker_id(ids[1]);
  done.set_round(1);
  done.set_model_hash(Hash('b'));
  ASSERT_TRUE(engine_->ReportRoundDone(done, &out).ok());

  // Nobody is evicted: both roll back and round 1 runs again.
  int aborted = 0, restarted = 0;
  for (const Directive& d : out) {
    aborted += d.message->has_round_aborted();
    restarted += d.message->has_round_start() && d.message->round_start().round() == 1;
  }
  EXPECT_EQ(aborted, 2);
  EXPECT_EQ(restarted, 2);
  const RunStatus status = engine_->Status();
  EXPECT_EQ(status.last_completed_round(), 0u);
  EXPECT_EQ(status.members(), 2u);
  for (const WorkerStatus& w : status.workers()) EXPECT_EQ(w.model_round(), 0u) << w.id();
}

// The cache behind GetRunStatus: good for one version, for max_age.
TEST(VersionedCacheTest, ServesTheValueOfItsVersionUntilItIsTooOld) {
  const absl::Time t0 = absl::FromUnixSeconds(1'700'000'000);
  VersionedCache<std::string> cache(absl::Milliseconds(100));
  EXPECT_EQ(cache.Get(1, t0), nullptr);  // nothing built yet
  EXPECT_EQ(cache.Put(7, t0, "seven"), "seven");
  ASSERT_NE(cache.Get(7, t0), nullptr);
  EXPECT_EQ(*cache.Get(7, t0), "seven");
  EXPECT_NE(cache.Get(7, t0 + absl::Milliseconds(100)), nullptr);
  EXPECT_EQ(cache.Get(7, t0 + absl::Milliseconds(101)), nullptr);  // too old
  EXPECT_EQ(cache.Get(8, t0), nullptr);                            // source changed
  EXPECT_EQ(cache.Get(7, t0 - absl::Milliseconds(1)), nullptr);    // clock went back
  cache.Put(8, t0 + absl::Seconds(1), "eight");
  EXPECT_EQ(cache.Get(7, t0 + absl::Seconds(1)), nullptr);
  EXPECT_EQ(*cache.Get(8, t0 + absl::Seconds(1)), "eight");
}

}  // namespace
}  // namespace shoal::coordinator
