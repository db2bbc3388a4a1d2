// Models brought as TorchScript files (--model=torchscript:PATH on the
// coordinator, a file written by torch.jit.script(m).save(...)): the checks
// a file must pass before anyone trains it. The coordinator runs them at
// start (before any worker can join), every worker again on the bytes it
// fetched. This header has no Torch types (torchscript_module.h has the
// loader that returns the module).
#ifndef SHOAL_SERVICES_WORKER_CORE_TORCHSCRIPT_MODEL_H_
#define SHOAL_SERVICES_WORKER_CORE_TORCHSCRIPT_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shoal::worker {

struct TorchScriptSummary {
  size_t parameter_tensors = 0;
  uint64_t parameters = 0;            // trainable elements
  size_t float_buffers = 0;           // averaged with the parameters (BatchNorm statistics)
  size_t integer_buffers = 0;         // carried as float32 (num_batches_tracked)
  std::vector<int64_t> output_shape;  // of the check batch
};

// Batch size of the check forward.
inline constexpr int64_t kCheckBatch = 2;

// Loads `bytes` as a TorchScript module and checks that it can be trained
// here, with INVALID_ARGUMENT saying which check failed:
//  - "not a TorchScript module: ..." (torch.jit.load refuses the bytes);
//  - "has no trainable parameters";
//  - "parameter/buffer NAME is DTYPE; only float32 ..." (other dtypes);
//  - "its forward does not take an image batch [2, C, H, W]: ..." (the
//    forward throws on zeros of `input_shape` = {C, H, W}), or returns
//    something other than [2, classes] logits with classes >= 2.
// `what` names the file in messages.
absl::StatusOr<TorchScriptSummary> CheckTorchScriptModel(const std::string& bytes,
                                                         const std::vector<int64_t>& input_shape,
                                                         const std::string& what);

// Reads a file into memory (NOT_FOUND, or the errno's code, naming it).
absl::StatusOr<std::string> ReadModelFile(const std::string& path);

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_TORCHSCRIPT_MODEL_H_
