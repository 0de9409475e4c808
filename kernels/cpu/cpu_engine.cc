#include "kernels/cpu/cpu_engine.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cpu/cpu_compute_call.h"
#include "kernels/cpu/cpu_grad_buffer.h"
#include "kernels/cpu/cpu_head.h"
#include "kernels/cpu/cpu_optimizer.h"
#include "kernels/cpu/host_memory.h"
#include "kernels/engine_factory.h"
#include "kernels/optimizer_math.h"

namespace flce::cpu {

int ResolveThreads(const EngineConfig& config) {
  if (config.threads > 0) return config.threads;
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

CpuEngine::CpuEngine(const EngineConfig& config)
    : ctx_(std::make_shared<CpuContext>(ResolveThreads(config), config.workspace_bytes)) {}

EngineInfo CpuEngine::info() const {
  EngineInfo info;
  info.name = "cpu";
  info.workspace_budget_bytes = ctx_->budget;
  info.workspace_peak_bytes = ctx_->peak_bytes();
  info.policy_objectives = true;
  return info;
}

PhaseTimes CpuEngine::phase_times() const {
  std::lock_guard<std::mutex> lock(ctx_->mu);
  return ctx_->phase_times;
}

absl::StatusOr<std::unique_ptr<HeadBuilder>> CpuEngine::BeginHead(const HeadSpec& spec) {
  FLCE_ASSIGN_OR_RETURN(std::unique_ptr<CpuHeadBuilder> builder, CpuHeadBuilder::Create(spec));
  return std::unique_ptr<HeadBuilder>(std::move(builder));
}

absl::StatusOr<std::unique_ptr<GradBuffer>> CpuEngine::NewGradBuffer(const HeadSpec& spec) {
  if (spec.vocab_size <= 0 || spec.hidden_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("gradient shape ", spec.vocab_size, " x ",
                                                   spec.hidden_size, " must be positive"));
  }
  FLCE_ASSIGN_OR_RETURN(
      int64_t bytes,
      HostBytes("gradient buffer", {spec.vocab_size, spec.hidden_size + (spec.has_bias ? 1 : 0),
                                    static_cast<int64_t>(sizeof(float))}));
  const std::string what =
      absl::StrCat("a V=", spec.vocab_size, " H=", spec.hidden_size, " fp32 gradient buffer");
  FLCE_RETURN_IF_ERROR(CheckHostBytes(what.c_str(), bytes));
  std::unique_ptr<GradBuffer> buffer;
  FLCE_RETURN_IF_ERROR(TryAllocate(what.c_str(), bytes, [&] {
    buffer = std::make_unique<CpuGradBuffer>(spec.vocab_size, spec.hidden_size, spec.has_bias);
  }));
  return buffer;
}

absl::StatusOr<std::unique_ptr<ComputeCall>> CpuEngine::StartCompute(
    std::shared_ptr<const Head> head, ComputeSpec spec, GradInputSink sink) {
  FLCE_RETURN_IF_ERROR(RefuseTwoPassSpec(spec, "cpu"));
  FLCE_ASSIGN_OR_RETURN(
      std::unique_ptr<CpuComputeCall> call,
      CpuComputeCall::Create(ctx_, std::move(head), std::move(spec), std::move(sink)));
  return std::unique_ptr<ComputeCall>(std::move(call));
}

absl::StatusOr<std::unique_ptr<HeadOptimizer>> CpuEngine::CreateOptimizer(
    std::shared_ptr<const Head> head, const OptimizerConfig& config) {
  auto cpu_head = std::dynamic_pointer_cast<const CpuHead>(head);
  if (cpu_head == nullptr) return absl::InvalidArgumentError("not a head of the CPU engine");
  const HeadSpec& spec = cpu_head->spec();
  const bool master = spec.dtype != DType::kF32;
  const int64_t weight_arrays = StateArrayCount(config.kind, config.weight, master);
  const int64_t bias_arrays = spec.has_bias ? StateArrayCount(config.kind, config.bias, master) : 0;
  FLCE_ASSIGN_OR_RETURN(
      int64_t bytes,
      HostBytes("optimizer state", {spec.vocab_size, spec.hidden_size * weight_arrays + bias_arrays,
                                    static_cast<int64_t>(sizeof(float))}));
  const std::string what =
      absl::StrCat("the ", OptimizerName(config.kind), " state of a V=", spec.vocab_size,
                   " H=", spec.hidden_size, " head");
  FLCE_RETURN_IF_ERROR(CheckHostBytes(what.c_str(), bytes));
  absl::StatusOr<std::unique_ptr<CpuHeadOptimizer>> optimizer;
  FLCE_RETURN_IF_ERROR(TryAllocate(
      what.c_str(), bytes, [&] { optimizer = CpuHeadOptimizer::Create(cpu_head, config); }));
  if (!optimizer.ok()) return optimizer.status();
  return std::unique_ptr<HeadOptimizer>(std::move(*optimizer));
}

}  // namespace flce::cpu

namespace flce {

absl::StatusOr<std::unique_ptr<Engine>> CreateCpuEngine(const EngineConfig& config) {
  if (config.workspace_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("workspace_bytes is ", config.workspace_bytes, ", must be > 0"));
  }
  if (config.threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads is ", config.threads, ", must be >= 0 (0 = all cores)"));
  }
  return std::unique_ptr<Engine>(std::make_unique<cpu::CpuEngine>(config));
}

}  // namespace flce
