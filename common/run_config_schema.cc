#include "common/run_config_schema.h"

#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/run_config.h"
#include "common/run_options.h"

namespace shoal {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using shoal::v1::RunConfig;
using shoal::v1::Setting;

// Adds the keys of `d` (a group's message) under `prefix`; a message field
// without a setting of its own is a nested group (outer_optimizer, ...).
void AddKeys(const Descriptor* d, const std::string& prefix, const std::string& group,
             std::vector<const FieldDescriptor*> path, std::vector<SettingInfo>* out) {
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    std::vector<const FieldDescriptor*> here = path;
    here.push_back(f);
    const std::string key = absl::StrCat(prefix, ".", f->name());
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !f->is_repeated()) {
      AddKeys(f->message_type(), key, group, std::move(here), out);
      continue;
    }
    SettingInfo s;
    s.key = key;
    s.group = group;
    s.path = std::move(here);
    s.setting = f->options().GetExtension(shoal::v1::setting);
    out->push_back(std::move(s));
  }
}

std::vector<SettingInfo> BuildSettings() {
  std::vector<SettingInfo> out;
  const Descriptor* d = RunConfig::descriptor();
  const google::protobuf::OneofDescriptor* mode = d->FindOneofByName("mode");
  SettingInfo m;
  m.key = "mode";
  m.group = "mode";
  m.setting = mode->options().GetExtension(shoal::v1::mode_setting);
  out.push_back(std::move(m));
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* group = d->field(i);
    AddKeys(group->message_type(), group->name(), group->name(), {group}, &out);
  }
  return out;
}

std::vector<SettingGroup> BuildGroups() {
  std::vector<SettingGroup> out;
  const Descriptor* d = RunConfig::descriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    SettingGroup g;
    g.field = d->field(i);
    g.name = g.field->name();
    g.doc = g.field->options().GetExtension(shoal::v1::setting).doc();
    for (const SettingInfo& s : RunConfigSettings()) {
      if (s.group == g.name) g.settings.push_back(&s);
    }
    out.push_back(std::move(g));
  }
  return out;
}

absl::Status Meaningless(const SettingInfo& s, const std::string& text, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--", s.setting.flag(), "=", text, " ", why));
}

// The message holding the key's field, created on the way down.
Message* Holder(const SettingInfo& s, RunConfig* c) {
  Message* m = c;
  for (size_t i = 0; i + 1 < s.path.size(); ++i) {
    m = m->GetReflection()->MutableMessage(m, s.path[i]);
  }
  return m;
}

// The flag's text for the field's own type (the flag prints its value the
// way it parses it: "true", "64", "0.05").
absl::Status SetPlain(const SettingInfo& s, const std::string& text, Message* m) {
  const FieldDescriptor* f = s.field();
  const Reflection* r = m->GetReflection();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      r->SetString(m, f, text);
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_BOOL: {
      bool v = false;
      if (!absl::SimpleAtob(text, &v)) return Meaningless(s, text, "is not true or false");
      r->SetBool(m, f, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_UINT32: {
      uint32_t v = 0;
      if (!absl::SimpleAtoi(text, &v)) return Meaningless(s, text, "is not a count");
      r->SetUInt32(m, f, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_UINT64: {
      uint64_t v = 0;
      if (!absl::SimpleAtoi(text, &v)) return Meaningless(s, text, "is not a count");
      r->SetUInt64(m, f, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      double v = 0;
      if (!absl::SimpleAtod(text, &v)) return Meaningless(s, text, "is not a number");
      r->SetDouble(m, f, v);
      return absl::OkStatus();
    }
    default:
      return absl::InternalError(absl::StrCat(s.key, ": no flag form for its type"));
  }
}

absl::Status SetDurationMs(const SettingInfo& s, const std::string& text, Message* m) {
  absl::Duration d;
  if (!absl::ParseDuration(text, &d)) return Meaningless(s, text, "is not a duration");
  if (d < absl::ZeroDuration() || d > absl::Milliseconds(std::numeric_limits<uint32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", s.setting.flag(), "=", absl::FormatDuration(d), " must be between 0 and 49 days"));
  }
  m->GetReflection()->SetUInt32(m, s.field(), static_cast<uint32_t>(absl::ToInt64Milliseconds(d)));
  return absl::OkStatus();
}

absl::Status SetModel(const std::string& text, RunConfig* c) {
  shoal::v1::ModelConfig* m = c->mutable_model();
  constexpr absl::string_view kTorchScript = "torchscript:";
  if (absl::StartsWith(text, kTorchScript)) {
    m->set_name("torchscript");
    m->set_file(text.substr(kTorchScript.size()));
  } else {
    m->set_name(text);
    m->clear_file();
  }
  // Computed from the file at start.
  m->clear_file_sha256();
  m->clear_file_bytes();
  return absl::OkStatus();
}

absl::Status SetShape(const SettingInfo& s, const std::string& text, RunConfig* c) {
  // Only a TorchScript model has one; a file that names one and gives no
  // shape takes the flag's (the coordinator's LoadModelFile).
  if (c->model().name() != "torchscript") return absl::OkStatus();
  absl::StatusOr<std::vector<int64_t>> shape = ParseInputShape(text);
  if (!shape.ok()) return shape.status();
  Message* m = Holder(s, c);
  const Reflection* r = m->GetReflection();
  r->ClearField(m, s.field());
  for (int64_t d : *shape) r->AddUInt32(m, s.field(), static_cast<uint32_t>(d));
  return absl::OkStatus();
}

}  // namespace

const std::vector<SettingInfo>& RunConfigSettings() {
  static const std::vector<SettingInfo>* settings = new std::vector<SettingInfo>(BuildSettings());
  return *settings;
}

const std::vector<SettingGroup>& RunConfigGroups() {
  static const std::vector<SettingGroup>* groups = new std::vector<SettingGroup>(BuildGroups());
  return *groups;
}

const SettingInfo* FindSettingByFlag(const std::string& flag) {
  for (const SettingInfo& s : RunConfigSettings()) {
    if (s.has_flag() && s.setting.flag() == flag) return &s;
  }
  return nullptr;
}

bool SettingApplies(const SettingInfo& s, const RunConfig& config) {
  if (s.setting.modes().empty()) return true;
  for (const std::string& mode : s.setting.modes()) {
    if (mode == ModeName(config)) return true;
  }
  return false;
}

absl::Status ApplySettingText(const SettingInfo& s, const std::string& text,
                              const std::optional<std::string>& zero_takes, RunConfig* c) {
  switch (s.setting.form()) {
    case shoal::v1::SETTING_MODE:
      if (text == "gossip") {
        c->mutable_gossip();
      } else if (text == "sync") {
        c->mutable_sync();
      } else {
        return Meaningless(s, text, "is not one of sync, gossip");
      }
      return absl::OkStatus();
    case shoal::v1::SETTING_MODEL:
      return SetModel(text, c);
    case shoal::v1::SETTING_SHAPE:
      return SetShape(s, text, c);
    case shoal::v1::SETTING_ON_OFF:
      if (text != "on" && text != "off") return Meaningless(s, text, "is not one of on, off");
      Holder(s, c)->GetReflection()->SetBool(Holder(s, c), s.field(), text == "on");
      return absl::OkStatus();
    case shoal::v1::SETTING_DURATION_MS:
      return SetDurationMs(s, text, Holder(s, c));
    default:
      break;
  }
  // A 0 that stands for another flag's value in a mode without that flag's
  // key (--data_shards in gossip mode: --min_participants).
  if (zero_takes.has_value() && text == "0") {
    const SettingInfo* other = FindSettingByFlag(s.setting.zero_takes());
    if (other != nullptr && !SettingApplies(*other, *c)) {
      return SetPlain(s, *zero_takes, Holder(s, c));
    }
  }
  return SetPlain(s, text, Holder(s, c));
}

std::vector<RunConfigFlag> RunConfigFlagsOf(const FlagLookup& lookup) {
  std::vector<RunConfigFlag> flags;
  for (const SettingInfo& s : RunConfigSettings()) {
    if (!s.has_flag()) continue;
    const std::optional<FlagText> value = lookup(s.setting.flag());
    if (!value.has_value()) continue;
    std::optional<std::string> zero_takes;
    if (!s.setting.zero_takes().empty()) {
      if (std::optional<FlagText> other = lookup(s.setting.zero_takes()); other.has_value()) {
        zero_takes = other->text;
      }
    }
    RunConfigFlag f;
    f.flag = s.setting.flag();
    f.key = s.key;
    f.mode = RunConfigFlag::Mode::kAny;
    if (s.setting.modes_size() == 1) {
      f.mode = s.setting.modes(0) == "gossip" ? RunConfigFlag::Mode::kGossip
                                              : RunConfigFlag::Mode::kSync;
    }
    f.given = value->given;
    f.apply = [&s, text = value->text, zero_takes](RunConfig* c) {
      return ApplySettingText(s, text, zero_takes, c);
    };
    flags.push_back(std::move(f));
  }
  return flags;
}

std::string FileFormDefault(const SettingInfo& s) {
  const std::string& d = s.setting.default_();
  switch (s.setting.form()) {
    case shoal::v1::SETTING_DURATION_MS: {
      absl::Duration duration;
      if (!absl::ParseDuration(d, &duration)) return d;
      return absl::StrCat(absl::ToInt64Milliseconds(duration));
    }
    case shoal::v1::SETTING_ON_OFF:
      return d == "on" ? "true" : "false";
    default:
      break;
  }
  const FieldDescriptor* f = s.field();
  if (f == nullptr || f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
    return d.empty() ? "" : absl::StrCat("`", d, "`");
  }
  return d;
}

}  // namespace shoal
