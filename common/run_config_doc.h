// What is generated from RunConfig's `setting` options (common/
// run_config_schema.h): the coordinator's flag definitions, compiled into
// shoal-coordinator at build time (shoal-config-gen flags), and
// docs/CONFIG.md's tables (make config-doc; a unit test fails when the file
// in the tree is stale). Pure functions; thread-safe.
#ifndef SHOAL_COMMON_RUN_CONFIG_DOC_H_
#define SHOAL_COMMON_RUN_CONFIG_DOC_H_

#include <string>

#include "absl/status/statusor.h"

namespace shoal {

// The C++ source of one ABSL_FLAG per setting with a flag (its type from
// the field and the form, its default and help from the options).
// INVALID_ARGUMENT for a default that is no value of the flag's type.
absl::StatusOr<std::string> RunConfigFlagsSource();

// `current` (docs/CONFIG.md) with its generated sections rewritten: the
// keys (one table per group) between "<!-- BEGIN GENERATED keys" and
// "<!-- END GENERATED keys -->", the validator's refusals between the same
// markers named "refusals". FAILED_PRECONDITION when a marker is missing.
absl::StatusOr<std::string> RenderConfigDoc(const std::string& current);

}  // namespace shoal

#endif  // SHOAL_COMMON_RUN_CONFIG_DOC_H_
