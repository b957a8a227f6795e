// RecentValues (cc/splitkv/recent_values.h): hits only for equal keys, keeps the last
// kEntries pairs, replaces the oldest.
#include "cc/splitkv/recent_values.h"

#include "tests/cc/test_check.h"

namespace {

using splitkv::RecentValues;

struct Key {
  int a = 0;
  int b = 0;
  bool operator==(const Key& o) const { return a == o.a && b == o.b; }
};

TEST(EmptyFindsNothing) {
  RecentValues<Key, int, 3> recent;
  EXPECT_TRUE(recent.Find(Key{0, 0}) == nullptr);  // the zero key is not stored until inserted
  EXPECT_TRUE(recent.Find(Key{1, 2}) == nullptr);
}

TEST(FindsOnlyEqualKeys) {
  RecentValues<Key, int, 3> recent;
  recent.Insert(Key{1, 2}, 10);
  const int* hit = recent.Find(Key{1, 2});
  EXPECT_TRUE(hit != nullptr);
  if (hit != nullptr) EXPECT_EQ(10, *hit);
  EXPECT_TRUE(recent.Find(Key{1, 3}) == nullptr);
  EXPECT_TRUE(recent.Find(Key{2, 2}) == nullptr);
}

TEST(KeepsTheLastEntriesAndReplacesTheOldest) {
  RecentValues<Key, int, 3> recent;
  for (int i = 0; i < 3; ++i) recent.Insert(Key{i, 0}, 100 + i);
  for (int i = 0; i < 3; ++i) {
    const int* hit = recent.Find(Key{i, 0});
    EXPECT_TRUE(hit != nullptr);
    if (hit != nullptr) EXPECT_EQ(100 + i, *hit);
  }
  recent.Insert(Key{3, 0}, 103);  // replaces key 0, stored first
  EXPECT_TRUE(recent.Find(Key{0, 0}) == nullptr);
  for (int i = 1; i < 4; ++i) {
    const int* hit = recent.Find(Key{i, 0});
    EXPECT_TRUE(hit != nullptr);
    if (hit != nullptr) EXPECT_EQ(100 + i, *hit);
  }
  recent.Insert(Key{4, 0}, 104);  // then key 1
  EXPECT_TRUE(recent.Find(Key{1, 0}) == nullptr);
  EXPECT_TRUE(recent.Find(Key{2, 0}) != nullptr);
  EXPECT_TRUE(recent.Find(Key{4, 0}) != nullptr);
}

TEST(OneEntryKeepsTheLastPair) {
  RecentValues<Key, int, 1> recent;
  recent.Insert(Key{5, 5}, 1);
  recent.Insert(Key{6, 6}, 2);
  EXPECT_TRUE(recent.Find(Key{5, 5}) == nullptr);
  const int* hit = recent.Find(Key{6, 6});
  EXPECT_TRUE(hit != nullptr);
  if (hit != nullptr) EXPECT_EQ(2, *hit);
}

}  // namespace

int main() { return splitkv_test::RunAllTests(); }
