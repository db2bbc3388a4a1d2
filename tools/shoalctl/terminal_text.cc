#include "tools/shoalctl/terminal_text.h"

#include <vector>

#include "common/printable.h"

namespace shoal::ctl {

using google::protobuf::FieldDescriptor;
using google::protobuf::Reflection;

void EscapeForTerminal(google::protobuf::Message* message) {
  const Reflection* r = message->GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(*message, &fields);
  for (const FieldDescriptor* f : fields) {
    if (f->type() == FieldDescriptor::TYPE_STRING) {
      if (!f->is_repeated()) {
        r->SetString(message, f, EscapeUnprintable(r->GetString(*message, f)));
        continue;
      }
      for (int i = 0; i < r->FieldSize(*message, f); ++i) {
        r->SetRepeatedString(message, f, i,
                             EscapeUnprintable(r->GetRepeatedString(*message, f, i)));
      }
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      // Map fields are repeated messages of a key and a value: covered.
      if (!f->is_repeated()) {
        EscapeForTerminal(r->MutableMessage(message, f));
        continue;
      }
      for (int i = 0; i < r->FieldSize(*message, f); ++i) {
        EscapeForTerminal(r->MutableRepeatedMessage(message, f, i));
      }
    }
  }
}

std::string TerminalText(absl::string_view text) { return EscapeUnprintable(text, "\n"); }

std::string DocumentText(absl::string_view document) {
  return EscapeUnprintableInDocument(document);
}

}  // namespace shoal::ctl
