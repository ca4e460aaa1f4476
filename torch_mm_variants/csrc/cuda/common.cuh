// Pieces shared by every CUDA rung. Host side: the dtype dispatch, the operand layout, the
// problem handed to a kernel (Gemm) with the layouts as template arguments, the grid and the
// shared-memory opt-in. Device side: conversions, vector loads, the predicated global -> shared
// tile copy (TileLoader), the outer-product update and the predicated output store.
#pragma once

#include "../registry.h"

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>

#include <climits>
#include <cstring>
#include <map>
#include <tuple>
#include <memory>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace mm_variants::cuda {

inline std::vector<c10::ScalarType> cuda_dtypes() { return {at::kFloat, at::kHalf, at::kBFloat16}; }

// Runs the lambda with `scalar_t` bound to float, c10::Half or c10::BFloat16.
#define MM_VARIANTS_DISPATCH_CUDA_DTYPES(TYPE, NAME, ...)          \
  AT_DISPATCH_SWITCH(TYPE, NAME,                                   \
                     AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__)     \
                     AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__)      \
                     AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__))

// A matrix as BLAS sees it: element (i, j) is data[i * ld + j] when row-major and
// data[i + j * ld] when column-major (a transposed view of a row-major tensor).
template <typename T>
struct Operand {
  const T* data;
  int64_t ld;
  bool col_major;

  __device__ __forceinline__ T at(int64_t i, int64_t j) const {
    return col_major ? data[i + j * ld] : data[i * ld + j];
  }
};

// Whether `t` can be read as a row-major matrix (unit column stride, rows do not overlap).
inline bool is_row_major(const at::Tensor& t) {
  return (t.stride(1) == 1 || t.size(1) == 1) && (t.stride(0) >= t.size(1) || t.size(0) == 1);
}

// Whether `t` can be read as a column-major matrix, e.g. w.t() for an nn.Linear weight w.
inline bool is_col_major(const at::Tensor& t) {
  return (t.stride(0) == 1 || t.size(0) == 1) && (t.stride(1) >= t.size(0) || t.size(1) == 1);
}

// Returns `t` itself when it is row- or column-major, else a contiguous copy: general strides
// (e.g. a[:, ::2], or expanded zero strides) are rare and not worth a kernel variant.
inline at::Tensor with_unit_stride(const at::Tensor& t) {
  return is_row_major(t) || is_col_major(t) ? t : t.contiguous();
}

// The BLAS view of a tensor that passed through with_unit_stride.
template <typename T>
Operand<T> operand_of(const at::Tensor& t) {
  const T* data = static_cast<const T*>(t.data_ptr());
  if (is_row_major(t)) return {data, t.size(0) == 1 ? t.size(1) : t.stride(0), false};
  return {data, t.size(1) == 1 ? t.size(0) : t.stride(1), true};
}

// Whether a pointer and leading dimension allow `bytes`-wide vector loads.
template <typename T>
bool vector_aligned(const Operand<T>& op, int bytes) {
  return reinterpret_cast<uintptr_t>(op.data) % bytes == 0 && (op.ld * sizeof(T)) % bytes == 0;
}

inline unsigned ceil_div(int64_t x, int64_t y) { return static_cast<unsigned>((x + y - 1) / y); }

// ---- The problem as the SIMT kernels see it ------------------------------------------------

// An operand read along the reduction dimension k: element (x, k), where x is the row m of A or
// the column n of B. K_CONTIGUOUS says which dimension is adjacent in memory: k for a row-major
// A or a column-major B (w.t() of an nn.Linear weight), x for the other two. As a template
// argument it lets a kernel read all four layouts in place with no branch in its loops.
template <typename T, bool K_CONTIGUOUS>
struct Panel {
  using scalar = T;
  static constexpr bool k_contiguous = K_CONTIGUOUS;
  const T* data;
  int64_t ld;

  // 64-bit: x * ld and k * ld pass 2^31 elements on large operands.
  __device__ __forceinline__ const T* at(int x, int k) const {
    return K_CONTIGUOUS ? data + static_cast<int64_t>(x) * ld + k
                        : data + static_cast<int64_t>(k) * ld + x;
  }

  // The elements from one k to the next along x's line.
  __host__ __device__ __forceinline__ int64_t k_step() const { return K_CONTIGUOUS ? 1 : ld; }

  // The panel from x = x0 on (the columns of B from n0: a slice of the product's columns).
  __host__ __device__ Panel from(int64_t x0) const {
    return {K_CONTIGUOUS ? data + x0 * ld : data + x0, ld};
  }

  // Whether loads of `bytes` along the contiguous dimension, starting at a multiple of their
  // width, are aligned: the base pointer and the leading dimension both allow it.
  bool aligned(int bytes) const {
    return reinterpret_cast<uintptr_t>(data) % bytes == 0 && (ld * sizeof(T)) % bytes == 0;
  }
};

// out[M, N] = a[M, K] @ b[K, N]; out's rows are ldc elements apart: N for the whole product
// (with_gemm), more for a slice of its columns. 32-bit sizes.
template <typename T, bool A_K_CONTIGUOUS, bool B_K_CONTIGUOUS>
struct Gemm {
  using scalar = T;
  Panel<T, A_K_CONTIGUOUS> a;  // x = m
  Panel<T, B_K_CONTIGUOUS> b;  // x = n
  T* c;
  int M, N, K;
  int ldc;

  __device__ __forceinline__ T* c_at(int m, int n) const {
    return c + static_cast<int64_t>(m) * ldc + n;
  }
};

// Calls f(std::bool_constant<flag>...): turns run-time flags into template arguments.
template <typename F>
void dispatch_bools(F&& f) {
  f();
}

template <typename F, typename... Flags>
void dispatch_bools(F&& f, bool first, Flags... rest) {
  auto with_first = [&](auto first_c) {
    dispatch_bools([&](auto... rest_c) { f(first_c, rest_c...); }, rest...);
  };
  if (first) {
    with_first(std::true_type{});
  } else {
    with_first(std::false_type{});
  }
}

// Calls f(c10::BFloat16{}) for bf16 and f(c10::Half{}) otherwise: the dispatch of the kernels
// that take only 16-bit inputs (their registrations list no other dtype).
template <typename F>
void dispatch_16bit(at::ScalarType dtype, F&& f) {
  if (dtype == at::kBFloat16) {
    f(c10::BFloat16{});
  } else {
    f(c10::Half{});
  }
}

// Calls f(gemm) with the Gemm for out = a @ b, its operand layouts as template arguments (four
// instantiations). Row- and column-major operands are read in place, at any storage offset and
// leading dimension; other strides are copied first (with_unit_stride).
template <typename T, typename F>
void with_gemm(const at::Tensor& a_in, const at::Tensor& b_in, at::Tensor& out, F&& f) {
  const at::Tensor a = with_unit_stride(a_in), b = with_unit_stride(b_in);
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  TORCH_CHECK(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX,
              "torch_mm_variants: the CUDA kernels take dimensions below 2^31, got ", M, "x", K,
              " and ", K, "x", N);
  TORCH_INTERNAL_ASSERT(out.is_contiguous() && reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0,
                        "mm_variants: kernels write a fresh contiguous output");
  const Operand<T> A = operand_of<T>(a), B = operand_of<T>(b);
  T* c = static_cast<T*>(out.data_ptr());
  dispatch_bools(
      [&](auto a_k, auto b_k) {
        using G = Gemm<T, decltype(a_k)::value, decltype(b_k)::value>;
        f(G{{A.data, A.ld}, {B.data, B.ld}, c, static_cast<int>(M), static_cast<int>(N),
            static_cast<int>(K), static_cast<int>(N)});
      },
      !A.col_major, B.col_major);
}

// Calls f(std::integral_constant<int, VEC>): 16-byte global loads (VEC = 16 / sizeof(T)) when both
// operands are aligned for them, else scalar loads, so a misaligned view never faults.
template <typename G, typename F>
void with_vector_width(const G& g, F&& f) {
  constexpr int kVec = 16 / sizeof(typename G::scalar);
  if (g.a.aligned(16) && g.b.aligned(16)) {
    f(std::integral_constant<int, kVec>{});
  } else {
    f(std::integral_constant<int, 1>{});
  }
}

// One block per BM x BN output tile, on a 1-D grid (gridDim.y would cap the tile rows at 65535).
template <int BM, int BN, typename G>
dim3 tile_grid(const G& g) {
  const int64_t tiles = static_cast<int64_t>(ceil_div(g.M, BM)) * ceil_div(g.N, BN);
  TORCH_CHECK(tiles <= INT_MAX, "torch_mm_variants: output ", g.M, "x", g.N,
              " has too many tiles for one grid");
  return dim3(static_cast<unsigned>(tiles));
}

// Lets `kernel` launch with `bytes` of dynamic shared memory on the current device: above 48 KB a
// kernel must opt in, once per device. Host-side bookkeeping only (no sync, graph-capture safe).
template <typename Kernel>
void allow_dynamic_smem(Kernel* kernel, int bytes) {
  if (bytes <= 48 * 1024) return;
  static std::mutex mutex;
  static std::set<std::pair<const void*, int>> done;
  const std::pair<const void*, int> key(reinterpret_cast<const void*>(kernel),
                                        c10::cuda::current_device());
  const std::lock_guard<std::mutex> lock(mutex);
  if (done.count(key)) return;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.insert(key);
}

// What the kernels need to know about a CUDA device, read once per device. Numbers come from
// cudaDeviceGetAttribute. The CUDA sources use this instead of ATen/cuda/CUDAContext.h, whose
// cuBLAS/cuSPARSE includes would keep them from compiling against a CPU-only torch (CI).
struct DeviceInfo {
  int major = 0, minor = 0, multiProcessorCount = 0;
  size_t sharedMemPerBlockOptin = 0;
  std::string name;
};

inline DeviceInfo read_device_info(int index) {
  DeviceInfo info;
  int smem = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&info.major, cudaDevAttrComputeCapabilityMajor, index));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&info.minor, cudaDevAttrComputeCapabilityMinor, index));
  C10_CUDA_CHECK(
      cudaDeviceGetAttribute(&info.multiProcessorCount, cudaDevAttrMultiProcessorCount, index));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, index));
  info.sharedMemPerBlockOptin = static_cast<size_t>(smem);
  // The name is only in cudaDeviceProp. A runtime newer than these headers may fill a larger
  // struct than the one compiled here, so it gets a buffer with room to spare.
  std::vector<unsigned char> buffer(4 * sizeof(cudaDeviceProp) + 4096);
  auto* properties = reinterpret_cast<cudaDeviceProp*>(buffer.data());
  C10_CUDA_CHECK(cudaGetDeviceProperties(properties, index));
  info.name.assign(properties->name, strnlen(properties->name, sizeof(properties->name)));
  return info;
}

inline const DeviceInfo& device_properties(int index) {
  static std::mutex mutex;
  static std::vector<std::unique_ptr<DeviceInfo>> cache(c10::cuda::device_count());
  TORCH_CHECK(index >= 0 && index < static_cast<int>(cache.size()), "mm_variants: no CUDA device ",
              index);
  const std::lock_guard<std::mutex> lock(mutex);
  if (!cache[index]) cache[index] = std::make_unique<DeviceInfo>(read_device_info(index));
  return *cache[index];
}

// The properties of `device`, or null when it is not a CUDA device of this process.
inline const DeviceInfo* device_info_for(c10::Device device) {
  const int count = c10::cuda::device_count();
  if (count == 0) return nullptr;
  const int index = device.has_index() ? device.index() : c10::cuda::current_device();
  return index < count ? &device_properties(index) : nullptr;
}

// The devices that mma.sync with bf16 and tf32 runs on: sm_80 and newer.
inline bool sm80_or_newer(c10::Device device) {
  const DeviceInfo* info = device_info_for(device);
  return info != nullptr && info->major >= 8;
}

// The devices that run sm_90a code (wgmma, setmaxnreg): compute capability 9.0 exactly, and only
// in a build that compiled it (-DMM_VARIANTS_WITH_SM90A).
inline bool sm90a(c10::Device device) {
#if defined(MM_VARIANTS_WITH_SM90A)
  const DeviceInfo* info = device_info_for(device);
  return info != nullptr && info->major == 9 && info->minor == 0;
#else
  (void)device;
  return false;
#endif
}

// query() for `kernel` on the current device, asked once per kernel, device and `variant` (e.g. a
// cluster size): occupancy answers, which cost a driver call and do not change while the process
// runs. Keyed by the kernel's address, since template instances that differ only in their tile
// shapes share one type.
template <class Query>
int once_per_kernel_and_device(const void* kernel, Query&& query, int variant = 0) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, int>, int> answers;
  const std::tuple<const void*, int, int> key(kernel, c10::cuda::current_device(), variant);
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = answers.find(key);
  if (found != answers.end()) return found->second;
  return answers[key] = query();
}

// ---- Device helpers --------------------------------------------------------------------------

// Inputs are converted to float on their way into registers or shared memory; all arithmetic is
// float32, and the result is converted back to T on the store.
template <typename T>
__device__ __forceinline__ float to_float(T x) {
  return static_cast<float>(x);
}

// N elements of T moved as one aligned vector: a single 2- to 16-byte load or store.
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// The first row and column of output tile `index` of an M x N output in BM x BN tiles. Tiles are
// walked in groups of GROUP_M tile rows, column by column within a group, so that blocks resident
// at the same time share rows of A and columns of B in L2; GROUP_M = 1 is plain row-major order.
template <int BM, int BN, int GROUP_M = 1>
__device__ __forceinline__ int2 grouped_tile(int index, int M, int N) {
  const int tiles_m = (M - 1) / BM + 1, tiles_n = (N - 1) / BN + 1;
  const int per_group = GROUP_M * tiles_n;
  const int first_m = index / per_group * GROUP_M;
  const int rows = min(tiles_m - first_m, GROUP_M);
  const int i = index % per_group;
  return make_int2((first_m + i % rows) * BM, i / rows * BN);
}

// This block's output tile (see tile_grid): one block per tile, in grouped order.
template <int BM, int BN, int GROUP_M = 1, typename G>
__device__ __forceinline__ int2 tile_origin(const G& g) {
  return grouped_tile<BM, BN, GROUP_M>(static_cast<int>(blockIdx.x), g.M, g.N);
}

// out[m][n] = sum over k of a[m][k] * b[k][n] by one thread straight from global memory: the body
// of rungs 1 and 2, which differ only in how threads map to (m, n).
template <typename G>
__device__ __forceinline__ void dot_product(const G& g, int m, int n) {
  if (m >= g.M || n >= g.N) return;
  float acc = 0.0f;
  for (int k = 0; k < g.K; ++k) {
    acc = fmaf(to_float(*g.a.at(m, k)), to_float(*g.b.at(n, k)), acc);
  }
  *g.c_at(m, n) = static_cast<typename G::scalar>(acc);
}

// Copies BK x BX tiles of a Panel (k in [k0, k0 + BK), x in [x0, x0 + BX)) into shared memory as
// float, in the layout the kernel reads: s[x * LDS + k] when SMEM_K_CONTIGUOUS, else
// s[k * LDS + x]; `s` 16-byte aligned. When the panel's contiguous dimension differs from the
// tile's, the copy transposes: each thread scatters its vector down a column of the tile.
//
// Split in two so that a kernel can issue the global loads of the next tile before it computes on
// the current one: load() reads global memory into registers, store() writes shared memory.
// Elements outside the matrix read as 0, so edge tiles need no special case downstream. THREADS
// threads (a 1-D block) share the copy, each moving vectors of VEC elements along the panel's
// contiguous dimension; VEC > 1 needs the panel aligned for it (Panel::aligned, checked at launch).
template <class P, bool SMEM_K_CONTIGUOUS, int BX, int BK, int LDS, int THREADS, int VEC>
struct TileLoader {
  using T = typename P::scalar;
  static constexpr bool kTranspose = P::k_contiguous != SMEM_K_CONTIGUOUS;
  static constexpr int kContig = P::k_contiguous ? BK : BX;  // extent along the contiguous dim
  static constexpr int kVecsPerLine = kContig / VEC;
  static constexpr int kVecs = BX * BK / VEC;
  static constexpr int kPerThread = (kVecs + THREADS - 1) / THREADS;
  static_assert(kContig % VEC == 0, "a tile line must hold whole vectors");

  Vec<T, VEC> regs[kPerThread];

  // The vector this thread moves in step i: `line` along the panel's strided dimension, `pos`
  // (its first element) along the contiguous one. False once the threads outnumber the vectors.
  __device__ __forceinline__ static bool slot(int i, int& line, int& pos) {
    const int v = static_cast<int>(threadIdx.x) + i * THREADS;
    line = v / kVecsPerLine;
    pos = v % kVecsPerLine * VEC;
    return kVecs % THREADS == 0 || v < kVecs;
  }

  // X and K: the matrix extents along x and k, for the predicates.
  __device__ __forceinline__ void load(const P& p, int x0, int k0, int X, int K) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      int line, pos;
      if (!slot(i, line, pos)) break;
      const int x = x0 + (P::k_contiguous ? line : pos), k = k0 + (P::k_contiguous ? pos : line);
      const bool line_in = P::k_contiguous ? x < X : k < K;
      const int left = P::k_contiguous ? K - k : X - x;  // elements left in the line
      const T* src = p.at(x, k);
      if (line_in && left >= VEC) {
        regs[i] = *reinterpret_cast<const Vec<T, VEC>*>(src);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) regs[i].v[e] = line_in && e < left ? src[e] : T(0.0f);
      }
    }
  }

  __device__ __forceinline__ void store(float* s) const {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      int line, pos;
      if (!slot(i, line, pos)) break;
      if constexpr (kTranspose) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) s[(pos + e) * LDS + line] = to_float(regs[i].v[e]);
      } else if constexpr (VEC % 4 == 0 && LDS % 4 == 0) {
#pragma unroll
        for (int q = 0; q < VEC; q += 4) {
          *reinterpret_cast<float4*>(s + line * LDS + pos + q) =
              make_float4(to_float(regs[i].v[q]), to_float(regs[i].v[q + 1]),
                          to_float(regs[i].v[q + 2]), to_float(regs[i].v[q + 3]));
        }
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) s[line * LDS + pos + e] = to_float(regs[i].v[e]);
      }
    }
  }
};

// The k tiles of width BK that cover K. Rungs 3-6 loop over them rather than step k0 past K:
// for K within BK of 2^31, k0 + BK would wrap to a negative k0, still below K.
template <int BK, class G>
__device__ __forceinline__ int k_tiles(const G& g) {
  return (g.K - 1) / BK + 1;
}

// The single-stage step of rungs 3-6: copies the block's A and B tiles for k0 into shared
// memory and waits until the whole block has stored them.
template <class LoaderA, class LoaderB, class G>
__device__ __forceinline__ void stage_tiles(LoaderA& load_a, LoaderB& load_b, const G& g,
                                            int2 tile, int k0, float* a_tile, float* b_tile) {
  load_a.load(g.a, tile.x, k0, g.M, g.K);
  load_b.load(g.b, tile.y, k0, g.N, g.K);
  load_a.store(a_tile);
  load_b.store(b_tile);
  __syncthreads();
}

// Four consecutive floats of 16-byte aligned shared memory in one 128-bit load.
__device__ __forceinline__ void load4(float* dst, const float* src) {
  const float4 v = *reinterpret_cast<const float4*>(src);
  dst[0] = v.x;
  dst[1] = v.y;
  dst[2] = v.z;
  dst[3] = v.w;
}

// acc += a b^T: the register-tile update of every SIMT rung from 5 on.
template <int TM, int TN>
__device__ __forceinline__ void outer_product_acc(float (&acc)[TM][TN], const float (&a)[TM],
                                                  const float (&b)[TN]) {
#pragma unroll
  for (int i = 0; i < TM; ++i) {
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
  }
}

// Writes vals[0, W) to out[m][n, n + W) as T, skipping what falls outside the matrix: one W-wide
// vector store when N allows it (n must be a multiple of W), else element by element. A column
// past N returns first: n + W would wrap past 2^31 for n = N = 2^31 - W, and pass the test below.
template <int W, typename G>
__device__ __forceinline__ void store_row(const G& g, int m, int n, const float* vals) {
  using T = typename G::scalar;
  if (m >= g.M || n >= g.N) return;
  T* dst = g.c_at(m, n);
  if (g.N % W == 0 && n + W <= g.N) {
    Vec<T, W> v;
#pragma unroll
    for (int j = 0; j < W; ++j) v.v[j] = static_cast<T>(vals[j]);
    *reinterpret_cast<Vec<T, W>*>(dst) = v;
  } else {
#pragma unroll
    for (int j = 0; j < W; ++j) {
      if (n + j < g.N) dst[j] = static_cast<T>(vals[j]);
    }
  }
}

}  // namespace mm_variants::cuda
