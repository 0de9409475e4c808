// When a Compute call lands, and what can never reach a session: a stream
// that ends without its end message (half-close, cancel, garbage), results
// that are not finite, unknown enum values and malformed ids, and a request
// id reused for other hidden states.
#include <cfloat>
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

class IntegrityTest : public ServerTest {
 protected:
  void SetUp() override {
    StartServer(TestConfig());
    problem_ = MakeProblem(TinyF32Spec());
    ASSERT_TRUE(UploadHead(stub(), "h", problem_).ok());
    // A session with a non-zero gradient, so "unchanged" means something.
    ComputeOutcome seed = Compute(stub(), MakeHeader(problem_, "h", "s", "seed"), problem_);
    ASSERT_TRUE(seed.status.ok()) << seed.status.error_message();
    before_ = FetchGrad(stub(), "h", "s");
    ASSERT_TRUE(before_.status.ok());
  }

  // Bit for bit the gradient of SetUp, one contribution.
  void ExpectUnchanged() {
    FetchedGrad after = FetchGrad(stub(), "h", "s");
    ASSERT_TRUE(after.status.ok());
    EXPECT_EQ(after.header.contributions(), before_.header.contributions());
    EXPECT_EQ(after.weight, before_.weight);
  }

  // The problem's hidden with every value multiplied by `scale`.
  Problem Scaled(float scale) const {
    Problem p = problem_;
    for (float& v : p.hidden) v *= scale;
    p.hidden_bytes.assign(reinterpret_cast<const char*>(p.hidden.data()), p.hidden.size() * 4);
    return p;
  }

  // The first token alone, its target set, hidden times `scale`: a gradient
  // of one outer product, so no partial sum inside the engine exceeds it.
  Problem FirstToken(float scale) const {
    Problem p = Scaled(scale);
    p.spec.num_tokens = 1;
    p.hidden.resize(p.spec.hidden_size);
    p.hidden_bytes.resize(p.spec.hidden_size * 4);
    p.targets = {3};
    return p;
  }

  Problem problem_;
  FetchedGrad before_;
};

TEST_F(IntegrityTest, HalfCloseWithoutEndLandsNothing) {
  ComputeOptions options;
  options.send_end = false;
  ComputeOutcome out = Compute(stub(), MakeHeader(problem_, "h", "s", "no-end"), problem_, options);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(),
              AllOf(HasSubstr("without an end message"), HasSubstr("20 of num_tokens = 20"),
                    HasSubstr("nothing landed")));
  EXPECT_FALSE(out.has_summary);
  ExpectUnchanged();
  // The id was not used up: the same call with its end lands once.
  ComputeOutcome retry = Compute(stub(), MakeHeader(problem_, "h", "s", "no-end"), problem_);
  ASSERT_TRUE(retry.status.ok()) << retry.status.error_message();
  EXPECT_TRUE(retry.summary.committed());
  EXPECT_FALSE(retry.summary.replayed());
}

// A client that sent every row, then cancelled before half-closing: never
// lands, however the race between the cancel and the server's reads falls.
TEST_F(IntegrityTest, CancelAfterEveryRowNeverLands) {
  for (int i = 0; i < 20; ++i) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto stream = stub().Compute(&context);
    // One id per attempt: the server may still be unwinding the previous
    // cancelled call, and a reused id in flight is refused (ABORTED) up front.
    const std::string request_id = "cancel-" + std::to_string(i);
    ASSERT_TRUE(stream->Write(HeaderMessage(MakeHeader(problem_, "h", "s", request_id))));
    ASSERT_TRUE(stream->Write(HiddenMessage(0, problem_.hidden_bytes)));
    std::this_thread::sleep_for(std::chrono::milliseconds(i));  // the server has the rows
    context.TryCancel();
    v1::ComputeResponse response;
    while (stream->Read(&response)) {
    }
    EXPECT_FALSE(stream->Finish().ok());
  }
  ASSERT_TRUE(WaitForPending(stub(), "s", 0));
  ExpectUnchanged();
}

// An undecodable message after a complete request is not an end of input.
TEST_F(IntegrityTest, GarbageAfterEveryRowLandsNothing) {
  std::string response;
  grpc::Status status = RawStream(
      channel().get(), "/flce.v1.Flce/Compute",
      {HeaderMessage(MakeHeader(problem_, "h", "s", "garbage")).SerializeAsString(),
       HiddenMessage(0, problem_.hidden_bytes).SerializeAsString(),
       std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11)},  // a varint too long
      &response);
  EXPECT_FALSE(status.ok());
  ASSERT_TRUE(WaitForPending(stub(), "s", 0));
  ExpectUnchanged();
}

// The end message is the last one: whatever follows it fails the call, and
// nothing lands, although every row and a correct end arrived before it.
TEST_F(IntegrityTest, AMessageAfterTheEndFailsTheCallAndLandsNothing) {
  struct Case {
    const char* name;
    v1::ComputeRequest after;
    const char* got;
  };
  const Case cases[] = {
      {"second end", EndMessage(20), "an end message (end.num_tokens = 20)"},
      {"hidden after end", HiddenMessage(0, problem_.hidden_bytes),
       "a hidden chunk at token_offset 0"},
      {"header after end", HeaderMessage(MakeHeader(problem_, "h", "s", "x")), "a header"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string request_id = std::string("after-end ") + c.name;
    ComputeOutcome out =
        ComputeMessages(stub(), {HeaderMessage(MakeHeader(problem_, "h", "s", request_id)),
                                 HiddenMessage(0, problem_.hidden_bytes), EndMessage(20), c.after});
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(out.status.error_message(),
                AllOf(HasSubstr("a message after the end message"), HasSubstr(c.got),
                      HasSubstr("nothing landed")));
    EXPECT_FALSE(out.has_summary);
    ExpectUnchanged();
    // The id was not used up: the same call, closed after its end, lands once.
    ComputeOutcome retry = Compute(stub(), MakeHeader(problem_, "h", "s", request_id), problem_);
    ASSERT_TRUE(retry.status.ok()) << retry.status.error_message();
    EXPECT_TRUE(retry.summary.committed());
    EXPECT_FALSE(retry.summary.replayed());
    FetchedGrad after = FetchGrad(stub(), "h", "s", /*reset=*/true, request_id + " reset");
    ASSERT_TRUE(after.status.ok());
    EXPECT_EQ(after.header.contributions(), before_.header.contributions() + 1);
    // Back to SetUp's gradient for the next case.
    ASSERT_TRUE(Compute(stub(), MakeHeader(problem_, "h", "s", request_id + " seed"), problem_)
                    .status.ok());
    before_ = FetchGrad(stub(), "h", "s");
  }
}

// A forward-only call lands nothing either way, but the rule is the same.
TEST_F(IntegrityTest, AMessageAfterTheEndFailsAForwardOnlyCall) {
  v1::ComputeHeader header = MakeHeader(problem_, "h", "s", "forward after end");
  header.mutable_outputs()->set_forward_only(true);
  ComputeOutcome out = ComputeMessages(
      stub(), {HeaderMessage(header), HiddenMessage(0, problem_.hidden_bytes), EndMessage(20),
               EndMessage(20)});
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(), HasSubstr("a message after the end message"));
  EXPECT_FALSE(out.has_summary);
}

// An undecodable message after the end is not a half-close either.
TEST_F(IntegrityTest, GarbageAfterTheEndLandsNothing) {
  std::string response;
  grpc::Status status = RawStream(
      channel().get(), "/flce.v1.Flce/Compute",
      {HeaderMessage(MakeHeader(problem_, "h", "s", "garbage-after-end")).SerializeAsString(),
       HiddenMessage(0, problem_.hidden_bytes).SerializeAsString(), EndMessage(20).SerializeAsString(),
       std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11)},  // a varint too long
      &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("does not parse as flce.v1.ComputeRequest"));
  ASSERT_TRUE(WaitForPending(stub(), "s", 0));
  ExpectUnchanged();
}

// A stream that starts with anything but a header is told what it started with.
TEST_F(IntegrityTest, AFirstMessageOtherThanAHeaderIsNamed) {
  ComputeOutcome out = ComputeMessages(stub(), {EndMessage(20)});
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(),
              HasSubstr("first message must be a header (got an end message (end.num_tokens = 20))"));
  ExpectUnchanged();
}

TEST_F(IntegrityTest, EndMustCountEveryToken) {
  ComputeOutcome out = ComputeMessages(
      stub(), {HeaderMessage(MakeHeader(problem_, "h", "s", "short-end")),
               HiddenMessage(0, problem_.hidden_bytes), EndMessage(19)});
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(), HasSubstr("end.num_tokens = 19"));
  ExpectUnchanged();
}

TEST_F(IntegrityTest, OptionsOutsideTheirRangesAreRefusedUpFront) {
  struct Case {
    std::function<void(v1::ComputeHeader&)> set;
    const char* names;
  };
  const float huge = 3e38f;
  const std::string huge_weights = [&] {
    std::vector<float> w(problem_.spec.num_tokens, 1.0f);
    w[3] = huge;
    return std::string(reinterpret_cast<const char*>(w.data()), w.size() * 4);
  }();
  for (const Case& c : std::vector<Case>{
           {[](v1::ComputeHeader& h) { h.mutable_options()->set_temperature(1e-38f); },
            "options.temperature"},
           {[](v1::ComputeHeader& h) { h.mutable_options()->set_temperature(1e9f); },
            "options.temperature"},
           {[&](v1::ComputeHeader& h) { h.mutable_options()->set_grad_scale(huge); },
            "options.grad_scale"},
           {[](v1::ComputeHeader& h) { h.mutable_options()->set_softcap(1e-30f); },
            "options.softcap"},
           {[](v1::ComputeHeader& h) { h.mutable_options()->set_z_loss_scale(1e30f); },
            "options.z_loss_scale"},
           {[&](v1::ComputeHeader& h) { h.set_token_weights(huge_weights); }, "token_weights[3]"},
           {[&](v1::ComputeHeader& h) { h.set_entropy_weights(huge_weights); },
            "entropy_weights[3]"},
       }) {
    v1::ComputeHeader header = MakeHeader(problem_, "h", "s", "range");
    header.set_reduction(v1::REDUCTION_NONE);
    c.set(header);
    ComputeOutcome out = Compute(stub(), header, problem_);
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.names;
    EXPECT_THAT(out.status.error_message(), AllOf(HasSubstr(c.names), HasSubstr("outside")));
  }
  ExpectUnchanged();
}

// Inputs inside every range whose results still overflow: nothing lands, and
// the status names the output.
TEST_F(IntegrityTest, NonFiniteLossLandsNothing) {
  // Finite hidden (~1e36) at the lowest accepted temperature: z = r / tau
  // overflows fp32.
  Problem huge = Scaled(1e36f);
  v1::ComputeHeader header = MakeHeader(huge, "h", "s", "nan-loss");
  header.mutable_options()->set_temperature(1e-3f);
  ComputeOutcome out = Compute(stub(), header, huge);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(),
              AllOf(HasSubstr("grad_input holds NaN or Inf"), HasSubstr("nothing landed")));
  EXPECT_FALSE(out.has_summary);
  ExpectUnchanged();

  // Without grad_input the loss itself is what is refused.
  header.set_request_id("nan-loss-eval");
  header.mutable_outputs()->set_forward_only(true);
  out = Compute(stub(), header, huge);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(), AllOf(HasSubstr("loss = "), HasSubstr("not finite")));
  EXPECT_FALSE(out.has_summary);
  ExpectUnchanged();
}

TEST_F(IntegrityTest, NonFiniteGradWContributionLandsNothing) {
  // Loss and grad_input stay finite (~1e31 and ~1e24); grad_W = dlogits x h
  // reaches ~1e43.
  Problem big = Scaled(1e19f);
  v1::ComputeHeader header = MakeHeader(big, "h", "s", "inf-grad-w");
  header.mutable_options()->set_grad_scale(1e12f);
  std::vector<float> weights(big.spec.num_tokens, 1e12f);
  header.set_token_weights(std::string(reinterpret_cast<const char*>(weights.data()),
                                       weights.size() * 4));
  ComputeOutcome out = Compute(stub(), header, big);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(),
              AllOf(HasSubstr("grad_W"), HasSubstr("NaN or Inf"), HasSubstr("nothing landed")));
  ExpectUnchanged();

  // Deferred: refused before it is staged, so Commit finds nothing.
  header.set_request_id("inf-grad-w-deferred");
  header.set_commit(v1::COMMIT_DEFERRED);
  out = Compute(stub(), header, big);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(), HasSubstr("grad_W"));
  EXPECT_EQ(Commit(stub(), "h", "s", "inf-grad-w-deferred", 1.0f, false).error_code(),
            grpc::StatusCode::NOT_FOUND);
  ExpectUnchanged();
}

TEST_F(IntegrityTest, FiniteContributionsWhoseSumOverflowsLeaveTheAccumulator) {
  // Probe the gradient's largest element, then scale two calls so that each
  // is 0.6 x FLT_MAX there: the first lands, the second would overflow.
  Problem big = FirstToken(1e27f);
  ASSERT_TRUE(Compute(stub(), MakeHeader(big, "h", "probe", "p"), big).status.ok());
  FetchedGrad probe = FetchGrad(stub(), "h", "probe");
  ASSERT_TRUE(probe.status.ok());
  float g = 0.0f;
  for (float v : probe.weight) g = std::max(g, std::abs(v));
  ASSERT_TRUE(std::isfinite(g) && g > 0.0f);
  const float scale = 0.6f * FLT_MAX / g;
  ASSERT_LE(scale, 1e12f) << "grad_scale must stay inside its accepted range";

  v1::ComputeHeader header = MakeHeader(big, "h", "s2", "first");
  header.mutable_options()->set_grad_scale(scale);
  ComputeOutcome first = Compute(stub(), header, big);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  FetchedGrad landed = FetchGrad(stub(), "h", "s2");
  header.set_request_id("second");
  ComputeOutcome second = Compute(stub(), header, big);
  EXPECT_EQ(second.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(second.status.error_message(),
              AllOf(HasSubstr("grad_W"), HasSubstr("overflows"), HasSubstr("unchanged")));
  FetchedGrad after = FetchGrad(stub(), "h", "s2");
  EXPECT_EQ(after.weight, landed.weight);
  EXPECT_EQ(after.header.contributions(), 1);

  // The same through Commit: the staged contribution x scale overflows the sum.
  header.set_request_id("deferred");
  header.set_commit(v1::COMMIT_DEFERRED);
  ASSERT_TRUE(Compute(stub(), header, big).status.ok());
  v1::CommitResponse response;
  grpc::Status commit = Commit(stub(), "h", "s2", "deferred", 1.0f, false, &response);
  EXPECT_EQ(commit.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(commit.error_message(), AllOf(HasSubstr("overflows"), HasSubstr("dropped")));
  after = FetchGrad(stub(), "h", "s2");
  EXPECT_EQ(after.weight, landed.weight);
  ASSERT_TRUE(Commit(stub(), "h", "s2", "deferred", 1.0f, false, &response).ok());
  EXPECT_EQ(response.state(), v1::CONTRIBUTION_DISCARDED);
  EXPECT_TRUE(response.replayed());
}

TEST_F(IntegrityTest, UnknownEnumValuesAreRefusedByName) {
  v1::ComputeHeader header = MakeHeader(problem_, "h", "s", "enum");
  header.set_commit(static_cast<v1::CommitMode>(5));
  ComputeOutcome out = Compute(stub(), header, problem_);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(),
              AllOf(HasSubstr("commit = 5"), HasSubstr("COMMIT_DEFERRED")));

  header = MakeHeader(problem_, "h", "s", "enum");
  header.set_hidden_dtype(static_cast<v1::DType>(7));
  out = Compute(stub(), header, problem_);
  EXPECT_THAT(out.status.error_message(), HasSubstr("hidden_dtype = 7 is not one of"));

  header = MakeHeader(problem_, "h", "s", "enum");
  header.set_hidden_dtype(v1::DTYPE_UNSPECIFIED);
  out = Compute(stub(), header, problem_);
  EXPECT_THAT(out.status.error_message(), HasSubstr("hidden_dtype = DTYPE_UNSPECIFIED (0)"));

  header = MakeHeader(problem_, "h", "s", "enum");
  header.set_reduction(static_cast<v1::Reduction>(9));
  out = Compute(stub(), header, problem_);
  EXPECT_THAT(out.status.error_message(), HasSubstr("reduction = 9 is not one of REDUCTION_MEAN"));
  ExpectUnchanged();
}

TEST_F(IntegrityTest, MalformedRequestIdsAreRefused) {
  for (const std::string& id :
       {std::string(300, 'r'), std::string(64 << 10, 'r'), std::string("two\nlines")}) {
    ComputeOutcome out = Compute(stub(), MakeHeader(problem_, "h", "s", id), problem_);
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(out.status.error_message(), HasSubstr("request_id"));
  }
  ExpectUnchanged();
}

TEST_F(IntegrityTest, EveryStringFieldIsBounded) {
  {
    grpc::ClientContext context;
    v1::DescribeHeadRequest request;
    request.set_head_id(std::string(64 << 10, 'h'));
    v1::HeadInfo info;
    grpc::Status s = stub().DescribeHead(&context, request, &info);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("head_id is 65536 bytes long"));
  }
  {
    grpc::ClientContext context;
    v1::LoadHeadFromFileRequest request;
    request.set_head_id("file");
    request.set_path(std::string(5000, 'p'));
    request.set_weight_tensor("lm_head.weight");
    v1::HeadInfo info;
    grpc::Status s = stub().LoadHeadFromFile(&context, request, &info);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("path is 5000 bytes long"));
  }
  {
    grpc::ClientContext context;
    v1::LoadHeadFromFileRequest request;
    request.set_head_id("file");
    request.set_path("w.safetensors");
    request.set_weight_tensor("lm_head\nweight");
    v1::HeadInfo info;
    grpc::Status s = stub().LoadHeadFromFile(&context, request, &info);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("weight_tensor holds a control character"));
  }
  FetchedGrad fetch = FetchGrad(stub(), "h", "s", true, "reset\nid");
  EXPECT_EQ(fetch.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(fetch.status.error_message(), HasSubstr("request_id"));
  ExpectUnchanged();
}

TEST_F(IntegrityTest, ReusedRequestIdWithOtherHiddenIsRefused) {
  // The same rows in another chunking and order are the same call: a replay.
  ComputeOptions other_chunks;
  other_chunks.rows_per_chunk = 3;
  ComputeOutcome replay =
      Compute(stub(), MakeHeader(problem_, "h", "s", "seed"), problem_, other_chunks);
  ASSERT_TRUE(replay.status.ok()) << replay.status.error_message();
  EXPECT_TRUE(replay.summary.replayed());

  // Other rows under the same id and header: refused once they have arrived.
  Problem other = Scaled(0.5f);
  ComputeOutcome reused = Compute(stub(), MakeHeader(other, "h", "s", "seed"), other);
  EXPECT_EQ(reused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(reused.status.error_message(),
              AllOf(HasSubstr("\"seed\""), HasSubstr("other hidden states")));
  EXPECT_FALSE(reused.has_summary);

  // Two rows swapped: same bytes overall, other tokens.
  Problem swapped = problem_;
  const int64_t row = problem_.spec.hidden_size * 4;
  std::string a = swapped.hidden_bytes.substr(0, row);
  swapped.hidden_bytes.replace(0, row, swapped.hidden_bytes.substr(row, row));
  swapped.hidden_bytes.replace(row, row, a);
  reused = Compute(stub(), MakeHeader(swapped, "h", "s", "seed"), swapped);
  EXPECT_EQ(reused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ExpectUnchanged();
}

}  // namespace
}  // namespace flce::server::test
