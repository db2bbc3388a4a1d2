// Zones (docs/SUPERNODES.md): where a worker sits in the network, as a
// path such as "eu/paris/rack1". Nested zones nest the hierarchy of a
// hierarchical round; the empty path is the root. Workers declare theirs
// with --zone (in Kubernetes from the node's topology labels through the
// downward API: deploy/k8s/README.md).
#ifndef SHOAL_COMMON_ZONE_H_
#define SHOAL_COMMON_ZONE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shoal {

// Longest zone path accepted, in bytes, and deepest nesting.
inline constexpr size_t kMaxZoneBytes = 128;
inline constexpr size_t kMaxZoneDepth = 8;

// Splits a zone path into its segments ("" -> {}). Segments are 1-63 of
// [a-z0-9._-] (what a Kubernetes label value or a DNS label holds, lower
// case), not "." or "..", separated by single '/'; no leading or trailing
// '/'. Anything else is INVALID_ARGUMENT naming the fault.
absl::StatusOr<std::vector<std::string>> ParseZone(absl::string_view zone);

// True when `zone` is `ancestor` or nested inside it ("" contains all).
bool ZoneContains(absl::string_view ancestor, absl::string_view zone);

// The enclosing zone ("eu/paris" -> "eu", "eu" -> "", "" -> "").
std::string ParentZone(absl::string_view zone);

}  // namespace shoal

#endif  // SHOAL_COMMON_ZONE_H_
