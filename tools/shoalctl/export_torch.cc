#include "tools/shoalctl/export_torch.h"

#include <ATen/ATen.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <cerrno>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace shoal::ctl {

absl::Status WriteTorchFile(const std::string& path, const std::vector<ExportTensor>& tensors) {
  std::vector<char> bytes;
  try {
    // A dict keeps insertion order, so Python sees the layers in model order.
    c10::Dict<std::string, at::Tensor> dict;
    for (const ExportTensor& t : tensors) {
      if (t.dtype != "float32") {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", t.name, "': unsupported dtype '", t.dtype, "'"));
      }
      int64_t count = 1;
      for (int64_t d : t.shape) count *= d;
      if (static_cast<size_t>(count) * sizeof(float) != t.bytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", t.name, "': ", t.bytes, " bytes do not match its shape"));
      }
      // from_blob does not copy; pickle_save reads the bytes once.
      at::Tensor tensor = at::from_blob(const_cast<uint8_t*>(t.data), t.shape,
                                        at::TensorOptions().dtype(at::kFloat));
      dict.insert(t.name, tensor);
    }
    bytes = torch::jit::pickle_save(c10::IValue(dict));
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("LibTorch cannot serialize: ", e.what_without_backtrace()));
  }

  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", tmp));
  }
  const bool written = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  const int write_errno = errno;
  if (std::fclose(f) != 0 || !written) {
    std::remove(tmp.c_str());
    return absl::ErrnoToStatus(written ? errno : write_errno, absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::ErrnoToStatus(err, absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

}  // namespace shoal::ctl
