// shoalctl explain / doctor (tools/shoalctl/diagnose.h): each fact of a
// run's status becomes the finding an operator needs, at the right level.
#include "tools/shoalctl/diagnose.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shoal::ctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Level = Finding::Level;

constexpr char kHash[] = "0123456789abcdef0123456789abcdef";

v1::WorkerStatus* Add(v1::RunStatus* s, const std::string& id, const std::string& state) {
  v1::WorkerStatus* w = s->add_workers();
  w->set_id(id);
  w->set_state(state);
  w->set_address("127.0.0.1:60" + id.substr(1));
  w->set_model_round(s->last_completed_round());
  w->set_model_hash(kHash);
  return w;
}

v1::RunStatus Training() {
  v1::RunStatus s;
  s.set_run_id("r1");
  s.set_phase(v1::TRAINING);
  s.set_round(7);
  s.set_last_completed_round(6);
  s.set_model_hash(kHash);
  s.set_members(3);
  s.set_min_participants(2);
  s.mutable_config()->mutable_sync()->set_rounds(100);
  s.mutable_config()->mutable_timeouts()->set_heartbeat_interval_ms(1000);
  s.mutable_config()->mutable_timeouts()->set_heartbeat_lease_ms(10000);
  for (const char* id : {"w1", "w2", "w3"}) s.add_participants(id);
  Add(&s, "w1", "ready")->set_name("alice");
  Add(&s, "w2", "training");
  Add(&s, "w3", "training");
  return s;
}

std::string Text(const std::vector<Finding>& findings) { return FormatFindings(findings); }

TEST(ExplainTest, ReadyWorkerWaitsForTheOnesStillTraining) {
  const auto f = ExplainWorker(Training(), "alice", std::nullopt);
  ASSERT_TRUE(f.ok());
  EXPECT_THAT(Text(*f), HasSubstr("waits for the others; still training: w2, w3"));
  EXPECT_FALSE(AnyProblem(*f));
}

TEST(ExplainTest, TellsACrashFromACleanLeaveAndAFinish) {
  v1::RunStatus s = Training();
  Add(&s, "w4", "lost")->set_reason("session stream reset");
  Add(&s, "w5", "left")->set_reason("worker shut down");
  Add(&s, "w6", "finished");
  Add(&s, "w7", "evicted")->set_reason("minority hash");
  auto lost = ExplainWorker(s, "w4", std::nullopt);
  EXPECT_THAT(Text(*lost), HasSubstr("PROBLEM  w4       lost: session stream reset: it went away "
                                     "without a goodbye (a crash, kill -9"));
  auto left = ExplainWorker(s, "w5", std::nullopt);
  EXPECT_THAT(Text(*left),
              HasSubstr("note     w5       left the run: worker shut down (a clean leave"));
  EXPECT_FALSE(AnyProblem(*left));
  EXPECT_THAT(Text(*ExplainWorker(s, "w6", std::nullopt)),
              HasSubstr("ok       w6       finished the run"));
  EXPECT_THAT(Text(*ExplainWorker(s, "w7", std::nullopt)), HasSubstr("evicted: minority hash"));
}

TEST(ExplainTest, SilenceStaleModelsDisagreementAndTopology) {
  v1::RunStatus s = Training();
  v1::WorkerStatus* w2 = s.mutable_workers(1);
  w2->set_last_seen_ms_ago(5500);
  w2->set_model_round(3);
  v1::WorkerStatus* w3 = s.mutable_workers(2);
  w3->set_model_hash("ffff");
  w3->set_outbound_only(true);
  w3->set_outbound_reason("declared (--outbound_only)");
  w3->set_relayed_by("w1");
  w3->set_rounds_late(2);
  w3->set_ready_seconds_median(9);
  w3->set_deadline_seconds(4);
  const std::string two = Text(*ExplainWorker(s, "w2", std::nullopt));
  EXPECT_THAT(two, HasSubstr("note     w2       last known: training round 7"));
  EXPECT_THAT(two, HasSubstr("PROBLEM  w2       not heard from for 5.5s (lease 10.0s)"));
  EXPECT_THAT(two, HasSubstr("holds round 3's model; the run completed round 6 (3 behind)"));
  const std::string three =
      Text(*ExplainWorker(s, "w3", absl::UnavailableError("connection refused")));
  EXPECT_THAT(three, HasSubstr("hashes to ffff, the run agreed on 0123456789ab"));
  EXPECT_THAT(three, HasSubstr("behind NAT, in push mode: declared (--outbound_only)"));
  EXPECT_THAT(three, HasSubstr("goes through the relay on w1"));
  EXPECT_THAT(three, HasSubstr("sat out 2 round(s) for the adaptive deadline: its ready time 9.0s "
                               "against a deadline of 4.0s"));
  EXPECT_THAT(three,
              HasSubstr("note     w3       its advertised address 127.0.0.1:603 is not reachable "
                        "from this host: connection refused (expected behind NAT)"));
}

TEST(ExplainTest, CatchUpWaitingAndUnknownWorkers) {
  v1::RunStatus s = Training();
  v1::WorkerStatus* w4 = Add(&s, "w4", "syncing");
  w4->set_sync_bytes_done(250);
  w4->set_sync_bytes_total(1000);
  w4->set_sync_sources(3);
  EXPECT_THAT(Text(*ExplainWorker(s, "w4", std::nullopt)),
              HasSubstr("catching up: pulling the run's model from 3 peer(s), 250 of 1000 bytes "
                        "(25%)"));
  Add(&s, "w5", "waiting");
  EXPECT_THAT(Text(*ExplainWorker(s, "w5", std::nullopt)),
              HasSubstr("not a participant of round 7"));
  s.set_phase(v1::WAITING_FOR_MEMBERS);
  EXPECT_THAT(Text(*ExplainWorker(s, "w5", std::nullopt)),
              HasSubstr("waits with the run for members: 3 of the 2 needed"));
  const auto none = ExplainWorker(s, "w9", std::nullopt);
  EXPECT_TRUE(absl::IsNotFound(none.status()));
  EXPECT_THAT(none.status().message(),
              HasSubstr("no worker 'w9' in run r1; workers: w1 (alice), w2"));
}

// Issue 49: a member whose peers read from it at a fraction of the others'
// rate, and whose exchange outweighs its training, is named as link-bound;
// a slow member whose training dominates is not (its compute bounds it).
TEST(ExplainTest, NamesAMemberWhoseLinkNotItsComputeBoundsTheRounds) {
  v1::RunStatus s = Training();
  auto time = [&](int k, double rate, double train, double exchange) {
    v1::WorkerStatus* w = s.mutable_workers(k);
    w->set_exchange_rate_bytes_per_second(rate);
    w->set_train_share(train);
    w->set_exchange_share(exchange);
    w->set_idle_share(1 - train - exchange);
    w->set_slice_share(0.04);
  };
  time(0, 1.2e6, 0.2, 0.7);  // alice: 1.2 MB/s, mostly exchanging
  time(1, 12e6, 0.2, 0.6);
  time(2, 11e6, 0.2, 0.6);
  auto f = ExplainWorker(s, "alice", std::nullopt);
  ASSERT_TRUE(f.ok());
  EXPECT_THAT(Text(*f), HasSubstr("its link, not its compute, bounds the rounds"));
  EXPECT_THAT(Text(*f), HasSubstr("1.20 MB/s against a median of 11.50 MB/s"));
  EXPECT_THAT(Text(*f), HasSubstr("--slice_sizing=bandwidth would give it a smaller slice"));
  EXPECT_FALSE(AnyProblem(*f));
  // With proportional slices it names its slice instead.
  s.mutable_config()->mutable_exchange()->set_slice_sizing("bandwidth");
  f = ExplainWorker(s, "alice", std::nullopt);
  EXPECT_THAT(Text(*f), HasSubstr("its slice holds 4.0% of the model"));
  // Doctor names it too, and only it.
  DoctorFacts facts;
  facts.coordinator_address = "127.0.0.1:7000";
  const std::string doctor = Text(Doctor(s, facts));
  EXPECT_THAT(doctor, HasSubstr("alice"));
  EXPECT_EQ(doctor.find("bounds the rounds"), doctor.rfind("bounds the rounds"));
  // A fast peer is not named; a slow link whose training dominates is not either.
  f = ExplainWorker(s, "w2", std::nullopt);
  EXPECT_THAT(Text(*f), Not(HasSubstr("bounds the rounds")));
  time(0, 1.2e6, 0.7, 0.2);
  f = ExplainWorker(s, "alice", std::nullopt);
  EXPECT_THAT(Text(*f), Not(HasSubstr("bounds the rounds")));
  // Nothing is named before rates are measured.
  time(0, 0, 0.2, 0.7);
  f = ExplainWorker(s, "alice", std::nullopt);
  EXPECT_THAT(Text(*f), Not(HasSubstr("bounds the rounds")));
}

TEST(ExplainTest, FindingsAsJson) {
  const std::vector<Finding> f = {{Level::kOk, "w1", "fine"},
                                  {Level::kProblem, "w2", "said \"no\""}};
  EXPECT_EQ(FormatFindingsJson(f),
            "{\"problem\": true, \"findings\": [\n"
            "  {\"level\": \"ok\", \"subject\": \"w1\", \"text\": \"fine\"},\n"
            "  {\"level\": \"PROBLEM\", \"subject\": \"w2\", \"text\": \"said \\\"no\\\"\"}\n"
            "]}\n");
  EXPECT_EQ(FormatFindingsJson({}), "{\"problem\": false, \"findings\": []}\n");
}

TEST(DoctorTest, NamesTheCoordinatorsRefusalWithWhatToCheck) {
  DoctorFacts f;
  f.coordinator_address = "10.0.0.1:50051";
  f.coordinator = absl::UnauthenticatedError("missing token");
  auto out = Doctor(v1::RunStatus(), f);
  EXPECT_TRUE(AnyProblem(out));
  EXPECT_THAT(Text(out), HasSubstr("requires a token: missing token (give the run's token"));
  f.client_token = true;
  EXPECT_THAT(Text(Doctor(v1::RunStatus(), f)), HasSubstr("refuses this client's token"));
  f.coordinator = absl::UnavailableError("SSL handshake failed");
  EXPECT_THAT(Text(Doctor(v1::RunStatus(), f)),
              HasSubstr("TLS failed: SSL handshake failed (the server speaks TLS: give --tls_ca"));
  f.coordinator = absl::UnimplementedError("shoal-checkpoint serves no Coordinator");
  EXPECT_THAT(Text(Doctor(v1::RunStatus(), f)), HasSubstr("is another kind of server"));
  f.coordinator = absl::UnavailableError("Connection refused");
  EXPECT_THAT(Text(Doctor(v1::RunStatus(), f)),
              HasSubstr("10.0.0.1:50051 is not reachable: Connection refused (is it running?"));
}

TEST(DoctorTest, NamesARunThatStoppedOrWentBack) {
  v1::RunStatus s = Training();
  s.set_base_fallback("round 9: checkpoint r1-r8 is damaged; went back to r1-r6");
  DoctorFacts f;
  f.coordinator_address = "127.0.0.1:50051";
  std::vector<Finding> findings = Doctor(s, f);
  EXPECT_THAT(Text(findings), HasSubstr("went back: round 9: checkpoint r1-r8 is damaged"));
  s.set_error("checkpoint r1-r8 is damaged and no older one is known");
  findings = Doctor(s, f);
  EXPECT_TRUE(AnyProblem(findings));
  EXPECT_THAT(Text(findings), HasSubstr("stopped: checkpoint r1-r8 is damaged"));
}

TEST(DoctorTest, NamesBansAndAuditsThatNeverRun) {
  v1::RunStatus s = Training();
  DoctorFacts f;
  f.coordinator_address = "127.0.0.1:50051";
  v1::Ban* ban = s.add_bans();
  ban->set_worker_id("w9");
  ban->set_name("cheater");
  ban->set_reason("score 0.00 below 0.50 after round 4: failed audit by w2");
  std::vector<Finding> findings = Doctor(s, f);
  EXPECT_TRUE(AnyProblem(findings));
  EXPECT_THAT(Text(findings), HasSubstr("banned from the run: score 0.00"));
  s.clear_bans();
  s.mutable_config()->mutable_trust()->set_audit_rate(0.1);
  s.set_audits_dropped(4);
  findings = Doctor(s, f);
  EXPECT_THAT(Text(findings), HasSubstr("4 audits dropped and none performed"));
  s.set_audits_performed(1);
  EXPECT_THAT(Text(Doctor(s, f)), Not(HasSubstr("audits dropped")));
}

TEST(DoctorTest, ChecksMembersStoreAndClock) {
  v1::RunStatus s = Training();
  s.mutable_config()->mutable_checkpoints()->set_store("127.0.0.1:50052");
  s.mutable_config()->mutable_checkpoints()->set_every(1);
  s.set_checkpoint_round(1);
  s.set_started_unix_ms(2'000'000);
  s.mutable_workers(1)->set_last_seen_ms_ago(8000);
  DoctorFacts f;
  f.coordinator_address = "127.0.0.1:50051";
  f.member_reachable = {{"w1", absl::OkStatus()},
                        {"w2", absl::OkStatus()},
                        {"w3", absl::UnavailableError("refused")}};
  f.store_address = "127.0.0.1:50052";
  f.store = absl::OkStatus();
  f.checkpoints.resize(2);
  f.checkpoints[0].set_id("r1-r1");
  f.checkpoints[1].set_id("r1-r0");
  f.checkpoints[1].set_damage("layer 'fc1.weight': blob is missing");
  f.local_unix_ms = 1'000'000;  // 1000 s behind the run's start
  const std::string out = Text(Doctor(s, f));
  EXPECT_THAT(out, HasSubstr("PROBLEM  w2           not heard from for 8.0s"));
  EXPECT_THAT(out, HasSubstr("PROBLEM  w3           advertised address 127.0.0.1:603 is not "
                             "reachable from this host: refused"));
  EXPECT_THAT(out, HasSubstr("2 of 3 members' advertised addresses reachable"));
  EXPECT_THAT(out, HasSubstr("checkpoint r1-r0 is damaged: layer 'fc1.weight'"));
  EXPECT_THAT(out, HasSubstr("the latest checkpoint is of round 1, 5 rounds behind round 6"));
  EXPECT_THAT(out, HasSubstr("this host's clock is at least 1000.0s behind the coordinator's"));
  // A healthy run: no problem.
  v1::RunStatus healthy = Training();
  DoctorFacts ok;
  ok.coordinator_address = "127.0.0.1:50051";
  ok.local_unix_ms = 5'000'000;
  healthy.set_started_unix_ms(4'000'000);
  const auto fine = Doctor(healthy, ok);
  EXPECT_FALSE(AnyProblem(fine)) << Text(fine);
  EXPECT_THAT(Text(fine), HasSubstr("the run has no checkpoint store"));
}

}  // namespace
}  // namespace shoal::ctl
