// Host-side TMA tensor maps, shared by the backends that use TMA (SM100, SM90).
// cuTensorMapEncodeTiled comes from the driver table (host/driver.h).
//
// Rules checked before encoding (CUDA driver API, cuTensorMapEncodeTiled):
// global address 16-B aligned; strides multiples of 16 and < 2^40; every
// box dimension in [1, 256]; inner box bytes a multiple of 16 and, with a
// swizzle, at most the swizzle span (128 B for SWIZZLE_128B).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "m3qkv/m3qkv.h"

namespace m3qkv::host {

// A 2-D uint8 tensor map: dims {inner, outer} elements (bytes), row pitch
// `outer_stride_bytes`, box {box_inner, box_outer}; out-of-bounds elements of
// a box are zero-filled (OOB_FILL_NONE), which the kernels rely on for M tails
// and phantom heads. `fn` opens the messages, `what` names the tensor.
m3qkv_status make_tensor_map_2d_u8(const char* fn, CUtensorMap* out, const char* what, const void* base,
                                   uint64_t inner, uint64_t outer, uint64_t outer_stride_bytes, uint32_t box_inner,
                                   uint32_t box_outer, CUtensorMapSwizzle swizzle);

}  // namespace m3qkv::host
