// PROTOTYPE (bench only, not used by services/): the Peer.ReadSlice stream
// without protobuf copies, wire-compatible with shoal.v1.TensorChunk.
//
//  - ZcPeerService serves ReadSlice through the generated raw callback
//    method (Peer::WithRawCallbackMethod_ReadSlice): each chunk is a
//    grpc::ByteBuffer of three slices: a few header bytes (round, begin,
//    data tag and length), a slice pointing straight at model memory
//    (grpc::Slice::STATIC_SLICE, no copy) and the CRC-32C field. The CRC is
//    computed from model memory; no EncodeChunk copy, no serialization copy.
//    An AVERAGED read of a slice its owner has not averaged yet is parked on
//    the server until it is (instead of UNAVAILABLE + client backoff).
//  - ZcPeerClient reads the stream as grpc::ByteBuffer and walks the
//    received slices (references to gRPC's read buffers): the data bytes
//    are checked (same checks as ChunkReceiver) and copied once, straight
//    into the destination, instead of protobuf parsing them into a string
//    first. It also implements PeerClient, so the real Exchanger can run on
//    it: a chunk whose bytes arrive in one slice is handed over as a view of
//    that slice, a split one is gathered into a scratch buffer (one copy).
//
// What it shows: the copies the protobuf path costs (see bench/RESULTS.md).
#ifndef SHOAL_BENCH_PROTO_ZC_ZC_PEER_H_
#define SHOAL_BENCH_PROTO_ZC_ZC_PEER_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "services/worker/core/model_state.h"
#include "services/worker/peer_client.h"
#include "shoal/v1/peer.grpc.pb.h"

namespace shoal::bench {

// CRC-32C continuing from `crc` (0 to start), same result as shoal::Crc32c
// over the concatenation. Three independent lanes (the crc32 instruction has
// a latency of 3 cycles and a throughput of 1), merged with carry-less
// multiplication.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);

class ZcPeerService final
    : public shoal::v1::Peer::WithRawCallbackMethod_ReadSlice<shoal::v1::Peer::CallbackService> {
 public:
  // `park_averaged_reads`: an AVERAGED read of a slice not averaged yet
  // waits on the server (re-checked every 200 us on a timer) instead of
  // failing UNAVAILABLE; the reader's retry loop then never sleeps.
  explicit ZcPeerService(const worker::ModelState* state, bool park_averaged_reads = true)
      : state_(state), park_averaged_reads_(park_averaged_reads) {}
  grpc::ServerWriteReactor<grpc::ByteBuffer>* ReadSlice(grpc::CallbackServerContext* ctx,
                                                        const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* GetPeerInfo(grpc::CallbackServerContext* ctx,
                                        const shoal::v1::GetPeerInfoRequest* request,
                                        shoal::v1::PeerInfo* response) override;

 private:
  const worker::ModelState* const state_;
  const bool park_averaged_reads_;
};

class ZcPeerClient : public worker::PeerClient {
 public:
  ZcPeerClient() = default;
  // Integer channel arguments set on top of Shoal's (e.g. HTTP/2 frame size).
  explicit ZcPeerClient(std::vector<std::pair<std::string, int>> extra_args)
      : extra_args_(std::move(extra_args)) {}

  // Reads [request.begin, request.end) into dst[begin, end) (dst points at
  // element 0). Bytes are copied while being checksummed, so a chunk that
  // then fails its CRC has already been written (the caller re-reads it).
  absl::Status ReadSliceInto(const std::string& address, const shoal::v1::ReadSliceRequest& request,
                             absl::Duration timeout, float* dst);

  absl::Status ReadSlice(const std::string& address, const shoal::v1::ReadSliceRequest& request,
                         absl::Duration timeout,
                         const std::function<bool(const ChunkView&)>& on_chunk) override;
  absl::StatusOr<shoal::v1::PeerInfo> Probe(const std::string& address,
                                            absl::Duration timeout) override;

  // Messages received and the slices they arrived in (how gRPC cut them).
  uint64_t messages() const { return messages_.load(); }
  uint64_t slices() const { return slices_.load(); }

 private:
  std::shared_ptr<grpc::Channel> ChannelFor(const std::string& address);
  const std::vector<std::pair<std::string, int>> extra_args_;
  std::atomic<uint64_t> messages_{0}, slices_{0};
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::bench

#endif  // SHOAL_BENCH_PROTO_ZC_ZC_PEER_H_
