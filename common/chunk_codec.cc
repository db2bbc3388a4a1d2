#include "common/chunk_codec.h"

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/grpc_util.h"

namespace shoal {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the wire format is little-endian float32; add byte swapping for big-endian hosts");

void EncodeChunk(uint64_t round, uint64_t begin, const float* data, size_t count,
                 shoal::v1::TensorChunk* chunk) {
  chunk->set_round(round);
  chunk->set_begin(begin);
  const size_t bytes = count * kBytesPerElement;
  chunk->mutable_data()->assign(reinterpret_cast<const char*>(data), bytes);
  chunk->set_crc32c(Crc32c(chunk->data().data(), bytes));
}

absl::StatusOr<ChunkView> ChunkReceiver::Accept(const shoal::v1::TensorChunk& chunk) {
  if (chunk.round() != round_) {
    return absl::FailedPreconditionError(
        absl::StrCat("chunk is for round ", chunk.round(), ", expected round ", round_));
  }
  const std::string& data = chunk.data();
  if (data.size() > kMaxChunkBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("chunk of ", data.size(), " bytes exceeds the limit of ", kMaxChunkBytes));
  }
  if (data.empty() || data.size() % kBytesPerElement != 0) {
    return absl::InvalidArgumentError(absl::StrCat("chunk size ", data.size(),
                                                   " is not a positive multiple of ",
                                                   kBytesPerElement, " bytes (float32)"));
  }
  if (chunk.begin() != next_) {
    return absl::InvalidArgumentError(absl::StrCat("chunk starts at element ", chunk.begin(),
                                                   ", expected ", next_, " (gap or overlap)"));
  }
  const uint64_t count = data.size() / kBytesPerElement;
  if (count > end_ - next_) {
    return absl::InvalidArgumentError(absl::StrCat("chunk [", chunk.begin(), ", ",
                                                   chunk.begin() + count,
                                                   ") runs past the end of the range at ", end_));
  }
  const uint32_t crc = Crc32c(data.data(), data.size());
  if (crc != chunk.crc32c()) {
    return absl::DataLossError(absl::StrCat("checksum mismatch on chunk at element ", chunk.begin(),
                                            ": got ", crc, ", chunk says ", chunk.crc32c()));
  }
  ChunkView view{chunk.begin(), reinterpret_cast<const float*>(data.data()), count};
  next_ += count;
  return view;
}

absl::Status ChunkReceiver::Finish() const {
  if (next_ != end_) {
    return absl::DataLossError(
        absl::StrCat("stream ended at element ", next_, " before the end of the range at ", end_));
  }
  return absl::OkStatus();
}

}  // namespace shoal
