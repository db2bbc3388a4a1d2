#include "common/grpc_util.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/support/client_interceptor.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/logging.h"
#include "common/reactor_handoff.h"
#include "grpc/health/v1/health.pb.h"

namespace shoal {
namespace {

// Adds `authorization: Bearer <token>` to the initial metadata of every call
// (common/auth.h). An interceptor rather than call credentials: gRPC sends
// call credentials only over TLS, and a token also guards plain-text runs.
class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kAuthMetadataKey, *header_);
    }
    methods->Proceed();
  }

 private:
  const std::string* const header_;
};

class TokenInterceptorFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(const std::string& token)
      : header_(absl::StrCat(kBearerPrefix, token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override {
    return new TokenInterceptor(&header_);
  }

 private:
  const std::string header_;
};

// Why gRPC could not listen on `listen`: gRPC says only that it could not
// (and prints its own internal error), so bind the address once more, here,
// and name the errno with what to do about it.
std::string WhyCannotListen(const std::string& listen) {
  std::string host = HostOf(listen);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string port = listen.substr(listen.rfind(':') + 1);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    return absl::StrCat("the host '", host, "' does not resolve: ", gai_strerror(rc));
  }
  std::string why = "gRPC refused it; binding it here worked (the address may be taken meanwhile)";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    const int rc = bind(fd, a->ai_addr, a->ai_addrlen);
    const int err = errno;
    close(fd);
    if (rc == 0) continue;
    why = absl::StrCat(std::strerror(err), " (errno ", err, ")");
    if (err == EADDRINUSE) {
      absl::StrAppend(&why, ": another process listens on port ", port,
                      "; stop it or pick another port (0 lets the system pick one)");
    } else if (err == EADDRNOTAVAIL) {
      absl::StrAppend(&why, ": ", host, " is not an address of this machine");
    } else if (err == EACCES) {
      absl::StrAppend(&why, ": ports below 1024 need root or CAP_NET_BIND_SERVICE");
    }
    break;
  }
  freeaddrinfo(found);
  return why;
}

// A call of a method this server does not serve ends UNIMPLEMENTED with a
// message that says what answered and what to check, instead of gRPC's empty
// one (a client pointed at the wrong port: --coordinator at the store, a
// grpcurl at a worker).
class UnknownMethods final : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    const std::string& method = ctx->method();
    const size_t slash = method.rfind('/');
    const std::string service =
        slash == std::string::npos || slash == 0 ? method : method.substr(1, slash - 1);
    return new FinishedGenericStream(grpc::Status(
        grpc::StatusCode::UNIMPLEMENTED,
        absl::StrCat("this server (shoal ", LogTag(), ") does not serve ", service, " (method ",
                     method,
                     "): check the address the client was given (--coordinator is the "
                     "coordinator's, --store the checkpoint store's; `grpcurl -plaintext ADDRESS "
                     "list` names what an address serves)")));
  }

 private:
  class FinishedGenericStream final : public grpc::ServerGenericBidiReactor {
   public:
    explicit FinishedGenericStream(grpc::Status status) {
      ReactionScope reaction(this);
      Finish(std::move(status));
    }
    void OnDone() override {
      AfterAllReactions(this);
      delete this;
    }
  };
};

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(
    const std::string& listen, const std::vector<grpc::Service*>& services) {
  return Start(listen, services, ProcessTls());
}

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(
    const std::string& listen, const std::vector<grpc::Service*>& services, const TlsConfig& tls) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  // gRPC's health service is not built from a linked .proto, so reflection
  // would list grpc.health.v1.Health without being able to describe it
  // (grpcurl: "target server does not expose service"). Using the generated
  // descriptor links health.pb.cc and registers it in the generated pool,
  // where reflection looks.
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address '", listen, "' is not host:port with a port in 0..65535"));
  }
  auto credentials = ServerCredentialsFor(tls);
  if (!credentials.ok()) return credentials.status();
  if (!tls.enabled() && !IsLoopbackHost(HostOf(listen))) {
    SHOAL_LOG(WARNING) << "serving plain text on " << listen
                       << ": anyone who can reach this address can read and send everything; "
                          "give --tls_cert, --tls_key and --tls_ca (docs/SECURITY.md)";
  }
  std::unique_ptr<GrpcServer> server(new GrpcServer());
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  // Never reuse a port another process holds (tests bind port 0).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(listen, *credentials, &server->port_);
  for (grpc::Service* s : services) builder.RegisterService(s);
  server->unknown_methods_ = std::make_unique<UnknownMethods>();
  builder.RegisterCallbackGenericService(server->unknown_methods_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen, ": ", WhyCannotListen(listen)));
  }
  server->address_ = absl::StrCat(HostOf(listen), ":", server->port_);
  return server;
}

void GrpcServer::SetServing(const std::string& service, bool serving) {
  if (shut_down_ || server_ == nullptr) return;
  if (auto* health = server_->GetHealthCheckService()) health->SetServingStatus(service, serving);
}

GrpcServer::~GrpcServer() { Shutdown(absl::ZeroDuration()); }

void GrpcServer::Shutdown(absl::Duration grace) {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  if (auto* health = server_->GetHealthCheckService()) health->Shutdown();
  server_->Shutdown(DeadlineIn(grace));
  server_->Wait();
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) {
  return MakeChannel(address, ProcessTls());
}

namespace {

grpc::ChannelArguments ChannelArgs(const TlsConfig& tls) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // Reconnect quickly after a peer or the coordinator comes back.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  if (!tls.server_name.empty()) args.SetSslTargetNameOverride(tls.server_name);
  return args;
}

}  // namespace

std::shared_ptr<grpc::Channel> MakeForeignChannel(const std::string& address) {
  const TlsConfig plain;
  return grpc::CreateCustomChannel(address, ChannelCredentialsFor(plain), ChannelArgs(plain));
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const TlsConfig& tls) {
  grpc::ChannelArguments args = ChannelArgs(tls);
  const std::string& token = ProcessToken();
  if (token.empty()) return grpc::CreateCustomChannel(address, ChannelCredentialsFor(tls), args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<TokenInterceptorFactory>(token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      address, ChannelCredentialsFor(tls), args, std::move(interceptors));
}

std::chrono::system_clock::time_point DeadlineIn(absl::Duration timeout) {
  return std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout);
}

std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return address;
  return address.substr(0, colon);
}

std::string CallerHost(const std::string& peer) {
  for (const char* scheme : {"ipv4:", "ipv6:"}) {
    if (peer.rfind(scheme, 0) == 0) return HostOf(peer.substr(5));
  }
  return peer;
}

}  // namespace shoal
