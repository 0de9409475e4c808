// One request on the CPU engine. Hidden rows arrive in any order; they are
// gathered into a token chunk (chunk_tokens rows) that runs as soon as it is
// full, and its grad_input goes to the sink at once, one message per run of
// consecutive tokens. Per-token results are kept per token and summed in token
// order at Finish, so the loss does not depend on arrival order or chunking.
#ifndef FLCE_KERNELS_CPU_CPU_COMPUTE_CALL_H_
#define FLCE_KERNELS_CPU_CPU_COMPUTE_CALL_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/cpu_context.h"
#include "kernels/cpu/cpu_grad_buffer.h"
#include "kernels/cpu/cpu_head.h"
#include "kernels/cpu/row_pass.h"
#include "kernels/engine.h"

namespace flce::cpu {

inline constexpr char kCpuStrategyName[] = "cpu_chunked";

class CpuComputeCall : public ComputeCall {
 public:
  // Validates spec against the head; grad_out must be a CpuGradBuffer.
  static absl::StatusOr<std::unique_ptr<CpuComputeCall>> Create(
      std::shared_ptr<CpuContext> ctx, std::shared_ptr<const Head> head, ComputeSpec spec,
      GradInputSink sink);
  ~CpuComputeCall() override;

  absl::Status AddHidden(int64_t token_offset, int64_t rows, const void* data) override;
  absl::StatusOr<ComputeResult> Finish() override;

 private:
  CpuComputeCall(std::shared_ptr<CpuContext> ctx, std::shared_ptr<const Head> head,
                 ComputeSpec spec, GradInputSink sink, CpuGradBuffer* grad,
                 int64_t chunk_tokens);
  // Runs the pending rows as one chunk and hands their grad_input to the sink.
  absl::Status Flush();

  std::shared_ptr<CpuContext> ctx_;
  std::shared_ptr<const Head> head_holder_;
  const CpuHead& head_;
  const ComputeSpec spec_;
  const GradInputSink sink_;
  CpuGradBuffer* const grad_;
  const int64_t chunk_tokens_;
  const int64_t hidden_size_;
  const bool want_grad_input_;

  std::mutex mu_;  // one AddHidden / Finish at a time
  bool finished_ = false;
  int64_t n_valid_ = 0;
  std::vector<int32_t> targets_;  // -1 = ignored
  std::vector<double> token_weights_;    // a_t (w_t under a policy objective)
  std::vector<double> entropy_weights_;  // e_t
  std::vector<uint8_t> received_;
  int64_t received_count_ = 0;
  std::vector<RowStats> stats_;  // per token
  double engine_ms_ = 0.0;
  double wait_ms_ = 0.0;

  // Rows waiting for their chunk, in arrival order.
  std::vector<float> pending_hidden_;  // chunk_tokens x H
  std::vector<int64_t> pending_tokens_;
  std::vector<int32_t> chunk_targets_;
  std::vector<double> chunk_token_weights_;
  std::vector<double> chunk_entropy_weights_;
  std::vector<PolicyRow> chunk_policy_rows_;  // under a policy objective
  std::vector<RowStats> chunk_stats_;
};

}  // namespace flce::cpu

#endif  // FLCE_KERNELS_CPU_CPU_COMPUTE_CALL_H_
