// tcgen05 (5th-generation tensor core, SM100 family) wrappers: one thin asm
// per instruction, named after the mnemonic. PTX ISA 9.x §9.7.16
// "TensorCore 5th Generation Family Instructions". Target: sm_100f (also
// sm_100a/sm_103a); never compiled for other targets except through the
// emulation layer below.
//
// Facts relied on (PTX ISA §9.7.16, checked against the text):
//  * Every tcgen05 instruction of a kernel uses the same .cta_group (§9.7.16.9.2,
//    §9.7.16.12.1) -> the wrappers take CG as a template parameter.
//  * .mma/.cp/.commit: issued by ONE thread; with cta_group::2 one thread of the
//    CTA pair drives both CTAs' Tensor Memory (§9.7.16.5 Table 46).
//  * .alloc/.dealloc/.relinquish_alloc_permit: one full warp; with cta_group::2
//    one warp in EACH CTA of the pair, collectively (§9.7.16.5 Table 46).
//  * .ld/.wait::ld: warp w accesses lanes 32·(w%4)..+31 only (§9.7.16.8.1).
//  * Pipelined pairs (§9.7.16.6.2): cp -> mma and mma -> mma (same accumulator)
//    execute in issue order; mma -> cp is NOT ordered (callers must not
//    overwrite scale factors an in-flight MMA may read), commit tracks all
//    prior mma/cp of the thread.
//  * .block_scale.block32 is the sm_100f spelling of scale_vec::1X for
//    kind::mxf8f6f4; scale_vec::NX needs sm_100a (§9.7.16.10.9.1 target notes).
//
// The SM100 kernels include it through sm100/tensor_core.cuh, which the
// tcgen05 emulation build (issue 6) points at the functional model of the
// same names (sm100/emu/tcgen05_emu.cuh, on sm_90a).
#pragma once

#include <stdint.h>

namespace m3qkv::ptx {

// ------------------------------------------------------------- allocation
// tcgen05.alloc.cta_group::N.sync.aligned.shared::cta.b32 [dst], nCols;
// nCols: power of 2 in [32, 512]; writes the TMEM base address to smem [dst].
template <int CG>
__device__ __forceinline__ void tcgen05_alloc(uint32_t smem_dst, uint32_t ncols) {
  static_assert(CG == 1 || CG == 2, "cta_group");
  if constexpr (CG == 1)
    asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], %1;" ::"r"(smem_dst), "r"(ncols)
                 : "memory");
  else
    asm volatile("tcgen05.alloc.cta_group::2.sync.aligned.shared::cta.b32 [%0], %1;" ::"r"(smem_dst), "r"(ncols)
                 : "memory");
}

// tcgen05.dealloc.cta_group::N.sync.aligned.b32 taddr, nCols;
template <int CG>
__device__ __forceinline__ void tcgen05_dealloc(uint32_t taddr, uint32_t ncols) {
  if constexpr (CG == 1)
    asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, %1;" ::"r"(taddr), "r"(ncols) : "memory");
  else
    asm volatile("tcgen05.dealloc.cta_group::2.sync.aligned.b32 %0, %1;" ::"r"(taddr), "r"(ncols) : "memory");
}

// tcgen05.relinquish_alloc_permit.cta_group::N.sync.aligned;
template <int CG>
__device__ __forceinline__ void tcgen05_relinquish_alloc_permit() {
  if constexpr (CG == 1)
    asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;" ::: "memory");
  else
    asm volatile("tcgen05.relinquish_alloc_permit.cta_group::2.sync.aligned;" ::: "memory");
}

// -------------------------------------------------------------------- mma
// tcgen05.mma.cta_group::N.kind::mxf8f6f4.block_scale.block32
//     [d_tmem], a_desc, b_desc, idesc, [sfa_tmem], [sfb_tmem], enable_input_d;
// D (f32, TMEM) = A·SFA × B·SFB (+ D when accumulate). K = 32 per instruction.
template <int CG>
__device__ __forceinline__ void tcgen05_mma_mxf8f6f4_block_scale(uint32_t d_tmem, uint64_t a_desc, uint64_t b_desc,
                                                                 uint32_t idesc, uint32_t sfa_tmem, uint32_t sfb_tmem,
                                                                 bool accumulate) {
  const uint32_t acc = accumulate ? 1u : 0u;
  if constexpr (CG == 1)
    asm volatile(
        "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %6, 0;\n\t"
        "tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale.block32 [%0], %1, %2, %3, [%4], [%5], p;\n\t}" ::"r"(
            d_tmem),
        "l"(a_desc), "l"(b_desc), "r"(idesc), "r"(sfa_tmem), "r"(sfb_tmem), "r"(acc)
        : "memory");
  else
    asm volatile(
        "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %6, 0;\n\t"
        "tcgen05.mma.cta_group::2.kind::mxf8f6f4.block_scale.block32 [%0], %1, %2, %3, [%4], [%5], p;\n\t}" ::"r"(
            d_tmem),
        "l"(a_desc), "l"(b_desc), "r"(idesc), "r"(sfa_tmem), "r"(sfb_tmem), "r"(acc)
        : "memory");
}

// --------------------------------------------------------------------- cp
// tcgen05.cp.cta_group::N.32x128b.warpx4 [taddr], s_desc;
// Copies 32 rows × 128 bit (a [32][16]-byte smem matrix, descriptor s_desc)
// into 4 TMEM columns × 32 lanes and multicasts it to all four lane quarters.
// cta_group::2: written to the Tensor Memory of both CTAs of the pair.
template <int CG>
__device__ __forceinline__ void tcgen05_cp_32x128b_warpx4(uint32_t taddr, uint64_t s_desc) {
  if constexpr (CG == 1)
    asm volatile("tcgen05.cp.cta_group::1.32x128b.warpx4 [%0], %1;" ::"r"(taddr), "l"(s_desc) : "memory");
  else
    asm volatile("tcgen05.cp.cta_group::2.32x128b.warpx4 [%0], %1;" ::"r"(taddr), "l"(s_desc) : "memory");
}

// ----------------------------------------------------------------- commit
// tcgen05.commit.cta_group::N.mbarrier::arrive::one.shared::cluster.b64 [mbar];
// one arrive (cluster scope) on `mbar` once all prior mma/cp of this thread completed.
template <int CG>
__device__ __forceinline__ void tcgen05_commit(uint32_t bar) {
  if constexpr (CG == 1)
    asm volatile("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];" ::"r"(bar) : "memory");
  else
    asm volatile("tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster.b64 [%0];" ::"r"(bar) : "memory");
}
// ...multicast::cluster.b64 [mbar], ctaMask;  the arrive goes to the barrier
// at the same offset in every CTA of ctaMask.
template <int CG>
__device__ __forceinline__ void tcgen05_commit_multicast(uint32_t bar, uint16_t cta_mask) {
  if constexpr (CG == 1)
    asm volatile(
        "tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64 [%0], %1;" ::"r"(bar),
        "h"(cta_mask)
        : "memory");
  else
    asm volatile(
        "tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64 [%0], %1;" ::"r"(bar),
        "h"(cta_mask)
        : "memory");
}

// ----------------------------------------------------------------- fences
// tcgen05.fence::before_thread_sync;  orders prior tcgen05 ops before a
// following thread-synchronizing operation (arrive, barrier).
__device__ __forceinline__ void tcgen05_fence_before_thread_sync() {
  asm volatile("tcgen05.fence::before_thread_sync;" ::: "memory");
}
// tcgen05.fence::after_thread_sync;  orders later tcgen05 ops after a
// preceding thread-synchronizing operation (wait, barrier).
__device__ __forceinline__ void tcgen05_fence_after_thread_sync() {
  asm volatile("tcgen05.fence::after_thread_sync;" ::: "memory");
}

// --------------------------------------------------------------------- ld
// tcgen05.ld.sync.aligned.32x32b.x16.b32 {r0..r15}, [taddr];
// shape 32x32b: thread t of the warp receives lane (taddr.lane + t), columns
// taddr.col .. +15 (one 32-bit value per column). §9.7.16.8.3, §9.7.16.2.3.
__device__ __forceinline__ void tcgen05_ld_32x32b_x16(uint32_t taddr, uint32_t (&r)[16]) {
  asm volatile(
      "tcgen05.ld.sync.aligned.32x32b.x16.b32 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, [%16];"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]), "=r"(r[4]), "=r"(r[5]), "=r"(r[6]), "=r"(r[7]), "=r"(r[8]),
        "=r"(r[9]), "=r"(r[10]), "=r"(r[11]), "=r"(r[12]), "=r"(r[13]), "=r"(r[14]), "=r"(r[15])
      : "r"(taddr)
      : "memory");
}
// tcgen05.ld.sync.aligned.32x32b.x32.b32 {r0..r31}, [taddr];
__device__ __forceinline__ void tcgen05_ld_32x32b_x32(uint32_t taddr, uint32_t (&r)[32]) {
  asm volatile(
      "tcgen05.ld.sync.aligned.32x32b.x32.b32 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, [%32];"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]), "=r"(r[4]), "=r"(r[5]), "=r"(r[6]), "=r"(r[7]), "=r"(r[8]),
        "=r"(r[9]), "=r"(r[10]), "=r"(r[11]), "=r"(r[12]), "=r"(r[13]), "=r"(r[14]), "=r"(r[15]), "=r"(r[16]),
        "=r"(r[17]), "=r"(r[18]), "=r"(r[19]), "=r"(r[20]), "=r"(r[21]), "=r"(r[22]), "=r"(r[23]), "=r"(r[24]),
        "=r"(r[25]), "=r"(r[26]), "=r"(r[27]), "=r"(r[28]), "=r"(r[29]), "=r"(r[30]), "=r"(r[31])
      : "r"(taddr)
      : "memory");
}

// tcgen05.wait::ld.sync.aligned;  all prior tcgen05.ld of the thread are complete.
__device__ __forceinline__ void tcgen05_wait_ld() { asm volatile("tcgen05.wait::ld.sync.aligned;" ::: "memory"); }

}  // namespace m3qkv::ptx
