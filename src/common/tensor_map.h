// Host-side TMA tensor maps, shared by the backends that use TMA (SM100, SM90).
//
// cuTensorMapEncodeTiled is a driver API entry point; it is obtained through
// cudaGetDriverEntryPointByVersion so the library has no link-time dependency
// on libcuda (SPEC §1: "tensor maps via cuTensorMapEncodeTiled obtained
// through cudaGetDriverEntryPoint"). Header-only (inline) so every backend's
// launcher can include it without a new translation unit in the build.
//
// Rules checked before encoding (CUDA driver API, cuTensorMapEncodeTiled):
// global address 16-B aligned; strides multiples of 16 and < 2^40; every
// box dimension in [1, 256]; inner box bytes a multiple of 16 and, with a
// swizzle, at most the swizzle span (128 B for SWIZZLE_128B).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

#include "api/internal.h"

namespace m3qkv {

// The driver's cuTensorMapEncodeTiled, resolved once per process (thread-safe).
inline m3qkv_status get_tensor_map_encoder(PFN_cuTensorMapEncodeTiled_v12000* out) {
  static std::atomic<PFN_cuTensorMapEncodeTiled_v12000> cached{nullptr};
  PFN_cuTensorMapEncodeTiled_v12000 fn = cached.load(std::memory_order_acquire);
  if (fn == nullptr) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    // ABI of the 12.0 signature (the one PFN_..._v12000 describes).
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || p == nullptr)
      return fail(M3QKV_ERROR_CUDA_ERROR, "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled): %s (query %d)",
                  cudaGetErrorName(e), static_cast<int>(q));
    fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    cached.store(fn, std::memory_order_release);
  }
  *out = fn;
  return M3QKV_SUCCESS;
}

// A 2-D uint8 tensor map: dims {inner, outer} elements (bytes), row pitch
// `outer_stride_bytes`, box {box_inner, box_outer}; out-of-bounds elements of
// a box are zero-filled (OOB_FILL_NONE), which the kernels rely on for M tails
// and phantom heads.
inline m3qkv_status make_tensor_map_2d_u8(CUtensorMap* out, const char* what, const void* base, uint64_t inner,
                                          uint64_t outer, uint64_t outer_stride_bytes, uint32_t box_inner,
                                          uint32_t box_outer, CUtensorMapSwizzle swizzle) {
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0)
    return fail(M3QKV_ERROR_MISALIGNED, "%s: tensor map base %p is not 16-byte aligned", what, base);
  if (outer_stride_bytes % 16 != 0 || outer_stride_bytes >= (uint64_t{1} << 40))
    return fail(M3QKV_ERROR_MISALIGNED, "%s: tensor map row pitch %llu is not a multiple of 16 below 2^40", what,
                static_cast<unsigned long long>(outer_stride_bytes));
  if (inner == 0 || outer == 0 || inner > (uint64_t{1} << 32) || outer > (uint64_t{1} << 32))
    return fail(M3QKV_ERROR_TOO_LARGE, "%s: tensor map dims %llu x %llu out of range", what,
                static_cast<unsigned long long>(inner), static_cast<unsigned long long>(outer));
  if (box_inner < 1 || box_inner > 256 || box_outer < 1 || box_outer > 256 || box_inner % 16 != 0 ||
      (swizzle == CU_TENSOR_MAP_SWIZZLE_128B && box_inner > 128))
    return fail(M3QKV_ERROR_INTERNAL, "%s: invalid TMA box %u x %u", what, box_inner, box_outer);
  PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  const m3qkv_status st = get_tensor_map_encoder(&encode);
  if (st != M3QKV_SUCCESS) return st;
  const cuuint64_t dims[2] = {inner, outer};
  const cuuint64_t strides[1] = {outer_stride_bytes};
  const cuuint32_t box[2] = {box_inner, box_outer};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode(out, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return fail(M3QKV_ERROR_CUDA_ERROR, "cuTensorMapEncodeTiled(%s) failed with CUresult %d", what,
                static_cast<int>(r));
  return M3QKV_SUCCESS;
}

}  // namespace m3qkv
