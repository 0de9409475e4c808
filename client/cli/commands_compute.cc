// compute: one Compute call from .npy files.
#include <algorithm>
#include <functional>
#include <numeric>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/cli_main.h"
#include "client/cli/command.h"
#include "client/cli/compute_policy.h"
#include "client/cli/compute_preference.h"
#include "client/cli/json_views.h"
#include "client/cli/tensor_files.h"
#include "client/cpp/request_id.h"
#include "client/cpp/wire_dtype.h"
#include "core/compute_options.h"
#include "core/loss_option_checks.h"
#include "core/status_macros.h"
#include "flce/v1/convert.h"

namespace flce::cli {
namespace {

// The command line's names are the proto enum's, lowercased and without the
// STRATEGY_ prefix ("auto", "chunked", "vocab_split", ...): a new strategy in
// the proto appears here by itself.
constexpr absl::string_view kStrategyPrefix = "STRATEGY_";

const std::vector<std::string>& StrategyNames() {
  static const std::vector<std::string>* names = [] {
    auto* out = new std::vector<std::string>;
    for (int i = v1::Strategy_MIN; i <= v1::Strategy_MAX; ++i) {
      if (!v1::Strategy_IsValid(i)) continue;
      std::string name = v1::Strategy_Name(static_cast<v1::Strategy>(i));
      out->push_back(absl::AsciiStrToLower(name.substr(kStrategyPrefix.size())));
    }
    return out;
  }();
  return *names;
}

v1::Strategy StrategyOf(const std::string& name) {
  v1::Strategy strategy = v1::STRATEGY_AUTO;
  // The flag parser admits only StrategyNames(): parsing cannot fail.
  v1::Strategy_Parse(absl::StrCat(kStrategyPrefix, absl::AsciiStrToUpper(name)), &strategy);
  return strategy;
}

v1::Reduction ReductionOf(const std::string& name) {
  if (name == "sum") return v1::REDUCTION_SUM;
  if (name == "none") return v1::REDUCTION_NONE;
  return v1::REDUCTION_MEAN;
}

}  // namespace

void DeclareCompute(FlagSet& flags) {
  flags.String("head", "head id").Required();
  flags.String("session", "session whose grad_W accumulates this call's").Required();
  flags.String("hidden", "hidden states .npy, (..., H): '<f4', '<f2', or '<u2' with --dtype bf16")
      .Required();
  flags.String("targets", "targets .npy, '<i4' or '<i8', one per hidden row").Required();
  flags.Choice("dtype", {"bf16", "fp16", "fp32"}, "",
               "hidden dtype on the wire and of grad_input; default: the file's");
  flags.String("out-grad-input",
               "write grad_input here (.npy, hidden's shape and dtype); without it the "
               "server sends no grad_input");
  flags.Choice("reduction", {"mean", "sum", "none"}, "mean", "loss reduction");
  flags.Int("ignore-index", "target value that is ignored", "-100");
  for (const LossOptionField& option : kLossOptionFields) {
    flags.Double(option.flag, absl::StrCat(option.help, " in ", LossOptionRange(option)),
                 absl::StrCat(LossOptions{}.*option.member));
  }
  flags.Choice("strategy", StrategyNames(), "auto", "GPU execution plan");
  flags.Bool("deferred", "stage grad_W until `commit` names this request id");
  flags.String("request-id", "idempotency key; default: a fresh random one");
  flags.Bool("forward-only", "evaluation: no grad_input, no grad_W");
  flags.String("per-token-out",
               "write PREFIX.loss.npy, PREFIX.logprob.npy, PREFIX.entropy.npy "
               "(and PREFIX.correct.npy with --accuracy)");
  flags.Bool("accuracy", "report accuracy (argmax == target)");
  flags.Double("chunk-mb", "hidden bytes per message, MiB", "4");
  flags.String("token-weights", "per-token a_t, '<f4' .npy, one per token");
  flags.String("entropy-weights", "per-token entropy weights e_t, '<f4' .npy");
  flags.Int("expected-version", "fail unless the head is at this version");
  flags.Bool("deterministic", "bitwise-repeatable results where the plan allows");
  flags.Int("chunk-tokens", "engine token-chunk size; 0 = the engine's choice", "0");
  DeclarePolicyFlags(flags);
  DeclarePreferenceFlags(flags);
}

absl::StatusOr<CommandResult> RunCompute(const FlagSet& flags, CliEnv& env) {
  const double chunk_mb = flags.f64("chunk-mb");
  if (!(chunk_mb > 0)) return UsageError("compute", "--chunk-mb must be > 0");
  if (flags.flag("forward-only") && flags.has("out-grad-input")) {
    return UsageError("compute", "--forward-only computes no grad_input to write");
  }
  FLCE_ASSIGN_OR_RETURN(WireTensor hidden,
                        ReadFloatTensor(flags.str("hidden"), flags.str("dtype")));
  FLCE_ASSIGN_OR_RETURN(Targets targets, ReadTargets(flags.str("targets")));
  if (hidden.shape.size() < 2 || hidden.shape.back() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flags.str("hidden"), ": hidden must be (tokens, H) or (..., H); got shape (",
                     absl::StrJoin(hidden.shape, ", "), ")"));
  }
  const int64_t hidden_size = hidden.shape.back();
  const int64_t tokens = std::accumulate(hidden.shape.begin(), hidden.shape.end() - 1, int64_t{1},
                                         std::multiplies<int64_t>());
  if (static_cast<int64_t>(targets.values.size()) != tokens) {
    return absl::InvalidArgumentError(absl::StrCat(flags.str("targets"), " has ",
                                                   targets.values.size(), " targets but ",
                                                   flags.str("hidden"), " has ", tokens, " rows"));
  }

  ComputeArgs args;
  v1::ComputeHeader& header = args.header;
  // Chosen here, not by the client library, so that a failed call's error
  // names it: a retry with the same id is answered without applying twice.
  header.set_request_id(flags.has("request-id") && !flags.str("request-id").empty()
                            ? flags.str("request-id")
                            : NewRequestId());
  header.set_head_id(flags.str("head"));
  header.set_session_id(flags.str("session"));
  if (flags.has("expected-version")) {
    header.set_expected_head_version(static_cast<uint64_t>(flags.i64("expected-version")));
  }
  header.set_strategy(StrategyOf(flags.str("strategy")));
  header.set_reduction(ReductionOf(flags.str("reduction")));
  header.set_ignore_index(static_cast<int32_t>(flags.i64("ignore-index")));
  header.set_hidden_dtype(hidden.dtype);
  for (const LossOptionField& option : kLossOptionFields) {
    FLCE_RETURN_IF_ERROR(SetLossOption(option, static_cast<float>(flags.f64(option.flag)),
                                       header.mutable_options()));
  }
  if (flags.has("token-weights")) {
    FLCE_ASSIGN_OR_RETURN(std::vector<float> weights,
                          ReadFloat32(flags.str("token-weights"), tokens));
    header.set_token_weights(ArrayBytes(weights));
  }
  if (flags.has("entropy-weights")) {
    FLCE_ASSIGN_OR_RETURN(std::vector<float> weights,
                          ReadFloat32(flags.str("entropy-weights"), tokens));
    header.set_entropy_weights(ArrayBytes(weights));
  }
  FLCE_RETURN_IF_ERROR(FillPolicy(flags, tokens, &header));
  FLCE_RETURN_IF_ERROR(FillPreference(flags, tokens, &header));
  const bool per_token = flags.has("per-token-out");
  v1::OutputSelection* outputs = header.mutable_outputs();
  outputs->set_forward_only(flags.flag("forward-only"));
  outputs->set_grad_input(flags.has("out-grad-input"));
  outputs->set_per_token_loss(per_token);
  outputs->set_logprob(per_token);
  outputs->set_entropy(per_token);
  outputs->set_accuracy(flags.flag("accuracy"));
  header.set_commit(flags.flag("deferred") ? v1::COMMIT_DEFERRED : v1::COMMIT_ON_COMPLETE);
  header.set_deterministic(flags.flag("deterministic"));
  header.set_chunk_tokens(flags.i64("chunk-tokens"));
  args.targets = std::move(targets.values);
  args.hidden = hidden.bytes;
  args.chunk_bytes = static_cast<int64_t>(chunk_mb * (1 << 20));

  FLCE_ASSIGN_OR_RETURN(Client * client, env.client());
  absl::StatusOr<ComputeOutcome> computed = client->Compute(args);
  if (!computed.ok()) {
    nlohmann::json error = ErrorJson(computed.status());
    error["error"]["request_id"] = header.request_id();
    return CommandResult{std::move(error), kExitFailed};
  }
  ComputeOutcome& outcome = *computed;

  nlohmann::json json = SummaryJson(outcome.summary, flags.flag("accuracy"));
  json["request_id"] = outcome.request_id;
  json["transport"] = outcome.transport;
  json["num_tokens"] = tokens;
  json["hidden_size"] = hidden_size;
  json["hidden_dtype"] = WireDTypeName(hidden.dtype);
  if (flags.has("out-grad-input")) {
    FLCE_RETURN_IF_ERROR(WriteWireTensor(
        flags.str("out-grad-input"), WireTensor{hidden.dtype, hidden.shape, outcome.grad_input}));
    json["grad_input"] = flags.str("out-grad-input");
  }
  if (per_token) {
    const std::string prefix = flags.str("per-token-out");
    nlohmann::json files = nlohmann::json::array();
    for (const auto& [name, values] :
         {std::pair<const char*, const std::vector<float>*>{"loss", &outcome.per_token_loss},
          {"logprob", &outcome.logprob},
          {"entropy", &outcome.entropy}}) {
      const std::string path = absl::StrCat(prefix, ".", name, ".npy");
      FLCE_RETURN_IF_ERROR(WriteFloat32(path, targets.shape, *values));
      files.push_back(path);
    }
    if (!outcome.correct.empty()) {
      const std::string path = prefix + ".correct.npy";
      FLCE_RETURN_IF_ERROR(WriteUint8(path, targets.shape, outcome.correct));
      files.push_back(path);
    }
    json["per_token_files"] = files;
  }
  return CommandResult{json};
}

}  // namespace flce::cli
