#include "services/worker/core/idx_reader.h"

#include <sys/stat.h>
#include <zlib.h>

#include "absl/strings/str_cat.h"

namespace shoal::worker {
namespace {

uint32_t ReadBigEndian32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

absl::StatusOr<ImageSet> LoadSet(const std::string& dir, const std::string& images_file,
                                 const std::string& labels_file) {
  absl::StatusOr<IdxArray> images = ReadIdxFile(dir + "/" + images_file);
  if (!images.ok()) return images.status();
  absl::StatusOr<IdxArray> labels = ReadIdxFile(dir + "/" + labels_file);
  if (!labels.ok()) return labels.status();
  if (images->dims.size() != 3 || labels->dims.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(images_file, " must have 3 dimensions and ", labels_file, " 1"));
  }
  if (images->dims[0] != labels->dims[0]) {
    return absl::InvalidArgumentError(absl::StrCat(images_file, " has ", images->dims[0],
                                                   " images but ", labels_file, " has ",
                                                   labels->dims[0], " labels"));
  }
  for (uint8_t l : labels->data) {
    if (l > 9) return absl::InvalidArgumentError(absl::StrCat(labels_file, " has a label > 9"));
  }
  ImageSet set;
  set.count = images->dims[0];
  set.rows = images->dims[1];
  set.cols = images->dims[2];
  set.pixels = std::move(images->data);
  set.labels = std::move(labels->data);
  return set;
}

}  // namespace

absl::StatusOr<IdxArray> ParseIdx(const std::string& bytes, const std::string& what) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  if (bytes.size() < 4 || p[0] != 0 || p[1] != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": not an IDX file (bad magic)"));
  }
  if (p[2] != 0x08) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": element type 0x", absl::Hex(p[2]), " is not unsigned byte"));
  }
  const int ndims = p[3];
  if (ndims < 1 || ndims > 4 || bytes.size() < 4 + 4u * ndims) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": bad IDX header"));
  }
  IdxArray array;
  uint64_t total = 1;
  for (int i = 0; i < ndims; ++i) {
    array.dims.push_back(ReadBigEndian32(p + 4 + 4 * i));
    total *= array.dims.back();
  }
  const size_t header = 4 + 4 * ndims;
  if (bytes.size() - header != total) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": header says ", total, " bytes of data, file has ", bytes.size() - header));
  }
  array.data.assign(p + header, p + bytes.size());
  return array;
}

absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(path, " not found"));
  }
  gzFile f = gzopen(path.c_str(), "rb");  // reads plain files too
  if (f == nullptr) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string bytes;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) bytes.append(buf, n);
  int err = 0;
  const char* msg = gzerror(f, &err);
  const std::string error = (n < 0 && msg) ? msg : "";
  gzclose(f);
  if (n < 0) return absl::DataLossError(absl::StrCat(path, ": ", error));
  return ParseIdx(bytes, path);
}

absl::StatusOr<FashionMnist> LoadFashionMnist(const std::string& dir) {
  struct stat st;
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat(
        "--data_dir ", dir,
        " does not exist; install Debian's dataset-fashion-mnist (scripts/install-deps.sh) or "
        "point --data_dir at a directory with the four Fashion-MNIST IDX files"));
  }
  FashionMnist data;
  auto train = LoadSet(dir, "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz");
  if (!train.ok())
    return absl::Status(train.status().code(),
                        absl::StrCat("--data_dir ", dir, ": ", train.status().message()));
  auto test = LoadSet(dir, "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz");
  if (!test.ok())
    return absl::Status(test.status().code(),
                        absl::StrCat("--data_dir ", dir, ": ", test.status().message()));
  data.train = std::move(*train);
  data.test = std::move(*test);
  return data;
}

}  // namespace shoal::worker
