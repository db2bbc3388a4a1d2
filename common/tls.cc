#include "common/tls.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace shoal {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(what, " file '", path, "' cannot be read"));
  std::ostringstream content;
  content << in.rdbuf();
  std::string pem = content.str();
  if (!absl::StrContains(pem, "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat(what, " file '", path, "' holds no PEM block"));
  }
  return pem;
}

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

std::unique_ptr<BIO, BioDeleter> MemoryBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioDeleter>(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The first certificate of a PEM bundle, or null.
std::unique_ptr<X509, X509Deleter> FirstCertificate(const std::string& pem) {
  auto bio = MemoryBio(pem);
  return std::unique_ptr<X509, X509Deleter>(
      PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

absl::Status CheckPair(const TlsFiles& files, const TlsConfig& config) {
  auto cert = FirstCertificate(config.cert_pem);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_cert file '", files.cert, "' holds no PEM certificate"));
  }
  auto bio = MemoryBio(config.key_pem);
  std::unique_ptr<EVP_PKEY, KeyDeleter> key(
      PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_key file '", files.key, "' holds no PEM private key (or it is encrypted)"));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("--tls_key file '", files.key,
                                                   "' is not the key of the certificate in '",
                                                   files.cert, "'"));
  }
  return absl::OkStatus();
}

absl::Mutex process_mu;
TlsConfig* process_config ABSL_GUARDED_BY(process_mu) = nullptr;

}  // namespace

absl::StatusOr<TlsConfig> LoadTls(const TlsFiles& files) {
  TlsConfig config;
  config.server_name = files.server_name;
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together: give both files or neither");
  }
  if (!files.cert.empty()) {
    auto cert = ReadPem(files.cert, "--tls_cert");
    if (!cert.ok()) return cert.status();
    auto key = ReadPem(files.key, "--tls_key");
    if (!key.ok()) return key.status();
    config.cert_pem = *std::move(cert);
    config.key_pem = *std::move(key);
    if (absl::Status s = CheckPair(files, config); !s.ok()) return s;
  }
  if (!files.ca.empty()) {
    auto ca = ReadPem(files.ca, "--tls_ca");
    if (!ca.ok()) return ca.status();
    if (FirstCertificate(*ca) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tls_ca file '", files.ca, "' holds no PEM certificate"));
    }
    config.ca_pem = *std::move(ca);
  }
  if (!config.enabled() && !config.server_name.empty()) {
    return absl::InvalidArgumentError(
        "--tls_server_name needs TLS: give --tls_ca (and --tls_cert/--tls_key for servers)");
  }
  return config;
}

void SetProcessTls(TlsConfig config) {
  absl::MutexLock lock(&process_mu);
  // Kept for the life of the process: ProcessTls() hands out references.
  process_config = new TlsConfig(std::move(config));
}

const TlsConfig& ProcessTls() {
  static const TlsConfig plain;
  absl::MutexLock lock(&process_mu);
  return process_config == nullptr ? plain : *process_config;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const TlsConfig& config) {
  if (!config.enabled()) return grpc::InsecureServerCredentials();
  if (config.cert_pem.empty()) {
    return absl::FailedPreconditionError(
        "TLS is on (--tls_ca) but this server has no certificate: give --tls_cert and --tls_key");
  }
  grpc::SslServerCredentialsOptions options(
      config.mutual() ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                      : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_root_certs = config.ca_pem;
  options.pem_key_cert_pairs.push_back({config.key_pem, config.cert_pem});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(const TlsConfig& config) {
  if (!config.enabled()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = config.ca_pem;  // empty = the system's roots
  options.pem_private_key = config.key_pem;
  options.pem_cert_chain = config.cert_pem;
  return grpc::SslCredentials(options);
}

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "[::1]" || host == "::1" || absl::StartsWith(host, "127.");
}

}  // namespace shoal
