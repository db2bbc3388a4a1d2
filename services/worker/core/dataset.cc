#include "services/worker/core/dataset.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace shoal::worker {
namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

absl::Status InDir(const std::string& dir, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("--dataset ", dir, ": ", s.message()));
}

// Images [N, H, W] and labels [N] of one split, checked against each other.
absl::StatusOr<ImageSet> MakeSet(const std::vector<uint64_t>& image_shape, std::string pixels,
                                 const std::vector<uint64_t>& label_shape,
                                 std::vector<uint8_t> labels, const std::string& images_name,
                                 const std::string& labels_name) {
  if (image_shape.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat(images_name, " must have 3 dimensions (images, height, width), it has ",
                     image_shape.size()));
  }
  if (label_shape.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(labels_name, " must have 1 dimension, it has ", label_shape.size()));
  }
  if (image_shape[0] != label_shape[0]) {
    return absl::InvalidArgumentError(absl::StrCat(images_name, " has ", image_shape[0],
                                                   " images but ", labels_name, " has ",
                                                   label_shape[0], " labels"));
  }
  if (image_shape[0] == 0 || image_shape[1] == 0 || image_shape[2] == 0) {
    return absl::InvalidArgumentError(absl::StrCat(images_name, " holds no image"));
  }
  if (image_shape[0] > UINT32_MAX || image_shape[1] > 4096 || image_shape[2] > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat(images_name, " is too large (", absl::StrJoin(image_shape, " x "), ")"));
  }
  ImageSet set;
  set.count = static_cast<uint32_t>(image_shape[0]);
  set.rows = static_cast<uint32_t>(image_shape[1]);
  set.cols = static_cast<uint32_t>(image_shape[2]);
  set.pixels.assign(pixels.begin(), pixels.end());
  set.labels = std::move(labels);
  return set;
}

absl::StatusOr<FashionMnist> CheckSplits(absl::StatusOr<ImageSet> train,
                                         absl::StatusOr<ImageSet> test) {
  if (!train.ok()) return train.status();
  if (!test.ok()) return test.status();
  if (train->rows != test->rows || train->cols != test->cols) {
    return absl::InvalidArgumentError(absl::StrCat("training images are ", train->rows, " x ",
                                                   train->cols, " but test images are ", test->rows,
                                                   " x ", test->cols));
  }
  FashionMnist data;
  data.train = std::move(*train);
  data.test = std::move(*test);
  return data;
}

// --------------------------------------------------------------------- IDX

absl::StatusOr<IdxArray> ReadIdxNamed(const std::string& dir, const std::string& name) {
  const std::string gz = dir + "/" + name + ".gz";
  const std::string plain = dir + "/" + name;
  if (Exists(gz)) return ReadIdxFile(gz);
  if (Exists(plain)) return ReadIdxFile(plain);
  return absl::NotFoundError(absl::StrCat("neither ", name, ".gz nor ", name, " is in ", dir));
}

absl::StatusOr<ImageSet> IdxSet(const std::string& dir, const std::string& images_name,
                                const std::string& labels_name) {
  absl::StatusOr<IdxArray> images = ReadIdxNamed(dir, images_name);
  if (!images.ok()) return images.status();
  absl::StatusOr<IdxArray> labels = ReadIdxNamed(dir, labels_name);
  if (!labels.ok()) return labels.status();
  std::vector<uint64_t> is(images->dims.begin(), images->dims.end());
  std::vector<uint64_t> ls(labels->dims.begin(), labels->dims.end());
  return MakeSet(is, std::string(images->data.begin(), images->data.end()), ls,
                 std::move(labels->data), images_name, labels_name);
}

// --------------------------------------------------------------------- NPY

absl::StatusOr<std::string> ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

absl::StatusOr<NpyArray> ReadNpy(const std::string& dir, const std::string& name) {
  absl::StatusOr<std::string> bytes = ReadWhole(dir + "/" + name);
  if (!bytes.ok()) return bytes.status();
  return ParseNpy(*bytes, name);
}

absl::StatusOr<ImageSet> NpySet(const std::string& dir, const std::string& images_name,
                                const std::string& labels_name) {
  absl::StatusOr<NpyArray> images = ReadNpy(dir, images_name);
  if (!images.ok()) return images.status();
  if (images->dtype != "|u1" && images->dtype != "<u1") {
    return absl::InvalidArgumentError(
        absl::StrCat(images_name, ": images must be uint8 (np.uint8, pixels 0..255), not '",
                     images->dtype, "'"));
  }
  absl::StatusOr<NpyArray> labels = ReadNpy(dir, labels_name);
  if (!labels.ok()) return labels.status();
  size_t width = 0;
  bool is_signed = false;
  if (labels->dtype == "|u1" || labels->dtype == "<u1") {
    width = 1;
  } else if (labels->dtype == "|i1" || labels->dtype == "<i1") {
    width = 1, is_signed = true;
  } else if (labels->dtype == "<i2" || labels->dtype == "<u2") {
    width = 2, is_signed = labels->dtype[1] == 'i';
  } else if (labels->dtype == "<i4" || labels->dtype == "<u4") {
    width = 4, is_signed = labels->dtype[1] == 'i';
  } else if (labels->dtype == "<i8" || labels->dtype == "<u8") {
    width = 8, is_signed = labels->dtype[1] == 'i';
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(labels_name, ": labels must be integers (uint8, int32, int64, ...), not '",
                     labels->dtype, "'"));
  }
  const size_t n = labels->data.size() / width;
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    const auto* p = reinterpret_cast<const unsigned char*>(labels->data.data() + i * width);
    uint64_t u = 0;
    for (size_t b = 0; b < width; ++b) u |= uint64_t{p[b]} << (8 * b);
    const bool negative = is_signed && (p[width - 1] & 0x80) != 0;
    if (negative || u > 255) {
      return absl::InvalidArgumentError(
          absl::StrCat(labels_name, ": label ", negative ? std::string("< 0") : absl::StrCat(u),
                       " at index ", i, " is outside 0..255"));
    }
    out[i] = static_cast<uint8_t>(u);
  }
  return MakeSet(images->shape, std::move(images->data), labels->shape, std::move(out), images_name,
                 labels_name);
}

}  // namespace

absl::StatusOr<NpyArray> ParseNpy(const std::string& bytes, const std::string& what) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": not a .npy file we can read (", why, ")"));
  };
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) return bad("bad magic");
  const uint8_t major = static_cast<uint8_t>(bytes[6]);
  size_t header_len = 0, start = 0;
  if (major == 1) {
    header_len = static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return bad("short header");
    for (int i = 0; i < 4; ++i) header_len |= size_t{static_cast<uint8_t>(bytes[8 + i])} << (8 * i);
    start = 12;
  } else {
    return bad(absl::StrCat("format version ", major));
  }
  if (header_len > bytes.size() - start) return bad("header past the end");
  const std::string header = bytes.substr(start, header_len);
  // {'descr': '<i8', 'fortran_order': False, 'shape': (3, 28, 28), }
  auto value_of = [&](const std::string& key) -> std::string {
    const size_t at = header.find("'" + key + "'");
    if (at == std::string::npos) return "";
    size_t colon = header.find(':', at);
    if (colon == std::string::npos) return "";
    size_t b = colon + 1;
    while (b < header.size() && header[b] == ' ') ++b;
    size_t e = b;
    if (b < header.size() && header[b] == '(') {
      e = header.find(')', b);
      return e == std::string::npos ? "" : header.substr(b, e - b + 1);
    }
    if (b < header.size() && header[b] == '\'') {
      e = header.find('\'', b + 1);
      return e == std::string::npos ? "" : header.substr(b + 1, e - b - 1);
    }
    while (e < header.size() && header[e] != ',' && header[e] != '}') ++e;
    return header.substr(b, e - b);
  };
  NpyArray out;
  out.dtype = value_of("descr");
  if (out.dtype.empty()) return bad("no 'descr' in the header");
  if (value_of("fortran_order") != "False") return bad("Fortran order; save a C-ordered array");
  std::string shape = value_of("shape");
  if (shape.size() < 2) return bad("no 'shape' in the header");
  shape = shape.substr(1, shape.size() - 2);
  uint64_t count = 1;
  for (absl::string_view part : absl::StrSplit(shape, ',', absl::SkipWhitespace())) {
    uint64_t d = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &d)) return bad("bad shape");
    if (d != 0 && count > UINT64_MAX / d) return bad("shape overflows");
    count *= d;
    out.shape.push_back(d);
  }
  size_t item = 0;
  if (out.dtype.size() >= 3 && absl::SimpleAtoi(out.dtype.substr(2), &item) && item > 0 &&
      item <= 16 && (out.dtype[0] == '<' || out.dtype[0] == '|')) {
  } else {
    return bad(absl::StrCat("dtype '", out.dtype, "' (little-endian numbers only)"));
  }
  const size_t data_start = start + header_len;
  if (count > (bytes.size() - data_start) / item || count * item != bytes.size() - data_start) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the header says ", count,
                                                   " elements of ", item, " bytes, the file has ",
                                                   bytes.size() - data_start, " bytes of data"));
  }
  out.data = bytes.substr(data_start);
  return out;
}

absl::StatusOr<FashionMnist> LoadDataset(const std::string& spec, const std::string& data_dir) {
  if (spec.empty() || spec == "fashion-mnist") return LoadFashionMnist(data_dir);
  if (absl::StartsWith(spec, "idx:")) {
    const std::string dir = spec.substr(4);
    absl::StatusOr<FashionMnist> d =
        CheckSplits(IdxSet(dir, "train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
                    IdxSet(dir, "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"));
    if (!d.ok()) return InDir(spec, d.status());
    return d;
  }
  if (absl::StartsWith(spec, "npy:")) {
    const std::string dir = spec.substr(4);
    absl::StatusOr<FashionMnist> d =
        CheckSplits(NpySet(dir, "train_images.npy", "train_labels.npy"),
                    NpySet(dir, "test_images.npy", "test_labels.npy"));
    if (!d.ok()) return InDir(spec, d.status());
    return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--dataset '", spec, "' is not fashion-mnist, idx:DIR or npy:DIR"));
}

int MaxLabel(const FashionMnist& data) {
  int max = 0;
  for (const ImageSet* s : {&data.train, &data.test}) {
    for (uint8_t l : s->labels) max = std::max<int>(max, l);
  }
  return max;
}

}  // namespace shoal::worker
