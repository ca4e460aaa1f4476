// mm_variants::linear's epilogue (../epilogue.h) on the device: a functor that a kernel applies to
// each float32 sum of output column n just before rounding it to the output dtype. The activation
// is a template argument, so a kernel instantiated with NoEpilogue (the plain matmul) compiles to
// the code it had without one.
#pragma once

#include "../epilogue.h"

namespace mm_variants::cuda {

// The activations in float32, with the same formulas as the CPU's `activate` (epilogue.h).
template <Activation A>
__device__ __forceinline__ float activate(float x) {
  if constexpr (A == Activation::kRelu) {
    return x < 0.0f ? 0.0f : x;  // NaN stays NaN, as in torch.relu
  } else if constexpr (A == Activation::kGelu) {
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
  } else if constexpr (A == Activation::kGeluTanh) {
    return 0.5f * x * (1.0f + tanhf(0.79788456080286535588f * (x + 0.044715f * x * x * x)));
  } else if constexpr (A == Activation::kSilu) {
    // __fdividef: IEEE division's slow-path call would make a kernel's unrolled epilogue spill,
    // and its 2-ulp error is far below the output's rounding. Below x = -87 (a denominator past
    // 2^126) it returns 0, where silu's true value is under 2e-36 in magnitude.
    return __fdividef(x, 1.0f + expf(-x));
  } else {
    return x;
  }
}

// The plain matmul: sums are stored as they are.
struct NoEpilogue {
  __device__ __forceinline__ float operator()(float sum, int) const { return sum; }
  // The epilogue of the output's columns from n0 on, counted from 0 (a kernel run on a slice).
  NoEpilogue from_column(int) const { return *this; }
};

// bias[n] added (when there is a bias), then activation A. Kernels may call it for columns past
// the matrix edge, whose results they drop; the bias is not read there.
template <typename T, Activation A>
struct BiasActivation {
  const T* bias;  // [columns], or null
  int columns;

  __device__ __forceinline__ float operator()(float sum, int column) const {
    if (bias != nullptr && column < columns) sum += static_cast<float>(bias[column]);
    return activate<A>(sum);
  }
  BiasActivation from_column(int n0) const {
    return {bias != nullptr ? bias + n0 : nullptr, columns - n0};
  }
};

// Calls f(BiasActivation<T, A>{...}) with the epilogue's activation as the template argument A.
template <typename T, typename F>
void with_epilogue(const Epilogue& epilogue, F&& f) {
  const bool has_bias = epilogue.bias.defined();
  const T* bias = has_bias ? static_cast<const T*>(epilogue.bias.data_ptr()) : nullptr;
  const int columns = has_bias ? static_cast<int>(epilogue.bias.size(0)) : 0;
  switch (epilogue.activation) {
    case Activation::kNone: return f(BiasActivation<T, Activation::kNone>{bias, columns});
    case Activation::kRelu: return f(BiasActivation<T, Activation::kRelu>{bias, columns});
    case Activation::kGelu: return f(BiasActivation<T, Activation::kGelu>{bias, columns});
    case Activation::kGeluTanh: return f(BiasActivation<T, Activation::kGeluTanh>{bias, columns});
    case Activation::kSilu: return f(BiasActivation<T, Activation::kSilu>{bias, columns});
  }
  TORCH_INTERNAL_ASSERT(false, "mm_variants: unhandled activation");
}

}  // namespace mm_variants::cuda
