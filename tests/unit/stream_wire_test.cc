// RelayDownBuilder (services/coordinator/stream_wire.h): the RelayDown it
// assembles by hand parses as the proto says, carries each message's bytes
// once per entry, and keeps every member's order of messages.
#include "services/coordinator/stream_wire.h"

#include <grpc/grpc.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace shoal::coordinator {
namespace {

using shoal::v1::CoordinatorMessage;
using shoal::v1::RelayDown;

[[maybe_unused]] const bool kGrpcInitialised = [] {
  grpc_init();
  return true;
}();

CoordinatorMessage Start(uint64_t round) {
  CoordinatorMessage m;
  m.mutable_round_start()->set_round(round);
  return m;
}

RelayDown Parse(const grpc::ByteBuffer& bytes) {
  grpc::ByteBuffer copy(bytes);
  RelayDown down;
  EXPECT_TRUE(ParseMessage(&copy, &down));
  return down;
}

// Each member's messages in the order a relay applying the entries in
// order would hand them out.
std::map<std::string, std::vector<uint64_t>> PerMember(const RelayDown& down) {
  std::map<std::string, std::vector<uint64_t>> out;
  for (const auto& d : down.directives()) {
    for (const std::string& id : d.worker_ids())
      out[id].push_back(d.message().round_start().round());
  }
  return out;
}

TEST(RelayDownBuilderTest, BroadcastToHundredMembersIsOneEntry) {
  CoordinatorMessage plan;
  auto* p = plan.mutable_round_plan();
  p->set_round(7);
  p->set_attempt(2);
  for (int i = 0; i < 100; ++i) p->add_slices()->set_worker_id(absl::StrCat("w", i + 1));
  const grpc::ByteBuffer bytes = SerializeMessage(plan);
  RelayDownBuilder builder;
  for (int i = 0; i < 100; ++i) builder.AddDirective(&bytes, absl::StrCat("w", i + 1));
  EXPECT_EQ(builder.directive_entries(), 1u);
  const RelayDown down = Parse(builder.Build());
  ASSERT_EQ(down.directives_size(), 1);
  EXPECT_EQ(down.directives(0).message().SerializeAsString(), plan.SerializeAsString());
  ASSERT_EQ(down.directives(0).worker_ids_size(), 100);
  EXPECT_EQ(down.directives(0).worker_ids(0), "w1");
  EXPECT_EQ(down.directives(0).worker_ids(99), "w100");
  EXPECT_EQ(down.results_size(), 0);
}

TEST(RelayDownBuilderTest, EveryMemberKeepsItsOrder) {
  const grpc::ByteBuffer x = SerializeMessage(Start(1));
  const grpc::ByteBuffer y = SerializeMessage(Start(2));
  RelayDownBuilder builder;
  // a: x then y; b: x then y (shares both entries); c: y then x (its x
  // must come after its y: a new entry).
  builder.AddDirective(&x, "a");
  builder.AddDirective(&y, "a");
  builder.AddDirective(&x, "b");
  builder.AddDirective(&y, "c");
  builder.AddDirective(&y, "b");
  builder.AddDirective(&x, "c");
  EXPECT_EQ(builder.directive_entries(), 3u);
  const auto per_member = PerMember(Parse(builder.Build()));
  EXPECT_EQ(per_member.at("a"), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(per_member.at("b"), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(per_member.at("c"), (std::vector<uint64_t>{2, 1}));
}

TEST(RelayDownBuilderTest, TheSameMessageTwiceToOneMemberArrivesTwice) {
  const grpc::ByteBuffer x = SerializeMessage(Start(3));
  RelayDownBuilder builder;
  builder.AddDirective(&x, "a");
  builder.AddDirective(&x, "a");
  EXPECT_EQ(PerMember(Parse(builder.Build())).at("a"), (std::vector<uint64_t>{3, 3}));
}

TEST(RelayDownBuilderTest, ResultsAndEndedFollowTheDirectives) {
  const grpc::ByteBuffer x = SerializeMessage(Start(4));
  RelayDownBuilder builder;
  EXPECT_TRUE(builder.empty());
  builder.AddDirective(&x, "a");
  auto* result = builder.rest().add_results();
  result->set_call_id(9);
  result->set_code(7);
  result->set_message("denied");
  auto* ended = builder.rest().add_ended();
  ended->set_worker_id("b");
  ended->set_code(5);
  EXPECT_FALSE(builder.empty());
  const RelayDown down = Parse(builder.Build());
  ASSERT_EQ(down.directives_size(), 1);
  ASSERT_EQ(down.results_size(), 1);
  EXPECT_EQ(down.results(0).call_id(), 9u);
  EXPECT_EQ(down.results(0).code(), 7);
  EXPECT_EQ(down.results(0).message(), "denied");
  ASSERT_EQ(down.ended_size(), 1);
  EXPECT_EQ(down.ended(0).worker_id(), "b");
}

TEST(RelayDownBuilderTest, OnlyResultsNeedNoDirective) {
  RelayDownBuilder builder;
  builder.rest().add_results()->set_call_id(1);
  const RelayDown down = Parse(builder.Build());
  EXPECT_EQ(down.directives_size(), 0);
  ASSERT_EQ(down.results_size(), 1);
}

}  // namespace
}  // namespace shoal::coordinator
