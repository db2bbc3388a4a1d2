// The coordinator's one implementation of the Coordinator RPC surface
// (shoal.v1.Coordinator): decodes requests, calls the RoundEngine and pushes
// the directives it returns onto the workers' session streams. Callback API
// only; no handler ever blocks a gRPC thread (a Join's reachability probe
// runs on the TcpProber and finishes the call from its completion).
//
// One table (Methods() in coordinator_service.cc) says what serves each
// method of the proto: a unary work function (Do*), shared by the direct RPC
// and by a call relayed through a supernode; Join's asynchronous start; or a
// stream (Session, Relay). Adding an RPC is the proto, one entry and its
// work here. Nothing here checks tokens or leadership: CoordinatorEndpoint
// (coordinator_endpoint.h), the registered grpc::Service, admits each call
// once and hands it to the service of the current term.
//
// Everything is raw bytes (grpc::ByteBuffer, the same wire format): a
// directive broadcast to N workers (a RoundPlan lists all N participants) is
// serialized once and its bytes (reference-counted slices) are shared by
// every stream instead of serialized per recipient; a Relay's RelayDown
// messages carry those same bytes once per relay with the ids of its members
// they are addressed to (stream_wire.h); GetRunStatus is served from cached
// bytes until the engine's status changes.
//
// The relay (docs/SUPERNODES.md "Relay") is implemented in
// coordinator_relay.cc: a supernode's one stream carries its members'
// sessions and unary calls; a relayed call names its method and carries the
// request's bytes, and runs through the same table as the direct RPC.
//
// One instance per term of the run: a single coordinator has one; a replica
// makes a fresh one (with a fresh engine) each time it is elected, and the
// old one's sessions are closed.
#ifndef SHOAL_SERVICES_COORDINATOR_COORDINATOR_SERVICE_H_
#define SHOAL_SERVICES_COORDINATOR_COORDINATOR_SERVICE_H_

#include <google/protobuf/descriptor.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>

#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/tcp_prober.h"
#include "services/coordinator/core/round_engine.h"
#include "services/coordinator/core/versioned_cache.h"
#include "services/coordinator/record_writer.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

class SessionReactor;
class RelayReactor;

// Limits of one relay stream (docs/SUPERNODES.md "Relay").
struct RelayLimits {
  // Members whose sessions one relay carries at once; a Hello past it ends
  // that member's relayed session with RESOURCE_EXHAUSTED.
  size_t max_members = 4096;
  // Entries (sessions + calls + gone) in one RelayUp; more ends the relay
  // stream with RESOURCE_EXHAUSTED.
  size_t max_batch = 4096;
};

// How a term's run record is written (the server's --state_dir or etcd).
struct RecordSink {
  // Writes the engine's record as it stands, when it changed since the last
  // write (a failed write is logged; the next change, or the replica loop,
  // tries again). Null: nothing is persisted.
  std::function<void()> write;
  // Whether the record as it stands was written (or its write was tried).
  std::function<bool()> current;
  // The thread writes run on (record_writer.h); null: on the calling thread
  // (tests).
  RecordWriter* writer = nullptr;
};

// Thread-safe. Owns the registry of open session streams.
class CoordinatorService final {
 public:
  using MethodDescriptor = google::protobuf::MethodDescriptor;
  using BidiReactor = grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>;

  // A cached GetRunStatus answer is at most this old even when nothing but
  // heartbeats happened (they move last_seen_ms_ago and nothing else).
  static constexpr absl::Duration kStatusMaxAge = absl::Milliseconds(100);

  // OK when the table serves every method of shoal.v1.Coordinator with the
  // kind the proto declares (unary or bidirectional stream) and the
  // `relayed` option fits (coordinator_methods.h); FAILED_PRECONDITION
  // naming the method otherwise. The server checks it before it serves.
  static absl::Status CheckMethods();
  // Calls of `method` count against the caller host's join rate
  // (--max_joins_per_minute): Join.
  static bool CountsAsJoin(const MethodDescriptor& method);
  // A standby replica answers `method` from its own view of the run (a
  // RunStatus) instead of refusing it: GetRunStatus.
  static bool StandbyAnswers(const MethodDescriptor& method);

  // `record` writes the run record after every engine call that changed it,
  // before that call's directives and answer go out. `clock` ages the
  // status cache. `prober` (may be null: no probe) checks a joiner's Peer
  // address. The writer and the prober must outlive the calls this service
  // serves.
  CoordinatorService(RoundEngine* engine, const Clock* clock, RecordSink record = {},
                     TcpProber* prober = nullptr)
      : engine_(engine), clock_(clock), record_(std::move(record)), prober_(prober) {}
  ~CoordinatorService();

  // The two entry points (CoordinatorEndpoint calls them once a call is
  // admitted): a unary call of `method`, and a stream of `method`.
  // `request` and `response` live until the returned reactor finishes.
  grpc::ServerUnaryReactor* Call(const MethodDescriptor& method, grpc::CallbackServerContext* ctx,
                                 const grpc::ByteBuffer* request, grpc::ByteBuffer* response);
  BidiReactor* Open(const MethodDescriptor& method, grpc::CallbackServerContext* ctx);

  // Set before the service is reachable.
  void set_relay_limits(RelayLimits limits) { relay_limits_ = limits; }
  // The run's TorchScript file and its SHA-256 (hex), served in pieces by
  // GetModelFile (the fallback source: workers ask peers that hold it
  // first); set once, before serving.
  void SetModelFile(std::string bytes, std::string sha256) {
    model_file_ = std::move(bytes);
    model_file_sha256_ = std::move(sha256);
  }

  // Fields merged into every GetRunStatus answer (a replica's role and
  // leader, --etcd). Set before the service is reachable.
  void set_status_extra(shoal::v1::RunStatus extra) { status_extra_ = std::move(extra); }
  const shoal::v1::RunStatus& status_extra() const { return status_extra_; }
  // WorkerStatus.relayed_by of the members whose session goes through a
  // relay now (GetRunStatus and the web page's status; takes mu_; lock order
  // status_mu_, then mu_).
  void FillRelayedBy(shoal::v1::RunStatus* status) ABSL_LOCKS_EXCLUDED(mu_);

  // Pushes directives to the sessions they are addressed to, direct or
  // relayed (one RelayDown per relay, one entry per distinct message); a
  // worker with no open session misses them (it re-syncs through its unary
  // calls), except an active one whose session is not registered yet. Then
  // runs `then` (a call's answer). When the engine's record changed and is
  // not written yet, both wait for the write on the record's writer thread
  // (never on the caller's), behind what waits already: directives go out
  // in the order of the Deliver calls.
  void Deliver(const Directives& directives, std::function<void()> then = nullptr);
  // Runs the engine's lease check and closes sessions of removed workers.
  void Tick();
  // Ends every session and relay stream (server shutdown).
  void CloseAllSessions();

 private:
  friend class SessionReactor;
  friend class RelayReactor;
  // `hello`: the session's Hello (its resume counts).
  void Register(const std::string& worker_id, const shoal::v1::Hello& hello,
                SessionReactor* session);
  // True when `session` was the registered one.
  bool Unregister(const std::string& worker_id, SessionReactor* session);
  // Tick's second half: closes the sessions and relays of members that
  // left the run.
  void CloseDeparted();
  // Deliver's work once the record is written.
  void Send(const Directives& directives);
  // On the writer's thread: writes the record, then sends what waited for
  // it and runs its continuations.
  void SendWaiting();

  // ---- The method table (coordinator_service.cc).
  // What serves one method: exactly one of `unary`, `async`, `stream`.
  struct Method {
    // Work run on the calling thread, for the direct RPC and for a call
    // relayed by `member` (empty: a direct call).
    using Unary = absl::Status (*)(CoordinatorService*, const grpc::ByteBuffer& request,
                                   const std::string& member, grpc::ByteBuffer* response,
                                   Directives* out);
    // A unary call that finishes `reactor` later (direct calls only).
    using Async = void (CoordinatorService::*)(const grpc::ByteBuffer& request,
                                               grpc::ByteBuffer* response,
                                               grpc::ServerUnaryReactor* reactor);
    using Stream = BidiReactor* (CoordinatorService::*)(grpc::CallbackServerContext* ctx);

    Unary unary = nullptr;
    Async async = nullptr;
    Stream stream = nullptr;
    // Changes nothing in the engine: no run record to persist, nothing to
    // deliver.
    bool read_only = false;
    bool counts_as_join = false;   // CountsAsJoin
    bool standby_answers = false;  // StandbyAnswers
  };
  // The table by method name, and indexed by the method's index in the
  // service descriptor.
  static const std::map<std::string, Method>& MethodsByName();
  static const std::vector<Method>& Methods();
  template <auto Work>
  static absl::Status RunUnary(CoordinatorService* service, const grpc::ByteBuffer& request,
                               const std::string& member, grpc::ByteBuffer* response,
                               Directives* out);

  // The methods. A unary one's work is shared by the direct RPC and the
  // relay: checks and the engine call; the directives it makes go to `out`
  // (the caller delivers them, then answers) and `response` is filled
  // when OK.
  absl::Status DoJoinRound(const shoal::v1::JoinRoundRequest& request,
                           shoal::v1::JoinRoundResponse* response, Directives* out);
  absl::Status DoReportReady(const shoal::v1::ReportReadyRequest& request,
                             shoal::v1::ReportReadyResponse* response, Directives* out);
  absl::Status DoConnectionsReady(const shoal::v1::ConnectionsReadyRequest& request,
                                  shoal::v1::ConnectionsReadyResponse* response, Directives* out);
  absl::Status DoReportRoundDone(const shoal::v1::ReportRoundDoneRequest& request,
                                 shoal::v1::ReportRoundDoneResponse* response, Directives* out);
  absl::Status DoReportAudit(const shoal::v1::ReportAuditRequest& request,
                             shoal::v1::ReportAuditResponse* response, Directives* out);
  absl::Status DoReportCheckpoint(const shoal::v1::ReportCheckpointRequest& request,
                                  shoal::v1::ReportCheckpointResponse* response, Directives* out);
  absl::Status DoLeave(const shoal::v1::LeaveRequest& request, shoal::v1::LeaveResponse* response,
                       Directives* out);
  // The cached bytes of the status (no directives).
  absl::Status DoGetRunStatus(const shoal::v1::GetRunStatusRequest& request,
                              grpc::ByteBuffer* response, Directives* out);
  absl::Status DoGetModelFile(const shoal::v1::GetModelFileRequest& request,
                              shoal::v1::ModelFileChunk* response, Directives* out);
  // Join: probes the joiner's Peer address (when the engine asks for it)
  // without blocking, then FinishJoin finishes `reactor`.
  void StartJoin(const grpc::ByteBuffer& request, grpc::ByteBuffer* response,
                 grpc::ServerUnaryReactor* reactor);
  void FinishJoin(const shoal::v1::JoinRequest& request, const std::string& unreachable,
                  grpc::ByteBuffer* response, grpc::ServerUnaryReactor* reactor);
  BidiReactor* OpenSession(grpc::CallbackServerContext* ctx);
  // A supernode's relay stream (coordinator_relay.cc).
  BidiReactor* OpenRelay(grpc::CallbackServerContext* ctx);

  // ---- Relays (coordinator_relay.cc).
  // A relay stream whose RelayHello was read. False (and the stream closed)
  // when shutting down.
  bool AddRelay(RelayReactor* relay);
  // The relay stream ended or broke: its members' routes go; the members
  // stay in the run (their lease runs) until they re-open a session.
  void RemoveRelay(RelayReactor* relay);
  // A member's Hello through `relay` (Connect done): routes it there,
  // ending any other session of it; `first` (may be null) goes out before
  // the directives kept for it. Not OK: the member's relayed session ends
  // with that status.
  absl::Status OpenRelayed(RelayReactor* relay, const shoal::v1::Hello& hello, SharedMessage first);
  // Whether `worker_id`'s session is routed through `relay`.
  bool RoutedThrough(RelayReactor* relay, const std::string& worker_id);
  // Drops the route when it goes through `relay`; true when it did.
  bool DropRelayed(RelayReactor* relay, const std::string& worker_id);
  // One RelayUp's batch (after the hello): sessions, calls, gone; the
  // directives delivered once, then the results and ended sessions to
  // `relay`.
  void HandleRelayBatch(RelayReactor* relay, const shoal::v1::RelayUp& up);
  // A relayed call, run through the method table as the direct RPC is.
  shoal::v1::RelayedCallResult HandleRelayedCall(RelayReactor* relay,
                                                 const shoal::v1::RelayedCall& call,
                                                 Directives* out);
  // Tells `relay` that these members' relayed sessions ended.
  static void EndRelayed(RelayReactor* relay, const std::string& worker_id, grpc::StatusCode code,
                         const std::string& message);
  // Ends `worker_id`'s direct session, if it has one.
  void CloseDirectLocked(const std::string& worker_id, const grpc::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the routes of `relay` (mu_ held).
  void RemoveRelayLocked(RelayReactor* relay) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- Directives in flight on a relay (docs/SUPERNODES.md). A relayed
  // session whose Hello numbers it (Hello.session) keeps the directives
  // sent on it, the latest kMaxRelayedLog; the member's next Hello says how
  // many it took, and the rest go out again first on its new session.
  struct LoggedDirective {
    SharedMessage message;   // a Deliver's directive, or
    grpc::ByteBuffer bytes;  // one sent as bytes (kept while it had none)
    bool resend = true;      // false: the new session's open sends it afresh
  };
  struct RelayedLog {
    uint64_t session = 0;  // the member's Hello.session
    uint64_t base = 0;     // directives of the session before entries.front()
    std::deque<LoggedDirective> entries;
  };
  static constexpr size_t kMaxRelayedLog = 32;
  void LogRelayedLocked(const std::string& worker_id, LoggedDirective entry)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The member's new session's Hello: consumes the log of its last relayed
  // session and returns what that session did not deliver, in order.
  std::vector<grpc::ByteBuffer> ResumeLocked(const std::string& worker_id,
                                             const shoal::v1::Hello& hello)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  RoundEngine* const engine_;
  const Clock* const clock_;
  const RecordSink record_;
  TcpProber* const prober_;
  // Deliveries waiting for the record's write, in order; order_mu_ also
  // orders a Deliver that goes out at once after those queued before it
  // (lock order: order_mu_, then mu_).
  struct Waiting {
    Directives directives;
    std::function<void()> then;
  };
  absl::Mutex order_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::deque<Waiting> waiting_ ABSL_GUARDED_BY(order_mu_);
  shoal::v1::RunStatus status_extra_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, SessionReactor*> sessions_ ABSL_GUARDED_BY(mu_);
  // Members whose session goes through a relay (never also in sessions_),
  // and each open relay with the members routed through it.
  absl::flat_hash_map<std::string, RelayReactor*> relayed_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<RelayReactor*, absl::flat_hash_set<std::string>> relays_ ABSL_GUARDED_BY(mu_);
  RelayLimits relay_limits_;
  // Serialized directives for active workers whose session has not
  // registered yet (lock order: mu_, then the engine's).
  static constexpr size_t kMaxPending = 64;
  absl::flat_hash_map<std::string, std::deque<grpc::ByteBuffer>> pending_ ABSL_GUARDED_BY(mu_);
  // Per member: its last numbered relayed session's directives.
  absl::flat_hash_map<std::string, RelayedLog> relayed_logs_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  // The engine's departures() when Tick last matched the sessions against
  // the members (nobody to close while it has not moved).
  uint64_t departures_seen_ ABSL_GUARDED_BY(mu_) = 0;
  // The serialized RunStatus of the engine's current status_version().
  // Held while rebuilding, so that concurrent callers wait for one rebuild
  // instead of each taking the engine lock for an O(members) build.
  absl::Mutex status_mu_;
  VersionedCache<grpc::ByteBuffer> status_cache_ ABSL_GUARDED_BY(status_mu_){kStatusMaxAge};
  // Immutable once the server serves.
  std::string model_file_;
  std::string model_file_sha256_;
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_COORDINATOR_SERVICE_H_
