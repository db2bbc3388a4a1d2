// The model layout rule (docs/PYTHON.md "Any model"): common/model_layout.h,
// the coordinator's LayoutBook, the round engine recording the first
// declared layout and initial model (the ExternalTrainer's turns:
// external_trainer_test.cc).
#include "common/model_layout.h"

#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/coordinator/core/layout_book.h"
#include "services/coordinator/core/round_engine.h"

namespace shoal {
namespace {

using ::testing::HasSubstr;

v1::ModelLayout Layout(std::vector<std::pair<std::string, std::vector<int64_t>>> tensors) {
  v1::ModelLayout l;
  for (const auto& [name, shape] : tensors) {
    v1::TensorSpec* t = l.add_tensors();
    t->set_name(name);
    for (int64_t d : shape) t->add_shape(d);
    t->set_dtype("float32");
  }
  EXPECT_TRUE(SealLayout(&l).ok());
  return l;
}

v1::ModelLayout Mlp(int hidden = 256) {
  return Layout(
      {{"fc1.weight", {hidden, 784}}, {"fc1.bias", {hidden}}, {"fc2.weight", {10, hidden}}});
}

TEST(ModelLayoutTest, TheHashCoversNamesShapesAndDtypes) {
  v1::ModelLayout a = Mlp();
  EXPECT_EQ(a.hash(), LayoutHash(Mlp()));
  EXPECT_NE(a.hash(), LayoutHash(Mlp(255)));
  v1::ModelLayout renamed = a;
  renamed.mutable_tensors(1)->set_name("fc1.b");
  EXPECT_NE(a.hash(), LayoutHash(renamed));
  v1::ModelLayout retyped = a;
  retyped.mutable_tensors(1)->set_dtype("int64");
  EXPECT_NE(a.hash(), LayoutHash(retyped));
}

TEST(ModelLayoutTest, MalformedLayoutsAreRefused) {
  v1::ModelLayout empty;
  EXPECT_EQ(SealLayout(&empty).code(), absl::StatusCode::kInvalidArgument);
  v1::ModelLayout twice = Mlp();
  twice.mutable_tensors(2)->set_name("fc1.weight");
  absl::Status s = SealLayout(&twice);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'fc1.weight' appears twice"));
}

TEST(ModelLayoutTest, TheFirstDifferingTensorIsNamed) {
  absl::Status s = CompareLayouts(Mlp(), Mlp(200), "declared by w1");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("(declared by w1)"));
  EXPECT_THAT(
      s.message(),
      HasSubstr("tensor 'fc1.weight' is [200, 784] float32 here, [256, 784] float32 in the run"));

  v1::ModelLayout shorter = Layout({{"fc1.weight", {256, 784}}, {"fc1.bias", {256}}});
  EXPECT_THAT(CompareLayouts(Mlp(), shorter, "r").message(),
              HasSubstr("tensor 'fc2.weight' [10, 256] float32 of the run is missing here"));
  EXPECT_THAT(CompareLayouts(shorter, Mlp(), "r").message(),
              HasSubstr("tensor 'fc2.weight' [10, 256] float32 here is not in the run"));
  v1::ModelLayout renamed = Mlp();
  renamed.mutable_tensors(0)->set_name("layer1.weight");
  EXPECT_THAT(CompareLayouts(Mlp(), renamed, "r").message(),
              HasSubstr("tensor 1 is 'layer1.weight' [256, 784] float32 here, 'fc1.weight'"));
  EXPECT_TRUE(CompareLayouts(Mlp(), Mlp(), "r").ok());
}

TEST(LayoutBookTest, TheFirstLayoutIsTheRunsAndSurvivesTheRecord) {
  coordinator::LayoutBook book;
  EXPECT_TRUE(book.Check(Mlp(200)).ok());  // nothing recorded yet
  EXPECT_TRUE(book.Record("w1", Mlp()));
  EXPECT_FALSE(book.Record("w2", Mlp(200)));
  EXPECT_THAT(book.Check(Mlp(200)).message(), HasSubstr("declared by w1"));
  v1::ModelLayout forged = Mlp();
  forged.set_hash(std::string(64, 'a'));
  EXPECT_EQ(book.Check(forged).code(), absl::StatusCode::kInvalidArgument);

  v1::RunRecord record;
  book.FillRecord(&record);
  coordinator::LayoutBook resumed;
  resumed.Resume(record);
  EXPECT_TRUE(resumed.Check(Mlp()).ok());
  EXPECT_THAT(resumed.Check(Mlp(200)).message(), HasSubstr("from the run record"));
}

class LayoutEngineTest : public ::testing::Test {
 protected:
  void Start(std::optional<v1::RunRecord> resume = std::nullopt) {
    coordinator::EngineOptions options;
    options.config.mutable_model()->set_name("module");
    options.config.mutable_sync()->set_min_participants(2);
    options.run_id = "run-l";
    options.heartbeat_lease = absl::Seconds(10);
    options.session_grace = absl::Seconds(10);
    options.resume = resume;
    engine_ = std::make_unique<coordinator::RoundEngine>(options, &clock_);
  }
  absl::StatusOr<coordinator::JoinResult> Join(int port, const v1::ModelLayout& layout,
                                               const std::string& initial_hash) {
    v1::JoinRequest request;
    request.set_peer_address(absl::StrCat("127.0.0.1:", port));
    *request.mutable_layout() = layout;
    request.set_initial_model_hash(initial_hash);
    return engine_->Join(request);
  }
  FakeClock clock_;
  std::unique_ptr<coordinator::RoundEngine> engine_;
};

TEST_F(LayoutEngineTest, AJoinOfAnotherLayoutIsRefusedAndTheFirstInitialModelIsTheRuns) {
  Start();
  absl::StatusOr<coordinator::JoinResult> first = Join(7001, Mlp(), std::string(64, 'a'));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->response.layout().hash(), Mlp().hash());

  absl::StatusOr<coordinator::JoinResult> other = Join(7002, Mlp(200), std::string(64, 'b'));
  ASSERT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.status().message(), HasSubstr("'fc1.weight'"));
  EXPECT_EQ(engine_->Status().members(), 1u) << "a refused worker is not a member";

  // A worker with another initial model takes the first one's from it.
  absl::StatusOr<coordinator::JoinResult> second = Join(7003, Mlp(), std::string(64, 'c'));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->response.model_round(), 0u);
  EXPECT_EQ(second->response.model_hash(), std::string(64, 'a'));
  EXPECT_THAT(std::vector<std::string>(second->response.holders().begin(),
                                       second->response.holders().end()),
              ::testing::ElementsAre("127.0.0.1:7001"));

  // The record keeps the layout and the initial model: a restarted
  // coordinator refuses the same worker.
  const v1::RunRecord record = engine_->Record();
  EXPECT_EQ(record.layout().hash(), Mlp().hash());
  EXPECT_EQ(record.model_hash(), std::string(64, 'a'));
  Start(record);
  EXPECT_EQ(Join(7002, Mlp(200), "").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Join(7004, Mlp(), "").ok());
}

}  // namespace
}  // namespace shoal
