// Functional model of the tcgen05 wrappers of ptx/tcgen05.cuh (same names and
// signatures, namespace m3qkv::ptx) for the test build M3QKV_TCGEN05_EMULATION:
// the SM100 kernel is compiled for sm_90a and run on an H100/H200, with Tensor
// Memory and the tensor core replaced by this model (docs/emulation.md).
//
// It follows the PTX ISA semantics (9.x §9.7.16), not the kernel's intent:
//  * Tensor Memory: 128 lanes × 512 columns × 32 bit per SM (§9.7.16.1), held
//    in global memory, one region per SM (%smid): the kernel runs one CTA per
//    SM, exactly the hardware situation; allocation bookkeeping per SM.
//  * alloc/dealloc/relinquish: one full converged warp (.sync.aligned); nCols a
//    power of 2 in [32, 512]; alloc after relinquish, double alloc, dealloc of
//    columns not held or by another warp than the allocating one, a read/MMA
//    outside the allocation trap with a message; an
//    allocation still held when another CTA on the SM allocates (leaked: no
//    dealloc before exit) traps after a timeout; m3qkv_emu_tmem_leaks() (host)
//    reports leaks after a run.
//  * mma.kind::mxf8f6f4.block_scale.block32: the shared-memory descriptors
//    (Table 40: start, LBO, SBO, fixed bits 46-48 = 0b001, base offset, LBO
//    mode, reserved bits, swizzle incl. the 128B/64B/32B address XOR) and the
//    instruction descriptor (Table 43: sparsity, SF ids, formats, negate,
//    transpose, N, scale type, M, reserved bits) are decoded; values the real
//    instruction rejects trap; legal values this model does not implement
//    (MN-major, sparsity, f6/f4 formats, base offset != 0, LBO mode 1, M = 128
//    at cta_group::2, 128B-with-32B-atom swizzle) trap as "not modeled".
//    D (f32) = Σ_k A·B per 32-wide block in f32, × 2^(SFA + SFB − 254) (UE8M0
//    bytes read from emulated TMEM, byte = SF id), written or accumulated.
//    cta_group::2 (M = 256): CTA pair (even, odd rank); A rows 0-127 from the
//    even CTA's shared memory, 128-255 from the odd one's; B rows [0, N/2) from
//    the even CTA, [N/2, N) from the odd one (distributed shared memory); each
//    CTA's D lanes, SFA and SFB from its own Tensor Memory.
//  * cp.32x128b.warpx4: 32 rows × 16 B (descriptor, no swizzle) to 32 lanes ×
//    4 columns, replicated to the 4 lane quarters; cta_group::2: each CTA of the
//    pair copies its own shared memory to its own Tensor Memory.
//  * mma and cp run synchronously in the issuing thread (one thread, as the
//    kernel issues them from one elected lane), so commit = make the results
//    visible (fences) + one arrive on the barrier (each barrier of the mask).
//  * ld.32x32b.xN: warp w may access lanes 32·(w%4)..+31 only (trap otherwise);
//    thread t gets lane base+t, N consecutive columns.
//
// Scale-factor placement in Tensor Memory (row m of A / column n of B): lane
// m % 32 (+32·q, all quarters hold the same copy after warpx4), column
// sf_base + m / 32, byte = SF id; this is the layout tcgen05.cp.32x128b.warpx4
// produces from a 512-byte [32][16] chunk whose byte (r, 4i + k) is the scale of
// row 32i + r (PTX ISA, tcgen05.cp and the block-scaled MMA's scale-factor layout; DeepGEMM's SF transpose before UTCCP).
// The model reads SFA of row m at lane m, SFB of column n at lane n % 128.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sm100/emu/emu_common.cuh"

namespace m3qkv::ptx::emu {

constexpr uint32_t kLanes = 128;
constexpr uint32_t kCols = 512;
constexpr uint32_t kMaxSms = 192;  // %smid bound checked at alloc
constexpr uint64_t kAllocTimeoutNs = 4000000000ull;

// Test-only fault injection: XOR masks applied to the operands of the emulated
// instructions before decoding (tests/gpu/test_sm100_emu.cu), set with
// m3qkv_emu_set_fault(). Proves the model reads the fields.
struct Fault {
  unsigned long long a_desc_xor, b_desc_xor, sf_desc_xor;
  unsigned int idesc_xor, pad;
};

namespace {
__device__ uint32_t g_tmem[kMaxSms][kLanes * kCols];  // 48 MiB, zero-filled at module load
__device__ uint32_t g_alloc_mask[kMaxSms];             // 32-column granules allocated on each SM
__device__ Fault g_fault;
}  // namespace

__device__ __forceinline__ uint32_t smid() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t* tmem_of(uint32_t sm) { return g_tmem[sm]; }

// .sync.aligned: the whole warp executes the instruction together. Modeled as
// a full-warp __syncwarp(): a partial warp never completes it (a hang the
// tests' timeouts catch, and compute-sanitizer synccheck reports). An
// __activemask() test is NOT used: the H200 run showed it reporting mask
// 0x1 right after a converged __syncwarp() (independent thread scheduling
// gives no convergence guarantee for __activemask), a false trap.
__device__ __forceinline__ void require_full_warp(const char* what) {
  (void)what;
  __syncwarp();
}

// The SM (Tensor Memory) of CTA `rank` of the cluster (own or peer).
__device__ __forceinline__ uint32_t sm_of_rank(uint32_t rank) {
  return ld_cluster_u32(mapa(smem_addr(&s_cta.sm), rank));
}
__device__ __forceinline__ void check_cols(uint32_t rank, uint32_t col, uint32_t n, const char* what) {
  const uint32_t c0 = ld_cluster_u32(mapa(smem_addr(&s_cta.alloc_col), rank));
  const uint32_t nc = ld_cluster_u32(mapa(smem_addr(&s_cta.alloc_ncols), rank));
  if (nc == 0 || col < c0 || col + n > c0 + nc)
    M3QKV_EMU_TRAP("%s: columns [%u, %u) of CTA rank %u outside its allocation [%u, %u)", what, col, col + n, rank, c0,
                   c0 + nc);
}

template <int CG>
__device__ __forceinline__ void check_cg_cluster(const char* what) {
  if (CG == 2 && (cluster_size() & 1u)) M3QKV_EMU_TRAP("%s.cta_group::2 needs an even cluster size (CTA pairs)", what);
}

// ------------------------------------------------------- descriptor decoding
struct SmemDesc {
  uint32_t start, lbo, sbo, swizzle_bytes, xor_mask;  // xor_mask: bits 4.. XORed with bits 7..
};
// Table 40 (§9.7.16.4.1). `k_bytes`: bytes of one row the instruction reads.
__device__ __forceinline__ SmemDesc decode_smem_desc(uint64_t d, const char* what, uint32_t k_bytes) {
  SmemDesc s;
  s.start = static_cast<uint32_t>(d & 0x3FFFu) << 4;
  s.lbo = static_cast<uint32_t>((d >> 16) & 0x3FFFu) << 4;
  s.sbo = static_cast<uint32_t>((d >> 32) & 0x3FFFu) << 4;
  const uint32_t fixed = static_cast<uint32_t>((d >> 46) & 7u);
  const uint32_t base_off = static_cast<uint32_t>((d >> 49) & 7u);
  const uint32_t lbo_mode = static_cast<uint32_t>((d >> 52) & 1u);
  const uint32_t zero_53_60 = static_cast<uint32_t>((d >> 53) & 0xFFu);
  const uint32_t reserved = static_cast<uint32_t>(((d >> 14) & 3u) | (((d >> 30) & 3u) << 2));
  const uint32_t swz = static_cast<uint32_t>(d >> 61);
  if (fixed != 1u) M3QKV_EMU_TRAP("%s: descriptor bits 46-48 = %u, must be 0b001 (desc %016llx)", what, fixed, (unsigned long long)d);
  if (zero_53_60 != 0u) M3QKV_EMU_TRAP("%s: descriptor bits 53-60 = %#x, must be 0 (desc %016llx)", what, zero_53_60, (unsigned long long)d);
  if (reserved != 0u) M3QKV_EMU_TRAP("%s: reserved descriptor bits 14-15/30-31 set (desc %016llx)", what, (unsigned long long)d);
  if (swz == 3u || swz == 5u || swz == 7u) M3QKV_EMU_TRAP("%s: invalid swizzle mode %u (desc %016llx)", what, swz, (unsigned long long)d);
  if (swz == 1u) M3QKV_EMU_TRAP("%s: swizzle mode 1 (128B with 32B atom) not modeled", what);
  if (base_off != 0u) M3QKV_EMU_TRAP("%s: matrix base offset %u not modeled (tiles must sit on the pattern boundary)", what, base_off);
  if (lbo_mode != 0u) M3QKV_EMU_TRAP("%s: LBO mode 1 (absolute) not modeled", what);
  s.swizzle_bytes = swz == 0 ? 0u : swz == 2 ? 128u : swz == 4 ? 64u : 32u;
  s.xor_mask = swz == 0 ? 0u : swz == 2 ? 7u : swz == 4 ? 3u : 1u;
  if (s.swizzle_bytes != 0 && (s.start % s.swizzle_bytes) + k_bytes > s.swizzle_bytes)
    M3QKV_EMU_TRAP("%s: the %u-byte K slice at start %#x crosses the %u-byte swizzle atom (not modeled)", what, k_bytes,
                   s.start, s.swizzle_bytes);
  return s;
}
// Shared-memory byte address of (row r, byte kb) of a K-major operand; kb is
// a multiple of 16 and the 16 bytes from there stay inside one granule.
// Swizzled: rows of one 8-row group `swizzle_bytes` apart, groups SBO apart,
// then the swizzle XORs address bits 4.. with bits 7.. (Swizzle<3,4,3> for
// 128B, <2,4,3> 64B, <1,4,3> 32B, the pattern TMA writes). No swizzle: core
// matrices of 8 rows × 16 B (128 contiguous bytes), LBO between core matrices
// along K, SBO along M/N.
__device__ __forceinline__ uint32_t operand_addr(const SmemDesc& s, uint32_t r, uint32_t kb) {
  if (s.swizzle_bytes == 0) return s.start + (r >> 3) * s.sbo + (kb >> 4) * s.lbo + (r & 7u) * 16u + (kb & 15u);
  const uint32_t lin = s.start + (r >> 3) * s.sbo + (r & 7u) * s.swizzle_bytes + kb;
  return lin ^ (((lin >> 7) & s.xor_mask) << 4);
}

struct Idesc {
  uint32_t m, n, sfa_id, sfb_id, fmt_a, fmt_b, neg_a, neg_b;
};
// Table 43 (§9.7.16.4.2, kind::mxf8f6f4).
template <int CG>
__device__ __forceinline__ Idesc decode_idesc(uint32_t d) {
  Idesc r;
  const uint32_t sparse_sel = d & 3u, sparse = (d >> 2) & 1u, res3 = (d >> 3) & 1u, res6 = (d >> 6) & 1u;
  r.sfb_id = (d >> 4) & 3u;
  r.fmt_a = (d >> 7) & 7u;
  r.fmt_b = (d >> 10) & 7u;
  r.neg_a = (d >> 13) & 1u;
  r.neg_b = (d >> 14) & 1u;
  const uint32_t trans_a = (d >> 15) & 1u, trans_b = (d >> 16) & 1u;
  r.n = ((d >> 17) & 0x3Fu) << 3;
  const uint32_t scale_type = (d >> 23) & 1u;
  const uint32_t res24 = (d >> 24) & 7u;
  r.m = ((d >> 27) & 3u) << 7;
  r.sfa_id = (d >> 29) & 3u;
  const uint32_t res31 = d >> 31;
  if (res3 | res6 | res24 | res31) M3QKV_EMU_TRAP("tcgen05.mma: reserved instruction-descriptor bits set (idesc %08x)", d);
  if (sparse) M3QKV_EMU_TRAP("tcgen05.mma: sparsity not modeled (idesc %08x)", d);
  if (sparse_sel) M3QKV_EMU_TRAP("tcgen05.mma: sparsity selector %u without sparsity (idesc %08x)", sparse_sel, d);
  auto fmt_ok = [](uint32_t f) { return f == 0u || f == 1u || f == 3u || f == 4u || f == 5u; };
  if (!fmt_ok(r.fmt_a) || !fmt_ok(r.fmt_b)) M3QKV_EMU_TRAP("tcgen05.mma: invalid A/B format %u/%u (idesc %08x)", r.fmt_a, r.fmt_b, d);
  if (r.fmt_a > 1u || r.fmt_b > 1u) M3QKV_EMU_TRAP("tcgen05.mma: f6/f4 formats not modeled (idesc %08x)", d);
  if (trans_a | trans_b) M3QKV_EMU_TRAP("tcgen05.mma: MN-major (transpose) operands not modeled (idesc %08x)", d);
  if (scale_type != 1u) M3QKV_EMU_TRAP("tcgen05.mma: kind::mxf8f6f4 needs UE8M0 scales (bit 23 = 1) (idesc %08x)", d);
  // Shapes (§9.7.16.2.1, dense): cta_group::1 M = 128 (M = 64 has no encoding
  // in Table 43's M >> 7), N 8..256 step 8; cta_group::2 M = 128/256, N 16..256 step 16.
  const bool ok = CG == 1 ? (r.m == 128 && r.n >= 8 && r.n <= 256)
                          : ((r.m == 128 || r.m == 256) && r.n >= 16 && r.n <= 256 && r.n % 16 == 0);
  if (!ok) M3QKV_EMU_TRAP("tcgen05.mma.cta_group::%d: invalid shape M = %u, N = %u (idesc %08x)", CG, r.m, r.n, d);
  if (CG == 2 && r.m != 256) M3QKV_EMU_TRAP("tcgen05.mma.cta_group::2 with M = 128 not modeled (idesc %08x)", d);
  return r;
}

// 16 bytes (16 fp8 values) -> f32 via cvt.rn.f16x2.{e4m3,e5m2}x2 (sm_89+): exact.
__device__ __forceinline__ void fp8x16_to_f32(uint4 v, uint32_t fmt, float (&o)[16]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint16_t pair = static_cast<uint16_t>(w[i] >> (16 * h));
      uint32_t f16x2;
      if (fmt == 0)
        asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(f16x2) : "h"(pair));
      else
        asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(f16x2) : "h"(pair));
      float lo, hi;
      asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}"
          : "=f"(lo), "=f"(hi)
          : "r"(f16x2));
      o[4 * i + 2 * h] = lo;
      o[4 * i + 2 * h + 1] = hi;
    }
  }
}

__device__ __forceinline__ uint8_t sf_byte(const uint32_t* tmem, uint32_t lane, uint32_t col, uint32_t id) {
  return static_cast<uint8_t>(__ldcg(tmem + lane * kCols + col) >> (8 * id));
}

// tcgen05.ld.sync.aligned.32x32b.xN model (the two wrappers below).
template <int N>
__device__ __forceinline__ void ld_32x32b(uint32_t taddr, uint32_t (&r)[N]) {
  require_full_warp("tcgen05.ld");
  require_state("tcgen05.ld");
  const uint32_t lane0 = taddr >> 16, col = taddr & 0xFFFFu;
  const uint32_t quarter = linear_warp() % 4u;
  if (lane0 != 32u * quarter)
    M3QKV_EMU_TRAP("tcgen05.ld.32x32b: warp %u (lane quarter %u) addresses lanes %u..%u", linear_warp(), quarter, lane0,
                   lane0 + 31);
  if (__shfl_sync(0xffffffffu, taddr, 0) != taddr) M3QKV_EMU_TRAP("tcgen05.ld: taddr differs across the warp");
  if ((threadIdx.x & 31u) == 0) check_cols(cta_rank(), col, N, "tcgen05.ld");
  const uint32_t* src = tmem_of(s_cta.sm) + (lane0 + (threadIdx.x & 31u)) * kCols + col;
#pragma unroll
  for (int i = 0; i < N; ++i) r[i] = __ldcg(src + i);
  __syncwarp();
}

}  // namespace m3qkv::ptx::emu

namespace m3qkv::ptx {

// ------------------------------------------------------------- allocation
template <int CG>
__device__ __forceinline__ void tcgen05_alloc(uint32_t smem_dst, uint32_t ncols) {
  static_assert(CG == 1 || CG == 2, "cta_group");
  using namespace emu;
  require_full_warp("tcgen05.alloc");
  check_cg_cluster<CG>("tcgen05.alloc");
  if ((threadIdx.x & 31u) == 0) {
    // First tcgen05 instruction of the CTA: (re)initialize the per-CTA state
    // (shared memory may still hold an earlier CTA's state: the owner tag is
    // this grid's %gridid and this CTA's index).
    const unsigned long long tag = (gridid() << 20) ^ blockIdx.x;
    if (s_cta.magic != kMagic || s_cta.owner != tag) {
      s_cta.magic = 0;
      s_cta.owner = tag;
      s_cta.alloc_ncols = 0;
      s_cta.relinquished = 0;
    }
    if (ncols < 32 || ncols > kCols || (ncols & (ncols - 1)) != 0)
      M3QKV_EMU_TRAP("tcgen05.alloc: nCols = %u is not a power of 2 in [32, 512]", ncols);
    if (s_cta.magic == kMagic && s_cta.relinquished) M3QKV_EMU_TRAP("tcgen05.alloc after relinquish_alloc_permit");
    if (s_cta.magic == kMagic && s_cta.alloc_ncols != 0)
      M3QKV_EMU_TRAP("tcgen05.alloc: double allocation (this CTA already holds %u columns)", s_cta.alloc_ncols);
    const uint32_t sm = smid();
    if (sm >= kMaxSms) M3QKV_EMU_TRAP("%%smid %u >= emulation bound %u", sm, kMaxSms);
    // Blocks until nCols aligned columns are free on this SM (as the hardware does).
    const uint32_t granules = ncols / 32u;
    const uint32_t want_bits = granules == 16 ? 0xFFFFu : ((1u << granules) - 1u);
    const uint64_t t0 = globaltimer_ns();
    uint32_t col = 0xFFFFFFFFu;
    while (col == 0xFFFFFFFFu) {
      const uint32_t cur = atomicAdd(&g_alloc_mask[sm], 0u);
      for (uint32_t g = 0; g < 16; g += granules) {
        const uint32_t bits = want_bits << g;
        if ((cur & bits) == 0 && atomicCAS(&g_alloc_mask[sm], cur, cur | bits) == cur) {
          col = g * 32u;
          break;
        }
        if ((cur & bits) == 0) break;  // lost a race: reload
      }
      if (col == 0xFFFFFFFFu && globaltimer_ns() - t0 > kAllocTimeoutNs)
        M3QKV_EMU_TRAP("tcgen05.alloc of %u columns on SM %u blocked for 4 s (allocated granules %04x): TMEM leaked by a "
                       "CTA that exited without dealloc, or a deadlock",
                       ncols, sm, atomicAdd(&g_alloc_mask[sm], 0u));
    }
    __threadfence();
    s_cta.sm = sm;
    s_cta.alloc_col = col;
    s_cta.alloc_ncols = ncols;
    s_cta.relinquished = 0;
    s_cta.alloc_warp = linear_warp();
    s_cta.tma_phase = 0;
    for (int i = 0; i < 4; ++i) s_cta.tmap_cache[i] = nullptr;
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&s_cta.tma_bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    s_cta.magic = kMagic;
    // The TMEM address (lane 0, first column) to [smem_dst].
    asm volatile("st.shared::cta.u32 [%0], %1;" ::"r"(smem_dst), "r"(col) : "memory");
  }
  __syncwarp();
}

template <int CG>
__device__ __forceinline__ void tcgen05_dealloc(uint32_t taddr, uint32_t ncols) {
  using namespace emu;
  require_full_warp("tcgen05.dealloc");
  if ((threadIdx.x & 31u) == 0) {
    require_state("tcgen05.dealloc");
    if ((taddr >> 16) != 0) M3QKV_EMU_TRAP("tcgen05.dealloc: address %08x has a non-zero lane", taddr);
    if (s_cta.alloc_ncols != 0 && s_cta.alloc_warp != linear_warp())
      M3QKV_EMU_TRAP("tcgen05.dealloc by warp %u, the columns were allocated by warp %u", linear_warp(), s_cta.alloc_warp);
    if (s_cta.alloc_ncols == 0 || s_cta.alloc_col != (taddr & 0xFFFFu) || s_cta.alloc_ncols != ncols)
      M3QKV_EMU_TRAP("tcgen05.dealloc of %u columns at %u: this CTA holds %u columns at %u", ncols, taddr & 0xFFFFu,
                     s_cta.alloc_ncols, s_cta.alloc_col);
    const uint32_t granules = ncols / 32u;
    const uint32_t bits = (granules == 16 ? 0xFFFFu : ((1u << granules) - 1u)) << (s_cta.alloc_col / 32u);
    __threadfence();
    const uint32_t old = atomicAnd(&g_alloc_mask[s_cta.sm], ~bits);
    if ((old & bits) != bits) M3QKV_EMU_TRAP("tcgen05.dealloc: SM %u bookkeeping lost granules %04x", s_cta.sm, bits & ~old);
    s_cta.alloc_ncols = 0;
  }
  __syncwarp();
}

template <int CG>
__device__ __forceinline__ void tcgen05_relinquish_alloc_permit() {
  using namespace emu;
  require_full_warp("tcgen05.relinquish_alloc_permit");
  if ((threadIdx.x & 31u) == 0) {
    require_state("tcgen05.relinquish_alloc_permit");
    s_cta.relinquished = 1;
  }
  __syncwarp();
}

// -------------------------------------------------------------------- mma
template <int CG>
__device__ __noinline__ void tcgen05_mma_mxf8f6f4_block_scale(uint32_t d_tmem, uint64_t a_desc, uint64_t b_desc,
                                                              uint32_t idesc, uint32_t sfa_tmem, uint32_t sfb_tmem,
                                                              bool accumulate) {
  using namespace emu;
  require_state("tcgen05.mma");
  check_cg_cluster<CG>("tcgen05.mma");
  a_desc ^= g_fault.a_desc_xor;
  b_desc ^= g_fault.b_desc_xor;
  idesc ^= g_fault.idesc_xor;
  const Idesc id = decode_idesc<CG>(idesc);
  constexpr uint32_t kKBytes = 32;  // K = 32 fp8 per instruction
  const SmemDesc da = decode_smem_desc(a_desc, "tcgen05.mma A", kKBytes);
  const SmemDesc db = decode_smem_desc(b_desc, "tcgen05.mma B", kKBytes);
  if ((d_tmem >> 16) || (sfa_tmem >> 16) || (sfb_tmem >> 16))
    M3QKV_EMU_TRAP("tcgen05.mma: TMEM addresses D %08x SFA %08x SFB %08x must start at lane 0", d_tmem, sfa_tmem, sfb_tmem);
  const uint32_t dcol = d_tmem & 0xFFFFu, sfa_col = sfa_tmem & 0xFFFFu, sfb_col = sfb_tmem & 0xFFFFu;
  const uint32_t pair0 = CG == 1 ? cta_rank() : (cta_rank() & ~1u);
  const uint32_t rows_per_cta = id.m / CG;  // 128
  const uint32_t n_per_cta = id.n / CG;     // B rows each CTA of the group provides
  const uint32_t sfb_cols = (id.n + 31) / 32;
  for (uint32_t p = 0; p < static_cast<uint32_t>(CG); ++p) {
    check_cols(pair0 + p, dcol, id.n, "tcgen05.mma D");
    check_cols(pair0 + p, sfa_col, rows_per_cta / 32, "tcgen05.mma SFA");
    check_cols(pair0 + p, sfb_col, sfb_cols, "tcgen05.mma SFB");
  }
  const float sign = (id.neg_a ^ id.neg_b) ? -1.0f : 1.0f;
  for (uint32_t p = 0; p < static_cast<uint32_t>(CG); ++p) {
    uint32_t* tmem = tmem_of(sm_of_rank(pair0 + p));
    for (uint32_t m = 0; m < rows_per_cta; ++m) {
      float a[32];
      {
        float h[16];
        fp8x16_to_f32(ld_cluster_v4(mapa(operand_addr(da, m, 0), pair0 + p)), id.fmt_a, h);
#pragma unroll
        for (int i = 0; i < 16; ++i) a[i] = h[i];
        fp8x16_to_f32(ld_cluster_v4(mapa(operand_addr(da, m, 16), pair0 + p)), id.fmt_a, h);
#pragma unroll
        for (int i = 0; i < 16; ++i) a[16 + i] = h[i];
      }
      const uint8_t sfa = sf_byte(tmem, m, sfa_col + m / 32, id.sfa_id);
      uint32_t* drow = tmem + m * kCols + dcol;
      // Eight columns at a time: their scale words and old D values are
      // independent loads issued together (one thread: latency dominates).
      for (uint32_t n0 = 0; n0 < id.n; n0 += 8) {
        uint32_t sfbw[8], dold[8];
#pragma unroll
        for (uint32_t j = 0; j < 8; ++j) {
          const uint32_t n = n0 + j;
          sfbw[j] = __ldcg(tmem + (n % kLanes) * kCols + sfb_col + n / 32);
          dold[j] = accumulate ? __ldcg(drow + n) : 0u;
        }
#pragma unroll
        for (uint32_t j = 0; j < 8; ++j) {
          const uint32_t n = n0 + j;
          const uint32_t src = pair0 + (CG == 1 ? 0u : n / n_per_cta);
          const uint32_t nr = n % n_per_cta;
          float acc = 0.0f;
#pragma unroll
          for (uint32_t half = 0; half < 2; ++half) {
            float b[16];
            fp8x16_to_f32(ld_cluster_v4(mapa(operand_addr(db, nr, 16 * half), src)), id.fmt_b, b);
#pragma unroll
            for (int i = 0; i < 16; ++i) acc = fmaf(a[16 * half + i], b[i], acc);
          }
          const uint32_t sfb = (sfbw[j] >> (8 * id.sfb_id)) & 0xFFu;
          float v;
          if (sfa == 0xFFu || sfb == 0xFFu)
            v = __int_as_float(0x7FC00000);  // E8M0 0xFF = NaN
          else
            v = sign * ldexpf(acc, static_cast<int>(sfa) + static_cast<int>(sfb) - 254);
          dold[j] = __float_as_uint(accumulate ? __uint_as_float(dold[j]) + v : v);
        }
#pragma unroll
        for (uint32_t j = 0; j < 8; ++j) __stcg(drow + n0 + j, dold[j]);
      }
    }
  }
}

// --------------------------------------------------------------------- cp
template <int CG>
__device__ __forceinline__ void tcgen05_cp_32x128b_warpx4(uint32_t taddr, uint64_t s_desc) {
  using namespace emu;
  require_state("tcgen05.cp");
  check_cg_cluster<CG>("tcgen05.cp");
  s_desc ^= g_fault.sf_desc_xor;
  const SmemDesc d = decode_smem_desc(s_desc, "tcgen05.cp", 16);
  if (d.swizzle_bytes != 0) M3QKV_EMU_TRAP("tcgen05.cp.32x128b: swizzled source not modeled");
  if (taddr >> 16) M3QKV_EMU_TRAP("tcgen05.cp.32x128b.warpx4: address %08x must start at lane 0", taddr);
  const uint32_t col = taddr & 0xFFFFu;
  const uint32_t pair0 = CG == 1 ? cta_rank() : (cta_rank() & ~1u);
  for (uint32_t p = 0; p < static_cast<uint32_t>(CG); ++p) {
    check_cols(pair0 + p, col, 4, "tcgen05.cp");
    uint32_t* tmem = tmem_of(sm_of_rank(pair0 + p));
    for (uint32_t r = 0; r < 32; ++r) {
      const uint4 v = ld_cluster_v4(mapa(operand_addr(d, r, 0), pair0 + p));
      for (uint32_t q = 0; q < 4; ++q) {
        uint32_t* dst = tmem + (32 * q + r) * kCols + col;
        __stcg(dst + 0, v.x);
        __stcg(dst + 1, v.y);
        __stcg(dst + 2, v.z);
        __stcg(dst + 3, v.w);
      }
    }
  }
}

// ----------------------------------------------------------------- commit
// The emulated mma/cp completed synchronously: make their Tensor Memory
// (global) writes visible at cluster scope and their shared-memory reads
// ordered before later async-proxy (TMA) writes, then arrive.
template <int CG>
__device__ __forceinline__ void tcgen05_commit(uint32_t bar) {
  using namespace emu;
  __threadfence();
  asm volatile("fence.proxy.async;" ::: "memory");
  arrive_cluster(mapa(bar, cta_rank()));  // `bar` is a shared::cta address of this CTA
}
template <int CG>
__device__ __forceinline__ void tcgen05_commit_multicast(uint32_t bar, uint16_t cta_mask) {
  using namespace emu;
  __threadfence();
  asm volatile("fence.proxy.async;" ::: "memory");
  // `bar` is a shared::cta offset: the barrier at that offset in each CTA of the mask.
  const uint32_t n = cluster_size();
  for (uint32_t r = 0; r < 16; ++r) {
    if (!((cta_mask >> r) & 1u)) continue;
    if (r >= n) M3QKV_EMU_TRAP("tcgen05.commit.multicast: ctaMask %04x names rank %u of a %u-CTA cluster", cta_mask, r, n);
    arrive_cluster(mapa(bar, r));
  }
}

// ----------------------------------------------------------------- fences
// The model's work is synchronous and published by the commit's fences; the
// thread-sync fences only need to order memory like the hardware ones do.
__device__ __forceinline__ void tcgen05_fence_before_thread_sync() { __threadfence_block(); }
__device__ __forceinline__ void tcgen05_fence_after_thread_sync() { __threadfence_block(); }

// --------------------------------------------------------------------- ld
__device__ __forceinline__ void tcgen05_ld_32x32b_x16(uint32_t taddr, uint32_t (&r)[16]) { emu::ld_32x32b<16>(taddr, r); }
__device__ __forceinline__ void tcgen05_ld_32x32b_x32(uint32_t taddr, uint32_t (&r)[32]) { emu::ld_32x32b<32>(taddr, r); }

// The emulated ld completes before it returns.
__device__ __forceinline__ void tcgen05_wait_ld() { __syncwarp(); }

}  // namespace m3qkv::ptx

// ------------------------------------------------------------ host hooks
// Test-only entry points (declared weak by the emulation tests). The model's
// device state (g_tmem, g_alloc_mask, g_fault, g_trap) is per translation
// unit: every SM100 kernel file that includes this header (fused_sm100.cu,
// decode_sm100.cu) has its own copy. Each such TU registers its host-side
// accessors in one process-wide list (an inline function's static: one
// object however many TUs include it), and the C hooks, defined in exactly
// one TU (the one that defines M3QKV_EMU_DEFINE_HOOKS before its includes:
// fused_sm100.cu), act on every registered TU. What stays per TU: the TMEM
// allocation bookkeeping, so a decode CTA and a tile CTA never see each
// other's columns (they cannot share an SM anyway: each needs more than half
// of its shared memory), and a leak is found by m3qkv_emu_tmem_leaks(), not
// by the other TU's next allocation.
#if defined(M3QKV_BUILDING_LIBRARY) && !defined(__CUDA_ARCH__)
#include <vector>

namespace m3qkv::ptx::emu::host {
// The accessors of one TU's device state. Each returns a cudaError_t (leaks:
// SMs with columns still allocated, or -cudaError_t; read_trap: 1 = a
// complete record was copied to *r, 0 = none, -cudaError_t).
struct Unit {
  int (*set_fault)(const Fault& f);
  int (*leaks)();
  int (*install_trap_mirror)(int dev, void* dev_ptr);
  int (*read_trap)(TrapRecord* r);
  int (*reset_trap)();
};
inline std::vector<Unit>& units() {
  static std::vector<Unit> v;
  return v;
}
inline TrapRecord* g_host_rec = nullptr;  // mapped pinned, shared by every TU, never freed (must outlive a dead context)
inline void print_record(const TrapRecord& r, FILE* f) {
  fprintf(f,
          "[m3qkv tcgen05 emulation] trap record (%u trap(s)): sm100/emu line %u, block %u thread %u, cluster rank %u/%u, "
          "SM %u, gridid %llu: \"%s\"; v = {%#llx, %#llx, %#llx, %#llx}\n",
          r.count, r.line, r.block_x, r.thread_x, r.cluster_rank, r.cluster_size, r.smid, r.gridid, r.fmt, r.v[0],
          r.v[1], r.v[2], r.v[3]);
  const unsigned n = r.dump_bytes < sizeof(r.dump) ? r.dump_bytes : static_cast<unsigned>(sizeof(r.dump));
  if (n != 0) {
    fprintf(f, "[m3qkv tcgen05 emulation]   dump (%u bytes):", n);
    for (unsigned i = 0; i < n; ++i) fprintf(f, "%s%02x", i % 16 == 0 ? "\n    " : " ", r.dump[i]);
    fprintf(f, "\n");
  }
}
inline void print_at_exit() {
  if (g_host_rec != nullptr && g_host_rec->state == 2u) print_record(*g_host_rec, stderr);
}

namespace {  // this TU's accessors
bool g_tu_mirror_installed[64] = {};
int tu_set_fault(const Fault& f) { return static_cast<int>(cudaMemcpyToSymbol(g_fault, &f, sizeof(f))); }
int tu_leaks() {
  uint32_t masks[kMaxSms];
  const cudaError_t e = cudaMemcpyFromSymbol(masks, g_alloc_mask, sizeof(masks));
  if (e != cudaSuccess) return -static_cast<int>(e);
  int leaks = 0;
  for (uint32_t i = 0; i < kMaxSms; ++i)
    if (masks[i] != 0) {
      fprintf(stderr, "[m3qkv tcgen05 emulation] SM %u: TMEM granules %04x still allocated\n", i, masks[i]);
      ++leaks;
    }
  return leaks;
}
int tu_install_trap_mirror(int dev, void* dev_ptr) {
  if (dev >= 0 && dev < 64 && g_tu_mirror_installed[dev]) return 0;
  const cudaError_t e = cudaMemcpyToSymbol(g_trap_host, &dev_ptr, sizeof(dev_ptr));
  if (e != cudaSuccess) return static_cast<int>(e);
  if (dev >= 0 && dev < 64) g_tu_mirror_installed[dev] = true;
  return 0;
}
int tu_read_trap(TrapRecord* r) {
  const cudaError_t e = cudaMemcpyFromSymbol(r, g_trap, sizeof(*r));
  if (e != cudaSuccess) return -static_cast<int>(e);
  return r->state == 2u ? 1 : 0;
}
int tu_reset_trap() {
  TrapRecord z;
  memset(&z, 0, sizeof(z));
  return static_cast<int>(cudaMemcpyToSymbol(g_trap, &z, sizeof(z)));
}
[[maybe_unused]] const bool g_tu_registered =
    (units().push_back(Unit{tu_set_fault, tu_leaks, tu_install_trap_mirror, tu_read_trap, tu_reset_trap}), true);
}  // namespace
}  // namespace m3qkv::ptx::emu::host

#if defined(M3QKV_EMU_DEFINE_HOOKS)
extern "C" __attribute__((visibility("default"))) int m3qkv_emu_present(void) { return 1; }
extern "C" int m3qkv_emu_trap_record_install(void);
// Sets the fault-injection XOR masks of every TU (0 everywhere = no fault). Returns a cudaError_t.
extern "C" __attribute__((visibility("default"))) int m3qkv_emu_set_fault(unsigned long long a_desc_xor,
                                                                           unsigned long long b_desc_xor,
                                                                           unsigned long long sf_desc_xor,
                                                                           unsigned int idesc_xor) {
  const m3qkv::ptx::emu::Fault f{a_desc_xor, b_desc_xor, sf_desc_xor, idesc_xor, 0u};
  for (const auto& u : m3qkv::ptx::emu::host::units()) {
    const int e = u.set_fault(f);
    if (e != 0) return e;
  }
  // The tests call this before their runs: install the trap record's host mirror.
  return m3qkv_emu_trap_record_install();
}
// Number of SMs whose emulated Tensor Memory (of any TU) still has allocated
// columns (call after the kernels completed); prints them. < 0: CUDA error.
extern "C" __attribute__((visibility("default"))) int m3qkv_emu_tmem_leaks(void) {
  int leaks = 0;
  for (const auto& u : m3qkv::ptx::emu::host::units()) {
    const int n = u.leaks();
    if (n < 0) return n;
    leaks += n;
  }
  return leaks;
}
// Number of TUs that registered emulation state (tests: every SM100 kernel file).
extern "C" __attribute__((visibility("default"))) int m3qkv_emu_units(void) {
  return static_cast<int>(m3qkv::ptx::emu::host::units().size());
}

// Installs the host mirror of the trap record for the current device in every
// TU (once per device and TU; m3qkv_emu_set_fault() calls it). A recorded trap
// is printed at exit. Returns a cudaError_t.
extern "C" __attribute__((visibility("default"))) int m3qkv_emu_trap_record_install(void) {
  namespace h = m3qkv::ptx::emu::host;
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return static_cast<int>(e);
  if (h::g_host_rec == nullptr) {
    void* p = nullptr;
    e = cudaHostAlloc(&p, sizeof(m3qkv::ptx::emu::TrapRecord), cudaHostAllocMapped | cudaHostAllocPortable);
    if (e != cudaSuccess) return static_cast<int>(e);
    memset(p, 0, sizeof(m3qkv::ptx::emu::TrapRecord));
    h::g_host_rec = static_cast<m3qkv::ptx::emu::TrapRecord*>(p);
    atexit(h::print_at_exit);
  }
  void* dptr = nullptr;
  e = cudaHostGetDevicePointer(&dptr, h::g_host_rec, 0);
  if (e != cudaSuccess) return static_cast<int>(e);
  for (const auto& u : h::units()) {
    const int r = u.install_trap_mirror(dev, dptr);
    if (r != 0) return r;
  }
  return 0;
}
// Describes the first recorded trap into buf (also to stderr when print != 0).
// Returns 1 if a trap was recorded, 0 if none, < 0 (-cudaError_t) if the record
// could not be read (no host mirror installed and the context is dead).
extern "C" __attribute__((visibility("default"))) int m3qkv_emu_last_trap(char* buf, int len, int print) {
  namespace h = m3qkv::ptx::emu::host;
  m3qkv::ptx::emu::TrapRecord r;
  memset(&r, 0, sizeof(r));
  if (h::g_host_rec != nullptr) {
    memcpy(&r, const_cast<const m3qkv::ptx::emu::TrapRecord*>(h::g_host_rec), sizeof(r));
  } else {
    for (const auto& u : h::units()) {
      const int got = u.read_trap(&r);
      if (got < 0) return got;
      if (got == 1) break;
    }
  }
  if (r.state != 2u) return 0;
  r.fmt[sizeof(r.fmt) - 1] = 0;
  if (buf != nullptr && len > 0)
    snprintf(buf, static_cast<size_t>(len), "line %u block %u thread %u rank %u/%u SM %u: %s; v = {%#llx, %#llx, %#llx, %#llx}",
             r.line, r.block_x, r.thread_x, r.cluster_rank, r.cluster_size, r.smid, r.fmt, r.v[0], r.v[1], r.v[2],
             r.v[3]);
  if (print) h::print_record(r, stderr);
  return 1;
}
// Clears the record (host mirror and, if the context is alive, every TU's device copy).
extern "C" __attribute__((visibility("default"))) int m3qkv_emu_trap_record_reset(void) {
  namespace h = m3qkv::ptx::emu::host;
  if (h::g_host_rec != nullptr) memset(h::g_host_rec, 0, sizeof(*h::g_host_rec));
  int rc = 0;
  for (const auto& u : h::units()) {
    const int e = u.reset_trap();
    if (e != 0 && rc == 0) rc = e;
  }
  return rc;
}
#endif  // M3QKV_EMU_DEFINE_HOOKS
#endif
