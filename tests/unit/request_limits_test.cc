// What strangers send is bounded before an operator sees it: the character
// rule (common/printable.h) and the coordinator's table of limits
// (services/coordinator/core/request_limits.h), field by field, and that
// docs/SECURITY.md lists every limit the table holds.
#include "services/coordinator/core/request_limits.h"

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/printable.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shoal::coordinator {
namespace {

using ::testing::HasSubstr;

// Text that must never reach a terminal raw: OSC retitle, clear screen,
// BEL, DEL, a C1 CSI, bidirectional override and isolate, line separator,
// BOM, a byte that is not UTF-8, an overlong '/', a surrogate.
const std::vector<std::string>& Hostile() {
  using namespace std::string_literals;
  static const auto* const v =
      new std::vector<std::string>{"\x1b]0;pwned\x07"s, "\x1b[2J"s,         "a\nb"s,
                                   "tab\there"s,        "nul\0x"s,          "del\x7f"s,
                                   "c1\xc2\x9b"s,       "rtl\xe2\x80\xae"s, "iso\xe2\x81\xa6"s,
                                   "ls\xe2\x80\xa8"s,   "bom\xef\xbb\xbf"s, "bad\xff"s,
                                   "over\xc0\xaf"s,     "sur\xed\xa0\x80"s, "cut\xe2\x82"s};
  return *v;
}

TEST(PrintableTest, ShowsPrintableUtf8AndFindsEveryOtherCharacter) {
  for (const std::string ok :
       {"", "w1", "ünïcødé 名前 🐟", "a \"quoted\" \\ name", "$(rm -rf /)", "%s%n", "<script>"}) {
    EXPECT_FALSE(FindUnprintable(ok).has_value()) << ok;
    EXPECT_EQ(EscapeUnprintable(ok), ok);
  }
  for (const std::string& s : Hostile()) {
    ASSERT_TRUE(FindUnprintable(s).has_value()) << s;
    const std::string escaped = EscapeUnprintable(s);
    EXPECT_FALSE(FindUnprintable(escaped).has_value()) << escaped;
  }
  EXPECT_EQ(EscapeUnprintable("\x1b]0;t\x07"), "\\x1b]0;t\\x07");
  EXPECT_EQ(EscapeUnprintable("a\xe2\x80\xae"
                              "b"),
            "a\\u202eb");
  EXPECT_EQ(EscapeUnprintable("a\xff"), "a\\xff");
  EXPECT_EQ(EscapeUnprintable("one\ntwo\x1b", "\n"), "one\ntwo\\x1b");
  EXPECT_EQ(EscapeUnprintableInDocument("{\"a\":\"x\xc2\x9b\"}\n"), "{\"a\":\"x\\u009b\"}\n");
  EXPECT_EQ(EscapeUnprintableInDocument("\"\xff\""), "\"\\ufffd\"");
  const std::optional<TextFault> f = FindUnprintable("ab\x1b");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->offset, 2u);
  EXPECT_EQ(DescribeFault(*f), "U+001B");
}

const TextRule& Rule(const std::string& field) {
  for (const TextRule& r : TextRules()) {
    if (r.field == "shoal.v1." + field) return r;
  }
  ADD_FAILURE() << "no rule for " << field;
  static const TextRule none;
  return none;
}

// A value of the right shape for `rule`, `n` bytes long.
std::string Valid(const TextRule& rule, size_t n) {
  switch (rule.kind) {
    case TextKind::kHex:
      return std::string(n, 'a');
    case TextKind::kZone: {
      // The deepest zone (8 segments) of n bytes.
      std::string z;
      size_t left = n - 7;
      for (size_t i = 0; i < 8; ++i) {
        const size_t len = left / (8 - i);
        z += std::string(len, 'a');
        left -= len;
        if (i < 7) z += '/';
      }
      return z;
    }
    default:
      return std::string(n, 'x');
  }
}

TEST(RequestLimitsTest, EveryStringFieldAStrangerSendsHasARule) {
  std::set<std::string> ruled;
  for (const TextRule& r : TextRules()) {
    EXPECT_TRUE(ruled.insert(r.field).second) << "two rules for " << r.field;
    EXPECT_NE(google::protobuf::DescriptorPool::generated_pool()->FindFieldByName(r.field), nullptr)
        << r.field << " is not a field";
    EXPECT_GT(r.max_bytes, 0u) << r.field;
  }
  const auto* config = shoal::v1::RunRecord::descriptor()->FindFieldByName("config");
  for (const google::protobuf::Descriptor* d : CheckedMessages()) {
    EXPECT_NE(d, config->message_type()) << "the run config is the operator's";
    for (int i = 0; i < d->field_count(); ++i) {
      const google::protobuf::FieldDescriptor* f = d->field(i);
      if (f->type() != google::protobuf::FieldDescriptor::TYPE_STRING) continue;
      EXPECT_TRUE(ruled.count(f->full_name())) << f->full_name() << " has no limit";
    }
  }
}

TEST(RequestLimitsTest, EachFieldRefusesOverItsLengthAndItsCharacters) {
  for (const TextRule& rule : TextRules()) {
    const std::string name = rule.field.substr(std::string("shoal.v1.").size());
    EXPECT_TRUE(CheckText(name, Valid(rule, rule.max_bytes), rule).ok()) << name;
    absl::Status over = CheckText(name, Valid(rule, rule.max_bytes + 1), rule);
    EXPECT_EQ(over.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(over.message(), HasSubstr(name));
    EXPECT_THAT(over.message(), HasSubstr(absl::StrCat("at most ", rule.max_bytes)));
    for (const std::string& bad : Hostile()) {
      absl::Status s = CheckText(name, bad, rule);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name << " took " << bad;
      EXPECT_THAT(s.message(), HasSubstr(name));
      // The refusal never quotes what it refuses raw.
      EXPECT_FALSE(FindUnprintable(s.message()).has_value()) << s.message();
    }
  }
  EXPECT_TRUE(CheckText("n", "ünïcødé 名前", Rule("JoinRequest.name")).ok());
  EXPECT_FALSE(CheckText("a", "host name:1", Rule("JoinRequest.peer_address")).ok());
  EXPECT_FALSE(CheckText("h", std::string(64, 'A'), Rule("JoinRequest.model_hash")).ok());
  EXPECT_FALSE(CheckText("z", "EU/Paris", Rule("JoinRequest.zone")).ok());
  EXPECT_TRUE(CheckText("z", "eu/paris/rack-1", Rule("JoinRequest.zone")).ok());
}

TEST(RequestLimitsTest, RefusesRequestsNamingTheFieldAndTheLimit) {
  shoal::v1::JoinRequest join;
  join.set_peer_address("127.0.0.1:5000");
  join.set_name("trainer ✓ one");
  join.set_zone("eu/paris");
  auto* t = join.mutable_layout()->add_tensors();
  t->set_name("fc.weight");
  t->set_dtype("float32");
  EXPECT_TRUE(CheckRequestText(join).ok());

  shoal::v1::JoinRequest long_name = join;
  long_name.set_name(std::string(100000, 'n'));
  absl::Status s = CheckRequestText(long_name);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("JoinRequest.name is 100000 bytes; at most 128"));

  shoal::v1::JoinRequest esc = join;
  esc.set_name("\x1b]0;owned\x07");
  EXPECT_THAT(CheckRequestText(esc).message(),
              HasSubstr("JoinRequest.name holds U+001B at byte 0"));

  shoal::v1::JoinRequest nested = join;
  nested.mutable_layout()->add_tensors()->set_name("x\x1b[2J");
  EXPECT_THAT(CheckRequestText(nested).message(), HasSubstr("JoinRequest.layout.tensors[1].name"));

  shoal::v1::ConnectionsReadyRequest ready;
  ready.set_worker_id("w1");
  ready.add_unreachable("w2");
  ready.add_unreachable("w 3");
  EXPECT_THAT(CheckRequestText(ready).message(),
              HasSubstr("ConnectionsReadyRequest.unreachable[1] holds byte 0x20"));

  shoal::v1::Heartbeat hb;
  for (int i = 0; i < 1025; ++i) hb.add_bad_chunks_from("10.0.0.1:1");
  EXPECT_THAT(CheckRequestText(hb).message(),
              HasSubstr("Heartbeat.bad_chunks_from has 1025 values; at most 1024"));

  // The relay path: the stream's own fields, and a session message inside.
  shoal::v1::RelayUp up;
  auto* m = up.add_sessions();
  m->set_worker_id("w4");
  m->mutable_message()->mutable_heartbeat()->set_final_error("oops\x1b[31m");
  EXPECT_THAT(CheckRequestText(*m).message(),
              HasSubstr("RelayedSessionMessage.message.heartbeat.final_error"));
  shoal::v1::RelayedMemberGone gone;
  gone.set_worker_id("w4");
  gone.set_reason(std::string(600, 'r'));
  EXPECT_THAT(CheckRequestText(gone).message(), HasSubstr("RelayedMemberGone.reason is 600 bytes"));

  shoal::v1::LeaveRequest leave;
  leave.set_worker_id("w1");
  leave.set_reason("bye\xe2\x80\xae");
  EXPECT_THAT(CheckRequestText(leave).message(), HasSubstr("LeaveRequest.reason holds U+202E"));
}

TEST(RequestLimitsTest, TheRunRecordReadBackHoldsTheSameLimits) {
  shoal::v1::RunRecord r;
  r.set_run_id("run-1");
  r.set_model_hash(std::string(64, 'c'));
  // The operator's config is not checked here (ValidateRunConfig does).
  r.mutable_config()->mutable_model()->set_name(std::string(1000, 'm'));
  auto* ban = r.add_bans();
  ban->set_worker_id("w3");
  ban->set_name("mallory");
  EXPECT_TRUE(CheckRunRecordText(r).ok());
  ban->set_reason("x\x1b[2J");
  EXPECT_THAT(CheckRunRecordText(r).message(), HasSubstr("RunRecord.bans[0].reason holds U+001B"));
  ban->clear_reason();
  r.set_run_id("run 1");
  EXPECT_THAT(CheckRunRecordText(r).message(), HasSubstr("RunRecord.run_id"));
  EXPECT_TRUE(CheckRunId("run-1700000000-abcd").ok());
  EXPECT_EQ(CheckRunId(std::string(129, 'r')).code(), absl::StatusCode::kInvalidArgument);
}

TEST(RequestLimitsTest, SecurityDocListsEveryLimit) {
  std::ifstream in(std::string(SHOAL_SOURCE_DIR) + "/docs/SECURITY.md");
  ASSERT_TRUE(in) << "docs/SECURITY.md";
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  for (const TextRule& r : TextRules()) {
    const std::string name = r.field.substr(std::string("shoal.v1.").size());
    // One table row per field: "| `JoinRequest.name` | text | 128 |".
    const std::string row =
        absl::StrCat("| `", name, "` | ", TextKindName(r.kind), " | ", r.max_bytes,
                     r.max_count > 1 ? absl::StrCat(" (", r.max_count, " values)") : "", " |");
    EXPECT_THAT(doc, HasSubstr(row)) << "docs/SECURITY.md lacks the row " << row;
  }
}

}  // namespace
}  // namespace shoal::coordinator
