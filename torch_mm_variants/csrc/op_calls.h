// The three ops called through the dispatcher, for kernels that call an op from inside another
// dispatch key's kernel (autograd.cpp, autocast.cpp): the call goes on from the keys that are
// still active, e.g. below autograd under at::AutoDispatchBelowADInplaceOrView, with a gradient
// record otherwise.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

namespace mm_variants {

inline at::Tensor matmul_op(const at::Tensor& a, const at::Tensor& b, c10::string_view algorithm) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mm_variants::matmul", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>();
  return op.call(a, b, algorithm);
}

inline at::Tensor linear_op(const at::Tensor& x, const at::Tensor& weight,
                            const c10::optional<at::Tensor>& bias, c10::string_view activation,
                            c10::string_view algorithm) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mm_variants::linear", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&,
                            c10::string_view, c10::string_view)>();
  return op.call(x, weight, bias, activation, algorithm);
}

inline at::Tensor bmm_op(const at::Tensor& a, const at::Tensor& b, c10::string_view algorithm) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mm_variants::bmm", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>();
  return op.call(a, b, algorithm);
}

}  // namespace mm_variants
