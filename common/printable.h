// What a string a stranger chose may put in front of an operator. A worker's
// name, a leave reason or a zone ends up in `shoalctl status`, on the web
// page and in the logs; a control character there can retitle or clear a
// terminal, hide lines (ESC ] 0 ; ... BEL, ESC [ 2 J: the class of
// kubectl's CVE-2021-25743) or reorder what is read (bidirectional
// controls). One definition serves both sides: the coordinator refuses such
// text at its edge (services/coordinator/core/request_limits.h) and shoalctl
// escapes it in whatever a coordinator sends (tools/shoalctl/terminal_text.h).
// Pure functions, no allocation beyond the result.
#ifndef SHOAL_COMMON_PRINTABLE_H_
#define SHOAL_COMMON_PRINTABLE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace shoal {

// True for a character shown as itself: not a C0 control (U+0000-001F),
// DEL, a C1 control (U+0080-009F), a line or paragraph separator
// (U+2028-2029), a bidirectional control (U+061C, U+200E-200F,
// U+202A-202E, U+2066-2069), a byte order mark (U+FEFF), a surrogate or
// past U+10FFFF.
bool IsShownCodePoint(uint32_t c);

// Decodes the UTF-8 sequence at s[*pos] and moves *pos past it. Returns the
// code point, or nullopt for a byte that starts no well-formed sequence
// (overlong forms, surrogates, past U+10FFFF, truncated): *pos then moves by
// one byte.
std::optional<uint32_t> NextCodePoint(absl::string_view s, size_t* pos);

// The first place where `s` is not printable UTF-8: its byte offset, and the
// code point there (nullopt: a byte that is not UTF-8). nullopt when all of
// `s` is printable.
struct TextFault {
  size_t offset = 0;
  std::optional<uint32_t> code_point;
};
std::optional<TextFault> FindUnprintable(absl::string_view s);

// "U+001B" or "byte 0xC3 that is not UTF-8", for error messages.
std::string DescribeFault(const TextFault& fault);

// `s` with every character that is not shown escaped, so that nothing of it
// acts on a terminal: characters below U+0080 as \xHH (ESC is \x1b), other
// code points as \uHHHH, bytes that are not UTF-8 as \xHH. Characters in
// `keep` (ASCII only, e.g. "\n" for whole lines of text) stay as they are.
// Printable text comes back unchanged, backslashes included.
std::string EscapeUnprintable(absl::string_view s, absl::string_view keep = "");

// A JSON document (or any text whose non-ASCII and control characters occur
// only inside string literals, e.g. YAML whose such scalars are
// double-quoted) with every character that is not shown written as a \uHHHH
// escape, which JSON and YAML both read back as the same character; bytes
// that are not UTF-8 become \ufffd. Tabs, newlines and carriage returns (the
// documents' own layout) stay.
std::string EscapeUnprintableInDocument(absl::string_view document);

}  // namespace shoal

#endif  // SHOAL_COMMON_PRINTABLE_H_
