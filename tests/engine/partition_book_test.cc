#include "engine/partition_book.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace fedfleet::engine {
namespace {

TEST(PartitionBook, ARequestInRangeIsGrantedEvenWhenHeld) {
  PartitionBook book(4);
  EXPECT_EQ(book.join("a", 2, [&] { return std::vector<int32_t>{2, 2}; }), 2);
  EXPECT_EQ(book.join("b", 9, [&] { return std::vector<int32_t>{}; }), 0)
      << "out of range: treated as no request";
}

TEST(PartitionBook, NewcomersGetTheLowestFreePartitionThenShare) {
  PartitionBook book(3);
  std::vector<int32_t> held;
  for (int i = 0; i < 3; ++i)
    held.push_back(book.join(std::string(1, static_cast<char>('a' + i)), -1, [&] { return held; }));
  EXPECT_EQ(held, (std::vector<int32_t>{0, 1, 2}));
  // All three held: the fourth and fifth client share, by the count of known clients.
  EXPECT_EQ(book.join("c3", -1, [&] { return std::vector<int32_t>(held); }), 0);
  held.push_back(0);
  EXPECT_EQ(book.join("c4", -1, [&] { return std::vector<int32_t>(held); }), 1);
  // A known client without a partition (-1) does not take one.
  EXPECT_EQ(book.join("c5", -1, [&] { return std::vector<int32_t>{-1, 0}; }), 1);
}

TEST(PartitionBook, AReservationIsKeptForItsClientAndNotGivenToOthers) {
  PartitionBook book(4);
  book.reserve("back", 0);
  book.reserve("later", 2);
  EXPECT_EQ(book.join("new", -1, [&] { return std::vector<int32_t>{}; }), 1)
      << "0 and 2 are reserved";
  EXPECT_EQ(book.join("back", -1, [&] { return std::vector<int32_t>{1}; }), 0);
  EXPECT_EQ(book.reserved().size(), 1u) << "the reservation of 'back' ended";
  EXPECT_EQ(book.reserved().count("later"), 1u);
  // A client with a reservation that asks for a partition gets what it asks; its
  // reservation ends all the same.
  EXPECT_EQ(book.join("later", 3, [&] { return std::vector<int32_t>{1, 0}; }), 3);
  EXPECT_TRUE(book.reserved().empty());
  EXPECT_EQ(book.join("next", -1,
                      [&] {
                        return std::vector<int32_t>{1, 0, 3};
                      }),
            2)
      << "2 is free again";
}

TEST(PartitionBook, TheHeldListIsNotBuiltForAClientThatNamesItsPartition) {
  PartitionBook book(8);
  book.reserve("kept", 5);
  int calls = 0;
  auto held = [&] {
    ++calls;
    return std::vector<int32_t>{};
  };
  EXPECT_EQ(book.join("asks", 3, held), 3);
  EXPECT_EQ(book.join("kept", -1, held), 5);
  EXPECT_EQ(calls, 0) << "a fleet of clients that name their partitions joins in O(1) each";
  EXPECT_EQ(book.join("any", -1, held), 0);
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace fedfleet::engine
