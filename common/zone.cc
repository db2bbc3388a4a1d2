#include "common/zone.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace shoal {

absl::StatusOr<std::vector<std::string>> ParseZone(absl::string_view zone) {
  std::vector<std::string> segments;
  if (zone.empty()) return segments;
  if (zone.size() > kMaxZoneBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("zone is ", zone.size(), " bytes; at most ", kMaxZoneBytes));
  }
  for (absl::string_view s : absl::StrSplit(zone, '/')) {
    if (s.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "zone \"", zone, "\" has an empty segment (a leading, trailing or double '/')"));
    }
    if (s.size() > 63) {
      return absl::InvalidArgumentError(
          absl::StrCat("zone \"", zone, "\": segment of ", s.size(), " bytes (at most 63)"));
    }
    if (s == "." || s == "..") {
      return absl::InvalidArgumentError(absl::StrCat("zone \"", zone, "\": segment \"", s, "\""));
    }
    for (char c : s) {
      const bool ok =
          (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat(
            "zone \"", zone.substr(0, 64), "\": segments hold only a-z, 0-9, '.', '_' and '-'"));
      }
    }
    segments.emplace_back(s);
  }
  if (segments.size() > kMaxZoneDepth) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zone \"", zone, "\" is nested ", segments.size(), " deep; at most ", kMaxZoneDepth));
  }
  return segments;
}

bool ZoneContains(absl::string_view ancestor, absl::string_view zone) {
  if (ancestor.empty()) return true;
  if (zone.size() < ancestor.size() || zone.substr(0, ancestor.size()) != ancestor) return false;
  return zone.size() == ancestor.size() || zone[ancestor.size()] == '/';
}

std::string ParentZone(absl::string_view zone) {
  const size_t slash = zone.rfind('/');
  return slash == absl::string_view::npos ? std::string() : std::string(zone.substr(0, slash));
}

}  // namespace shoal
