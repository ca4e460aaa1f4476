// mm_variants::bmm: a batch of products, out[i] = a[i] @ b[i] for a [B, M, K] and b [B, K, N],
// or out[i] = a[i] @ b for a shared 2-D b [K, N] (e.g. a weight).
//
// One kernel serves every device (CompositeExplicitAutograd): it validates once and chooses the
// algorithm once for the batch's shape. Against a shared b, a batch whose entries' rows follow
// one another at one stride (a contiguous a, or entries of one row) is one product of B * M rows
// (batch_as_rows): the shared matrix, often a weight, is read once instead of once per entry, and
// the one launch has all the rows to fill the GPU with (B sequences of one token each against a
// weight stream it once, at B tokens). Otherwise, algorithms with a batched kernel (run_batched)
// take the whole batch in one launch; the others run on each batch entry's views, which every
// algorithm reads in place whatever their strides. auto runs a batch of small entries in one
// launch (batch_algorithm). Each entry's output starts on a 16-byte boundary, as the
// vectorized stores of the GPU kernels need; when M * N elements do not fill whole 16-byte units
// the padded result is compacted at the end.
#include "auto.h"
#include "matmul.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <climits>
#include <optional>

namespace mm_variants {
namespace {

void check_bmm_inputs(const at::Tensor& a, const at::Tensor& b) {
  check_strided("mm_variants::bmm", "a", a);
  check_strided("mm_variants::bmm", "b", b);
  TORCH_CHECK(a.dim() == 3, "mm_variants::bmm: a must be a batch of matrices [B, M, K], got a ",
              a.dim(), "-D tensor");
  TORCH_CHECK(b.dim() == 3 || b.dim() == 2,
              "mm_variants::bmm: b must be [B, K, N] or a shared [K, N], got a ", b.dim(),
              "-D tensor");
  TORCH_CHECK(b.dim() == 2 || b.size(0) == a.size(0),
              "mm_variants::bmm: a and b have different batch sizes (", a.size(0), " and ",
              b.size(0), ")");
  TORCH_CHECK(a.size(2) == b.size(-2), "mm_variants::bmm: a and b shapes cannot be multiplied (",
              a.sizes(), " and ", b.sizes(), ")");
}

// The matrix that batch entry i multiplies by: b's i-th, or the shared one.
at::Tensor b_entry(const at::Tensor& b, int64_t i) { return b.dim() == 3 ? b.select(0, i) : b; }

// The matrix every entry multiplies by, where they share one: a 2-D b, or a 3-D b of one entry
// or expanded from one (batch stride 0).
std::optional<at::Tensor> shared_b(const at::Tensor& b) {
  if (b.dim() == 2) return b;
  if (b.size(0) == 1 || b.stride(0) == 0) return b.select(0, 0);
  return std::nullopt;
}

// a [B, M, K] as one [B * M, K] matrix, where the entries' rows follow one another at one stride:
// a contiguous batch (or any whose entries lie M rows apart), entries of one row, a batch of one.
std::optional<at::Tensor> batch_as_rows(const at::Tensor& a) {
  const int64_t batch = a.size(0), m = a.size(1);
  // The CUDA kernels take fewer than 2^31 rows (with_gemm); the entries apart they would run.
  if (a.is_cuda() && batch * m > INT_MAX) return std::nullopt;
  if (m == 1) return a.select(1, 0);
  if (batch == 1) return a.select(0, 0);
  if (a.stride(0) != m * a.stride(1)) return std::nullopt;
  return a.view({batch * m, a.size(2)});
}

// Whether `algorithm` runs rows @ b as one product: auto always, a named algorithm where it takes
// that many rows (a skinny rung takes a few; a batch of more then runs as a batch). Inputs that
// the checks refuse, and unknown names, go the batch's way to those checks.
bool runs_as_one_product(c10::string_view algorithm, const at::Tensor& rows, const at::Tensor& b) {
  if (algorithm == "auto") return true;
  if (rows.scalar_type() != b.scalar_type() || rows.device() != b.device()) return false;
  for (const Algorithm* named : algorithms_for(rows.device())) {
    if (named->name == algorithm) {
      return named->supports(rows.scalar_type()) &&
             (named->accepts == nullptr || named->accepts(rows, b));
    }
  }
  return false;
}

// Output elements of a batch entry below which auto runs the batch in one launch of the highest
// rung with a batched kernel, rather than its choice for one entry in a launch per entry: 2^21,
// 64 tiles of 128 x 256, half the SMs of an H100. There (bf16, and float32 in TF32; torch.bmm
// beside each) batches of 8-64 entries of 128 x 128 to 1024 x 1024 outputs ran at 0.64-0.87x of
// torch.bmm in tensor_core's batched kernel and at 0.01-0.45x in wgmma's launches; batches of 8
// entries of 2048 x 2048 and 2-4 of 4096 x 4096 at 0.87-1.08x in wgmma's and 0.59-0.71x batched.
// Entries of at most kDecodeRows rows (a few tokens each, as attention's products are at decode)
// run in one launch of the batched rung that auto's heuristic picks among those with a batched
// kernel (rungs 10-12), where auto's choice for one entry has none: a launch per entry cost 5-7
// us of the host's time each, and ran at 0.02-0.12x of torch.bmm on batches of 32-128 such
// products on an H200 (decode.md, "Batches of decode products"). Where that choice has a batched
// kernel, the batch keeps it unless the heuristic, told the count of entries, picks another: rung
// 12 on the many short rows of q @ k^T in 16 bits, where rung 10 ran at 0.26-0.89x of torch.bmm
// and rung 12 at 0.66-1.19x (skinny_gemv's short_k_takes), or rung 10 where rung 11 defers a
// batch to it (skinny_tma's batch_goes_lower).
constexpr int64_t kSmallEntryOutput = int64_t(1) << 21;
constexpr int64_t kDecodeRows = 64;

}  // namespace

const Algorithm& batch_algorithm(const Algorithm& chosen, c10::string_view requested,
                                 const at::Tensor& a_entry, const at::Tensor& b_entry,
                                 int64_t batch) {
  const int64_t rows = a_entry.size(0), entry_output = rows * b_entry.size(1);
  if (requested != "auto" || batch < 2 ||
      (rows > kDecodeRows && entry_output >= kSmallEntryOutput)) {
    return chosen;
  }
  const Algorithm* batched = batched_candidate(a_entry, b_entry, batch);
  if (batched == nullptr) return chosen;
  if (chosen.run_batched == nullptr) return *batched;
  // Kept, but where the entries together lead the heuristic elsewhere than one entry does (asked
  // only where the batch's pick differs from it: the second scan costs host time).
  if (batched == &chosen) return chosen;
  return batched != batched_candidate(a_entry, b_entry, 1) ? *batched : chosen;
}

namespace {

at::Tensor bmm(const at::Tensor& a, const at::Tensor& b, c10::string_view algorithm) {
  const BatchChoice choice = batch_choice_inputs(a, b, algorithm);
  const c10::OptionalDeviceGuard guard(a.device());
  const Algorithm& resolved = resolve_algorithm("mm_variants::bmm", choice.a, choice.b, algorithm);
  const int64_t batch = a.size(0), m = a.size(1), k = a.size(2), n = b.size(-1);
  if (batch == 0) return at::empty({0, m, n}, a.options());
  if (m == 0 || n == 0 || k == 0) return at::zeros({batch, m, n}, a.options());
  if (choice.one_product) {
    at::Tensor out = new_output(batch * m, n, a.options());
    resolved.run(choice.a, choice.b, out);
    return out.view({batch, m, n});
  }
  const Algorithm& chosen = batch_algorithm(resolved, algorithm, choice.a, choice.b, batch);

  const int64_t per_unit = std::max<int64_t>(1, 16 / static_cast<int64_t>(a.element_size()));
  const int64_t stride = (m * n + per_unit - 1) / per_unit * per_unit;  // elements per entry
  at::Tensor storage = new_output(batch, stride, a.options());
  if (chosen.run_batched != nullptr) {
    chosen.run_batched(a, b, storage);
  } else {
    for (int64_t i = 0; i < batch; ++i) {
      at::Tensor out = storage.select(0, i).narrow(0, 0, m * n).view({m, n});
      chosen.run(a.select(0, i), b_entry(b, i), out);
    }
  }
  const at::Tensor result = storage.narrow(1, 0, m * n);
  return (stride == m * n ? result : result.contiguous()).view({batch, m, n});
}

}  // namespace

BatchChoice batch_choice_inputs(const at::Tensor& a, const at::Tensor& b,
                                c10::string_view algorithm) {
  check_bmm_inputs(a, b);
  const int64_t k = a.size(2);
  // An empty batch runs nothing but gets the checks of any other: dtypes, devices, the name.
  if (a.size(0) == 0) return {a.new_empty({0, k}), b.new_empty({k, 0}), false};
  if (const std::optional<at::Tensor> shared = shared_b(b)) {
    const std::optional<at::Tensor> rows = batch_as_rows(a);
    if (rows && runs_as_one_product(algorithm, *rows, *shared)) return {*rows, *shared, true};
  }
  return {a.select(0, 0), b_entry(b, 0), false};
}

}  // namespace mm_variants

TORCH_LIBRARY_FRAGMENT(mm_variants, m) {
  m.def("bmm(Tensor a, Tensor b, str algorithm=\"auto\") -> Tensor");
}

TORCH_LIBRARY_IMPL(mm_variants, CompositeExplicitAutograd, m) {
  m.impl("bmm", &mm_variants::bmm);
}

// A nested operand's keys are not CompositeExplicitAutograd's: there the same kernel's input
// checks refuse it by name (check_strided) instead of the dispatcher's "Could not run".
TORCH_LIBRARY_IMPL(mm_variants, NestedTensorCPU, m) { m.impl("bmm", &mm_variants::bmm); }
TORCH_LIBRARY_IMPL(mm_variants, NestedTensorCUDA, m) { m.impl("bmm", &mm_variants::bmm); }
