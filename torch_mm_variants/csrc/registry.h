// The algorithm registry: the single source of truth for which kernels exist.
//
// Every kernel file registers itself with one MM_VARIANTS_REGISTER line. The op looks the
// `algorithm` string up here, `torch_mm_variants.algorithms(device)` lists it, and the tests and
// the benchmark iterate that list, so a new kernel is one file and is tested and benchmarked
// automatically.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/string_view.h>

#include <string>
#include <vector>

namespace mm_variants {

// The op that messages name unless their caller names another (linear and bmm name their own).
inline constexpr char kMatmulOp[] = "mm_variants::matmul";

// Writes a @ b into out. `a` is [M, K] and `b` is [K, N] with arbitrary strides and storage
// offsets; `out` is a fresh contiguous [M, N] tensor of the inputs' dtype. The op has already
// validated shapes, dtypes and devices, and handled M, N or K == 0, so kernels see M, N, K >= 1.
using MatmulKernel = void (*)(const at::Tensor& a, const at::Tensor& b, at::Tensor& out);

struct Epilogue;
// The same, with bias and activation (epilogue.h) applied before the output is stored.
using FusedMatmulKernel = void (*)(const at::Tensor& a, const at::Tensor& b,
                                   const Epilogue& epilogue, at::Tensor& out);

// A whole mm_variants::bmm batch in one launch: out[i] = a[i] @ b[i], or a[i] @ b for a shared
// 2-D b. `a` is [B, M, K] and `b` [B, K, N] or [K, N], with arbitrary strides (entries of one
// tensor share their layout); `out` is a fresh contiguous [B, S] tensor whose row i starts with
// entry i's contiguous [M, N] result (S >= M * N, rows 16-byte aligned). B, M, N, K >= 1.
using BatchedMatmulKernel = void (*)(const at::Tensor& a, const at::Tensor& b, at::Tensor& out);

// Whether an algorithm can run on a given device (e.g. needs sm_90) or on given inputs
// (e.g. TF32 for float32 only when the user allows it). Null means "always".
using DevicePredicate = bool (*)(c10::Device device);
using InputPredicate = bool (*)(const at::Tensor& a, const at::Tensor& b);
// Whether `auto`'s heuristic passes an algorithm over on `entries` products of a and b run in one
// launch (1: a single product; more: a bmm batch in its batched kernel, a and b one entry each).
using DeferPredicate = bool (*)(const at::Tensor& a, const at::Tensor& b, int64_t entries);

struct Algorithm {
  std::string name;
  c10::DeviceType device_type;
  int rung;  // position on the ladder: the listing order, and `auto` prefers higher rungs
  std::vector<c10::ScalarType> dtypes;
  MatmulKernel run;
  DevicePredicate runs_on = nullptr;
  // Inputs this algorithm refuses although their dtype is listed; `why_not` explains the refusal.
  InputPredicate accepts = nullptr;
  const char* why_not = "";
  // False for kernels that exist for teaching only and should never be picked by `auto`.
  bool auto_candidate = true;
  // Set by kernels that fuse mm_variants::linear's bias and activation into their store.
  FusedMatmulKernel run_fused = nullptr;
  // Set by kernels that take a whole batch in one launch; bmm runs the others entry by entry.
  BatchedMatmulKernel run_batched = nullptr;
  // Inputs on which `auto`'s heuristic passes this algorithm over for the next lower rung that
  // takes them, because that one was measured faster there. Null: never.
  DeferPredicate defers_to_lower = nullptr;
  // Set by a kernel that `auto` considers only where every higher candidate defers the inputs
  // to a lower rung (a rung that wins only there, auto_candidate false): measured mode then
  // times it on those inputs alone, not on every product.
  bool auto_where_deferred_to = false;

  bool supports(c10::ScalarType dtype) const;
};

void register_algorithm(Algorithm algorithm);

// The algorithms that can run on `device`, in ladder order.
std::vector<const Algorithm*> algorithms_for(c10::Device device);

// Every registered name, for any device type, whether or not a device of this process can run
// it: once each, in ladder order.
std::vector<std::string> registered_names();

// A name the user gave, as an error message quotes it: control characters as \xNN escapes, since
// a NUL would end the message there, in Python, before the list of valid names.
std::string printable_name(c10::string_view name);

// Looks `name` up for `device`; throws a c10::Error listing the valid names when it is unknown.
const Algorithm& find_algorithm(c10::Device device, const std::string& name,
                                const char* op = kMatmulOp);

struct AlgorithmRegistrar {
  explicit AlgorithmRegistrar(Algorithm algorithm) { register_algorithm(std::move(algorithm)); }
};

}  // namespace mm_variants

#define MM_VARIANTS_CONCAT_INNER(x, y) x##y
#define MM_VARIANTS_CONCAT(x, y) MM_VARIANTS_CONCAT_INNER(x, y)
// Registers an algorithm at load time: MM_VARIANTS_REGISTER({"naive", c10::kCPU, 1, ...});
#define MM_VARIANTS_REGISTER(...)                                                  \
  static const ::mm_variants::AlgorithmRegistrar MM_VARIANTS_CONCAT(               \
      mm_variants_registrar_, __LINE__)(::mm_variants::Algorithm __VA_ARGS__)
