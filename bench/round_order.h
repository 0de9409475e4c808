// The order in which an interleaved benchmark round runs its calls.
//
// On a GPU at its power limit a call's time depends on the call before it
// (what it left in clocks, temperature and caches). A plain rotation keeps
// the calls' cyclic order, so every call always follows the same one, and
// the same code listed twice reads differently by its place in the list
// (docs/perf/cuda.md). Williams' crossover design balances that carry-over:
// over one cycle of rounds (n rounds for an even n, 2n for an odd one) every
// call takes every place equally often and follows every other call equally
// often.
#ifndef FLCE_BENCH_ROUND_ORDER_H_
#define FLCE_BENCH_ROUND_ORDER_H_

#include <algorithm>
#include <cstddef>
#include <vector>

namespace flce::bench {

// Rounds in one balanced cycle of n calls.
inline size_t RoundOrderCycle(size_t n) { return n % 2 == 0 ? n : 2 * n; }

// The calls (0 .. n-1) of round `round`, in the order they run.
inline std::vector<size_t> RoundOrder(size_t n, size_t round) {
  // The design's first row: 0, 1, n-1, 2, n-2, ...; row r adds r (mod n),
  // and for an odd n the second n rows are the first n reversed.
  std::vector<size_t> order(n);
  size_t low = 1, high = n - 1;
  const size_t r = round % RoundOrderCycle(n);
  for (size_t j = 0; j < n; ++j) {
    const size_t first = j == 0 ? 0 : (j % 2 == 1 ? low++ : high--);
    order[j] = (first + r) % n;
  }
  if (r >= n) std::reverse(order.begin(), order.end());
  return order;
}

}  // namespace flce::bench

#endif  // FLCE_BENCH_ROUND_ORDER_H_
