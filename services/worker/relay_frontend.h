// The supernode's side of the control-plane relay (docs/SUPERNODES.md
// "Relay"): the members of its zone open their session and make their
// round calls here, on the supernode's Peer server, instead of at the
// coordinator; this frontend carries all of them over ONE
// Coordinator.Relay stream (opened on demand with its RelayHello) and
// routes what comes down to the right member.
//
// It serves the Coordinator service itself, so a member reaches it with the
// same client it uses for the coordinator: only the address changes. It is
// a forwarder that knows no round call: every unary method the proto marks
// `relayed` (coordinator.proto; JoinRound, ReportReady, ...) goes up as its
// method name and the request's bytes (RelayedCall) and its result comes
// back as the response's bytes (RelayedCallResult); Session is translated
// into the member's relayed session; anything else (Join, GetRunStatus,
// Relay) is UNIMPLEMENTED here and made directly. A new relayed RPC needs
// no change here (common/raw_service.h, common/coordinator_methods.h).
//
// Who may speak: every call passes the run token (the Peer server's gate)
// and, with member credentials on, a current member's x-shoal-member
// credential naming the worker the call or the Hello is for
// (PERMISSION_DENIED otherwise): the coordinator trusts the relay's word,
// so the relay checks.
//
// Failure: when the Relay stream breaks, every member session ends with
// UNAVAILABLE and every forwarded call still waiting fails with
// UNAVAILABLE; the members go back to the coordinator directly (it keeps
// their lease and their directives). The next session or call opens a new
// stream. A forwarded call waits at most min(its own deadline,
// call_timeout) for its result (then DEADLINE_EXCEEDED).
//
// Threads: gRPC's callback threads (member streams and calls, never
// blocked), one pump thread (batches what the members send and writes it
// to the Relay stream; expires calls) and one reader thread per Relay
// stream. Thread-safe; outlives the server it is registered on.
#ifndef SHOAL_SERVICES_WORKER_RELAY_FRONTEND_H_
#define SHOAL_SERVICES_WORKER_RELAY_FRONTEND_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/clock.h"
#include "common/member_credentials.h"
#include "common/raw_service.h"
#include "shoal/v1/coordinator.grpc.pb.h"

namespace shoal::worker {

struct RelayFrontendOptions {
  // The coordinator the Relay stream goes to (a channel that carries the
  // run token, common/grpc_util.h MakeChannel).
  std::shared_ptr<grpc::Channel> coordinator;
  // The coordinator replicas (--coordinator's addresses, in order, each
  // with its channel), when there are several: the Relay stream follows
  // the leader. A standby's refusal names it (trailing metadata
  // shoal-leader); a stream that breaks UNAVAILABLE without a name moves
  // to the next address. Empty: `coordinator` only.
  std::vector<std::pair<std::string, std::shared_ptr<grpc::Channel>>> replicas;
  // Who may call (--token_file); open by default.
  TokenGate gate;
  // Member credentials (the worker's MemberSet); null or not enabled: the
  // token is enough. Outlives the frontend.
  const MemberSet* members = nullptr;
  // Longest wait of a forwarded call for its result.
  absl::Duration call_timeout = absl::Seconds(10);
  // Entries (sessions + calls + gone) per RelayUp: the coordinator's
  // --relay_max_batch default.
  size_t max_batch = 4096;
  // Reads the forwarded calls' deadlines.
  const Clock* clock = RealClock::Get();
};

// Every method raw (bytes in and out): calls are forwarded as the bytes the
// member sent, directives as the bytes that came down, serialized once.
class RelayFrontend final : public RawCallbackService<shoal::v1::Coordinator> {
 public:
  explicit RelayFrontend(RelayFrontendOptions options);
  ~RelayFrontend() override;

  // This worker's id (from Join): the RelayHello's. Until it is set every
  // member call is UNAVAILABLE.
  void SetRelayId(const std::string& worker_id);
  // Ends every member session and call with UNAVAILABLE, closes the Relay
  // stream and joins the threads. Later calls get UNAVAILABLE. Idempotent.
  void Shutdown();

  // Members whose session is open here now (status, tests).
  size_t members() const;
  // Relay streams opened so far (tests).
  uint64_t streams_opened() const { return streams_opened_.load(); }

 private:
  class MemberStream;
  class CallReactor;
  struct Uplink;
  struct PendingCall {
    CallReactor* reactor = nullptr;
    // The call's response, filled with the result's bytes.
    grpc::ByteBuffer* response = nullptr;
    absl::Time deadline;
  };

  // A relayed method's call goes up; any other is UNIMPLEMENTED.
  grpc::ServerUnaryReactor* Unary(const MethodDescriptor& method, grpc::CallbackServerContext* ctx,
                                  const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;
  // Session opens a member's relayed session; any other is UNIMPLEMENTED.
  BidiReactor* Stream(const MethodDescriptor& method, grpc::CallbackServerContext* ctx) override;

  // The run token, then (credentials on) a current member's credential for
  // `worker_id` (empty: any member; the Hello checks the id later).
  grpc::Status Allowed(const grpc::CallbackServerContext* ctx, const std::string& worker_id) const;
  // Queues `method`'s call (the member's request bytes) and returns the
  // reactor its result finishes.
  grpc::ServerUnaryReactor* Forward(const MethodDescriptor& method,
                                    grpc::CallbackServerContext* ctx,
                                    const grpc::ByteBuffer& request, grpc::ByteBuffer* response);
  void CancelCall(uint64_t call_id);

  // From member streams.
  // `hello` goes up as the member sent it (its session number and resume
  // counts are the coordinator's to read).
  grpc::Status OpenMember(MemberStream* stream, const shoal::v1::Hello& hello);
  void FromMember(MemberStream* stream, shoal::v1::WorkerMessage message);
  void MemberBroken(MemberStream* stream, const std::string& reason);
  void MemberDone(MemberStream* stream);

  // The pump thread: batches, writes, expires, opens streams on demand.
  void Pump();
  // The reader thread of `uplink`.
  void ReadUplink(Uplink* uplink);
  // Marks a write as in flight, unless the reader already saw the end.
  static bool StartWrite(Uplink* uplink);
  void Route(const shoal::v1::RelayDown& down);
  void UplinkBroken(Uplink* uplink, const grpc::Status& status);
  // Moves at most max_batch entries of outbox_ into `batch`.
  void TakeBatchLocked(shoal::v1::RelayUp* batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool OutboxEmptyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct Target {
    std::string address;  // empty: the one `coordinator` channel
    std::unique_ptr<shoal::v1::Coordinator::Stub> stub;
  };
  static std::vector<Target> Targets(const RelayFrontendOptions& options);

  const RelayFrontendOptions options_;
  const std::vector<Target> targets_;
  std::atomic<uint64_t> streams_opened_{0};

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::string relay_id_ ABSL_GUARDED_BY(mu_);
  // What the members sent and the pump has not written yet.
  shoal::v1::RelayUp outbox_ ABSL_GUARDED_BY(mu_);
  // The current Relay stream (null: none; the pump opens one when the
  // outbox has something), and broken ones whose reader the pump joins.
  std::shared_ptr<Uplink> uplink_ ABSL_GUARDED_BY(mu_);
  // The target the next Relay stream opens to (an index into targets_).
  size_t current_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::shared_ptr<Uplink>> retired_ ABSL_GUARDED_BY(mu_);
  // Open member sessions by worker id. A stream is in the map until it
  // ends; its Enqueue/Close run under mu_ (gRPC runs OnDone, which takes
  // mu_, on its executor thread, never inline).
  absl::flat_hash_map<std::string, MemberStream*> sessions_ ABSL_GUARDED_BY(mu_);
  // Forwarded calls waiting for their result. Whoever erases an entry
  // finishes its reactor (exactly once).
  absl::flat_hash_map<uint64_t, PendingCall> calls_ ABSL_GUARDED_BY(mu_);
  uint64_t next_call_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread pump_;
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_RELAY_FRONTEND_H_
