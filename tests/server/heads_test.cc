// LoadHeadFromFile: .safetensors under --head-root (dtype conversion, bias,
// missing tensors) and everything outside it refused.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/server/server_test_util.h"
#include "tests/support/reference_f64.h"

namespace flce::server::test {
namespace {

using ::flce::test::ComputeReference;
using ::flce::test::MakeProblem;
using ::flce::test::MakeReferenceInput;
using ::flce::test::RelativeError;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

struct Tensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

void WriteSafetensors(const fs::path& path, const std::vector<Tensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}};
  int64_t offset = 0;
  std::string data;
  for (const Tensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + static_cast<int64_t>(t.bytes.size())}}};
    offset += static_cast<int64_t>(t.bytes.size());
    data += t.bytes;
  }
  std::string json = header.dump();
  uint64_t n = json.size();
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << json << data;
}

class HeadsTest : public ServerTest {
 protected:
  void SetUp() override {
    base_ = fs::temp_directory_path() / absl::StrCat("flce-heads-", getpid(), "-", counter_++);
    root_ = base_ / "root";
    fs::create_directories(root_ / "sub");
    ServerConfig config = TestConfig();
    config.head_root = root_.string();
    StartServer(config);
  }
  void TearDown() override {
    ServerTest::TearDown();
    fs::remove_all(base_);
  }

  grpc::Status Load(const std::string& path, const std::string& weight, const std::string& bias,
                    v1::DType dtype, v1::HeadInfo* info) {
    grpc::ClientContext context;
    v1::LoadHeadFromFileRequest request;
    request.set_head_id("f");
    request.set_path(path);
    request.set_weight_tensor(weight);
    request.set_bias_tensor(bias);
    request.set_dtype(dtype);
    return stub().LoadHeadFromFile(&context, request, info);
  }

  static inline int counter_ = 0;
  fs::path base_;
  fs::path root_;
};

TEST_F(HeadsTest, LoadsBf16FileAsFp32WithBiasAndComputesLikeTheReference) {
  ProblemSpec ps;
  ps.vocab_size = 61;
  ps.hidden_size = 12;
  ps.num_tokens = 30;
  ps.head_dtype = DType::kBF16;  // values representable in bf16: exact in both dtypes
  ps.hidden_dtype = DType::kF32;
  ps.has_bias = true;
  Problem problem = MakeProblem(ps);
  WriteSafetensors(
      root_ / "sub" / "model.safetensors",
      {{"lm_head.weight", "BF16", {ps.vocab_size, ps.hidden_size}, problem.weight_bytes},
       {"lm_head.bias", "BF16", {ps.vocab_size}, problem.bias_bytes},
       {"other", "F32", {2}, std::string(8, '\0')}});
  v1::HeadInfo info;
  grpc::Status s =
      Load("sub/model.safetensors", "lm_head.weight", "lm_head.bias", v1::DTYPE_FP32, &info);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(info.vocab_size(), 61);
  EXPECT_EQ(info.hidden_size(), 12);
  EXPECT_EQ(info.dtype(), v1::DTYPE_FP32);
  EXPECT_TRUE(info.has_bias());
  EXPECT_EQ(info.source(), "file:sub/model.safetensors");

  // The resident head is fp32 now: the reference sees the same values.
  Problem as_f32 = problem;
  as_f32.spec.head_dtype = DType::kF32;
  ComputeSpec spec;
  spec.reduction = Reduction::kSum;
  auto ref = ComputeReference(MakeReferenceInput(as_f32, spec));
  ComputeOutcome out = Compute(stub(), MakeHeader(problem, "f", "s", "r"), problem);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_NEAR(out.summary.loss(), ref.loss, 1e-5 * std::abs(ref.loss));
  EXPECT_LE(RelativeError(Doubles(out.grad_input), ref.grad_input), 1e-5);
  FetchedGrad grad = FetchGrad(stub(), "f", "s");
  EXPECT_LE(RelativeError(Doubles(grad.bias), ref.grad_bias), 1e-5);
}

TEST_F(HeadsTest, KeepsTheFileDtypeWhenUnspecified) {
  std::string bytes(7 * 3 * 2, '\0');
  WriteSafetensors(root_ / "h.safetensors", {{"w", "F16", {7, 3}, bytes}});
  v1::HeadInfo info;
  ASSERT_TRUE(Load("h.safetensors", "w", "", v1::DTYPE_UNSPECIFIED, &info).ok());
  EXPECT_EQ(info.dtype(), v1::DTYPE_FP16);
  EXPECT_EQ(info.version(), 1u);
  ASSERT_TRUE(Load("h.safetensors", "w", "", v1::DTYPE_BF16, &info).ok());
  EXPECT_EQ(info.version(), 2u) << "loading the same id again replaces it";
}

TEST_F(HeadsTest, MissingTensorListsTheAvailableOnes) {
  WriteSafetensors(root_ / "h.safetensors",
                   {{"model.embed", "F32", {4, 2}, std::string(32, '\0')},
                    {"lm_head.weight", "F32", {4, 2}, std::string(32, '\0')}});
  v1::HeadInfo info;
  grpc::Status s = Load("h.safetensors", "output.weight", "", v1::DTYPE_UNSPECIFIED, &info);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("output.weight"));
  EXPECT_THAT(s.error_message(), HasSubstr("lm_head.weight"));
  EXPECT_THAT(s.error_message(), HasSubstr("model.embed"));
  grpc::Status missing_file = Load("nope.safetensors", "w", "", v1::DTYPE_UNSPECIFIED, &info);
  EXPECT_EQ(missing_file.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(HeadsTest, RefusesEverythingOutsideTheRoot) {
  WriteSafetensors(base_ / "outside.safetensors", {{"w", "F32", {4, 2}, std::string(32, '\0')}});
  fs::create_symlink(base_ / "outside.safetensors", root_ / "link.safetensors");
  v1::HeadInfo info;
  for (const std::string& path :
       {std::string("../outside.safetensors"), (base_ / "outside.safetensors").string(),
        std::string("link.safetensors"), std::string("sub/../../outside.safetensors"),
        std::string("/etc/passwd"), std::string("../does-not-exist")}) {
    grpc::Status s = Load(path, "w", "", v1::DTYPE_UNSPECIFIED, &info);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << path << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("--head-root")) << path;
  }
  grpc::ClientContext context;
  v1::ListHeadsResponse heads;
  ASSERT_TRUE(stub().ListHeads(&context, v1::ListHeadsRequest(), &heads).ok());
  EXPECT_EQ(heads.heads_size(), 0);
}

// [2^31, 2^31] F32 is 2^64 bytes: a product that wraps to 0 matched the
// empty data_offsets and the load went on with an absurd head.
TEST_F(HeadsTest, AbsurdShapeInTheFileHeaderIsRefusedAndTheServerKeepsServing) {
  WriteSafetensors(root_ / "huge.safetensors",
                   {{"w", "F32", {int64_t{1} << 31, int64_t{1} << 31}, std::string()}});
  v1::HeadInfo info;
  grpc::Status s = Load("huge.safetensors", "w", "", v1::DTYPE_UNSPECIFIED, &info);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("does not fit in 64 bits"));
  WriteSafetensors(root_ / "ok.safetensors", {{"w", "F32", {4, 2}, std::string(32, '\0')}});
  EXPECT_TRUE(Load("ok.safetensors", "w", "", v1::DTYPE_UNSPECIFIED, &info).ok());
}

class HeadFileLimitTest : public HeadsTest {
 protected:
  void SetUp() override {
    base_ = fs::temp_directory_path() / absl::StrCat("flce-head-limit-", getpid(), "-", counter_++);
    root_ = base_ / "root";
    fs::create_directories(root_);
    ServerConfig config = TestConfig();
    config.head_root = root_.string();
    config.max_head_bytes = 1000;
    config.embedded_demo_head = false;
    StartServer(config);
  }
};

TEST_F(HeadFileLimitTest, FileHeadOverMaxHeadBytesIsRefusedBeforeItIsRead) {
  WriteSafetensors(root_ / "h.safetensors", {{"w", "F32", {64, 16}, std::string(4096, '\0')}});
  v1::HeadInfo info;
  grpc::Status s = Load("h.safetensors", "w", "", v1::DTYPE_UNSPECIFIED, &info);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("--max-head-bytes=1000"));
}

TEST_F(HeadsTest, MalformedFileIsInvalidArgument) {
  std::ofstream(root_ / "bad.safetensors", std::ios::binary) << "not a safetensors file at all";
  v1::HeadInfo info;
  grpc::Status s = Load("bad.safetensors", "w", "", v1::DTYPE_UNSPECIFIED, &info);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("header length"));
}

class NoHeadRootTest : public ServerTest {};

TEST_F(NoHeadRootTest, FileLoadsAreRefusedWithoutAHeadRoot) {
  StartServer(TestConfig());
  grpc::ClientContext context;
  v1::LoadHeadFromFileRequest request;
  request.set_head_id("f");
  request.set_path("x.safetensors");
  request.set_weight_tensor("w");
  v1::HeadInfo info;
  grpc::Status s = stub().LoadHeadFromFile(&context, request, &info);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("--head-root"));
}

}  // namespace
}  // namespace flce::server::test
