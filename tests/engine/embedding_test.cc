// Every engine's tied-embedding primitives (Head::GatherRows,
// GradBuffer::ScatterAddRows) against the problem's own weight and a float64
// sum, and HeadOptimizer::WriteState (a checkpoint restored) read back.
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/optimizer.h"
#include "tests/engine/engine_test_fixture.h"

namespace flce::test {
namespace {

class EmbeddingTest : public EngineTest {
 protected:
  void MakeHead(DType dtype, bool has_bias = false) {
    ProblemSpec ps;
    ps.vocab_size = 131;
    ps.hidden_size = 37;
    ps.head_dtype = dtype;
    ps.has_bias = has_bias;
    problem_ = MakeProblem(ps);
    auto head = BuildHead(*engine_, problem_, 2);
    ASSERT_TRUE(head.ok()) << head.status();
    head_ = *head;
  }

  // Ids with repeats and both ends of the vocabulary.
  std::vector<int32_t> Ids(int64_t n, uint64_t seed) const {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::vector<int32_t> ids(n);
    for (int32_t& id : ids) id = static_cast<int32_t>(rng() % problem_.spec.vocab_size);
    ids[0] = 0;
    ids[n - 1] = static_cast<int32_t>(problem_.spec.vocab_size - 1);
    ids[n / 2] = ids[1];
    return ids;
  }

  Problem problem_;
  std::shared_ptr<const Head> head_;
};

TEST_P(EmbeddingTest, GatherRowsReturnsTheHeadsRowsExactly) {
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    SCOPED_TRACE(DTypeName(dtype));
    MakeHead(dtype);
    const int64_t h = problem_.spec.hidden_size;
    std::vector<int32_t> ids = Ids(53, problem_.seed);
    for (DType out : {dtype, DType::kF32}) {
      std::string bytes(ids.size() * h * DTypeSize(out), '\xAB');
      absl::Status status = head_->GatherRows(ids.data(), ids.size(), out, bytes.data());
      ASSERT_TRUE(status.ok()) << status;
      std::vector<float> got(ids.size() * h);
      ToFloat(out, bytes.data(), got.data(), got.size());
      for (size_t i = 0; i < ids.size(); ++i) {
        for (int64_t c = 0; c < h; ++c) {
          ASSERT_EQ(got[i * h + c], problem_.weight[ids[i] * h + c]) << "row " << i;
        }
      }
    }
  }
}

TEST_P(EmbeddingTest, GatherRowsRefusesIdsOutsideTheVocabulary) {
  MakeHead(DType::kBF16);
  std::vector<int32_t> ids = {3, static_cast<int32_t>(problem_.spec.vocab_size), 5};
  std::string out(ids.size() * problem_.spec.hidden_size * 4, '\0');
  absl::Status status = head_->GatherRows(ids.data(), ids.size(), DType::kF32, out.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("token id 131 at index 1"), std::string::npos) << status;
  ids = {-1};
  status = head_->GatherRows(ids.data(), 1, DType::kF32, out.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  ids = {3};  // a valid id, but fp16 is neither the head's dtype nor fp32
  EXPECT_EQ(head_->GatherRows(ids.data(), 1, DType::kF16, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(EmbeddingTest, ScatterAddRowsSumsRepeatedIds) {
  MakeHead(DType::kBF16, /*has_bias=*/true);
  const int64_t v = problem_.spec.vocab_size, h = problem_.spec.hidden_size;
  for (DType rows_dtype : {DType::kF32, DType::kBF16}) {
    for (bool deterministic : {false, true}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(rows_dtype) << " deterministic "
                                        << deterministic << " seed " << problem_.seed);
      const int64_t n = 300;  // every id several times
      std::vector<int32_t> ids = Ids(n, problem_.seed + 1);
      std::vector<float> rows = RandomFloats(n * h, -1.0f, 1.0f, problem_.seed + 2);
      RoundTo(rows_dtype, rows.data(), rows.size());
      std::string bytes(n * h * DTypeSize(rows_dtype), '\0');
      FromFloat(rows_dtype, rows.data(), bytes.data(), rows.size());
      auto grad = engine_->NewGradBuffer(HeadSpecOf(problem_));
      ASSERT_TRUE(grad.ok());
      // Added on top of an existing gradient, twice.
      std::vector<double> want(v * h, 0.0);
      for (int round = 0; round < 2; ++round) {
        ASSERT_TRUE(
            (*grad)->ScatterAddRows(ids.data(), n, bytes.data(), rows_dtype, deterministic).ok());
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t c = 0; c < h; ++c) want[ids[i] * h + c] += rows[i * h + c];
        }
      }
      auto got = ReadGradWeight(**grad, DType::kF32);
      ASSERT_TRUE(got.ok());
      EXPECT_LE(RelativeError(*got, want), 1e-6);
      auto bias = ReadGradBias(**grad, DType::kF32);
      ASSERT_TRUE(bias.ok());
      for (double b : *bias) ASSERT_EQ(b, 0.0) << "the bias has no embedding gradient";
      if (deterministic) {
        auto again = engine_->NewGradBuffer(HeadSpecOf(problem_));
        ASSERT_TRUE(again.ok());
        for (int round = 0; round < 2; ++round) {
          ASSERT_TRUE((*again)->ScatterAddRows(ids.data(), n, bytes.data(), rows_dtype, true).ok());
        }
        EXPECT_EQ(*ReadGradWeight(**again, DType::kF32), *got) << "not bitwise repeatable";
      }
    }
  }
  auto grad = engine_->NewGradBuffer(HeadSpecOf(problem_));
  std::vector<int32_t> bad = {static_cast<int32_t>(v)};
  std::vector<float> row(h, 1.0f);
  EXPECT_EQ((*grad)->ScatterAddRows(bad.data(), 1, row.data(), DType::kF32, false).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ReadGradWeight(**grad, DType::kF32), std::vector<double>(v * h, 0.0))
      << "a refused scatter wrote something";
}

// What a checkpoint restores: every state tensor written back and read
// again, the served weight following the master, the step count.
TEST_P(EmbeddingTest, WriteStateRestoresMasterMomentsAndSteps) {
  MakeHead(DType::kBF16, /*has_bias=*/true);
  OptimizerConfig config;
  config.kind = OptimizerKind::kAdamW;
  config.weight.amsgrad = true;
  config.bias = config.weight;
  auto optimizer = engine_->CreateOptimizer(head_, config);
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  const int64_t v = problem_.spec.vocab_size, h = problem_.spec.hidden_size;
  uint64_t seed = problem_.seed;
  for (HeadTensor group : {HeadTensor::kWeight, HeadTensor::kBias}) {
    const int64_t n = group == HeadTensor::kWeight ? v * h : v;
    for (OptimizerTensor t : {OptimizerTensor::kMaster, OptimizerTensor::kMomentum,
                              OptimizerTensor::kSecondMoment, OptimizerTensor::kMaxSecondMoment}) {
      std::vector<float> values = RandomFloats(n, 0.0f, 0.5f, ++seed);
      ASSERT_TRUE((*optimizer)->WriteState(group, t, 0, n, values.data()).ok());
      std::vector<float> back(n, std::numeric_limits<float>::quiet_NaN());
      ASSERT_TRUE((*optimizer)->ReadState(group, t, 0, n, back.data()).ok());
      EXPECT_EQ(back, values) << HeadTensorName(group) << " "
                              << OptimizerTensorName(config.kind, t);
      if (t == OptimizerTensor::kMaster) {
        std::string served(n * 2, '\0'), want(n * 2, '\0');
        ASSERT_TRUE(head_->CopyOut(group, 0, n, served.data()).ok());
        FromFloat(DType::kBF16, values.data(), want.data(), n);
        EXPECT_EQ(served, want) << "the served weight does not follow its master";
      }
    }
  }
  float x = 0.0f;
  EXPECT_EQ((*optimizer)->WriteState(HeadTensor::kBias, OptimizerTensor::kMaster, v, 1, &x).code(),
            absl::StatusCode::kOutOfRange);
  (*optimizer)->set_steps(41);
  EXPECT_EQ((*optimizer)->steps(), 41);
}

std::vector<EngineParam> OneParamPerEngine() {
  return {{"cpu", Strategy::kAuto},
          {"cuda", Strategy::kAuto},
          {"cuda_shards2", Strategy::kAuto},
          {"cuda_shards3", Strategy::kAuto}};
}

INSTANTIATE_TEST_SUITE_P(AllEngines, EmbeddingTest, ::testing::ValuesIn(OneParamPerEngine()),
                         TestParamName);

}  // namespace
}  // namespace flce::test
