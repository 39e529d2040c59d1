// The SM100-only (.cta_group::2) forms of the TMA tile load. PTX ISA 9.x
// §9.7.9.25.5.2 "cp.async.bulk.tensor" (common forms: ptx/tma.cuh).
// Facts relied on (same section):
//  * .cta_group::2: `mbar` may be in the shared memory of the destination CTA
//    or of its peer CTA (SM100 family only: sm_100a / sm_100f).
//  * .multicast::cluster with .cta_group::2: the complete_tx for each
//    destination CTA is sent to that CTA or to its peer, whichever has the
//    %cluster_ctarank parity of the CTA holding `mbar`.
// The SM100 kernels include it through sm100/tensor_core.cuh, which the
// tcgen05 emulation build points at its sm_90 model instead.
#pragma once

#include <stdint.h>

namespace m3qkv::ptx {

// 2-D tile load into this CTA whose complete_tx goes to `bar_cluster`, a
// shared::cluster address (mapa) of a barrier in this CTA or its peer.
__device__ __forceinline__ void cp_async_bulk_tensor_2d_cta_group_2(uint32_t dst, const void* tmap, int32_t x,
                                                                    int32_t y, uint32_t bar_cluster) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.cta_group::2"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(x), "r"(y), "r"(bar_cluster)
      : "memory");
}

// 2-D tile load multicast to the CTAs of `cta_mask` (same smem offset in each);
// complete_tx per destination goes to the pair CTA of `bar_cluster`'s parity.
__device__ __forceinline__ void cp_async_bulk_tensor_2d_multicast_cta_group_2(uint32_t dst, const void* tmap, int32_t x,
                                                                              int32_t y, uint32_t bar_cluster,
                                                                              uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      ".cta_group::2 [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(x), "r"(y), "r"(bar_cluster), "h"(cta_mask)
      : "memory");
}

}  // namespace m3qkv::ptx
