// Datasets a worker trains on, chosen with --dataset (no Torch here):
//   "" or "fashion-mnist"  the four Fashion-MNIST IDX files in --data_dir
//                          (Debian's dataset-fashion-mnist);
//   "idx:DIR"              any MNIST-family IDX quadruple in DIR:
//                          train-images-idx3-ubyte, train-labels-idx1-ubyte,
//                          t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte,
//                          each gzip-compressed (".gz") or plain;
//   "npy:DIR"              NumPy files in DIR: train_images.npy,
//                          train_labels.npy, test_images.npy,
//                          test_labels.npy (np.save of uint8 images
//                          [N, H, W] and integer labels [N], 0..255).
// Checked at load: 3-D images and 1-D labels of the same count, train and
// test images of the same height and width, at least one image each,
// labels in 0..255; each error names the file and what is wrong.
#ifndef SHOAL_SERVICES_WORKER_CORE_DATASET_H_
#define SHOAL_SERVICES_WORKER_CORE_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/worker/core/idx_reader.h"

namespace shoal::worker {

// A parsed .npy array: its dtype descriptor ("|u1", "<i8", ...), shape and
// raw little-endian data.
struct NpyArray {
  std::string dtype;
  std::vector<uint64_t> shape;
  std::string data;
};

// Parses the bytes of a .npy file (format versions 1-3, C order only).
// INVALID_ARGUMENT naming `what` for anything else.
absl::StatusOr<NpyArray> ParseNpy(const std::string& bytes, const std::string& what);

// Loads the dataset `spec` names (see above); `data_dir` is the directory
// of the default Fashion-MNIST.
absl::StatusOr<FashionMnist> LoadDataset(const std::string& spec, const std::string& data_dir);

// The largest label of both sets (for the model's number of classes).
int MaxLabel(const FashionMnist& data);

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_DATASET_H_
