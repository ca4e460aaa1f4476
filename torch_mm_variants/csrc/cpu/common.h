// Shared pieces of the CPU ladder: a strided matrix view, the dtype dispatch and registration
// helpers. Every CPU rung reads its inputs through MatrixView, so transposed views and slices
// with a storage offset work without copies.
#pragma once

#include "../epilogue.h"
#include "../registry.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace mm_variants::cpu {

// Element (i, j) of a 2-D tensor with arbitrary strides.
template <typename T>
struct MatrixView {
  T* data;
  int64_t rows, cols, row_stride, col_stride;

  T& operator()(int64_t i, int64_t j) const { return data[i * row_stride + j * col_stride]; }
};

template <typename T>
MatrixView<T> view_of(const at::Tensor& t) {
  return {static_cast<T*>(t.data_ptr()), t.size(0), t.size(1), t.stride(0), t.stride(1)};
}

// Float32 accumulation for float, half and bfloat16; double for double.
template <typename T>
using acc_t = at::opmath_type<T>;

// linear's epilogue as a fused CPU kernel sees it.
template <typename T>
struct TypedEpilogue {
  const T* bias = nullptr;  // [N] or null
  Activation activation = Activation::kNone;

  acc_t<T> operator()(acc_t<T> sum, int64_t column) const {
    if (bias != nullptr) sum += static_cast<acc_t<T>>(bias[column]);
    return activate(sum, activation);
  }
};

// row[j] += scale * b(p, j) for j in [j0, j1): the streaming inner loop of rungs 2 and 3. The
// unit-stride case gets its own loop, which the compiler vectorizes.
template <typename T>
inline void add_scaled_row(acc_t<T>* row, acc_t<T> scale, MatrixView<const T> b, int64_t p,
                           int64_t j0, int64_t j1) {
  const T* b_row = &b(p, 0);
  if (b.col_stride == 1) {
    for (int64_t j = j0; j < j1; ++j) row[j] += scale * static_cast<acc_t<T>>(b_row[j]);
  } else {
    for (int64_t j = j0; j < j1; ++j) row[j] += scale * static_cast<acc_t<T>>(b_row[j * b.col_stride]);
  }
}

// Writes row-major partial sums into `out`, rounding each to T once, at the end.
template <typename T>
void store_sums(const std::vector<acc_t<T>>& sums, MatrixView<T> out) {
  for (int64_t i = 0; i < out.rows; ++i)
    for (int64_t j = 0; j < out.cols; ++j) out(i, j) = static_cast<T>(sums[i * out.cols + j]);
}

inline std::vector<c10::ScalarType> cpu_dtypes() {
  return {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble};
}

// Turns a rung (a struct with `template <typename T> static void run(MatrixView<const T> a,
// MatrixView<const T> b, MatrixView<T> out)`) into a registry kernel for the four CPU dtypes.
template <class Rung>
void run_rung(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "mm_variants_cpu",
                                  [&] {
                                    Rung::template run<scalar_t>(view_of<const scalar_t>(a),
                                                                 view_of<const scalar_t>(b),
                                                                 view_of<scalar_t>(out));
                                  });
}

// The same for rungs that fuse linear's epilogue: `run` takes a fourth argument, the bias as a
// T pointer (or null) and the activation.
template <class Rung>
void run_rung_fused(const at::Tensor& a, const at::Tensor& b, const Epilogue& epilogue,
                    at::Tensor& out) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "mm_variants_cpu",
                                  [&] {
                                    const scalar_t* bias = epilogue.bias.defined()
                                                               ? epilogue.bias.data_ptr<scalar_t>()
                                                               : nullptr;
                                    Rung::template run<scalar_t>(
                                        view_of<const scalar_t>(a), view_of<const scalar_t>(b),
                                        view_of<scalar_t>(out), {bias, epilogue.activation});
                                  });
}

}  // namespace mm_variants::cpu
