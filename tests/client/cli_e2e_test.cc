// The real flce-client binary against the real flce-server binary over
// loopback (CPU engine), checked against the float64 reference of MATH.md:
// the three commands of the README (load-weight, compute, fetch-grad), the
// accumulation and reset of grad_W, a rejected request that leaves grad_W
// untouched, and every other subcommand once.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "client/cpp/npy.h"
#include "core/dtype.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/client/subprocess.h"
#include "tests/support/problem.h"
#include "tests/support/reference_f64.h"

namespace flce::test {
namespace {

#if defined(FLCE_SERVER_BIN) && defined(FLCE_CLIENT_BIN)
constexpr bool kHaveBinaries = true;
constexpr char kServerBin[] = FLCE_SERVER_BIN;
constexpr char kClientBin[] = FLCE_CLIENT_BIN;
#else
constexpr bool kHaveBinaries = false;
constexpr char kServerBin[] = "";
constexpr char kClientBin[] = "";
#endif

struct CliRun {
  int exit_code = -1;
  nlohmann::json json;
  std::string out;
  std::string err;
};

std::string Describe(const CliRun& run) {
  return "exit " + std::to_string(run.exit_code) + "\nstdout: " + run.out + "\nstderr: " + run.err;
}

std::vector<double> Scaled(const std::vector<double>& values, double scale) {
  std::vector<double> out(values);
  for (double& v : out) v *= scale;
  return out;
}

// An .npy of fp32 ('<f4') or bf16 ('<u2') values as doubles.
std::vector<double> ReadFloats(const std::string& path, std::vector<int64_t>* shape = nullptr,
                               NpyType* type = nullptr) {
  absl::StatusOr<NpyArray> array = ReadNpy(path);
  EXPECT_TRUE(array.ok()) << array.status();
  if (!array.ok()) return {};
  if (shape != nullptr) *shape = array->shape;
  if (type != nullptr) *type = array->type;
  const int64_t n = array->NumElements();
  std::vector<float> values(n);
  if (array->type == NpyType::kF32) {
    std::memcpy(values.data(), array->data.data(), n * 4);
  } else if (array->type == NpyType::kU16) {
    ToFloat(DType::kBF16, array->data.data(), values.data(), n);
  } else {
    ADD_FAILURE() << path << " has dtype " << NpyDescr(array->type);
  }
  return ToDoubles(values);
}

class CliEndToEndTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!kHaveBinaries) return;
    dir_ = new std::string(std::filesystem::temp_directory_path() /
                           ("flce_cli_e2e_" + std::to_string(getpid())));
    std::filesystem::create_directories(*dir_ + "/heads");
    std::filesystem::create_directories(*dir_ + "/scratch");
    port_ = FreePort();
    ASSERT_GT(port_, 0);
    server_ = new BackgroundProcess(
        {kServerBin, "--host", "127.0.0.1", "--port", std::to_string(port_), "--metrics-port", "0",
         "--device", "cpu", "--threads", "2", "--head-root", *dir_ + "/heads",
         "--checkpoint-dir", *dir_ + "/checkpoints", "--local-transports=shm", "--unix-socket",
         *dir_ + "/flce.sock"},
        *dir_ + "/server.log");
    ASSERT_TRUE(server_->started());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      ASSERT_TRUE(server_->Running()) << "flce-server exited:\n" << ReadFile(*dir_ + "/server.log");
      if (Cli({"--timeout-s", "2", "health"}).exit_code == 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    FAIL() << "flce-server never became healthy:\n" << ReadFile(*dir_ + "/server.log");
  }

  static void TearDownTestSuite() {
    if (server_ != nullptr) {
      // SIGTERM drains and exits 0: anything else is a server bug worth seeing.
      EXPECT_EQ(server_->Stop(30), 0) << ReadFile(*dir_ + "/server.log");
      delete server_;
      server_ = nullptr;
    }
    if (dir_ != nullptr) {
      std::filesystem::remove_all(*dir_);
      delete dir_;
      dir_ = nullptr;
    }
  }

  void SetUp() override {
    if (!kHaveBinaries) GTEST_SKIP() << "flce-server is not built in this tree";
  }

  static CliRun Cli(std::vector<std::string> args) {
    std::vector<std::string> argv = {kClientBin, "--target", "127.0.0.1:" + std::to_string(port_)};
    argv.insert(argv.end(), args.begin(), args.end());
    ProcessResult result = RunProcess(argv, *dir_ + "/scratch");
    CliRun run;
    run.exit_code = result.exit_code;
    run.out = result.out;
    run.err = result.err;
    run.json = nlohmann::json::parse(result.out, nullptr, /*allow_exceptions=*/false);
    // Exactly one JSON object, whatever happened.
    EXPECT_TRUE(run.json.is_object()) << Describe(run);
    return run;
  }

  // Runs and expects success; the JSON back.
  static nlohmann::json Ok(std::vector<std::string> args) {
    CliRun run = Cli(args);
    EXPECT_EQ(run.exit_code, 0) << Describe(run);
    EXPECT_FALSE(run.json.contains("error")) << Describe(run);
    return run.json;
  }

  std::string Path(const std::string& name) const { return *dir_ + "/" + name; }

  void WriteArray(const std::string& path, NpyType type, std::vector<int64_t> shape,
                  const void* data, size_t bytes) {
    ASSERT_TRUE(WriteNpy(path, NpyArray{type, std::move(shape),
                                        std::string(static_cast<const char*>(data), bytes)})
                    .ok());
  }

  // w.npy, h.npy (fp32), t64.npy, t32.npy (and b.npy with a bias) of problem.
  void WriteProblem(const Problem& p, const std::string& prefix) {
    const int64_t v = p.spec.vocab_size, h = p.spec.hidden_size, bt = p.spec.num_tokens;
    WriteArray(Path(prefix + "w.npy"), NpyType::kF32, {v, h}, p.weight.data(), v * h * 4);
    WriteArray(Path(prefix + "h.npy"), NpyType::kF32, {bt, h}, p.hidden.data(), bt * h * 4);
    if (!p.bias.empty()) {
      WriteArray(Path(prefix + "b.npy"), NpyType::kF32, {v}, p.bias.data(), v * 4);
    }
    std::vector<int64_t> wide(p.targets.begin(), p.targets.end());
    WriteArray(Path(prefix + "t64.npy"), NpyType::kI64, {bt}, wide.data(), bt * 8);
    WriteArray(Path(prefix + "t32.npy"), NpyType::kI32, {bt}, p.targets.data(), bt * 4);
  }

  static std::string* dir_;
  static int port_;
  static BackgroundProcess* server_;
};

std::string* CliEndToEndTest::dir_ = nullptr;
int CliEndToEndTest::port_ = 0;
BackgroundProcess* CliEndToEndTest::server_ = nullptr;

TEST_F(CliEndToEndTest, ReadmeCommandsMatchTheFloat64Reference) {
  ProblemSpec ps;  // fp32 head and hidden, V=257, H=64, 48 tokens
  ps.ignore_fraction = 0.1;
  const Problem p = MakeProblem(ps);
  SCOPED_TRACE("problem seed " + std::to_string(p.seed));
  WriteProblem(p, "rt_");
  ComputeSpec spec;
  spec.reduction = Reduction::kMean;
  const ReferenceOutput ref = ComputeReference(MakeReferenceInput(p, spec));
  const std::string w = Path("rt_w.npy"), h = Path("rt_h.npy"), gx = Path("rt_gx.npy"),
                    gw = Path("rt_gw.npy");

  const nlohmann::json head = Ok({"load-weight", "--head", "h1", "--weight", w});
  EXPECT_EQ(head["head_id"], "h1");
  EXPECT_EQ(head["vocab_size"], ps.vocab_size);
  EXPECT_EQ(head["hidden_size"], ps.hidden_size);
  EXPECT_EQ(head["dtype"], "fp32");
  EXPECT_EQ(head["has_bias"], false);

  // int64 targets.
  const nlohmann::json first = Ok({"compute", "--head", "h1", "--session", "s1", "--hidden", h,
                                   "--targets", Path("rt_t64.npy"), "--out-grad-input", gx});
  ASSERT_TRUE(first.contains("loss")) << first;
  EXPECT_NEAR(first["loss"].get<double>(), ref.loss, 1e-5 * std::abs(ref.loss));
  EXPECT_EQ(first["n_valid"], ref.n_valid);
  EXPECT_EQ(first["num_tokens"], ps.num_tokens);
  EXPECT_EQ(first["committed"], true);
  EXPECT_EQ(first["request_id"].get<std::string>().size(), 32u);
  std::vector<int64_t> shape;
  NpyType type;
  const std::vector<double> grad_input = ReadFloats(gx, &shape, &type);
  EXPECT_EQ(type, NpyType::kF32);
  EXPECT_EQ(shape, (std::vector<int64_t>{ps.num_tokens, ps.hidden_size}));
  EXPECT_LE(RelativeError(grad_input, ref.grad_input), 1e-5);

  nlohmann::json grad = Ok({"fetch-grad", "--head", "h1", "--session", "s1", "--out", gw});
  EXPECT_EQ(grad["contributions"], 1);
  EXPECT_EQ(grad["dtype"], "fp32");
  std::vector<double> grad_w = ReadFloats(gw, &shape, &type);
  EXPECT_EQ(shape, (std::vector<int64_t>{ps.vocab_size, ps.hidden_size}));
  EXPECT_LE(RelativeError(grad_w, ref.grad_weight), 1e-5);

  // int32 targets, same data: the session's grad_W doubles.
  const nlohmann::json second = Ok({"compute", "--head", "h1", "--session", "s1", "--hidden", h,
                                    "--targets", Path("rt_t32.npy")});
  EXPECT_NEAR(second["loss"].get<double>(), ref.loss, 1e-5 * std::abs(ref.loss));
  EXPECT_NE(second["request_id"], first["request_id"]);
  grad = Ok({"fetch-grad", "--head", "h1", "--session", "s1", "--out", gw, "--reset"});
  EXPECT_EQ(grad["contributions"], 2);
  EXPECT_LE(RelativeError(ReadFloats(gw), Scaled(ref.grad_weight, 2.0)), 1e-5);

  // After the reset: exactly zero.
  grad = Ok({"fetch-grad", "--head", "h1", "--session", "s1", "--out", gw});
  EXPECT_EQ(grad["contributions"], 0);
  for (double value : ReadFloats(gw)) ASSERT_EQ(value, 0.0);

  // A target >= V is rejected by name and leaves grad_W untouched.
  std::vector<int64_t> bad(p.targets.begin(), p.targets.end());
  bad[3] = ps.vocab_size;
  WriteArray(Path("rt_bad.npy"), NpyType::kI64, {ps.num_tokens}, bad.data(), bad.size() * 8);
  const CliRun rejected = Cli({"compute", "--head", "h1", "--session", "s1", "--hidden", h,
                               "--targets", Path("rt_bad.npy"), "--out-grad-input", gx});
  EXPECT_NE(rejected.exit_code, 0) << Describe(rejected);
  ASSERT_TRUE(rejected.json.contains("error")) << Describe(rejected);
  EXPECT_EQ(rejected.json["error"]["code"], "INVALID_ARGUMENT") << Describe(rejected);
  EXPECT_FALSE(rejected.json["error"]["message"].get<std::string>().empty());
  // The id it was sent under, so that a retry cannot apply twice.
  EXPECT_EQ(rejected.json["error"]["request_id"].get<std::string>().size(), 32u)
      << Describe(rejected);
  grad = Ok({"fetch-grad", "--head", "h1", "--session", "s1", "--out", gw});
  EXPECT_EQ(grad["contributions"], 0);
  for (double value : ReadFloats(gw)) ASSERT_EQ(value, 0.0);
}

// compute --policy: the objective from .npy files (per-sequence advantages,
// sequence ids, a mask) against the float64 reference given the weights by
// hand; the statistics in the JSON; a per-token file of the wrong length named.
TEST_F(CliEndToEndTest, ComputeWithAPolicyObjective) {
  ProblemSpec ps;  // fp32, V=257, H=64, 48 tokens
  ps.ignore_fraction = 0.0;
  const Problem p = MakeProblem(ps);
  SCOPED_TRACE("problem seed " + std::to_string(p.seed));
  WriteProblem(p, "po_");
  const int64_t n = ps.num_tokens;
  ComputeSpec plain;
  const ReferenceOutput logps = ComputeReference(MakeReferenceInput(p, plain));
  std::vector<float> old(n);
  std::vector<int32_t> sequences(n), mask(n);
  for (int64_t t = 0; t < n; ++t) {
    old[t] = static_cast<float>(logps.logprob[t] + 0.25 * std::sin(3.0 * t));
    sequences[t] = static_cast<int32_t>(t / 12);  // four sequences
    mask[t] = t % 5 == 0 ? 0 : 1;
  }
  const std::vector<float> per_sequence = {1.0f, -0.5f, 2.0f, -1.0f};
  WriteArray(Path("po_old.npy"), NpyType::kF32, {n}, old.data(), n * 4);
  WriteArray(Path("po_adv.npy"), NpyType::kF32, {4}, per_sequence.data(), 16);
  WriteArray(Path("po_seq.npy"), NpyType::kI32, {n}, sequences.data(), n * 4);
  WriteArray(Path("po_mask.npy"), NpyType::kI32, {n}, mask.data(), n * 4);

  ComputeSpec spec;
  PolicyObjective o;
  o.clip_high = 0.28f;
  o.old_logp = old;
  int counted = 0;
  for (int32_t m : mask) counted += m;
  for (int64_t t = 0; t < n; ++t) {
    o.advantages.push_back(per_sequence[t / 12]);
    o.weights.push_back(mask[t] ? 1.0 / counted : 0.0);
  }
  spec.policy = o;
  const ReferenceOutput ref = ComputeReference(MakeReferenceInput(p, spec));

  Ok({"load-weight", "--head", "po", "--weight", Path("po_w.npy")});
  const nlohmann::json out =
      Ok({"compute", "--head", "po", "--session", "s", "--hidden", Path("po_h.npy"), "--targets",
          Path("po_t32.npy"), "--out-grad-input", Path("po_gx.npy"), "--policy", "ppo_clip",
          "--old-logp", Path("po_old.npy"), "--advantages", Path("po_adv.npy"),
          "--sequence-ids", Path("po_seq.npy"), "--mask", Path("po_mask.npy"), "--clip-high",
          "0.28"});
  EXPECT_NEAR(out["loss"].get<double>(), ref.loss, 1e-5 * ref.loss_abs) << out;
  ASSERT_TRUE(out.contains("policy")) << out;
  EXPECT_EQ(out["policy"]["loss"], "ppo_clip");
  EXPECT_EQ(out["policy"]["tokens"], counted);
  EXPECT_LE(RelativeError(ReadFloats(Path("po_gx.npy")), ref.grad_input), 1e-5);

  const CliRun short_file =
      Cli({"compute", "--head", "po", "--session", "s", "--hidden", Path("po_h.npy"),
           "--targets", Path("po_t32.npy"), "--policy", "ppo_clip", "--old-logp",
           Path("po_adv.npy"), "--advantages", Path("po_adv.npy")});
  EXPECT_NE(short_file.exit_code, 0) << Describe(short_file);
  EXPECT_NE(short_file.out.find("po_adv.npy"), std::string::npos) << Describe(short_file);
  const CliRun without = Cli({"compute", "--head", "po", "--session", "s", "--hidden",
                              Path("po_h.npy"), "--targets", Path("po_t32.npy"), "--policy",
                              "cispo", "--advantages", Path("po_adv.npy")});
  EXPECT_NE(without.exit_code, 0) << Describe(without);
  EXPECT_NE(without.out.find("--policy needs --old-logp and --advantages"), std::string::npos)
      << Describe(without);
}

// compute --preference: DPO over two pairs from .npy files (a prompt token of
// no sequence, the reference per sequence, then per token) against the
// float64 reference; the summary in the JSON; files of the wrong length and
// flags without their objective named.
TEST_F(CliEndToEndTest, ComputeWithAPreferenceObjective) {
  ProblemSpec ps;  // fp32, V=257, H=64, 48 tokens
  ps.ignore_fraction = 0.0;
  const Problem p = MakeProblem(ps);
  SCOPED_TRACE("problem seed " + std::to_string(p.seed));
  WriteProblem(p, "pr_");
  const int64_t n = ps.num_tokens;
  std::vector<int32_t> sequence(n);
  for (int64_t t = 0; t < n; ++t) {
    sequence[t] = t % 12 == 0 ? -1 : static_cast<int32_t>(t / 12);  // four responses
  }
  const std::vector<float> ref_per_sequence = {-60.5f, -58.0f, -61.25f, -57.75f};
  std::vector<float> ref_per_token(n, 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    if (sequence[t] >= 0) ref_per_token[t] = ref_per_sequence[sequence[t]] / 11.0f;
  }
  WriteArray(Path("pr_seq.npy"), NpyType::kI32, {n}, sequence.data(), n * 4);
  WriteArray(Path("pr_ref.npy"), NpyType::kF32, {4}, ref_per_sequence.data(), 16);
  WriteArray(Path("pr_ref_tok.npy"), NpyType::kF32, {n}, ref_per_token.data(), n * 4);

  ComputeSpec spec;
  PreferenceObjective o;
  o.beta = 0.25f;
  o.num_pairs = 2;
  o.sequence_of_token = sequence;
  o.ref_logp.assign(ref_per_sequence.begin(), ref_per_sequence.end());
  spec.preference = o;
  const ReferenceOutput ref = ComputeReference(MakeReferenceInput(p, spec));

  Ok({"load-weight", "--head", "pr", "--weight", Path("pr_w.npy")});
  const std::vector<std::string> base = {"compute",          "--head",   "pr",
                                         "--session",        "s",        "--hidden",
                                         Path("pr_h.npy"),   "--targets", Path("pr_t32.npy")};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> args = base;
    args.insert(args.end(), more.begin(), more.end());
    return args;
  };
  for (const char* ref_file : {"pr_ref.npy", "pr_ref_tok.npy"}) {
    SCOPED_TRACE(ref_file);
    const nlohmann::json out = Ok(with({"--out-grad-input", Path("pr_gx.npy"), "--preference",
                                        "dpo_sigmoid", "--sequence-of-token", Path("pr_seq.npy"),
                                        "--ref-logp", Path(ref_file), "--beta", "0.25"}));
    EXPECT_NEAR(out["loss"].get<double>(), ref.loss, 1e-5 * std::max(1.0, ref.loss_abs)) << out;
    ASSERT_TRUE(out.contains("preference")) << out;
    EXPECT_EQ(out["preference"]["loss"], "dpo_sigmoid");
    EXPECT_EQ(out["preference"]["pairs"], 2);
    EXPECT_NEAR(out["preference"]["pair_loss"].get<double>(), ref.preference.pair_loss, 1e-5);
    EXPECT_GT(out["preference"]["first_pass_ms"].get<double>(), 0.0);
    EXPECT_LE(RelativeError(ReadFloats(Path("pr_gx.npy")), ref.grad_input), 1e-5);
  }

  const CliRun wrong_length =
      Cli(with({"--preference", "dpo_sigmoid", "--sequence-of-token", Path("pr_seq.npy"),
                "--ref-logp", Path("pr_h.npy")}));
  EXPECT_NE(wrong_length.exit_code, 0) << Describe(wrong_length);
  EXPECT_NE(wrong_length.out.find("--ref-logp"), std::string::npos) << Describe(wrong_length);
  const CliRun no_sequences = Cli(with({"--preference", "simpo"}));
  EXPECT_NE(no_sequences.exit_code, 0) << Describe(no_sequences);
  EXPECT_NE(no_sequences.out.find("--preference needs --sequence-of-token"), std::string::npos)
      << Describe(no_sequences);
  const CliRun orphan = Cli(with({"--beta", "0.5"}));
  EXPECT_NE(orphan.exit_code, 0) << Describe(orphan);
  EXPECT_NE(orphan.out.find("--beta belongs to --preference"), std::string::npos)
      << Describe(orphan);
  const CliRun no_objective = Cli(with({"--ref-logp", Path("pr_ref.npy")}));
  EXPECT_NE(no_objective.exit_code, 0) << Describe(no_objective);
  EXPECT_NE(no_objective.out.find("--ref-logp belongs to --policy or --preference"),
            std::string::npos)
      << Describe(no_objective);
  const CliRun both = Cli(with({"--preference", "orpo", "--sequence-of-token", Path("pr_seq.npy"),
                                "--policy", "cispo", "--old-logp", Path("pr_ref_tok.npy"),
                                "--advantages", Path("pr_ref_tok.npy")}));
  EXPECT_NE(both.exit_code, 0) << Describe(both);
  EXPECT_NE(both.out.find("two objectives"), std::string::npos) << Describe(both);
}

TEST_F(CliEndToEndTest, EveryOtherSubcommand) {
  const nlohmann::json health = Ok({"health"});
  EXPECT_EQ(health["status"], "SERVING");

  const nlohmann::json info = Ok({"server-info"});
  EXPECT_EQ(info["engine"].get<std::string>().rfind("cpu", 0), 0u) << info;
  EXPECT_FALSE(info["instance_id"].get<std::string>().empty());
  EXPECT_GT(info["max_message_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(info["device_uuid"], "") << info;  // the CPU engine has no GPU
  EXPECT_EQ(info["unix_socket"], *dir_ + "/flce.sock") << info;  // told to a caller on its host
  // Started without --data-port: the data plane on a port the kernel picked, named here.
  EXPECT_GT(info["data_plane_port"].get<int64_t>(), 0) << info;

  // The embedded demo head of a server started without one.
  const nlohmann::json demo = Ok({"describe", "--head", "demo"});
  EXPECT_EQ(demo["vocab_size"], 32000);
  EXPECT_EQ(demo["hidden_size"], 512);
  EXPECT_EQ(demo["dtype"], "bf16");

  // A bf16 head with a bias, uploaded from fp32 files whose values bf16
  // holds exactly, so the reference sees the head the server holds.
  ProblemSpec ps;
  ps.vocab_size = 131;
  ps.hidden_size = 40;
  ps.num_tokens = 20;
  ps.head_dtype = DType::kBF16;
  ps.hidden_dtype = DType::kBF16;
  ps.has_bias = true;
  const Problem p = MakeProblem(ps);
  SCOPED_TRACE("problem seed " + std::to_string(p.seed));
  WriteProblem(p, "ev_");
  const std::string h = Path("ev_h.npy"), t = Path("ev_t64.npy");
  const nlohmann::json head = Ok({"load-weight", "--head", "hb", "--weight", Path("ev_w.npy"),
                                  "--bias", Path("ev_b.npy"), "--dtype", "bf16"});
  EXPECT_EQ(head["dtype"], "bf16");
  EXPECT_EQ(head["has_bias"], true);
  EXPECT_EQ(head["uploaded_bytes"], (ps.vocab_size * ps.hidden_size + ps.vocab_size) * 2);

  const nlohmann::json heads = Ok({"list-heads"});
  std::vector<std::string> ids;
  for (const auto& entry : heads["heads"]) ids.push_back(entry["head_id"]);
  EXPECT_NE(std::find(ids.begin(), ids.end(), "hb"), ids.end()) << heads;
  EXPECT_NE(std::find(ids.begin(), ids.end(), "demo"), ids.end()) << heads;

  // bf16 on the wire, sum reduction, per-token outputs and accuracy.
  ComputeSpec sum_spec;
  sum_spec.reduction = Reduction::kSum;
  const ReferenceOutput ref_sum = ComputeReference(MakeReferenceInput(p, sum_spec));
  const std::string prefix = Path("ev_tok");
  const nlohmann::json summed = Ok({"compute",
                                    "--head",
                                    "hb",
                                    "--session",
                                    "sb",
                                    "--hidden",
                                    h,
                                    "--targets",
                                    t,
                                    "--dtype",
                                    "bf16",
                                    "--reduction",
                                    "sum",
                                    "--out-grad-input",
                                    Path("ev_gx.npy"),
                                    "--per-token-out",
                                    prefix,
                                    "--accuracy",
                                    "--chunk-mb",
                                    "0.001"});
  EXPECT_NEAR(summed["loss"].get<double>(), ref_sum.loss, 1e-5 * std::abs(ref_sum.loss));
  EXPECT_EQ(summed["hidden_dtype"], "bf16");
  EXPECT_LE(std::abs(summed["n_correct"].get<int64_t>() - ref_sum.n_correct),
            ref_sum.n_correct_uncertain);
  NpyType type;
  std::vector<int64_t> shape;
  // grad_input comes back rounded to bf16.
  EXPECT_LE(RelativeError(ReadFloats(Path("ev_gx.npy"), &shape, &type), ref_sum.grad_input), 1e-2);
  EXPECT_EQ(type, NpyType::kU16);
  EXPECT_LE(RelativeError(ReadFloats(prefix + ".loss.npy", &shape), ref_sum.per_token_loss), 1e-5);
  EXPECT_EQ(shape, std::vector<int64_t>{ps.num_tokens});
  EXPECT_LE(RelativeError(ReadFloats(prefix + ".logprob.npy"), ref_sum.logprob), 1e-5);
  EXPECT_LE(RelativeError(ReadFloats(prefix + ".entropy.npy"), ref_sum.entropy), 1e-5);
  // On the server's host with --local-transports=shm, hidden went through
  // shared memory by itself; messages give the same bytes back.
  EXPECT_EQ(summed["transport"], "shm") << summed;
  const nlohmann::json in_messages =
      Ok({"compute", "--head", "hb", "--session", "sb-messages", "--hidden", h, "--targets", t,
          "--dtype", "bf16", "--reduction", "sum", "--out-grad-input", Path("ev_gx_messages.npy"),
          "--transport", "grpc", "--data-plane", "off"});
  EXPECT_EQ(in_messages["transport"], "grpc") << in_messages;
  // Without shared memory, the server's default data plane carries the rows: the same bytes.
  const nlohmann::json beside =
      Ok({"compute", "--head", "hb", "--session", "sb-data-plane", "--hidden", h, "--targets", t,
          "--dtype", "bf16", "--reduction", "sum", "--out-grad-input", Path("ev_gx_beside.npy"),
          "--transport", "grpc"});
  EXPECT_EQ(beside["transport"], "data_plane") << beside;
  EXPECT_EQ(ReadFile(Path("ev_gx_beside.npy")), ReadFile(Path("ev_gx.npy")));
  EXPECT_NEAR(in_messages["loss"].get<double>(), summed["loss"].get<double>(),
              1e-12 * std::abs(summed["loss"].get<double>()));
  EXPECT_EQ(ReadFile(Path("ev_gx_messages.npy")), ReadFile(Path("ev_gx.npy")));
  const CliRun bad_transport = Cli({"--transport", "tcp", "health"});
  EXPECT_EQ(bad_transport.exit_code, 2) << Describe(bad_transport);
  EXPECT_NE(bad_transport.out.find("--transport must be auto, grpc or shm"), std::string::npos)
      << Describe(bad_transport);

  nlohmann::json grad = Ok({"fetch-grad", "--head", "hb", "--session", "sb", "--out",
                            Path("ev_gw.npy"), "--out-bias", Path("ev_gb.npy")});
  EXPECT_EQ(grad["has_bias"], true);
  EXPECT_LE(RelativeError(ReadFloats(Path("ev_gw.npy")), ref_sum.grad_weight), 1e-5);
  EXPECT_LE(RelativeError(ReadFloats(Path("ev_gb.npy")), ref_sum.grad_bias), 1e-5);
  grad = Ok({"fetch-grad", "--head", "hb", "--session", "sb", "--out", Path("ev_gw16.npy"),
             "--dtype", "bf16"});
  EXPECT_EQ(grad["dtype"], "bf16");
  EXPECT_LE(RelativeError(ReadFloats(Path("ev_gw16.npy"), nullptr, &type), ref_sum.grad_weight),
            1e-2);
  EXPECT_EQ(type, NpyType::kU16);

  // Forward only: the loss, and the session's gradient untouched.
  const nlohmann::json evaluated =
      Ok({"compute", "--head", "hb", "--session", "sb", "--hidden", h, "--targets", t, "--dtype",
          "bf16", "--reduction", "sum", "--forward-only"});
  EXPECT_NEAR(evaluated["loss"].get<double>(), ref_sum.loss, 1e-5 * std::abs(ref_sum.loss));
  Ok({"fetch-grad", "--head", "hb", "--session", "sb", "--out", Path("ev_gw.npy")});
  EXPECT_LE(RelativeError(ReadFloats(Path("ev_gw.npy")), ref_sum.grad_weight), 1e-5);

  // Per-token weights a_t from a file (reduction none).
  ComputeSpec weighted_spec;
  weighted_spec.reduction = Reduction::kNone;
  weighted_spec.token_weights = RandomFloats(ps.num_tokens, 0.0f, 2.0f, p.seed + 1);
  const ReferenceOutput ref_weighted = ComputeReference(MakeReferenceInput(p, weighted_spec));
  WriteArray(Path("ev_tw.npy"), NpyType::kF32, {ps.num_tokens}, weighted_spec.token_weights.data(),
             ps.num_tokens * 4);
  const nlohmann::json weighted =
      Ok({"compute", "--head", "hb", "--session", "sw", "--hidden", h, "--targets", t, "--dtype",
          "bf16", "--reduction", "none", "--token-weights", Path("ev_tw.npy")});
  EXPECT_NEAR(weighted["loss"].get<double>(), ref_weighted.loss,
              1e-5 * std::abs(ref_weighted.loss));
  Ok({"fetch-grad", "--head", "hb", "--session", "sw", "--out", Path("ev_gww.npy")});
  EXPECT_LE(RelativeError(ReadFloats(Path("ev_gww.npy")), ref_weighted.grad_weight), 1e-5);

  // Deferred commit with a scale.
  ComputeSpec mean_spec;
  const ReferenceOutput ref_mean = ComputeReference(MakeReferenceInput(p, mean_spec));
  const nlohmann::json staged =
      Ok({"compute", "--head", "hb", "--session", "sd", "--hidden", h, "--targets", t, "--dtype",
          "bf16", "--deferred", "--request-id", "deferred-1"});
  EXPECT_EQ(staged["request_id"], "deferred-1");
  EXPECT_EQ(staged["staged"], true);
  EXPECT_EQ(staged["committed"], false);
  nlohmann::json sessions = Ok({"sessions", "--head", "hb"});
  bool saw_pending = false;
  for (const auto& s : sessions["sessions"]) {
    if (s["session_id"] == "sd") saw_pending = s["pending"] == 1;
  }
  EXPECT_TRUE(saw_pending) << sessions;
  const nlohmann::json commit = Ok({"commit", "--head", "hb", "--session", "sd", "--request-id",
                                    "deferred-1", "--scale", "0.5"});
  EXPECT_EQ(commit["state"], "COMMITTED");
  EXPECT_EQ(commit["replayed"], false);
  Ok({"fetch-grad", "--head", "hb", "--session", "sd", "--out", Path("ev_gd.npy")});
  EXPECT_LE(RelativeError(ReadFloats(Path("ev_gd.npy")), Scaled(ref_mean.grad_weight, 0.5)), 1e-5);

  const nlohmann::json zeroed = Ok({"zero-grad", "--head", "hb", "--session", "sd"});
  EXPECT_EQ(zeroed["zeroed"], true);
  Ok({"fetch-grad", "--head", "hb", "--session", "sd", "--out", Path("ev_gd.npy")});
  for (double value : ReadFloats(Path("ev_gd.npy"))) ASSERT_EQ(value, 0.0);

  Ok({"sessions", "--delete", "--head", "hb", "--session", "sd"});
  sessions = Ok({"sessions"});
  for (const auto& s : sessions["sessions"]) {
    EXPECT_FALSE(s["head_id"] == "hb" && s["session_id"] == "sd") << sessions;
  }

  const CliRun bench_run =
      Cli({"bench", "--head", "hb", "--tokens", "32", "--steps", "3", "--warmup", "1"});
  ASSERT_EQ(bench_run.exit_code, 0) << Describe(bench_run);
  EXPECT_EQ(bench_run.err, "") << "progress is for terminals only";
  const nlohmann::json& bench = bench_run.json;
  EXPECT_EQ(bench["tokens"], 32);
  EXPECT_GT(bench["tokens_per_s"].get<double>(), 0);
  EXPECT_GT(bench["step_ms"]["median"].get<double>(), 0);
  EXPECT_EQ(bench["bytes_down_per_step"], 32 * ps.hidden_size * 2);  // bf16 grad_input
  EXPECT_GT(bench["gb_per_s_up"].get<double>(), 0);

  // A .safetensors head under --head-root, then one outside it.
  const int64_t v = ps.vocab_size, hs = ps.hidden_size;
  const std::string header = "{\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[" +
                             std::to_string(v) + "," + std::to_string(hs) +
                             "],\"data_offsets\":[0," + std::to_string(v * hs * 4) + "]}}";
  {
    std::ofstream file(Path("heads/small.safetensors"), std::ios::binary);
    const uint64_t len = header.size();
    file.write(reinterpret_cast<const char*>(&len), 8);
    file << header;
    file.write(reinterpret_cast<const char*>(p.weight.data()), v * hs * 4);
  }
  const nlohmann::json loaded = Ok({"load-file", "--head", "hf", "--path", "small.safetensors",
                                    "--weight-tensor", "lm_head.weight"});
  EXPECT_EQ(loaded["vocab_size"], v);
  EXPECT_EQ(loaded["dtype"], "fp32");
  EXPECT_NE(loaded["source"].get<std::string>().find("small.safetensors"), std::string::npos);
  const CliRun outside = Cli(
      {"load-file", "--head", "hx", "--path", "../ev_w.npy", "--weight-tensor", "lm_head.weight"});
  EXPECT_EQ(outside.exit_code, 1) << Describe(outside);
  EXPECT_EQ(outside.json["error"]["code"], "PERMISSION_DENIED") << Describe(outside);

  const nlohmann::json unloaded = Ok({"unload", "--head", "hf"});
  EXPECT_EQ(unloaded["head"]["head_id"], "hf");
  const CliRun gone = Cli({"describe", "--head", "hf"});
  EXPECT_EQ(gone.exit_code, 1);
  EXPECT_EQ(gone.json["error"]["code"], "NOT_FOUND") << Describe(gone);
}

TEST_F(CliEndToEndTest, TrainingSubcommands) {
  ProblemSpec ps;
  ps.vocab_size = 97;
  ps.hidden_size = 24;
  ps.num_tokens = 16;
  const Problem p = MakeProblem(ps);
  SCOPED_TRACE("problem seed " + std::to_string(p.seed));
  WriteProblem(p, "tr_");
  Ok({"load-weight", "--head", "ht", "--weight", Path("tr_w.npy")});
  ComputeSpec sum_spec;
  sum_spec.reduction = Reduction::kSum;
  const ReferenceOutput ref = ComputeReference(MakeReferenceInput(p, sum_spec));
  Ok({"compute", "--head", "ht", "--session", "st", "--hidden", Path("tr_h.npy"), "--targets",
      Path("tr_t64.npy"), "--reduction", "sum"});

  const nlohmann::json norm = Ok({"grad-norm", "--head", "ht", "--session", "st"});
  double want = 0;
  for (double g : ref.grad_weight) want += g * g;
  EXPECT_NEAR(norm["sq_norm"].get<double>(), want, 1e-5 * want);
  EXPECT_EQ(norm["contributions"], 1);

  const nlohmann::json created =
      Ok({"create-optimizer", "--head", "ht", "--kind", "adamw", "--weight-decay", "0"});
  EXPECT_EQ(created["kind"], "ADAMW");
  EXPECT_EQ(created["weight"]["beta2"], 0.999);  // the server's default, filled in
  EXPECT_GT(created["state_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(Ok({"describe", "--head", "ht"})["optimizer"]["kind"], "ADAMW");
  CliRun twice = Cli({"create-optimizer", "--head", "ht", "--kind", "sgd"});
  EXPECT_EQ(twice.exit_code, 1);
  EXPECT_EQ(twice.json["error"]["code"], "ALREADY_EXISTS") << Describe(twice);

  // The weight comes back as uploaded; a head without a bias has none to write.
  const nlohmann::json downloaded =
      Ok({"download-head", "--head", "ht", "--out", Path("tr_dl0.npy")});
  EXPECT_EQ(downloaded["out_dtype"], "fp32");
  std::vector<int64_t> shape;
  const std::vector<double> before = ReadFloats(Path("tr_dl0.npy"), &shape);
  EXPECT_EQ(shape, (std::vector<int64_t>{ps.vocab_size, ps.hidden_size}));
  EXPECT_EQ(before, std::vector<double>(p.weight.begin(), p.weight.end()));
  CliRun no_bias = Cli({"download-head", "--head", "ht", "--out", Path("tr_dl_nb.npy"),
                        "--out-bias", Path("tr_dl_b.npy")});
  EXPECT_EQ(no_bias.exit_code, 1) << Describe(no_bias);
  EXPECT_EQ(no_bias.json["error"]["code"], "FAILED_PRECONDITION") << Describe(no_bias);

  const int64_t version = Ok({"describe", "--head", "ht"})["version"];
  const nlohmann::json step =
      Ok({"step", "--head", "ht", "--session", "st", "--lr", "0.01", "--request-id", "k1"});
  EXPECT_EQ(step["outcome"], "APPLIED");
  EXPECT_EQ(step["contributions"], 1);
  EXPECT_EQ(step["head_version"], version + 1);
  EXPECT_EQ(step["steps"], 1);
  const nlohmann::json replay =
      Ok({"step", "--head", "ht", "--session", "st", "--lr", "0.01", "--request-id", "k1"});
  EXPECT_EQ(replay["replayed"], true);
  EXPECT_EQ(Ok({"step", "--head", "ht", "--session", "st", "--lr", "0.01"})["outcome"],
            "SKIPPED_NO_GRADIENT");
  CliRun no_lr = Cli({"step", "--head", "ht", "--session", "st"});
  EXPECT_EQ(no_lr.exit_code, 2) << Describe(no_lr);

  // After the step: the trained weight, and rows of it by token id (2 x 2 ids).
  Ok({"download-head", "--head", "ht", "--out", Path("tr_dl1.npy")});
  const std::vector<double> after = ReadFloats(Path("tr_dl1.npy"));
  EXPECT_NE(after, before);
  const int32_t ids[] = {3, 0, static_cast<int32_t>(ps.vocab_size - 1), 3};
  WriteArray(Path("tr_ids.npy"), NpyType::kI32, {2, 2}, ids, sizeof(ids));
  const nlohmann::json embedded = Ok({"embed", "--head", "ht", "--ids", Path("tr_ids.npy"),
                                      "--out", Path("tr_rows.npy"), "--chunk-rows", "1"});
  EXPECT_EQ(embedded["num_tokens"], 4);
  const std::vector<double> rows = ReadFloats(Path("tr_rows.npy"), &shape);
  EXPECT_EQ(shape, (std::vector<int64_t>{2, 2, ps.hidden_size}));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(std::vector<double>(rows.begin() + i * ps.hidden_size,
                                  rows.begin() + (i + 1) * ps.hidden_size),
              std::vector<double>(after.begin() + ids[i] * ps.hidden_size,
                                  after.begin() + (ids[i] + 1) * ps.hidden_size))
        << "row " << i << " (id " << ids[i] << ")";
  }
  const int32_t outside[] = {static_cast<int32_t>(ps.vocab_size)};
  WriteArray(Path("tr_bad_ids.npy"), NpyType::kI32, {1}, outside, sizeof(outside));
  CliRun bad_ids = Cli({"embed", "--head", "ht", "--ids", Path("tr_bad_ids.npy"), "--out",
                        Path("tr_bad_rows.npy")});
  EXPECT_EQ(bad_ids.json["error"]["code"], "INVALID_ARGUMENT") << Describe(bad_ids);

  const nlohmann::json saved = Ok({"save-checkpoint", "--head", "ht", "--name", "c1"});
  EXPECT_EQ(saved["has_optimizer"], true);
  EXPECT_EQ(saved["head_version"], version + 1);
  EXPECT_GT(saved["bytes"].get<int64_t>(), ps.vocab_size * ps.hidden_size * 4);
  const nlohmann::json loaded =
      Ok({"load-checkpoint", "--head", "ht2", "--name", "c1"});
  EXPECT_EQ(loaded["vocab_size"], ps.vocab_size);
  EXPECT_EQ(loaded["optimizer"]["steps"], 1);
  const nlohmann::json info = Ok({"server-info"});
  EXPECT_NE(std::find(info["capabilities"].begin(), info["capabilities"].end(), "checkpoint"),
            info["capabilities"].end())
      << info;
}

}  // namespace
}  // namespace flce::test
