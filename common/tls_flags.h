// --tls_cert, --tls_key, --tls_ca and --tls_server_name, shared by every Shoal
// binary (common/tls.h says what each does).
#ifndef SHOAL_COMMON_TLS_FLAGS_H_
#define SHOAL_COMMON_TLS_FLAGS_H_

#include "absl/status/status.h"

namespace shoal {

// Loads the files the flags name and makes them the process's TLS
// configuration. Call after absl::ParseCommandLine(), before any server or
// channel starts; an error names the flag and file.
absl::Status ApplyTlsFlags();

// This file's name as its flags record it, for UseFlagsOfFileForHelp.
const char* TlsFlagsFile();

}  // namespace shoal

#endif  // SHOAL_COMMON_TLS_FLAGS_H_
