// Reads Fashion-MNIST from the IDX files of Debian's dataset-fashion-mnist
// (gzip-compressed, big-endian headers). No Torch here.
#ifndef SHOAL_SERVICES_WORKER_CORE_IDX_READER_H_
#define SHOAL_SERVICES_WORKER_CORE_IDX_READER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shoal::worker {

// An IDX file's content: dims and raw unsigned bytes.
struct IdxArray {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> data;
};

// Parses an IDX byte buffer (already decompressed). INVALID_ARGUMENT for a
// bad magic, an element type other than unsigned byte, or a size mismatch.
absl::StatusOr<IdxArray> ParseIdx(const std::string& bytes, const std::string& what);

// Reads a gzip (or plain) IDX file. NOT_FOUND when missing.
absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path);

struct ImageSet {
  uint32_t count = 0;
  uint32_t rows = 0;
  uint32_t cols = 0;
  std::vector<uint8_t> pixels;  // count * rows * cols
  std::vector<uint8_t> labels;  // count, values 0..9
};

struct FashionMnist {
  ImageSet train;
  ImageSet test;
};

// Loads the four files from `dir`. The error names the directory, the file,
// and the Debian package that provides it.
absl::StatusOr<FashionMnist> LoadFashionMnist(const std::string& dir);

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_IDX_READER_H_
