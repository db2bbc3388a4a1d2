// Where a coordinator message goes on a worker (core/directive_route.h):
// host directives are applied on the session's thread and never queued;
// everything else is the runner's, and the interrupting ones cancel a
// running exchange at once.
#include "services/worker/core/directive_route.h"

#include "gtest/gtest.h"

namespace shoal::worker {
namespace {

TEST(DirectiveRoute, HostDirectivesAreNotQueued) {
  shoal::v1::CoordinatorMessage relay;
  relay.mutable_use_relay()->set_address("10.0.0.9:7000");
  DirectiveRoute r = RouteDirective(relay);
  EXPECT_TRUE(r.use_relay);
  EXPECT_FALSE(r.to_runner);
  EXPECT_FALSE(r.interrupts);

  shoal::v1::CoordinatorMessage members;
  members.mutable_member_update()->set_version(3);
  r = RouteDirective(members);
  EXPECT_TRUE(r.member_update);
  EXPECT_FALSE(r.to_runner);
}

TEST(DirectiveRoute, AnUploadGrantGoesToTheStoreAndItsRequestToTheRunner) {
  shoal::v1::CoordinatorMessage m;
  m.mutable_checkpoint_request()->set_round(4);
  DirectiveRoute r = RouteDirective(m);
  EXPECT_FALSE(r.upload_grant);
  EXPECT_TRUE(r.to_runner);
  m.mutable_checkpoint_request()->set_upload_grant("grant");
  r = RouteDirective(m);
  EXPECT_TRUE(r.upload_grant);
  EXPECT_TRUE(r.to_runner);
  EXPECT_FALSE(r.interrupts);
}

TEST(DirectiveRoute, InterruptingDirectivesCancelTheExchange) {
  shoal::v1::CoordinatorMessage plan;
  plan.mutable_round_plan()->set_round(2);
  EXPECT_TRUE(RouteDirective(plan).interrupts);
  shoal::v1::CoordinatorMessage finished;
  finished.mutable_run_finished()->set_reason("done");
  EXPECT_TRUE(RouteDirective(finished).interrupts);
  shoal::v1::CoordinatorMessage start;
  start.mutable_round_start()->set_round(3);
  EXPECT_FALSE(RouteDirective(start).interrupts);
  EXPECT_TRUE(RouteDirective(start).to_runner);
  shoal::v1::CoordinatorMessage peers;
  peers.mutable_peer_update()->set_version(1);
  EXPECT_TRUE(RouteDirective(peers).to_runner);
  EXPECT_FALSE(RouteDirective(peers).interrupts);
}

}  // namespace
}  // namespace shoal::worker
