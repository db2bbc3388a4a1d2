#include "services/worker/core/codec.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace shoal::worker {

void Fp32Codec::Encode(const float* src, size_t n, uint8_t* out) const {
  // Little-endian hosts only (x86-64, arm64): the bytes are the floats.
  std::memcpy(out, src, n * sizeof(float));
}

absl::Status Fp32Codec::AccumulateContribution(const ChunkView& chunk, float* sum) const {
  chunk.AddTo(sum);
  return absl::OkStatus();
}

absl::Status Fp32Codec::ApplyAverage(const ChunkView& chunk, float* dst) const {
  chunk.CopyTo(dst);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Codec>> MakeCodec(const std::string& name) {
  if (name.empty() || name == "fp32") return std::make_unique<Fp32Codec>();
  return absl::InvalidArgumentError(
      absl::StrCat("unknown codec '", name, "' (this build has: fp32)"));
}

}  // namespace shoal::worker
