#include "tests/support/engine_harness.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace flce::test {

ComputeSpec AllOutputsSpec(Strategy strategy) {
  ComputeSpec spec;
  spec.strategy = strategy;
  spec.outputs.grad_input = true;
  spec.outputs.per_token_loss = true;
  spec.outputs.logprob = true;
  spec.outputs.entropy = true;
  spec.outputs.accuracy = true;
  return spec;
}

std::vector<double> WidenToDoubles(DType dtype, const void* src, int64_t count) {
  std::vector<float> floats(count);
  ToFloat(dtype, src, floats.data(), count);
  return std::vector<double>(floats.begin(), floats.end());
}

namespace {

constexpr uint16_t kBf16QuietNan = 0x7fc0;

std::string PoisonedBuffer(DType dtype, int64_t count) {
  std::string buffer(count * DTypeSize(dtype), '\0');
  if (dtype == DType::kF32) {
    float nan = std::numeric_limits<float>::quiet_NaN();
    for (int64_t i = 0; i < count; ++i) std::memcpy(&buffer[i * 4], &nan, 4);
  } else {
    // 0x7e00 is a quiet NaN in fp16, 0x7fc0 in bf16.
    uint16_t nan = dtype == DType::kBF16 ? kBf16QuietNan : uint16_t{0x7e00};
    for (int64_t i = 0; i < count; ++i) std::memcpy(&buffer[i * 2], &nan, 2);
  }
  return buffer;
}

// Collects grad_input rows from the engine's sink threads.
class SinkCollector {
 public:
  SinkCollector(int64_t num_tokens, int64_t hidden_size, DType dtype)
      : num_tokens_(num_tokens),
        row_bytes_(hidden_size * DTypeSize(dtype)),
        data_(PoisonedBuffer(dtype, num_tokens * hidden_size)),
        deliveries_(num_tokens, 0) {}

  void Receive(int64_t offset, int64_t rows, const std::string& bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (offset < 0 || rows <= 0 || offset + rows > num_tokens_) {
      Fail(absl::StrCat("sink got rows [", offset, ", ", offset + rows, ") outside [0, ",
                        num_tokens_, ")"));
      return;
    }
    if (static_cast<int64_t>(bytes.size()) != rows * row_bytes_) {
      Fail(absl::StrCat("sink got ", bytes.size(), " bytes for ", rows, " rows of ",
                        row_bytes_, " bytes"));
      return;
    }
    for (int64_t r = offset; r < offset + rows; ++r) ++deliveries_[r];
    std::memcpy(&data_[offset * row_bytes_], bytes.data(), bytes.size());
  }

  // OK when every row arrived exactly once.
  absl::Status Check() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty()) return absl::InternalError(error_);
    for (int64_t r = 0; r < num_tokens_; ++r) {
      if (deliveries_[r] != 1) {
        return absl::InternalError(
            absl::StrCat("grad_input row ", r, " delivered ", deliveries_[r], " times"));
      }
    }
    return absl::OkStatus();
  }

  const std::string& data() const { return data_; }

 private:
  void Fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
  }

  const int64_t num_tokens_;
  const int64_t row_bytes_;
  std::mutex mu_;
  std::string data_;
  std::vector<int> deliveries_;
  std::string error_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const Head>> BuildHead(Engine& engine, const Problem& problem,
                                                      int chunks) {
  FLCE_ASSIGN_OR_RETURN(std::unique_ptr<HeadBuilder> builder,
                        engine.BeginHead(HeadSpecOf(problem)));
  const int64_t total = static_cast<int64_t>(problem.weight_bytes.size());
  chunks = std::max(chunks, 1);
  // Uneven pieces that need not align to elements: bytes are bytes.
  int64_t offset = 0;
  for (int i = 0; i < chunks && offset < total; ++i) {
    int64_t piece = i + 1 == chunks ? total - offset : std::max<int64_t>(1, total / chunks + 3 * i - 1);
    piece = std::min(piece, total - offset);
    FLCE_RETURN_IF_ERROR(builder->WriteWeight(offset, problem.weight_bytes.data() + offset, piece));
    offset += piece;
  }
  if (problem.spec.has_bias) {
    const int64_t bias_total = static_cast<int64_t>(problem.bias_bytes.size());
    const int64_t half = bias_total / 2;
    FLCE_RETURN_IF_ERROR(builder->WriteBias(half, problem.bias_bytes.data() + half,
                                            bias_total - half));
    if (half > 0) FLCE_RETURN_IF_ERROR(builder->WriteBias(0, problem.bias_bytes.data(), half));
  }
  return builder->Finish();
}

absl::StatusOr<CallOutput> RunCall(Engine& engine, std::shared_ptr<const Head> head,
                                   const Problem& problem, ComputeSpec spec,
                                   GradBuffer* grad_out, const HarnessOptions& options) {
  const int64_t BT = problem.spec.num_tokens;
  const int64_t H = problem.spec.hidden_size;
  const DType dtype = problem.spec.hidden_dtype;
  spec.num_tokens = BT;
  spec.hidden_dtype = dtype;
  spec.targets = problem.targets;
  spec.ignore_index = problem.spec.ignore_index;
  spec.grad_out = grad_out;
  const bool want_grad_input = spec.outputs.grad_input;

  auto collector = std::make_shared<SinkCollector>(BT, H, dtype);
  GradInputSink sink = [collector](int64_t offset, int64_t rows, std::string data) {
    collector->Receive(offset, rows, data);
  };
  FLCE_ASSIGN_OR_RETURN(std::unique_ptr<ComputeCall> call,
                        StartComputeCall(engine, std::move(head), std::move(spec), sink));

  const int64_t block = options.rows_per_block > 0 ? options.rows_per_block : std::max<int64_t>(BT, 1);
  std::vector<int64_t> starts;
  for (int64_t start = 0; start < BT; start += block) starts.push_back(start);
  if (options.shuffle_blocks) {
    std::mt19937_64 rng(options.seed != 0 ? options.seed : FreshSeed());
    std::shuffle(starts.begin(), starts.end(), rng);
  }
  const int64_t row_bytes = H * DTypeSize(dtype);
  for (int64_t start : starts) {
    const int64_t rows = std::min(block, BT - start);
    FLCE_RETURN_IF_ERROR(
        call->AddHidden(start, rows, problem.hidden_bytes.data() + start * row_bytes));
  }
  FLCE_ASSIGN_OR_RETURN(ComputeResult result, call->Finish());
  call.reset();

  CallOutput out;
  out.result = std::move(result);
  if (want_grad_input) {
    FLCE_RETURN_IF_ERROR(collector->Check());
    out.grad_input = WidenToDoubles(dtype, collector->data().data(), BT * H);
  }
  return out;
}

absl::StatusOr<std::vector<double>> ReadGradWeight(const GradBuffer& grad, DType dtype,
                                                   int64_t rows_per_copy) {
  const int64_t V = grad.vocab_size();
  const int64_t H = grad.hidden_size();
  std::string buffer = PoisonedBuffer(dtype, V * H);
  rows_per_copy = std::max<int64_t>(rows_per_copy, 1);
  for (int64_t row = 0; row < V; row += rows_per_copy) {
    const int64_t rows = std::min(rows_per_copy, V - row);
    FLCE_RETURN_IF_ERROR(
        grad.CopyWeightRows(row, rows, dtype, &buffer[row * H * DTypeSize(dtype)]));
  }
  return WidenToDoubles(dtype, buffer.data(), V * H);
}

absl::StatusOr<std::vector<double>> ReadGradBias(const GradBuffer& grad, DType dtype) {
  const int64_t V = grad.vocab_size();
  std::string buffer = PoisonedBuffer(dtype, V);
  const int64_t half = V / 2;
  if (half > 0) FLCE_RETURN_IF_ERROR(grad.CopyBias(0, half, dtype, &buffer[0]));
  FLCE_RETURN_IF_ERROR(grad.CopyBias(half, V - half, dtype, &buffer[half * DTypeSize(dtype)]));
  return WidenToDoubles(dtype, buffer.data(), V);
}

absl::StatusOr<EngineRun> RunProblem(Engine& engine, const Problem& problem,
                                     const ComputeSpec& spec, const HarnessOptions& options) {
  FLCE_ASSIGN_OR_RETURN(std::shared_ptr<const Head> head,
                        BuildHead(engine, problem, options.weight_chunks));
  std::unique_ptr<GradBuffer> grad;
  if (options.with_grad_buffer) {
    FLCE_ASSIGN_OR_RETURN(grad, engine.NewGradBuffer(HeadSpecOf(problem)));
  }
  FLCE_ASSIGN_OR_RETURN(CallOutput call,
                        RunCall(engine, head, problem, spec, grad.get(), options));
  EngineRun run;
  run.result = std::move(call.result);
  run.grad_input = std::move(call.grad_input);
  if (grad != nullptr) {
    FLCE_ASSIGN_OR_RETURN(run.grad_weight, ReadGradWeight(*grad, options.grad_read_dtype));
    if (problem.spec.has_bias) {
      FLCE_ASSIGN_OR_RETURN(run.grad_bias, ReadGradBias(*grad, options.grad_read_dtype));
    }
  }
  return run;
}

}  // namespace flce::test
