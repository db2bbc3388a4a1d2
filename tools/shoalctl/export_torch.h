// Writes named tensors to a file that Python's torch.load() opens as a dict
// name -> tensor (PyTorch's zip format, via LibTorch's pickle_save). The
// only Torch code of shoalctl; this header includes no Torch header.
#ifndef SHOAL_TOOLS_SHOALCTL_EXPORT_TORCH_H_
#define SHOAL_TOOLS_SHOALCTL_EXPORT_TORCH_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace shoal::ctl {

// One tensor, its raw little-endian bytes in caller memory (not copied
// before serialization).
struct ExportTensor {
  std::string name;
  std::string dtype;  // "float32"
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t bytes = 0;
};

// Writes `tensors` (in order) to `path` atomically (a temporary file renamed
// into place). INVALID_ARGUMENT: unsupported dtype or bytes that do not
// match the shape; an I/O error keeps its errno's code.
absl::Status WriteTorchFile(const std::string& path, const std::vector<ExportTensor>& tensors);

}  // namespace shoal::ctl

#endif  // SHOAL_TOOLS_SHOALCTL_EXPORT_TORCH_H_
