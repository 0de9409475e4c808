#include "kernels/held_rows.h"

#include <cstring>

#include "gtest/gtest.h"

namespace flce {
namespace {

class HeldRowsTest : public ::testing::Test {
 protected:
  void SetUp() override { HeldRows::DropKept(); }
  void TearDown() override { HeldRows::DropKept(); }
};

TEST_F(HeldRowsTest, TheNextCallGetsTheBufferTheLastOneGaveBack) {
  const char* first = nullptr;
  {
    HeldRows rows(3 << 20);
    ASSERT_NE(rows.data(), nullptr);
    std::memset(rows.data(), 7, 3 << 20);  // every byte writable
    first = rows.data();
  }
  EXPECT_EQ(HeldRows::KeptBytes(), 3 << 20);
  HeldRows smaller(1 << 20);
  EXPECT_EQ(smaller.data(), first);
  EXPECT_EQ(smaller.capacity(), 3 << 20);
  EXPECT_EQ(HeldRows::KeptBytes(), 0);
}

TEST_F(HeldRowsTest, ALargerCallGetsANewBufferAndTheSmallestFitIsTaken) {
  { HeldRows a(1 << 20); }
  EXPECT_EQ(HeldRows::KeptBytes(), 1 << 20);
  HeldRows larger(2 << 20);
  EXPECT_EQ(larger.capacity(), 2 << 20);
  EXPECT_EQ(HeldRows::KeptBytes(), 1 << 20);  // the small one still waits
  { HeldRows b(4 << 20); }
  HeldRows fit(1 << 20);
  EXPECT_EQ(fit.capacity(), 1 << 20);  // not the 4 MiB one
  EXPECT_EQ(HeldRows::KeptBytes(), 4 << 20);
}

TEST_F(HeldRowsTest, OnlyTheLargestBuffersAreKept) {
  static_assert(HeldRows::kKeptBuffers == 2, "the sizes below keep two");
  {
    HeldRows a(1 << 20);
    HeldRows b(3 << 20);
    HeldRows c(2 << 20);
  }
  EXPECT_EQ(HeldRows::KeptBytes(), (3 << 20) + (2 << 20));
}

TEST_F(HeldRowsTest, AMovedFromHolderGivesNothingBack) {
  HeldRows a(1 << 20);
  HeldRows b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): the point of the test
  EXPECT_EQ(b.capacity(), 1 << 20);
  { HeldRows gone = std::move(b); }
  EXPECT_EQ(HeldRows::KeptBytes(), 1 << 20);
  HeldRows zero(0);
  EXPECT_NE(zero.data(), nullptr);
}

}  // namespace
}  // namespace flce
