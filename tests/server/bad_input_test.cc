// Every bad input of the v1 API: the status code, a message naming the
// problem, the session's grad_W untouched, and the server still serving.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/server_test_util.h"

namespace flce::server::test {
namespace {

using ::flce::test::MakeProblem;
using ::testing::AllOf;
using ::testing::HasSubstr;

class BadInputTest : public ServerTest {
 protected:
  void SetUp() override {
    StartServer(TestConfig());
    problem_ = MakeProblem(TinyF32Spec());
    row_bytes_ = problem_.spec.hidden_size * 4;
    ASSERT_TRUE(UploadHead(stub(), "h", problem_).ok());
    // A session with a non-zero gradient, so "unchanged" means something.
    ComputeOutcome seed = Compute(stub(), MakeHeader(problem_, "h", "s", "seed"), problem_);
    ASSERT_TRUE(seed.status.ok()) << seed.status.error_message();
    before_ = FetchGrad(stub(), "h", "s");
    ASSERT_TRUE(before_.status.ok());
  }

  // grad_W unchanged, nothing pending, and a good call still works.
  void ExpectUntouchedAndServing() {
    for (int i = 0; i < 100; ++i) {  // a failed call's worker cleans up just after
      grpc::ClientContext context;
      v1::ListSessionsResponse sessions;
      ASSERT_TRUE(stub().ListSessions(&context, v1::ListSessionsRequest(), &sessions).ok());
      bool pending = false;
      for (const auto& session : sessions.sessions()) pending |= session.pending() > 0;
      if (!pending) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FetchedGrad after = FetchGrad(stub(), "h", "s");
    ASSERT_TRUE(after.status.ok());
    EXPECT_EQ(after.weight, before_.weight);
    EXPECT_EQ(after.header.contributions(), before_.header.contributions());
    ComputeOutcome good = Compute(
        stub(), MakeHeader(problem_, "h", "other", "good-" + std::to_string(++n_)), problem_);
    EXPECT_TRUE(good.status.ok()) << good.status.error_message();
  }

  std::string Rows(int64_t begin, int64_t rows) const {
    return problem_.hidden_bytes.substr(begin * row_bytes_, rows * row_bytes_);
  }

  // The whole problem's hidden in two chunks after `header`, then the end.
  std::vector<v1::ComputeRequest> Messages(const v1::ComputeHeader& header) const {
    return {HeaderMessage(header), HiddenMessage(0, Rows(0, 10)), HiddenMessage(10, Rows(10, 10)),
            EndMessage(20)};
  }

  Problem problem_;
  int64_t row_bytes_ = 0;
  FetchedGrad before_;
  int n_ = 0;
};

TEST_F(BadInputTest, NoHeaderFirst) {
  ComputeOutcome out = ComputeMessages(stub(), {HiddenMessage(0, Rows(0, 5))});
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(), HasSubstr("first message must be a header"));
  ExpectUntouchedAndServing();
}

TEST_F(BadInputTest, EmptyStream) {
  ComputeOutcome out = ComputeMessages(stub(), {});
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(), HasSubstr("first message must be a header"));
  ExpectUntouchedAndServing();
}

TEST_F(BadInputTest, TargetAtOrAboveVocab) {
  v1::ComputeHeader header = MakeHeader(problem_, "h", "s", "bad");
  std::vector<int32_t> targets = problem_.targets;
  targets[7] = 97;
  header.set_targets(
      std::string(reinterpret_cast<const char*>(targets.data()), targets.size() * 4));
  ComputeOutcome out = ComputeMessages(stub(), Messages(header));
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(),
              AllOf(HasSubstr("targets[7] = 97"), HasSubstr("[0, 97)")));
  ExpectUntouchedAndServing();
}

TEST_F(BadInputTest, NegativeTargetOtherThanIgnoreIndex) {
  v1::ComputeHeader header = MakeHeader(problem_, "h", "s", "bad");
  std::vector<int32_t> targets = problem_.targets;
  targets[3] = -1;
  header.set_targets(
      std::string(reinterpret_cast<const char*>(targets.data()), targets.size() * 4));
  ComputeOutcome out = ComputeMessages(stub(), Messages(header));
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(), HasSubstr("targets[3] = -1"));
  ExpectUntouchedAndServing();
}

TEST_F(BadInputTest, TargetsByteCountMismatch) {
  v1::ComputeHeader header = MakeHeader(problem_, "h", "s", "bad");
  header.set_targets(header.targets().substr(0, 12));
  ComputeOutcome out = ComputeMessages(stub(), Messages(header));
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(),
              AllOf(HasSubstr("targets has 12 bytes"), HasSubstr("80")));
  ExpectUntouchedAndServing();
}

TEST_F(BadInputTest, UnknownHead) {
  ComputeOutcome out = ComputeMessages(stub(), Messages(MakeHeader(problem_, "nohead", "s", "x")));
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(out.status.error_message(), HasSubstr("\"nohead\""));
  ExpectUntouchedAndServing();
}

TEST_F(BadInputTest, UnknownSession) {
  FetchedGrad fetch = FetchGrad(stub(), "h", "nosession");
  EXPECT_EQ(fetch.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(fetch.status.error_message(), HasSubstr("\"nosession\""));
  grpc::Status commit = Commit(stub(), "h", "nosession", "r", 1.0f, false);
  EXPECT_EQ(commit.error_code(), grpc::StatusCode::NOT_FOUND);
  // ZeroGrad of a session that does not exist yet is not an error (consistency_test.cc).
  ExpectUntouchedAndServing();
}

TEST_F(BadInputTest, OverlappingChunks) {
  ComputeOutcome out =
      ComputeMessages(stub(), {HeaderMessage(MakeHeader(problem_, "h", "s", "bad")),
                               HiddenMessage(0, Rows(0, 10)), HiddenMessage(8, Rows(8, 12))});
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(), AllOf(HasSubstr("rows [8, 20) overlap rows [0, 10)")));
  ExpectUntouchedAndServing();
}

TEST_F(BadInputTest, MissingChunks) {
  ComputeOutcome out =
      ComputeMessages(stub(), {HeaderMessage(MakeHeader(problem_, "h", "s", "bad")),
                               HiddenMessage(0, Rows(0, 10)), HiddenMessage(15, Rows(15, 5)),
                               EndMessage(20)});
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(), AllOf(HasSubstr("received 15 of num_tokens = 20"),
                                                HasSubstr("first missing row 10")));
  ExpectUntouchedAndServing();
}

TEST_F(BadInputTest, OutOfRangeChunk) {
  ComputeOutcome out = ComputeMessages(
      stub(),
      {HeaderMessage(MakeHeader(problem_, "h", "s", "bad")), HiddenMessage(15, Rows(0, 10))});
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(),
              HasSubstr("rows [15, 25) are outside [0, num_tokens = 20)"));
  ExpectUntouchedAndServing();
}

TEST_F(BadInputTest, ChunkNotAMultipleOfARow) {
  ComputeOutcome out =
      ComputeMessages(stub(), {HeaderMessage(MakeHeader(problem_, "h", "s", "bad")),
                               HiddenMessage(0, Rows(0, 2).substr(0, row_bytes_ + 3))});
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(), HasSubstr("not a positive multiple of a row's 64 bytes"));
  ExpectUntouchedAndServing();
}

TEST_F(BadInputTest, NaNInHiddenNamesTheToken) {
  std::string rows = Rows(10, 10);
  float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(rows.data() + (3 * 16 + 5) * 4, &nan, 4);  // token 13, element 5
  ComputeOutcome out =
      ComputeMessages(stub(), {HeaderMessage(MakeHeader(problem_, "h", "s", "bad")),
                               HiddenMessage(0, Rows(0, 10)), HiddenMessage(10, rows)});
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(), AllOf(HasSubstr("token 13"), HasSubstr("element 5")));
  ExpectUntouchedAndServing();
}

TEST_F(BadInputTest, InfInHiddenNamesTheToken) {
  std::string rows = Rows(0, 10);
  float inf = -std::numeric_limits<float>::infinity();
  std::memcpy(rows.data() + (4 * 16) * 4, &inf, 4);  // token 4
  ComputeOutcome out =
      ComputeMessages(stub(), {HeaderMessage(MakeHeader(problem_, "h", "s", "bad")),
                               HiddenMessage(0, rows), HiddenMessage(10, Rows(10, 10))});
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(), HasSubstr("token 4"));
  ExpectUntouchedAndServing();
}

TEST_F(BadInputTest, HeaderTwice) {
  v1::ComputeHeader header = MakeHeader(problem_, "h", "s", "bad");
  ComputeOutcome out = ComputeMessages(
      stub(), {HeaderMessage(header), HiddenMessage(0, Rows(0, 10)), HeaderMessage(header)});
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(), HasSubstr("header sent twice"));
  ExpectUntouchedAndServing();
}

TEST_F(BadInputTest, ExpectedHeadVersionMismatch) {
  v1::ComputeHeader header = MakeHeader(problem_, "h", "s", "bad");
  header.set_expected_head_version(7);
  ComputeOutcome out = ComputeMessages(stub(), Messages(header));
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(out.status.error_message(), AllOf(HasSubstr("version 1"), HasSubstr("= 7")));
  ExpectUntouchedAndServing();
}

TEST_F(BadInputTest, BadOptionsAndWeights) {
  v1::ComputeHeader header = MakeHeader(problem_, "h", "s", "bad");
  header.mutable_options()->set_temperature(0.0f);
  ComputeOutcome out = ComputeMessages(stub(), Messages(header));
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(), HasSubstr("options.temperature = 0"));

  header = MakeHeader(problem_, "h", "s", "bad");
  header.set_token_weights(std::string(12, '\0'));
  out = ComputeMessages(stub(), Messages(header));
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(), HasSubstr("token_weights has 12 bytes"));

  header = MakeHeader(problem_, "h", "s", "bad");
  header.set_hidden_dtype(v1::DTYPE_UNSPECIFIED);
  out = ComputeMessages(stub(), Messages(header));
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(), HasSubstr("hidden_dtype"));
  ExpectUntouchedAndServing();
}

TEST_F(BadInputTest, RepeatOfACallInFlightIsAborted) {
  ComputeOptions options;
  options.pause_after_chunks = 1;
  ComputeOutcome repeat;
  options.on_pause = [&] {
    ASSERT_TRUE(WaitForPending(stub(), "s", 1));  // the first call holds the id
    repeat = ComputeMessages(stub(), Messages(MakeHeader(problem_, "h", "s", "twice")));
  };
  ComputeOutcome first =
      Compute(stub(), MakeHeader(problem_, "h", "s", "twice"), problem_, options);
  EXPECT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(repeat.status.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(repeat.status.error_message(), HasSubstr("\"twice\" is still in flight"));
}

// Uploads: byte counts must match V x H x dtype exactly.
grpc::Status UploadRaw(v1::Flce::Stub& stub, const std::vector<v1::UploadHeadRequest>& messages) {
  grpc::ClientContext context;
  v1::HeadInfo info;
  auto writer = stub.UploadHead(&context, &info);
  for (const auto& m : messages) {
    if (!writer->Write(m)) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

v1::UploadHeadRequest UploadHeader(const std::string& id, int64_t v, int64_t h, bool bias = false) {
  v1::UploadHeadRequest r;
  r.mutable_header()->set_head_id(id);
  r.mutable_header()->set_vocab_size(v);
  r.mutable_header()->set_hidden_size(h);
  r.mutable_header()->set_dtype(v1::DTYPE_FP32);
  r.mutable_header()->set_has_bias(bias);
  return r;
}

v1::UploadHeadRequest UploadChunk(v1::TensorRole role, int64_t offset, int64_t bytes) {
  v1::UploadHeadRequest r;
  r.mutable_chunk()->set_role(role);
  r.mutable_chunk()->set_byte_offset(offset);
  r.mutable_chunk()->set_data(std::string(bytes, '\0'));
  return r;
}

TEST_F(BadInputTest, UploadWithTooFewBytes) {
  grpc::Status s =
      UploadRaw(stub(), {UploadHeader("u", 10, 4), UploadChunk(v1::TENSOR_WEIGHT, 0, 100)});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), AllOf(HasSubstr("expected 160"), HasSubstr("got 100")));
  ExpectUntouchedAndServing();
}

TEST_F(BadInputTest, UploadWithTooManyBytes) {
  grpc::Status s =
      UploadRaw(stub(), {UploadHeader("u", 10, 4), UploadChunk(v1::TENSOR_WEIGHT, 0, 100),
                         UploadChunk(v1::TENSOR_WEIGHT, 100, 100)});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), AllOf(HasSubstr("expected 160"), HasSubstr("got at least 200")));
  ExpectUntouchedAndServing();
}

// A header the validation allows but no machine can hold used to end in
// std::bad_alloc, which aborted the server. The default --max-head-bytes
// refuses it before the engine is asked (the engine's own guard is
// CpuEngineTest.AbsurdHeadIsRefusedBeforeAnyAllocation).
TEST_F(BadInputTest, UploadOfAnAbsurdHeadIsRefusedAndTheServerKeepsServing) {
  grpc::Status s = UploadRaw(stub(), {UploadHeader("huge", int64_t{1} << 31, int64_t{1} << 20),
                                      UploadChunk(v1::TENSOR_WEIGHT, 0, 64)});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(),
              AllOf(HasSubstr("\"huge\" (9007199254740992 bytes)"), HasSubstr("--max-head-bytes=")));
  ExpectUntouchedAndServing();
}

TEST_F(BadInputTest, UploadBiasMissingOrOutOfOrder) {
  grpc::Status missing =
      UploadRaw(stub(), {UploadHeader("u", 10, 4, true), UploadChunk(v1::TENSOR_WEIGHT, 0, 160)});
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(missing.error_message(),
              AllOf(HasSubstr("bias bytes: expected 40"), HasSubstr("got 0")));
  grpc::Status gap =
      UploadRaw(stub(), {UploadHeader("u", 10, 4), UploadChunk(v1::TENSOR_WEIGHT, 0, 80),
                         UploadChunk(v1::TENSOR_WEIGHT, 120, 40)});
  EXPECT_EQ(gap.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(gap.error_message(), HasSubstr("byte_offset 120; expected 80"));
  grpc::Status no_header = UploadRaw(stub(), {UploadChunk(v1::TENSOR_WEIGHT, 0, 160)});
  EXPECT_EQ(no_header.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(no_header.error_message(), HasSubstr("first message must be a header"));
  // None of them created the head.
  grpc::ClientContext context;
  v1::DescribeHeadRequest describe;
  describe.set_head_id("u");
  v1::HeadInfo info;
  EXPECT_EQ(stub().DescribeHead(&context, describe, &info).error_code(),
            grpc::StatusCode::NOT_FOUND);
  ExpectUntouchedAndServing();
}

TEST_F(BadInputTest, ReplacingWithAnotherShapeWhileSessionsExist) {
  Problem other = MakeProblem([] {
    ProblemSpec ps;
    ps.vocab_size = 50;
    ps.hidden_size = 16;
    ps.head_dtype = DType::kF32;
    return ps;
  }());
  grpc::Status s = UploadHead(stub(), "h", other);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("s"));
  EXPECT_THAT(s.error_message(), HasSubstr("DeleteSession"));
  ExpectUntouchedAndServing();
}

}  // namespace
}  // namespace flce::server::test
