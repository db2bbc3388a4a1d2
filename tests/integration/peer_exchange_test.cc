// Integration tests of the peer-to-peer exchange over real gRPC: PeerService
// servers on 127.0.0.1:0, GrpcPeerClient, Exchanger. Every read has a
// timeout; every server is stopped by its owner's destructor.
#include <grpc/grpc.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/sync_stream.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/chunk_codec.h"
#include "common/crc32c.h"
#include "common/grpc_util.h"
#include "common/member_credentials.h"
#include "common/reactor_handoff.h"
#include "common/shard_plan.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/worker/core/model_state.h"
#include "services/worker/exchanger.h"
#include "services/worker/peer_client.h"
#include "services/worker/peer_service.h"
#include "shoal/v1/coordinator.pb.h"
#include "shoal/v1/peer.grpc.pb.h"
#include "tests/support/test_support.h"

namespace shoal::worker {
namespace {

using ::shoal::v1::ReadSliceRequest;
using ::shoal::v1::TensorChunk;

// Keeps gRPC initialised for the whole test binary. Otherwise gRPC 1.51 tears
// the library down whenever a test's last server or channel goes away, and
// that teardown sometimes blocks ~10 s joining an executor thread that sits
// in a 10 s poll. Never shut down: process exit cleans up.
[[maybe_unused]] const bool kGrpcKeptInitialised = [] {
  grpc_init();
  return true;
}();

// A hang guard for reads and waits, not a target: a loaded machine is slow.
constexpr absl::Duration kTimeout = absl::Seconds(30);
// Plan attempt used throughout.
constexpr uint32_t kAttempt = 1;

// One in-process "worker": its parameters, the state its PeerService serves
// from, the server, and its own outbound client and exchanger.
struct PeerNode {
  PeerNode(std::string id, std::vector<float> initial, PeerServiceOptions service_options = {})
      : id(std::move(id)), params(std::move(initial)), service(&state, nullptr, service_options) {
    state.Bind(params.data(), params.size(), "mlp");
    state.SetWorkerId(this->id);
    auto started = GrpcServer::Start("127.0.0.1:0", {&service});
    EXPECT_TRUE(started.ok()) << started.status();
    if (started.ok()) server = std::move(*started);
    service.set_push_box(&push_box);
    ExchangeOptions options;
    options.timeout = absl::Seconds(30);
    options.push_box = &push_box;
    exchanger = std::make_unique<Exchanger>(&client, &state, options);
  }
  ~PeerNode() {
    state.SetShuttingDown();
    if (server != nullptr) server->Shutdown(absl::Seconds(1));
  }
  std::string address() const { return server != nullptr ? server->address() : ""; }

  std::string id;
  std::vector<float> params;
  ModelState state;
  PushBox push_box{uint64_t{64} << 20};
  PeerService service;
  std::unique_ptr<GrpcServer> server;
  GrpcPeerClient client;
  std::unique_ptr<Exchanger> exchanger;
};

std::vector<float> RandomVector(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  // Positive values: no cancellation, so float sums stay within a few ulp
  // of the exact mean.
  std::uniform_real_distribution<float> dist(0.5f, 1.5f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng) * scale;
  return v;
}

// Reads [begin, end) of `kind` with a real GrpcPeerClient; collects the
// elements it received.
absl::Status Read(GrpcPeerClient* client, const std::string& address, uint64_t round,
                  uint64_t begin, uint64_t end, v1::SliceKind kind,
                  std::vector<float>* out = nullptr, uint32_t attempt = kAttempt) {
  ReadSliceRequest request;
  request.set_round(round);
  request.set_attempt(attempt);
  request.set_begin(begin);
  request.set_end(end);
  request.set_kind(kind);
  request.set_reader_id("test");
  return client->ReadSlice(address, request, kTimeout, [&](const ChunkView& c) {
    if (out != nullptr) {
      const size_t at = out->size();
      out->resize(at + c.count);
      c.CopyTo(out->data() + at);
    }
    return true;
  });
}

TEST(PeerExchangeTest, ThreeWorkersAverageToTheMean) {
  // About 2.7 MiB per worker: several 1 MiB chunks per slice read.
  constexpr size_t kElements = 700'000;
  constexpr uint64_t kRound = 1;
  std::vector<std::unique_ptr<PeerNode>> nodes;
  for (int k = 0; k < 3; ++k) {
    nodes.push_back(std::make_unique<PeerNode>(absl::StrCat("w", k + 1),
                                               RandomVector(kElements, 100 + k, k + 1.0f)));
    ASSERT_NE(nodes.back()->server, nullptr);
  }
  std::vector<double> mean(kElements);
  for (size_t i = 0; i < kElements; ++i) {
    double sum = 0;
    for (const auto& n : nodes) sum += n->params[i];
    mean[i] = sum / nodes.size();
  }
  for (auto& n : nodes) {
    n->state.BeginTraining(kRound);
    n->state.SetReady(kRound);
  }

  v1::RoundPlan plan;
  plan.set_round(kRound);
  plan.set_total_elements(kElements);
  plan.set_attempt(kAttempt);
  const uint64_t bounds[] = {0, 233'334, 466'667, kElements};
  for (int k = 0; k < 3; ++k) {
    auto* s = plan.add_slices();
    s->set_worker_id(nodes[k]->id);
    s->set_peer_address(nodes[k]->address());
    s->set_begin(bounds[k]);
    s->set_end(bounds[k + 1]);
  }

  std::vector<absl::Status> results(3);
  std::vector<ExchangeStats> stats(3);
  {
    std::vector<std::thread> threads;
    for (int k = 0; k < 3; ++k) {
      threads.emplace_back([&, k] {
        results[k] = nodes[k]->exchanger->Average(plan, nodes[k]->id, nodes[k]->params.data(),
                                                  nullptr, &stats[k]);
      });
    }
    for (auto& t : threads) t.join();
  }
  for (int k = 0; k < 3; ++k) {
    ASSERT_TRUE(results[k].ok()) << nodes[k]->id << ": " << results[k];
    // Two contributions of its own slice, then the two other averaged slices.
    const uint64_t own = bounds[k + 1] - bounds[k];
    EXPECT_EQ(stats[k].bytes_received, (2 * own + (kElements - own)) * sizeof(float))
        << nodes[k]->id;
  }

  EXPECT_EQ(std::memcmp(nodes[0]->params.data(), nodes[1]->params.data(), kElements * 4), 0)
      << "w1 and w2 differ";
  EXPECT_EQ(std::memcmp(nodes[0]->params.data(), nodes[2]->params.data(), kElements * 4), 0)
      << "w1 and w3 differ";
  size_t bad = 0;
  for (size_t i = 0; i < kElements; ++i) {
    const double got = nodes[0]->params[i];
    if (std::abs(got - mean[i]) > 1e-6 * std::abs(mean[i])) {
      if (++bad <= 5) ADD_FAILURE() << "element " << i << ": " << got << " vs mean " << mean[i];
    }
  }
  EXPECT_EQ(bad, 0u);
}

// A participant behind NAT (outbound_only): its plan address leads nowhere
// (port 1 on loopback refuses), so the round completes only if it pushes its
// contributions and nobody tries to read it; everyone ends with the mean.
TEST(PeerExchangeTest, ParticipantBehindNatPushesAndEveryoneGetsTheMean) {
  constexpr size_t kElements = 300'000;
  constexpr uint64_t kRound = 4;
  std::vector<std::unique_ptr<PeerNode>> nodes;
  for (int k = 0; k < 3; ++k) {
    nodes.push_back(std::make_unique<PeerNode>(absl::StrCat("w", k + 1),
                                               RandomVector(kElements, 300 + k, k + 1.0f)));
    ASSERT_NE(nodes.back()->server, nullptr);
  }
  std::vector<double> mean(kElements);
  for (size_t i = 0; i < kElements; ++i) {
    double sum = 0;
    for (const auto& n : nodes) sum += n->params[i];
    mean[i] = sum / nodes.size();
  }
  for (auto& n : nodes) {
    n->state.BeginTraining(kRound);
    n->state.SetReady(kRound);
  }
  v1::RoundPlan plan;
  plan.set_round(kRound);
  plan.set_total_elements(kElements);
  plan.set_attempt(kAttempt);
  // w2 is behind NAT: the owners are w1 and w3 (PlanSlicesAmong).
  const std::vector<SliceRange> ranges = PlanSlicesAmong(kElements, {false, true, false});
  for (int k = 0; k < 3; ++k) {
    auto* s = plan.add_slices();
    s->set_worker_id(nodes[k]->id);
    s->set_peer_address(k == 1 ? "127.0.0.1:1" : nodes[k]->address());
    s->set_begin(ranges[k].begin);
    s->set_end(ranges[k].end);
    s->set_outbound_only(k == 1);
  }
  std::vector<absl::Status> results(3);
  {
    std::vector<std::thread> threads;
    for (int k = 0; k < 3; ++k) {
      threads.emplace_back([&, k] {
        results[k] = nodes[k]->exchanger->Average(plan, nodes[k]->id, nodes[k]->params.data(),
                                                  nullptr, nullptr);
      });
    }
    for (auto& t : threads) t.join();
  }
  for (int k = 0; k < 3; ++k) ASSERT_TRUE(results[k].ok()) << nodes[k]->id << ": " << results[k];
  for (int k = 1; k < 3; ++k) {
    EXPECT_EQ(std::memcmp(nodes[0]->params.data(), nodes[k]->params.data(), kElements * 4), 0)
        << "w1 and " << nodes[k]->id << " differ";
  }
  size_t bad = 0;
  for (size_t i = 0; i < kElements; ++i) {
    if (std::abs(nodes[0]->params[i] - mean[i]) > 1e-6 * std::abs(mean[i]) && ++bad <= 5) {
      ADD_FAILURE() << "element " << i << ": " << nodes[0]->params[i] << " vs " << mean[i];
    }
  }
  EXPECT_EQ(bad, 0u);
  for (const auto& n : nodes) EXPECT_EQ(n->push_box.bytes(), 0u) << n->id;
}

// Malformed pushes are refused with INVALID_ARGUMENT and leave nothing behind.
TEST(PeerExchangeTest, MalformedPushesAreRefused) {
  PeerNode node("w1", RandomVector(100, 1, 1.0f));
  ASSERT_NE(node.server, nullptr);
  GrpcPeerClient client;
  v1::PushHeader header;
  header.set_round(1);
  header.set_attempt(1);
  header.set_begin(0);
  header.set_end(10);
  header.set_pusher_id("w9");
  header.set_total_bytes(40);
  // Fewer bytes than the header announced.
  EXPECT_EQ(client.Push(node.address(), header, std::string(20, 'x'), kTimeout, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  // A raw push must be exactly the slice's float32 bytes.
  header.set_total_bytes(44);
  EXPECT_EQ(client.Push(node.address(), header, std::string(44, 'x'), kTimeout, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  header.set_begin(10);  // reversed
  header.set_total_bytes(0);
  EXPECT_EQ(client.Push(node.address(), header, "", kTimeout, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(node.push_box.bytes(), 0u);
  // And a good one is kept.
  header.set_begin(0);
  header.set_total_bytes(40);
  EXPECT_TRUE(client.Push(node.address(), header, std::string(40, 'x'), kTimeout, nullptr).ok());
  EXPECT_EQ(node.push_box.bytes(), 40u);
}

// Found by the soak (issue 30): a worker behind NAT pushed without its member
// credential, so with --token_file every push was PERMISSION_DENIED and no
// round with it ever completed. A push carries the credential like a read.
TEST(PeerExchangeTest, PushCarriesTheMemberCredential) {
  MemberRoster roster(42);
  MemberSet members;
  members.Enable();
  members.Apply(roster.Full());
  v1::MemberUpdate update;
  const std::string credential = roster.Issue("w9", &update);
  members.Apply(update);
  PeerServiceOptions options;
  options.members = &members;
  PeerNode node("w1", RandomVector(100, 1, 1.0f), options);
  ASSERT_NE(node.server, nullptr);
  v1::PushHeader header;
  header.set_round(1);
  header.set_attempt(1);
  header.set_begin(0);
  header.set_end(10);
  header.set_pusher_id("w9");
  header.set_total_bytes(40);
  GrpcPeerClient stranger;
  EXPECT_EQ(stranger.Push(node.address(), header, std::string(40, 'x'), kTimeout, nullptr).code(),
            absl::StatusCode::kPermissionDenied);
  MemberCredentialHolder holder;
  holder.Set("w9", credential);
  GrpcPeerClient member(&holder);
  const absl::Status pushed =
      member.Push(node.address(), header, std::string(40, 'x'), kTimeout, nullptr);
  EXPECT_TRUE(pushed.ok()) << pushed;
  EXPECT_EQ(node.push_box.bytes(), 40u);
}

class PeerServiceTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kElements = 10'000;
  static constexpr uint64_t kRound = 2;

  void SetUp() override {
    // A short wait for averages, so that "not averaged yet" answers quickly.
    PeerServiceOptions options;
    options.averaged_wait = absl::Milliseconds(200);
    node_ = std::make_unique<PeerNode>("w1", RandomVector(kElements, 7, 1.0f), options);
    ASSERT_NE(node_->server, nullptr);
    node_->state.BeginTraining(kRound);
    node_->state.SetReady(kRound);
    node_->state.SetPlan(kRound, kAttempt, 0, kElements / 2);
  }

  std::unique_ptr<PeerNode> node_;
  GrpcPeerClient client_;
};

TEST_F(PeerServiceTest, RefusesBadReadsAndKeepsServing) {
  const std::string addr = node_->address();
  auto read = [&](uint64_t round, uint64_t begin, uint64_t end, v1::SliceKind kind) {
    return Read(&client_, addr, round, begin, end, kind).code();
  };
  EXPECT_EQ(read(kRound, 10, 10, v1::CONTRIBUTION), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(read(kRound, 20, 10, v1::CONTRIBUTION), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(read(kRound, 0, 10, v1::SLICE_KIND_UNSPECIFIED), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(read(kRound, 0, kElements + 1, v1::CONTRIBUTION), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(read(kRound, kElements, kElements + 5, v1::CONTRIBUTION),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(read(kRound - 1, 0, 10, v1::CONTRIBUTION), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(read(kRound + 1, 0, 10, v1::CONTRIBUTION), absl::StatusCode::kFailedPrecondition);
  // Owned: [0, kElements / 2).
  EXPECT_EQ(read(kRound, kElements / 2, kElements, v1::AVERAGED),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(read(kRound, kElements / 2 - 1, kElements / 2 + 1, v1::AVERAGED),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(read(kRound, 0, 10, v1::AVERAGED), absl::StatusCode::kUnavailable)
      << "not averaged yet";
  EXPECT_EQ(Read(&client_, addr, kRound, 0, 10, v1::CONTRIBUTION, nullptr, kAttempt + 1).code(),
            absl::StatusCode::kFailedPrecondition)
      << "another plan attempt";

  // Still serving: a valid read returns exactly the parameters.
  std::vector<float> got;
  absl::Status s = Read(&client_, addr, kRound, 0, kElements, v1::CONTRIBUTION, &got);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(got.size(), kElements);
  EXPECT_EQ(std::memcmp(got.data(), node_->params.data(), kElements * sizeof(float)), 0);

  node_->state.MarkAveraged(kRound);
  got.clear();
  s = Read(&client_, addr, kRound, 100, kElements / 2, v1::AVERAGED, &got);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(got.size(), kElements / 2 - 100);
  EXPECT_EQ(std::memcmp(got.data(), node_->params.data() + 100, got.size() * sizeof(float)), 0);
}

TEST_F(PeerServiceTest, ServesTheSnapshotOfItsRound) {
  const std::string addr = node_->address();
  EXPECT_EQ(Read(&client_, addr, 1, 0, 10, v1::SNAPSHOT).code(), absl::StatusCode::kUnavailable)
      << "no snapshot yet";
  std::vector<float> snapshot = RandomVector(kElements, 99, 3.0f);
  node_->state.BindSnapshot(snapshot.data());
  node_->state.SetSnapshot(1);
  std::vector<float> got;
  absl::Status s = Read(&client_, addr, 1, 0, kElements, v1::SNAPSHOT, &got);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(got.size(), kElements);
  EXPECT_EQ(std::memcmp(got.data(), snapshot.data(), kElements * sizeof(float)), 0);
  EXPECT_EQ(Read(&client_, addr, 2, 0, 10, v1::SNAPSHOT).code(),
            absl::StatusCode::kFailedPrecondition)
      << "it holds the model of round 1 only";
  node_->state.BeginSnapshotUpdate();
  EXPECT_EQ(Read(&client_, addr, 1, 0, 10, v1::SNAPSHOT).code(), absl::StatusCode::kUnavailable)
      << "being replaced";
}

// With a run token (--token_file) a worker serves members only: a caller
// without the token gets UNAUTHENTICATED for every read, and the worker
// keeps serving those who have it.
TEST(PeerServiceTokenTest, ReadsNeedTheRunToken) {
  constexpr uint64_t kElements = 1000;
  constexpr char kToken[] = "run-token-0123456789";
  PeerServiceOptions options;
  options.gate = TokenGate(kToken, "");
  PeerNode node("w1", RandomVector(kElements, 7, 1.0f), options);
  ASSERT_NE(node.server, nullptr);
  node.state.BeginTraining(2);
  node.state.SetReady(2);
  node.state.SetPlan(2, kAttempt, 0, kElements / 2);
  auto info = [&](absl::StatusCode* code) {
    auto stub = v1::Peer::NewStub(MakeChannel(node.address()));
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(kTimeout));
    v1::PeerInfo out;
    *code = static_cast<absl::StatusCode>(
        stub->GetPeerInfo(&ctx, v1::GetPeerInfoRequest(), &out).error_code());
  };
  {
    GrpcPeerClient stranger;
    EXPECT_EQ(Read(&stranger, node.address(), 2, 0, 10, v1::CONTRIBUTION).code(),
              absl::StatusCode::kUnauthenticated);
    absl::StatusCode code;
    info(&code);
    EXPECT_EQ(code, absl::StatusCode::kUnauthenticated);
  }
  SetProcessToken(kToken);  // channels made from now on send it
  GrpcPeerClient member;
  std::vector<float> got;
  absl::Status s = Read(&member, node.address(), 2, 0, kElements, v1::CONTRIBUTION, &got);
  absl::StatusCode code;
  info(&code);
  SetProcessToken("");
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(std::memcmp(got.data(), node.params.data(), kElements * sizeof(float)), 0);
  EXPECT_EQ(code, absl::StatusCode::kOk);
}

// --max_reads_per_peer: a caller host with that many reads running gets
// RESOURCE_EXHAUSTED for the next one, and is served again once one ends.
TEST(PeerServiceLimitTest, ReadsPerCallerAreCapped) {
  constexpr uint64_t kElements = 1000;
  PeerServiceOptions options;
  options.max_reads_per_peer = 1;
  options.averaged_wait = absl::Seconds(3);  // an AVERAGED read parks: it stays running
  PeerNode node("w1", RandomVector(kElements, 7, 1.0f), options);
  ASSERT_NE(node.server, nullptr);
  node.state.BeginTraining(2);
  node.state.SetReady(2);
  node.state.SetPlan(2, kAttempt, 0, kElements / 2);
  // One client per thread: two callers on the same host.
  GrpcPeerClient parked_client;
  GrpcPeerClient client;
  absl::Status parked;
  std::thread waiting([&] {
    // Refused while one of the probes below holds the host's slot: try again.
    const absl::Time give_up = absl::Now() + kTimeout;
    do {
      std::vector<float> got;
      parked = Read(&parked_client, node.address(), 2, 0, 10, v1::AVERAGED, &got);
    } while (parked.code() == absl::StatusCode::kResourceExhausted && absl::Now() < give_up);
  });
  struct Join {
    std::thread* t;
    ~Join() {
      if (t->joinable()) t->join();
    }
  } join{&waiting};
  // While the parked read runs, a second one from this host is refused.
  absl::Status second;
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        second = Read(&client, node.address(), 2, 0, 10, v1::CONTRIBUTION);
        return second.code() == absl::StatusCode::kResourceExhausted;
      },
      absl::Seconds(2)))
      << second;
  EXPECT_NE(second.message().find("--max_reads_per_peer=1"), std::string::npos) << second;
  node.state.MarkAveraged(2);  // the parked read is served and ends
  waiting.join();              // (the guard joins it when an assertion above returns early)
  EXPECT_TRUE(parked.ok()) << parked;
  std::vector<float> got;
  absl::Status s;
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        got.clear();
        s = Read(&client, node.address(), 2, 0, kElements, v1::CONTRIBUTION, &got);
        return s.ok();
      },
      absl::Seconds(5)))
      << s;
  EXPECT_EQ(got.size(), kElements);
}

TEST_F(PeerServiceTest, PeerInfoDescribesTheWorker) {
  node_->state.SetModel(1, std::string(64, 'e'));
  auto stub = v1::Peer::NewStub(MakeChannel(node_->address()));
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(kTimeout));
  v1::PeerInfo info;
  grpc::Status s = stub->GetPeerInfo(&ctx, v1::GetPeerInfoRequest(), &info);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(info.worker_id(), "w1");
  EXPECT_EQ(info.model_round(), 1u);
  EXPECT_EQ(info.model_hash(), std::string(64, 'e'));
  EXPECT_EQ(info.total_elements(), kElements);
  EXPECT_EQ(info.model(), "mlp");
}

// ------------------------------------------------ the zero-copy ReadSlice

ReadSliceRequest MakeRequest(uint64_t round, uint64_t begin, uint64_t end, v1::SliceKind kind,
                             uint32_t attempt = kAttempt) {
  ReadSliceRequest request;
  request.set_round(round);
  request.set_attempt(attempt);
  request.set_begin(begin);
  request.set_end(end);
  request.set_kind(kind);
  request.set_reader_id("test");
  return request;
}

class ZeroCopyServiceTest : public ::testing::Test {
 protected:
  // 2.7 cells of the 1 MiB grid.
  static constexpr uint64_t kElements = 700'000;
  static constexpr uint64_t kRound = 4;
  static constexpr uint64_t kCell = ModelState::kCellElements;

  void Start(PeerServiceOptions options = {}) {
    node_ = std::make_unique<PeerNode>("w1", RandomVector(kElements, 8, 1.0f), options);
    ASSERT_NE(node_->server, nullptr);
    node_->state.BeginTraining(kRound);
    node_->state.SetReady(kRound);
    node_->state.SetPlan(kRound, kAttempt, 0, kElements / 2);
  }

  // Every chunk lent to gRPC is eventually given back.
  void ExpectAllReturned() {
    EXPECT_TRUE(testing::WaitUntil(
        [&] { return node_->state.chunks_lent(ModelState::Buffer::kParameters) == 0; }, kTimeout));
  }

  std::unique_ptr<PeerNode> node_;
  GrpcPeerClient client_;
};

// What the raw server writes is a TensorChunk stream to any protobuf client:
// the generated typed stub parses every chunk, each passes the standard
// checks, and chunks follow the 1 MiB grid.
TEST_F(ZeroCopyServiceTest, StandardProtobufClientReadsTheStream) {
  Start();
  auto stub = v1::Peer::NewStub(MakeChannel(node_->address()));
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(kTimeout));
  const uint64_t begin = 1000, end = 650'000;
  auto reader = stub->ReadSlice(&ctx, MakeRequest(kRound, begin, end, v1::CONTRIBUTION));
  ChunkReceiver receiver(kRound, begin, end);
  std::vector<float> got(end, 0.0f);
  std::vector<uint64_t> starts;
  TensorChunk chunk;
  while (reader->Read(&chunk)) {
    absl::StatusOr<ChunkView> view = receiver.Accept(chunk);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_LE(chunk.data().size(), kChunkBytes);
    starts.push_back(view->begin);
    view->CopyTo(got.data() + view->begin);
  }
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_TRUE(receiver.Finish().ok());
  EXPECT_EQ(starts, (std::vector<uint64_t>{begin, kCell, 2 * kCell}));
  EXPECT_EQ(
      std::memcmp(got.data() + begin, node_->params.data() + begin, (end - begin) * sizeof(float)),
      0);
  ExpectAllReturned();
}

TEST_F(ZeroCopyServiceTest, GrpcPeerClientReadsWholeAndPartialCells) {
  Start();
  for (auto [begin, end] : std::vector<std::pair<uint64_t, uint64_t>>{
           {0, kElements}, {0, kCell}, {kCell - 1, kCell + 1}, {123, 124}, {kCell, kElements}}) {
    std::vector<float> got;
    absl::Status s = Read(&client_, node_->address(), kRound, begin, end, v1::CONTRIBUTION, &got);
    ASSERT_TRUE(s.ok()) << begin << ".." << end << ": " << s;
    ASSERT_EQ(got.size(), end - begin);
    EXPECT_EQ(std::memcmp(got.data(), node_->params.data() + begin, (end - begin) * sizeof(float)),
              0);
  }
  ExpectAllReturned();
}

// Bad bytes as the request: a clear INVALID_ARGUMENT, and the server goes on.
TEST_F(ZeroCopyServiceTest, MalformedRequestIsInvalidArgument) {
  Start();
  auto channel = MakeChannel(node_->address());
  const grpc::internal::RpcMethod method("/shoal.v1.Peer/ReadSlice",
                                         grpc::internal::RpcMethod::SERVER_STREAMING, channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(kTimeout));
  const std::string garbage = "\x0a\xff\xff";  // a field claiming more bytes than follow
  grpc::Slice slice(garbage);
  grpc::ByteBuffer request(&slice, 1);
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel.get(), method, &ctx,
                                                                    request));
  grpc::ByteBuffer message;
  EXPECT_FALSE(reader->Read(&message));
  const grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_TRUE(Read(&client_, node_->address(), kRound, 0, 10, v1::CONTRIBUTION).ok());
}

// An AVERAGED read of a slice not averaged yet waits on the server and
// returns the average as soon as it is there.
TEST_F(ZeroCopyServiceTest, ParkedAveragedReadReturnsWhenAveraged) {
  // The park would last until just before the reader's deadline (kLongRead),
  // far beyond the hang guard (kTimeout) the test waits for the answer: an
  // answer at the end of the park, not on MarkAveraged, fails the wait.
  constexpr absl::Duration kLongRead = absl::Minutes(5);
  PeerServiceOptions options;
  options.averaged_wait = absl::Minutes(10);
  Start(options);
  std::vector<float> got;
  absl::Status s;
  std::atomic<bool> finished{false};
  CancellationToken canceller;
  std::thread reader([&] {
    got.clear();
    s = client_.ReadSliceCancellable(node_->address(),
                                     MakeRequest(kRound, 100, kElements / 2, v1::AVERAGED),
                                     kLongRead, &canceller, [&](const ChunkView& c) {
                                       const size_t at = got.size();
                                       got.resize(at + c.count);
                                       c.CopyTo(got.data() + at);
                                       return true;
                                     });
    finished = true;
  });
  // Parked: registered with ModelState, not answered.
  ASSERT_TRUE(testing::WaitUntil([&] { return node_->state.observer_count() == 1; }, kTimeout));
  EXPECT_FALSE(finished.load());
  for (uint64_t i = 0; i < kElements / 2; ++i) node_->params[i] *= 0.5f;  // "the average"
  node_->state.MarkAveraged(kRound);
  const bool answered = testing::WaitUntil([&] { return finished.load(); }, kTimeout);
  if (!answered) canceller.Cancel();
  reader.join();
  ASSERT_TRUE(answered) << "not answered when averaged (only the park's end would)";
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(got.size(), kElements / 2 - 100);
  EXPECT_EQ(std::memcmp(got.data(), node_->params.data() + 100, got.size() * sizeof(float)), 0);
  ExpectAllReturned();
  EXPECT_TRUE(testing::WaitUntil([&] { return node_->state.observer_count() == 0; }, kTimeout));
}

// Not averaged within the server's wait: UNAVAILABLE (retryable), saying so.
TEST_F(ZeroCopyServiceTest, ParkedAveragedReadTimesOutUnavailable) {
  PeerServiceOptions options;
  options.averaged_wait = absl::Milliseconds(300);
  Start(options);
  // UNAVAILABLE saying it waited: the server's own wait ended (the reader's
  // deadline, kTimeout, would have been DEADLINE_EXCEEDED).
  absl::Status s = Read(&client_, node_->address(), kRound, 0, 10, v1::AVERAGED);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("not averaged yet"), std::string::npos) << s;
  EXPECT_NE(s.message().find("waited"), std::string::npos) << s;
  EXPECT_TRUE(testing::WaitUntil([&] { return node_->state.observer_count() == 0; }, kTimeout));
}

// The server's wait ends before the reader's deadline, so the reader hears
// why rather than DEADLINE_EXCEEDED.
TEST_F(ZeroCopyServiceTest, ParkedReadEndsBeforeTheReadersDeadline) {
  PeerServiceOptions options;
  options.averaged_wait = absl::Seconds(30);
  Start(options);
  // The server stops waiting 500 ms before the reader's deadline.
  constexpr absl::Duration kReaderTimeout = absl::Seconds(2);
  // UNAVAILABLE, not DEADLINE_EXCEEDED: the answer came before the reader's
  // deadline (the status says so; no clock needed).
  absl::Status s = client_.ReadSlice(node_->address(), MakeRequest(kRound, 0, 10, v1::AVERAGED),
                                     kReaderTimeout, [](const ChunkView&) { return true; });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("waited"), std::string::npos) << s;
}

// A change that makes the read impossible ends the wait at once, with the
// read's own refusal.
TEST_F(ZeroCopyServiceTest, ParkedReadEndsWhenTheRoundIsAborted) {
  // As in ParkedAveragedReadReturnsWhenAveraged: the park's own end lies far
  // beyond the hang guard the test waits for the answer.
  PeerServiceOptions options;
  options.averaged_wait = absl::Minutes(10);
  Start(options);
  absl::Status s;
  std::atomic<bool> finished{false};
  CancellationToken canceller;
  std::thread reader([&] {
    s = client_.ReadSliceCancellable(node_->address(), MakeRequest(kRound, 0, 10, v1::AVERAGED),
                                     absl::Minutes(5), &canceller,
                                     [](const ChunkView&) { return true; });
    finished = true;
  });
  ASSERT_TRUE(testing::WaitUntil([&] { return node_->state.observer_count() == 1; }, kTimeout));
  node_->state.Abort(kRound);
  const bool answered = testing::WaitUntil([&] { return finished.load(); }, kTimeout);
  if (!answered) canceller.Cancel();
  reader.join();
  ASSERT_TRUE(answered) << "the abort did not end the park";
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

// A reader that gives up while parked frees the server's wait.
TEST_F(ZeroCopyServiceTest, CancelledParkedReadIsReleased) {
  PeerServiceOptions options;
  options.averaged_wait = absl::Seconds(10);
  Start(options);
  CancellationToken canceller;
  absl::Status s;
  std::thread reader([&] {
    s = client_.ReadSliceCancellable(node_->address(), MakeRequest(kRound, 0, 10, v1::AVERAGED),
                                     kTimeout, &canceller, [](const ChunkView&) { return true; });
  });
  ASSERT_TRUE(testing::WaitUntil([&] { return node_->state.observer_count() == 1; }, kTimeout));
  canceller.Cancel();
  reader.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_TRUE(testing::WaitUntil([&] { return node_->state.observer_count() == 0; }, kTimeout));
}

// Peer.ReadEncoded of a piece its owner has not published yet waits on the
// server (EncodedStore::Await and a timer) instead of the reader asking
// again with backoff: answered when published, UNAVAILABLE saying it waited
// when the server's wait ends, released when the reader gives up.
class ParkedEncodedReadTest : public ::testing::Test {
 protected:
  void Start(absl::Duration wait) {
    PeerServiceOptions options;
    options.averaged_wait = wait;
    node_ = std::make_unique<PeerNode>("w1", RandomVector(100, 8, 1.0f), options);
    ASSERT_NE(node_->server, nullptr);
    node_->service.set_encoded_store(&store_);
    store_.BeginRound(kRound, kAttempt);
  }
  static v1::ReadEncodedRequest Averaged() {
    v1::ReadEncodedRequest r;
    r.set_round(kRound);
    r.set_attempt(kAttempt);
    r.set_kind(v1::AVERAGED);
    r.set_begin(0);
    r.set_end(100);
    r.set_reader_id("test");
    return r;
  }
  static constexpr uint64_t kRound = 5;
  EncodedStore store_;  // outlives the node's server
  std::unique_ptr<PeerNode> node_;
  GrpcPeerClient client_;
};

TEST_F(ParkedEncodedReadTest, AnsweredWhenPublished) {
  // The server's wait and the reader's deadline lie far beyond the hang
  // guard the test waits for the answer: only the Publish can answer it.
  Start(absl::Minutes(10));
  absl::StatusOr<v1::EncodedPiece> piece = absl::UnknownError("not answered");
  std::atomic<bool> finished{false};
  CancellationToken canceller;
  std::thread reader([&] {
    piece = client_.ReadEncoded(node_->address(), Averaged(), absl::Minutes(5), &canceller);
    finished = true;
  });
  ASSERT_TRUE(testing::WaitUntil([&] { return store_.waiting() == 1; }, kTimeout));
  EXPECT_FALSE(finished.load());
  store_.Publish(kRound, kAttempt, v1::AVERAGED, 0, 100,
                 std::make_shared<const std::string>("the encoded average"));
  const bool answered = testing::WaitUntil([&] { return finished.load(); }, kTimeout);
  if (!answered) canceller.Cancel();
  reader.join();
  ASSERT_TRUE(answered) << "not answered when published";
  ASSERT_TRUE(piece.ok()) << piece.status();
  EXPECT_EQ(piece->data(), "the encoded average");
  EXPECT_EQ(piece->total_bytes(), piece->data().size());
}

TEST_F(ParkedEncodedReadTest, TheServersWaitEndsUnavailableSayingSo) {
  Start(absl::Milliseconds(300));
  CancellationToken stop;
  absl::StatusOr<v1::EncodedPiece> piece =
      client_.ReadEncoded(node_->address(), Averaged(), kTimeout, &stop);
  EXPECT_EQ(piece.status().code(), absl::StatusCode::kUnavailable) << piece.status();
  EXPECT_NE(piece.status().message().find("waited"), std::string::npos) << piece.status();
  EXPECT_EQ(store_.waiting(), 0u);
  // A new attempt refuses what the old one never published, at once.
  store_.BeginRound(kRound, kAttempt + 1);
  piece = client_.ReadEncoded(node_->address(), Averaged(), kTimeout, &stop);
  EXPECT_EQ(piece.status().code(), absl::StatusCode::kFailedPrecondition) << piece.status();
}

TEST_F(ParkedEncodedReadTest, AReaderThatGivesUpFreesTheWait) {
  Start(absl::Minutes(10));
  CancellationToken canceller;
  absl::StatusOr<v1::EncodedPiece> piece = absl::UnknownError("not answered");
  std::thread reader(
      [&] { piece = client_.ReadEncoded(node_->address(), Averaged(), kTimeout, &canceller); });
  ASSERT_TRUE(testing::WaitUntil([&] { return store_.waiting() == 1; }, kTimeout));
  canceller.Cancel();
  reader.join();
  EXPECT_FALSE(piece.ok());
  EXPECT_TRUE(testing::WaitUntil([&] { return store_.waiting() == 0; }, kTimeout));
  // The server goes on: a published piece is served.
  store_.Publish(kRound, kAttempt, v1::AVERAGED, 0, 100, std::make_shared<const std::string>("x"));
  CancellationToken stop;
  EXPECT_TRUE(client_.ReadEncoded(node_->address(), Averaged(), kTimeout, &stop).ok());
}

// A model much larger than what loopback TCP and HTTP/2 flow control buffer
// between a server and a reader that does not read (a few MiB).
class LargeModelTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kElements = 16 << 20;  // 64 MiB, 64 chunks
  static constexpr uint64_t kRound = 4;

  void SetUp() override {
    std::vector<float> params(kElements);
    for (uint64_t i = 0; i < kElements; ++i) params[i] = static_cast<float>(i % 1013);
    node_ = std::make_unique<PeerNode>("w1", std::move(params));
    ASSERT_NE(node_->server, nullptr);
    node_->state.BeginTraining(kRound);
    node_->state.SetReady(kRound);
  }

  std::unique_ptr<PeerNode> node_;
  GrpcPeerClient client_;
};

// A reader that stops reading keeps a chunk of model memory in gRPC's
// hands. When the worker closes the window to rewrite the parameters,
// AwaitReturned cancels that stream and gets the chunk back promptly.
TEST_F(LargeModelTest, StalledReaderIsCancelledWhenTheWindowCloses) {
  auto stub = v1::Peer::NewStub(MakeChannel(node_->address()));
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(absl::Seconds(60)));
  auto reader = stub->ReadSlice(&ctx, MakeRequest(kRound, 0, kElements, v1::CONTRIBUTION));
  TensorChunk first;
  ASSERT_TRUE(reader->Read(&first));
  // Do not read on: the server fills the buffers up to flow control, then
  // its next chunk stays lent.
  ASSERT_TRUE(testing::WaitUntil(
      [&] { return node_->state.chunks_lent(ModelState::Buffer::kParameters) > 0; }, kTimeout));
  // Not a synchronization (the test holds either way): by then the buffers
  // are full, so the chunk is stuck and has to be revoked rather than sent.
  absl::SleepFor(absl::Milliseconds(300));
  node_->state.BeginTraining(kRound + 1);
  // True, not a timeout: the stalled stream was cancelled and let go.
  EXPECT_TRUE(node_->state.AwaitReturned(ModelState::Buffer::kParameters, kTimeout));
  // The stream does not complete: what was buffered arrives, then an error.
  TensorChunk more;
  int chunks = 1;
  while (reader->Read(&more)) ++chunks;
  EXPECT_LT(chunks, 64);
  const grpc::Status s = reader->Finish();
  EXPECT_TRUE(s.error_code() == grpc::StatusCode::CANCELLED ||
              s.error_code() == grpc::StatusCode::ABORTED)
      << s.error_code() << " " << s.error_message();
}

// A read whose window closes during the stream ends ABORTED at the next
// chunk it would lend.
TEST_F(LargeModelTest, WindowClosedDuringTheReadIsAborted) {
  int chunks = 0;
  absl::Status s =
      client_.ReadSlice(node_->address(), MakeRequest(kRound, 0, kElements, v1::CONTRIBUTION),
                        kTimeout, [&](const ChunkView&) {
                          if (++chunks == 1)
                            node_->state.Unready();  // e.g. a re-plan restoring the model
                          return true;
                        });
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_LT(chunks, 64);
  EXPECT_TRUE(testing::WaitUntil(
      [&] { return node_->state.chunks_lent(ModelState::Buffer::kParameters) == 0; }, kTimeout));
}

// A peer that streams whatever chunks the test gives it, then ends with OK.
class LyingPeer final : public v1::Peer::CallbackService {
 public:
  explicit LyingPeer(std::vector<TensorChunk> chunks) : chunks_(std::move(chunks)) {}

  grpc::ServerWriteReactor<TensorChunk>* ReadSlice(grpc::CallbackServerContext* ctx,
                                                   const ReadSliceRequest* request) override {
    return new Writer(chunks_);
  }

 private:
  class Writer : public grpc::ServerWriteReactor<TensorChunk> {
   public:
    explicit Writer(std::vector<TensorChunk> chunks) : chunks_(std::move(chunks)) {
      ReactionScope reaction(this);
      Next();
    }
    void OnWriteDone(bool ok) override {
      ReactionScope reaction(this, &chunks_);
      if (!ok) {
        Finish(grpc::Status(grpc::StatusCode::CANCELLED, "reader went away"));
        return;
      }
      Next();
    }
    void OnDone() override {
      AfterAllReactions(this);
      delete this;
    }

   private:
    void Next() {
      if (next_ == chunks_.size()) {
        Finish(grpc::Status::OK);
        return;
      }
      BeforeStart(&chunks_);
      StartWrite(&chunks_[next_++]);
    }
    std::vector<TensorChunk> chunks_;
    size_t next_ = 0;
  };

  const std::vector<TensorChunk> chunks_;
};

class LyingPeerTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kRound = 3;

  // A well-formed chunk of `count` elements starting at `begin`.
  static TensorChunk Chunk(uint64_t begin, size_t count) {
    std::vector<float> data(count, 1.5f);
    TensorChunk chunk;
    EncodeChunk(kRound, begin, data.data(), count, &chunk);
    return chunk;
  }

  // Serves `chunks` and reads [0, 100) from it.
  absl::Status ReadFrom(std::vector<TensorChunk> chunks, size_t* delivered) {
    LyingPeer peer(std::move(chunks));
    auto server = GrpcServer::Start("127.0.0.1:0", {&peer});
    if (!server.ok()) return server.status();
    GrpcPeerClient client;
    ReadSliceRequest request;
    request.set_round(kRound);
    request.set_begin(0);
    request.set_end(100);
    request.set_kind(v1::CONTRIBUTION);
    *delivered = 0;
    absl::Status s =
        client.ReadSlice((*server)->address(), request, kTimeout, [&](const ChunkView& c) {
          *delivered += c.count;
          return true;
        });
    (*server)->Shutdown(absl::Seconds(1));
    return s;
  }
};

TEST_F(LyingPeerTest, WrongChecksumIsDataLoss) {
  TensorChunk bad = Chunk(0, 100);
  bad.set_crc32c(bad.crc32c() ^ 1);
  size_t delivered = 0;
  absl::Status s = ReadFrom({bad}, &delivered);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(delivered, 0u) << "a bad chunk must never reach the caller";
}

TEST_F(LyingPeerTest, ChunkNotAMultipleOfFourBytesIsInvalidArgument) {
  TensorChunk bad;
  bad.set_round(kRound);
  bad.set_begin(0);
  bad.set_data(std::string(6, '\x01'));
  bad.set_crc32c(Crc32c(bad.data().data(), bad.data().size()));
  size_t delivered = 0;
  absl::Status s = ReadFrom({bad}, &delivered);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(delivered, 0u);
}

TEST_F(LyingPeerTest, ChunkPastTheRequestedRangeIsInvalidArgument) {
  size_t delivered = 0;
  absl::Status s = ReadFrom({Chunk(0, 60), Chunk(60, 60)}, &delivered);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(delivered, 60u) << "only the good first chunk is delivered";
}

TEST_F(LyingPeerTest, StreamEndingEarlyIsDataLoss) {
  size_t delivered = 0;
  absl::Status s = ReadFrom({Chunk(0, 50)}, &delivered);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(delivered, 50u);
}

TEST_F(LyingPeerTest, HonestChunksAreAccepted) {
  size_t delivered = 0;
  absl::Status s = ReadFrom({Chunk(0, 30), Chunk(30, 70)}, &delivered);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(delivered, 100u);
}

TEST(PeerClientTest, StoppedPeerIsUnavailableWithinTheTimeout) {
  ModelState state;
  PeerService service(&state);
  auto server = GrpcServer::Start("127.0.0.1:0", {&service});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();
  (*server)->Shutdown(absl::ZeroDuration());

  GrpcPeerClient client;
  // UNAVAILABLE, not DEADLINE_EXCEEDED: it gave up before its deadline.
  absl::Status s = Read(&client, address, 1, 0, 10, v1::CONTRIBUTION);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

}  // namespace
}  // namespace shoal::worker
