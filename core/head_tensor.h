// The two tensors of an LM head (and the two parameter groups its optimizer
// trains): the V x H weight and the length-V bias.
#ifndef FLCE_CORE_HEAD_TENSOR_H_
#define FLCE_CORE_HEAD_TENSOR_H_

namespace flce {

enum class HeadTensor { kWeight, kBias };

inline const char* HeadTensorName(HeadTensor tensor) {
  return tensor == HeadTensor::kWeight ? "weight" : "bias";
}

}  // namespace flce

#endif  // FLCE_CORE_HEAD_TENSOR_H_
