// The coordinator's decision of the gossip run's final average
// (services/coordinator/core/final_average.h).
#include "services/coordinator/core/final_average.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace shoal::coordinator {
namespace {

using ::testing::HasSubstr;
using Action = FinalAverageDecision::Action;

FinalAverageMember Member(const std::string& id, bool done) {
  FinalAverageMember m;
  m.worker_id = id;
  m.address = "127.0.0.1:" + std::to_string(40000 + id.back());
  m.done = done;
  return m;
}

TEST(FinalAverageTest, NothingToSayWhileEveryoneTrains) {
  const FinalAverageDecision d = DecideFinalAverage({Member("w1", false), Member("w2", false)},
                                                    /*sent=*/false);
  EXPECT_EQ(d.action, Action::kWait);
  EXPECT_EQ(d.summary, "");
  EXPECT_EQ(DecideFinalAverage({}, false).action, Action::kWait);
}

TEST(FinalAverageTest, WaitsForTheLastWorkerAndNamesWhoStillTrains) {
  const FinalAverageDecision d = DecideFinalAverage(
      {Member("w1", true), Member("w2", false), Member("w3", true)}, /*sent=*/false);
  EXPECT_EQ(d.action, Action::kWait);
  EXPECT_EQ(d.summary, "waiting: 2 of 3 workers done, still training: w2");
}

TEST(FinalAverageTest, SendsTheSourcesInTheGivenOrderLeavingOutThoseBehindNat) {
  std::vector<FinalAverageMember> members = {Member("w1", true), Member("w2", true),
                                             Member("w3", true)};
  members[1].outbound_only = true;  // nobody can fetch from it
  const FinalAverageDecision d = DecideFinalAverage(members, /*sent=*/false);
  ASSERT_EQ(d.action, Action::kSend);
  ASSERT_EQ(d.sources.size(), 2u);
  EXPECT_EQ(d.sources[0].worker_id, "w1");
  EXPECT_EQ(d.sources[1].worker_id, "w3");
  EXPECT_EQ(d.sources[1].address, members[2].address);
  EXPECT_EQ(d.summary, "averaging the final models of 2 workers");
}

TEST(FinalAverageTest, EveryoneBehindNatFinishesWithoutAnAverage) {
  std::vector<FinalAverageMember> members = {Member("w1", true)};
  members[0].outbound_only = true;
  const FinalAverageDecision d = DecideFinalAverage(members, /*sent=*/false);
  EXPECT_EQ(d.action, Action::kFinish);
  EXPECT_FALSE(d.agree);
  EXPECT_THAT(d.summary, HasSubstr("no member can be fetched from"));
}

TEST(FinalAverageTest, AfterTheListFinishesWhenEveryRecipientReported) {
  std::vector<FinalAverageMember> members = {Member("w1", true), Member("w2", true),
                                             Member("w3", false)};
  members[0].recipient = members[1].recipient = true;  // w3 joined after the list
  members[0].hash = std::string(64, 'a');
  members[0].models = 2;
  FinalAverageDecision d = DecideFinalAverage(members, /*sent=*/true);
  EXPECT_EQ(d.action, Action::kWait);
  EXPECT_EQ(d.summary, "averaging: 1 of 2 workers reported, waiting for w2");

  members[1].hash = std::string(64, 'a');
  members[1].models = 2;
  d = DecideFinalAverage(members, /*sent=*/true);
  EXPECT_EQ(d.action, Action::kFinish);
  EXPECT_TRUE(d.agree);
  EXPECT_EQ(d.summary, "2 final models averaged by 2 workers; hashes agree (aaaaaaaaaaaa)");
}

TEST(FinalAverageTest, DifferentHashesOrAFailureFinishWithoutAgreement) {
  std::vector<FinalAverageMember> members = {Member("w1", true), Member("w2", true),
                                             Member("w3", true)};
  for (auto& m : members) m.recipient = true;
  members[0].hash = std::string(64, 'a');
  members[1].hash = std::string(64, 'b');
  members[2].error = "gossip fetch from w1: deadline exceeded";
  const FinalAverageDecision d = DecideFinalAverage(members, /*sent=*/true);
  EXPECT_EQ(d.action, Action::kFinish);
  EXPECT_FALSE(d.agree);
  EXPECT_THAT(d.summary, HasSubstr("hashes DIFFER"));
  EXPECT_THAT(d.summary, HasSubstr("aaaaaaaaaaaa held by w1"));
  EXPECT_THAT(d.summary, HasSubstr("bbbbbbbbbbbb held by w2"));
  EXPECT_THAT(d.summary, HasSubstr("failed w3: gossip fetch from w1: deadline exceeded"));

  // One failure among agreeing hashes is no agreement either.
  members[1].hash = std::string(64, 'a');
  EXPECT_FALSE(DecideFinalAverage(members, /*sent=*/true).agree);
}

TEST(FinalAverageTest, RecipientsThatLeftDoNotHoldTheRunUp) {
  // The caller passes the active members only: a recipient that died is
  // not among them.
  std::vector<FinalAverageMember> members = {Member("w1", true)};
  members[0].recipient = true;
  members[0].hash = std::string(64, 'c');
  members[0].models = 2;
  const FinalAverageDecision d = DecideFinalAverage(members, /*sent=*/true);
  EXPECT_EQ(d.action, Action::kFinish);
  EXPECT_TRUE(d.agree);
}

}  // namespace
}  // namespace shoal::coordinator
