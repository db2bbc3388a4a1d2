#include "tools/shoalctl/yaml_output.h"

#include <yaml-cpp/yaml.h>

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace shoal::ctl {
namespace {

// Strings that are safe plain: they start with a letter or '_', hold
// letters, digits, spaces and "_.-/" only, and are not one of YAML 1.1's
// boolean or null words. Everything else is double-quoted, so that no YAML
// reader takes a hash, an address, a number-like string or an RFC 3339
// time ("2026-11-28T17:21:57Z", a timestamp to YAML 1.1) for another type.
bool NeedsQuotes(const std::string& s) {
  if (s.empty() || !(absl::ascii_isalpha(s[0]) || s[0] == '_')) return true;
  if (s.back() == ' ') return true;
  for (const char c : s) {
    if (!(absl::ascii_isalnum(c) || c == '_' || c == '.' || c == '-' || c == '/' || c == ' ')) {
      return true;
    }
  }
  const std::string lower = absl::AsciiStrToLower(s);
  for (const char* word : {"true", "false", "yes", "no", "on", "off", "y", "n", "null"}) {
    if (lower == word) return true;
  }
  return false;
}

void Emit(YAML::Emitter& out, const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      out << YAML::BeginMap;
      for (const auto& kv : node) {
        out << YAML::Key << kv.first.Scalar() << YAML::Value;
        Emit(out, kv.second);
      }
      out << YAML::EndMap;
      break;
    case YAML::NodeType::Sequence:
      out << YAML::BeginSeq;
      for (const auto& item : node) Emit(out, item);
      out << YAML::EndSeq;
      break;
    case YAML::NodeType::Scalar:
      // A JSON string has the non-specific tag "!" (it was quoted).
      if (node.Tag() == "!") {
        if (NeedsQuotes(node.Scalar())) out << YAML::DoubleQuoted;
        out << node.Scalar();
      } else {
        out << node.Scalar();
      }
      break;
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      out << YAML::Null;
      break;
  }
}

}  // namespace

absl::StatusOr<std::string> JsonToYaml(absl::string_view json) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(json));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("not JSON: ", e.what()));
  }
  YAML::Emitter out;
  out.SetIndent(2);
  Emit(out, root);
  if (!out.good()) return absl::InternalError(absl::StrCat("yaml: ", out.GetLastError()));
  return absl::StrCat(out.c_str(), "\n");
}

}  // namespace shoal::ctl
