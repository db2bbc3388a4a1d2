// --tls_cert, --tls_key, --tls_ca, --tls_server_name and --token_file, shared
// by every Shoal binary (common/tls.h and common/auth.h say what each does).
#ifndef SHOAL_COMMON_TLS_FLAGS_H_
#define SHOAL_COMMON_TLS_FLAGS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shoal {

// Loads the files the flags name and makes them the process's TLS
// configuration. Call after absl::ParseCommandLine(), before any server or
// channel starts; an error names the flag and file.
absl::Status ApplyTlsFlags();

// Reads --token_file (empty when not given) and makes it the token this
// process's clients send (common/auth.h). A server passes the result to its
// TokenGate. Call after absl::ParseCommandLine(), before any channel starts;
// an error names the file.
absl::StatusOr<std::string> ApplyTokenFlag();

// This file's name as its flags record it, for UseFlagsOfFileForHelp.
const char* TlsFlagsFile();

}  // namespace shoal

#endif  // SHOAL_COMMON_TLS_FLAGS_H_
