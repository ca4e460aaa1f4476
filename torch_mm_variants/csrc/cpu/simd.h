// The SIMD micro-kernel of rungs 5-6 and its run-time choice of instruction set.
//
// A micro-kernel computes an mr x nr block of C from a packed panel of A (kc steps of mr values)
// and a packed panel of B (kc steps of nr values): per step, two vector loads of B, mr
// broadcasts of A and 2 * mr vector FMAs into accumulators that never leave registers. The
// shape follows the register file: AVX-512 has 32 vector registers (14 x 2 accumulators),
// AVX2 and the portable 128-bit fallback have 16 (6 x 2).
#pragma once

#include <cstdint>
#include <string>

namespace mm_variants::cpu::simd {

template <typename T>
struct MicroKernel {
  int mr, nr;
  // c[0:mr, 0:nr] = (accumulate ? c : 0) + a_panel^T * b_panel, c with row stride ldc.
  void (*run)(int64_t kc, const T* a_panel, const T* b_panel, T* c, int64_t ldc, bool accumulate);
};

// The micro-kernel of the selected instruction set, for float or double accumulation.
template <typename T>
MicroKernel<T> micro_kernel();
// Its block shape (mr, nr), for choices made before any kernel runs: unlike micro_kernel, it
// leaves last_isa as it is.
template <typename T>
MicroKernel<T> micro_kernel_shape();

// The selected instruction set: "avx512", "avx2" or "generic". The best one the CPU supports is
// chosen at load time; set_isa lets tests and benchmarks force a fallback.
std::string isa();
void set_isa(const std::string& name);
// The instruction set of the micro-kernel that micro_kernel() last returned.
std::string last_isa();

}  // namespace mm_variants::cpu::simd
