// Shared pieces of the tcgen05 / SM100-TMA emulation (issue 6, build option
// M3QKV_TCGEN05_EMULATION): per-CTA emulation state in static shared memory,
// distributed-shared-memory helpers and the trap-with-message macro.
// Test-only code: compiled for sm_90a when the SM100 kernel is built in
// emulation mode; never part of a normal build.
#pragma once

#include <stdint.h>
#include <stdio.h>

namespace m3qkv::ptx::emu {

// Loud failure: the message names the emulated instruction and the offending
// value; __trap() makes the launch fail (sticky cudaErrorLaunchFailure /
// cudaErrorIllegalInstruction), so a test cannot silently pass.
#define M3QKV_EMU_TRAP(...)                                                                                   \
  do {                                                                                                        \
    printf("[m3qkv tcgen05 emulation] block %d thread %d: ", static_cast<int>(blockIdx.x),                   \
           static_cast<int>(threadIdx.x));                                                                    \
    printf(__VA_ARGS__);                                                                                      \
    printf("\n");                                                                                             \
    __trap();                                                                                                 \
  } while (0)

// Per-CTA state. Shared memory is not cleared between CTAs, so every field is
// (re)initialized by the emulated tcgen05.alloc, which the kernel executes
// before any other tcgen05 / SM100 TMA instruction (TMEM must be allocated
// before it can be used, and the base address is read after a barrier).
struct CtaState {
  uint64_t tma_bar;        // private mbarrier for the emulated .cta_group::2 TMA forms
  unsigned long long owner;  // (%gridid << 20) ^ blockIdx.x of the CTA the state belongs to
  uint32_t magic;          // kMagic once initialized by alloc
  uint32_t sm;             // SM whose Tensor Memory this CTA uses
  uint32_t alloc_col;      // first allocated column
  uint32_t alloc_ncols;    // 0 = nothing allocated
  uint32_t relinquished;   // relinquish_alloc_permit executed
  uint32_t tma_phase;      // parity of tma_bar's current phase
  uint32_t alloc_warp;     // warp that allocated (dealloc must come from the same warp)
  const void* tmap_cache[4];
  uint32_t tmap_bytes[4];
};
constexpr uint32_t kMagic = 0x454D5535u;  // "EMU5"

namespace {
__shared__ CtaState s_cta;
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ uint32_t cta_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_size() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t mapa(uint32_t a, uint32_t rank) {
  uint32_t d;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(rank));
  return d;
}
// Generic-proxy accesses of (possibly remote) shared memory by shared::cluster address.
__device__ __forceinline__ uint4 ld_cluster_v4(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared::cluster.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(a)
               : "memory");
  return v;
}
__device__ __forceinline__ uint32_t ld_cluster_u32(uint32_t a) {
  uint32_t v;
  asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(a) : "memory");
  return v;
}
__device__ __forceinline__ void st_cluster_v4(uint32_t a, uint4 v) {
  asm volatile("st.shared::cluster.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(a), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
// Remote-capable mbarrier signals (sm_90: PTX ISA §9.7.13.15 mbarrier.arrive /
// mbarrier.complete_tx with .shared::cluster addresses).
__device__ __forceinline__ void arrive_cluster(uint32_t bar_cluster) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(bar_cluster) : "memory");
}
__device__ __forceinline__ void complete_tx_cluster(uint32_t bar_cluster, uint32_t bytes) {
  asm volatile("mbarrier.complete_tx.relaxed.cluster.shared::cluster.b64 [%0], %1;" ::"r"(bar_cluster), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint32_t linear_warp() { return threadIdx.x / 32u; }

__device__ __forceinline__ unsigned long long gridid() {
  unsigned long long r;
  asm volatile("mov.u64 %0, %%gridid;" : "=l"(r));
  return r;
}
__device__ __forceinline__ void require_state(const char* what) {
  if (s_cta.magic != kMagic || s_cta.owner != ((gridid() << 20) ^ blockIdx.x)) M3QKV_EMU_TRAP("%s before tcgen05.alloc initialized the emulation state", what);
}

// Rank of the CTA whose shared memory holds shared::cluster address `a`
// (checked exactly: mapa of the recovered offset must give `a` back).
__device__ __forceinline__ bool cluster_addr_owner(uint32_t a, uint32_t* rank, uint32_t* local) {
  const uint32_t ref = smem_addr(&s_cta);
  const uint32_t n = cluster_size();
  for (uint32_t r = 0; r < n; ++r) {
    const uint32_t cand = a - (mapa(ref, r) - ref);
    if (cand < 0x40000u && mapa(cand, r) == a) {
      *rank = r;
      *local = cand;
      return true;
    }
  }
  return false;
}

}  // namespace m3qkv::ptx::emu
