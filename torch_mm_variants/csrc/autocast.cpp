// Mixed precision: under torch.autocast the three ops run in the autocast dtype, as torch.mm,
// F.linear and torch.bmm do (they are on autocast's lower-precision list). float32 operands (and
// linear's bias) are cast to that dtype, on the CPU and on CUDA, with autocast's cache, so a
// weight is cast once per autocast region rather than once per call; float64 stays as it is.
// The call then goes on below the Autocast key, to autograd and the kernels.
#include "op_calls.h"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

namespace mm_variants {
namespace {

template <c10::DeviceType kDevice>
struct AutocastRegion {
  c10::impl::ExcludeDispatchKeyGuard no_autocast{
      at::autocast::get_autocast_dispatch_key_from_device_type(kDevice)};

  static at::Tensor cast(const at::Tensor& t) {
    return at::autocast::cached_cast(at::autocast::get_autocast_dtype(kDevice), t, kDevice);
  }
};

template <c10::DeviceType kDevice>
at::Tensor matmul_autocast(const at::Tensor& a, const at::Tensor& b, c10::string_view algorithm) {
  const AutocastRegion<kDevice> region;
  return matmul_op(region.cast(a), region.cast(b), algorithm);
}

template <c10::DeviceType kDevice>
at::Tensor linear_autocast(const at::Tensor& x, const at::Tensor& weight,
                           const c10::optional<at::Tensor>& bias, c10::string_view activation,
                           c10::string_view algorithm) {
  const AutocastRegion<kDevice> region;
  const c10::optional<at::Tensor> cast_bias =
      bias.has_value() ? c10::optional<at::Tensor>(region.cast(*bias)) : c10::nullopt;
  return linear_op(region.cast(x), region.cast(weight), cast_bias, activation, algorithm);
}

template <c10::DeviceType kDevice>
at::Tensor bmm_autocast(const at::Tensor& a, const at::Tensor& b, c10::string_view algorithm) {
  const AutocastRegion<kDevice> region;
  return bmm_op(region.cast(a), region.cast(b), algorithm);
}

}  // namespace
}  // namespace mm_variants

TORCH_LIBRARY_IMPL(mm_variants, AutocastCPU, m) {
  m.impl("matmul", &mm_variants::matmul_autocast<c10::DeviceType::CPU>);
  m.impl("linear", &mm_variants::linear_autocast<c10::DeviceType::CPU>);
  m.impl("bmm", &mm_variants::bmm_autocast<c10::DeviceType::CPU>);
}

TORCH_LIBRARY_IMPL(mm_variants, AutocastCUDA, m) {
  m.impl("matmul", &mm_variants::matmul_autocast<c10::DeviceType::CUDA>);
  m.impl("linear", &mm_variants::linear_autocast<c10::DeviceType::CUDA>);
  m.impl("bmm", &mm_variants::bmm_autocast<c10::DeviceType::CUDA>);
}
