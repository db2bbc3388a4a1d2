// Transport security of every Shoal channel (docs/SECURITY.md): the
// certificate, key and CA a process serves and calls with.
//
// One process has one identity, so the configuration is process-wide: each
// binary's main() loads it from --tls_cert / --tls_key / --tls_ca /
// --tls_server_name (common/tls_flags.h) before it starts a server or opens a
// channel, and GrpcServer::Start and MakeChannel use it. In-process tests pass
// a TlsConfig of their own to the overloads that take one.
//
//  - No file given: plain text (the default, meant for 127.0.0.1; a server
//    listening on another address without TLS logs a warning).
//  - Servers need a certificate and its key. With a CA as well, they require
//    and verify a client certificate signed by it (mutual TLS).
//  - Clients verify the server's certificate against the CA (the system's
//    roots when none is given) and present their own certificate when they
//    have one. The name checked is the host of the address called, or
//    --tls_server_name when the certificate names a service rather than
//    every address (pod IPs in Kubernetes).
#ifndef SHOAL_COMMON_TLS_H_
#define SHOAL_COMMON_TLS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shoal {

struct TlsFiles {
  std::string cert;         // PEM certificate chain of this process
  std::string key;          // PEM private key of that certificate
  std::string ca;           // PEM CA bundle that peers' certificates must chain to
  std::string server_name;  // name to check server certificates against
};

struct TlsConfig {
  std::string cert_pem;
  std::string key_pem;
  std::string ca_pem;
  std::string server_name;

  // Any TLS at all (a client with only a CA speaks TLS too).
  bool enabled() const { return !cert_pem.empty() || !ca_pem.empty(); }
  // Servers then ask for and verify client certificates.
  bool mutual() const { return !cert_pem.empty() && !ca_pem.empty(); }
};

// Reads and checks the files: a certificate needs its key and the other way
// round, each file must hold PEM of the right kind, and the key must belong to
// the certificate. Errors name the file (INVALID_ARGUMENT, NOT_FOUND).
absl::StatusOr<TlsConfig> LoadTls(const TlsFiles& files);

// The process-wide configuration (plain text until set).
void SetProcessTls(TlsConfig config);
const TlsConfig& ProcessTls();

// Credentials for a server; FAILED_PRECONDITION when TLS is on but there is
// no certificate to serve with.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const TlsConfig& config);
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(const TlsConfig& config);

// Whether a listen host is reachable only from this machine (127.0.0.0/8,
// ::1, localhost): the one place plain text is not warned about.
bool IsLoopbackHost(const std::string& host);

}  // namespace shoal

#endif  // SHOAL_COMMON_TLS_H_
