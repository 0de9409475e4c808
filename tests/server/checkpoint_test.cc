// SaveCheckpoint and LoadCheckpoint through gRPC on the CPU engine: what a
// checkpoint restores, where its file lives (one directory per tenant, no
// partial file ever under its name), and what is refused, changing nothing.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/handlers/head_checkpoint.h"
#include "tests/server/server_test_util.h"

namespace flce::server::test {
namespace {

using ::flce::test::MakeProblem;
using ::testing::HasSubstr;

class CheckpointTest : public ServerTest {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("flce-checkpoints-", getpid(), "-", counter_++);
    std::filesystem::remove_all(dir_);
    ServerConfig config = TestConfig();
    config.checkpoint_dir = dir_.string();
    StartServer(config);
    ProblemSpec spec = TinyF32Spec();
    spec.head_dtype = DType::kBF16;
    spec.has_bias = true;
    problem_ = MakeProblem(spec);
    ASSERT_TRUE(UploadHead(stub(), "h", problem_).ok());
    v1::CreateOptimizerRequest request;
    request.set_head_id("h");
    request.set_kind(v1::OPTIMIZER_ADAMW);
    request.mutable_weight()->set_amsgrad(true);
    ASSERT_TRUE(CreateOptimizer(stub(), request).ok());
  }
  void TearDown() override {
    ServerTest::TearDown();
    std::filesystem::remove_all(dir_);
  }

  void TrainStep(const std::string& id) {
    ComputeOutcome out = Compute(stub(), MakeHeader(problem_, "h", "s", id), problem_);
    ASSERT_TRUE(out.status.ok()) << out.status.error_message();
    v1::StepResponse step;
    ASSERT_TRUE(StepHead(stub(), "h", "s", id + "-step", 0.01, &step).ok());
    ASSERT_EQ(step.outcome(), v1::STEP_APPLIED);
  }

  grpc::Status Save(const std::string& name, v1::CheckpointInfo* info,
                    const std::string& request_id = "", bool overwrite = false,
                    const std::string& head_id = "h") {
    v1::SaveCheckpointRequest request;
    request.set_head_id(head_id);
    request.set_name(name);
    request.set_request_id(request_id);
    request.set_overwrite(overwrite);
    grpc::ClientContext ctx;
    return stub().SaveCheckpoint(&ctx, request, info);
  }

  grpc::Status Load(const std::string& name, v1::HeadInfo* info, bool reset = true,
                    const std::string& head_id = "h", const std::string& request_id = "") {
    v1::LoadCheckpointRequest request;
    request.set_head_id(head_id);
    request.set_name(name);
    request.set_reset_optimizer(reset);
    request.set_request_id(request_id);
    grpc::ClientContext ctx;
    return stub().LoadCheckpoint(&ctx, request, info);
  }

  v1::HeadInfo Describe(const std::string& head_id = "h") {
    v1::DescribeHeadRequest request;
    request.set_head_id(head_id);
    v1::HeadInfo info;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub().DescribeHead(&ctx, request, &info).ok());
    return info;
  }

  std::vector<std::string> Files() const {
    std::vector<std::string> out;
    if (!std::filesystem::exists(dir_)) return out;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir_)) {
      out.push_back(std::filesystem::relative(e.path(), dir_).string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  std::filesystem::path dir_;
  Problem problem_;
  static inline int counter_ = 0;
};

TEST_F(CheckpointTest, ALoadedCheckpointIsTheSavedHeadAndState) {
  TrainStep("a");
  TrainStep("b");
  v1::CheckpointInfo info;
  ASSERT_TRUE(Save("run-1.step-2", &info).ok());
  EXPECT_EQ(info.steps(), 2);
  EXPECT_TRUE(info.has_optimizer());
  const v1::HeadInfo saved = Describe();
  EXPECT_EQ(info.head_version(), saved.version());
  EXPECT_EQ(Files(), (std::vector<std::string>{"anonymous", "anonymous/run-1.step-2.safetensors"}));
  EXPECT_EQ(static_cast<int64_t>(
                std::filesystem::file_size(dir_ / "anonymous" / "run-1.step-2.safetensors")),
            info.bytes());
  DownloadedHead weight = DownloadHead(stub(), "h");
  DownloadedHead master = DownloadHead(stub(), "h", true);

  TrainStep("c");  // moves everything on
  ASSERT_NE(DownloadHead(stub(), "h", true).weight, master.weight);
  v1::HeadInfo loaded;
  ASSERT_TRUE(Load("run-1.step-2", &loaded).ok());
  EXPECT_GT(loaded.version(), saved.version());  // a version is never reused on one server
  EXPECT_EQ(loaded.optimizer().steps(), 2);
  EXPECT_EQ(loaded.optimizer().kind(), v1::OPTIMIZER_ADAMW);
  EXPECT_TRUE(loaded.optimizer().weight().amsgrad());
  EXPECT_EQ(loaded.source(), "checkpoint:run-1.step-2");
  DownloadedHead weight_again = DownloadHead(stub(), "h");
  DownloadedHead master_again = DownloadHead(stub(), "h", true);
  EXPECT_EQ(weight_again.weight, weight.weight);
  EXPECT_EQ(weight_again.bias, weight.bias);
  EXPECT_EQ(master_again.weight, master.weight);
  EXPECT_EQ(master_again.bias, master.bias);
  // The moments came back too: the same step from the same state gives the
  // same weight as before the reload.
  TrainStep("c2");
  DownloadedHead after_reload = DownloadHead(stub(), "h", true);
  ASSERT_TRUE(Load("run-1.step-2", &loaded).ok());
  TrainStep("c3");
  EXPECT_EQ(DownloadHead(stub(), "h", true).weight, after_reload.weight);
}

TEST_F(CheckpointTest, ARepeatedSaveWritesOnceAndARepeatedLoadLoadsOnce) {
  TrainStep("a");
  v1::CheckpointInfo first, again;
  ASSERT_TRUE(Save("c", &first, "save-1").ok());
  const auto written = std::filesystem::last_write_time(dir_ / "anonymous" / "c.safetensors");
  TrainStep("b");
  ASSERT_TRUE(Save("c", &again, "save-1").ok());  // no overwrite needed: nothing is written
  EXPECT_TRUE(again.replayed());
  EXPECT_EQ(again.steps(), first.steps());
  EXPECT_EQ(std::filesystem::last_write_time(dir_ / "anonymous" / "c.safetensors"), written);

  v1::HeadInfo loaded, reloaded;
  ASSERT_TRUE(Load("c", &loaded, true, "h", "load-1").ok());
  TrainStep("d");
  ASSERT_TRUE(Load("c", &reloaded, true, "h", "load-1").ok());
  EXPECT_EQ(reloaded.version(), Describe().version());
  EXPECT_EQ(reloaded.optimizer().steps(), 2) << "the repeat loaded the checkpoint again";
  // An id names one request: reused for another checkpoint, it is refused.
  EXPECT_EQ(Save("other", &again, "save-1").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "anonymous" / "other.safetensors"));
  EXPECT_EQ(Load("missing", &reloaded, true, "h", "load-1").error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(CheckpointTest, RefusalsChangeNothing) {
  TrainStep("a");
  v1::CheckpointInfo info;
  grpc::Status status = Save("../escape", &info);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("[A-Za-z0-9._-]"));
  EXPECT_EQ(Save(".hidden", &info).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Save("", &info).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Save("c", &info, "", false, "nope").error_code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(Save("c", &info).ok());
  status = Save("c", &info);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(status.error_message(), HasSubstr("overwrite"));
  EXPECT_TRUE(Save("c", &info, "", /*overwrite=*/true).ok());

  const v1::HeadInfo before = Describe();
  DownloadedHead master = DownloadHead(stub(), "h", true);
  v1::HeadInfo loaded;
  status = Load("missing", &loaded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("checkpoint \"missing\" does not exist"));
  status = Load("c", &loaded, /*reset=*/false);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("reset_optimizer"));

  // A file that is not a checkpoint, and one cut short.
  const std::filesystem::path tenant = dir_ / "anonymous";
  std::ofstream(tenant / "junk.safetensors") << "not a safetensors file at all";
  EXPECT_EQ(Load("junk", &loaded).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  std::filesystem::copy_file(tenant / "c.safetensors", tenant / "cut.safetensors");
  std::filesystem::resize_file(tenant / "cut.safetensors",
                               std::filesystem::file_size(tenant / "c.safetensors") - 100);
  status = Load("cut", &loaded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  // A plain safetensors file with the weight but none of the metadata.
  {
    std::string header = R"({"weight":{"dtype":"BF16","shape":[1,2],"data_offsets":[0,4]}})";
    std::string bytes(8, '\0');
    bytes[0] = static_cast<char>(header.size());
    std::ofstream(tenant / "plain.safetensors", std::ios::binary) << bytes << header << "abcd";
  }
  status = Load("plain", &loaded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("no metadata key \"format\""));

  const v1::HeadInfo after = Describe();
  EXPECT_EQ(after.version(), before.version());
  EXPECT_EQ(after.optimizer().steps(), before.optimizer().steps());
  EXPECT_EQ(DownloadHead(stub(), "h", true).weight, master.weight);
}

TEST_F(CheckpointTest, NoTemporaryFileIsLeftBehind) {
  TrainStep("a");
  v1::CheckpointInfo info;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Save("c", &info, "", true).ok());
  EXPECT_EQ(Files(), (std::vector<std::string>{"anonymous", "anonymous/c.safetensors"}));
}

// Each tenant saves into and loads from its own directory only.
TEST_F(CheckpointTest, TenantsDoNotSeeEachOthersCheckpoints) {
  ServerTest::TearDown();
  const std::string tokens =
      (dir_.parent_path() / absl::StrCat(dir_.filename().string(), ".tokens")).string();
  std::ofstream(tokens) << "tok-alice alice\ntok-bob bob\n";
  ServerConfig config = TestConfig();
  config.checkpoint_dir = dir_.string();
  config.auth_token_file = tokens;
  StartServer(config);
  auto as = [](grpc::ClientContext& ctx, const char* token) {
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", token));
  };
  // Alice's own head, saved as "c".
  ASSERT_TRUE(UploadHead(stub(), "h", problem_, 3, nullptr, "tok-alice").ok());
  v1::SaveCheckpointRequest save;
  save.set_head_id("h");
  save.set_name("c");
  v1::CheckpointInfo info;
  {
    grpc::ClientContext ctx;
    as(ctx, "tok-alice");
    ASSERT_TRUE(stub().SaveCheckpoint(&ctx, save, &info).ok());
  }
  EXPECT_TRUE(std::filesystem::exists(dir_ / "t-alice" / "c.safetensors"));
  v1::LoadCheckpointRequest load;
  load.set_head_id("bobs");
  load.set_name("c");
  v1::HeadInfo head;
  grpc::ClientContext ctx;
  as(ctx, "tok-bob");
  grpc::Status status = stub().LoadCheckpoint(&ctx, load, &head);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();
  std::filesystem::remove(tokens);
}

TEST(CheckpointNamesTest, TenantDirectoriesAreDistinct) {
  EXPECT_EQ(TenantDirectoryName(""), "anonymous");
  EXPECT_EQ(TenantDirectoryName("alice"), "t-alice");
  EXPECT_EQ(TenantDirectoryName("a/b"), "x-612f62");
  EXPECT_EQ(TenantDirectoryName(".."), "x-2e2e");
  EXPECT_NE(TenantDirectoryName("x-61"), TenantDirectoryName("a"));
  EXPECT_EQ(*CheckpointPath("/ck", "bob", "step-10"), "/ck/t-bob/step-10.safetensors");
  EXPECT_FALSE(CheckpointPath("/ck", "bob", "a/b").ok());
  EXPECT_FALSE(CheckpointPath("/ck", "bob", std::string(129, 'a')).ok());
}

using CheckpointConfigTest = ServerTest;

TEST_F(CheckpointConfigTest, WithoutACheckpointDirectoryCheckpointsAreRefused) {
  StartServer(TestConfig());
  Problem problem = MakeProblem(TinyF32Spec());
  ASSERT_TRUE(UploadHead(stub(), "h", problem).ok());
  v1::SaveCheckpointRequest request;
  request.set_head_id("h");
  request.set_name("c");
  v1::CheckpointInfo info;
  grpc::ClientContext ctx;
  grpc::Status status = stub().SaveCheckpoint(&ctx, request, &info);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("--checkpoint-dir"));
  v1::ServerInfo server;
  grpc::ClientContext ctx2;
  ASSERT_TRUE(stub().GetServerInfo(&ctx2, v1::ServerInfoRequest(), &server).ok());
  EXPECT_THAT(server.capabilities(), ::testing::Not(::testing::Contains("checkpoint")));
}

}  // namespace
}  // namespace flce::server::test
