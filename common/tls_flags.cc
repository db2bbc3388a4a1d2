#include "common/tls_flags.h"

#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "common/auth.h"
#include "common/tls.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate this process serves and calls with; with --tls_key. Empty = plain "
          "text (for 127.0.0.1 only; see docs/SECURITY.md).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle: servers and peers must present a certificate signed by it, and "
          "servers then require one from every client (mutual TLS).");
ABSL_FLAG(std::string, tls_server_name, "",
          "Name to check server certificates against instead of the host called (when one "
          "certificate names a service, e.g. pods reached by IP).");

ABSL_FLAG(std::string, token_file, "",
          "File holding this run's secret token (one line, at least 16 printable characters, "
          "e.g. from `openssl rand -hex 32`). Servers then refuse calls without it "
          "(UNAUTHENTICATED) and clients send it with every call. Empty = no token "
          "(docs/SECURITY.md).");

namespace shoal {

absl::Status ApplyTlsFlags() {
  TlsFiles files;
  files.cert = absl::GetFlag(FLAGS_tls_cert);
  files.key = absl::GetFlag(FLAGS_tls_key);
  files.ca = absl::GetFlag(FLAGS_tls_ca);
  files.server_name = absl::GetFlag(FLAGS_tls_server_name);
  auto config = LoadTls(files);
  if (!config.ok()) return config.status();
  SetProcessTls(*std::move(config));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ApplyTokenFlag() {
  const std::string path = absl::GetFlag(FLAGS_token_file);
  if (path.empty()) return std::string();
  absl::StatusOr<std::string> token = ReadTokenFile(path);
  if (!token.ok()) return token.status();
  SetProcessToken(*token);
  return token;
}

const char* TlsFlagsFile() { return __FILE__; }

}  // namespace shoal
