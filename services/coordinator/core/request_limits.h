// What a client may send the coordinator as text, in one table: every
// string field of every message a worker, a relay or anyone else sends
// (the requests of shoal.v1.Coordinator's methods, the Session's
// WorkerMessage, the Relay's RelayUp) and of the run record read back at a
// restart has a kind and a maximum length (docs/SECURITY.md "Limits"). A
// message over them is refused with INVALID_ARGUMENT naming the field, what
// it holds and the limit, before any part of the engine sees it: an open run
// accepts joins from anyone, and every member's name, zone and reasons are
// shown to every operator (status, web page, logs).
//
// The service checks each request once, where it is parsed (the method
// table's unary work functions, shared by direct and relayed calls; Join;
// each session message; each relay entry); the servers check the run record
// before they resume from it. Pure functions over protobuf reflection; the
// table is built once and is immutable, so calls are thread-safe.
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_REQUEST_LIMITS_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_REQUEST_LIMITS_H_

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

// What a string field may hold.
enum class TextKind {
  // Printable UTF-8 (common/printable.h: no control, separator or
  // bidirectional character): names, reasons, error texts.
  kText,
  // Printable ASCII without spaces (0x21-0x7e): ids, addresses, method
  // names, dtypes.
  kToken,
  // Lowercase hexadecimal digits: hashes.
  kHex,
  // A zone path by its grammar (common/zone.h ParseZone).
  kZone,
};

// "text", "token", "hex", "zone".
const char* TextKindName(TextKind kind);

struct TextRule {
  // "shoal.v1.JoinRequest.name".
  std::string field;
  TextKind kind = TextKind::kText;
  // Bytes of one value.
  size_t max_bytes = 0;
  // Values of a repeated field (1 for a singular one).
  size_t max_count = 1;
};

// Every rule, in the table's order (docs and tests list them).
const std::vector<TextRule>& TextRules();

// The messages the rules cover: each method's request, WorkerMessage,
// RelayUp and RunRecord (its `config` aside: the operator's, checked by
// ValidateRunConfig), with every message nested in them.
std::vector<const google::protobuf::Descriptor*> CheckedMessages();

// OK when `value` fits `rule`; else INVALID_ARGUMENT naming `path` (the
// field as found, e.g. "JoinRequest.layout.tensors[3].name"), the fault and
// the limit.
absl::Status CheckText(absl::string_view path, absl::string_view value, const TextRule& rule);

// Checks every set string field of `message` against its rule (fields
// without one: kText of at most kDefaultMaxBytes; TextRules() covers every
// field of CheckedMessages(), which a test holds). Bytes fields are not
// text and are not checked (RelayedCall.request is checked as the request
// of its method when the method table parses it).
inline constexpr size_t kDefaultMaxBytes = 256;
absl::Status CheckRequestText(const google::protobuf::Message& message);

// The run record read back at a restart (--state_dir, etcd or the
// checkpoint store), by the same rules: a record that breaks them was not
// written by this coordinator's engine.
absl::Status CheckRunRecordText(const shoal::v1::RunRecord& record);

// The run's id (--run_id, or generated) by RunRecord.run_id's rule: it is
// shown in every status and names the run's checkpoints.
absl::Status CheckRunId(absl::string_view run_id);

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_REQUEST_LIMITS_H_
