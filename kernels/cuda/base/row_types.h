// Plain structs shared by the row kernels and the host code that launches
// them: MATH.md's per-call options and the per-row inputs and outputs.
#ifndef FLCE_KERNELS_CUDA_BASE_ROW_TYPES_H_
#define FLCE_KERNELS_CUDA_BASE_ROW_TYPES_H_

#include <cstdint>

namespace flce::cuda {

struct LossParams {
  int64_t vocab = 0;  // real V: columns >= vocab are padding, excluded everywhere
  float label_smoothing = 0.0f;
  float z_loss_scale = 0.0f;
  float softcap = 0.0f;
  float temperature = 1.0f;
  float grad_scale = 1.0f;
  // Some e_t != 0: the backward needs per-element entropy terms, so the
  // logits-stats path keeps its dlogits pass (a hint; rows are checked again).
  bool entropy_weighted = false;
};

// Device arrays, one entry per row of the launch.
struct RowInputs {
  const int32_t* target = nullptr;        // -1 = ignored
  const float* token_weight = nullptr;    // a_t (0 for ignored tokens)
  const float* entropy_weight = nullptr;  // e_t
};

// Device arrays, one entry per row of the launch.
struct RowOutputs {
  float* loss = nullptr;     // l_t (0 for ignored tokens)
  float* z_loss = nullptr;   // s LSE^2 (0 for ignored tokens)
  float* logprob = nullptr;  // z_y - LSE (0 for ignored tokens)
  float* entropy = nullptr;
  int32_t* argmax = nullptr;
};

// Online-softmax state of one row over the columns seen so far. sez is
// sum_j exp(z_j - m) (z_j - m): kept relative to the running max so that a
// peaked row's entropy and loss come out without cancellation.
struct RowState {
  float m;
  float s;
  float sez;
  float sum_z;
  float zy;
  float amax_value;
  int32_t amax_index;
  int32_t pad;
};
static_assert(sizeof(RowState) == 32, "RowState is copied as 32 bytes");

// What the gradient pass needs per row, from the finished state.
struct RowGrad {
  float m;
  float lse;
  float mean_shift;    // sum_j p_j (z_j - m)
  float logprob;       // z_y - LSE (0 for ignored tokens)
  float coef_loss;     // grad_scale * a_t
  float coef_entropy;  // grad_scale * e_t
  int32_t target;
  int32_t pad;
};
static_assert(sizeof(RowGrad) == 32, "RowGrad is copied as 32 bytes");

}  // namespace flce::cuda

#endif  // FLCE_KERNELS_CUDA_BASE_ROW_TYPES_H_
