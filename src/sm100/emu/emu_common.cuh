// Shared pieces of the tcgen05 / SM100-TMA emulation (issue 6, build option
// M3QKV_TCGEN05_EMULATION): per-CTA emulation state in static shared memory,
// distributed-shared-memory helpers and the trap-with-message macro.
// Test-only code: compiled for sm_90a when the SM100 kernel is built in
// emulation mode; never part of a normal build.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

namespace m3qkv::ptx::emu {

// Trap record. Device printf output is lost when the trap kills the context,
// so every M3QKV_EMU_TRAP first stores its key numbers: the first trapping
// thread of the launch claims the record (later ones only bump `count`). It is
// written to the __device__ variable g_trap and, when a host hook installed one
// (m3qkv_emu_trap_record_install(), tcgen05_emu.cuh; m3qkv_emu_set_fault()
// installs it too), to a mapped pinned host buffer that the host can still read
// after the context died (m3qkv_emu_last_trap(); also printed at process exit).
struct TrapRecord {  // 4-byte words only (copied word by word); `state` first
  unsigned int state;  // 0 empty, 1 being written, 2 complete
  unsigned int count;  // traps seen (all threads, all launches since the reset)
  unsigned int line;   // source line (in src/sm100/emu/) of the trap
  unsigned int block_x, thread_x, cluster_rank, cluster_size, smid;
  unsigned long long gridid;
  unsigned long long v[4];  // key numbers; meaning per trap site (see the site)
  char fmt[112];            // the message's format string (truncated)
  unsigned int dump_bytes;  // bytes of `dump` valid (require_state: this CTA's raw s_cta)
  unsigned char dump[124];
};
static_assert(sizeof(TrapRecord) % 4 == 0 && offsetof(TrapRecord, state) == 0 && offsetof(TrapRecord, count) == 4,
              "TrapRecord layout");
// require_state: v[0] = observed magic, v[1] = observed owner, v[2] = expected
// owner tag ((%gridid << 20) ^ blockIdx.x), v[3] = call site (SM100 TMA models:
// the tensor map's generic address, so A/B/SFA/SFB = param offsets 0/128/256/384;
// others: shared::cta address of s_cta),
// dump = the CTA's raw CtaState (tells a clobber by box data, a copy of another
// CTA's state, and a state never initialized apart).

namespace {
__device__ TrapRecord g_trap;
__device__ TrapRecord* g_trap_host;  // mapped pinned host copy, or null
}

// The first trapping thread claims g_trap (atomics in device memory) and fills
// it, then copies it to the host mirror with plain stores (no atomics on mapped
// host memory); later traps only count.
static __device__ __noinline__ void trap_record(uint32_t line, const char* fmt, unsigned long long v0 = 0,
                                                unsigned long long v1 = 0, unsigned long long v2 = 0,
                                                unsigned long long v3 = 0, const void* dump = nullptr,
                                                uint32_t dump_bytes = 0) {
  TrapRecord* r = &g_trap;
  const unsigned int count = atomicAdd(&r->count, 1u) + 1u;
  volatile TrapRecord* hv = *static_cast<TrapRecord* volatile*>(&g_trap_host);
  if (atomicCAS(&r->state, 0u, 1u) != 0u) {
    if (hv != nullptr) hv->count = count;
    __threadfence_system();
    return;
  }
  volatile TrapRecord* w = r;
  unsigned long long gid;
  uint32_t crank, csize, sm;
  asm volatile("mov.u64 %0, %%gridid;" : "=l"(gid));
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(crank));
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(csize));
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  w->line = line;
  w->block_x = blockIdx.x;
  w->thread_x = threadIdx.x;
  w->cluster_rank = crank;
  w->cluster_size = csize;
  w->smid = sm;
  w->gridid = gid;
  w->v[0] = v0;
  w->v[1] = v1;
  w->v[2] = v2;
  w->v[3] = v3;
  int i = 0;
  for (; i < static_cast<int>(sizeof(r->fmt)) - 1 && fmt[i] != 0; ++i) w->fmt[i] = fmt[i];
  w->fmt[i] = 0;
  const unsigned char* d = static_cast<const unsigned char*>(dump);
  if (d == nullptr) dump_bytes = 0;
  if (dump_bytes > sizeof(r->dump)) dump_bytes = sizeof(r->dump);
  for (uint32_t j = 0; j < dump_bytes; ++j) w->dump[j] = d[j];
  w->dump_bytes = dump_bytes;
  __threadfence();
  atomicExch(&r->state, 2u);
  if (hv != nullptr) {
    // Plain copy, `state` last (the host reads the record once state == 2).
    const volatile unsigned int* src = reinterpret_cast<const volatile unsigned int*>(w);
    volatile unsigned int* dst = reinterpret_cast<volatile unsigned int*>(hv);
    for (uint32_t k = 1; k < sizeof(TrapRecord) / 4u; ++k) dst[k] = src[k];
    dst[1] = count;
    __threadfence_system();
    dst[0] = 2u;
    __threadfence_system();
  }
}

// Loud failure: the message names the emulated instruction and the offending
// value; __trap() makes the launch fail (sticky cudaErrorLaunchFailure /
// cudaErrorIllegalInstruction), so a test cannot silently pass. The first
// argument is the format string (recorded with the line, see TrapRecord).
#define M3QKV_EMU_TRAP(...) M3QKV_EMU_TRAP_VD(0ull, 0ull, 0ull, 0ull, nullptr, 0u, __VA_ARGS__)
// Same, recording four key numbers v0..v3 (see TrapRecord).
#define M3QKV_EMU_TRAP_V(v0, v1, v2, v3, ...) M3QKV_EMU_TRAP_VD(v0, v1, v2, v3, nullptr, 0u, __VA_ARGS__)
// Same, also recording `dump_bytes` raw bytes from `dump` (generic pointer).
#define M3QKV_EMU_TRAP_VD(v0, v1, v2, v3, dump, dump_bytes, ...)                                                \
  do {                                                                                                        \
    ::m3qkv::ptx::emu::trap_record(__LINE__, M3QKV_EMU_FIRST_(__VA_ARGS__, ""), (unsigned long long)(v0),        \
                                   (unsigned long long)(v1), (unsigned long long)(v2),                        \
                                   (unsigned long long)(v3), (dump), (dump_bytes));                           \
    printf("[m3qkv tcgen05 emulation] block %d thread %d: ", static_cast<int>(blockIdx.x),                   \
           static_cast<int>(threadIdx.x));                                                                    \
    printf(__VA_ARGS__);                                                                                      \
    printf("\n");                                                                                             \
    __trap();                                                                                                 \
  } while (0)
#define M3QKV_EMU_FIRST_(f, ...) f

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
static_assert(sizeof(CtaState) <= sizeof(TrapRecord::dump), "trap record dumps the whole CtaState");

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
// `site`: recorded as v[3]; callers pass something that tells their call sites
// apart (the TMA models: the tensor map's address), else the address of s_cta.
__device__ __forceinline__ void require_state(const char* what, unsigned long long site = ~0ull) {
  const uint32_t magic = s_cta.magic;
  const unsigned long long owner = s_cta.owner;
  const unsigned long long tag = (gridid() << 20) ^ blockIdx.x;
  if (magic != kMagic || owner != tag)
    M3QKV_EMU_TRAP_VD(magic, owner, tag, site != ~0ull ? site : smem_addr(&s_cta), &s_cta,
                      static_cast<uint32_t>(sizeof(s_cta)),
                     "%s before tcgen05.alloc initialized the emulation state (magic %08x, owner %llx, expected %llx)",
                     what, magic, owner, tag);
}

// Rank of the CTA whose shared memory holds shared::cluster address `a`
// (getctarank.shared::cluster, PTX ISA "getctarank", sm_90) and the shared::cta address of the
// same location in this CTA's window, checked exactly: mapa(local, rank) must
// give `a` back. The local address is found by the offset mapa applies to a
// known variable of this CTA; no assumption about the numeric range of
// shared::cta addresses (an earlier version required the local address to be
// below 0x40000 and rejected the even CTA's barrier address in every odd CTA
// on the H200).
__device__ __forceinline__ bool cluster_addr_owner(uint32_t a, uint32_t* rank, uint32_t* local) {
  uint32_t r;
  asm volatile("getctarank.shared::cluster.u32 %0, %1;" : "=r"(r) : "r"(a));
  if (r >= cluster_size()) return false;
  const uint32_t ref = smem_addr(&s_cta);
  const uint32_t cand = a - (mapa(ref, r) - ref);
  if (mapa(cand, r) != a) return false;
  *rank = r;
  *local = cand;
  return true;
}

}  // namespace m3qkv::ptx::emu
