// ComputeHeader.policy through the server: the wire's per-sequence form
// (mask, sequence ids, per-sequence advantages, the aggregation) against the
// float64 reference given per-token weights worked out here by hand; bad
// inputs named and landing nothing; engines without objectives refused.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/engine_factory.h"
#include "tests/server/server_test_util.h"
#include "tests/support/delegating_engine.h"
#include "tests/support/reference_f64.h"

namespace flce::server::test {
namespace {

using ::flce::test::ComputeReference;
using ::flce::test::DelegatingEngine;
using ::flce::test::MakeProblem;
using ::flce::test::MakeReferenceInput;
using ::flce::test::ReferenceOutput;
using ::flce::test::RelativeError;
using ::testing::HasSubstr;

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

class PolicyTest : public ServerTest {
 protected:
  void SetUp() override {
    StartServer(TestConfig());
    problem_ = MakeProblem(TinyF32Spec());
    ASSERT_TRUE(UploadHead(stub(), "h", problem_).ok());
    const int64_t n = problem_.spec.num_tokens;
    // Tokens 4-9 count whatever the draw ignored: the bad inputs below name them.
    for (int64_t t = 4; t < 10; ++t) problem_.targets[t] = static_cast<int32_t>(t);
    // Four sequences of 5 tokens; token 2 masked; its sequence's advantage
    // is given once per sequence.
    for (int64_t t = 0; t < n; ++t) {
      sequences_.push_back(static_cast<int32_t>(10 + t / 5));
      mask_.push_back(t == 2 ? 0 : 1);
      old_logp_.push_back(static_cast<float>(-std::log(16.0) + 0.2 * std::sin(t)));
    }
    seq_advantages_ = {1.0f, -0.5f, 2.0f, -1.5f};
  }

  v1::ComputeHeader PolicyHeader(const std::string& request_id) const {
    v1::ComputeHeader header = MakeHeader(problem_, "h", "s", request_id);
    header.set_reduction(v1::REDUCTION_MEAN);
    v1::PolicyObjective* p = header.mutable_policy();
    p->set_loss(v1::POLICY_LOSS_PPO_CLIP);
    p->set_clip_low(0.2f);
    p->set_clip_high(0.28f);
    p->set_aggregation(v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_MEAN);
    p->set_old_logp(Bytes(old_logp_));
    p->set_advantages(Bytes(seq_advantages_));
    p->set_sequence_ids(Bytes(sequences_));
    p->set_mask(Bytes(mask_));
    return header;
  }

  // The same objective per token, weights by hand: seq-mean-token-mean over
  // the sequences with a counted token.
  ReferenceOutput Reference() const {
    const int64_t n = problem_.spec.num_tokens;
    ComputeSpec spec;
    spec.num_tokens = n;
    spec.reduction = Reduction::kMean;
    PolicyObjective o;
    o.clip_high = 0.28f;
    o.old_logp = old_logp_;
    std::vector<int> counted_in(4, 0);
    for (int64_t t = 0; t < n; ++t) {
      const bool counts = mask_[t] == 1 && problem_.targets[t] != problem_.spec.ignore_index;
      counted_in[t / 5] += counts;
    }
    int sequences = 0;
    for (int c : counted_in) sequences += c > 0;
    for (int64_t t = 0; t < n; ++t) {
      const bool counts = mask_[t] == 1 && problem_.targets[t] != problem_.spec.ignore_index;
      o.advantages.push_back(seq_advantages_[t / 5]);
      o.weights.push_back(counts ? 1.0 / (counted_in[t / 5] * sequences) : 0.0);
    }
    spec.policy = o;
    return ComputeReference(MakeReferenceInput(problem_, spec));
  }

  Problem problem_;
  std::vector<int32_t> sequences_;
  std::vector<uint8_t> mask_;
  std::vector<float> old_logp_;
  std::vector<float> seq_advantages_;
};

TEST_F(PolicyTest, ServerOffersIt) {
  grpc::ClientContext context;
  v1::ServerInfo info;
  ASSERT_TRUE(stub().GetServerInfo(&context, v1::ServerInfoRequest(), &info).ok());
  EXPECT_THAT(info.capabilities(), ::testing::Contains("policy_objectives"));
}

TEST_F(PolicyTest, SequencesMaskAndPerSequenceAdvantagesMatchTheReference) {
  ComputeOutcome out = Compute(stub(), PolicyHeader("ppo"), problem_);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  const ReferenceOutput ref = Reference();
  EXPECT_NEAR(out.summary.loss(), ref.loss, 1e-5 * ref.loss_abs);
  EXPECT_EQ(out.summary.policy().loss(), "ppo_clip");
  EXPECT_EQ(out.summary.policy().tokens(), ref.policy.tokens);
  EXPECT_NEAR(out.summary.policy().ratio_mean(), ref.policy.ratio_sum / ref.policy.tokens, 1e-5);
  EXPECT_NEAR(out.summary.policy().surrogate_loss(), ref.policy.surrogate_loss,
              1e-5 * ref.loss_abs);
  EXPECT_LE(RelativeError(std::vector<double>(out.grad_input.begin(), out.grad_input.end()),
                          ref.grad_input),
            1e-5);
  FetchedGrad grad = FetchGrad(stub(), "h", "s");
  ASSERT_TRUE(grad.status.ok());
  EXPECT_LE(RelativeError(std::vector<double>(grad.weight.begin(), grad.weight.end()),
                          ref.grad_weight),
            1e-5);
}

// The objective is part of what a request id names: the same id with
// another advantage is a different request.
TEST_F(PolicyTest, TheObjectiveIsFingerprinted) {
  ASSERT_TRUE(Compute(stub(), PolicyHeader("same"), problem_).status.ok());
  v1::ComputeHeader other = PolicyHeader("same");
  seq_advantages_[0] = 3.0f;
  other.mutable_policy()->set_advantages(Bytes(seq_advantages_));
  ComputeOutcome out = Compute(stub(), other, problem_);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << out.status.error_message();
}

TEST_F(PolicyTest, BadInputsAreNamedAndLandNothing) {
  const FetchedGrad before = FetchGrad(stub(), "h", "s");
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::function<void(v1::ComputeHeader&)> set;
    std::string names;
  };
  std::vector<float> bad_old = old_logp_;
  bad_old[4] = NAN;
  std::vector<float> masked_nan = old_logp_;
  masked_nan[2] = NAN;  // token 2 is masked: not read, so it is fine (checked below)
  std::vector<float> inf_adv = seq_advantages_;
  inf_adv[1] = inf;
  std::vector<int32_t> backwards = sequences_;
  std::swap(backwards[4], backwards[5]);
  for (const Case& c : std::vector<Case>{
           {[](v1::ComputeHeader& h) { h.mutable_policy()->clear_old_logp(); },
            "policy.old_logp has 0 bytes"},
           {[&](v1::ComputeHeader& h) { h.mutable_policy()->set_old_logp(Bytes(bad_old)); },
            "old_logp[4] = nan is not finite"},
           {[&](v1::ComputeHeader& h) { h.mutable_policy()->set_advantages(Bytes(inf_adv)); },
            "policy.advantages[1] = inf is not finite (sequence 11 has tokens that count)"},
           {[](v1::ComputeHeader& h) { h.mutable_policy()->set_advantages("abc"); },
            "policy.advantages has 3 bytes"},
           {[](v1::ComputeHeader& h) { h.mutable_policy()->set_clip_low(-0.1f); },
            "clip_low = -0.1 is outside [0, 1]"},
           {[](v1::ComputeHeader& h) { h.mutable_policy()->set_dual_clip(0.5f); },
            "dual_clip = 0.5"},
           {[](v1::ComputeHeader& h) { h.mutable_policy()->set_kl_coef(0.1f); },
            "kl_coef = 0.1 needs ref_logp"},
           {[&](v1::ComputeHeader& h) { h.mutable_policy()->set_sequence_ids(Bytes(backwards)); },
            "policy.sequence_ids[5] = 10 is below sequence_ids[4] = 11"},
           {[](v1::ComputeHeader& h) { h.mutable_policy()->set_mask(std::string(20, '\2')); },
            "policy.mask[0] = 2 is not 0 or 1"},
           {[](v1::ComputeHeader& h) {
              h.mutable_policy()->set_aggregation(static_cast<v1::LossAggregation>(9));
            },
            "policy.aggregation"},
           {[](v1::ComputeHeader& h) { h.set_reduction(v1::REDUCTION_SUM); },
            "reduction = REDUCTION_SUM does not apply to a policy objective"},
           {[](v1::ComputeHeader& h) { h.mutable_options()->set_label_smoothing(0.1f); },
            "label_smoothing"},
           {[](v1::ComputeHeader& h) { h.mutable_policy()->set_loss(v1::POLICY_LOSS_NONE); },
            "policy.loss is POLICY_LOSS_NONE"},
       }) {
    v1::ComputeHeader header = PolicyHeader("bad");
    c.set(header);
    ComputeOutcome out = Compute(stub(), header, problem_);
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.names;
    EXPECT_THAT(out.status.error_message(), HasSubstr(c.names));
  }
  FetchedGrad after = FetchGrad(stub(), "h", "s");
  EXPECT_EQ(after.header.contributions(), before.header.contributions());
  EXPECT_EQ(after.weight, before.weight);

  v1::ComputeHeader header = PolicyHeader("masked-nan");
  header.mutable_policy()->set_old_logp(Bytes(masked_nan));
  ComputeOutcome out = Compute(stub(), header, problem_);
  EXPECT_TRUE(out.status.ok()) << out.status.error_message();
}

// An engine that does not compute objectives: the server refuses before any
// work instead of computing the cross-entropy.
class NoPolicyEngine : public DelegatingEngine {
 public:
  using DelegatingEngine::DelegatingEngine;
  EngineInfo info() const override {
    EngineInfo info = DelegatingEngine::info();
    info.policy_objectives = false;
    return info;
  }
};

class PolicyRefusedTest : public PolicyTest {
 protected:
  void SetUp() override {}
};

TEST_F(PolicyRefusedTest, AServerWhoseEngineLacksThemSaysSo) {
  auto cpu = CreateCpuEngine(EngineConfig{});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  StartServer(TestConfig(), std::make_unique<NoPolicyEngine>(std::move(*cpu)));
  PolicyTest::problem_ = MakeProblem(TinyF32Spec());
  ASSERT_TRUE(UploadHead(stub(), "h", problem_).ok());
  for (int64_t t = 0; t < problem_.spec.num_tokens; ++t) {
    sequences_.push_back(static_cast<int32_t>(t / 5));
    mask_.push_back(1);
    old_logp_.push_back(-2.0f);
  }
  seq_advantages_ = {1.0f, 1.0f, 1.0f, 1.0f};
  grpc::ClientContext context;
  v1::ServerInfo info;
  ASSERT_TRUE(stub().GetServerInfo(&context, v1::ServerInfoRequest(), &info).ok());
  EXPECT_THAT(info.capabilities(), ::testing::Not(::testing::Contains("policy_objectives")));
  ComputeOutcome out = Compute(stub(), PolicyHeader("refused"), problem_);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(out.status.error_message(), HasSubstr("does not compute policy objectives"));
  EXPECT_FALSE(out.has_summary);

  // The C++ client refuses it itself, from the capabilities, before sending.
  ClientOptions options;
  options.target = absl::StrCat("127.0.0.1:", server().port());
  options.timeout = absl::Seconds(20);
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  ComputeArgs args;
  args.header = PolicyHeader("client-refused");
  args.targets = problem_.targets;
  args.hidden = problem_.hidden_bytes;
  absl::StatusOr<::flce::ComputeOutcome> refused = (*client)->Compute(args);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("its capabilities do not name \"policy_objectives\""));
}

}  // namespace
}  // namespace flce::server::test
