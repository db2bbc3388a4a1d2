// The build's identity: Shoal's version (CMakeLists.txt's project VERSION),
// the git commit it was built from and the build type. Printed by every
// binary's --version and exported as the `shoal_build_info` metric.
//
// The definitions are generated at configure time (common/version.cc.in):
// `make build` re-runs CMake, so the commit is the checkout's HEAD (with
// "-dirty" when the tree had changes); a tree without git history (the
// container image's build) says "unknown" unless -DSHOAL_COMMIT=... names it.
// Only the binaries' main files use this, so a new commit relinks them alone.
#ifndef SHOAL_COMMON_VERSION_H_
#define SHOAL_COMMON_VERSION_H_

#include <string>

namespace shoal {

// "0.9.0".
const char* ShoalVersion();
// A 12-digit abbreviated commit, "…-dirty", or "unknown".
const char* ShoalCommit();
// "RelWithDebInfo", "Release", ...
const char* ShoalBuildType();
// "<program> 0.9.0 (commit 1a2b3c4d5e6f, RelWithDebInfo)".
std::string VersionLine(const std::string& program);

}  // namespace shoal

#endif  // SHOAL_COMMON_VERSION_H_
