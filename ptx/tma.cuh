// TMA (bulk tensor copy) wrappers. PTX ISA 9.x §9.7.9.25.5.2
// "cp.async.bulk.tensor" and §9.7.9.x "prefetch{.tensormap}".
//
// Syntax (global -> shared::cluster):
//   cp.async.bulk.tensor.dim.dst.src{.load_mode}.completion_mechanism{.multicast}{.cta_group}
//       [dstMem], [tensorMap, tensorCoords], [mbar]{, ctaMask}
// Facts relied on (same section):
//  * complete_tx with the number of bytes copied (the whole box, out-of-bounds
//    elements included: they are zero-filled) is performed on `mbar`.
//  * .multicast::cluster: the data goes to the same offset in every CTA of
//    ctaMask.
// Coordinates are {innermost, outer} in elements of the tensor map.
// The SM100-only .cta_group::2 forms: ptx/tma_sm100.cuh.
#pragma once

#include <stdint.h>

namespace m3qkv::ptx {

// prefetch.tensormap [addr];  pulls the descriptor into the cache ahead of the first copy.
__device__ __forceinline__ void prefetch_tensormap(const void* tmap) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(tmap)) : "memory");
}

// 2-D tile load into this CTA, completion on this CTA's barrier (cta_group::1).
__device__ __forceinline__ void cp_async_bulk_tensor_2d(uint32_t dst, const void* tmap, int32_t x, int32_t y,
                                                        uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}

// 2-D tile load multicast to the CTAs of `cta_mask` (sm_90 form, cta_group::1):
// each destination CTA's barrier at the offset of `bar` receives its complete_tx.
__device__ __forceinline__ void cp_async_bulk_tensor_2d_multicast(uint32_t dst, const void* tmap, int32_t x, int32_t y,
                                                                  uint32_t bar, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(x), "r"(y), "r"(bar), "h"(cta_mask)
      : "memory");
}

// cp.async.bulk.prefetch.tensor.2d.L2.global.tile [tmap, {x, y}];  PTX ISA
// "cp.async.bulk.prefetch.tensor" (sm_90): brings a box into L2 without a
// destination or a completion. L2 is the point of coherence, so a prefetch
// cannot make a later load see stale data: the SM90 decode kernel issues it for
// its weights before griddepcontrol.wait.
__device__ __forceinline__ void cp_async_bulk_prefetch_tensor_2d_l2(const void* tmap, int32_t x, int32_t y) {
  asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];" ::"l"(reinterpret_cast<uint64_t>(tmap)),
               "r"(x), "r"(y)
               : "memory");
}

// cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], size, [mbar];
// PTX ISA 8.0+, "Data Movement: cp.async.bulk" (sm_90). A plain (non-tensor)
// bulk copy: src, dst and size 16-B aligned / multiple of 16. The MX scale
// chunks are contiguous 512-byte blocks of the F8_128x4 layout, so they need
// no tensor map.
__device__ __forceinline__ void cp_async_bulk_shared_global(uint32_t dst, const void* src, uint32_t bytes,
                                                            uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(bar)
               : "memory");
}

}  // namespace m3qkv::ptx

