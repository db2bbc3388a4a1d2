// The worker's model memory as its peers see it: a thin thread-safe
// composition of
//  - the serving rule (core/serving_rule.h): which reads may be served in
//    the current state of the round, a pure function of a ServingState that
//    ModelState keeps under its lock;
//  - the lending ledger (core/lending_ledger.h): windows and lent-chunk
//    counts of the memory the zero-copy Peer.ReadSlice lends to gRPC;
//  - the CRC cache (CellCrcCache, common/tensor_wire.h): the CRC-32C of each
//    1 MiB cell of the parameters, computed once per window;
//  - the manifest cache (core/manifest_cache.h): the snapshot described
//    layer by layer (GetManifest);
//  - the observers: the peer service's reads that wait for a change.
//
// Lending model memory (the zero-copy Peer.ReadSlice). The peer service
// does not copy the bytes it sends: each chunk is a gRPC slice pointing
// into the parameters or the snapshot, and gRPC reads those bytes when it
// writes them to the socket, possibly well after the write was started. So
// ModelState hands out memory in windows and keeps count of what is lent:
//  - A read is granted (CheckRead) within a window of its buffer: for the
//    parameters, an epoch that ends whenever they may be rewritten outside
//    the exchange protocol (BeginTraining, Unready, Abort, a new plan
//    attempt, Bind); for the snapshot, its generation (BindSnapshot,
//    BeginSnapshotUpdate, SetSnapshot). Each chunk is lent (LendChunk) only
//    while the read's window is still open, and is returned (ReturnChunk)
//    when gRPC drops its last reference to the slice.
//  - INVARIANT: memory inside an open window is not written except as the
//    exchange protocol allows (a worker only rewrites a slice after every
//    reader of it has received it: see services/worker/exchanger.h), and
//    once a window is closed the owner waits for AwaitReturned before
//    rewriting that buffer, and keeps the buffer allocated until then.
//    Streams of a closed window end ABORTED at their next chunk; a stream
//    whose chunk stays unsent (a reader that stopped reading) is cancelled
//    by AwaitReturned so that the wait stays short.
//  - While a window is open the bytes of whole 1 MiB cells of the parameters
//    do not change, so their CRC-32C is computed once (SetReady for the
//    contribution, MarkAveraged for the owned slice) and served with every
//    chunk that covers exactly one cell.
//
// Thread-safe: the worker's main thread updates it, gRPC threads read it.
// Lock order: mu_, then the ledger's; observers are called without either.
#ifndef SHOAL_SERVICES_WORKER_CORE_MODEL_STATE_H_
#define SHOAL_SERVICES_WORKER_CORE_MODEL_STATE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/tensor_wire.h"
#include "services/worker/core/lending_ledger.h"
#include "services/worker/core/manifest_cache.h"
#include "services/worker/core/serving_rule.h"
#include "shoal/v1/peer.pb.h"

namespace shoal::worker {

class ModelState {
 public:
  ModelState() = default;
  ModelState(const float* params, uint64_t total_elements, std::string model) {
    Bind(params, total_elements, std::move(model));
  }
  // Waits (up to 10 s) until every lent chunk is returned: gRPC may still
  // hold slices of a server that was just shut down, and their release
  // calls back into this object. Aborts the process if they are not: freeing
  // memory gRPC may still read would be worse.
  ~ModelState();
  ModelState(const ModelState&) = delete;
  ModelState& operator=(const ModelState&) = delete;

  // Attaches the model memory (once, before the worker joins a round). Until
  // then every read gets UNAVAILABLE.
  void Bind(const float* params, uint64_t total_elements, std::string model);

  // The layer table of the flat vector (names, offsets, sizes in parameter
  // order), given once after Bind. Until then (or when it is rejected:
  // INVALID_ARGUMENT, not contiguous or not covering the model) the
  // manifest describes the whole vector as one layer named "all".
  absl::Status SetLayers(std::vector<LayerSpan> layers);
  std::vector<LayerSpan> layers() const;
  // Piece size of the manifest's piece digests (tests use small ones).
  void SetDigestPieceElements(uint64_t elements);

  // Describes the snapshot of `round` (see the class comment). `done` runs
  // exactly once, on this thread or on the thread computing the digests.
  // FAILED_PRECONDITION: the snapshot holds another round. UNAVAILABLE: no
  // snapshot, being replaced, or shutting down. ABORTED: the snapshot
  // changed while it was being hashed.
  using ManifestCallback = worker::ManifestCallback;
  void GetManifest(uint64_t round, ManifestCallback done) const;

  void SetWorkerId(const std::string& id);
  // The worker starts local training of `round`: nothing of it is served
  // yet. Closes the parameters' window (see the class comment): call
  // AwaitReturned(kParameters) before training writes them.
  void BeginTraining(uint64_t round);
  // How many times BeginTraining was called: a new count means the
  // parameters hold a new trained model (not the last exchange's leftovers).
  uint64_t trainings() const;
  // Local training of `round` is done: its contribution may be read.
  // Computes the CRC-32C of every 1 MiB cell of the parameters (on this
  // thread, outside the lock) unless they are already known in this window.
  void SetReady(uint64_t round);
  // A plan (attempt) of the round arrived: the worker owns [begin, end).
  // Reads of other attempts are refused from now on (and a new attempt
  // closes the parameters' window).
  void SetPlan(uint64_t round, uint32_t attempt, uint64_t begin, uint64_t end);
  // Contribution reads are refused until SetReady (the worker is restoring
  // its trained model for a new attempt). Closes the parameters' window.
  void Unready();
  // The owned slice now holds the average (its cells' CRCs are computed
  // here, on the caller's thread). Wakes the AVERAGED reads waiting for it.
  void MarkAveraged(uint64_t round);
  // [own begin, until) of the owned slice holds the average (the reduce
  // completes it cell by cell): it may be served, and the rest waits. Calls
  // may come in any order (the largest counts); `until` past the slice is
  // MarkAveraged.
  void MarkAveragedUntil(uint64_t round, uint64_t until);
  // How far an AVERAGED read of (round, attempt) may be served right now:
  // the end of the owned slice once it is averaged, the averaged prefix
  // before, 0 for another round or attempt.
  uint64_t AveragedLimit(uint64_t round, uint32_t attempt) const;
  // The round was aborted; nothing of it is served any more. Closes the
  // parameters' window.
  void Abort(uint64_t round);
  // The worker holds the averaged model of `round` with this hash.
  void SetModel(uint64_t round, const std::string& hash);
  void SetShuttingDown();

  // The snapshot buffer (the averaged model kept for workers catching up).
  void BindSnapshot(const float* snapshot);
  // Call before overwriting the snapshot buffer (then AwaitReturned
  // (kSnapshot)); reads in flight end ABORTED.
  void BeginSnapshotUpdate();
  // The snapshot buffer now holds the averaged model of `round`.
  void SetSnapshot(uint64_t round);
  // Changes whenever the snapshot is being or was replaced.
  uint64_t snapshot_generation() const { return ledger_.window(Buffer::kSnapshot); }
  const float* snapshot() const { return snapshot_.load(); }

  // Which memory a read is served from.
  using Buffer = ModelBuffer;
  // What CheckRead granted: the buffer and the window (epoch or snapshot
  // generation) the read may be served in.
  struct ReadGrant {
    Buffer buffer = Buffer::kParameters;
    uint64_t epoch = 0;
  };

  // OK when `request` may be served now from parameters(). UNAVAILABLE when it
  // may be served later (slice not averaged yet, or shutting down); every
  // other code is final: INVALID_ARGUMENT (empty range, no kind),
  // OUT_OF_RANGE (past the end), FAILED_PRECONDITION (stale or future round,
  // not trained yet, a slice the worker does not own).
  // For SNAPSHOT, `generation` gets the snapshot generation to re-check
  // while streaming.
  absl::Status CheckRead(const shoal::v1::ReadSliceRequest& request,
                         uint64_t* generation = nullptr) const;
  // The same, filling `grant` when OK. `may_wait` (may be null) is set when
  // the refusal is an AVERAGED read that a change of this state can turn
  // into OK (no plan yet, not averaged yet): the peer service parks those
  // reads until the next change (AddObserver) instead of refusing them.
  absl::Status CheckRead(const shoal::v1::ReadSliceRequest& request, ReadGrant* grant,
                         bool* may_wait) const;

  // One chunk lent to gRPC: `data` points at element `begin` of the granted
  // buffer and stays valid and unmodified until ReturnChunk (see the class
  // comment). `crc` is the chunk's precomputed CRC-32C when `has_crc`.
  struct LentChunk {
    const float* data = nullptr;
    bool has_crc = false;
    uint32_t crc = 0;
  };
  // ABORTED when the grant's window has closed since (the read must start
  // over); UNAVAILABLE when shutting down.
  absl::StatusOr<LentChunk> LendChunk(const ReadGrant& grant, uint64_t begin, uint64_t count) const;
  // gRPC is done with one chunk lent from `buffer` (it may run on any thread,
  // inside gRPC: it only takes this object's lock).
  void ReturnChunk(Buffer buffer) const;
  // Waits until no chunk of `buffer` is lent, at most `timeout`. After a
  // short grace it asks the streams still holding chunks of a closed window
  // to cancel themselves (Observer::OnServingChange(true)). False on
  // timeout.
  bool AwaitReturned(Buffer buffer, absl::Duration timeout) const;
  int chunks_lent(Buffer buffer) const;
  // True while the grant's window is open.
  bool IsCurrent(const ReadGrant& grant) const;
  // A grant of the parameters as they are now, for a reader inside this
  // process: the steps trained ahead of their round (local_training.h)
  // take the round's average from them chunk by chunk (LendChunk /
  // ReturnChunk), and a rewrite of the parameters (which closes their
  // window first) waits for the chunk in hand.
  ReadGrant GrantParameters() const;

  // The peer service's reads that want to hear about changes: AVERAGED
  // reads parked until their slice is averaged, and streams that must stop
  // when their window closes. Reference-counted by the caller, so that a
  // notification never races with the observer's destruction.
  class Observer {
   public:
    // Runs after every change of what may be served, on the thread that
    // made it, outside this object's locks (it may call CheckRead,
    // LendChunk...). `revoke`: AwaitReturned asks streams of closed
    // windows to cancel themselves.
    virtual void OnServingChange(bool revoke) = 0;
    virtual void AddRef() = 0;
    virtual void Release() = 0;

   protected:
    ~Observer() = default;
  };
  // Takes a reference until RemoveObserver (which may be called again).
  void AddObserver(Observer* observer) const;
  void RemoveObserver(Observer* observer) const;
  // Reads registered right now (parked or streaming); for tests.
  size_t observer_count() const;

  shoal::v1::PeerInfo Info() const;
  const float* parameters() const { return params_.load(); }
  uint64_t total_elements() const { return total_.load(); }

  // Chunks of the zero-copy stream are cut on the wire module's grid (1 MiB
  // cells of the flat vector), so that a chunk is a whole cell whenever it
  // can be.
  static constexpr uint64_t kCellElements = shoal::kCellElements;

 private:
  std::atomic<const float*> params_{nullptr};
  std::atomic<uint64_t> total_{0};
  std::atomic<const float*> snapshot_{nullptr};

  mutable absl::Mutex mu_;
  std::string model_ ABSL_GUARDED_BY(mu_);
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  // What the serving rule decides on.
  ServingState serving_ ABSL_GUARDED_BY(mu_);
  uint64_t model_round_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t trainings_ ABSL_GUARDED_BY(mu_) = 0;
  std::string model_hash_ ABSL_GUARDED_BY(mu_);
  // CRC-32C of the parameters' cells, valid for one parameters window.
  CellCrcCache cell_crcs_ ABSL_GUARDED_BY(mu_);
  mutable ManifestCache manifests_ ABSL_GUARDED_BY(mu_);
  // Windows and lent chunks (its own lock, taken after mu_).
  mutable LendingLedger ledger_;

  // Closes the parameters' window (a new epoch).
  void CloseParametersWindow() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells every observer; call without mu_ held.
  void Notify(bool revoke) const ABSL_LOCKS_EXCLUDED(mu_);

  // Separate from mu_: observers are called without mu_ (they take it).
  mutable absl::Mutex observers_mu_;
  mutable std::vector<Observer*> observers_ ABSL_GUARDED_BY(observers_mu_);
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_MODEL_STATE_H_
