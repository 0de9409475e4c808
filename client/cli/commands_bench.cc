// bench: drives a resident head with random data of its shape and reports
// the wire's throughput. Each step is one full Compute call (hidden up,
// grad_input down); the median step is the figure that matters, the first
// --warmup steps are not counted.
#include <algorithm>
#include <chrono>
#include <random>

#include "absl/strings/str_cat.h"
#include "client/cli/command.h"
#include "client/cli/progress.h"
#include "client/cpp/request_id.h"
#include "client/cpp/wire_dtype.h"
#include "core/dtype.h"
#include "core/status_macros.h"

namespace flce::cli {
namespace {

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace

void DeclareBench(FlagSet& flags) {
  flags.String("head", "head id", "demo");
  flags.Int("tokens", "tokens per step", "4096");
  flags.Int("steps", "timed steps", "10");
  flags.Int("warmup", "untimed steps first", "2");
  flags.Double("chunk-mb", "hidden bytes per message, MiB", "4");
  flags.Choice("dtype", {"bf16", "fp16", "fp32"}, "", "hidden dtype; default: the head's");
  flags.String("session", "session to accumulate into; default: a fresh one, deleted after");
  flags.Bool("forward-only", "no grad_input, no grad_W");
  flags.Int("seed", "random data seed", "1");
}

absl::StatusOr<CommandResult> RunBench(const FlagSet& flags, CliEnv& env) {
  const int64_t tokens = flags.i64("tokens"), steps = flags.i64("steps");
  const int64_t warmup = flags.i64("warmup");
  const double chunk_mb = flags.f64("chunk-mb");
  if (tokens < 1) return UsageError("bench", "--tokens must be >= 1");
  if (steps < 1) return UsageError("bench", "--steps must be >= 1");
  if (warmup < 0) return UsageError("bench", "--warmup must be >= 0");
  if (!(chunk_mb > 0)) return UsageError("bench", "--chunk-mb must be > 0");

  FLCE_ASSIGN_OR_RETURN(Client * client, env.client());
  FLCE_ASSIGN_OR_RETURN(v1::HeadInfo head, client->DescribeHead(flags.str("head")));
  v1::DType dtype = head.dtype();
  if (flags.has("dtype")) {
    FLCE_ASSIGN_OR_RETURN(dtype, ParseWireDType(flags.str("dtype")));
  }
  FLCE_ASSIGN_OR_RETURN(DType host_dtype, DTypeFromProto(dtype));
  const int64_t hidden_size = head.hidden_size();

  // h ~ N(0, 1) and uniform targets: the engine's cost does not depend on the
  // values, and these keep the loss finite for any head.
  std::mt19937_64 rng(static_cast<uint64_t>(flags.i64("seed")));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(tokens * hidden_size);
  for (float& v : values) v = normal(rng);
  std::string hidden(values.size() * DTypeSize(host_dtype), '\0');
  FromFloat(host_dtype, values.data(), hidden.data(), static_cast<int64_t>(values.size()));
  std::uniform_int_distribution<int32_t> target(0, static_cast<int32_t>(head.vocab_size() - 1));
  std::vector<int32_t> targets(tokens);
  for (int32_t& t : targets) t = target(rng);

  const bool own_session = !flags.has("session");
  const std::string session = own_session ? "bench-" + NewRequestId() : flags.str("session");
  const bool forward_only = flags.flag("forward-only");
  ComputeArgs args;
  args.header.set_head_id(head.head_id());
  args.header.set_session_id(session);
  args.header.set_hidden_dtype(dtype);
  args.header.mutable_outputs()->set_forward_only(forward_only);
  args.targets = targets;
  args.hidden = hidden;
  args.chunk_bytes = static_cast<int64_t>(chunk_mb * (1 << 20));

  Progress progress(env.show_progress(), env.err(), "bench " + head.head_id());
  std::vector<double> step_ms, engine_ms;
  ComputeOutcome last;
  absl::Status failed;
  for (int64_t step = 0; step < warmup + steps; ++step) {
    args.header.clear_request_id();  // a fresh id each step: a replay would skip the work
    args.grad_input_storage = &last.grad_input;  // as a trainer reusing its buffer would
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<ComputeOutcome> outcome = client->Compute(args);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (!outcome.ok()) {
      failed = outcome.status();
      break;
    }
    if (step >= warmup) {
      step_ms.push_back(ms);
      engine_ms.push_back(outcome->summary.timings().engine_ms());
    }
    last = *std::move(outcome);
    progress.Update(step + 1, warmup + steps, "steps");
  }
  if (own_session && !forward_only) {
    // Best effort: the bench's gradient is of no use to anyone.
    (void)client->DeleteSession(head.head_id(), session);
  }
  if (!failed.ok()) return failed;

  const double median_ms = Median(step_ms);
  const int64_t bytes_up = static_cast<int64_t>(hidden.size() + targets.size() * 4);
  const int64_t bytes_down = static_cast<int64_t>(last.grad_input.size());
  const double step_s = median_ms / 1e3;
  return CommandResult{{{"head", head.head_id()},
                        {"vocab_size", head.vocab_size()},
                        {"hidden_size", hidden_size},
                        {"hidden_dtype", WireDTypeName(dtype)},
                        {"tokens", tokens},
                        {"steps", steps},
                        {"forward_only", forward_only},
                        {"engine", last.summary.engine()},
                        {"strategy_used", last.summary.strategy_used()},
                        {"kernels", last.summary.kernels()},
                        {"transport", last.transport},
                        {"connections", last.connections},
                        {"step_ms",
                         {{"median", median_ms},
                          {"min", *std::min_element(step_ms.begin(), step_ms.end())},
                          {"max", *std::max_element(step_ms.begin(), step_ms.end())}}},
                        {"engine_ms_median", Median(engine_ms)},
                        {"tokens_per_s", tokens / step_s},
                        {"bytes_up_per_step", bytes_up},
                        {"bytes_down_per_step", bytes_down},
                        {"gb_per_s_up", bytes_up / step_s / 1e9},
                        {"gb_per_s_down", bytes_down / step_s / 1e9},
                        {"loss", last.summary.loss()}}};
}

}  // namespace flce::cli
