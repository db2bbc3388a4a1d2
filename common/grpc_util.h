// Server start-up and client channels, configured once for every Shoal
// binary: health service (described to reflection too), reflection, message
// size limits, port 0 binding.
#ifndef SHOAL_COMMON_GRPC_UTIL_H_
#define SHOAL_COMMON_GRPC_UTIL_H_

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls.h"

namespace shoal {

// Largest message any Shoal server or client accepts; bigger ones get
// RESOURCE_EXHAUSTED.
inline constexpr int kMaxMessageBytes = 8 << 20;

class GrpcServer {
 public:
  // Binds `listen` ("host:port", port 0 = any free port), registers the
  // services plus gRPC health and reflection, and starts serving, with the
  // process's TLS configuration (common/tls.h) or the given one.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(
      const std::string& listen, const std::vector<grpc::Service*>& services);
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(
      const std::string& listen, const std::vector<grpc::Service*>& services, const TlsConfig& tls);

  ~GrpcServer();

  int port() const { return port_; }
  // "host:port" with the port actually bound.
  const std::string& address() const { return address_; }

  // Health of one named service (grpc.health.v1 Check with that name), e.g.
  // a coordinator replica reports "shoal.v1.Coordinator" SERVING only while
  // it leads. Unknown names answer NOT_FOUND until set once.
  void SetServing(const std::string& service, bool serving);

  // Marks every service NOT_SERVING, then stops, cancelling calls still
  // running after `grace`.
  void Shutdown(absl::Duration grace);

 private:
  GrpcServer() = default;
  // Answers methods of services this server does not have (declared before
  // server_: it outlives it).
  std::unique_ptr<grpc::CallbackGenericService> unknown_methods_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
  bool shut_down_ = false;
};

// Channel to a Shoal server with Shoal's message limits, with the process's
// TLS configuration (common/tls.h) or the given one.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const TlsConfig& tls);

// Channel to a server that is not Shoal's (etcd): plain text and without the
// run token. The token is the run's secret, and etcd reads `authorization`
// as its own auth token: it refused every call of a coordinator started
// with --token_file ("etcdserver: invalid auth token"), so no replica led.
std::shared_ptr<grpc::Channel> MakeForeignChannel(const std::string& address);

// Deadline `timeout` from now, for a ClientContext.
std::chrono::system_clock::time_point DeadlineIn(absl::Duration timeout);

// Host part of "host:port" (brackets kept for IPv6).
std::string HostOf(const std::string& address);

// The caller's host from a server context's peer() ("ipv4:10.0.0.7:5123" ->
// "10.0.0.7", "ipv6:[::1]:5123" -> "[::1]"; anything else whole), the key of
// per-address limits.
std::string CallerHost(const std::string& peer);

}  // namespace shoal

#endif  // SHOAL_COMMON_GRPC_UTIL_H_
