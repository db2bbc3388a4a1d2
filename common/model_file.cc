#include "common/model_file.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/sha256.h"

namespace shoal {

absl::StatusOr<shoal::v1::ModelFileChunk> ServeModelFilePiece(
    const std::string& bytes, const std::string& sha256,
    const shoal::v1::GetModelFileRequest& request) {
  if (sha256.empty()) {
    return absl::NotFoundError("this run has no model file (its model is built in)");
  }
  if (absl::AsciiStrToLower(request.sha256()) != sha256) {
    return absl::NotFoundError(absl::StrCat("no model file with SHA-256 '", request.sha256(),
                                            "' here (this one serves ", sha256, ")"));
  }
  if (request.offset() > bytes.size()) {
    return absl::OutOfRangeError(absl::StrCat("offset ", request.offset(),
                                              " is past the end of the model file (", bytes.size(),
                                              " bytes)"));
  }
  const uint64_t max = request.max_bytes() == 0
                           ? kModelFilePieceBytes
                           : std::min(request.max_bytes(), kModelFilePieceBytes);
  const uint64_t len = std::min<uint64_t>(max, bytes.size() - request.offset());
  shoal::v1::ModelFileChunk out;
  out.set_total_bytes(bytes.size());
  out.set_offset(request.offset());
  out.set_data(bytes.substr(request.offset(), len));
  return out;
}

namespace {

absl::StatusOr<std::string> FetchFrom(
    const ModelFileSource& source, const std::string& sha256, uint64_t size,
    const std::function<void(uint64_t, uint64_t, const std::string&)>& on_progress) {
  std::string out;
  out.reserve(size);
  while (out.size() < size) {
    shoal::v1::GetModelFileRequest request;
    request.set_sha256(sha256);
    request.set_offset(out.size());
    request.set_max_bytes(kModelFilePieceBytes);
    absl::StatusOr<shoal::v1::ModelFileChunk> piece = source.read(request);
    if (!piece.ok()) return piece.status();
    if (piece->total_bytes() != size) {
      return absl::DataLossError(absl::StrCat("it serves a file of ", piece->total_bytes(),
                                              " bytes, the run's has ", size));
    }
    if (piece->offset() != out.size() || piece->data().empty() ||
        piece->data().size() > kModelFilePieceBytes || piece->data().size() > size - out.size()) {
      return absl::DataLossError(absl::StrCat("inconsistent piece (offset ", piece->offset(), ", ",
                                              piece->data().size(), " bytes) for offset ",
                                              out.size()));
    }
    out.append(piece->data());
    if (on_progress) on_progress(out.size(), size, source.name);
  }
  const std::string got = Sha256Hex(out.data(), out.size());
  if (got != sha256) {
    return absl::DataLossError(
        absl::StrCat("its file has SHA-256 ", got, ", the run's is ", sha256));
  }
  return out;
}

}  // namespace

absl::StatusOr<FetchedModelFile> FetchModelFile(
    const std::vector<ModelFileSource>& sources, const std::string& sha256, uint64_t size,
    const std::function<void(uint64_t, uint64_t, const std::string&)>& on_progress) {
  if (size > kMaxModelFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the run's model file has ", size, " bytes, more than the limit of ", kMaxModelFileBytes));
  }
  if (sources.empty()) return absl::UnavailableError("no source for the model file");
  std::string failures;
  absl::StatusCode code = absl::StatusCode::kUnavailable;
  bool data_loss = false;
  for (const ModelFileSource& source : sources) {
    absl::StatusOr<std::string> bytes = FetchFrom(source, sha256, size, on_progress);
    if (bytes.ok()) return FetchedModelFile{std::move(*bytes), source.name};
    absl::StrAppend(&failures, failures.empty() ? "" : "; ", source.name, ": ",
                    bytes.status().message());
    code = bytes.status().code();
    data_loss = data_loss || code == absl::StatusCode::kDataLoss;
  }
  return absl::Status(data_loss ? absl::StatusCode::kDataLoss : code,
                      absl::StrCat("cannot fetch the model file (SHA-256 ", sha256, ", ", size,
                                   " bytes): ", failures));
}

}  // namespace shoal
