// The durable checkpoint store: content-addressed layer blobs plus one
// manifest per checkpoint, in a directory. Plain C++ (no gRPC types); the
// gRPC adapter is services/checkpoint/checkpoint_service.h.
//
// Layout of the data directory (see services/checkpoint/README.md):
//   LOCK                 flock()ed while a store has the directory open
//   FORMAT               "shoal-checkpoint-store 1"
//   blobs/ab/abcd...     one layer's raw bytes, named by their SHA-256 (hex)
//   manifests/<id>.pb    a binary shoal.v1.Manifest per committed checkpoint
//   tmp/                 uploads in progress; wiped when the store opens
//
// A checkpoint becomes visible only when its manifest is renamed into
// manifests/ (after every blob it names is fsynced and in place), so a crash
// at any point leaves either the old state or the new one. Blobs no manifest
// names (left by a crash between the two steps) are removed on open.
#ifndef SHOAL_SERVICES_CHECKPOINT_CORE_CHECKPOINT_STORE_H_
#define SHOAL_SERVICES_CHECKPOINT_CORE_CHECKPOINT_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/sha256.h"
#include "shoal/v1/checkpoint.pb.h"

namespace shoal::checkpoint {

struct StoreOptions {
  // The store's directory; created if missing.
  std::string data_dir;
  // Keep the last `retain` checkpoints (highest rounds) of each run; older
  // ones are deleted after each commit. 0 keeps everything.
  uint32_t retain = 0;
  // Re-hash every blob on open and mark checkpoints whose blobs do not match
  // as damaged. When false only the blobs' presence and sizes are checked.
  bool verify_on_start = true;
  // Stamps `created_unix_ms`. Not owned; must outlive the store.
  const Clock* clock = RealClock::Get();
  // Test hook for failing writes: called before every write(2) of data to
  // disk with the number of bytes about to be written; a non-zero return is
  // treated as that errno (e.g. ENOSPC, which becomes RESOURCE_EXHAUSTED).
  std::function<int(size_t bytes)> write_fault;
};

// Bytes per element of a supported dtype, 0 when unsupported. Only
// "float32" for now.
size_t DtypeSize(absl::string_view dtype);

// "<run_id>-r<round>".
std::string CheckpointId(absl::string_view run_id, uint64_t round);

// Longest run id, and longest checkpoint id ("<run_id>-r" + a uint64).
inline constexpr size_t kMaxRunIdLength = 128;
inline constexpr size_t kMaxCheckpointIdLength = kMaxRunIdLength + 2 + 20;

// Run ids and checkpoint ids name files (manifests/<id>.pb), so both are
// one safe path component: 1..limit characters, only letters, digits, '.',
// '_' and '-', not starting with '.', no "..". INVALID_ARGUMENT otherwise.
// Every store call that takes an id checks it first, before the index or
// the filesystem is touched.
absl::Status ValidateRunId(absl::string_view run_id);
absl::Status ValidateCheckpointId(absl::string_view id);

// Checks a manifest as an upload header: valid run id, at least one layer,
// unique non-empty names, a supported dtype, non-negative shapes whose size
// matches `bytes`, a 64-digit hex SHA-256. INVALID_ARGUMENT naming the
// offending layer otherwise.
absl::Status ValidateManifest(const shoal::v1::Manifest& manifest);

class CheckpointStore;

// One upload in progress: layer bytes are appended in manifest order (layer
// by layer, each from offset 0 without gaps), written to tmp/ and hashed as
// they arrive; a layer whose bytes do not hash to the manifest's SHA-256 is
// refused with DATA_LOSS. Commit() makes the checkpoint visible atomically.
// Destroying an upload that was not committed removes its temporary files.
// Not thread-safe: one upload is driven by one stream. The store must
// outlive it.
class PendingUpload {
 public:
  ~PendingUpload();
  PendingUpload(const PendingUpload&) = delete;
  PendingUpload& operator=(const PendingUpload&) = delete;

  // Appends `data` at `offset` of layer `layer`. INVALID_ARGUMENT: unknown
  // layer, out of order, and the wire module's chunk checks (empty, gap,
  // overlap, past the layer's end; RESOURCE_EXHAUSTED over 4 MiB: see
  // common/tensor_wire.h). DATA_LOSS: a layer completed with the wrong
  // SHA-256. I/O errors keep
  // their errno's code (ENOSPC: RESOURCE_EXHAUSTED). After any error the
  // upload is dead: later calls repeat the error.
  absl::Status Append(uint32_t layer, uint64_t offset, absl::string_view data);

  // DATA_LOSS when fewer bytes arrived than the manifest says (nothing is
  // committed). On success the checkpoint is durable and listed, replacing
  // one with the same id, and retention has run.
  absl::StatusOr<shoal::v1::CheckpointInfo> Commit();

  const shoal::v1::Manifest& manifest() const { return manifest_; }
  uint64_t bytes_received() const { return received_; }

 private:
  friend class CheckpointStore;
  PendingUpload(CheckpointStore* store, shoal::v1::Manifest manifest, std::string dir);
  absl::Status OpenLayer(uint32_t layer);
  absl::Status FinishLayer();
  absl::Status Fail(absl::Status status);
  void CloseFile();

  CheckpointStore* const store_;
  shoal::v1::Manifest manifest_;
  const std::string dir_;  // tmp/<upload>/
  uint64_t total_ = 0;     // bytes the manifest promises
  uint64_t received_ = 0;
  uint32_t layer_ = 0;                    // layer being written
  uint64_t next_offset_ = 0;              // next byte expected in `layer_`
  int fd_ = -1;                           // file of `layer_`, when open
  std::unique_ptr<Sha256> hasher_;        // of `layer_`
  std::vector<std::string> layer_files_;  // complete, fsynced layers
  absl::Status error_;
  bool committed_ = false;
};

// Reads a byte range of one layer, piece by piece, from a file descriptor
// opened when the reader was made (so a concurrent delete does not disturb
// it). A read of the whole layer is hashed; a mismatch ends it with
// DATA_LOSS and marks the checkpoint damaged. Not thread-safe.
class LayerReader {
 public:
  ~LayerReader();
  LayerReader(const LayerReader&) = delete;
  LayerReader& operator=(const LayerReader&) = delete;

  // Reads up to `max_bytes` of the range into `out` (replacing its contents)
  // and returns the offset within the layer of the first byte read. `out` is
  // empty at the end of the range; call Finish() then.
  absl::StatusOr<uint64_t> Next(size_t max_bytes, std::string* out);
  // DATA_LOSS when a whole-layer read did not match the layer's SHA-256.
  absl::Status Finish();

  uint64_t remaining() const { return end_ - next_; }

 private:
  friend class CheckpointStore;
  LayerReader(CheckpointStore* store, int fd, std::string sha256, std::string what, uint64_t begin,
              uint64_t end, bool whole);

  CheckpointStore* const store_;
  const int fd_;
  const std::string sha256_;
  const std::string what_;  // "layer 'fc1.weight' of run-r3", for messages
  uint64_t next_;
  const uint64_t end_;
  std::unique_ptr<Sha256> hasher_;  // set for whole-layer reads
};

// Thread-safe: the index (manifests, blob reference counts, damaged blobs)
// sits behind one mutex; commits and deletes hold it while they move or
// remove blob files so that deduplication never races a delete. Large writes
// and fsyncs of layer data happen in PendingUpload, outside the mutex.
// Only one store may have a directory open at a time (flock on LOCK).
class CheckpointStore {
 public:
  // Creates or opens the store in `options.data_dir`: wipes tmp/, loads the
  // manifests, removes unreferenced blobs, checks (or re-hashes, with
  // verify_on_start) every blob. FAILED_PRECONDITION when another store holds
  // the directory or its format is unknown.
  static absl::StatusOr<std::unique_ptr<CheckpointStore>> Open(StoreOptions options);
  ~CheckpointStore();

  // Starts an upload of `manifest` (validated; its id and created time are
  // set by the store). INVALID_ARGUMENT for a bad manifest.
  absl::StatusOr<std::unique_ptr<PendingUpload>> BeginUpload(shoal::v1::Manifest manifest);

  // Committed checkpoints, newest first (creation time, then round); only
  // `run_id`'s when it is not empty.
  std::vector<shoal::v1::CheckpointInfo> List(absl::string_view run_id = "") const;
  // Every call that takes an id: INVALID_ARGUMENT for an id that fails
  // ValidateCheckpointId, before any lookup or file access.
  absl::StatusOr<shoal::v1::CheckpointInfo> Info(absl::string_view id) const;
  // NOT_FOUND for an unknown id.
  absl::StatusOr<shoal::v1::Manifest> GetManifest(absl::string_view id) const;
  // Opens [offset, offset + length) of layer `layer`; length 0 means to the
  // end of the layer. NOT_FOUND: unknown id. OUT_OF_RANGE: layer index past
  // the manifest, offset or range past the end of the layer. DATA_LOSS: the
  // checkpoint is damaged.
  absl::StatusOr<std::unique_ptr<LayerReader>> ReadLayer(absl::string_view id, uint32_t layer,
                                                         uint64_t offset, uint64_t length);
  // Removes the manifest, then every blob no other manifest uses.
  // NOT_FOUND for an unknown id.
  absl::Status Delete(absl::string_view id);

  const std::string& data_dir() const { return options_.data_dir; }
  size_t size() const;

 private:
  friend class PendingUpload;
  friend class LayerReader;
  struct Entry {
    shoal::v1::Manifest manifest;
    uint64_t bytes = 0;
  };

  explicit CheckpointStore(StoreOptions options) : options_(std::move(options)) {}
  absl::Status Init();
  absl::Status LoadManifests(bool* all_loaded);
  absl::Status SweepBlobs(bool remove_unreferenced);
  void CheckBlobs();

  // Called by PendingUpload::Commit with the fsynced layer files.
  absl::StatusOr<shoal::v1::CheckpointInfo> CommitUpload(
      shoal::v1::Manifest manifest, const std::vector<std::string>& layer_files);
  // Called by a reader whose whole-layer hash did not match.
  void MarkDamaged(const std::string& sha256, const std::string& reason);
  // Writes `size` bytes, honouring the write_fault hook.
  absl::Status WriteAll(int fd, const char* data, size_t size, const std::string& path);

  std::string BlobPath(absl::string_view sha256) const;
  std::string ManifestPath(absl::string_view id) const;
  absl::Status DeleteLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyRetentionLocked(const std::string& run_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddRefsLocked(const shoal::v1::Manifest& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the manifest's references and removes blobs nobody uses any more.
  void DropRefsLocked(const shoal::v1::Manifest& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string DamageLocked(const shoal::v1::Manifest& m) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  shoal::v1::CheckpointInfo InfoLocked(const Entry& e) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const StoreOptions options_;
  int lock_fd_ = -1;

  mutable absl::Mutex mu_;
  std::map<std::string, Entry> checkpoints_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> blob_refs_ ABSL_GUARDED_BY(mu_);
  // Blob sha256 -> why it cannot be served.
  std::map<std::string, std::string> damaged_blobs_ ABSL_GUARDED_BY(mu_);
  uint64_t next_upload_ ABSL_GUARDED_BY(mu_) = 0;
};

// One Checkpoint.Upload stream as the service receives it (the gRPC
// reactor passes each message here): the first message carries the
// manifest (BeginUpload), every later one a layer chunk (size and CRC-32C
// checked here, range and digest by PendingUpload::Append); Finish()
// commits once the client has half-closed. INVALID_ARGUMENT for messages
// out of that order. After an error the upload is dropped (its temporary
// files go) and every later call fails. Not thread-safe: one stream.
class UploadStream {
 public:
  explicit UploadStream(CheckpointStore* store) : store_(store) {}

  absl::Status Accept(shoal::v1::UploadChunk message);
  absl::StatusOr<shoal::v1::CheckpointInfo> Finish();
  // Drops the upload without committing (a cancelled or failed call).
  void Abort() { upload_.reset(); }
  // The upload's checkpoint id, or "(no manifest)".
  std::string id() const;

 private:
  CheckpointStore* const store_;
  std::unique_ptr<PendingUpload> upload_;
  std::string id_;  // of the accepted manifest
  absl::Status failed_;
};

}  // namespace shoal::checkpoint

#endif  // SHOAL_SERVICES_CHECKPOINT_CORE_CHECKPOINT_STORE_H_
