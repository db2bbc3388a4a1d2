// Gossip between real peers: Peer services on 127.0.0.1:0 serving published
// copies (GossipBoard), fetched by GossipFetcher through the real client and
// the wire module. A corrupt or truncated transfer is dropped whole (the
// result carries no model), a peer that stops answering costs one fetch
// bounded by the gossip timeout, and a reader keeps the copy it started
// while the peer goes on publishing. With a codec (int8) the pull reads the
// publication's encoding and decodes exactly what a local decode gives.
#include <grpc/grpc.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/grpc_util.h"
#include "gtest/gtest.h"
#include "services/worker/core/codec.h"
#include "services/worker/core/gossip_board.h"
#include "services/worker/core/gossip_policy.h"
#include "services/worker/core/model_state.h"
#include "services/worker/core/push_box.h"
#include "services/worker/gossip_fetcher.h"
#include "services/worker/peer_client.h"
#include "services/worker/peer_service.h"
#include "tests/support/faulty_peer.h"
#include "tests/support/test_support.h"

namespace shoal::worker {
namespace {

[[maybe_unused]] const bool kGrpcKeptInitialised = [] {
  grpc_init();
  return true;
}();

// 3.5 chunks of 1 MiB: several chunks per transfer, a short last one.
constexpr uint64_t kElements = 3 * (1 << 18) + (1 << 17);

// A peer: the real PeerService behind the test's fault injection
// (tests/support/faulty_peer.h), which passes everything through
// while its fault is kNone.
struct GossipNode {
  explicit GossipNode(float fill)
      : params(kElements),
        service(&state),
        faulty(&service, ::shoal::testing::FaultyPeer::Gossip(&board)) {
    for (uint64_t i = 0; i < kElements; ++i) params[i] = fill + 1e-6f * static_cast<float>(i % 977);
    state.Bind(params.data(), params.size(), "mlp");
    state.SetWorkerId("peer");
    service.set_gossip_board(&board);
    auto started = GrpcServer::Start("127.0.0.1:0", {&faulty});
    EXPECT_TRUE(started.ok()) << started.status();
    if (started.ok()) server = std::move(*started);
  }
  ~GossipNode() {
    state.SetShuttingDown();
    if (server != nullptr) server->Shutdown(absl::Seconds(1));
  }
  std::string address() const { return server != nullptr ? server->address() : ""; }

  std::vector<float> params;
  ModelState state;
  GossipBoard board;
  PeerService service;
  ::shoal::testing::FaultyPeer faulty;
  std::unique_ptr<GrpcServer> server;
};

class GossipPeersTest : public ::testing::Test {
 protected:
  GrpcPeerClient client_;
  CancellationToken stop_;
};

TEST_F(GossipPeersTest, FetchesAWholePublishedCopyWithItsState) {
  GossipNode peer(2.0f);
  peer.board.Publish(peer.params.data(), kElements, 12800, 0.37);
  GossipFetcher fetcher(&client_, "reader", nullptr, &stop_);
  const GossipFetchResult r = fetcher.FetchNow("w9", peer.address(), kElements, absl::Seconds(20));
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_DOUBLE_EQ(r.peer_clock, 12800);
  EXPECT_DOUBLE_EQ(r.peer_loss, 0.37);
  ASSERT_NE(r.peer_params, nullptr);
  EXPECT_EQ(std::vector<float>(r.peer_params, r.peer_params + kElements), peer.params);
}

TEST_F(GossipPeersTest, Int8PullsReadTheEncodingAndDecodeItExactly) {
  absl::StatusOr<std::unique_ptr<Codec>> int8 = MakeCodec("int8");
  ASSERT_TRUE(int8.ok());
  GossipNode peer(2.0f);
  peer.board.SetCodec(int8->get());
  std::shared_ptr<const GossipCopy> copy =
      peer.board.Publish(peer.params.data(), kElements, 640, 0.25);
  ASSERT_NE(copy->encoded, nullptr);
  EXPECT_EQ(copy->encoded->size(), (*int8)->EncodedBytes(kElements));
  std::vector<float> want(kElements);
  ASSERT_TRUE(
      (*int8)
          ->DecodeSlice(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(copy->encoded->data()),
                                            copy->encoded->size()),
                        kElements, want.data())
          .ok());
  GossipFetcher fetcher(&client_, "reader", nullptr, &stop_);
  fetcher.set_codec(int8->get());
  const GossipFetchResult r = fetcher.FetchNow("w9", peer.address(), kElements, absl::Seconds(20));
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_DOUBLE_EQ(r.peer_clock, 640);
  EXPECT_EQ(r.wire_bytes, copy->encoded->size());
  ASSERT_NE(r.peer_params, nullptr);
  EXPECT_EQ(std::vector<float>(r.peer_params, r.peer_params + kElements), want);
  // Close to the float32 model: half an int8 step of each block's largest
  // value (about 2.001 / 254).
  for (uint64_t i = 0; i < kElements; i += 4099) {
    EXPECT_NEAR(r.peer_params[i], peer.params[i], 2.01 / 254) << i;
  }
  // A float32 reader of an int8 run's peer still reads the copy raw; an
  // encoded read of a peer that publishes no encoding is refused.
  GossipNode plain(3.0f);
  plain.board.Publish(plain.params.data(), kElements, 1, 0.1);
  const GossipFetchResult refused =
      fetcher.FetchNow("w8", plain.address(), kElements, absl::Seconds(20));
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kFailedPrecondition) << refused.status;
  EXPECT_EQ(refused.peer_params, nullptr);
}

TEST_F(GossipPeersTest, BackgroundFetchThenInterpolationKeepsLocalSteps) {
  GossipNode peer(4.0f);
  peer.board.Publish(peer.params.data(), kElements, 1000, 0.5);
  GossipBoard own_board;
  std::vector<float> own(kElements, 2.0f);
  auto base = own_board.Publish(own.data(), kElements, 1000, 0.5);
  GossipFetcher fetcher(&client_, "reader", nullptr, &stop_);
  ASSERT_TRUE(fetcher.Start("w9", peer.address(), kElements, absl::Seconds(20), base));
  EXPECT_FALSE(fetcher.Start("w9", peer.address(), kElements, absl::Seconds(20), base));
  // Training goes on meanwhile: +1 on every parameter.
  for (float& v : own) v += 1.0f;
  std::optional<GossipFetchResult> r;
  ASSERT_TRUE(::shoal::testing::WaitUntil([&] { return (r = fetcher.Take()).has_value(); },
                                          absl::Seconds(30)));
  ASSERT_TRUE(r->status.ok()) << r->status;
  GossipConfig g;
  ASSERT_TRUE(ParseInterpolation("clock", &g).ok());
  const double a = InterpolationFactor(g, {r->base->clock, r->base->loss}, {r->peer_clock, 0.5});
  EXPECT_DOUBLE_EQ(a, 0.5);
  ApplyInterpolation(own.data(), r->base->params.data(), r->peer_params, kElements, a);
  // 0.5 * 2 + 0.5 * peer + the local step.
  EXPECT_FLOAT_EQ(own[0], 0.5f * 2.0f + 0.5f * peer.params[0] + 1.0f);
  EXPECT_FLOAT_EQ(own[kElements - 1], 0.5f * 2.0f + 0.5f * peer.params[kElements - 1] + 1.0f);
}

TEST_F(GossipPeersTest, CorruptOrTruncatedTransferIsDroppedWhole) {
  GossipNode peer(1.0f);
  peer.board.Publish(peer.params.data(), kElements, 640, 1.0);
  GossipFetcher fetcher(&client_, "reader", nullptr, &stop_);
  peer.faulty.set_fault(::shoal::testing::FaultyPeer::Fault::kCorrupt);
  GossipFetchResult r = fetcher.FetchNow("w9", peer.address(), kElements, absl::Seconds(20));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDataLoss) << r.status;
  EXPECT_FALSE(r.not_answering);
  EXPECT_EQ(r.peer_params, nullptr);

  peer.faulty.set_fault(::shoal::testing::FaultyPeer::Fault::kTruncate);
  r = fetcher.FetchNow("w9", peer.address(), kElements, absl::Seconds(20));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDataLoss) << r.status;
  EXPECT_EQ(r.peer_params, nullptr);

  // The same peer, healthy again, serves a whole copy.
  peer.faulty.set_fault(::shoal::testing::FaultyPeer::Fault::kNone);
  r = fetcher.FetchNow("w9", peer.address(), kElements, absl::Seconds(20));
  EXPECT_TRUE(r.status.ok()) << r.status;
}

TEST_F(GossipPeersTest, PeerThatStopsAnsweringCostsOneBoundedFetch) {
  GossipNode peer(1.0f);
  peer.board.Publish(peer.params.data(), kElements, 640, 1.0);
  peer.faulty.set_fault(::shoal::testing::FaultyPeer::Fault::kStall);
  GossipFetcher fetcher(&client_, "reader", nullptr, &stop_);
  const absl::Time t0 = absl::Now();
  const GossipFetchResult r =
      fetcher.FetchNow("w9", peer.address(), kElements, absl::Milliseconds(800));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDeadlineExceeded) << r.status;
  EXPECT_TRUE(r.not_answering);
  EXPECT_EQ(r.peer_params, nullptr);
  // A hang guard (about 40 x the fetch timeout), not a target: the fetch
  // ends by its own timeout instead of waiting on the stalled peer.
  EXPECT_LT(absl::Now() - t0, absl::Seconds(30));
  // Its flow-control score drops.
  FakeClock clock;
  PeerChooser chooser(&clock, 1);
  chooser.SetPeers({{"w9", peer.address()}});
  chooser.OnTimeout("w9");
  EXPECT_LT(chooser.Score("w9"), 1.0);
}

TEST_F(GossipPeersTest, RefusalsHaveTheirCodes) {
  GossipNode peer(1.0f);
  GossipFetcher fetcher(&client_, "reader", nullptr, &stop_);
  // Nothing published yet.
  GossipFetchResult r = fetcher.FetchNow("w9", peer.address(), kElements, absl::Seconds(20));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kFailedPrecondition) << r.status;
  peer.board.Publish(peer.params.data(), kElements, 1, 1);
  // Another model size.
  r = fetcher.FetchNow("w9", peer.address(), kElements + 1, absl::Seconds(20));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument) << r.status;
  // A publication that no longer exists, and a range past the end.
  shoal::v1::ReadSliceRequest req;
  req.set_kind(shoal::v1::GOSSIP);
  req.set_round(999);
  req.set_begin(0);
  req.set_end(10);
  auto noop = [](const ChunkView&) { return true; };
  EXPECT_EQ(client_.ReadSlice(peer.address(), req, absl::Seconds(20), noop).code(),
            absl::StatusCode::kFailedPrecondition);
  req.set_round(peer.board.Current()->publication);
  req.set_end(kElements + 5);
  EXPECT_EQ(client_.ReadSlice(peer.address(), req, absl::Seconds(20), noop).code(),
            absl::StatusCode::kOutOfRange);
  // A worker without a board (not gossiping): NOT_FOUND.
  peer.service.set_gossip_board(nullptr);
  req.set_end(10);
  EXPECT_EQ(client_.ReadSlice(peer.address(), req, absl::Seconds(20), noop).code(),
            absl::StatusCode::kNotFound);
}

TEST_F(GossipPeersTest, BackgroundFetchBehindNatPushesOurModelBack) {
  GossipNode peer(4.0f);
  PushBox box(uint64_t{64} << 20);
  peer.service.set_push_box(&box);
  peer.board.Publish(peer.params.data(), kElements, 1000, 0.5);
  GossipBoard own_board;
  std::vector<float> own(kElements, 2.5f);
  auto base = own_board.Publish(own.data(), kElements, 700, 0.75);
  GossipFetcher fetcher(&client_, "reader", nullptr, &stop_);
  fetcher.set_push_own(true);
  ASSERT_TRUE(fetcher.Start("w9", peer.address(), kElements, absl::Seconds(20), base));
  std::optional<GossipFetchResult> r;
  ASSERT_TRUE(::shoal::testing::WaitUntil([&] { return (r = fetcher.Take()).has_value(); },
                                          absl::Seconds(30)));
  ASSERT_TRUE(r->status.ok()) << r->status;
  EXPECT_TRUE(r->pushed) << r->push_status;
  EXPECT_EQ(std::vector<float>(r->peer_params, r->peer_params + kElements), peer.params);
  std::optional<GossipPush> pushed = box.TakeGossip();
  ASSERT_TRUE(pushed.has_value());
  EXPECT_EQ(pushed->pusher, "reader");
  EXPECT_EQ(pushed->publication, base->publication);
  EXPECT_DOUBLE_EQ(pushed->clock, 700);
  ASSERT_EQ(pushed->bytes.size(), kElements * sizeof(float));
  EXPECT_EQ(std::memcmp(pushed->bytes.data(), own.data(), pushed->bytes.size()), 0);
  EXPECT_TRUE(fetcher.idle());
}

TEST_F(GossipPeersTest, StopEndsABackgroundFetchOfAStalledPeerAtOnce) {
  GossipNode peer(1.0f);
  peer.board.Publish(peer.params.data(), kElements, 640, 1.0);
  peer.faulty.set_fault(::shoal::testing::FaultyPeer::Fault::kStall);
  GossipFetcher fetcher(&client_, "reader", nullptr, &stop_);
  ASSERT_TRUE(fetcher.Start("w9", peer.address(), kElements, absl::Seconds(60), nullptr));
  EXPECT_FALSE(fetcher.idle());
  stop_.Cancel();
  // Long before the fetch's own 60 s deadline.
  std::optional<GossipFetchResult> r;
  ASSERT_TRUE(::shoal::testing::WaitUntil([&] { return (r = fetcher.Take()).has_value(); },
                                          absl::Seconds(20)));
  EXPECT_TRUE(absl::IsCancelled(r->status)) << r->status;
  EXPECT_EQ(r->peer_params, nullptr);
}

}  // namespace
}  // namespace shoal::worker
