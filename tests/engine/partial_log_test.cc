#include "engine/partial_log.h"

#include <gtest/gtest.h>

#include <vector>

namespace fedfleet::engine {
namespace {

struct Seen {
  uint64_t offset, elements;
  std::string payload;
};

std::vector<Seen> collect(PartialLog& log, uint64_t token) {
  std::vector<Seen> out;
  EXPECT_TRUE(log.forEach(token,
                          [&](uint64_t o, uint64_t n, std::string_view p) {
                            out.push_back({o, n, std::string(p)});
                            return Status::ok();
                          })
                  .isOk());
  return out;
}

TEST(PartialLog, KeepsChunksInMemoryUpToTheBoundThenSpills) {
  PartialLog log(10);                                               // ten bytes in memory
  ASSERT_TRUE(log.append(1, 0, 2, "abcdef").isOk());                // 6: memory
  ASSERT_TRUE(log.append(2, 0, 3, "ghij").isOk());                  // 10: memory
  ASSERT_TRUE(log.append(1, 2, 4, "klmnop").isOk());                // spills
  ASSERT_TRUE(log.append(2, 3, 1, std::string(1000, 'z')).isOk());  // spills
  EXPECT_EQ(log.memoryBytes(), 10u);
  EXPECT_EQ(log.spilledBytes(), 1006u);
  auto one = collect(log, 1);
  ASSERT_EQ(one.size(), 2u);  // in arrival order, wherever they live
  EXPECT_EQ(one[0].payload, "abcdef");
  EXPECT_EQ(one[1].payload, "klmnop");
  EXPECT_EQ(one[1].offset, 2u);
  EXPECT_EQ(one[1].elements, 4u);
  auto two = collect(log, 2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[1].payload, std::string(1000, 'z'));
  log.erase(1);
  EXPECT_TRUE(collect(log, 1).empty());
  EXPECT_EQ(log.memoryBytes(), 4u);               // token 1's in-memory bytes returned
  ASSERT_TRUE(log.append(3, 0, 1, "qr").isOk());  // fits again
  EXPECT_EQ(log.memoryBytes(), 6u);
  log.clear();
  EXPECT_TRUE(collect(log, 2).empty());
  EXPECT_EQ(log.memoryBytes(), 0u);
  ASSERT_TRUE(log.append(4, 0, 1, std::string(50, 'y')).isOk());  // the file is reused
  EXPECT_EQ(collect(log, 4)[0].payload, std::string(50, 'y'));
}

TEST(PartialLog, AnErrorFromTheCallbackStopsTheWalk) {
  PartialLog log(1 << 20);
  ASSERT_TRUE(log.append(1, 0, 1, "a").isOk());
  ASSERT_TRUE(log.append(1, 1, 1, "b").isOk());
  int calls = 0;
  Status st = log.forEach(1, [&](uint64_t, uint64_t, std::string_view) {
    ++calls;
    return corrupt("bad");
  });
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_EQ(calls, 1);
}

TEST(PartialLog, FreedBuffersAreReusedWithinTheBound) {
  PartialLog log(64);
  const std::string big(40, 'a');
  ASSERT_TRUE(log.append(1, 0, 10, big).isOk());
  const char* first = nullptr;
  ASSERT_TRUE(log.forEach(1,
                          [&](uint64_t, uint64_t, std::string_view p) {
                            first = p.data();
                            return Status::ok();
                          })
                  .isOk());
  log.erase(1);
  EXPECT_EQ(log.memoryBytes(), 0u);
  // The next payload lands in the freed buffer, with its own bytes; the bound still counts live
  // payloads only.
  ASSERT_TRUE(log.append(2, 0, 8, std::string(32, 'b')).isOk());
  auto two = collect(log, 2);
  ASSERT_EQ(two.size(), 1u);
  EXPECT_EQ(two[0].payload, std::string(32, 'b'));
  ASSERT_TRUE(log.forEach(2,
                          [&](uint64_t, uint64_t, std::string_view p) {
                            EXPECT_EQ(p.data(), first);
                            return Status::ok();
                          })
                  .isOk());
  EXPECT_EQ(log.memoryBytes(), 32u);
  log.clear();
  EXPECT_EQ(log.memoryBytes(), 0u);
  ASSERT_TRUE(log.append(3, 0, 16, std::string(64, 'c')).isOk());
  EXPECT_EQ(log.memoryBytes(), 64u);
  EXPECT_EQ(log.spilledBytes(), 0u);
}

}  // namespace
}  // namespace fedfleet::engine
