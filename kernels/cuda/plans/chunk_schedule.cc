#include "kernels/cuda/plans/chunk_schedule.h"

#include <algorithm>

#include "kernels/cuda/base/policy.h"
#include "kernels/cuda/plans/plan_parts.h"

namespace flce::cuda {

std::vector<int64_t> ChunkEnds(const Plan& plan, int64_t num_tokens) {
  const int64_t c = std::max<int64_t>(plan.chunk_tokens, 1);
  const int64_t e = plan.edge_tokens;
  std::vector<int64_t> ends;
  if (e <= 0 || e >= c) {
    for (int64_t end = c; end < num_tokens; end += c) ends.push_back(end);
    ends.push_back(num_tokens);
    return ends;
  }
  std::vector<int64_t> head;  // the first chunks' sizes; the last ones mirror them
  int64_t middle = num_tokens;
  for (int64_t s = e; s > 0 && s < c && middle >= 2 * s; s *= 2) {
    head.push_back(s);
    middle -= 2 * s;
  }
  // Between the edges, as many equal chunks as the largest size allows:
  // the next doubling, at most the plan's chunk (a call too short for any
  // edge keeps chunks of edge_tokens).
  const int64_t cap = std::min(c, head.empty() ? e : 2 * head.back());
  std::vector<int64_t> sizes = head;
  if (middle > 0) {
    const int64_t chunks = (middle + cap - 1) / cap;
    const int64_t each = std::min(
        cap, plan_parts::AlignUp((middle + chunks - 1) / chunks, ChunkPolicy::kBalancedAlign));
    for (int64_t left = middle; left > 0; left -= each) sizes.push_back(std::min(each, left));
  }
  sizes.insert(sizes.end(), head.rbegin(), head.rend());
  ends.reserve(sizes.size());
  int64_t end = 0;
  for (int64_t s : sizes) ends.push_back(end += s);
  return ends;
}

int64_t ChunkRowsFrom(const std::vector<int64_t>& ends, int64_t chunk_tokens, int64_t begin) {
  const auto next = std::upper_bound(ends.begin(), ends.end(), begin);
  if (next == ends.end()) return chunk_tokens;
  return std::min(chunk_tokens, *next - begin);
}

}  // namespace flce::cuda
