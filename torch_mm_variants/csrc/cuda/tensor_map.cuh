// Host side of TMA (the Hopper tensor memory accelerator): the CUtensorMap that tells the copy
// engine how a 2-D matrix lies in global memory and which box of it one copy moves. The kernels
// that copy with TMA (hopper.cuh's tma_load_2d and tma_store_2d) take these maps as
// __grid_constant__ parameters.
#pragma once

#include "common.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <type_traits>

namespace mm_variants::cuda {

// The inner extent of every box: one 128-byte swizzle row, 64 16-bit elements or 32 floats.
constexpr int kTmaRowBytes = 128;
template <typename T>
constexpr int kTmaBoxInnerOf = kTmaRowBytes / sizeof(T);
constexpr int kTmaBoxInner = kTmaBoxInnerOf<uint16_t>;

// cuTensorMapEncodeTiled lives in the driver library; the runtime hands out its address, so the
// extension needs no link against libcuda.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    C10_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                    cudaEnableDefault, &found));
    TORCH_CHECK(found == cudaDriverEntryPointSuccess && fn != nullptr,
                "torch_mm_variants: the CUDA driver does not provide cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// A 2-D tensor map over a 16-bit or float32 matrix whose contiguous dimension has `inner`
// elements and whose `outer` lines are `ld` elements apart, copied in boxes of box_inner x
// box_outer elements laid out with `swizzle`. Reads outside the matrix return zeros; stores
// outside it are dropped.
template <typename T>
CUtensorMap encode_tile_map(const T* data, int64_t inner, int64_t outer, int64_t ld, int box_inner,
                            int box_outer, CUtensorMapSwizzle swizzle) {
  static_assert(std::is_same_v<T, c10::BFloat16> || std::is_same_v<T, c10::Half> ||
                std::is_same_v<T, float>);
  constexpr CUtensorMapDataType kType = std::is_same_v<T, float> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                        : std::is_same_v<T, c10::BFloat16>
                                            ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                            : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(outer)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * sizeof(T)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_inner),
                             static_cast<cuuint32_t>(box_outer)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult result = tensor_map_encoder()(
      &map, kType, 2, const_cast<T*>(data), dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TORCH_CHECK(result == CUDA_SUCCESS, "torch_mm_variants: TMA could not describe a ", outer,
              "x", inner, " operand (leading dimension ", ld, ", CUresult ",
              static_cast<int>(result), ")");
  return map;
}

// The boxes of the tiles that wgmma reads: one 128-byte swizzle row (kTmaBoxInnerOf<T>) x
// box_outer, with the 128-byte swizzle.
template <typename T>
CUtensorMap tile_map(const T* data, int64_t inner, int64_t outer, int64_t ld, int box_outer) {
  return encode_tile_map(data, inner, outer, ld, kTmaBoxInnerOf<T>, box_outer,
                         CU_TENSOR_MAP_SWIZZLE_128B);
}

}  // namespace mm_variants::cuda
