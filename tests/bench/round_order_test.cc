#include "bench/round_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace flce::bench {
namespace {

// Over one cycle: every round a permutation, every call at every place
// equally often, every ordered pair of calls adjacent equally often.
TEST(RoundOrderTest, CycleBalancesPlacesAndPredecessors) {
  for (size_t n = 1; n <= 9; ++n) {
    const size_t cycle = RoundOrderCycle(n);
    std::vector<std::vector<int>> at_place(n, std::vector<int>(n, 0));
    std::vector<std::vector<int>> follows(n, std::vector<int>(n, 0));
    for (size_t round = 0; round < cycle; ++round) {
      const std::vector<size_t> order = RoundOrder(n, round);
      ASSERT_EQ(order.size(), n);
      std::vector<size_t> sorted = order;
      std::sort(sorted.begin(), sorted.end());
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(sorted[i], i) << "n " << n << " round " << round;
      for (size_t j = 0; j < n; ++j) ++at_place[order[j]][j];
      for (size_t j = 1; j < n; ++j) ++follows[order[j]][order[j - 1]];
    }
    const int per_place = static_cast<int>(cycle / n);
    const int per_pair = n > 1 ? static_cast<int>(cycle * (n - 1) / (n * (n - 1))) : 0;
    for (size_t a = 0; a < n; ++a) {
      for (size_t j = 0; j < n; ++j) EXPECT_EQ(at_place[a][j], per_place) << "n " << n;
      for (size_t b = 0; b < n; ++b) {
        EXPECT_EQ(follows[a][b], a == b ? 0 : per_pair) << "n " << n << ": " << a << " after " << b;
      }
    }
  }
}

// Two calls alternate (the bound and one strategy), as the rotation did.
TEST(RoundOrderTest, TwoCallsAlternate) {
  EXPECT_EQ(RoundOrder(2, 0), (std::vector<size_t>{0, 1}));
  EXPECT_EQ(RoundOrder(2, 1), (std::vector<size_t>{1, 0}));
  EXPECT_EQ(RoundOrder(2, 2), (std::vector<size_t>{0, 1}));
}

}  // namespace
}  // namespace flce::bench
