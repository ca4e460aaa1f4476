// Instantiations of the micro-kernel for each instruction set, chosen at run time.
//
// One generic body written with GCC vector extensions is compiled three times, inside functions
// carrying different `target` attributes, so one binary holds AVX-512, AVX2+FMA and portable
// code and picks what the running CPU supports.
#include "simd.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <cstring>

namespace mm_variants::cpu::simd {
namespace {

template <typename T, int kVectorBytes, int kMR>
__attribute__((always_inline)) inline void micro_kernel_body(int64_t kc, const T* __restrict a,
                                                             const T* __restrict b,
                                                             T* __restrict c, int64_t ldc,
                                                             bool accumulate) {
  typedef T Vec __attribute__((vector_size(kVectorBytes)));
  constexpr int kLanes = kVectorBytes / sizeof(T);
  Vec lo[kMR], hi[kMR];
#pragma GCC unroll 16
  for (int i = 0; i < kMR; ++i) lo[i] = hi[i] = Vec{};
  for (int64_t p = 0; p < kc; ++p, a += kMR, b += 2 * kLanes) {
    Vec b_lo, b_hi;
    std::memcpy(&b_lo, b, sizeof(Vec));
    std::memcpy(&b_hi, b + kLanes, sizeof(Vec));
#pragma GCC unroll 16
    for (int i = 0; i < kMR; ++i) {
      lo[i] += a[i] * b_lo;
      hi[i] += a[i] * b_hi;
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < kMR; ++i) {
    T* row = c + i * ldc;
    if (accumulate) {
      Vec c_lo, c_hi;
      std::memcpy(&c_lo, row, sizeof(Vec));
      std::memcpy(&c_hi, row + kLanes, sizeof(Vec));
      lo[i] += c_lo;
      hi[i] += c_hi;
    }
    std::memcpy(row, &lo[i], sizeof(Vec));
    std::memcpy(row + kLanes, &hi[i], sizeof(Vec));
  }
}

constexpr int kMRWide = 14, kMRNarrow = 6;

#if defined(__GNUC__) && defined(__x86_64__)
template <typename T>
__attribute__((target("avx512f,fma"))) void run_avx512(int64_t kc, const T* a, const T* b, T* c,
                                                      int64_t ldc, bool accumulate) {
  micro_kernel_body<T, 64, kMRWide>(kc, a, b, c, ldc, accumulate);
}

template <typename T>
__attribute__((target("avx2,fma"))) void run_avx2(int64_t kc, const T* a, const T* b, T* c,
                                                 int64_t ldc, bool accumulate) {
  micro_kernel_body<T, 32, kMRNarrow>(kc, a, b, c, ldc, accumulate);
}
#endif

template <typename T>
void run_generic(int64_t kc, const T* a, const T* b, T* c, int64_t ldc, bool accumulate) {
  micro_kernel_body<T, 16, kMRNarrow>(kc, a, b, c, ldc, accumulate);
}

enum class Isa { kGeneric, kAvx2, kAvx512 };

Isa best_supported() {
#if defined(__GNUC__) && defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
#endif
  return Isa::kGeneric;
}

std::atomic<Isa>& selected() {
  static std::atomic<Isa> isa{best_supported()};
  return isa;
}

// The instruction set of the micro-kernel last handed out: what ran, where `selected` is what
// was asked for (tests check that a forced fallback really runs).
std::atomic<Isa>& last_handed_out() {
  static std::atomic<Isa> isa{best_supported()};
  return isa;
}

std::string isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    default: return "generic";
  }
}

// The instruction set whose micro-kernel runs when `isa` is selected: the portable one where
// this build has no x86 kernels.
Isa available(Isa isa) {
#if defined(__GNUC__) && defined(__x86_64__)
  return isa;
#else
  (void)isa;
  return Isa::kGeneric;
#endif
}

template <typename T>
MicroKernel<T> kernel_of(Isa isa) {
  constexpr int kLanes128 = 16 / sizeof(T);
  switch (isa) {
#if defined(__GNUC__) && defined(__x86_64__)
    case Isa::kAvx512: return {kMRWide, 8 * kLanes128, &run_avx512<T>};
    case Isa::kAvx2: return {kMRNarrow, 4 * kLanes128, &run_avx2<T>};
#endif
    default: return {kMRNarrow, 2 * kLanes128, &run_generic<T>};
  }
}

}  // namespace

template <typename T>
MicroKernel<T> micro_kernel() {
  const Isa isa = available(selected().load());
  last_handed_out().store(isa, std::memory_order_relaxed);
  return kernel_of<T>(isa);
}

template <typename T>
MicroKernel<T> micro_kernel_shape() {
  return kernel_of<T>(available(selected().load()));
}

template MicroKernel<float> micro_kernel<float>();
template MicroKernel<double> micro_kernel<double>();
template MicroKernel<float> micro_kernel_shape<float>();
template MicroKernel<double> micro_kernel_shape<double>();

std::string isa() { return isa_name(selected().load()); }

std::string last_isa() { return isa_name(last_handed_out().load()); }

void set_isa(const std::string& name) {
  const Isa best = best_supported();
  Isa wanted;
  if (name == "avx512") {
    wanted = Isa::kAvx512;
  } else if (name == "avx2") {
    wanted = Isa::kAvx2;
  } else if (name == "generic") {
    wanted = Isa::kGeneric;
  } else {
    TORCH_CHECK(false, "mm_variants: unknown CPU instruction set '", name,
                "'; valid: avx512, avx2, generic");
  }
  TORCH_CHECK(wanted <= best, "mm_variants: this CPU does not support ", name);
  selected().store(wanted);
}

}  // namespace mm_variants::cpu::simd
