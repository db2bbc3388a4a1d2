#include "common/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <atomic>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/grpc_util.h"
#include "common/status_util.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace shoal {
namespace {

namespace pb = etcdserverpb;

EtcdKeyValue FromPb(const mvccpb::KeyValue& kv, int64_t read_revision) {
  EtcdKeyValue out;
  out.read_revision = read_revision;
  out.key = kv.key();
  out.value = kv.value();
  out.create_revision = kv.create_revision();
  out.mod_revision = kv.mod_revision();
  out.lease = kv.lease();
  return out;
}

void ToPb(const EtcdCompare& c, pb::Compare* out) {
  out->set_key(c.key);
  out->set_result(pb::Compare::EQUAL);
  switch (c.target) {
    case EtcdCompare::Target::kCreateRevision:
      out->set_target(pb::Compare::CREATE);
      out->set_create_revision(c.revision);
      break;
    case EtcdCompare::Target::kModRevision:
      out->set_target(pb::Compare::MOD);
      out->set_mod_revision(c.revision);
      break;
    case EtcdCompare::Target::kValue:
      out->set_target(pb::Compare::VALUE);
      out->set_value(c.value);
      break;
  }
}

// Thread-safe: stubs are, and the current member is an atomic index.
class GrpcEtcdClient final : public EtcdClient {
 public:
  explicit GrpcEtcdClient(EtcdClientOptions options) : options_(std::move(options)) {
    for (const std::string& e : options_.endpoints) {
      // Plain text and no run token: etcd members are not Shoal servers;
      // the process's --tls_* configuration and token are not theirs
      // (etcd's own TLS: not supported yet, docs/REPLICAS.md).
      auto channel = MakeForeignChannel(e);
      members_.push_back(
          {pb::KV::NewStub(channel), pb::Lease::NewStub(channel), pb::Watch::NewStub(channel)});
    }
  }

  absl::StatusOr<std::optional<EtcdKeyValue>> Get(const std::string& key) override {
    return Range(key, /*serializable=*/false);
  }

  absl::StatusOr<std::optional<EtcdKeyValue>> GetLocal(const std::string& key) override {
    return Range(key, /*serializable=*/true);
  }

  absl::StatusOr<std::optional<EtcdKeyValue>> Range(const std::string& key, bool serializable) {
    pb::RangeRequest request;
    request.set_key(key);
    request.set_serializable(serializable);
    pb::RangeResponse response;
    RETURN_IF_ERROR(Call("Range", /*idempotent=*/true, [&](Member& m, grpc::ClientContext* ctx) {
      return m.kv->Range(ctx, request, &response);
    }));
    if (response.kvs_size() == 0) return std::optional<EtcdKeyValue>();
    return std::optional<EtcdKeyValue>(FromPb(response.kvs(0), response.header().revision()));
  }

  absl::StatusOr<EtcdTxnResult> Txn(const std::vector<EtcdCompare>& compares,
                                    const std::vector<EtcdPut>& puts,
                                    const std::vector<std::string>& get_on_failure) override {
    pb::TxnRequest request;
    for (const EtcdCompare& c : compares) ToPb(c, request.add_compare());
    for (const EtcdPut& p : puts) {
      pb::PutRequest* put = request.add_success()->mutable_request_put();
      put->set_key(p.key);
      put->set_value(p.value);
      put->set_lease(p.lease);
    }
    for (const std::string& k : get_on_failure) {
      request.add_failure()->mutable_request_range()->set_key(k);
    }
    pb::TxnResponse response;
    // A transaction whose deadline passed may have been applied: not retried
    // on another member (its comparisons would then fail and mislead).
    RETURN_IF_ERROR(Call("Txn", /*idempotent=*/false, [&](Member& m, grpc::ClientContext* ctx) {
      return m.kv->Txn(ctx, request, &response);
    }));
    EtcdTxnResult result;
    result.succeeded = response.succeeded();
    result.revision = response.header().revision();
    if (!result.succeeded) {
      for (const pb::ResponseOp& op : response.responses()) {
        if (!op.has_response_range()) continue;
        for (const auto& kv : op.response_range().kvs()) {
          result.current.push_back(FromPb(kv, response.header().revision()));
        }
      }
    }
    return result;
  }

  absl::StatusOr<bool> Delete(const std::string& key, std::optional<EtcdCompare> compare) override {
    pb::TxnRequest request;
    if (compare.has_value()) ToPb(*compare, request.add_compare());
    request.add_success()->mutable_request_delete_range()->set_key(key);
    pb::TxnResponse response;
    RETURN_IF_ERROR(Call("Delete", /*idempotent=*/true, [&](Member& m, grpc::ClientContext* ctx) {
      return m.kv->Txn(ctx, request, &response);
    }));
    if (!response.succeeded()) return false;
    for (const pb::ResponseOp& op : response.responses()) {
      if (op.has_response_delete_range()) return op.response_delete_range().deleted() > 0;
    }
    return false;
  }

  absl::StatusOr<bool> AwaitDelete(const std::string& key, int64_t after_revision,
                                   absl::Duration timeout) override {
    // The member the other calls use; an unreachable one is an error, and
    // the caller's next linearizable call moves to another member.
    const size_t idx = current_.load();
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(timeout));
    // etcd's "require leader": a member cut off from the others ends the
    // watch (UNAVAILABLE) instead of holding it open without events.
    ctx.AddMetadata("hasleader", "true");
    auto stream = members_[idx].watch->Watch(&ctx);
    pb::WatchRequest request;
    pb::WatchCreateRequest* create = request.mutable_create_request();
    create->set_key(key);
    create->set_start_revision(after_revision + 1);
    create->add_filters(pb::WatchCreateRequest::NOPUT);
    bool deleted = false;
    int64_t compacted = 0;
    if (stream->Write(request)) {
      pb::WatchResponse response;
      while (!deleted && compacted == 0 && stream->Read(&response)) {
        for (const mvccpb::Event& e : response.events()) {
          if (e.type() == mvccpb::Event::DELETE) deleted = true;
        }
        // Compacted past the start (or cancelled by the member): the
        // deletion may be in the history that is gone.
        if (!deleted && (response.compact_revision() != 0 || response.canceled())) {
          compacted = std::max<int64_t>(1, response.compact_revision());
        }
      }
    }
    if (deleted || compacted != 0) {
      ctx.TryCancel();  // do not wait for the server's end
      (void)stream->Finish();
      if (deleted) return true;
      return absl::FailedPreconditionError(
          absl::StrCat("etcd Watch at ", options_.endpoints[idx], ": history from revision ",
                       after_revision + 1, " is compacted (", compacted, ")"));
    }
    stream->WritesDone();
    grpc::Status s = stream->Finish();
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) return false;
    if (s.ok()) s = grpc::Status(grpc::StatusCode::UNAVAILABLE, "watch stream ended");
    return Annotate(FromGrpcStatus(s), absl::StrCat("etcd Watch at ", options_.endpoints[idx]));
  }

  absl::StatusOr<int64_t> GrantLease(absl::Duration ttl) override {
    pb::LeaseGrantRequest request;
    request.set_ttl(std::max<int64_t>(1, absl::ToInt64Seconds(ttl)));
    pb::LeaseGrantResponse response;
    RETURN_IF_ERROR(
        Call("LeaseGrant", /*idempotent=*/false, [&](Member& m, grpc::ClientContext* ctx) {
          return m.lease->LeaseGrant(ctx, request, &response);
        }));
    if (!response.error().empty()) {
      return absl::UnavailableError(absl::StrCat("etcd LeaseGrant: ", response.error()));
    }
    return response.id();
  }

  absl::StatusOr<absl::Duration> KeepAlive(int64_t lease) override {
    pb::LeaseKeepAliveResponse response;
    // LeaseKeepAlive is a stream in etcd's API; one request and one answer
    // per renewal, each stream under the call deadline.
    RETURN_IF_ERROR(
        Call("LeaseKeepAlive", /*idempotent=*/true, [&](Member& m, grpc::ClientContext* ctx) {
          auto stream = m.lease->LeaseKeepAlive(ctx);
          pb::LeaseKeepAliveRequest request;
          request.set_id(lease);
          if (!stream->Write(request) || !stream->Read(&response)) {
            stream->WritesDone();
            grpc::Status s = stream->Finish();
            if (s.ok()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream ended");
            return s;
          }
          stream->WritesDone();
          ctx->TryCancel();  // we read our answer; do not wait for the server's end
          (void)stream->Finish();
          return grpc::Status::OK;
        }));
    if (response.ttl() <= 0) {
      return absl::NotFoundError(absl::StrCat("etcd lease ", lease, " has expired"));
    }
    return absl::Seconds(response.ttl());
  }

  absl::Status RevokeLease(int64_t lease) override {
    pb::LeaseRevokeRequest request;
    request.set_id(lease);
    pb::LeaseRevokeResponse response;
    return Call("LeaseRevoke", /*idempotent=*/true, [&](Member& m, grpc::ClientContext* ctx) {
      return m.lease->LeaseRevoke(ctx, request, &response);
    });
  }

 private:
  struct Member {
    std::unique_ptr<pb::KV::Stub> kv;
    std::unique_ptr<pb::Lease::Stub> lease;
    std::unique_ptr<pb::Watch::Stub> watch;
  };

  // Tries the current member, then (idempotent calls, or any call that was
  // refused before reaching a member: UNAVAILABLE) the others once each.
  absl::Status Call(const char* what, bool idempotent,
                    const std::function<grpc::Status(Member&, grpc::ClientContext*)>& call) {
    const size_t n = members_.size();
    const size_t first = current_.load();
    absl::Status last;
    for (size_t i = 0; i < n; ++i) {
      const size_t idx = (first + i) % n;
      grpc::ClientContext ctx;
      ctx.set_deadline(DeadlineIn(options_.call_timeout));
      absl::Status s = FromGrpcStatus(call(members_[idx], &ctx));
      if (s.ok()) {
        current_.store(idx);
        return s;
      }
      last = Annotate(s, absl::StrCat("etcd ", what, " at ", options_.endpoints[idx]));
      const bool retry = absl::IsUnavailable(s) || (idempotent && absl::IsDeadlineExceeded(s));
      if (!retry) return last;
    }
    current_.store((first + 1) % n);
    return last;
  }

  const EtcdClientOptions options_;
  std::vector<Member> members_;
  std::atomic<size_t> current_{0};
};

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseEndpoints(const std::string& list,
                                                        const std::string& flag) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    const size_t colon = part.rfind(':');
    int port = 0;
    if (colon == absl::string_view::npos || colon == 0 ||
        !absl::SimpleAtoi(part.substr(colon + 1), &port) || port <= 0 || port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": '", part, "' is not host:port (port 1..65535)"));
    }
    out.emplace_back(part);
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " names no host:port"));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<EtcdClient>> MakeGrpcEtcdClient(EtcdClientOptions options) {
  if (options.endpoints.empty()) return absl::InvalidArgumentError("no etcd endpoint");
  return std::unique_ptr<EtcdClient>(new GrpcEtcdClient(std::move(options)));
}

}  // namespace shoal
