#include "engine/engine_state.h"

#include <gtest/gtest.h>

namespace fedfleet::engine {
namespace {

TEST(EngineState, SectionsRoundTripInOrder) {
  EngineStateWriter w;
  w.section("abc");
  w.section("");
  w.section(std::string(300, 'x'));
  const std::string blob = std::move(w).finish();
  EXPECT_EQ(blob.substr(0, 4), "FFE1");
  EXPECT_EQ(blob.size(), 4 + 3 * 8 + 3 + 300u);
  auto r = EngineStateReader::open(blob);
  ASSERT_TRUE(r.isOk());
  EXPECT_EQ(*r->section("a"), "abc");
  EXPECT_EQ(*r->section("b"), "");
  EXPECT_FALSE(r->atEnd());
  EXPECT_EQ(r->section("c")->size(), 300u);
  EXPECT_TRUE(r->atEnd());
  EXPECT_EQ(r->section("d").status().message(), "engine state: truncated before d");
}

TEST(EngineState, ABlobWithoutTheMagicOrCutShortIsCorrupt) {
  EXPECT_EQ(EngineStateReader::open("FFE0").status().code(), StatusCode::kCorrupt);
  EngineStateWriter w;
  w.section("abcdef");
  std::string blob = std::move(w).finish();
  blob.resize(blob.size() - 1);
  auto r = EngineStateReader::open(blob);
  ASSERT_TRUE(r.isOk());
  EXPECT_EQ(r->section("selector").status().message(), "engine state: truncated selector");
}

TEST(EngineState, PartitionsRoundTripAndAreCheckedAgainstTheRun) {
  const std::string section = encodePartitions({{"b", 2}, {"a", 0}});
  auto parts = parsePartitions(section, 3);
  ASSERT_TRUE(parts.isOk()) << parts.status().toString();
  EXPECT_EQ(*parts, (std::map<std::string, int32_t>{{"a", 0}, {"b", 2}}));
  EXPECT_EQ(parsePartitions(section, 2).status().code(), StatusCode::kCorrupt);  // 2 >= 2
  EXPECT_EQ(parsePartitions(section + "x", 3).status().message(),
            "engine state: trailing bytes after partitions");
  EXPECT_EQ(parsePartitions(encodePartitions({{"", 0}}), 3).status().message(),
            "engine state: bad client id in partitions");
  EXPECT_EQ(parsePartitions("abc", 3).status().message(), "engine state: truncated partitions");
}

}  // namespace
}  // namespace fedfleet::engine
