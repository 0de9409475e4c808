// SaveCheckpoint and LoadCheckpoint: a head trained on the server survives a
// restart. A checkpoint is a .safetensors file in the caller's own directory
// under --checkpoint-dir (ckpt_dir/<tenant dir>/<name>.safetensors), written
// crash-safe (WriteSafetensors). The handlers' logic, free of gRPC.
//
// Tensors: "weight" [V, H] and "bias" [V] in the head's dtype; with optimizer
// state, per group g in {weight, bias}: "g.master" (F32, 16-bit heads only: an
// fp32 head's weight is its master) and torch's state names "g.momentum_buffer"
// (SGD), "g.exp_avg", "g.exp_avg_sq", "g.max_exp_avg_sq" (AdamW), F32.
// Metadata (strings): format "flce-checkpoint/1", flce_version, head_id,
// vocab_size, hidden_size, dtype (BF16/F16/F32), has_bias, head_version,
// optimizer (none/sgd/adamw), steps, skipped_steps, and per group
// "g.weight_decay", "g.momentum", "g.dampening", "g.nesterov", "g.beta1",
// "g.beta2", "g.eps", "g.amsgrad" (doubles with 17 significant digits).
#ifndef FLCE_SERVER_HANDLERS_HEAD_CHECKPOINT_H_
#define FLCE_SERVER_HANDLERS_HEAD_CHECKPOINT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "flce/v1/flce.pb.h"
#include "server/handlers/service_context.h"
#include "server/state/auth.h"

namespace flce::server {

inline constexpr char kCheckpointFormat[] = "flce-checkpoint/1";

// The tenant's directory name: "anonymous" for the tenant of a server without
// auth, "t-<tenant>" for a tenant of [A-Za-z0-9_-], else "x-<hex of tenant>"
// (no two tenants share one, none is another's prefix).
std::string TenantDirectoryName(const std::string& tenant);

// ckpt_dir/<tenant dir>/<name>.safetensors; INVALID_ARGUMENT for a name that is
// not 1-128 of [A-Za-z0-9._-] starting with an alphanumeric.
absl::StatusOr<std::string> CheckpointPath(const std::string& checkpoint_dir,
                                           const std::string& tenant, const std::string& name);

absl::Status SaveHeadCheckpoint(const ServiceContext& ctx, const Principal& who,
                                const v1::SaveCheckpointRequest& request, v1::CheckpointInfo* out);

absl::Status LoadHeadCheckpoint(const ServiceContext& ctx, const Principal& who,
                                const v1::LoadCheckpointRequest& request, v1::HeadInfo* out);

}  // namespace flce::server

#endif  // FLCE_SERVER_HANDLERS_HEAD_CHECKPOINT_H_
