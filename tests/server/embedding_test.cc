// Tied embeddings through gRPC on the CPU engine: Embed returns the head's
// rows, EmbedGrad adds gradient rows into the session's grad_W under
// Compute's landing rules, and one Step applies the head's and the
// embedding's gradient together.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "flce/v1/convert.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/server_test_util.h"

namespace flce::server::test {
namespace {

using ::flce::test::MakeProblem;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Bytes(const std::vector<int32_t>& ids) {
  return std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 4);
}

struct EmbedOutcome {
  grpc::Status status;
  v1::EmbedHeader header;
  std::vector<float> rows;  // num_tokens x H
  int messages = 0;
};

class EmbeddingTest : public ServerTest {
 protected:
  void SetUp() override {
    StartServer(TestConfig());
    ProblemSpec spec = TinyF32Spec();
    spec.head_dtype = DType::kBF16;
    spec.has_bias = true;
    problem_ = MakeProblem(spec);
    ASSERT_TRUE(UploadHead(stub(), "h", problem_).ok());
  }

  EmbedOutcome Embed(const std::vector<int32_t>& ids, v1::DType dtype = v1::DTYPE_UNSPECIFIED,
                     int64_t chunk_rows = 0) {
    v1::EmbedRequest request;
    request.set_head_id("h");
    request.set_token_ids(Bytes(ids));
    request.set_dtype(dtype);
    request.set_chunk_rows(chunk_rows);
    grpc::ClientContext ctx;
    auto reader = stub().Embed(&ctx, request);
    EmbedOutcome out;
    v1::EmbedResponse response;
    DType got = DType::kF32;
    while (reader->Read(&response)) {
      if (response.has_header()) {
        out.header = response.header();
        got = *DTypeFromProto(out.header.dtype());
        out.rows.assign(out.header.num_tokens() * out.header.hidden_size(), std::nanf(""));
        continue;
      }
      ++out.messages;
      const v1::EmbedRows& rows = response.rows();
      ToFloat(got, rows.data().data(),
              out.rows.data() + rows.token_offset() * problem_.spec.hidden_size,
              rows.num_tokens() * problem_.spec.hidden_size);
    }
    out.status = reader->Finish();
    return out;
  }

  struct GradCall {
    std::string request_id;
    std::string session = "s";
    std::vector<int32_t> ids;
    std::vector<float> rows;  // fp32 rows, n x H
    std::optional<int32_t> padding_idx;
    bool deterministic = false;
    bool send_end = true;
    std::vector<v1::EmbedGradRequest> after_end;  // sent after the end message
    int64_t rows_per_chunk = 5;
  };

  grpc::Status EmbedGrad(const GradCall& call, v1::EmbedGradSummary* summary = nullptr) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::EmbedGradSummary local;
    auto writer = stub().EmbedGrad(&ctx, summary != nullptr ? summary : &local);
    const int64_t n = static_cast<int64_t>(call.ids.size()), h = problem_.spec.hidden_size;
    v1::EmbedGradRequest header;
    v1::EmbedGradHeader* hd = header.mutable_header();
    hd->set_request_id(call.request_id);
    hd->set_head_id("h");
    hd->set_session_id(call.session);
    hd->set_num_tokens(n);
    hd->set_token_ids(Bytes(call.ids));
    hd->set_dtype(v1::DTYPE_FP32);
    hd->set_deterministic(call.deterministic);
    if (call.padding_idx) hd->set_padding_idx(*call.padding_idx);
    writer->Write(header);
    // Chunks in reverse order: arrival order must not matter. Rows as given,
    // which may be fewer than the ids.
    for (int64_t end = static_cast<int64_t>(call.rows.size()) / h; end > 0;
         end -= call.rows_per_chunk) {
      const int64_t begin = std::max<int64_t>(0, end - call.rows_per_chunk);
      v1::EmbedGradRequest chunk;
      chunk.mutable_rows()->set_token_offset(begin);
      chunk.mutable_rows()->set_data(std::string(
          reinterpret_cast<const char*>(call.rows.data() + begin * h), (end - begin) * h * 4));
      writer->Write(chunk);
    }
    if (call.send_end) {
      v1::EmbedGradRequest end;
      end.mutable_end()->set_num_tokens(n);
      writer->Write(end);
    }
    for (const v1::EmbedGradRequest& message : call.after_end) writer->Write(message);
    writer->WritesDone();
    return writer->Finish();
  }

  GradCall RandomCall(const std::string& request_id, int64_t n, uint64_t seed) {
    GradCall call;
    call.request_id = request_id;
    std::mt19937 rng(static_cast<uint32_t>(seed));
    for (int64_t i = 0; i < n; ++i) {
      call.ids.push_back(static_cast<int32_t>(rng() % problem_.spec.vocab_size));
    }
    call.ids[1] = call.ids[0];  // a repeat
    call.rows = flce::test::RandomFloats(n * problem_.spec.hidden_size, -1.0f, 1.0f, seed);
    return call;
  }

  // The float64 scatter of a call, rows of padding_idx left out.
  std::vector<double> Reference(const GradCall& call) const {
    const int64_t h = problem_.spec.hidden_size;
    std::vector<double> out(problem_.spec.vocab_size * h, 0.0);
    for (size_t i = 0; i < call.ids.size(); ++i) {
      if (call.padding_idx && call.ids[i] == *call.padding_idx) continue;
      for (int64_t c = 0; c < h; ++c) out[call.ids[i] * h + c] += call.rows[i * h + c];
    }
    return out;
  }

  Problem problem_;
};

TEST_F(EmbeddingTest, EmbedReturnsTheHeadsRows) {
  std::vector<int32_t> ids = {5, 0, 96, 5, 17, 3, 3};
  for (v1::DType dtype : {v1::DTYPE_UNSPECIFIED, v1::DTYPE_FP32}) {
    EmbedOutcome out = Embed(ids, dtype, /*chunk_rows=*/3);
    ASSERT_TRUE(out.status.ok()) << out.status.error_message();
    EXPECT_EQ(out.header.dtype(), dtype == v1::DTYPE_FP32 ? v1::DTYPE_FP32 : v1::DTYPE_BF16);
    EXPECT_EQ(out.messages, 3);
    const int64_t h = problem_.spec.hidden_size;
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int64_t c = 0; c < h; ++c) {
        ASSERT_EQ(out.rows[i * h + c], problem_.weight[ids[i] * h + c]) << "token " << i;
      }
    }
  }
}

TEST_F(EmbeddingTest, EmbedRefusesBadIds) {
  EmbedOutcome out = Embed({1, 97});
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(), HasSubstr("token id 97 at index 1"));
  EXPECT_EQ(Embed({-3}).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Embed({1}, v1::DTYPE_FP16).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::EmbedRequest request;
  request.set_head_id("h");
  request.set_token_ids("abc");  // not a whole int32
  grpc::ClientContext ctx;
  auto reader = stub().Embed(&ctx, request);
  v1::EmbedResponse ignored;
  while (reader->Read(&ignored)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(EmbeddingTest, EmbedGradAddsRowsIntoTheSession) {
  GradCall call = RandomCall("g1", 40, 7);
  call.padding_idx = call.ids[5];
  v1::EmbedGradSummary summary;
  ASSERT_TRUE(EmbedGrad(call, &summary).ok());
  EXPECT_TRUE(summary.committed());
  EXPECT_FALSE(summary.replayed());
  int64_t padded = 0;
  for (int32_t id : call.ids) padded += id == *call.padding_idx;
  EXPECT_EQ(summary.rows_applied(), 40 - padded);
  FetchedGrad grad = FetchGrad(stub(), "h", "s");
  ASSERT_TRUE(grad.status.ok());
  EXPECT_EQ(grad.header.contributions(), 1);
  EXPECT_LE(flce::test::RelativeError(Doubles(grad.weight), Reference(call)), 1e-6);
  for (float b : grad.bias) ASSERT_EQ(b, 0.0f);
  const int64_t h = problem_.spec.hidden_size;
  for (int64_t c = 0; c < h; ++c) {
    ASSERT_EQ(grad.weight[*call.padding_idx * h + c], 0.0f) << "padding_idx got a gradient";
  }
  // torch's negative padding_idx counts from the end.
  GradCall last = RandomCall("g2", 10, 8);
  last.ids[3] = static_cast<int32_t>(problem_.spec.vocab_size - 1);
  last.padding_idx = -1;
  ASSERT_TRUE(EmbedGrad(last, &summary).ok());
  EXPECT_EQ(summary.rows_applied(),
            10 - std::count(last.ids.begin(), last.ids.end(), problem_.spec.vocab_size - 1));
}

TEST_F(EmbeddingTest, DeterministicEmbedGradIsBitwiseRepeatable) {
  GradCall call = RandomCall("d1", 60, 9);
  call.deterministic = true;
  ASSERT_TRUE(EmbedGrad(call).ok());
  FetchedGrad first = FetchGrad(stub(), "h", "s", /*reset=*/true, "reset-1");
  call.request_id = "d2";
  call.rows_per_chunk = 7;  // other chunks, same result
  ASSERT_TRUE(EmbedGrad(call).ok());
  FetchedGrad second = FetchGrad(stub(), "h", "s");
  EXPECT_EQ(first.weight, second.weight);
}

// As for Compute: the end message is the last one; a message after it fails
// the call before anything lands, and the request id stays unused.
TEST_F(EmbeddingTest, AMessageAfterTheEndFailsEmbedGradAndLandsNothing) {
  GradCall call = RandomCall("after-end", 20, 12);
  v1::EmbedGradRequest end;
  end.mutable_end()->set_num_tokens(20);
  v1::EmbedGradRequest rows;
  rows.mutable_rows()->set_token_offset(0);
  rows.mutable_rows()->set_data(std::string(
      reinterpret_cast<const char*>(call.rows.data()), problem_.spec.hidden_size * 4));
  v1::EmbedGradRequest header;
  header.mutable_header()->set_head_id("h");
  struct Case {
    const char* name;
    v1::EmbedGradRequest after;
    const char* got;
  };
  for (const Case& c : {Case{"second end", end, "an end message (end.num_tokens = 20)"},
                        Case{"rows after end", rows, "gradient rows at token_offset 0"},
                        Case{"header after end", header, "a header"}}) {
    SCOPED_TRACE(c.name);
    call.after_end = {c.after};
    grpc::Status status = EmbedGrad(call);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(),
                AllOf(HasSubstr("a message after the end message"), HasSubstr(c.got),
                      HasSubstr("nothing landed")));
    FetchedGrad nothing = FetchGrad(stub(), "h", "s");
    if (nothing.status.ok()) {
      EXPECT_EQ(nothing.header.contributions(), 0);
      EXPECT_EQ(*std::max_element(nothing.weight.begin(), nothing.weight.end()), 0.0f);
    } else {
      EXPECT_EQ(nothing.status.error_code(), grpc::StatusCode::NOT_FOUND);
    }
  }
  // The same request id, closed right after its end, lands once.
  call.after_end.clear();
  v1::EmbedGradSummary summary;
  ASSERT_TRUE(EmbedGrad(call, &summary).ok());
  EXPECT_TRUE(summary.committed());
  EXPECT_FALSE(summary.replayed());
  EXPECT_EQ(FetchGrad(stub(), "h", "s").header.contributions(), 1);
}

// A message that does not parse after the end is not the half-close that lands.
TEST_F(EmbeddingTest, GarbageAfterTheEndLandsNothing) {
  GradCall call = RandomCall("garbage-after-end", 4, 14);
  const int64_t h = problem_.spec.hidden_size;
  v1::EmbedGradRequest header;
  v1::EmbedGradHeader* hd = header.mutable_header();
  hd->set_request_id(call.request_id);
  hd->set_head_id("h");
  hd->set_session_id("s");
  hd->set_num_tokens(4);
  hd->set_token_ids(Bytes(call.ids));
  hd->set_dtype(v1::DTYPE_FP32);
  v1::EmbedGradRequest rows;
  rows.mutable_rows()->set_token_offset(0);
  rows.mutable_rows()->set_data(
      std::string(reinterpret_cast<const char*>(call.rows.data()), 4 * h * 4));
  v1::EmbedGradRequest end;
  end.mutable_end()->set_num_tokens(4);
  std::string response;
  grpc::Status status = RawStream(
      channel().get(), "/flce.v1.Flce/EmbedGrad",
      {header.SerializeAsString(), rows.SerializeAsString(), end.SerializeAsString(),
       std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11)},  // a varint too long
      &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("does not parse as flce.v1.EmbedGradRequest"));
  FetchedGrad nothing = FetchGrad(stub(), "h", "s");
  if (nothing.status.ok()) {
    EXPECT_EQ(nothing.header.contributions(), 0);
  } else {
    EXPECT_EQ(nothing.status.error_code(), grpc::StatusCode::NOT_FOUND);
  }
}

TEST_F(EmbeddingTest, EmbedGradNamesMissingGradientRowsAndAWrongFirstMessage) {
  GradCall call = RandomCall("missing", 20, 13);
  call.rows_per_chunk = 20;
  call.ids.resize(25, 1);  // the header counts 25 tokens; 20 rows are sent
  grpc::Status missing = EmbedGrad(call);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(missing.error_message(), HasSubstr("gradient rows missing: received 20 of num_tokens = 25"));

  grpc::ClientContext ctx;
  v1::EmbedGradSummary summary;
  auto writer = stub().EmbedGrad(&ctx, &summary);
  v1::EmbedGradRequest end;
  end.mutable_end()->set_num_tokens(3);
  writer->Write(end);
  writer->WritesDone();
  grpc::Status first = writer->Finish();
  EXPECT_EQ(first.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(first.error_message(),
              HasSubstr("first message must be a header (got an end message (end.num_tokens = 3))"));
}

TEST_F(EmbeddingTest, EmbedGradLandsOnlyWithItsEndMessageAndOnce) {
  GradCall call = RandomCall("once", 20, 11);
  call.send_end = false;
  grpc::Status status = EmbedGrad(call);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("without an end message"));
  FetchedGrad nothing = FetchGrad(stub(), "h", "s");
  if (nothing.status.ok()) {
    EXPECT_EQ(nothing.header.contributions(), 0);
  } else {
    EXPECT_EQ(nothing.status.error_code(), grpc::StatusCode::NOT_FOUND);
  }
  call.send_end = true;
  v1::EmbedGradSummary summary;
  ASSERT_TRUE(EmbedGrad(call, &summary).ok());  // the retry lands
  ASSERT_TRUE(EmbedGrad(call, &summary).ok());  // the repeat does not
  EXPECT_TRUE(summary.replayed());
  EXPECT_EQ(summary.rows_applied(), 20);
  FetchedGrad grad = FetchGrad(stub(), "h", "s");
  EXPECT_EQ(grad.header.contributions(), 1);
  EXPECT_LE(flce::test::RelativeError(Doubles(grad.weight), Reference(call)), 1e-6);
  // The same id with other rows is refused, and lands nothing.
  GradCall other = call;
  other.rows[0] += 1.0f;
  status = EmbedGrad(other);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("other gradient rows"));
  // A row that is not finite.
  GradCall bad = RandomCall("nan", 8, 12);
  bad.rows[3 * problem_.spec.hidden_size + 2] = std::nanf("");
  status = EmbedGrad(bad);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("a gradient row holds NaN or Inf at token 3 (element 2)"));
  FetchedGrad after = FetchGrad(stub(), "h", "s");
  EXPECT_EQ(after.header.contributions(), 1);
  EXPECT_EQ(after.weight, grad.weight);
  // Ids outside the vocabulary and a missing request id.
  GradCall out_of_range = RandomCall("oor", 4, 13);
  out_of_range.ids[2] = 97;
  EXPECT_EQ(EmbedGrad(out_of_range).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  GradCall anonymous = RandomCall("", 4, 14);
  EXPECT_EQ(EmbedGrad(anonymous).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// A tied model's step: the head's gradient (Compute) and the embedding's
// (EmbedGrad) in one session, applied by one Step.
TEST_F(EmbeddingTest, OneStepAppliesTheHeadsAndTheEmbeddingsGradient) {
  v1::CreateOptimizerRequest create;
  create.set_head_id("h");
  create.set_kind(v1::OPTIMIZER_SGD);
  ASSERT_TRUE(CreateOptimizer(stub(), create).ok());
  ComputeOutcome compute = Compute(stub(), MakeHeader(problem_, "h", "head-only", "c"), problem_);
  ASSERT_TRUE(compute.status.ok());
  FetchedGrad head_grad = FetchGrad(stub(), "h", "head-only");
  GradCall call = RandomCall("e", 30, 21);
  ASSERT_TRUE(Compute(stub(), MakeHeader(problem_, "h", "s", "c2"), problem_).status.ok());
  ASSERT_TRUE(EmbedGrad(call).ok());
  FetchedGrad both = FetchGrad(stub(), "h", "s");
  EXPECT_EQ(both.header.contributions(), 2);
  std::vector<double> want = Reference(call);
  for (size_t i = 0; i < want.size(); ++i) want[i] += head_grad.weight[i];
  EXPECT_LE(flce::test::RelativeError(Doubles(both.weight), want), 1e-6);
  DownloadedHead before = DownloadHead(stub(), "h", true);
  v1::StepResponse step;
  ASSERT_TRUE(StepHead(stub(), "h", "s", "step", 0.5, &step).ok());
  EXPECT_EQ(step.outcome(), v1::STEP_APPLIED);
  EXPECT_EQ(step.contributions(), 2);
  DownloadedHead after = DownloadHead(stub(), "h", true);
  for (size_t i = 0; i < after.weight.size(); ++i) {
    ASSERT_EQ(after.weight[i], before.weight[i] + (-0.5f) * both.weight[i]) << i;
  }
}

}  // namespace
}  // namespace flce::server::test
