// The TorchScript loader behind CheckTorchScriptModel, for the trainer.
// Includes LibTorch: only torchscript_model.cc and trainer.cc include it.
#ifndef SHOAL_SERVICES_WORKER_CORE_TORCHSCRIPT_MODULE_H_
#define SHOAL_SERVICES_WORKER_CORE_TORCHSCRIPT_MODULE_H_

#include <torch/script.h>

#include "services/worker/core/torchscript_model.h"

namespace shoal::worker {

// CheckTorchScriptModel, returning the module (in training mode).
absl::StatusOr<torch::jit::Module> LoadTorchScriptModule(const std::string& bytes,
                                                         const std::vector<int64_t>& input_shape,
                                                         const std::string& what,
                                                         TorchScriptSummary* summary);

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_TORCHSCRIPT_MODULE_H_
