// Wrappers the SM90 kernel needs that ptx/{tma,mbarrier,...}.cuh (engineer
// SM100) do not have. One thin inline-asm wrapper per instruction, named after
// the mnemonic; no logic beyond the instruction.
#pragma once

#include <stdint.h>

namespace m3qkv::ptx {

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

// bar.sync id, nthreads;  PTX ISA "barrier{.cta}": a named barrier for a
// subset of the CTA (one consumer warpgroup). id 0 is __syncthreads'.
__device__ __forceinline__ void bar_sync(uint32_t id, uint32_t nthreads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(nthreads) : "memory");
}

// bar.arrive id, nthreads;  PTX ISA "barrier{.cta}": counts this warp's
// threads towards the barrier without waiting (the producer side of an
// ordering handshake whose consumer side is bar.sync on the same id).
__device__ __forceinline__ void bar_arrive(uint32_t id, uint32_t nthreads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(nthreads) : "memory");
}

// mul.rn.bf16x2 d, a, b;  PTX ISA 7.8+, sm_90 ("Half Precision Floating-Point
// Instructions: mul"). No .ftz form exists for bf16: subnormal inputs and
// results are kept (the SM90 dequantizer relies on it; the GPU test
// Sm90Dequant.AllBytesAllScales checks it on all 256 x 256 (byte, scale) pairs).
__device__ __forceinline__ uint32_t mul_rn_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// ld.shared::cluster.f32 d, [addr];  PTX ISA 7.8+, sm_90 ("ld", state space
// .shared::cluster): a load from the shared memory of any CTA of the cluster
// (distributed shared memory); `addr` comes from mapa (ptx/cluster.cuh).
// volatile: the data is written by another CTA; ordering comes from the
// mbarrier acquire before it.
__device__ __forceinline__ float ld_shared_cluster_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr));
  return v;
}

// prmt.b32 d, a, b, c;  PTX ISA "prmt" (default mode): byte n of d is byte
// c[4n+2 : 4n] of the 8 bytes {b, a} (a = bytes 0-3); when bit 4n+3 of c is
// set, the sign bit of that byte replicated instead (0x00 or 0xFF).
// (__byte_perm uses only the 3 low bits of each selector nibble.)
__device__ __forceinline__ uint32_t prmt_b32(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

}  // namespace m3qkv::ptx
