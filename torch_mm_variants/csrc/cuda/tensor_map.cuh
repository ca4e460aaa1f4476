// Host side of TMA (the Hopper tensor memory accelerator): the CUtensorMap that tells the copy
// engine how a 2-D matrix (or a batch of them) lies in global memory and which box of it one copy
// moves. The kernels that copy with TMA (hopper.cuh's tma_load_2d, tma_load_3d and tma_store_2d)
// take these maps as __grid_constant__ parameters.
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

// A tensor map of `rank` dimensions (dims and box innermost first, strides in bytes between the
// lines of each outer dimension) over 16-bit or float32 elements, copied in boxes laid out with
// `swizzle`. Reads outside the tensor return zeros; stores outside it are dropped.
template <typename T>
CUtensorMap encode_map(const T* data, cuuint32_t rank, const cuuint64_t* dims,
                       const cuuint64_t* strides, const cuuint32_t* box,
                       CUtensorMapSwizzle swizzle) {
  static_assert(std::is_same_v<T, c10::BFloat16> || std::is_same_v<T, c10::Half> ||
                std::is_same_v<T, float>);
  constexpr CUtensorMapDataType kType = std::is_same_v<T, float> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                        : std::is_same_v<T, c10::BFloat16>
                                            ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                            : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  CUtensorMap map;
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult result = tensor_map_encoder()(
      &map, kType, rank, const_cast<T*>(data), dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TORCH_CHECK(result == CUDA_SUCCESS, "torch_mm_variants: TMA could not describe a ", dims[1],
              "x", dims[0], " operand (leading dimension ", strides[0] / sizeof(T), ", CUresult ",
              static_cast<int>(result), ")");
  return map;
}

// A 2-D tensor map over a matrix whose contiguous dimension has `inner` elements and whose
// `outer` lines are `ld` elements apart, copied in boxes of box_inner x box_outer elements.
template <typename T>
CUtensorMap encode_tile_map(const T* data, int64_t inner, int64_t outer, int64_t ld, int box_inner,
                            int box_outer, CUtensorMapSwizzle swizzle) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(outer)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * sizeof(T)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_inner),
                             static_cast<cuuint32_t>(box_outer)};
  return encode_map(data, 2, dims, strides, box, swizzle);
}

// The boxes of the tiles that wgmma reads: one 128-byte swizzle row (kTmaBoxInnerOf<T>) x
// box_outer, with the 128-byte swizzle.
template <typename T>
CUtensorMap tile_map(const T* data, int64_t inner, int64_t outer, int64_t ld, int box_outer) {
  return encode_tile_map(data, inner, outer, ld, kTmaBoxInnerOf<T>, box_outer,
                         CU_TENSOR_MAP_SWIZZLE_128B);
}

// The same boxes over `entries` such matrices, entry_ld elements apart (a bmm batch): a 3-D map
// whose boxes each lie in one entry, so every entry's edges fill with zeros as a matrix's do.
// entry_ld must keep 16-byte units, as ld does.
template <typename T>
CUtensorMap batch_tile_map(const T* data, int64_t inner, int64_t outer, int64_t ld, int box_outer,
                           int64_t entries, int64_t entry_ld) {
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(outer),
                              static_cast<cuuint64_t>(entries)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(ld) * sizeof(T),
                                 static_cast<cuuint64_t>(entry_ld) * sizeof(T)};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(kTmaBoxInnerOf<T>),
                             static_cast<cuuint32_t>(box_outer), 1};
  return encode_map(data, 3, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
}

}  // namespace mm_variants::cuda
