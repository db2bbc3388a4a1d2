// Helpers shared by the checkpoint tests: deterministic layers, manifests
// that describe them, and looks at the store's directory.
#ifndef SHOAL_TESTS_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_
#define SHOAL_TESTS_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/sha256.h"
#include "shoal/v1/checkpoint.pb.h"

namespace shoal::checkpoint::testing {

// A float32 layer of `shape`, its values a function of (seed, index).
struct TestLayer {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;

  const uint8_t* data() const { return reinterpret_cast<const uint8_t*>(values.data()); }
  size_t bytes() const { return values.size() * sizeof(float); }
  std::string str() const { return std::string(reinterpret_cast<const char*>(data()), bytes()); }
};

inline TestLayer MakeLayer(const std::string& name, std::vector<int64_t> shape, float seed) {
  TestLayer l{name, std::move(shape), {}};
  size_t count = 1;
  for (int64_t d : l.shape) count *= static_cast<size_t>(d);
  l.values.resize(count);
  for (size_t i = 0; i < count; ++i) {
    l.values[i] = seed + static_cast<float>(i % 9973) * 0.25f - static_cast<float>(i % 7);
  }
  return l;
}

inline shoal::v1::Manifest MakeManifest(const std::string& run_id, uint64_t round,
                                        const std::vector<TestLayer>& layers) {
  shoal::v1::Manifest m;
  m.set_run_id(run_id);
  m.set_round(round);
  m.set_epoch(round / 2);
  m.set_model("mlp");
  for (const TestLayer& l : layers) {
    auto* e = m.add_layers();
    e->set_name(l.name);
    e->set_dtype("float32");
    for (int64_t d : l.shape) e->add_shape(d);
    e->set_bytes(l.bytes());
    e->set_sha256(Sha256Hex(l.data(), l.bytes()));
  }
  return m;
}

// Regular files under `dir` (recursively); 0 when it does not exist.
inline size_t CountFiles(const std::string& dir) {
  std::error_code ec;
  size_t n = 0;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file()) ++n;
  }
  return n;
}

// Entries (files or directories) directly in `dir`.
inline size_t CountEntries(const std::string& dir) {
  std::error_code ec;
  size_t n = 0;
  for (auto it = std::filesystem::directory_iterator(dir, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return n;
}

inline size_t CountBlobs(const std::string& data_dir) { return CountFiles(data_dir + "/blobs"); }
inline size_t CountTmp(const std::string& data_dir) { return CountFiles(data_dir + "/tmp"); }

}  // namespace shoal::checkpoint::testing

#endif  // SHOAL_TESTS_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_
