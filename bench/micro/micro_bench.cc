// micro: Google Benchmark micro-benchmarks of the hot paths of a transfer,
// each next to memcpy of the same bytes (the baseline: what moving the
// bytes once costs on this machine).
//
//   shoal-bench-micro --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "common/chunk_codec.h"
#include "common/clock.h"
#include "common/crc32c.h"
#include "common/run_options.h"
#include "common/sha256.h"
#include "services/coordinator/core/zone_election.h"
#include "services/worker/core/aggregation.h"
#include "shoal/v1/common.pb.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::bench {
namespace {

constexpr size_t kChunk = 1 << 20;  // Shoal's chunk size

std::vector<float> Floats(size_t bytes) {
  std::vector<float> v(bytes / sizeof(float));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 9973) * 0.5f;
  return v;
}

void SetBytes(benchmark::State& state, size_t bytes) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}

// Baseline: one copy of the chunk.
void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = state.range(0);
  std::vector<float> src = Floats(bytes), dst(src.size());
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::ClobberMemory();
  }
  SetBytes(state, bytes);
}
BENCHMARK(BM_Memcpy)->Arg(kChunk);

// Crc32c: three interleaved lanes (common/crc32c.cc).
void BM_Crc32c(benchmark::State& state) {
  const size_t bytes = state.range(0);
  std::vector<float> src = Floats(bytes);
  for (auto _ : state) benchmark::DoNotOptimize(Crc32c(src.data(), bytes));
  SetBytes(state, bytes);
}
BENCHMARK(BM_Crc32c)->Arg(64 << 10)->Arg(kChunk);

// The one-lane loop Crc32c used before (one dependent crc32 chain).
void BM_Crc32cOneLane(benchmark::State& state) {
  const size_t bytes = state.range(0);
  std::vector<float> src = Floats(bytes);
  if (!crc32c_internal::HasSse42()) {
    state.SkipWithError("no SSE4.2");
    return;
  }
  if (crc32c_internal::ExtendSse42OneLane(0, src.data(), bytes) != Crc32c(src.data(), bytes)) {
    state.SkipWithError("one-lane CRC differs from Crc32c");
    return;
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize(crc32c_internal::ExtendSse42OneLane(0, src.data(), bytes));
  }
  SetBytes(state, bytes);
}
BENCHMARK(BM_Crc32cOneLane)->Arg(kChunk);

// Sender side: copy into the message + CRC.
void BM_EncodeChunk(benchmark::State& state) {
  std::vector<float> src = Floats(kChunk);
  shoal::v1::TensorChunk chunk;
  for (auto _ : state) {
    EncodeChunk(7, 0, src.data(), src.size(), &chunk);
    benchmark::DoNotOptimize(chunk.crc32c());
  }
  SetBytes(state, kChunk);
}
BENCHMARK(BM_EncodeChunk);

// Receiver side: the checks and the CRC.
void BM_ChunkReceiverAccept(benchmark::State& state) {
  std::vector<float> src = Floats(kChunk);
  shoal::v1::TensorChunk chunk;
  EncodeChunk(7, 0, src.data(), src.size(), &chunk);
  for (auto _ : state) {
    ChunkReceiver receiver(7, 0, src.size());
    auto view = receiver.Accept(chunk);
    benchmark::DoNotOptimize(view->data);
  }
  SetBytes(state, kChunk);
}
BENCHMARK(BM_ChunkReceiverAccept);

// The user-space part of one chunk's trip through protobuf (what tests and
// any standard client do): encode, serialize (gRPC's protobuf serializer
// copies), parse (copies again), accept, copy into the model.
void BM_ChunkRoundTripProtobuf(benchmark::State& state) {
  std::vector<float> src = Floats(kChunk), dst(src.size());
  shoal::v1::TensorChunk chunk, parsed;
  std::string wire;
  for (auto _ : state) {
    EncodeChunk(7, 0, src.data(), src.size(), &chunk);
    chunk.SerializeToString(&wire);
    parsed.ParseFromString(wire);
    ChunkReceiver receiver(7, 0, src.size());
    auto view = receiver.Accept(parsed);
    view->CopyTo(dst.data());
    benchmark::ClobberMemory();
  }
  SetBytes(state, kChunk);
}
BENCHMARK(BM_ChunkRoundTripProtobuf);

// The same chunk as the worker sends and receives it (zero-copy): the
// sender writes a header next to model memory (its CRC precomputed), the
// receiver parses the fields across 16 receive slices of 64 KiB, checks the
// CRC there and copies the data once into the model.
void BM_ChunkRoundTripZeroCopy(benchmark::State& state) {
  std::vector<float> src = Floats(kChunk), dst(src.size());
  const uint32_t crc = Crc32c(src.data(), kChunk);  // precomputed (SetReady)
  // The bytes as they lie in the receiver's buffers (gRPC and the kernel
  // put them there: not Shoal's work, and outside the loop).
  uint8_t head[kChunkHeaderMaxBytes];
  uint8_t tail[kChunkTrailerBytes];
  const size_t h = EncodeChunkHeader(7, 0, kChunk, head);
  EncodeChunkTrailer(crc, tail);
  std::string wire(reinterpret_cast<const char*>(head), h);
  wire.append(reinterpret_cast<const char*>(src.data()), kChunk);
  wire.append(reinterpret_cast<const char*>(tail), sizeof(tail));
  std::vector<BytePiece> pieces;
  for (size_t at = 0; at < wire.size(); at += 64 << 10) {
    pieces.push_back({reinterpret_cast<const uint8_t*>(wire.data()) + at,
                      std::min<size_t>(64 << 10, wire.size() - at)});
  }
  RawChunk raw;
  for (auto _ : state) {
    // Sender: the header and trailer (the data is not touched).
    benchmark::DoNotOptimize(EncodeChunkHeader(7, 0, kChunk, head));
    EncodeChunkTrailer(crc, tail);
    // Receiver: fields, checks and CRC over the pieces, one copy.
    (void)ParseChunk(pieces.data(), pieces.size(), &raw);
    ChunkReceiver receiver(7, 0, src.size());
    auto view = receiver.Accept(raw);
    view->CopyTo(dst.data());
    benchmark::ClobberMemory();
  }
  SetBytes(state, kChunk);
}
BENCHMARK(BM_ChunkRoundTripZeroCopy);

// The exchanger's reduce step as it was (a plain loop: compiled with the
// project's flags, -O2, it stays scalar because dst and src may alias) and
// as it is (AddFloats / DivideFloats in common/chunk_codec.cc: __restrict,
// vectorized at -O2).
__attribute__((noinline)) void AddAsBefore(float* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}
__attribute__((noinline)) void ScaleAsBefore(float* dst, size_t n, int parts) {
  const float scale = static_cast<float>(parts);
  for (size_t i = 0; i < n; ++i) dst[i] /= scale;
}

void BM_AverageAddScalar(benchmark::State& state) {
  std::vector<float> src = Floats(kChunk), dst = Floats(kChunk);
  for (auto _ : state) {
    AddAsBefore(dst.data(), src.data(), src.size());
    benchmark::ClobberMemory();
  }
  SetBytes(state, kChunk);
}
BENCHMARK(BM_AverageAddScalar);

void BM_AverageAddVector(benchmark::State& state) {
  std::vector<float> src = Floats(kChunk), dst = Floats(kChunk);
  for (auto _ : state) {
    AddFloats(dst.data(), reinterpret_cast<const uint8_t*>(src.data()), src.size());
    benchmark::ClobberMemory();
  }
  SetBytes(state, kChunk);
}
BENCHMARK(BM_AverageAddVector);

void BM_AverageScaleScalar(benchmark::State& state) {
  std::vector<float> dst = Floats(kChunk);
  for (auto _ : state) {
    ScaleAsBefore(dst.data(), dst.size(), static_cast<int>(state.range(0)));
    benchmark::ClobberMemory();
  }
  SetBytes(state, kChunk);
}
BENCHMARK(BM_AverageScaleScalar)->Arg(1);  // divisor 1 at run time: no denormals

void BM_AverageScaleVector(benchmark::State& state) {
  std::vector<float> dst = Floats(kChunk);
  for (auto _ : state) {
    DivideFloats(dst.data(), dst.size(), static_cast<float>(state.range(0)));
    benchmark::ClobberMemory();
  }
  SetBytes(state, kChunk);
}
BENCHMARK(BM_AverageScaleVector)->Arg(1);

// The owner's combination of N contributions of a 1 MiB slice (issue 14,
// services/worker/core/aggregation.h): range(0) = rule (0 mean, 1
// trimmed_mean:1, 2 median), range(1) = N. Bytes: the N inputs read. The
// exchanges' own mean (AddFloats as chunks arrive, then DivideFloats) is
// BM_AverageAddVector + BM_AverageScaleVector above.
void BM_CombineContributions(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(1));
  const size_t count = kChunk / sizeof(float);
  std::vector<std::vector<float>> parts;
  std::vector<const float*> inputs;
  for (size_t k = 0; k < n; ++k) parts.push_back(Floats(kChunk));
  for (size_t k = 0; k < n; ++k) {
    std::rotate(parts[k].begin(), parts[k].begin() + 97 * k, parts[k].end());  // not all equal
    inputs.push_back(parts[k].data());
  }
  shoal::AggregationSpec spec;
  spec.kind = state.range(0) == 0   ? shoal::AggregationSpec::Kind::kMean
              : state.range(0) == 1 ? shoal::AggregationSpec::Kind::kTrimmedMean
                                    : shoal::AggregationSpec::Kind::kMedian;
  spec.trim = 1;
  std::vector<float> out(count);
  for (auto _ : state) {
    auto applied = shoal::worker::CombineContributions(spec, inputs, count, out.data());
    benchmark::DoNotOptimize(applied);
    benchmark::ClobberMemory();
  }
  SetBytes(state, kChunk * n);
}
BENCHMARK(BM_CombineContributions)
    ->ArgNames({"rule", "n"})
    ->Args({0, 5})
    ->Args({1, 5})
    ->Args({2, 5})
    ->Args({1, 16})
    ->Args({2, 16});

void BM_Sha256(benchmark::State& state) {
  const size_t bytes = state.range(0);
  std::vector<float> src = Floats(bytes);
  for (auto _ : state) benchmark::DoNotOptimize(Sha256Hex(src.data(), bytes));
  SetBytes(state, bytes);
}
BENCHMARK(BM_Sha256)->Arg(4 << 20);

// The coordinator's per-recipient work on a round plan of N participants
// (services/coordinator): SendPlan pushes one copy of the plan message per
// participant into the directives, Deliver copies it again into each
// session's queue, and each session serializes its copy. Times are per
// recipient; multiply by N for a round.
shoal::v1::CoordinatorMessage PlanMessage(int n) {
  shoal::v1::CoordinatorMessage msg;
  auto* plan = msg.mutable_round_plan();
  plan->set_round(12);
  plan->set_attempt(1);
  plan->set_total_elements(1000000);
  for (int k = 0; k < n; ++k) {
    auto* s = plan->add_slices();
    s->set_worker_id("w" + std::to_string(k + 1));
    s->set_peer_address("127.0.0.1:" + std::to_string(10000 + k));
    s->set_begin(uint64_t{1000000} * k / n);
    s->set_end(uint64_t{1000000} * (k + 1) / n);
  }
  return msg;
}

void BM_PlanCopyAndDestroy(benchmark::State& state) {
  const shoal::v1::CoordinatorMessage msg = PlanMessage(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    shoal::v1::CoordinatorMessage copy(msg);
    benchmark::DoNotOptimize(copy.round_plan().slices_size());
  }
  state.counters["plan_bytes"] = static_cast<double>(msg.ByteSizeLong());
}
BENCHMARK(BM_PlanCopyAndDestroy)->Arg(10)->Arg(1000);

void BM_PlanSerialize(benchmark::State& state) {
  const shoal::v1::CoordinatorMessage msg = PlanMessage(static_cast<int>(state.range(0)));
  std::string out;
  for (auto _ : state) {
    msg.SerializeToString(&out);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["plan_bytes"] = static_cast<double>(msg.ByteSizeLong());
}
BENCHMARK(BM_PlanSerialize)->Arg(10)->Arg(1000);

// The supernode election over N members in 10 regions x 10 zones (and 10
// members at the root), measured, from the previous result: what the
// coordinator runs once per completed round, per burst of joins, and at
// once when a supernode leaves (docs/SUPERNODES.md).
void BM_ElectZones(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  std::vector<coordinator::ElectionMember> members(n);
  for (int i = 0; i < n; ++i) {
    auto& m = members[i];
    m.id = "w" + std::to_string(i + 1);
    m.zone = i < 10 ? "" : "r" + std::to_string(i % 10) + "/z" + std::to_string(i / 10 % 10);
    m.step_seconds = 0.01 + 0.001 * (i % 7);
    m.bandwidth_bps = 1e8 + 1e6 * (i % 13);
  }
  const FakeClock clock;
  const coordinator::ElectionOptions options;
  coordinator::ElectionResult previous = coordinator::ElectZones(
      members, {}, options, coordinator::ElectionTrigger::kMembership, clock);
  for (auto _ : state) {
    coordinator::ElectionResult next = coordinator::ElectZones(
        members, previous, options, coordinator::ElectionTrigger::kMeasurements, clock);
    benchmark::DoNotOptimize(next.zones.data());
  }
  state.counters["zones"] = static_cast<double>(previous.zones.size());
}
BENCHMARK(BM_ElectZones)->Arg(1000)->Arg(10000)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace shoal::bench

BENCHMARK_MAIN();
