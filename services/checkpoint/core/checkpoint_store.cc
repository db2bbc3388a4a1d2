#include "services/checkpoint/core/checkpoint_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_util.h"
#include "common/tensor_wire.h"

namespace shoal::checkpoint {
namespace fs = std::filesystem;
namespace {

constexpr char kFormat[] = "shoal-checkpoint-store 1\n";
constexpr size_t kIoBytes = 1 << 20;

// errno -> status. The codes a client can act on are chosen explicitly: a
// full disk is RESOURCE_EXHAUSTED, a read-only or forbidden directory is an
// operator problem (FAILED_PRECONDITION), an I/O error is DATA_LOSS.
absl::Status ErrnoStatus(int err, absl::string_view what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
    case EMFILE:
    case ENFILE:
    case ENOMEM:
      return absl::ResourceExhaustedError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::FailedPreconditionError(message);
    case EIO:
      return absl::DataLossError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status FsyncPath(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECTORY);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", path));
  const int rc = fsync(fd);
  const int err = errno;
  close(fd);
  if (rc != 0) return ErrnoStatus(err, absl::StrCat("fsync ", path));
  return absl::OkStatus();
}

absl::Status MakeDirs(const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) return ErrnoStatus(ec.value(), absl::StrCat("create directory ", path));
  return absl::OkStatus();
}

bool IsHex(absl::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return absl::ascii_isxdigit(c); });
}

bool IsLowerSha256(absl::string_view s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return absl::ascii_isdigit(c) || (c >= 'a' && c <= 'f');
         });
}

// Hashes a whole file.
absl::StatusOr<std::string> HashFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", path));
  Sha256 hash;
  std::string buf(kIoBytes, '\0');
  while (true) {
    const ssize_t n = read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      return ErrnoStatus(err, absl::StrCat("read ", path));
    }
    if (n == 0) break;
    hash.Update(buf.data(), static_cast<size_t>(n));
  }
  close(fd);
  return hash.HexDigest();
}

std::string HumanBytes(uint64_t bytes) {
  if (bytes >= (1ull << 30)) return absl::StrFormat("%.1f GiB", bytes / double(1ull << 30));
  if (bytes >= (1ull << 20)) return absl::StrFormat("%.1f MiB", bytes / double(1ull << 20));
  if (bytes >= (1ull << 10)) return absl::StrFormat("%.1f KiB", bytes / double(1ull << 10));
  return absl::StrCat(bytes, " B");
}

}  // namespace

size_t DtypeSize(absl::string_view dtype) { return dtype == "float32" ? 4 : 0; }

std::string CheckpointId(absl::string_view run_id, uint64_t round) {
  return absl::StrCat(run_id, "-r", round);
}

namespace {

// Letters, digits, '.', '_', '-'; not first '.'; no "..". Such a name is
// one path component that is neither "." nor "..", whatever follows it.
bool IsSafeName(absl::string_view name) {
  return !name.empty() && name[0] != '.' && !absl::StrContains(name, "..") &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-';
         });
}

// `s` for an error message: at most 64 characters, non-printable bytes
// escaped (a hostile id is echoed back, and logged).
std::string Quoted(absl::string_view s) {
  std::string out = absl::CHexEscape(s.substr(0, 64));
  if (s.size() > 64) absl::StrAppend(&out, "... (", s.size(), " bytes)");
  return absl::StrCat("'", out, "'");
}

}  // namespace

absl::Status ValidateRunId(absl::string_view run_id) {
  if (run_id.empty()) return absl::InvalidArgumentError("manifest has no run_id");
  if (run_id.size() > kMaxRunIdLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("run_id is longer than ", kMaxRunIdLength, " characters"));
  }
  if (!IsSafeName(run_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("run_id ", Quoted(run_id),
                     " may only contain letters, digits, '.', '_' and '-' (not first '.', no "
                     "'..')"));
  }
  return absl::OkStatus();
}

absl::Status ValidateCheckpointId(absl::string_view id) {
  if (id.empty()) return absl::InvalidArgumentError("checkpoint id is empty");
  if (id.size() > kMaxCheckpointIdLength) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint id ", Quoted(id), " is longer than ",
                                                   kMaxCheckpointIdLength, " characters"));
  }
  if (!IsSafeName(id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint id ", Quoted(id),
                     " may only contain letters, digits, '.', '_' and '-' (not first '.', no "
                     "'..')"));
  }
  return absl::OkStatus();
}

absl::Status ValidateManifest(const shoal::v1::Manifest& m) {
  RETURN_IF_ERROR(ValidateRunId(m.run_id()));
  if (m.layers().empty()) return absl::InvalidArgumentError("manifest has no layers");
  std::set<absl::string_view> names;
  bool state_seen = false;
  for (int i = 0; i < m.layers_size(); ++i) {
    const shoal::v1::LayerEntry& l = m.layers(i);
    const std::string where = absl::StrCat("layer ", i, " '", l.name(), "'");
    if (l.name().empty())
      return absl::InvalidArgumentError(absl::StrCat("layer ", i, " has no name"));
    // Readers take the model as the leading layers (export, model pulls).
    if (l.optimizer_state()) {
      if (i == 0) return absl::InvalidArgumentError(absl::StrCat(where, ": no model layer"));
      state_seen = true;
    } else if (state_seen) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": a model layer after an optimizer state layer"));
    }
    if (!names.insert(l.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate layer name '", l.name(), "'"));
    }
    const size_t elem = DtypeSize(l.dtype());
    if (elem == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": unsupported dtype '", l.dtype(), "' (supported: float32)"));
    }
    uint64_t count = 1;
    for (int64_t d : l.shape()) {
      if (d < 0) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": negative dimension ", d));
      }
      if (__builtin_mul_overflow(count, static_cast<uint64_t>(d), &count)) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": shape overflows"));
      }
    }
    uint64_t expected = 0;
    if (__builtin_mul_overflow(count, static_cast<uint64_t>(elem), &expected)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": shape overflows"));
    }
    if (l.bytes() != expected) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": bytes is ", l.bytes(), " but ",
                                                     count, " ", l.dtype(), " elements take ",
                                                     expected));
    }
    if (l.sha256().size() != 64 || !IsHex(l.sha256())) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": sha256 must be 64 hex digits, got '", l.sha256(), "'"));
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// PendingUpload

PendingUpload::PendingUpload(CheckpointStore* store, shoal::v1::Manifest manifest, std::string dir)
    : store_(store), manifest_(std::move(manifest)), dir_(std::move(dir)) {
  for (const auto& l : manifest_.layers()) total_ += l.bytes();
}

PendingUpload::~PendingUpload() {
  CloseFile();
  std::error_code ec;
  fs::remove_all(dir_, ec);
  if (!committed_) {
    SHOAL_VLOG(1) << "upload of " << manifest_.id() << " dropped after " << received_ << " of "
                  << total_ << " bytes";
  }
}

void PendingUpload::CloseFile() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

absl::Status PendingUpload::Fail(absl::Status status) {
  error_ = status;
  CloseFile();
  // Free the disk now rather than when the stream object goes away.
  std::error_code ec;
  fs::remove_all(dir_, ec);
  layer_files_.clear();
  return status;
}

absl::Status PendingUpload::OpenLayer(uint32_t layer) {
  const std::string path = absl::StrCat(dir_, "/layer-", layer);
  fd_ = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) return ErrnoStatus(errno, absl::StrCat("create ", path));
  hasher_ = std::make_unique<Sha256>();
  return absl::OkStatus();
}

absl::Status PendingUpload::FinishLayer() {
  if (fd_ < 0) RETURN_IF_ERROR(OpenLayer(layer_));  // an empty layer gets no chunks
  const shoal::v1::LayerEntry& l = manifest_.layers(layer_);
  const std::string digest = hasher_->HexDigest();
  hasher_.reset();
  if (digest != l.sha256()) {
    return absl::DataLossError(absl::StrCat("layer ", layer_, " '", l.name(), "': its ", l.bytes(),
                                            " bytes hash to ", digest, ", the manifest says ",
                                            l.sha256()));
  }
  const std::string path = absl::StrCat(dir_, "/layer-", layer_);
  if (fsync(fd_) != 0) return ErrnoStatus(errno, absl::StrCat("fsync ", path));
  CloseFile();
  layer_files_.push_back(path);
  return absl::OkStatus();
}

absl::Status PendingUpload::Append(uint32_t layer, uint64_t offset, absl::string_view data) {
  if (!error_.ok()) return error_;
  if (committed_) return absl::FailedPreconditionError("upload already committed");
  const uint32_t n = static_cast<uint32_t>(manifest_.layers_size());
  if (layer >= n) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("chunk for layer ", layer, " but the manifest has ", n, " layers")));
  }
  if (layer < layer_) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("chunk for layer ", layer, " at offset ", offset,
                     " after that layer was complete (layers are sent in order, once)")));
  }
  // Moving on to a later layer: everything before it must be complete.
  while (layer_ < layer) {
    const shoal::v1::LayerEntry& cur = manifest_.layers(layer_);
    if (next_offset_ != cur.bytes()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "chunk for layer ", layer, " arrived before layer ", layer_, " '", cur.name(),
          "' was complete (", next_offset_, " of ", cur.bytes(), " bytes)")));
    }
    if (absl::Status s = FinishLayer(); !s.ok()) return Fail(s);
    ++layer_;
    next_offset_ = 0;
  }
  const shoal::v1::LayerEntry& l = manifest_.layers(layer_);
  // The wire module's checks (common/tensor_wire.h), as for tensor chunks:
  // INVALID_ARGUMENT for an empty chunk, a gap, an overlap or a chunk past
  // the layer's end; RESOURCE_EXHAUSTED over kMaxChunkBytes.
  const ChunkSequence sequence(next_offset_, l.bytes(), /*unit_bytes=*/1);
  if (absl::StatusOr<uint64_t> checked = sequence.Check(offset, data.size()); !checked.ok()) {
    return Fail(Annotate(checked.status(), absl::StrCat("layer ", layer_, " '", l.name(), "' (",
                                                        l.bytes(), " bytes)")));
  }
  if (fd_ < 0) {
    if (absl::Status s = OpenLayer(layer_); !s.ok()) return Fail(s);
  }
  if (absl::Status s = store_->WriteAll(fd_, data.data(), data.size(), dir_); !s.ok()) {
    return Fail(s);
  }
  hasher_->Update(data.data(), data.size());
  next_offset_ += data.size();
  received_ += data.size();
  if (next_offset_ == l.bytes()) {
    // Check the hash as soon as the layer is complete, not at the very end.
    if (absl::Status s = FinishLayer(); !s.ok()) return Fail(s);
    ++layer_;
    next_offset_ = 0;
  }
  return absl::OkStatus();
}

absl::StatusOr<shoal::v1::CheckpointInfo> PendingUpload::Commit() {
  if (!error_.ok()) return error_;
  if (committed_) return absl::FailedPreconditionError("upload already committed");
  const uint32_t n = static_cast<uint32_t>(manifest_.layers_size());
  while (layer_ < n) {
    const shoal::v1::LayerEntry& l = manifest_.layers(layer_);
    if (next_offset_ != l.bytes()) {
      return Fail(absl::DataLossError(absl::StrCat(
          "upload ended after ", received_, " of ", total_, " bytes (layer ", layer_, " '",
          l.name(), "' has ", next_offset_, " of ", l.bytes(), "); nothing committed")));
    }
    if (absl::Status s = FinishLayer(); !s.ok()) return Fail(s);
    ++layer_;
    next_offset_ = 0;
  }
  absl::StatusOr<shoal::v1::CheckpointInfo> info = store_->CommitUpload(manifest_, layer_files_);
  if (!info.ok()) return Fail(info.status());
  committed_ = true;
  return info;
}

// ---------------------------------------------------------------------------
// LayerReader

LayerReader::LayerReader(CheckpointStore* store, int fd, std::string sha256, std::string what,
                         uint64_t begin, uint64_t end, bool whole)
    : store_(store),
      fd_(fd),
      sha256_(std::move(sha256)),
      what_(std::move(what)),
      next_(begin),
      end_(end) {
  if (whole) hasher_ = std::make_unique<Sha256>();
}

LayerReader::~LayerReader() { close(fd_); }

absl::StatusOr<uint64_t> LayerReader::Next(size_t max_bytes, std::string* out) {
  const uint64_t begin = next_;
  const size_t n = static_cast<size_t>(std::min<uint64_t>(max_bytes, end_ - next_));
  out->resize(n);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = pread(fd_, out->data() + done, n - done, static_cast<off_t>(next_ + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoStatus(errno, absl::StrCat("read ", what_));
    if (r == 0) {
      const std::string reason = absl::StrCat("blob ends at byte ", next_ + done);
      store_->MarkDamaged(sha256_, reason);
      return absl::DataLossError(absl::StrCat(what_, ": ", reason));
    }
    done += static_cast<size_t>(r);
  }
  if (hasher_) hasher_->Update(out->data(), n);
  next_ += n;
  return begin;
}

absl::Status LayerReader::Finish() {
  if (!hasher_ || next_ != end_) return absl::OkStatus();
  const std::string digest = hasher_->HexDigest();
  hasher_.reset();
  if (digest != sha256_) {
    const std::string reason = absl::StrCat("blob hashes to ", digest);
    store_->MarkDamaged(sha256_, reason);
    return absl::DataLossError(absl::StrCat(what_, " is corrupted: ", reason));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// CheckpointStore

absl::StatusOr<std::unique_ptr<CheckpointStore>> CheckpointStore::Open(StoreOptions options) {
  if (options.data_dir.empty()) return absl::InvalidArgumentError("no data directory given");
  if (options.clock == nullptr) options.clock = RealClock::Get();
  std::unique_ptr<CheckpointStore> store(new CheckpointStore(std::move(options)));
  RETURN_IF_ERROR(store->Init());
  return store;
}

CheckpointStore::~CheckpointStore() {
  if (lock_fd_ >= 0) close(lock_fd_);  // releases the flock
}

std::string CheckpointStore::BlobPath(absl::string_view sha256) const {
  return absl::StrCat(options_.data_dir, "/blobs/", sha256.substr(0, 2), "/", sha256);
}

std::string CheckpointStore::ManifestPath(absl::string_view id) const {
  return absl::StrCat(options_.data_dir, "/manifests/", id, ".pb");
}

absl::Status CheckpointStore::WriteAll(int fd, const char* data, size_t size,
                                       const std::string& path) {
  while (size > 0) {
    const size_t n = std::min(size, kIoBytes);
    if (options_.write_fault) {
      if (const int err = options_.write_fault(n); err != 0) {
        return ErrnoStatus(err, absl::StrCat("write to ", path));
      }
    }
    const ssize_t w = write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return ErrnoStatus(errno, absl::StrCat("write to ", path));
    data += w;
    size -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status CheckpointStore::Init() {
  const std::string& dir = options_.data_dir;
  for (const char* sub : {"", "/blobs", "/manifests", "/tmp"}) {
    RETURN_IF_ERROR(MakeDirs(dir + sub));
  }
  const std::string lock_path = dir + "/LOCK";
  lock_fd_ = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) return ErrnoStatus(errno, absl::StrCat("open ", lock_path));
  if (flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat(dir, " is in use by another checkpoint store (", lock_path, " is locked)"));
    }
    return ErrnoStatus(errno, absl::StrCat("lock ", lock_path));
  }

  // The format marker: refuse directories written by an incompatible store.
  const std::string format_path = dir + "/FORMAT";
  if (fs::exists(format_path)) {
    std::string content(256, '\0');
    const int fd = open(format_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", format_path));
    const ssize_t n = read(fd, content.data(), content.size());
    close(fd);
    content.resize(n > 0 ? static_cast<size_t>(n) : 0);
    if (content != kFormat) {
      return absl::FailedPreconditionError(
          absl::StrCat(format_path, " says '", absl::StripAsciiWhitespace(content),
                       "'; this server reads '", absl::StripAsciiWhitespace(kFormat), "'"));
    }
  } else {
    const std::string tmp = dir + "/tmp/FORMAT";
    const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("create ", tmp));
    absl::Status s = WriteAll(fd, kFormat, sizeof(kFormat) - 1, tmp);
    if (s.ok() && fsync(fd) != 0) s = ErrnoStatus(errno, absl::StrCat("fsync ", tmp));
    close(fd);
    RETURN_IF_ERROR(s);
    if (rename(tmp.c_str(), format_path.c_str()) != 0) {
      return ErrnoStatus(errno, absl::StrCat("rename ", tmp));
    }
    RETURN_IF_ERROR(FsyncPath(dir));
  }

  // Uploads that were in progress when the last server stopped are gone.
  std::error_code ec;
  size_t stale = 0;
  for (const auto& e : fs::directory_iterator(dir + "/tmp", ec)) {
    fs::remove_all(e.path(), ec);
    ++stale;
  }
  if (stale > 0)
    SHOAL_LOG(INFO) << "removed " << stale << " unfinished upload(s) from " << dir << "/tmp";

  bool all_loaded = true;
  RETURN_IF_ERROR(LoadManifests(&all_loaded));
  RETURN_IF_ERROR(SweepBlobs(/*remove_unreferenced=*/all_loaded));
  CheckBlobs();
  {
    absl::MutexLock lock(&mu_);
    std::set<std::string> runs;
    for (const auto& [id, e] : checkpoints_) runs.insert(e.manifest.run_id());
    for (const std::string& run : runs) ApplyRetentionLocked(run);
  }
  return absl::OkStatus();
}

absl::Status CheckpointStore::LoadManifests(bool* all_loaded) {
  const std::string dir = options_.data_dir + "/manifests";
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return ErrnoStatus(ec.value(), absl::StrCat("list ", dir));
  absl::MutexLock lock(&mu_);
  for (const auto& f : it) {
    const std::string path = f.path().string();
    const std::string name = f.path().filename().string();
    if (!absl::EndsWith(name, ".pb")) {
      SHOAL_LOG(WARNING) << "ignoring " << path << " (not a manifest)";
      continue;
    }
    const std::string id = name.substr(0, name.size() - 3);
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    shoal::v1::Manifest m;
    const bool parsed = fd >= 0 && m.ParseFromFileDescriptor(fd);
    if (fd >= 0) close(fd);
    absl::Status s = parsed ? ValidateManifest(m) : absl::DataLossError("cannot parse");
    if (s.ok() && (m.id() != id || CheckpointId(m.run_id(), m.round()) != id)) {
      s = absl::DataLossError(absl::StrCat("manifest says id '", m.id(), "'"));
    }
    if (!s.ok()) {
      // Keep the file for an operator to look at; its blobs are kept too.
      SHOAL_LOG(ERROR) << "skipping manifest " << path << ": " << s.message();
      *all_loaded = false;
      continue;
    }
    Entry e;
    for (const auto& l : m.layers()) e.bytes += l.bytes();
    e.manifest = std::move(m);
    AddRefsLocked(e.manifest);
    checkpoints_[id] = std::move(e);
  }
  return absl::OkStatus();
}

absl::Status CheckpointStore::SweepBlobs(bool remove_unreferenced) {
  const std::string dir = options_.data_dir + "/blobs";
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return ErrnoStatus(ec.value(), absl::StrCat("list ", dir));
  absl::MutexLock lock(&mu_);
  size_t removed = 0;
  for (const auto& sub : it) {
    for (const auto& f : fs::directory_iterator(sub.path(), ec)) {
      const std::string sha = f.path().filename().string();
      if (blob_refs_.count(sha) > 0 || !remove_unreferenced) continue;
      if (!IsLowerSha256(sha) || sub.path().filename() != sha.substr(0, 2)) {
        SHOAL_LOG(WARNING) << "ignoring " << f.path().string() << " (not a blob)";
        continue;
      }
      // Left by a crash between placing blobs and writing their manifest, or
      // between removing a manifest and its blobs.
      fs::remove(f.path(), ec);
      ++removed;
    }
  }
  if (removed > 0) SHOAL_LOG(INFO) << "removed " << removed << " unreferenced blob(s)";
  return absl::OkStatus();
}

void CheckpointStore::CheckBlobs() {
  std::map<std::string, uint64_t> expected;  // sha -> bytes
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, e] : checkpoints_) {
      for (const auto& l : e.manifest.layers()) expected[l.sha256()] = l.bytes();
    }
  }
  const absl::Time start = options_.clock->Now();
  uint64_t hashed = 0;
  std::map<std::string, std::string> damaged;
  for (const auto& [sha, bytes] : expected) {
    const std::string path = BlobPath(sha);
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
      damaged[sha] = absl::StrCat("blob ", sha, " is missing (", std::strerror(errno), ")");
      continue;
    }
    if (static_cast<uint64_t>(st.st_size) != bytes) {
      damaged[sha] =
          absl::StrCat("blob ", sha, " has ", st.st_size, " bytes, the manifest says ", bytes);
      continue;
    }
    if (!options_.verify_on_start) continue;
    absl::StatusOr<std::string> digest = HashFile(path);
    hashed += bytes;
    if (!digest.ok()) {
      damaged[sha] = std::string(digest.status().message());
    } else if (*digest != sha) {
      damaged[sha] = absl::StrCat("blob ", sha, " is corrupted (its bytes hash to ", *digest, ")");
    }
  }
  absl::MutexLock lock(&mu_);
  damaged_blobs_ = std::move(damaged);
  size_t bad = 0;
  for (const auto& [id, e] : checkpoints_) {
    const std::string damage = DamageLocked(e.manifest);
    if (damage.empty()) continue;
    ++bad;
    SHOAL_LOG(ERROR) << "checkpoint " << id << " is damaged: " << damage;
  }
  SHOAL_LOG(INFO) << "opened " << options_.data_dir << ": " << checkpoints_.size()
                  << " checkpoint(s), " << expected.size() << " blob(s)"
                  << (options_.verify_on_start
                          ? absl::StrCat(", verified ", HumanBytes(hashed), " in ",
                                         absl::FormatDuration(options_.clock->Now() - start))
                          : std::string(", sizes checked (verification off)"))
                  << (bad > 0 ? absl::StrCat(", ", bad, " damaged") : std::string());
}

absl::StatusOr<std::unique_ptr<PendingUpload>> CheckpointStore::BeginUpload(
    shoal::v1::Manifest manifest) {
  RETURN_IF_ERROR(ValidateManifest(manifest));
  for (auto& l : *manifest.mutable_layers()) absl::AsciiStrToLower(l.mutable_sha256());
  manifest.set_id(CheckpointId(manifest.run_id(), manifest.round()));
  manifest.set_created_unix_ms(0);  // stamped at commit
  uint64_t n;
  {
    absl::MutexLock lock(&mu_);
    n = next_upload_++;
  }
  const std::string dir = absl::StrCat(options_.data_dir, "/tmp/upload-", n);
  RETURN_IF_ERROR(MakeDirs(dir));
  return std::unique_ptr<PendingUpload>(new PendingUpload(this, std::move(manifest), dir));
}

absl::StatusOr<shoal::v1::CheckpointInfo> CheckpointStore::CommitUpload(
    shoal::v1::Manifest manifest, const std::vector<std::string>& layer_files) {
  manifest.set_created_unix_ms(absl::ToUnixMillis(options_.clock->Now()));
  const std::string id = manifest.id();
  std::string serialized;
  if (!manifest.SerializeToString(&serialized)) {
    return absl::InternalError("cannot serialize the manifest");
  }

  absl::MutexLock lock(&mu_);
  // 1. Place the blobs. An existing healthy blob with the same hash is the
  // same content (deduplication); a damaged one is replaced.
  std::vector<std::string> placed;  // blobs this commit created
  auto undo = [&] {
    for (const std::string& sha : placed) {
      if (blob_refs_.count(sha) == 0) unlink(BlobPath(sha).c_str());
    }
  };
  std::set<std::string> dirs;
  for (int i = 0; i < manifest.layers_size(); ++i) {
    const std::string& sha = manifest.layers(i).sha256();
    const std::string path = BlobPath(sha);
    const std::string parent = fs::path(path).parent_path().string();
    const bool damaged = damaged_blobs_.count(sha) > 0;
    if (!damaged && access(path.c_str(), F_OK) == 0) {
      unlink(layer_files[i].c_str());
      continue;
    }
    if (absl::Status s = MakeDirs(parent); !s.ok()) {
      undo();
      return s;
    }
    if (rename(layer_files[i].c_str(), path.c_str()) != 0) {
      const absl::Status s = ErrnoStatus(errno, absl::StrCat("rename into ", path));
      undo();
      return s;
    }
    if (damaged) {
      damaged_blobs_.erase(sha);
      SHOAL_LOG(INFO) << "blob " << sha << " repaired by the upload of " << id;
    } else {
      placed.push_back(sha);
    }
    dirs.insert(parent);
  }
  for (const std::string& d : dirs) {
    if (absl::Status s = FsyncPath(d); !s.ok()) {
      undo();
      return s;
    }
  }

  // 2. The manifest: written aside, fsynced, renamed into place. The rename
  // is the commit point.
  const std::string tmp = absl::StrCat(options_.data_dir, "/tmp/", id, ".pb.tmp");
  const std::string path = ManifestPath(id);
  absl::Status s;
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    s = ErrnoStatus(errno, absl::StrCat("create ", tmp));
  } else {
    s = WriteAll(fd, serialized.data(), serialized.size(), tmp);
    if (s.ok() && fsync(fd) != 0) s = ErrnoStatus(errno, absl::StrCat("fsync ", tmp));
    close(fd);
  }
  if (s.ok() && rename(tmp.c_str(), path.c_str()) != 0) {
    s = ErrnoStatus(errno, absl::StrCat("rename into ", path));
  }
  if (!s.ok()) {
    unlink(tmp.c_str());
    undo();
    return s;
  }
  // The rename happened; a failed directory fsync is only logged (the
  // checkpoint is visible and the next one will fsync the directory again).
  if (absl::Status sync = FsyncPath(options_.data_dir + "/manifests"); !sync.ok()) {
    SHOAL_LOG(WARNING) << sync.message();
  }

  // 3. The index. References first, so blobs shared with a replaced
  // checkpoint of the same id survive.
  Entry e;
  for (const auto& l : manifest.layers()) e.bytes += l.bytes();
  e.manifest = std::move(manifest);
  AddRefsLocked(e.manifest);
  auto old = checkpoints_.find(id);
  if (old != checkpoints_.end()) {
    DropRefsLocked(old->second.manifest);
    checkpoints_.erase(old);
    SHOAL_LOG(INFO) << "checkpoint " << id << " replaced";
  }
  const std::string run_id = e.manifest.run_id();
  auto [it, inserted] = checkpoints_.emplace(id, std::move(e));
  const shoal::v1::CheckpointInfo info = InfoLocked(it->second);
  SHOAL_LOG(INFO) << "checkpoint " << id << " committed: " << info.layers() << " layers, "
                  << HumanBytes(info.bytes()) << ", " << placed.size() << " new blob(s)";
  ApplyRetentionLocked(run_id);
  return info;
}

void CheckpointStore::AddRefsLocked(const shoal::v1::Manifest& m) {
  for (const auto& l : m.layers()) ++blob_refs_[l.sha256()];
}

void CheckpointStore::DropRefsLocked(const shoal::v1::Manifest& m) {
  std::set<std::string> dirs;
  for (const auto& l : m.layers()) {
    auto it = blob_refs_.find(l.sha256());
    if (it == blob_refs_.end()) continue;
    if (--it->second > 0) continue;
    blob_refs_.erase(it);
    damaged_blobs_.erase(l.sha256());
    const std::string path = BlobPath(l.sha256());
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      // Harmless: an unreferenced blob is removed on the next open.
      SHOAL_LOG(WARNING) << "cannot remove " << path << ": " << std::strerror(errno);
    }
  }
}

absl::Status CheckpointStore::DeleteLocked(const std::string& id) {
  auto it = checkpoints_.find(id);
  if (it == checkpoints_.end()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint '", id, "'"));
  }
  const std::string path = ManifestPath(id);
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus(errno, absl::StrCat("remove ", path));
  }
  if (absl::Status s = FsyncPath(options_.data_dir + "/manifests"); !s.ok()) {
    SHOAL_LOG(WARNING) << s.message();
  }
  DropRefsLocked(it->second.manifest);
  checkpoints_.erase(it);
  return absl::OkStatus();
}

void CheckpointStore::ApplyRetentionLocked(const std::string& run_id) {
  if (options_.retain == 0) return;
  std::vector<std::pair<uint64_t, std::string>> rounds;  // (round, id)
  for (const auto& [id, e] : checkpoints_) {
    if (e.manifest.run_id() == run_id) rounds.emplace_back(e.manifest.round(), id);
  }
  if (rounds.size() <= options_.retain) return;
  std::sort(rounds.rbegin(), rounds.rend());
  for (size_t i = options_.retain; i < rounds.size(); ++i) {
    if (absl::Status s = DeleteLocked(rounds[i].second); !s.ok()) {
      SHOAL_LOG(WARNING) << "retention cannot delete " << rounds[i].second << ": " << s.message();
    } else {
      SHOAL_LOG(INFO) << "checkpoint " << rounds[i].second << " deleted (retain " << options_.retain
                      << " per run)";
    }
  }
}

std::string CheckpointStore::DamageLocked(const shoal::v1::Manifest& m) const {
  std::string first;
  size_t more = 0;
  for (const auto& l : m.layers()) {
    auto it = damaged_blobs_.find(l.sha256());
    if (it == damaged_blobs_.end()) continue;
    if (first.empty()) {
      first = absl::StrCat("layer '", l.name(), "': ", it->second);
    } else {
      ++more;
    }
  }
  if (more > 0) absl::StrAppend(&first, " (and ", more, " more layer(s))");
  return first;
}

shoal::v1::CheckpointInfo CheckpointStore::InfoLocked(const Entry& e) const {
  shoal::v1::CheckpointInfo info;
  info.set_id(e.manifest.id());
  info.set_run_id(e.manifest.run_id());
  info.set_round(e.manifest.round());
  info.set_created_unix_ms(e.manifest.created_unix_ms());
  info.set_bytes(e.bytes);
  info.set_layers(static_cast<uint32_t>(e.manifest.layers_size()));
  info.set_damage(DamageLocked(e.manifest));
  return info;
}

std::vector<shoal::v1::CheckpointInfo> CheckpointStore::List(absl::string_view run_id) const {
  std::vector<shoal::v1::CheckpointInfo> out;
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [id, e] : checkpoints_) {
      if (!run_id.empty() && e.manifest.run_id() != run_id) continue;
      out.push_back(InfoLocked(e));
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    if (a.created_unix_ms() != b.created_unix_ms())
      return a.created_unix_ms() > b.created_unix_ms();
    if (a.round() != b.round()) return a.round() > b.round();
    return a.id() < b.id();
  });
  return out;
}

absl::StatusOr<shoal::v1::CheckpointInfo> CheckpointStore::Info(absl::string_view id) const {
  RETURN_IF_ERROR(ValidateCheckpointId(id));
  absl::ReaderMutexLock lock(&mu_);
  auto it = checkpoints_.find(std::string(id));
  if (it == checkpoints_.end()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint ", Quoted(id)));
  }
  return InfoLocked(it->second);
}

absl::StatusOr<shoal::v1::Manifest> CheckpointStore::GetManifest(absl::string_view id) const {
  RETURN_IF_ERROR(ValidateCheckpointId(id));
  absl::ReaderMutexLock lock(&mu_);
  auto it = checkpoints_.find(std::string(id));
  if (it == checkpoints_.end()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint ", Quoted(id)));
  }
  return it->second.manifest;
}

absl::StatusOr<std::unique_ptr<LayerReader>> CheckpointStore::ReadLayer(absl::string_view id,
                                                                        uint32_t layer,
                                                                        uint64_t offset,
                                                                        uint64_t length) {
  RETURN_IF_ERROR(ValidateCheckpointId(id));
  absl::MutexLock lock(&mu_);
  auto it = checkpoints_.find(std::string(id));
  if (it == checkpoints_.end()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint ", Quoted(id)));
  }
  const shoal::v1::Manifest& m = it->second.manifest;
  if (layer >= static_cast<uint32_t>(m.layers_size())) {
    return absl::OutOfRangeError(absl::StrCat("layer ", layer, " of checkpoint ", id, ": it has ",
                                              m.layers_size(), " layers"));
  }
  const shoal::v1::LayerEntry& l = m.layers(layer);
  const std::string what = absl::StrCat("layer ", layer, " '", l.name(), "' of ", id);
  if (offset > l.bytes()) {
    return absl::OutOfRangeError(
        absl::StrCat("offset ", offset, " is past the end of ", what, " (", l.bytes(), " bytes)"));
  }
  if (length > l.bytes() - offset) {
    return absl::OutOfRangeError(absl::StrCat("range [", offset, ", ", offset + length,
                                              ") runs past the end of ", what, " (", l.bytes(),
                                              " bytes)"));
  }
  const uint64_t end = length == 0 ? l.bytes() : offset + length;
  if (const std::string damage = DamageLocked(m); !damage.empty()) {
    return absl::DataLossError(absl::StrCat("checkpoint ", id, " is damaged: ", damage));
  }
  const std::string path = BlobPath(l.sha256());
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  std::string problem;
  struct stat st;
  if (fd < 0) {
    problem = absl::StrCat("blob ", l.sha256(), " is missing (", std::strerror(errno), ")");
  } else if (fstat(fd, &st) != 0) {
    problem = absl::StrCat("blob ", l.sha256(), ": ", std::strerror(errno));
    close(fd);
  } else if (static_cast<uint64_t>(st.st_size) != l.bytes()) {
    problem = absl::StrCat("blob ", l.sha256(), " has ", st.st_size, " bytes, the manifest says ",
                           l.bytes());
    close(fd);
  }
  if (!problem.empty()) {
    damaged_blobs_.emplace(l.sha256(), problem);
    SHOAL_LOG(ERROR) << "checkpoint " << id << " is damaged: " << problem;
    return absl::DataLossError(absl::StrCat(what, ": ", problem));
  }
  const bool whole = offset == 0 && end == l.bytes();
  return std::unique_ptr<LayerReader>(
      new LayerReader(this, fd, l.sha256(), what, offset, end, whole));
}

void CheckpointStore::MarkDamaged(const std::string& sha256, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (blob_refs_.count(sha256) == 0) return;  // deleted meanwhile
  if (damaged_blobs_.emplace(sha256, reason).second) {
    SHOAL_LOG(ERROR) << "blob " << sha256 << " is damaged: " << reason;
  }
}

absl::Status CheckpointStore::Delete(absl::string_view id) {
  RETURN_IF_ERROR(ValidateCheckpointId(id));
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(DeleteLocked(std::string(id)));
  SHOAL_LOG(INFO) << "checkpoint " << id << " deleted";
  return absl::OkStatus();
}

size_t CheckpointStore::size() const {
  absl::ReaderMutexLock lock(&mu_);
  return checkpoints_.size();
}

absl::Status UploadStream::Accept(shoal::v1::UploadChunk message) {
  if (!failed_.ok()) return failed_;
  absl::Status s;
  if (upload_ == nullptr) {
    if (!message.has_manifest()) {
      s = absl::InvalidArgumentError("the first message of an upload must carry the manifest");
    } else {
      absl::StatusOr<std::unique_ptr<PendingUpload>> upload =
          store_->BeginUpload(std::move(*message.mutable_manifest()));
      if (upload.ok()) {
        upload_ = std::move(*upload);
        id_ = upload_->manifest().id();
      } else {
        s = upload.status();
      }
    }
  } else if (!message.has_data()) {
    s = absl::InvalidArgumentError("only the first message of an upload carries a manifest");
  } else {
    const shoal::v1::LayerChunk& c = message.data();
    // The wire module's checks and codes (common/tensor_wire.h): size and
    // CRC here, range, gap and overlap in PendingUpload::Append.
    s = CheckChunkSize(c.data().size());
    if (s.ok()) {
      s = CheckChunkCrc(c.crc32c(), c.data().data(), c.data().size(),
                        absl::StrCat("the chunk of layer ", c.layer(), " at offset ", c.offset()));
    }
    if (s.ok()) s = upload_->Append(c.layer(), c.offset(), c.data());
  }
  if (!s.ok()) {
    failed_ = s;
    Abort();
  }
  return s;
}

absl::StatusOr<shoal::v1::CheckpointInfo> UploadStream::Finish() {
  if (!failed_.ok()) return failed_;
  if (upload_ == nullptr) {
    failed_ = absl::InvalidArgumentError("upload stream ended without a manifest");
    return failed_;
  }
  absl::StatusOr<shoal::v1::CheckpointInfo> info = upload_->Commit();
  upload_.reset();
  if (!info.ok()) failed_ = info.status();
  return info;
}

std::string UploadStream::id() const { return id_.empty() ? "(no manifest)" : id_; }

}  // namespace shoal::checkpoint
