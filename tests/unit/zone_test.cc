#include "common/zone.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace shoal {
namespace {

TEST(ZoneTest, ParsesPaths) {
  EXPECT_EQ(*ParseZone(""), std::vector<std::string>{});
  EXPECT_EQ(*ParseZone("eu"), std::vector<std::string>{"eu"});
  EXPECT_EQ(*ParseZone("eu/paris/rack-1.a_b"),
            (std::vector<std::string>{"eu", "paris", "rack-1.a_b"}));
}

TEST(ZoneTest, RefusesMalformedPaths) {
  for (const char* bad :
       {"/", "/eu", "eu/", "eu//paris", "Eu", "eu paris", "eu/./x", "..", "eu/\xc3\xa9", "a:b"}) {
    EXPECT_EQ(ParseZone(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_FALSE(ParseZone(std::string(64, 'a')).ok());
  EXPECT_TRUE(ParseZone(std::string(63, 'a')).ok());
  EXPECT_FALSE(ParseZone("a/b/c/d/e/f/g/h/i").ok());
  EXPECT_TRUE(ParseZone("a/b/c/d/e/f/g/h").ok());
  std::string long_path;
  for (int i = 0; i < 8; ++i) long_path += (i ? "/" : "") + std::string(20, 'x');
  EXPECT_FALSE(ParseZone(long_path).ok());  // 167 bytes
}

TEST(ZoneTest, ContainmentAndParent) {
  EXPECT_TRUE(ZoneContains("", "eu/paris"));
  EXPECT_TRUE(ZoneContains("eu", "eu/paris"));
  EXPECT_TRUE(ZoneContains("eu/paris", "eu/paris"));
  EXPECT_FALSE(ZoneContains("eu/par", "eu/paris"));
  EXPECT_FALSE(ZoneContains("eu/paris", "eu"));
  EXPECT_EQ(ParentZone("eu/paris/r1"), "eu/paris");
  EXPECT_EQ(ParentZone("eu"), "");
  EXPECT_EQ(ParentZone(""), "");
}

}  // namespace
}  // namespace shoal
