// The supernode's side of the control-plane relay (docs/SUPERNODES.md
// "Relay"): the members of its zone open their session and make their
// round calls here, on the supernode's Peer server, instead of at the
// coordinator; this frontend carries all of them over ONE
// Coordinator.Relay stream (opened on demand with its RelayHello) and
// routes what comes down to the right member.
//
// It serves the Coordinator service itself (Session, JoinRound,
// ReportReady, ConnectionsReady, ReportRoundDone, ReportCheckpoint,
// Leave; the rest is UNIMPLEMENTED, Join stays a direct call), so a member
// reaches it with the same client it uses for the coordinator: only the
// address changes.
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
#include "common/member_credentials.h"
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
};

// Every method a callback method (the ones not overridden answer
// UNIMPLEMENTED), Session raw (directives are forwarded as the bytes that
// came down, serialized once).
namespace relay_internal {
using V1 = shoal::v1::Coordinator;
using FrontendBase = V1::WithCallbackMethod_Join<V1::WithRawCallbackMethod_Session<
    V1::WithCallbackMethod_JoinRound<V1::WithCallbackMethod_ReportReady<
        V1::WithCallbackMethod_ReportRoundDone<V1::WithCallbackMethod_ConnectionsReady<
            V1::WithCallbackMethod_ReportCheckpoint<V1::WithCallbackMethod_Leave<
                V1::WithCallbackMethod_Relay<V1::WithCallbackMethod_GetRunStatus<
                    V1::WithCallbackMethod_GetModelFile<V1::Service>>>>>>>>>>>;
}  // namespace relay_internal

class RelayFrontend final : public relay_internal::FrontendBase {
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

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Session(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* JoinRound(grpc::CallbackServerContext* ctx,
                                      const shoal::v1::JoinRoundRequest* request,
                                      shoal::v1::JoinRoundResponse* response) override;
  grpc::ServerUnaryReactor* ReportReady(grpc::CallbackServerContext* ctx,
                                        const shoal::v1::ReportReadyRequest* request,
                                        shoal::v1::ReportReadyResponse* response) override;
  grpc::ServerUnaryReactor* ConnectionsReady(
      grpc::CallbackServerContext* ctx, const shoal::v1::ConnectionsReadyRequest* request,
      shoal::v1::ConnectionsReadyResponse* response) override;
  grpc::ServerUnaryReactor* ReportRoundDone(grpc::CallbackServerContext* ctx,
                                            const shoal::v1::ReportRoundDoneRequest* request,
                                            shoal::v1::ReportRoundDoneResponse* response) override;
  grpc::ServerUnaryReactor* ReportCheckpoint(
      grpc::CallbackServerContext* ctx, const shoal::v1::ReportCheckpointRequest* request,
      shoal::v1::ReportCheckpointResponse* response) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx,
                                  const shoal::v1::LeaveRequest* request,
                                  shoal::v1::LeaveResponse* response) override;

 private:
  class MemberStream;
  class CallReactor;
  struct Uplink;
  // Copies a result's response into the call's response (false: the
  // result carries another kind).
  using Fill = std::function<bool(const shoal::v1::RelayedCallResult&)>;
  struct PendingCall {
    CallReactor* reactor = nullptr;
    Fill fill;
    absl::Time deadline;
  };

  // The run token, then (credentials on) a current member's credential for
  // `worker_id` (empty: any member; the Hello checks the id later).
  grpc::Status Allowed(const grpc::CallbackServerContext* ctx, const std::string& worker_id) const;
  // Queues `call` for `worker_id` and returns the reactor its result finishes.
  grpc::ServerUnaryReactor* Forward(grpc::CallbackServerContext* ctx, const std::string& worker_id,
                                    shoal::v1::RelayedCall call, Fill fill);
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
