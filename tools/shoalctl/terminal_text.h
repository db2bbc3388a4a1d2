// What shoalctl prints is safe for the terminal it prints to, whatever a
// coordinator or a store sends (common/printable.h says why): every
// character that is not shown is escaped (\x1b, \u202e). Table and wide
// forms escape each string of the message before it is laid out (a newline
// in a name cannot forge a row), and the lines printed once more (a status
// message of an error); JSON and YAML carry such characters as \uHHHH,
// which their readers decode back to the same strings. Pure functions.
#ifndef SHOAL_TOOLS_SHOALCTL_TERMINAL_TEXT_H_
#define SHOAL_TOOLS_SHOALCTL_TERMINAL_TEXT_H_

#include <google/protobuf/message.h>

#include <string>

#include "absl/strings/string_view.h"

namespace shoal::ctl {

// Escapes every string field of `message`, nested and repeated ones
// included (bytes fields are left: no formatter prints them raw).
void EscapeForTerminal(google::protobuf::Message* message);

// A copy of `message` with its strings escaped, for the table forms.
template <typename M>
M ForTerminal(M message) {
  EscapeForTerminal(&message);
  return message;
}

// Lines of text for a terminal: every character that is not shown
// escaped, newlines kept.
std::string TerminalText(absl::string_view text);

// A JSON or YAML document with such characters as \uHHHH escapes.
std::string DocumentText(absl::string_view document);

}  // namespace shoal::ctl

#endif  // SHOAL_TOOLS_SHOALCTL_TERMINAL_TEXT_H_
