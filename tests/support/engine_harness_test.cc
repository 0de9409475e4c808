// Checks that the engine harness catches what it claims to catch. A fake
// engine echoes hidden back as grad_input and returns the head itself as
// grad_W, so a faithful run must reproduce the problem's inputs bit for bit;
// its injectable faults (a row delivered twice or never, a short message, a
// gradient row never copied) must each make the run fail or read as NaN.
#include "tests/support/engine_harness.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "gtest/gtest.h"
#include "kernels/engine.h"
#include "tests/support/problem.h"

namespace flce::test {
namespace {

struct Faults {
  int64_t duplicate_row = -1;  // sent to the sink twice
  int64_t drop_row = -1;       // never sent to the sink
  bool short_message = false;  // one byte missing from every message
  int64_t skip_grad_row = -1;  // CopyWeightRows leaves this row unwritten
};

class FakeHead : public Head {
 public:
  FakeHead(HeadSpec spec, std::vector<float> weight, std::vector<float> bias)
      : spec_(spec), weight_(std::move(weight)), bias_(std::move(bias)) {}
  const HeadSpec& spec() const override { return spec_; }
  int64_t resident_bytes() const override {
    return static_cast<int64_t>((weight_.size() + bias_.size()) * sizeof(float));
  }
  absl::Status CopyOut(HeadTensor, int64_t, int64_t, void*) const override {
    return absl::UnimplementedError("the fake head is not read back");
  }
  absl::Status GatherRows(const int32_t*, int64_t, DType, void*) const override {
    return absl::UnimplementedError("the fake head has no embedding");
  }
  const std::vector<float>& weight() const { return weight_; }
  const std::vector<float>& bias() const { return bias_; }

 private:
  HeadSpec spec_;
  std::vector<float> weight_;
  std::vector<float> bias_;
};

class FakeHeadBuilder : public HeadBuilder {
 public:
  explicit FakeHeadBuilder(const HeadSpec& spec)
      : spec_(spec),
        weight_(spec.vocab_size * spec.hidden_size * DTypeSize(spec.dtype), '\0'),
        bias_(spec.has_bias ? spec.vocab_size * DTypeSize(spec.dtype) : 0, '\0'),
        weight_written_(weight_.size(), 0),
        bias_written_(bias_.size(), 0) {}

  absl::Status WriteWeight(int64_t offset, const void* data, int64_t bytes) override {
    return Write(weight_, weight_written_, offset, data, bytes);
  }
  absl::Status WriteBias(int64_t offset, const void* data, int64_t bytes) override {
    return Write(bias_, bias_written_, offset, data, bytes);
  }
  absl::StatusOr<std::shared_ptr<const Head>> Finish() override {
    const bool complete =
        std::all_of(weight_written_.begin(), weight_written_.end(), [](char c) { return c; }) &&
        std::all_of(bias_written_.begin(), bias_written_.end(), [](char c) { return c; });
    if (!complete) return absl::FailedPreconditionError("head incomplete");
    std::vector<float> weight(spec_.vocab_size * spec_.hidden_size);
    ToFloat(spec_.dtype, weight_.data(), weight.data(), static_cast<int64_t>(weight.size()));
    std::vector<float> bias(spec_.has_bias ? spec_.vocab_size : 0);
    ToFloat(spec_.dtype, bias_.data(), bias.data(), static_cast<int64_t>(bias.size()));
    return std::shared_ptr<const Head>(
        std::make_shared<FakeHead>(spec_, std::move(weight), std::move(bias)));
  }

 private:
  static absl::Status Write(std::string& buffer, std::vector<char>& written, int64_t offset,
                            const void* data, int64_t bytes) {
    if (offset < 0 || bytes < 0 || offset + bytes > static_cast<int64_t>(buffer.size())) {
      return absl::InvalidArgumentError("write outside the tensor");
    }
    std::memcpy(&buffer[offset], data, bytes);
    std::fill(written.begin() + offset, written.begin() + offset + bytes, 1);
    return absl::OkStatus();
  }

  HeadSpec spec_;
  std::string weight_;
  std::string bias_;
  std::vector<char> weight_written_;
  std::vector<char> bias_written_;
};

class FakeGradBuffer : public GradBuffer {
 public:
  FakeGradBuffer(const HeadSpec& spec, const Faults* faults)
      : spec_(spec),
        faults_(faults),
        weight_(spec.vocab_size * spec.hidden_size, 0.0f),
        bias_(spec.has_bias ? spec.vocab_size : 0, 0.0f) {}

  int64_t vocab_size() const override { return spec_.vocab_size; }
  int64_t hidden_size() const override { return spec_.hidden_size; }
  bool has_bias() const override { return spec_.has_bias; }
  int64_t bytes() const override {
    return static_cast<int64_t>((weight_.size() + bias_.size()) * sizeof(float));
  }
  absl::Status Zero() override {
    std::fill(weight_.begin(), weight_.end(), 0.0f);
    std::fill(bias_.begin(), bias_.end(), 0.0f);
    return absl::OkStatus();
  }
  absl::Status AddScaled(const GradBuffer&, float) override {
    return absl::UnimplementedError("not needed by the harness");
  }
  absl::StatusOr<FiniteCheck> ScaleAndAdd(float, const GradBuffer&) override {
    return absl::UnimplementedError("not needed by the harness");
  }
  absl::StatusOr<GradNorms> SquaredNorms() const override { return GradNorms{}; }
  absl::Status ScatterAddRows(const int32_t*, int64_t, const void*, DType, bool) override {
    return absl::UnimplementedError("the fake gradient has no embedding rows");
  }
  absl::StatusOr<bool> AllFinite() const override {
    return absl::UnimplementedError("not needed by the harness");
  }
  absl::Status CopyWeightRows(int64_t row_begin, int64_t rows, DType out_dtype,
                              void* host_out) const override {
    const int64_t H = spec_.hidden_size;
    char* out = static_cast<char*>(host_out);
    for (int64_t r = row_begin; r < row_begin + rows; ++r) {
      if (r == faults_->skip_grad_row) continue;
      FromFloat(out_dtype, &weight_[r * H], out + (r - row_begin) * H * DTypeSize(out_dtype), H);
    }
    return absl::OkStatus();
  }
  absl::Status CopyBias(int64_t begin, int64_t count, DType out_dtype,
                        void* host_out) const override {
    FromFloat(out_dtype, &bias_[begin], host_out, count);
    return absl::OkStatus();
  }

  std::vector<float>& weight() { return weight_; }
  std::vector<float>& bias() { return bias_; }

 private:
  HeadSpec spec_;
  const Faults* faults_;
  std::vector<float> weight_;
  std::vector<float> bias_;
};

// Echoes every hidden row back as its grad_input (same dtype, same bytes) and,
// at Finish, sets grad_W / grad_b to the head's own weight / bias.
class FakeCall : public ComputeCall {
 public:
  FakeCall(std::shared_ptr<const FakeHead> head, ComputeSpec spec, GradInputSink sink,
           const Faults* faults, std::vector<int64_t>* offsets)
      : head_(std::move(head)),
        spec_(std::move(spec)),
        sink_(std::move(sink)),
        faults_(faults),
        offsets_(offsets) {}

  absl::Status AddHidden(int64_t offset, int64_t rows, const void* data) override {
    offsets_->push_back(offset);
    if (!spec_.outputs.grad_input) return absl::OkStatus();
    const int64_t row_bytes = head_->spec().hidden_size * DTypeSize(spec_.hidden_dtype);
    const char* bytes = static_cast<const char*>(data);
    for (int64_t r = offset; r < offset + rows; ++r) {
      if (r == faults_->drop_row) continue;
      const int sends = r == faults_->duplicate_row ? 2 : 1;
      for (int i = 0; i < sends; ++i) {
        std::string message(bytes + (r - offset) * row_bytes, row_bytes);
        if (faults_->short_message) message.pop_back();
        sink_(r, 1, std::move(message));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<ComputeResult> Finish() override {
    if (spec_.grad_out != nullptr) {
      auto* grad = static_cast<FakeGradBuffer*>(spec_.grad_out);
      grad->weight() = head_->weight();
      grad->bias() = head_->bias();
    }
    ComputeResult result;
    result.strategy_used = "fake";
    for (int32_t y : spec_.targets) result.n_valid += y != spec_.ignore_index ? 1 : 0;
    return result;
  }

 private:
  std::shared_ptr<const FakeHead> head_;
  ComputeSpec spec_;
  GradInputSink sink_;
  const Faults* faults_;
  std::vector<int64_t>* offsets_;
};

class FakeEngine : public Engine {
 public:
  Faults faults;
  std::vector<int64_t> offsets;  // AddHidden token offsets, in call order

  EngineInfo info() const override { return {"fake", 0, 0, 0, 0}; }
  absl::StatusOr<std::unique_ptr<HeadBuilder>> BeginHead(const HeadSpec& spec) override {
    return std::unique_ptr<HeadBuilder>(std::make_unique<FakeHeadBuilder>(spec));
  }
  absl::StatusOr<std::unique_ptr<GradBuffer>> NewGradBuffer(const HeadSpec& spec) override {
    return std::unique_ptr<GradBuffer>(std::make_unique<FakeGradBuffer>(spec, &faults));
  }
  absl::StatusOr<std::unique_ptr<ComputeCall>> StartCompute(std::shared_ptr<const Head> head,
                                                            ComputeSpec spec,
                                                            GradInputSink sink) override {
    auto fake = std::dynamic_pointer_cast<const FakeHead>(head);
    if (fake == nullptr) return absl::InvalidArgumentError("not a fake head");
    return std::unique_ptr<ComputeCall>(std::make_unique<FakeCall>(
        std::move(fake), std::move(spec), std::move(sink), &faults, &offsets));
  }
  absl::StatusOr<std::unique_ptr<HeadOptimizer>> CreateOptimizer(std::shared_ptr<const Head>,
                                                                 const OptimizerConfig&) override {
    return absl::UnimplementedError("the fake engine has no optimizer");
  }
  bool healthy() const override { return true; }
};

Problem SmallProblem(DType head_dtype, DType hidden_dtype) {
  ProblemSpec ps;
  ps.vocab_size = 13;
  ps.hidden_size = 6;
  ps.num_tokens = 23;
  ps.head_dtype = head_dtype;
  ps.hidden_dtype = hidden_dtype;
  ps.has_bias = true;
  return MakeProblem(ps);
}

TEST(EngineHarnessTest, FaithfulEngineReproducesTheInputsExactly) {
  const DType kDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  for (DType head_dtype : kDtypes) {
    for (DType hidden_dtype : kDtypes) {
      SCOPED_TRACE(
          absl::StrCat("head ", DTypeName(head_dtype), " hidden ", DTypeName(hidden_dtype)));
      FakeEngine engine;
      Problem problem = SmallProblem(head_dtype, hidden_dtype);
      HarnessOptions options;
      options.weight_chunks = 4;
      // bf16 read-back is exact only for a head that already holds bf16 values.
      options.grad_read_dtype = head_dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
      absl::StatusOr<EngineRun> run = RunProblem(engine, problem, ComputeSpec{}, options);
      ASSERT_TRUE(run.ok()) << run.status();
      EXPECT_EQ(run->grad_input, ToDoubles(problem.hidden));
      EXPECT_EQ(run->grad_weight, ToDoubles(problem.weight));
      EXPECT_EQ(run->grad_bias, ToDoubles(problem.bias));
      EXPECT_EQ(run->result.strategy_used, "fake");
    }
  }
}

TEST(EngineHarnessTest, EveryRowIsSubmittedOnceInAShuffledOrder) {
  FakeEngine engine;
  Problem problem = SmallProblem(DType::kF32, DType::kF32);
  HarnessOptions options;
  options.rows_per_block = 2;
  options.seed = 42;
  ASSERT_TRUE(RunProblem(engine, problem, ComputeSpec{}, options).ok());
  std::vector<int64_t> sorted = engine.offsets;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> expected;
  for (int64_t t = 0; t < problem.spec.num_tokens; t += 2) expected.push_back(t);
  EXPECT_EQ(sorted, expected);
  EXPECT_NE(engine.offsets, expected) << "blocks were not shuffled";
}

TEST(EngineHarnessTest, RowDeliveredTwiceIsInternal) {
  FakeEngine engine;
  engine.faults.duplicate_row = 7;
  absl::StatusOr<EngineRun> run =
      RunProblem(engine, SmallProblem(DType::kF32, DType::kBF16), ComputeSpec{}, {});
  ASSERT_EQ(run.status().code(), absl::StatusCode::kInternal) << run.status();
  EXPECT_NE(run.status().message().find("row 7 delivered 2 times"), std::string::npos)
      << run.status();
}

TEST(EngineHarnessTest, RowNeverDeliveredIsInternal) {
  FakeEngine engine;
  engine.faults.drop_row = 22;  // the last row: a partial final block
  absl::StatusOr<EngineRun> run =
      RunProblem(engine, SmallProblem(DType::kF32, DType::kF32), ComputeSpec{}, {});
  ASSERT_EQ(run.status().code(), absl::StatusCode::kInternal) << run.status();
  EXPECT_NE(run.status().message().find("row 22 delivered 0 times"), std::string::npos)
      << run.status();
}

TEST(EngineHarnessTest, WrongByteCountIsInternal) {
  FakeEngine engine;
  engine.faults.short_message = true;
  absl::StatusOr<EngineRun> run =
      RunProblem(engine, SmallProblem(DType::kF32, DType::kF16), ComputeSpec{}, {});
  ASSERT_EQ(run.status().code(), absl::StatusCode::kInternal) << run.status();
  EXPECT_NE(run.status().message().find("bytes"), std::string::npos) << run.status();
}

TEST(EngineHarnessTest, GradRowNeverCopiedReadsAsNanAndNeverPasses) {
  for (DType read_dtype : {DType::kF32, DType::kBF16}) {
    FakeEngine engine;
    engine.faults.skip_grad_row = 5;
    Problem problem = SmallProblem(DType::kBF16, DType::kBF16);
    HarnessOptions options;
    options.grad_read_dtype = read_dtype;
    absl::StatusOr<EngineRun> run = RunProblem(engine, problem, ComputeSpec{}, options);
    ASSERT_TRUE(run.ok()) << run.status();
    const int64_t H = problem.spec.hidden_size;
    for (int64_t k = 0; k < H; ++k) EXPECT_TRUE(std::isnan(run->grad_weight[5 * H + k]));
    EXPECT_FALSE(std::isnan(run->grad_weight[4 * H]));
    EXPECT_TRUE(std::isinf(RelativeError(run->grad_weight, ToDoubles(problem.weight))));
  }
}

TEST(EngineHarnessTest, NoGradInputWantedSkipsTheSinkCheck) {
  FakeEngine engine;
  ComputeSpec spec;
  spec.outputs.grad_input = false;
  HarnessOptions options;
  options.with_grad_buffer = false;
  absl::StatusOr<EngineRun> run =
      RunProblem(engine, SmallProblem(DType::kF32, DType::kF32), spec, options);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(run->grad_input.empty());
  EXPECT_TRUE(run->grad_weight.empty());
  EXPECT_TRUE(run->grad_bias.empty());
}

}  // namespace
}  // namespace flce::test
