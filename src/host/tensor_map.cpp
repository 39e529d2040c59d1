// Tensor-map encoding (see tensor_map.h).
#include "host/tensor_map.h"

#include <cstdio>

#include "host/cuda.h"
#include "host/status.h"

namespace m3qkv::host {

m3qkv_status make_tensor_map_2d_u8(const char* fn, CUtensorMap* out, const char* what, const void* base,
                                   uint64_t inner, uint64_t outer, uint64_t outer_stride_bytes, uint32_t box_inner,
                                   uint32_t box_outer, CUtensorMapSwizzle swizzle) {
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0)
    return fail(M3QKV_ERROR_MISALIGNED, "%s: tensor map of %s: base %p is not 16-byte aligned", fn, what, base);
  if (outer_stride_bytes % 16 != 0 || outer_stride_bytes >= (uint64_t{1} << 40))
    return fail(M3QKV_ERROR_MISALIGNED, "%s: tensor map of %s: row pitch %llu is not a multiple of 16 below 2^40", fn,
                what, static_cast<unsigned long long>(outer_stride_bytes));
  if (inner == 0 || outer == 0 || inner > (uint64_t{1} << 32) || outer > (uint64_t{1} << 32))
    return fail(M3QKV_ERROR_TOO_LARGE, "%s: tensor map of %s: dims %llu x %llu out of range", fn, what,
                static_cast<unsigned long long>(inner), static_cast<unsigned long long>(outer));
  if (box_inner < 1 || box_inner > 256 || box_outer < 1 || box_outer > 256 || box_inner % 16 != 0 ||
      (swizzle == CU_TENSOR_MAP_SWIZZLE_128B && box_inner > 128))
    return fail(M3QKV_ERROR_INTERNAL, "%s: tensor map of %s: invalid TMA box %u x %u", fn, what, box_inner, box_outer);
  const Cuda* c = nullptr;
  M3QKV_TRY(cuda(fn, &c));
  const cuuint64_t dims[2] = {inner, outer};
  const cuuint64_t strides[1] = {outer_stride_bytes};
  const cuuint32_t box[2] = {box_inner, box_outer};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = c->tensor_map_encode_tiled(out, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims,
                                                  strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                                                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    char call[96];
    std::snprintf(call, sizeof(call), "cuTensorMapEncodeTiled(%s)", what);
    return cuda_fail(fn, call, r);
  }
  return M3QKV_SUCCESS;
}

}  // namespace m3qkv::host
