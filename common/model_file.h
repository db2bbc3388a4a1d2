// The run's TorchScript model file (--model=torchscript:PATH on the
// coordinator) in transit: serving pieces of it (coordinator and workers
// answer GetModelFile the same way) and fetching it from a list of sources
// (peers first, the coordinator last), verified against its SHA-256.
// No Torch and no gRPC types here.
#ifndef SHOAL_COMMON_MODEL_FILE_H_
#define SHOAL_COMMON_MODEL_FILE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shoal/v1/common.pb.h"

namespace shoal {

// Largest piece one GetModelFile call returns.
inline constexpr uint32_t kModelFilePieceBytes = 1u << 20;
// Largest model file accepted (the coordinator reads it into memory).
inline constexpr uint64_t kMaxModelFileBytes = uint64_t{2} << 30;

// Answers `request` from `bytes`, the file whose digest is `sha256` (empty =
// no file in this run). NOT_FOUND: no file, or another digest asked for;
// OUT_OF_RANGE: an offset past the end. An offset equal to the size gives an
// empty piece.
absl::StatusOr<shoal::v1::ModelFileChunk> ServeModelFilePiece(
    const std::string& bytes, const std::string& sha256,
    const shoal::v1::GetModelFileRequest& request);

// One place the file can be read from: `read` makes one call with its own
// deadline.
struct ModelFileSource {
  std::string name;  // for messages, e.g. "peer 10.0.0.2:50060"
  std::function<absl::StatusOr<shoal::v1::ModelFileChunk>(const shoal::v1::GetModelFileRequest&)>
      read;
};

struct FetchedModelFile {
  std::string bytes;
  std::string source;  // name of the source that delivered it
};

// Reads the whole file (`size` bytes, digest `sha256`) from the first source
// that delivers it completely with the right digest, trying them in order.
// A source that fails a call, answers an inconsistent piece or ends with
// another digest is dropped and the next one starts from byte 0.
// `on_progress(bytes_so_far, size, source)` runs after each piece (may be
// empty). The error (the last source's) lists every source's failure:
// DATA_LOSS when a source delivered bytes of another digest, else the code
// of the last failure.
absl::StatusOr<FetchedModelFile> FetchModelFile(
    const std::vector<ModelFileSource>& sources, const std::string& sha256, uint64_t size,
    const std::function<void(uint64_t, uint64_t, const std::string&)>& on_progress = {});

}  // namespace shoal

#endif  // SHOAL_COMMON_MODEL_FILE_H_
