#include "common/printable.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shoal {

bool IsShownCodePoint(uint32_t c) {
  if (c < 0x20 || c == 0x7f) return false;       // C0, DEL
  if (c >= 0x80 && c <= 0x9f) return false;      // C1 (0x9b is CSI on some terminals)
  if (c == 0x2028 || c == 0x2029) return false;  // line and paragraph separators
  if (c == 0x061c || c == 0x200e || c == 0x200f) return false;  // bidi marks
  if (c >= 0x202a && c <= 0x202e) return false;                 // bidi embeddings and overrides
  if (c >= 0x2066 && c <= 0x2069) return false;                 // bidi isolates
  if (c == 0xfeff) return false;                                // byte order mark
  if (c >= 0xd800 && c <= 0xdfff) return false;                 // surrogates
  return c <= 0x10ffff;
}

std::optional<uint32_t> NextCodePoint(absl::string_view s, size_t* pos) {
  const size_t i = *pos;
  const auto byte = [&s](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t b0 = byte(i);
  *pos = i + 1;
  if (b0 < 0x80) return b0;
  size_t n = 0;
  uint32_t c = 0, min = 0;
  if ((b0 & 0xe0) == 0xc0) {
    n = 1, c = b0 & 0x1f, min = 0x80;
  } else if ((b0 & 0xf0) == 0xe0) {
    n = 2, c = b0 & 0x0f, min = 0x800;
  } else if ((b0 & 0xf8) == 0xf0) {
    n = 3, c = b0 & 0x07, min = 0x10000;
  } else {
    return std::nullopt;  // a continuation byte or 0xf8-0xff
  }
  if (i + n >= s.size()) return std::nullopt;  // truncated
  for (size_t k = 1; k <= n; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) return std::nullopt;
    c = (c << 6) | (byte(i + k) & 0x3f);
  }
  if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return std::nullopt;
  *pos = i + 1 + n;
  return c;
}

std::optional<TextFault> FindUnprintable(absl::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t at = pos;
    // ASCII fast path: most text is.
    const uint8_t b = static_cast<uint8_t>(s[pos]);
    if (b >= 0x20 && b < 0x7f) {
      ++pos;
      continue;
    }
    const std::optional<uint32_t> c = NextCodePoint(s, &pos);
    if (!c.has_value() || !IsShownCodePoint(*c)) return TextFault{at, c};
  }
  return std::nullopt;
}

std::string DescribeFault(const TextFault& fault) {
  if (!fault.code_point.has_value()) return "a byte that is not UTF-8";
  return absl::StrFormat("U+%04X", *fault.code_point);
}

std::string EscapeUnprintable(absl::string_view s, absl::string_view keep) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t at = pos;
    const std::optional<uint32_t> c = NextCodePoint(s, &pos);
    if (!c.has_value()) {
      absl::StrAppendFormat(&out, "\\x%02x", static_cast<uint8_t>(s[at]));
    } else if (IsShownCodePoint(*c) ||
               (*c < 0x80 && keep.find(static_cast<char>(*c)) != absl::string_view::npos)) {
      out.append(s.data() + at, pos - at);
    } else if (*c < 0x80) {
      absl::StrAppendFormat(&out, "\\x%02x", *c);
    } else {
      absl::StrAppendFormat(&out, "\\u%04x", *c);
    }
  }
  return out;
}

std::string EscapeUnprintableInDocument(absl::string_view document) {
  std::string out;
  out.reserve(document.size());
  size_t pos = 0;
  while (pos < document.size()) {
    const size_t at = pos;
    const std::optional<uint32_t> c = NextCodePoint(document, &pos);
    if (!c.has_value()) {
      out += "\\ufffd";
    } else if (IsShownCodePoint(*c) || *c == '\n' || *c == '\t' || *c == '\r') {
      out.append(document.data() + at, pos - at);
    } else {
      // Every character that is not shown is in the BMP: one escape.
      absl::StrAppendFormat(&out, "\\u%04x", *c);
    }
  }
  return out;
}

}  // namespace shoal
