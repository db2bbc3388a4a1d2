#include "common/run_config_file.h"

#include <errno.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/run_config.h"
#include "common/status_util.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "yaml-cpp/yaml.h"

namespace shoal {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Reflection;

// A run config is a few hundred bytes; anything this large is not one.
constexpr size_t kMaxFileBytes = 1 << 20;

// Walks a parsed YAML tree along a message's descriptor and sets the fields
// it names. Every refusal names the file, the line and the key's path.
class Walker {
 public:
  Walker(const std::string& name, bool keep_mode, std::vector<std::string>* skipped)
      : name_(name), keep_mode_(keep_mode), skipped_(skipped) {}

  absl::Status Walk(const YAML::Node& node, google::protobuf::Message* msg,
                    const std::string& path) {
    if (node.IsNull()) return absl::OkStatus();
    if (!node.IsMap()) {
      return Error(node, path.empty()
                             ? "the file must be a mapping of groups (model, training, ...)"
                             : absl::StrCat("key '", path, "' must be a mapping of keys"));
    }
    const google::protobuf::Descriptor* d = msg->GetDescriptor();
    std::set<std::string> seen;
    for (auto it = node.begin(); it != node.end(); ++it) {
      // By value: the iterator's pair is a temporary proxy, references to
      // its members dangle after this statement.
      const YAML::Node key = it->first;
      const YAML::Node value = it->second;
      if (!key.IsScalar()) return Error(key, "a key must be a plain name");
      const std::string& name = key.Scalar();
      const std::string full = path.empty() ? name : absl::StrCat(path, ".", name);
      if (!seen.insert(name).second) return Error(key, absl::StrCat("duplicate key '", full, "'"));
      const FieldDescriptor* field = d->FindFieldByName(name);
      if (field == nullptr) {
        std::vector<std::string> known;
        for (int i = 0; i < d->field_count(); ++i) known.push_back(d->field(i)->name());
        return Error(key,
                     absl::StrCat("unknown key '", full, "' (", path.empty() ? "groups" : "keys",
                                  " here: ", absl::StrJoin(known, ", "), ")"));
      }
      if (const google::protobuf::OneofDescriptor* oneof = field->containing_oneof()) {
        for (int i = 0; i < oneof->field_count(); ++i) {
          const FieldDescriptor* other = oneof->field(i);
          if (other != field && seen.count(other->name()) > 0) {
            return Error(key, absl::StrCat("'", other->name(), "' and '", name,
                                           "' are exclusive: the run has one ", oneof->name()));
          }
        }
        const FieldDescriptor* current = msg->GetReflection()->GetOneofFieldDescriptor(*msg, oneof);
        if (keep_mode_ && current != nullptr && current != field) {
          if (skipped_ != nullptr) skipped_->push_back(full);
          continue;
        }
      }
      RETURN_IF_ERROR(Field(value, msg, field, full));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Error(const YAML::Node& at, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(name_, ":", at.Mark().line + 1, ": ", what));
  }

  absl::Status Field(const YAML::Node& value, google::protobuf::Message* msg,
                     const FieldDescriptor* field, const std::string& path) {
    const Reflection* r = msg->GetReflection();
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (field->is_repeated())
        return Error(value, absl::StrCat("key '", path, "' is not supported"));
      return Walk(value, r->MutableMessage(msg, field), path);
    }
    if (field->is_repeated()) {
      if (!value.IsSequence()) {
        return Error(value, absl::StrCat("key '", path, "' must be a list, e.g. [1, 28, 28]"));
      }
      r->ClearField(msg, field);
      for (const YAML::Node& item : value) {
        RETURN_IF_ERROR(Scalar(item, msg, field, path, /*add=*/true));
      }
      return absl::OkStatus();
    }
    return Scalar(value, msg, field, path, /*add=*/false);
  }

  absl::Status Scalar(const YAML::Node& value, google::protobuf::Message* msg,
                      const FieldDescriptor* field, const std::string& path, bool add) {
    const Reflection* r = msg->GetReflection();
    if (value.IsNull()) return Error(value, absl::StrCat("key '", path, "' has no value"));
    if (!value.IsScalar()) {
      return Error(value, absl::StrCat("key '", path, "' must be ", Expected(field), ", not a ",
                                       value.IsMap() ? "mapping" : "list"));
    }
    const std::string text(absl::StripAsciiWhitespace(value.Scalar()));
    auto wrong = [&] {
      return Error(value, absl::StrCat("key '", path, "' must be ", Expected(field), ", got '",
                                       value.Scalar(), "'"));
    };
    switch (field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_STRING:
        add ? r->AddString(msg, field, value.Scalar()) : r->SetString(msg, field, value.Scalar());
        return absl::OkStatus();
      case FieldDescriptor::CPPTYPE_BOOL: {
        // YAML 1.1's words too, so that `hierarchy: on` reads like the flag.
        const std::string t = absl::AsciiStrToLower(text);
        bool v = false;
        if (t == "true" || t == "on" || t == "yes") {
          v = true;
        } else if (t != "false" && t != "off" && t != "no") {
          return wrong();
        }
        add ? r->AddBool(msg, field, v) : r->SetBool(msg, field, v);
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_UINT32: {
        uint32_t v = 0;
        if (absl::StartsWith(text, "-") || !absl::SimpleAtoi(text, &v)) return wrong();
        add ? r->AddUInt32(msg, field, v) : r->SetUInt32(msg, field, v);
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_UINT64: {
        uint64_t v = 0;
        if (absl::StartsWith(text, "-") || !absl::SimpleAtoi(text, &v)) return wrong();
        add ? r->AddUInt64(msg, field, v) : r->SetUInt64(msg, field, v);
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_INT32: {
        int32_t v = 0;
        if (!absl::SimpleAtoi(text, &v)) return wrong();
        add ? r->AddInt32(msg, field, v) : r->SetInt32(msg, field, v);
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_INT64: {
        int64_t v = 0;
        if (!absl::SimpleAtoi(text, &v)) return wrong();
        add ? r->AddInt64(msg, field, v) : r->SetInt64(msg, field, v);
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_DOUBLE:
      case FieldDescriptor::CPPTYPE_FLOAT: {
        double v = 0;
        if (!absl::SimpleAtod(text, &v) || !std::isfinite(v)) return wrong();
        if (field->cpp_type() == FieldDescriptor::CPPTYPE_FLOAT) {
          add ? r->AddFloat(msg, field, static_cast<float>(v))
              : r->SetFloat(msg, field, static_cast<float>(v));
        } else {
          add ? r->AddDouble(msg, field, v) : r->SetDouble(msg, field, v);
        }
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_ENUM: {
        const google::protobuf::EnumValueDescriptor* e = field->enum_type()->FindValueByName(text);
        if (e == nullptr) return wrong();
        add ? r->AddEnum(msg, field, e) : r->SetEnum(msg, field, e);
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_MESSAGE:
        break;
    }
    return wrong();
  }

  static std::string Expected(const FieldDescriptor* field) {
    switch (field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_STRING:
        return "a string";
      case FieldDescriptor::CPPTYPE_BOOL:
        return "true or false";
      case FieldDescriptor::CPPTYPE_UINT32:
        return "an integer in [0, 4294967295]";
      case FieldDescriptor::CPPTYPE_UINT64:
        return "an integer >= 0";
      case FieldDescriptor::CPPTYPE_INT32:
      case FieldDescriptor::CPPTYPE_INT64:
        return "an integer";
      case FieldDescriptor::CPPTYPE_DOUBLE:
      case FieldDescriptor::CPPTYPE_FLOAT:
        return "a number";
      case FieldDescriptor::CPPTYPE_ENUM:
        return "one of the enum's names";
      case FieldDescriptor::CPPTYPE_MESSAGE:
        return "a mapping";
    }
    return "a value";
  }

  const std::string& name_;
  const bool keep_mode_;
  std::vector<std::string>* skipped_;
};

absl::StatusOr<YAML::Node> Load(const std::string& text, const std::string& name) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  const bool json =
      absl::EndsWith(name, ".json") || (first != std::string::npos && text[first] == '{');
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(name, ":", e.mark.line + 1, ":",
                                                   e.mark.column + 1, ": not valid ",
                                                   json ? "JSON" : "YAML", ": ", e.msg));
  }
}

}  // namespace

absl::StatusOr<RunConfigFile> ParseRunConfigFile(const std::string& text, const std::string& name) {
  if (text.size() > kMaxFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": ", text.size(), " bytes, more than a run config's limit of ", kMaxFileBytes));
  }
  ASSIGN_OR_RETURN(YAML::Node root, Load(text, name));
  RunConfigFile file;
  file.name = name;
  file.text = text;
  Walker walker(file.name, /*keep_mode=*/false, nullptr);
  RETURN_IF_ERROR(walker.Walk(root, &file.config, ""));
  return file;
}

absl::StatusOr<RunConfigFile> ReadRunConfigFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int e = errno;
    const std::string what =
        absl::StrCat("cannot read the run config ", path, ": ", std::strerror(e));
    return e == ENOENT ? absl::NotFoundError(what) : absl::FailedPreconditionError(what);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseRunConfigFile(ss.str(), path);
}

absl::Status ApplyRunConfigFile(const RunConfigFile& file, shoal::v1::RunConfig* into,
                                bool keep_mode, std::vector<std::string>* skipped) {
  ASSIGN_OR_RETURN(YAML::Node root, Load(file.text, file.name));
  Walker walker(file.name, keep_mode, skipped);
  return walker.Walk(root, into, "");
}

absl::StatusOr<MergedRunConfig> MergeRunConfig(const std::vector<RunConfigFlag>& flags,
                                               const RunConfigFile* file) {
  using Mode = RunConfigFlag::Mode;
  MergedRunConfig merged;
  shoal::v1::RunConfig& c = merged.config;
  const RunConfigFlag* mode_flag = nullptr;
  for (const RunConfigFlag& f : flags) {
    if (f.key == "mode") mode_flag = &f;
  }
  const bool file_mode =
      file != nullptr && file->config.mode_case() != shoal::v1::RunConfig::MODE_NOT_SET;
  if (file_mode && (mode_flag == nullptr || !mode_flag->given)) {
    file->config.has_gossip() ? (void)c.mutable_gossip() : (void)c.mutable_sync();
  } else if (mode_flag != nullptr) {
    RETURN_IF_ERROR(mode_flag->apply(&c));
  } else {
    c.mutable_sync();
  }
  auto applies = [&c](const RunConfigFlag& f) {
    return f.mode == Mode::kAny || (f.mode == Mode::kGossip) == IsGossip(c);
  };
  // Every flag, at its default or as given: the base the file overrides.
  for (const RunConfigFlag& f : flags) {
    if (&f != mode_flag && applies(f)) RETURN_IF_ERROR(f.apply(&c));
  }
  if (file != nullptr) {
    std::vector<std::string> skipped;
    RETURN_IF_ERROR(ApplyRunConfigFile(*file, &c, /*keep_mode=*/true, &skipped));
    for (const std::string& key : skipped) {
      merged.notes.push_back(
          absl::StrCat(file->name, ": '", key, "' ignored: --mode=", ModeName(c), " was given"));
    }
  }
  // The flags given on the command line override the file.
  for (const RunConfigFlag& f : flags) {
    if (&f == mode_flag || !f.given) continue;
    if (applies(f)) {
      RETURN_IF_ERROR(f.apply(&c));
    } else {
      merged.notes.push_back(absl::StrCat("--", f.flag, " ignored: it applies to ",
                                          f.mode == Mode::kGossip ? "gossip" : "sync",
                                          " mode, the run is ", ModeName(c)));
    }
  }
  NormalizeRunConfig(&c);
  return merged;
}

}  // namespace shoal
