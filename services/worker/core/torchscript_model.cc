#include "services/worker/core/torchscript_model.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/worker/core/torchscript_module.h"

namespace shoal::worker {
namespace {

// The first line of a LibTorch error (the rest is a backtrace or the
// TorchScript source around the failing line).
std::string FirstLine(const std::string& what) {
  const size_t end = what.find('\n');
  return end == std::string::npos ? what : what.substr(0, end);
}

std::string Shape(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::StatusOr<torch::jit::Module> LoadTorchScriptModule(const std::string& bytes,
                                                         const std::vector<int64_t>& input_shape,
                                                         const std::string& what,
                                                         TorchScriptSummary* summary) {
  *summary = TorchScriptSummary();
  torch::jit::Module module;
  try {
    std::istringstream in(bytes);
    module = torch::jit::load(in, torch::kCPU);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     " is not a TorchScript module (a file written by "
                     "torch.jit.script(model).save(path)): torch.jit.load says: ",
                     FirstLine(e.what_without_backtrace())));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " is not a TorchScript module: torch.jit.load says: ", FirstLine(e.what())));
  }
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    if (p.value.scalar_type() != torch::kFloat32) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": parameter ", p.name, " is ", c10::toString(p.value.scalar_type()),
                       "; only float32 parameters are supported (call .float() before saving)"));
    }
    if (!p.value.requires_grad()) continue;
    ++summary->parameter_tensors;
    summary->parameters += p.value.numel();
  }
  if (summary->parameters == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has no trainable parameters (nothing to train or average)"));
  }
  for (const auto& b : module.named_buffers(/*recurse=*/true)) {
    const auto type = b.value.scalar_type();
    if (type == torch::kFloat32) {
      ++summary->float_buffers;
    } else if (c10::isIntegralType(type, /*includeBool=*/false)) {
      ++summary->integer_buffers;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": buffer ", b.name, " is ", c10::toString(type),
                       "; only float32 and integer buffers are supported"));
    }
  }
  std::vector<int64_t> batch_shape = {kCheckBatch};
  batch_shape.insert(batch_shape.end(), input_shape.begin(), input_shape.end());
  const std::string expected =
      absl::StrCat("its forward does not take an image batch ", Shape(batch_shape),
                   " (float32, N x channels x height x width) and return [N, classes] logits");
  try {
    torch::NoGradGuard no_grad;
    module.eval();  // BatchNorm statistics stay untouched by the check
    torch::jit::IValue out = module.forward({torch::zeros(batch_shape)});
    module.train();
    if (!out.isTensor()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", expected, ": it returned a ", out.tagKind()));
    }
    const torch::Tensor t = out.toTensor();
    summary->output_shape = t.sizes().vec();
    if (t.dim() != 2 || t.size(0) != kCheckBatch || t.size(1) < 2 || !t.is_floating_point()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", expected, ": it returned ", Shape(summary->output_shape)));
    }
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", expected, ": ", FirstLine(e.what_without_backtrace())));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", expected, ": ", FirstLine(e.what())));
  }
  return module;
}

absl::StatusOr<TorchScriptSummary> CheckTorchScriptModel(const std::string& bytes,
                                                         const std::vector<int64_t>& input_shape,
                                                         const std::string& what) {
  TorchScriptSummary summary;
  absl::StatusOr<torch::jit::Module> module =
      LoadTorchScriptModule(bytes, input_shape, what, &summary);
  if (!module.ok()) return module.status();
  return summary;
}

absl::StatusOr<std::string> ReadModelFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    return absl::Status(
        err == ENOENT ? absl::StatusCode::kNotFound : absl::StatusCode::kFailedPrecondition,
        absl::StrCat("cannot open model file ", path, ": ", std::strerror(err)));
  }
  std::ostringstream data;
  data << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read model file ", path));
  return data.str();
}

}  // namespace shoal::worker
