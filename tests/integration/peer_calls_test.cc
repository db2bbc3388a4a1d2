// GrpcPeerClient's callback calls over real gRPC against a scripted Peer
// service on 127.0.0.1:0: the manifest request's short retry of
// UNAVAILABLE (on a gRPC alarm) and its end when it runs out, cancellation
// of a manifest request and of a probe the peer never answers, and a push
// written piece by piece. Every wait is a poll with a deadline.
#include <grpc/grpc.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "common/crc32c.h"
#include "common/grpc_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/worker/peer_client.h"
#include "shoal/v1/peer.grpc.pb.h"
#include "tests/support/test_support.h"

namespace shoal::worker {
namespace {

using ::shoal::testing::WaitUntil;
using ::testing::HasSubstr;

[[maybe_unused]] const bool kGrpcKeptInitialised = [] {
  grpc_init();
  return true;
}();

// A call the peer never answers: it ends when the caller cancels it (or
// its deadline passes, or the server shuts down).
class Held : public grpc::ServerUnaryReactor {
 public:
  explicit Held(std::atomic<int>* cancelled) : cancelled_(cancelled) {}
  void OnCancel() override {
    ++*cancelled_;
    Finish(grpc::Status::CANCELLED);
  }
  void OnDone() override { delete this; }

 private:
  std::atomic<int>* const cancelled_;
};

// What a scripted peer does; thread-safe (gRPC threads serve).
class ScriptedPeer final : public shoal::v1::Peer::CallbackService {
 public:
  // GetManifest: the first `unavailable` calls answer UNAVAILABLE, later
  // ones a manifest of the round asked; `hold`: no answer at all.
  std::atomic<int> unavailable{0};
  std::atomic<bool> hold{false};
  std::atomic<int> manifest_calls{0};
  std::atomic<int> probe_calls{0};
  std::atomic<int> cancelled{0};  // held calls the caller cancelled
  // Push: refused at once with PERMISSION_DENIED.
  std::atomic<bool> refuse_push{false};

  grpc::ServerUnaryReactor* GetManifest(grpc::CallbackServerContext* ctx,
                                        const shoal::v1::GetModelManifestRequest* request,
                                        shoal::v1::ModelManifest* response) override {
    const int n = ++manifest_calls;
    if (hold) return new Held(&cancelled);
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    if (n <= unavailable) {
      r->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "not a member yet"));
      return r;
    }
    response->set_round(request->round());
    response->set_model_hash("the-hash");
    r->Finish(grpc::Status::OK);
    return r;
  }

  grpc::ServerUnaryReactor* GetPeerInfo(grpc::CallbackServerContext* ctx,
                                        const shoal::v1::GetPeerInfoRequest*,
                                        shoal::v1::PeerInfo* response) override {
    ++probe_calls;
    if (hold) return new Held(&cancelled);
    response->set_gossip_publication(42);
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }

  grpc::ServerReadReactor<shoal::v1::PushMessage>* Push(grpc::CallbackServerContext*,
                                                        shoal::v1::PushResponse*) override {
    return new PushReader(this);
  }

  // What the last push delivered (its pieces checked).
  struct Pushed {
    shoal::v1::PushHeader header;
    std::string bytes;
    int pieces = 0;
    bool crc_ok = true;
  };
  std::optional<Pushed> pushed() {
    absl::MutexLock lock(&mu_);
    return pushed_;
  }

 private:
  class PushReader : public grpc::ServerReadReactor<shoal::v1::PushMessage> {
   public:
    explicit PushReader(ScriptedPeer* peer) : peer_(peer) {
      if (peer_->refuse_push) {
        Finish(grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "not a member"));
        return;
      }
      StartRead(&message_);
    }
    void OnReadDone(bool ok) override {
      if (!ok) {
        absl::MutexLock lock(&peer_->mu_);
        peer_->pushed_ = std::move(got_);
        Finish(grpc::Status::OK);
        return;
      }
      if (message_.has_header()) {
        got_.header = message_.header();
      } else {
        const shoal::v1::EncodedPiece& p = message_.piece();
        got_.crc_ok &= Crc32c(p.data().data(), p.data().size()) == p.crc32c() &&
                       p.offset() == got_.bytes.size();
        got_.bytes += p.data();
        ++got_.pieces;
      }
      StartRead(&message_);
    }
    void OnDone() override { delete this; }

   private:
    ScriptedPeer* const peer_;
    shoal::v1::PushMessage message_;
    Pushed got_;
  };

  absl::Mutex mu_;
  std::optional<Pushed> pushed_ ABSL_GUARDED_BY(mu_);
};

// A callback's one answer, waited for. The callback shares its state: an
// answer after a failed test's end writes into memory still there.
template <typename T>
class Answer {
 public:
  std::function<void(T)> Callback() {
    return [state = state_](T value) {
      absl::MutexLock lock(&state->mu);
      state->value = std::move(value);
    };
  }
  // The answer, once given within `timeout`.
  std::optional<T> Wait(absl::Duration timeout) {
    State* s = state_.get();
    absl::MutexLock lock(&s->mu);
    auto given = [s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) { return s->value.has_value(); };
    s->mu.AwaitWithTimeout(absl::Condition(&given), timeout);
    return s->value;
  }

 private:
  struct State {
    absl::Mutex mu;
    std::optional<T> value ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

class PeerCallsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto started = GrpcServer::Start("127.0.0.1:0", {&peer_});
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = std::move(*started);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(1));
  }
  std::string address() const { return server_->address(); }

  ScriptedPeer peer_;
  std::unique_ptr<GrpcServer> server_;
  GrpcPeerClient client_;
};

using ManifestAnswer = Answer<absl::StatusOr<shoal::v1::ModelManifest>>;

TEST_F(PeerCallsTest, ManifestRequestRetriesUnavailableThenAnswers) {
  peer_.unavailable = 2;
  ManifestAnswer answer;
  client_.StartGetManifest(address(), 7, "reader", absl::Seconds(10), nullptr, answer.Callback());
  auto m = answer.Wait(absl::Seconds(20));
  ASSERT_TRUE(m.has_value());
  ASSERT_TRUE(m->ok()) << m->status();
  EXPECT_EQ((*m)->round(), 7u);
  EXPECT_EQ((*m)->model_hash(), "the-hash");
  EXPECT_EQ(peer_.manifest_calls.load(), 3);
}

TEST_F(PeerCallsTest, ManifestRequestGivesUpWithTheLastErrorAfterItsRetries) {
  peer_.unavailable = 1 << 30;
  ManifestAnswer answer;
  client_.StartGetManifest(address(), 7, "reader", absl::Seconds(10), nullptr, answer.Callback());
  auto m = answer.Wait(absl::Seconds(20));
  ASSERT_TRUE(m.has_value());
  EXPECT_TRUE(absl::IsUnavailable(m->status())) << m->status();
  EXPECT_THAT(m->status().message(), HasSubstr("gave up after"));
  EXPECT_THAT(m->status().message(), HasSubstr(address()));
  EXPECT_THAT(m->status().message(), HasSubstr("not a member yet"));
  EXPECT_GE(peer_.manifest_calls.load(), 2);
}

TEST_F(PeerCallsTest, ManifestRequestThatIsNeverAnsweredEndsWhenCancelled) {
  peer_.hold = true;
  CancellationToken cancel;
  ManifestAnswer answer;
  client_.StartGetManifest(address(), 7, "reader", absl::Seconds(60), &cancel, answer.Callback());
  ASSERT_TRUE(WaitUntil([&] { return peer_.manifest_calls.load() == 1; }, absl::Seconds(10)));
  cancel.Cancel();
  // Long before the call's own 60 s deadline.
  auto m = answer.Wait(absl::Seconds(20));
  ASSERT_TRUE(m.has_value());
  EXPECT_TRUE(absl::IsCancelled(m->status())) << m->status();
  EXPECT_TRUE(WaitUntil([&] { return peer_.cancelled.load() == 1; }, absl::Seconds(10)));
}

TEST_F(PeerCallsTest, ManifestRequestCancelledBeforeItStartsNeverReachesThePeer) {
  CancellationToken cancel;
  cancel.Cancel();
  ManifestAnswer answer;
  client_.StartGetManifest(address(), 7, "reader", absl::Seconds(10), &cancel, answer.Callback());
  auto m = answer.Wait(absl::Seconds(10));
  ASSERT_TRUE(m.has_value());
  EXPECT_TRUE(absl::IsCancelled(m->status())) << m->status();
  EXPECT_EQ(peer_.manifest_calls.load(), 0);
}

TEST_F(PeerCallsTest, ProbeAnswersAndEndsWhenCancelled) {
  Answer<absl::StatusOr<shoal::v1::PeerInfo>> answered;
  client_.StartProbe(address(), absl::Seconds(10), nullptr, answered.Callback());
  auto info = answered.Wait(absl::Seconds(20));
  ASSERT_TRUE(info.has_value());
  ASSERT_TRUE(info->ok()) << info->status();
  EXPECT_EQ((*info)->gossip_publication(), 42u);

  peer_.hold = true;
  CancellationToken cancel;
  Answer<absl::StatusOr<shoal::v1::PeerInfo>> held;
  client_.StartProbe(address(), absl::Seconds(60), &cancel, held.Callback());
  ASSERT_TRUE(WaitUntil([&] { return peer_.probe_calls.load() == 2; }, absl::Seconds(10)));
  cancel.Cancel();
  info = held.Wait(absl::Seconds(20));
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(absl::IsCancelled(info->status())) << info->status();
}

TEST_F(PeerCallsTest, PushWritesEveryPieceWithItsCrc) {
  // 2.5 MiB: two whole 1 MiB pieces and a short one.
  std::string bytes((5 << 20) / 2, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 31 % 251);
  shoal::v1::PushHeader header;
  header.set_gossip(true);
  header.set_round(3);
  header.set_begin(0);
  header.set_end(bytes.size() / sizeof(float));
  header.set_pusher_id("reader");
  header.set_total_bytes(bytes.size());
  Answer<absl::Status> answer;
  client_.StartPush(address(), header, bytes, absl::Seconds(10), nullptr, answer.Callback());
  auto s = answer.Wait(absl::Seconds(20));
  ASSERT_TRUE(s.has_value());
  ASSERT_TRUE(s->ok()) << *s;
  std::optional<ScriptedPeer::Pushed> got = peer_.pushed();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->header.pusher_id(), "reader");
  EXPECT_EQ(got->header.total_bytes(), bytes.size());
  EXPECT_EQ(got->pieces, 3);
  EXPECT_TRUE(got->crc_ok);
  EXPECT_TRUE(got->bytes == bytes);
}

TEST_F(PeerCallsTest, RefusedPushHasThePeersCode) {
  peer_.refuse_push = true;
  const std::string bytes(4096, 'x');
  shoal::v1::PushHeader header;
  header.set_pusher_id("reader");
  header.set_total_bytes(bytes.size());
  Answer<absl::Status> answer;
  client_.StartPush(address(), header, bytes, absl::Seconds(10), nullptr, answer.Callback());
  auto s = answer.Wait(absl::Seconds(20));
  ASSERT_TRUE(s.has_value());
  EXPECT_TRUE(absl::IsPermissionDenied(*s)) << *s;
  EXPECT_THAT(s->message(), HasSubstr("push to peer"));
  EXPECT_FALSE(peer_.pushed().has_value());
}

}  // namespace
}  // namespace shoal::worker
