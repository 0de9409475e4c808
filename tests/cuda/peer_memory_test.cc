// CUDA IPC on the engine: device memory another process exported is opened
// (and refused precisely when it should be), hidden read from it gives the
// same results bit for bit as hidden from host memory, grad_input lands in
// it, and the device-side checks (first non-finite element, the fingerprint)
// agree with their host references. The exporting process is this test
// binary run again with FLCE_PEER_EXPORTER=1 (PeerExporter.Serve), talking
// over two pipes. Every test skips with the reason when there is no GPU.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/engine/cuda_engine.h"
#include "kernels/cuda/ops/peer_row_kernels.cuh"
#include "tests/cuda/cuda_test_util.h"
#include "tests/support/device_fingerprint_reference.h"
#include "tests/support/engine_harness.h"
#include "tests/support/problem.h"

extern char** environ;

namespace flce::test {
namespace {

constexpr int kToExporter = 3;    // the exporter's fd for commands
constexpr int kFromExporter = 4;  // ...and for answers

bool ReadAll(int fd, void* data, size_t bytes) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t got = read(fd, p, bytes);
    if (got <= 0) return false;
    p += got;
    bytes -= static_cast<size_t>(got);
  }
  return true;
}

bool WriteAll(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t put = write(fd, p, bytes);
    if (put <= 0) return false;
    p += put;
    bytes -= static_cast<size_t>(put);
  }
  return true;
}

// The exporting side, in the child process: allocates the region, fills it
// with what the parent sent, records an interprocess event, answers with the
// two handles; then 'r' sends the region back, anything else (or EOF) ends.
TEST(PeerExporter, Serve) {
  if (std::getenv("FLCE_PEER_EXPORTER") == nullptr) {
    GTEST_SKIP() << "the exporting process of the peer-memory tests (run by them)";
  }
  int64_t bytes = 0;
  ASSERT_TRUE(ReadAll(kToExporter, &bytes, sizeof(bytes)));
  std::string content(static_cast<size_t>(bytes), '\0');
  ASSERT_TRUE(ReadAll(kToExporter, content.data(), content.size()));
  void* region = nullptr;
  ASSERT_EQ(cudaMalloc(&region, bytes), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(region, content.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  cudaEvent_t written;
  ASSERT_EQ(cudaEventCreateWithFlags(&written, cudaEventInterprocess | cudaEventDisableTiming),
            cudaSuccess);
  ASSERT_EQ(cudaEventRecord(written, nullptr), cudaSuccess);
  cudaIpcMemHandle_t mh;
  cudaIpcEventHandle_t eh;
  ASSERT_EQ(cudaIpcGetMemHandle(&mh, region), cudaSuccess);
  ASSERT_EQ(cudaIpcGetEventHandle(&eh, written), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_TRUE(WriteAll(kFromExporter, &mh, sizeof(mh)));
  ASSERT_TRUE(WriteAll(kFromExporter, &eh, sizeof(eh)));
  char command = 0;
  while (ReadAll(kToExporter, &command, 1) && command == 'r') {
    ASSERT_EQ(cudaMemcpy(content.data(), region, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_TRUE(WriteAll(kFromExporter, content.data(), content.size()));
  }
  cudaFree(region);
}

// The parent's handle on one exporting process.
class Exporter {
 public:
  explicit Exporter(const std::string& content) : bytes_(static_cast<int64_t>(content.size())) {
    int to[2], from[2];
    EXPECT_EQ(pipe2(to, O_CLOEXEC), 0);
    EXPECT_EQ(pipe2(from, O_CLOEXEC), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to[0], kToExporter);
    posix_spawn_file_actions_adddup2(&actions, from[1], kFromExporter);
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
    env_strings.emplace_back("FLCE_PEER_EXPORTER=1");
    std::vector<char*> env;
    for (std::string& s : env_strings) env.push_back(s.data());
    env.push_back(nullptr);
    std::string exe = "/proc/self/exe", filter = "--gtest_filter=PeerExporter.Serve";
    char* argv[] = {exe.data(), filter.data(), nullptr};
    EXPECT_EQ(posix_spawn(&pid_, exe.c_str(), &actions, nullptr, argv, env.data()), 0);
    posix_spawn_file_actions_destroy(&actions);
    close(to[0]);
    close(from[1]);
    to_ = to[1];
    from_ = from[0];
    EXPECT_TRUE(WriteAll(to_, &bytes_, sizeof(bytes_)));
    EXPECT_TRUE(WriteAll(to_, content.data(), content.size()));
    memory_handle_.resize(sizeof(cudaIpcMemHandle_t));
    event_handle_.resize(sizeof(cudaIpcEventHandle_t));
    ok_ = ReadAll(from_, memory_handle_.data(), memory_handle_.size()) &&
          ReadAll(from_, event_handle_.data(), event_handle_.size());
  }
  ~Exporter() {
    const char quit = 'q';
    WriteAll(to_, &quit, 1);
    close(to_);
    close(from_);
    int status = 0;
    waitpid(pid_, &status, 0);
  }

  bool ok() const { return ok_; }
  // The region as the exporter sees it now.
  std::string Read() {
    const char command = 'r';
    std::string content(static_cast<size_t>(bytes_), '\0');
    if (!WriteAll(to_, &command, 1) || !ReadAll(from_, content.data(), content.size())) return "";
    return content;
  }
  PeerMemoryHandle Handle(const std::string& device_uuid, const std::string& key) const {
    PeerMemoryHandle h;
    h.memory_handle = memory_handle_;
    h.event_handle = event_handle_;
    h.device_uuid = device_uuid;
    h.bytes = bytes_;
    h.key = key;
    return h;
  }

 private:
  int64_t bytes_;
  pid_t pid_ = 0;
  int to_ = -1, from_ = -1;
  bool ok_ = false;
  std::string memory_handle_, event_handle_;
};

const std::string kKey = "0123456789abcdef";

// key | hidden | grad_input poisoned with 0xff (NaN in every dtype).
std::string RegionContent(const Problem& problem) {
  return kKey + problem.hidden_bytes + std::string(problem.hidden_bytes.size(), '\xff');
}

ComputeSpec PeerSpec(const Problem& problem, Strategy strategy) {
  ComputeSpec spec;
  spec.strategy = strategy;
  spec.deterministic = true;
  spec.outputs.grad_input = true;
  spec.outputs.per_token_loss = true;
  spec.num_tokens = problem.spec.num_tokens;
  spec.hidden_dtype = problem.spec.hidden_dtype;
  spec.targets = problem.targets;
  spec.ignore_index = problem.spec.ignore_index;
  return spec;
}

TEST(PeerRowKernelsTest, ChecksAndFingerprintMatchTheHostReference) {
  auto engine = MakeEngine(512);
  SKIP_WITHOUT_GPU(engine);
  std::mt19937_64 rng(FreshSeed());
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (int64_t hidden : {1, 37, 1025}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " H=" << hidden);
      const int64_t n = 19, size = DTypeSize(dtype);
      std::string rows(static_cast<size_t>(n * hidden * size), '\0');
      for (char& c : rows) c = static_cast<char>(rng());
      // Finite everywhere first (exponent bits cleared), then one Inf and one NaN.
      char* top = rows.data() + size - 1;  // each element's sign and high exponent bits
      for (int64_t i = 0; i < n * hidden; ++i) top[i * size] &= static_cast<char>(0x80);
      const int64_t first_bad = (n / 2) * hidden + hidden / 2, later_bad = (n - 1) * hidden;
      for (int64_t at : {later_bad, first_bad}) {
        char* e = &rows[at * size];
        if (size == 4) {
          e[3] = 0x7f;  // exponent all ones: Inf or NaN
          e[2] = static_cast<char>(e[2] | 0x80);
        } else {
          e[1] = dtype == DType::kF16 ? 0x7c : 0x7f;
          e[0] = static_cast<char>(e[0] | 0x80);
        }
      }
      void* device = nullptr;
      cuda::RowCheckWords* words = nullptr;
      ASSERT_EQ(cudaMalloc(&device, rows.size()), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&words, sizeof(*words)), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(device, rows.data(), rows.size(), cudaMemcpyHostToDevice), cudaSuccess);
      const cuda::RowCheckWords fresh = cuda::RowCheckWords::Fresh();
      ASSERT_EQ(cudaMemcpy(words, &fresh, sizeof(fresh), cudaMemcpyHostToDevice), cudaSuccess);
      cuda::DeviceHealth health;
      ASSERT_TRUE(cuda::LaunchCheckRows(dtype, device, n, hidden, 1000, 7, true, words, nullptr,
                                        &health)
                      .ok());
      cuda::RowCheckWords got;
      ASSERT_EQ(cudaMemcpy(&got, words, sizeof(got), cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(got.first_non_finite, static_cast<unsigned long long>(7 + first_bad));
      EXPECT_EQ(got.fingerprint, DeviceHiddenFingerprint(dtype, rows.data(), n, hidden, 1000));
      cudaFree(device);
      cudaFree(words);
    }
  }
}

// Hidden from peer memory and from host memory: the same bits out, for the
// streaming plan and a buffered one; grad_input written into the peer's
// poisoned area, every element.
TEST(PeerMemoryTest, PeerHiddenEqualsHostHiddenBitForBit) {
  auto engine = MakeEngine(512);
  SKIP_WITHOUT_GPU(engine);
  ProblemSpec ps;
  ps.vocab_size = 30011;
  ps.hidden_size = 136;
  ps.num_tokens = 3001;  // streams in several chunks
  ps.head_dtype = DType::kBF16;
  ps.hidden_dtype = DType::kBF16;
  Problem problem = MakeProblem(ps);
  const int64_t hidden_bytes = static_cast<int64_t>(problem.hidden_bytes.size());
  Exporter exporter(RegionContent(problem));
  ASSERT_TRUE(exporter.ok());
  auto memory = (*engine)->OpenPeerMemory(exporter.Handle((*engine)->info().device_uuid, kKey));
  ASSERT_TRUE(memory.ok()) << memory.status();
  auto head = BuildHead(**engine, problem, 2);
  ASSERT_TRUE(head.ok()) << head.status();
  for (Strategy strategy : {Strategy::kChunked, Strategy::kVocabSplit}) {
    SCOPED_TRACE(StrategyName(strategy));
    auto host_grad = (*engine)->NewGradBuffer((*head)->spec());
    auto peer_grad = (*engine)->NewGradBuffer((*head)->spec());
    ASSERT_TRUE(host_grad.ok() && peer_grad.ok());
    HarnessOptions one_block;
    one_block.rows_per_block = 0;
    ComputeSpec spec = PeerSpec(problem, strategy);
    spec.chunk_tokens = 1024;
    auto by_host = RunCall(**engine, *head, problem, spec, host_grad->get(), one_block);
    ASSERT_TRUE(by_host.ok()) << by_host.status();

    spec.grad_out = peer_grad->get();
    spec.grad_input_peer = memory->get();
    spec.grad_input_peer_offset = 16 + hidden_bytes;
    auto call = (*engine)->StartCompute(*head, spec, [](int64_t, int64_t, std::string) {
      ADD_FAILURE() << "grad_input reached the sink instead of the peer memory";
    });
    ASSERT_TRUE(call.ok()) << call.status();
    // Two pieces in order (as the server sends them), split inside a chunk: the
    // chunks are those of the host call, so the bits must be too.
    const int64_t half = ps.num_tokens / 2, row = hidden_bytes / ps.num_tokens;
    auto first = (*call)->AddHiddenFromPeer(0, half, **memory, 16);
    auto second = (*call)->AddHiddenFromPeer(half, ps.num_tokens - half, **memory, 16 + half * row);
    ASSERT_TRUE(first.ok() && second.ok()) << first.status() << second.status();
    EXPECT_EQ(first->first_non_finite, -1);
    EXPECT_EQ(first->fingerprint + second->fingerprint,
              DeviceHiddenFingerprint(ps.hidden_dtype, problem.hidden_bytes.data(), ps.num_tokens,
                                      ps.hidden_size, 0));
    auto result = (*call)->Finish();
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->grad_input_first_non_finite, -1);
    EXPECT_EQ(result->loss, by_host->result.loss);
    EXPECT_EQ(result->per_token_loss, by_host->result.per_token_loss);
    const std::string region = exporter.Read();
    ASSERT_EQ(static_cast<int64_t>(region.size()), 16 + 2 * hidden_bytes);
    const std::vector<double> peer_grad_input =
        WidenToDoubles(ps.hidden_dtype, region.data() + 16 + hidden_bytes,
                       ps.num_tokens * ps.hidden_size);
    EXPECT_EQ(peer_grad_input, by_host->grad_input);
    auto host_w = ReadGradWeight(**host_grad, DType::kF32, 4096);
    auto peer_w = ReadGradWeight(**peer_grad, DType::kF32, 4096);
    ASSERT_TRUE(host_w.ok() && peer_w.ok());
    EXPECT_EQ(*host_w, *peer_w);
  }
}

TEST(PeerMemoryTest, NonFiniteHiddenIsFoundWhereItIs) {
  auto engine = MakeEngine(512);
  SKIP_WITHOUT_GPU(engine);
  ProblemSpec ps;
  ps.vocab_size = 1000;
  ps.hidden_size = 40;
  ps.num_tokens = 64;
  ps.head_dtype = DType::kF32;
  ps.hidden_dtype = DType::kF32;
  Problem problem = MakeProblem(ps);
  const float inf = INFINITY;
  std::memcpy(&problem.hidden_bytes[(9 * 40 + 3) * 4], &inf, 4);
  Exporter exporter(RegionContent(problem));
  ASSERT_TRUE(exporter.ok());
  auto memory = (*engine)->OpenPeerMemory(exporter.Handle((*engine)->info().device_uuid, kKey));
  ASSERT_TRUE(memory.ok()) << memory.status();
  auto head = BuildHead(**engine, problem, 1);
  ASSERT_TRUE(head.ok());
  auto call = (*engine)->StartCompute(*head, PeerSpec(problem, Strategy::kChunked), nullptr);
  ASSERT_TRUE(call.ok()) << call.status();
  // Rows 8.. of the region: the bad element is row 1 of the piece, column 3.
  auto got = (*call)->AddHiddenFromPeer(8, 4, **memory, 16 + 8 * 40 * 4);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->first_non_finite, 1 * 40 + 3);
  auto beyond = (*call)->AddHiddenFromPeer(60, 4, **memory, 16 + 2 * 64 * 40 * 4 - 100);
  EXPECT_EQ(beyond.status().code(), absl::StatusCode::kInvalidArgument) << beyond.status();
}

TEST(PeerMemoryTest, OpeningRefusesWhatItShould) {
  auto engine = MakeEngine(512);
  SKIP_WITHOUT_GPU(engine);
  ProblemSpec ps;
  ps.vocab_size = 1000;
  ps.hidden_size = 16;
  ps.num_tokens = 8;
  Problem problem = MakeProblem(ps);
  Exporter exporter(RegionContent(problem));
  ASSERT_TRUE(exporter.ok());
  const std::string uuid = (*engine)->info().device_uuid;
  ASSERT_EQ(uuid.rfind("GPU-", 0), 0u) << uuid;

  auto wrong_key = (*engine)->OpenPeerMemory(exporter.Handle(uuid, "fedcba9876543210"));
  EXPECT_EQ(wrong_key.status().code(), absl::StatusCode::kPermissionDenied) << wrong_key.status();
  auto other_gpu = (*engine)->OpenPeerMemory(
      exporter.Handle("GPU-00000000-0000-0000-0000-000000000000", kKey));
  EXPECT_EQ(other_gpu.status().code(), absl::StatusCode::kFailedPrecondition)
      << other_gpu.status();
  PeerMemoryHandle too_big = exporter.Handle(uuid, kKey);
  too_big.bytes += int64_t{64} << 20;
  auto beyond = (*engine)->OpenPeerMemory(too_big);
  EXPECT_EQ(beyond.status().code(), absl::StatusCode::kInvalidArgument) << beyond.status();
  PeerMemoryHandle garbage = exporter.Handle(uuid, kKey);
  garbage.memory_handle = std::string(garbage.memory_handle.size(), '\x5a');
  auto bad = (*engine)->OpenPeerMemory(garbage);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  PeerMemoryHandle short_handle = exporter.Handle(uuid, kKey);
  short_handle.event_handle.resize(10);
  EXPECT_EQ((*engine)->OpenPeerMemory(short_handle).status().code(),
            absl::StatusCode::kInvalidArgument);
  // None of it hurt the engine: the right handle still opens, with nvidia-smi's
  // spelling of the uuid or without its dashes.
  EXPECT_TRUE((*engine)->healthy());
  std::string bare = uuid.substr(4);
  bare.erase(std::remove(bare.begin(), bare.end(), '-'), bare.end());
  auto right = (*engine)->OpenPeerMemory(exporter.Handle(bare, kKey));
  EXPECT_TRUE(right.ok()) << right.status();
}

}  // namespace
}  // namespace flce::test
