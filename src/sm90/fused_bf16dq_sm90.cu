// SM90 fused kernel, mainloop variant A: MXFP8 dequantized to bf16 in shared
// memory by a transform warpgroup, then bf16 wgmma (m64n128k16) with f32
// accumulators over the whole K.
//
// e4m3·2^e is exact in bf16 (src/sm90/dequant_sm90.cuh), so acc is the exact
// block-scaled product summed by the tensor core in f32. The tensor rate is
// bf16 (half the fp8 rate); the conversion costs ~2.5 integer/bf16 ops per
// element on the transform warpgroup, overlapped with the wgmma of the
// consumers.
//
// Warp roles:
//   warpgroup 0: TMA producer (one elected thread)       setmaxnreg.dec 40 (24 for BM 128)
//   warpgroups 1, 2: transform, raw e4m3 stage -> 2 bf16 stages (BK 64
//                each); each converts half of every row's chunks
//                                                         setmaxnreg.dec 96 (56 for BM 128)
//   then kCons consumers, 64 rows each, the register     setmaxnreg.inc 232 (BM 64) / 168 (BM 128)
//                epilogue on the fragment (epilogue_regs_sm90.cuh)
// Barriers: raw_full[s] (1 arrival + tx), raw_empty[s] (every transform thread),
//           bf_full[s] (every transform thread), bf_empty[s] (one arrival per consumer warp).
// Layouts: raw tiles are TMA 128-B swizzled (row r, 16-B chunk c at r·128 +
// ((c ^ r%8)·16)); bf16 tiles are [rows][64 bf16] with the same 128-B swizzle,
// the K-major layout wgmma's descriptor describes (ptx/wgmma.cuh).
//
// kPreA (prefill, docs/sm90.md "Prefill step 1"): the activations are
// converted once per call by the grid itself before its mainloop
// (convert_sm90.cuh, then a grid barrier; one cooperative launch) into a bf16
// copy x̂ [M][K] (the stream workspace), so the A side needs no transform: a second
// producer thread (warp 1) loads x̂ tiles by TMA with the 128-B swizzle
// straight into the bf16 stages — the very bytes the transform would have
// stored there (same dequantizer, same swizzle; TMA zero-fills rows past M as
// zero_row_half does) — and the transform warpgroups convert the weights only:
// half the conversion work per stage, which bounds variant A at large M.
// Barrier change: bf_full[s] counts the transform threads plus the A
// producer's arrive.expect_tx (its tile's bytes).
#include "sm90/convert_sm90.cuh"
#include "sm90/dequant_sm90.cuh"
#include "sm90/epilogue_regs_sm90.cuh"
#include "sm90/kernel_sm90.cuh"

namespace m3qkv::sm90 {
namespace {

constexpr int kBKbf = 64;  // bf16 stage K: one 128-byte swizzle row of bf16 per tile row

template <int kCons, bool kSplit, bool kPreA = false>
struct Bf16DqCfg {
  static constexpr int kBM = kRowsPerWg * kCons;
  // Transform warpgroups: 2 (each thread converts half of a row's chunks: two
  // warps per sub-partition hide each other's latency; the transform bounds
  // A's stage time).
  static constexpr int kXf = 2;
  static constexpr int kThreads = kWarpgroup * (1 + kXf + kCons);
  // raw (TMA) stages; kPreA: the weights' tile and scale chunk only
  static constexpr int kABytes = kPreA ? 0 : kBM * kBK;
  static constexpr int kSfaBytes = kPreA ? 0 : kSfChunk;
  static constexpr int kBBytes = kBN * kBK;
  static constexpr int kRawStageBytes = kABytes + kBBytes + kSfaBytes + kSfChunk;
  // bf16 stages
  static constexpr int kAbfBytes = kBM * kBKbf * 2;
  static constexpr int kBbfBytes = kBN * kBKbf * 2;
  static constexpr int kBfStageBytes = kAbfBytes + kBbfBytes;
  // Split-K (kCons 1): each rank's partial block, read by the other ranks.
  static constexpr int kStagingBytes = kSplit ? kPartBytes : 0;
  static constexpr int kReserve = kSwizzleAtom + 256;
  // Picked to fill the budget (static_assert below):
  //   BM 128 (kCons 2)  raw 3, bf16 3
  //   BM 64  (kCons 1)  raw 4, bf16 5
  //   BM 64, split-K    raw 3, bf16 4   (+ the 32 KiB partial block)
  //   BM 128, kPreA     raw 3, bf16 5   (a raw stage is the B half only: 16.5 KiB)
  static constexpr int kRawStages = kCons == 2 ? 3 : (!kSplit ? 4 : 3);
  static constexpr int kBfStages = kPreA ? 5 : kCons == 2 ? 3 : (!kSplit ? 5 : 4);
  static constexpr int kAOff = 0;
  static constexpr int kBOff = kAOff + kRawStages * kABytes;
  static constexpr int kAbfOff = kBOff + kRawStages * kBBytes;
  static constexpr int kBbfOff = kAbfOff + kBfStages * kAbfBytes;
  static constexpr int kSfaOff = kBbfOff + kBfStages * kBbfBytes;
  static constexpr int kSfbOff = kSfaOff + kRawStages * kSfaBytes;
  static constexpr int kStgOff = kSfbOff + kRawStages * kSfChunk;
  static constexpr int kBarOff = kStgOff + kStagingBytes;
  // Each consumer warpgroup's slot-owner table (epilogue_regs_sm90.cuh
  // block_owners), at named barrier kOwnersBarrier0 + its index.
  static constexpr int kOwnersOff = kBarOff + 8 * (2 * kRawStages + 2 * kBfStages + 2);
  static constexpr int kOwnersBytes = kCons * static_cast<int>(sizeof(BlockOwners));
  static constexpr uint32_t kOwnersBarrier0 = 1;
  static constexpr int kSmemBytes = kOwnersOff + kOwnersBytes + kSwizzleAtom;
  static constexpr int kLaunchBound = kThreads;
  // BM 128 with 2 transform warpgroups: 640 threads get 96 registers each at
  // launch (65536 / 640 rounded down to the allocation granule of 8), so
  // 24 + 2·56 + 2·168 <= 5·96.
  // BM 64: 512 threads get 128, so 40 + 2·96 + 232 <= 4·128.
  static constexpr bool kTight = kCons == 2;
  static constexpr int kProducerRegs = kTight ? 24 : 40;
  static constexpr int kTransformRegs = kTight ? 56 : 96;
  static constexpr int kConsumerRegs = kTight ? 168 : 232;

  static_assert(kRawStages * kRawStageBytes + kBfStages * kBfStageBytes + kStagingBytes + kOwnersBytes + kReserve <=
                    kSmemLimit,
                "shared memory budget");
  static_assert(kOwnersOff % 8 == 0, "owner tables: 8-B words");
  static_assert(kSmemBytes <= kSmemLimit, "shared memory budget");
  static_assert(!kSplit || kCons == 1, "split-K: one consumer warpgroup");
  static_assert(!kPreA || (kCons == 2 && !kSplit), "kPreA: the one prefill instance (BM 128, no split-K)");
  // bf_full: every transform thread, plus the A producer's arrive.expect_tx.
  static constexpr int kBfFullArrivals = kXf * kWarpgroup + (kPreA ? 1 : 0);
  static_assert(kABytes % kSwizzleAtom == 0 && kAbfBytes % kSwizzleAtom == 0 && kBbfBytes % kSwizzleAtom == 0,
                "tiles 1024-B aligned");
  static_assert(kBKbf * 2 == kSwizzleBytes, "one swizzle row of bf16 per tile row and bf16 stage");
  static_assert(kBK == 2 * kBKbf, "a raw stage is two bf16 stages");
  static_assert(kProducerRegs + kXf * kTransformRegs + kCons * kConsumerRegs <=
                    ((65536 / kLaunchBound) & ~7) * (1 + kXf + kCons),
                "setmaxnreg: the register pool allocated at launch must cover the increased warpgroups");
};

// Row `r` (16-B chunks 4h..4h+3 of the raw stage = K 64h..64h+63) of one
// operand tile, converted into the bf16 stage in two steps so that the
// transform can issue the shared loads of both operands (and before it waits
// for the bf16 stage to be free) and convert afterwards: ncu at M = 4096 showed
// the transform warps (2 per scheduler) stalled on each load's latency
// (short scoreboard) with the consumers starved for bf16 stages.
// kXf transform warpgroups share the row: part `x` converts chunks
// 4h + i, i in [x·4/kXf, (x+1)·4/kXf).
template <int kXf>
struct RowHalf {
  uint4 v[4 / kXf];
};
template <int kXf>
__device__ __forceinline__ RowHalf<kXf> load_row_half(const uint8_t* raw_tile, int r, int h, int x) {
  RowHalf<kXf> o;
#pragma unroll
  for (int ii = 0; ii < 4 / kXf; ++ii) {
    const int c = 4 * h + x * (4 / kXf) + ii;  // raw chunk: K 16c .. 16c+15
    o.v[ii] = *reinterpret_cast<const uint4*>(raw_tile + r * kSwizzleBytes + ((c ^ (r % 8)) << 4));
  }
  return o;
}
// `sf` = the row's 4 scale bytes (MX block c/2 of raw chunk c).
template <int kXf>
__device__ __forceinline__ void store_row_half(const RowHalf<kXf>& in, uint8_t* bf_tile, int r, int h, uint32_t sf,
                                               int x) {
  const int sw = r % 8;
#pragma unroll
  for (int ii = 0; ii < 4 / kXf; ++ii) {
    const int i = x * (4 / kXf) + ii;
    const int c = 4 * h + i;
    uint4 lo, hi;
    dequant16_e4m3_to_bf16(in.v[ii], (sf >> (8 * (c / 2))) & 0xffu, &lo, &hi);
    *reinterpret_cast<uint4*>(bf_tile + r * kSwizzleBytes + (((2 * i) ^ sw) << 4)) = lo;
    *reinterpret_cast<uint4*>(bf_tile + r * kSwizzleBytes + (((2 * i + 1) ^ sw) << 4)) = hi;
  }
}

// Zero row `r`, K half h, of a bf16 tile (a tile row past M: what converting
// the zero-filled TMA row would give, without the conversion work).
// Chunk order swizzled like the converted stores: the 8 threads of a quarter
// warp (rows r..r+7) hit 8 different 16-B bank groups.
// Part `x` of kXf zeroes the bf16 chunks its converted raw chunks would write.
template <int kXf>
__device__ __forceinline__ void zero_row_half(uint8_t* bf_tile, int r, int x) {
#pragma unroll
  for (int ii = 0; ii < 8 / kXf; ++ii) {
    const int i = x * (8 / kXf) + ii;
    *reinterpret_cast<uint4*>(bf_tile + r * kSwizzleBytes + ((i ^ (r % 8)) << 4)) = make_uint4(0, 0, 0, 0);
  }
}

template <int kCons, bool kSplit, bool kPreA>
__global__ void __launch_bounds__(Bf16DqCfg<kCons, kSplit, kPreA>::kLaunchBound, 1)
    fused_bf16dq_kernel(const __grid_constant__ CUtensorMap tmap_x, const __grid_constant__ CUtensorMap tmap_w,
                        const __grid_constant__ KernelParams p) {
#if defined(__CUDA_ARCH__) && M3QKV_HAS_WGMMA
  // tmap_x: the e4m3 activations, or (kPreA) their bf16 copy x̂ as bytes.
  using C = Bf16DqCfg<kCons, kSplit, kPreA>;
  constexpr int kBM = C::kBM;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = ptx::smem_u32(smem_raw);
  const uint32_t base = (raw + kSwizzleAtom - 1) & ~static_cast<uint32_t>(kSwizzleAtom - 1);
  uint8_t* gbase = smem_raw + (base - raw);
  const uint32_t raw_full0 = base + C::kBarOff;
  const uint32_t raw_empty0 = raw_full0 + 8 * C::kRawStages;
  const uint32_t bf_full0 = raw_empty0 + 8 * C::kRawStages;
  const uint32_t bf_empty0 = bf_full0 + 8 * C::kBfStages;
  const uint32_t red_full = bf_empty0 + 8 * C::kBfStages;  // split-K (kernel_sm90.cuh splitk_reduce_spread)
  const uint32_t red_empty = red_full + 8;
  const uint32_t rank = kSplit ? ptx::cluster_ctarank() : 0u;
  const Work wk = work_of<kSplit>(p, rank);

  const int wg = threadIdx.x / kWarpgroup;
  const int warp = threadIdx.x / 32;
  if (threadIdx.x == 0) {
    trace_event(p, kTrEntry);
    trace_value(p, kTrRank, rank);
    for (int s = 0; s < C::kRawStages; ++s) {
      ptx::mbarrier_init(raw_full0 + 8 * s, 1);
      ptx::mbarrier_init(raw_empty0 + 8 * s, C::kXf * kWarpgroup);
    }
    for (int s = 0; s < C::kBfStages; ++s) {
      ptx::mbarrier_init(bf_full0 + 8 * s, C::kBfFullArrivals);
      ptx::mbarrier_init(bf_empty0 + 8 * s, 4 * kCons);
    }
    if (kSplit) {
      // Every other rank writes to and reads this CTA's partial (splitk_reduce_spread).
      ptx::mbarrier_init(red_full, (p.split - 1) * kWarpgroup);
      ptx::mbarrier_init(red_empty, (p.split - 1) * kWarpgroup);
    }
    ptx::fence_mbarrier_init_release_cluster();
  }
  if (threadIdx.x == 32) {
    ptx::prefetch_tensormap(&tmap_x);
    ptx::prefetch_tensormap(&tmap_w);
  }
  __syncthreads();
  if constexpr (kSplit) {
    // Every CTA's barriers are initialized before any remote arrive.
    ptx::barrier_cluster_arrive();
    ptx::barrier_cluster_wait();
  }
  griddepcontrol_wait();
  if (threadIdx.x == 0) trace_event(p, kTrPdlWaitDone);
  if constexpr (kPreA) convert_phase(p);  // x̂: every CTA converts its share, then the grid barrier

  if (wg == 0) {
    ptx::setmaxnreg_dec<C::kProducerRegs>();
    if (warp == 0 && ptx::elect_sync()) {
      trace_event(p, kTrProducerStart);
      produce<kBM, C::kRawStages, !kPreA>(p, wk, &tmap_x, &tmap_w, base + C::kAOff, base + C::kBOff,
                                          base + C::kSfaOff, base + C::kSfbOff, raw_full0, raw_empty0);
    } else if (kPreA && warp == 1 && ptx::elect_sync()) {
      // The A producer: x̂ tiles into the A half of every bf16 stage (the
      // transform's B half arrives on the same bf_full).
      produce_bf16<kBM, C::kBfStages>(p, wk, &tmap_x, nullptr, base + C::kAbfOff, 0u, bf_full0, bf_empty0);
    }
    griddepcontrol_launch_dependents();
  } else if (wg <= C::kXf) {
    ptx::setmaxnreg_dec<C::kTransformRegs>();
    // Thread r of transform warpgroup x converts its chunks (load/store_row_half)
    // of row r of the B tile and, when r < BM, of row r of the A tile.
    const int r = threadIdx.x % kWarpgroup;
    const int xpart = wg - 1;  // which chunks of the row (kXf = 2: halves)
    Ring<C::kRawStages> rs;
    Ring<C::kBfStages> bs;
    for (int ti = wk.first; ti < p.num_tiles; ti += wk.step) {
      const Tile tl = tile_of(p, ti);
      const int sfa_off = kPreA ? 0 : f8_128x4_chunk_word(sf_chunk_row<kBM>(tl.mb, r < kBM ? r : 0));
      const int sfb_off = f8_128x4_chunk_word(r);
      // A rows past M (TMA zero-filled) need no conversion: zeros are stored
      // (at M = 1 this skips a third of the transform work).
      // kPreA: the A producer fills the A half of every bf16 stage.
      const bool a_live = !kPreA && r < kBM && static_cast<int64_t>(tl.mb) * kBM + r < p.m;
      const bool a_zero = !kPreA && r < kBM && !a_live;
      for (int ks = wk.k0; ks < wk.k1; ++ks) {
        ptx::mbarrier_wait(raw_full0 + 8 * rs.idx, rs.phase);
        if (threadIdx.x == kWarpgroup && ti == wk.first && ks == wk.k0) trace_event(p, kTrXfFirstRaw);
        const uint8_t* a_raw = gbase + C::kAOff + rs.idx * C::kABytes;
        const uint8_t* b_raw = gbase + C::kBOff + rs.idx * C::kBBytes;
        const uint32_t sfa =
            kPreA ? 0u : *reinterpret_cast<const uint32_t*>(gbase + C::kSfaOff + rs.idx * kSfChunk + sfa_off);
        const uint32_t sfb = *reinterpret_cast<const uint32_t*>(gbase + C::kSfbOff + rs.idx * kSfChunk + sfb_off);
#pragma unroll
        for (int h = 0; h < kBK / kBKbf; ++h) {
          // B's loads go out before the wait (their latency hides behind it).
          // Holding A's too spills at 56 registers (BM 128, two transform
          // warpgroups), so A is loaded after B is converted.
          const RowHalf<C::kXf> rb = load_row_half<C::kXf>(b_raw, r, h, xpart);
          ptx::mbarrier_wait(bf_empty0 + 8 * bs.idx, bs.phase ^ 1u);
          uint8_t* a_bf = gbase + C::kAbfOff + bs.idx * C::kAbfBytes;
          uint8_t* b_bf = gbase + C::kBbfOff + bs.idx * C::kBbfBytes;
          store_row_half<C::kXf>(rb, b_bf, r, h, sfb, xpart);
          if (a_live)
            store_row_half<C::kXf>(load_row_half<C::kXf>(a_raw, r, h, xpart), a_bf, r, h, sfa, xpart);
          else if (a_zero)
            zero_row_half<C::kXf>(a_bf, r, xpart);
          // Generic-proxy stores read next by wgmma (async proxy): fence in
          // every writing thread before the release (HOPPER.md "Ordering").
          ptx::fence_proxy_async_shared_cta();
          ptx::mbarrier_arrive(bf_full0 + 8 * bs.idx);
          bs.advance();
        }
        ptx::mbarrier_arrive(raw_empty0 + 8 * rs.idx);
        rs.advance();
      }
    }
    if (threadIdx.x == kWarpgroup) trace_event(p, kTrXfDone);
  } else {
    ptx::setmaxnreg_inc<C::kConsumerRegs>();
    const int cw = wg - 1 - C::kXf;
    const bool cons_t0 = threadIdx.x == (1 + C::kXf) * kWarpgroup;  // first consumer thread
    Ring<C::kBfStages> bs;
    float acc[64];
    uint32_t red_phase = 0;
    for (int ti = wk.first; ti < p.num_tiles; ti += wk.step) {
      const Tile tl = tile_of(p, ti);
      mainloop_bf16<C::kBfStages>(acc, bs, (wk.k1 - wk.k0) * (kBK / kBKbf),
                                  base + C::kAbfOff + cw * kRowsPerWg * kSwizzleBytes, C::kAbfBytes,
                                  base + C::kBbfOff, C::kBbfBytes, bf_full0, bf_empty0, p,
                                  cons_t0 && ti == wk.first);
      if (cons_t0) trace_event(p, kTrConsMainDone);
      const int64_t row_base = static_cast<int64_t>(tl.mb) * kBM + kRowsPerWg * cw;
      finish_tile<kSplit>(p, acc, tl, row_base, rank, reinterpret_cast<float*>(gbase + C::kStgOff), base + C::kStgOff,
                          red_full, red_empty, &red_phase, ti == wk.first,
                          reinterpret_cast<BlockOwners*>(gbase + C::kOwnersOff)[cw], C::kOwnersBarrier0 + cw);
      if (cons_t0) trace_event(p, kTrConsEpiDone);
    }
  }
  splitk_exit_sync<kSplit>();
  if (threadIdx.x == 0) trace_event(p, kTrExit);
#endif
}

// The instances the launcher picks: BM 64 or 128, BM 64 with split-K, and the
// prefill instance (BM 128, x̂ by TMA).
template <int kCons, bool kSplit, bool kPreA = false>
constexpr auto kKernel = &fused_bf16dq_kernel<kCons, kSplit, kPreA>;
using PreACfg = Bf16DqCfg<2, false, true>;
constexpr auto kPreAKernel = kKernel<2, false, true>;

template <int kCons, bool kSplit>
m3qkv_status launch_one(const CUtensorMap& tx, const CUtensorMap& tw, const KernelParams& p, int grid, bool pdl,
                        cudaStream_t stream) {
  using C = Bf16DqCfg<kCons, kSplit>;
  host::LaunchShape s;
  s.grid = static_cast<unsigned>(grid);
  s.threads = C::kThreads;
  s.smem = C::kSmemBytes;
  s.pdl = pdl;
  s.cluster = kSplit ? static_cast<unsigned>(p.split) : 0u;
  return host::launch("m3qkv_fused_qkv", "fused_bf16dq_kernel", kKernel<kCons, kSplit>, s, stream, tx, tw, p);
}

template <int kCons, bool kSplit, bool kPreA = false>
cudaError_t set_smem() {
  return cudaFuncSetAttribute(kKernel<kCons, kSplit, kPreA>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              Bf16DqCfg<kCons, kSplit, kPreA>::kSmemBytes);
}

}  // namespace

m3qkv_status launch_bf16dq(int cons, const CUtensorMap& tmap_x, const CUtensorMap& tmap_w, const KernelParams& p,
                           int grid, bool pdl, cudaStream_t stream) {
  if (p.split > 1) return launch_one<1, true>(tmap_x, tmap_w, p, grid, pdl, stream);
  return cons == 1 ? launch_one<1, false>(tmap_x, tmap_w, p, grid, pdl, stream)
                   : launch_one<2, false>(tmap_x, tmap_w, p, grid, pdl, stream);
}

cudaError_t prepare_bf16dq() {
  cudaError_t e = set_smem<1, false>();
  if (e == cudaSuccess) e = set_smem<2, false>();
  if (e == cudaSuccess) e = set_smem<1, true>();
  if (e == cudaSuccess) e = set_smem<2, false, true>();
  return e;
}

m3qkv_status co_resident_pre_a(const DeviceInfo& dev, unsigned* ctas) {
  return host::co_resident_ctas("m3qkv_fused_qkv", "fused_bf16dq_kernel<pre_a>", dev,
                                reinterpret_cast<const void*>(kPreAKernel), PreACfg::kThreads, PreACfg::kSmemBytes, ctas);
}

m3qkv_status launch_bf16dq_pre_a(const CUtensorMap& tmap_xbf, const CUtensorMap& tmap_w, const KernelParams& p,
                                 int grid, bool pdl, unsigned max_ctas, cudaStream_t stream) {
  host::LaunchShape s;
  // The grid barrier needs every CTA resident: any grid is clamped to that.
  s.grid = host::clamp_grid(grid, max_ctas);
  s.threads = PreACfg::kThreads;
  s.smem = PreACfg::kSmemBytes;
  s.pdl = pdl;
  s.cooperative = true;  // the grid barrier after the conversion
  return host::launch("m3qkv_fused_qkv", "fused_bf16dq_kernel<pre_a>", kPreAKernel, s, stream, tmap_xbf, tmap_w, p);
}

int max_clusters_bf16dq(int split) {
  using C = Bf16DqCfg<1, true>;
  return host::max_active_clusters(kKernel<1, true>, C::kThreads, C::kSmemBytes, static_cast<unsigned>(split));
}

}  // namespace m3qkv::sm90
