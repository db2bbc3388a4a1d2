#include "common/run_config_doc.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/run_config.h"
#include "common/run_config_schema.h"

namespace shoal {
namespace {

using google::protobuf::FieldDescriptor;

std::string CLiteral(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += ch;
    }
  }
  return out + "\"";
}

// The flag's C++ type and its default as a C++ expression.
absl::StatusOr<std::pair<std::string, std::string>> FlagType(const SettingInfo& s) {
  const std::string& d = s.setting.default_();
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat(s.key, ": default '", d, "' is no value of its flag --", s.setting.flag()));
  };
  switch (s.setting.form()) {
    case shoal::v1::SETTING_DURATION_MS: {
      absl::Duration duration;
      if (!absl::ParseDuration(d, &duration)) return bad();
      return std::make_pair(
          std::string("absl::Duration"),
          absl::StrCat("absl::Milliseconds(", absl::ToInt64Milliseconds(duration), ")"));
    }
    case shoal::v1::SETTING_ON_OFF:
      if (d != "on" && d != "off") return bad();
      [[fallthrough]];
    case shoal::v1::SETTING_MODE:
    case shoal::v1::SETTING_MODEL:
    case shoal::v1::SETTING_SHAPE:
      return std::make_pair(std::string("std::string"), CLiteral(d));
    default:
      break;
  }
  switch (s.field()->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      return std::make_pair(std::string("std::string"), CLiteral(d));
    case FieldDescriptor::CPPTYPE_BOOL: {
      bool v = false;
      if (!absl::SimpleAtob(d, &v)) return bad();
      return std::make_pair(std::string("bool"), std::string(v ? "true" : "false"));
    }
    case FieldDescriptor::CPPTYPE_UINT32: {
      uint32_t v = 0;
      if (!absl::SimpleAtoi(d, &v)) return bad();
      return std::make_pair(std::string("uint32_t"), absl::StrCat("uint32_t{", v, "}"));
    }
    case FieldDescriptor::CPPTYPE_UINT64: {
      uint64_t v = 0;
      if (!absl::SimpleAtoi(d, &v)) return bad();
      return std::make_pair(std::string("uint64_t"), absl::StrCat("uint64_t{", v, "}"));
    }
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      double v = 0;
      if (!absl::SimpleAtod(d, &v)) return bad();
      return std::make_pair(std::string("double"), absl::StrCat("double{", d, "}"));
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(s.key, ": no flag for its type"));
  }
}

constexpr char kBegin[] = "<!-- BEGIN GENERATED ";
constexpr char kEnd[] = "<!-- END GENERATED ";

// Replaces what lies between the section's markers (the lines after the
// begin marker's up to the end marker) with `body`.
absl::StatusOr<std::string> Replace(const std::string& text, const std::string& name,
                                    const std::string& body) {
  const std::string begin = absl::StrCat(kBegin, name);
  const std::string end = absl::StrCat(kEnd, name, " -->");
  const size_t b = text.find(begin);
  const size_t e = text.find(end);
  if (b == std::string::npos || e == std::string::npos || e < b) {
    return absl::FailedPreconditionError(
        absl::StrCat("docs/CONFIG.md has no section '", begin, "' ... '", end, "'"));
  }
  const size_t after = text.find('\n', b);
  return absl::StrCat(text.substr(0, after + 1), body, text.substr(e));
}

std::string Row(const SettingInfo& s) {
  const shoal::v1::Setting& o = s.setting;
  std::string flag = o.doc_flag();
  if (flag.empty() && s.has_flag()) {
    flag =
        absl::StrCat("`--", o.flag(), o.form() == shoal::v1::SETTING_ON_OFF ? "=on/off" : "", "`");
  }
  const std::string value = !o.doc_default().empty() ? o.doc_default()
                            : s.has_flag()           ? FileFormDefault(s)
                                                     : "";
  std::string row = "|";
  for (const std::string& cell : {absl::StrCat("`", s.key, "`"), flag, value, o.doc()}) {
    absl::StrAppend(&row, cell.empty() ? " " : absl::StrCat(" ", cell, " "), "|");
  }
  return row + "\n";
}

std::string KeysSection() {
  const SettingInfo& mode = RunConfigSettings().front();
  std::string out =
      absl::StrCat("The mode is the group the file names, `sync:` or `gossip:`, or `--mode` (`",
                   mode.setting.default_(), "` by default).\n");
  for (const SettingGroup& g : RunConfigGroups()) {
    absl::StrAppend(&out, "\n### `", g.name, "`",
                    g.doc.empty() ? "" : absl::StrCat(" (", g.doc, ")"),
                    "\n\n| key | flag | default | meaning |\n| --- | --- | --- | --- |\n");
    for (const SettingInfo* s : g.settings) absl::StrAppend(&out, Row(*s));
  }
  return out;
}

std::string RefusalsSection() {
  std::string keys = "Single keys:\n\n";
  std::string combinations =
      "\nCombinations, refused only where they have no meaning: every codec, outer optimizer, "
      "aggregation rule and topology of the synchronous mode compose (one averaging pipeline, "
      "docs/ARCHITECTURE.md), and gossip pulls travel in any codec (docs/GOSSIP.md, "
      "\"Compressed pulls\").\n\n| refused | why |\n| --- | --- |\n";
  for (const RunConfigRuleDoc& r : RunConfigRuleDocs()) {
    if (r.kind == RunConfigRuleDoc::Kind::kKey) {
      absl::StrAppend(&keys, "- ", r.refused, "\n");
    } else {
      absl::StrAppend(&combinations, "| ", r.refused, " | ", r.why, " |\n");
    }
  }
  return keys + combinations;
}

}  // namespace

absl::StatusOr<std::string> RunConfigFlagsSource() {
  std::string out =
      "// Generated by shoal-config-gen from the `setting` options of RunConfig in\n"
      "// protos/shoal/v1/coordinator.proto (common/run_config_doc.h): do not edit.\n"
      "#include <cstdint>\n#include <string>\n\n"
      "#include \"absl/flags/flag.h\"\n#include \"absl/time/time.h\"\n\n"
      "// The flags' file as --help shows it: where they are defined.\n"
      "#line 1 \"protos/shoal/v1/coordinator.proto\"\n";
  for (const SettingInfo& s : RunConfigSettings()) {
    if (!s.has_flag()) continue;
    absl::StatusOr<std::pair<std::string, std::string>> type = FlagType(s);
    if (!type.ok()) return type.status();
    absl::StrAppend(&out, "ABSL_FLAG(", type->first, ", ", s.setting.flag(), ", ", type->second,
                    ",\n          ", CLiteral(s.setting.help()), ");\n");
  }
  absl::StrAppend(&out,
                  "\nnamespace shoal {\nconst char* RunConfigFlagsFile() { return __FILE__; }\n"
                  "}  // namespace shoal\n");
  return out;
}

absl::StatusOr<std::string> RenderConfigDoc(const std::string& current) {
  absl::StatusOr<std::string> text = Replace(current, "keys", KeysSection());
  if (!text.ok()) return text.status();
  return Replace(*text, "refusals", RefusalsSection());
}

}  // namespace shoal
