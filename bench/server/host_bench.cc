// What the server does per received or sent byte of a Compute call besides
// moving it: HiddenFingerprint over every hidden row (request-id reuse) and
// FirstNonFinite over hidden (bad input) and grad_input (overflow), in two
// passes or in one (CheckHiddenRows); the data plane's frames read into fresh
// or kept buffers. Sized as
// the first bench shape's step: 65535 rows of H = 1024 bf16, 128 MiB; and a preference
// call's copy of its rows, into fresh or kept memory; a grad_input chunk cut into
// response messages.
//
//   build/bench/server/flce_host_bench --benchmark_out=host.json
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "core/dtype.h"
#include "kernels/held_rows.h"
#include "server/base/receive_buffers.h"
#include "server/validate/hidden_rows_check.h"
#include "server/validate/request_fingerprint.h"

namespace {

constexpr int64_t kRows = 65535;
constexpr int64_t kHidden = 1024;

const std::vector<uint16_t>& Bf16Rows() {
  static const std::vector<uint16_t> rows = [] {
    std::vector<uint16_t> v(kRows * kHidden);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    for (auto& x : v) x = flce::FloatToBf16(normal(rng));
    return v;
  }();
  return rows;
}

void SetBytes(benchmark::State& state) {
  state.SetBytesProcessed(state.iterations() * kRows * kHidden * 2);
}

// Per 4 MiB message, as the server sees the rows arrive.
void BM_HiddenFingerprint(benchmark::State& state) {
  const auto& rows = Bf16Rows();
  constexpr int64_t kRowsPerMessage = (4 << 20) / (kHidden * 2);
  for (auto _ : state) {
    uint64_t sum = 0;
    for (int64_t r = 0; r < kRows; r += kRowsPerMessage) {
      const int64_t n = std::min(kRowsPerMessage, kRows - r);
      sum += flce::server::HiddenFingerprint(rows.data() + r * kHidden, n, kHidden * 2, r);
    }
    benchmark::DoNotOptimize(sum);
  }
  SetBytes(state);
}
BENCHMARK(BM_HiddenFingerprint)->Unit(benchmark::kMillisecond);

void BM_FirstNonFiniteBf16(benchmark::State& state) {
  const auto& rows = Bf16Rows();
  for (auto _ : state) {
    benchmark::DoNotOptimize(flce::FirstNonFinite(flce::DType::kBF16, rows.data(), kRows * kHidden));
  }
  SetBytes(state);
}
BENCHMARK(BM_FirstNonFiniteBf16)->Unit(benchmark::kMillisecond);

// The server's checks of each 4 MiB message of hidden as it arrives, at the
// bench's H = 1024 and (the same bytes as 16384 rows) at H = 4096: the
// finiteness scan over the whole message and then its fingerprint (two
// passes, each reading every byte from memory), against both row by row in
// one pass (CheckHiddenRows).
template <bool kOnePass>
void BM_HiddenChecks(benchmark::State& state) {
  const auto& rows = Bf16Rows();
  const int64_t hidden = state.range(0);
  const int64_t total_rows = kRows * kHidden / hidden;
  const int64_t row_bytes = hidden * 2;
  const int64_t per_message = (4 << 20) / row_bytes;
  for (auto _ : state) {
    uint64_t sum = 0;
    for (int64_t r = 0; r < total_rows; r += per_message) {
      const int64_t n = std::min(per_message, total_rows - r);
      const uint16_t* message = rows.data() + r * hidden;
      if (kOnePass) {
        const flce::server::HiddenRowsCheck check =
            flce::server::CheckHiddenRows(flce::DType::kBF16, message, n, hidden, r, true);
        sum += check.fingerprint + static_cast<uint64_t>(check.first_non_finite);
      } else {
        sum += static_cast<uint64_t>(flce::FirstNonFinite(flce::DType::kBF16, message, n * hidden));
        sum += flce::server::HiddenFingerprint(message, n, row_bytes, r);
      }
    }
    benchmark::DoNotOptimize(sum);
  }
  SetBytes(state);
}
BENCHMARK(BM_HiddenChecks<false>)
    ->Name("BM_HiddenChecksTwoPasses")
    ->Arg(1024)
    ->Arg(4096)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_HiddenChecks<true>)
    ->Name("BM_HiddenChecksOnePass")
    ->Arg(1024)
    ->Arg(4096)
    ->Unit(benchmark::kMillisecond);

// The data plane's frames of hidden (4 MiB each, 128 MiB), read into a
// fresh string each (zero-filled by resize, then the socket's copy, here a
// memcpy) or into buffers kept from earlier frames (ReceiveBuffers); four
// frames queued towards the engine, as the Compute job takes them.
template <bool kKept>
void BM_ReceiveFrames(benchmark::State& state) {
  constexpr size_t kFrame = size_t{4} << 20;
  constexpr int64_t kFrames = kRows * kHidden * 2 / kFrame;
  static const std::vector<char> wire(kFrame, 1);
  flce::server::ReceiveBuffers buffers;
  for (auto _ : state) {
    std::deque<std::string> queued;
    for (int64_t f = 0; f < kFrames; ++f) {
      std::string frame;
      if (kKept) {
        frame = buffers.Take(kFrame);
      } else {
        frame.resize(kFrame);
      }
      std::memcpy(frame.data(), wire.data(), kFrame);
      queued.push_back(std::move(frame));
      if (queued.size() > 4) {
        if (kKept) buffers.Return(std::move(queued.front()));
        queued.pop_front();
      }
    }
    benchmark::DoNotOptimize(queued.size());
  }
  SetBytes(state);
}
BENCHMARK(BM_ReceiveFrames<false>)->Name("BM_ReceiveFramesFresh")->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ReceiveFrames<true>)->Name("BM_ReceiveFramesKept")->Unit(benchmark::kMillisecond);

// A preference objective's call keeps its rows between its passes: the copy
// per 4 MiB message into memory taken for the call, fresh (mapped anew, first
// touch faults and zeroes each page) or kept from the call before.
template <bool kKept>
void BM_HoldRows(benchmark::State& state) {
  const auto& rows = Bf16Rows();
  const int64_t bytes = kRows * kHidden * 2;
  constexpr int64_t kMessage = 4 << 20;
  for (auto _ : state) {
    flce::HeldRows kept;
    std::unique_ptr<char[]> fresh;
    char* held = nullptr;
    if (kKept) {
      kept = flce::HeldRows(bytes);
      held = kept.data();
    } else {
      fresh.reset(new char[bytes]);
      held = fresh.get();
    }
    const char* from = reinterpret_cast<const char*>(rows.data());
    for (int64_t at = 0; at < bytes; at += kMessage) {
      std::memcpy(held + at, from + at, std::min(kMessage, bytes - at));
    }
    benchmark::DoNotOptimize(held);
    benchmark::ClobberMemory();
  }
  SetBytes(state);
}
BENCHMARK(BM_HoldRows<false>)->Name("BM_HoldRowsFresh")->Unit(benchmark::kMillisecond);
BENCHMARK(BM_HoldRows<true>)->Name("BM_HoldRowsKept")->Unit(benchmark::kMillisecond);

// A chunk's grad_input on its way out as 4 MiB messages, from the chunk's pinned
// download buffer: as one string that is then cut into the messages (what the
// server does) or cut into the messages straight from the download buffer.
// Sized as a call with rows in messages chunks at H = 4096 bf16: 1024 rows, 8 MiB.
template <bool kWhole>
void BM_GradInputChunkToMessages(benchmark::State& state) {
  constexpr int64_t kBytes = int64_t{8} << 20;
  constexpr int64_t kMessage = 4 << 20;
  static const std::vector<char> download(kBytes, 1);
  for (auto _ : state) {
    std::vector<std::string> messages;
    if (kWhole) {
      std::string chunk(download.data(), kBytes);
      for (int64_t at = 0; at < kBytes; at += kMessage) {
        messages.push_back(chunk.substr(at, kMessage));
      }
    } else {
      for (int64_t at = 0; at < kBytes; at += kMessage) {
        messages.emplace_back(download.data() + at, kMessage);
      }
    }
    benchmark::DoNotOptimize(messages.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kBytes);
}
BENCHMARK(BM_GradInputChunkToMessages<true>)
    ->Name("BM_GradInputChunkWholeThenMessages")
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GradInputChunkToMessages<false>)
    ->Name("BM_GradInputChunkStraightToMessages")
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
