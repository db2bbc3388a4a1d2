#include "services/coordinator/core/request_limits.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/coordinator_methods.h"
#include "common/printable.h"
#include "common/zone.h"

namespace shoal::coordinator {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// Lengths every rule below shares.
constexpr size_t kIdBytes = 32;        // "w12345": a worker id
constexpr size_t kHashBytes = 64;      // SHA-256 in hex
constexpr size_t kNameBytes = 128;     // a worker's --name
constexpr size_t kReasonBytes = 512;   // a reason someone gives
constexpr size_t kErrorBytes = 1024;   // an error the worker met (a status message)
constexpr size_t kAddressBytes = 256;  // host:port
constexpr size_t kRunIdBytes = 128;    // as the checkpoint store's run ids
constexpr size_t kCheckpointIdBytes = kRunIdBytes + 2 + 20;  // RUN-r<round>

std::vector<TextRule> MakeRules() {
  const auto rule = [](const char* field, TextKind kind, size_t max_bytes, size_t count = 1) {
    return TextRule{absl::StrCat("shoal.v1.", field), kind, max_bytes, count};
  };
  using K = TextKind;
  return {
      // Join: what every operator sees of a member.
      rule("JoinRequest.peer_address", K::kToken, kAddressBytes),
      rule("JoinRequest.name", K::kText, kNameBytes),
      rule("JoinRequest.previous_worker_id", K::kToken, kIdBytes),
      rule("JoinRequest.model_hash", K::kHex, kHashBytes),
      rule("JoinRequest.zone", K::kZone, kMaxZoneBytes),
      rule("JoinRequest.initial_model_hash", K::kHex, kHashBytes),
      rule("JoinRequest.replay_fingerprint", K::kText, kAddressBytes),
      rule("ModelLayout.hash", K::kHex, kHashBytes),
      rule("TensorSpec.name", K::kText, 256),
      rule("TensorSpec.dtype", K::kToken, 32),
      // The session (direct or relayed).
      rule("Hello.worker_id", K::kToken, kIdBytes),
      rule("Heartbeat.last_partner", K::kToken, kIdBytes),
      rule("Heartbeat.final_hash", K::kHex, kHashBytes),
      rule("Heartbeat.final_error", K::kText, kErrorBytes),
      rule("Heartbeat.bad_chunks_from", K::kToken, kAddressBytes, 1024),
      // The round's reports.
      rule("JoinRoundRequest.worker_id", K::kToken, kIdBytes),
      rule("ReportReadyRequest.worker_id", K::kToken, kIdBytes),
      rule("ReportReadyRequest.base_unavailable", K::kText, kErrorBytes),
      rule("ReportReadyRequest.contribution_hash", K::kHex, kHashBytes),
      rule("ConnectionsReadyRequest.worker_id", K::kToken, kIdBytes),
      rule("ConnectionsReadyRequest.unreachable", K::kToken, kIdBytes, 65536),
      rule("ReportRoundDoneRequest.worker_id", K::kToken, kIdBytes),
      rule("ReportRoundDoneRequest.model_hash", K::kHex, kHashBytes),
      rule("PeerRead.worker_id", K::kToken, kIdBytes),
      rule("ReportAuditRequest.worker_id", K::kToken, kIdBytes),
      rule("ReportAuditRequest.replay_hash", K::kHex, kHashBytes),
      rule("ReportAuditRequest.error", K::kText, kErrorBytes),
      rule("ReportCheckpointRequest.worker_id", K::kToken, kIdBytes),
      rule("ReportCheckpointRequest.checkpoint_id", K::kToken, kCheckpointIdBytes),
      rule("ReportCheckpointRequest.error", K::kText, kErrorBytes),
      rule("LeaveRequest.worker_id", K::kToken, kIdBytes),
      rule("LeaveRequest.reason", K::kText, kReasonBytes),
      rule("GetModelFileRequest.sha256", K::kHex, kHashBytes),
      // A supernode's relay stream (RelayedCall.request is bytes: checked
      // as its method's request).
      rule("RelayHello.worker_id", K::kToken, kIdBytes),
      rule("RelayedSessionMessage.worker_id", K::kToken, kIdBytes),
      rule("RelayedCall.worker_id", K::kToken, kIdBytes),
      rule("RelayedCall.method", K::kToken, 64),
      rule("RelayedMemberGone.worker_id", K::kToken, kIdBytes),
      rule("RelayedMemberGone.reason", K::kText, kReasonBytes),
      // The run record read back at a restart.
      rule("RunRecord.run_id", K::kToken, kRunIdBytes),
      rule("RunRecord.model_hash", K::kHex, kHashBytes),
      rule("RunRecord.checkpoint_id", K::kToken, kCheckpointIdBytes),
      rule("CheckpointRef.id", K::kToken, kCheckpointIdBytes),
      rule("CheckpointRef.model_hash", K::kHex, kHashBytes),
      rule("Ban.worker_id", K::kToken, kIdBytes),
      rule("Ban.name", K::kText, kNameBytes),
      rule("Ban.reason", K::kText, kReasonBytes),
  };
}

}  // namespace

const std::vector<TextRule>& TextRules() {
  static const std::vector<TextRule>* const rules = new std::vector<TextRule>(MakeRules());
  return *rules;
}

namespace {

// The rules by field, and which messages hold a checked string somewhere
// (the walk skips the others).
struct Table {
  absl::flat_hash_map<const FieldDescriptor*, const TextRule*> by_field;
  absl::flat_hash_set<const Descriptor*> holds_text;
  std::vector<const Descriptor*> messages;
};

// Messages nested in `d` (itself first), `skip` aside.
void Collect(const Descriptor* d, const FieldDescriptor* skip,
             std::vector<const Descriptor*>* out) {
  if (std::find(out->begin(), out->end(), d) != out->end()) return;
  out->push_back(d);
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f != skip && f->type() == FieldDescriptor::TYPE_MESSAGE)
      Collect(f->message_type(), skip, out);
  }
}

const FieldDescriptor* RecordConfig() {
  return shoal::v1::RunRecord::descriptor()->FindFieldByName("config");
}

const Table& GetTable() {
  static const Table* const table = [] {
    auto* t = new Table();
    const google::protobuf::DescriptorPool* pool =
        google::protobuf::DescriptorPool::generated_pool();
    for (const TextRule& r : TextRules()) {
      const FieldDescriptor* f = pool->FindFieldByName(r.field);
      if (f != nullptr) t->by_field[f] = &r;
    }
    const google::protobuf::ServiceDescriptor* service = &CoordinatorDescriptor();
    for (int i = 0; i < service->method_count(); ++i) {
      Collect(service->method(i)->input_type(), nullptr, &t->messages);
    }
    Collect(shoal::v1::RunRecord::descriptor(), RecordConfig(), &t->messages);
    // Fixed point: a message holds text when a string field or a nested
    // message that holds text does.
    for (bool changed = true; changed;) {
      changed = false;
      for (const Descriptor* d : t->messages) {
        if (t->holds_text.contains(d)) continue;
        for (int i = 0; i < d->field_count(); ++i) {
          const FieldDescriptor* f = d->field(i);
          const bool text = f->type() == FieldDescriptor::TYPE_STRING ||
                            (f->type() == FieldDescriptor::TYPE_MESSAGE &&
                             t->holds_text.contains(f->message_type()));
          if (text) {
            t->holds_text.insert(d);
            changed = true;
            break;
          }
        }
      }
    }
    return t;
  }();
  return *table;
}

const TextRule& RuleOf(const FieldDescriptor* f) {
  static const TextRule* const fallback =
      new TextRule{"(any other string field)", TextKind::kText, kDefaultMaxBytes, 1 << 16};
  auto it = GetTable().by_field.find(f);
  return it == GetTable().by_field.end() ? *fallback : *it->second;
}

absl::Status CheckMessage(const Message& m, const std::string& path, const FieldDescriptor* skip) {
  const Reflection* r = m.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const FieldDescriptor* f : fields) {
    // Most set fields of a heartbeat or a report are numbers: skipped
    // before the path is built.
    const bool text = f->type() == FieldDescriptor::TYPE_STRING;
    if (f == skip || (!text && !(f->type() == FieldDescriptor::TYPE_MESSAGE &&
                                 GetTable().holds_text.contains(f->message_type())))) {
      continue;
    }
    const std::string here = absl::StrCat(path, ".", f->name());
    if (text) {
      const TextRule& rule = RuleOf(f);
      if (!f->is_repeated()) {
        if (absl::Status s = CheckText(here, r->GetStringReference(m, f, nullptr), rule); !s.ok()) {
          return s;
        }
        continue;
      }
      const int n = r->FieldSize(m, f);
      if (static_cast<size_t>(n) > rule.max_count) {
        return absl::InvalidArgumentError(
            absl::StrCat(here, " has ", n, " values; at most ", rule.max_count));
      }
      std::string scratch;
      for (int i = 0; i < n; ++i) {
        const std::string& v = r->GetRepeatedStringReference(m, f, i, &scratch);
        if (absl::Status s = CheckText(absl::StrCat(here, "[", i, "]"), v, rule); !s.ok()) return s;
      }
    } else {
      if (!f->is_repeated()) {
        if (absl::Status s = CheckMessage(r->GetMessage(m, f), here, nullptr); !s.ok()) return s;
        continue;
      }
      for (int i = 0; i < r->FieldSize(m, f); ++i) {
        absl::Status s =
            CheckMessage(r->GetRepeatedMessage(m, f, i), absl::StrCat(here, "[", i, "]"), nullptr);
        if (!s.ok()) return s;
      }
    }
  }
  return absl::OkStatus();
}

bool IsToken(absl::string_view s, size_t* bad) {
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] < 0x21 || s[i] > 0x7e) {
      *bad = i;
      return false;
    }
  }
  return true;
}

bool IsHex(absl::string_view s, size_t* bad) {
  for (size_t i = 0; i < s.size(); ++i) {
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) {
      *bad = i;
      return false;
    }
  }
  return true;
}

}  // namespace

const char* TextKindName(TextKind kind) {
  switch (kind) {
    case TextKind::kText:
      return "printable UTF-8";
    case TextKind::kToken:
      return "printable ASCII without spaces";
    case TextKind::kHex:
      return "lowercase hex";
    case TextKind::kZone:
      return "a zone path";
  }
  return "?";
}

std::vector<const google::protobuf::Descriptor*> CheckedMessages() { return GetTable().messages; }

absl::Status CheckText(absl::string_view path, absl::string_view value, const TextRule& rule) {
  if (value.size() > rule.max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is ", value.size(), " bytes; at most ",
                                                   rule.max_bytes, " (", TextKindName(rule.kind),
                                                   ")"));
  }
  size_t bad = 0;
  switch (rule.kind) {
    case TextKind::kText:
      if (std::optional<TextFault> fault = FindUnprintable(value); fault.has_value()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, " holds ", DescribeFault(*fault), " at byte ", fault->offset,
                         "; it must be printable UTF-8 of at most ", rule.max_bytes,
                         " bytes (no control, separator or bidirectional character)"));
      }
      return absl::OkStatus();
    case TextKind::kToken:
      if (!IsToken(value, &bad)) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, " holds byte 0x", absl::Hex(static_cast<uint8_t>(value[bad]), absl::kZeroPad2),
            " at byte ", bad, "; it must be printable ASCII without spaces, at most ",
            rule.max_bytes, " bytes"));
      }
      return absl::OkStatus();
    case TextKind::kHex:
      if (!IsHex(value, &bad)) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, " holds byte 0x", absl::Hex(static_cast<uint8_t>(value[bad]), absl::kZeroPad2),
            " at byte ", bad, "; it must be lowercase hex, at most ", rule.max_bytes, " digits"));
      }
      return absl::OkStatus();
    case TextKind::kZone:
      if (absl::Status s = ParseZone(value).status(); !s.ok()) {
        // ParseZone's message quotes the zone: not when it is not printable.
        if (FindUnprintable(value).has_value()) {
          return absl::InvalidArgumentError(absl::StrCat(
              path,
              " is not a zone path (segments of a-z, 0-9, '.', '_' and '-' separated by "
              "'/', at most ",
              kMaxZoneBytes, " bytes)"));
        }
        return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
      }
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

absl::Status CheckRequestText(const google::protobuf::Message& message) {
  return CheckMessage(message, message.GetDescriptor()->name(), nullptr);
}

absl::Status CheckRunRecordText(const shoal::v1::RunRecord& record) {
  return CheckMessage(record, "RunRecord", RecordConfig());
}

absl::Status CheckRunId(absl::string_view run_id) {
  const FieldDescriptor* f = shoal::v1::RunRecord::descriptor()->FindFieldByName("run_id");
  return CheckText("the run id", run_id, RuleOf(f));
}

}  // namespace shoal::coordinator
