// SM90 fused kernel, mainloop variant B: fp8 wgmma per 32-K MX block with
// promotion in f32 registers.
//
// Per BK = 128 stage and consumer warpgroup (64 rows x 128 columns), for each
// of the 4 MX blocks kb: wgmma.m64n128k32.e4m3 into a zeroed f32 `partial`,
// wait, then acc = fma(partial, sa[row][kb]·sb[col][kb], acc) on the CUDA
// cores. Hopper has no block-scaled MMA, and fp8 wgmma accumulates with
// reduced precision inside the tensor core (about 14 bits, DeepSeek-V3
// report), so the per-block promotion is needed anyway. Cost: 2 f32 ops per
// accumulator per 32 K on the FMA pipe, about twice the fp8 tensor time:
// the ceiling is roughly the bf16 tensor rate; the two consumer warpgroups
// overlap each other's promotion with their own wgmma.
//
// Warp roles (384 threads for BM = 128, 256 for BM = 64):
//   warpgroup 0: TMA producer (one elected thread), setmaxnreg.dec 40
//   warpgroup 1..kCons: consumers (64 rows each), setmaxnreg.inc 232
// Barriers: full[s] (1 arrival + tx bytes), empty[s] (one arrival per consumer warp).
#include "sm90/epilogue_regs_sm90.cuh"
#include "sm90/kernel_sm90.cuh"
#include "sm90/scale_sm90.h"

namespace m3qkv::sm90 {
namespace {

template <int kCons, bool kRegEpi, bool kSplit>
struct Fp8PromoCfg {
  static constexpr int kBM = kRowsPerWg * kCons;
  static constexpr int kThreads = kWarpgroup * (1 + kCons);
  static constexpr int kABytes = kBM * kBK;
  static constexpr int kBBytes = kBN * kBK;
  static constexpr int kStageBytes = kABytes + kBBytes + 2 * kSfChunk;
  // Split-K (kCons 1): ranks 1.. keep their partial block here, the leader its
  // staging buffer: the two never coexist in one CTA, so they share the space.
  static constexpr int kStagingBytes0 = kRegEpi ? 0 : kCons * kRowsPerWg * kStageStride * 4;
  static constexpr int kStagingBytes = kSplit && kStagingBytes0 < kPartBytes ? kPartBytes : kStagingBytes0;
  static constexpr int kReserve = kSwizzleAtom /* base alignment */ + 256 /* barriers */;
  // (2 CTAs per SM for the split-K instance were measured, docs/sm90.md
  // "Performance log" step 2: no gain, the second CTA shares the SM; 1 CTA.)
  static constexpr int kStagesFit = (kSmemLimit - kStagingBytes - kReserve) / kStageBytes;
  static constexpr int kStages = kStagesFit > 8 ? 8 : kStagesFit;
  // Offsets from the 1024-aligned base.
  static constexpr int kAOff = 0;
  static constexpr int kBOff = kAOff + kStages * kABytes;
  static constexpr int kSfaOff = kBOff + kStages * kBBytes;
  static constexpr int kSfbOff = kSfaOff + kStages * kSfChunk;
  static constexpr int kStgOff = kSfbOff + kStages * kSfChunk;
  static constexpr int kBarOff = kStgOff + kStagingBytes;
  static constexpr int kSmemBytes = kBarOff + (2 * kStages + 2) * 8 + kSwizzleAtom;
  // Registers: launch bound 384 threads -> 168 per thread at entry for both
  // shapes (BM = 64 launches 256 threads under the same bound).
  static constexpr int kLaunchBound = 384;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;

  static_assert(kStages >= 3, "pipeline too shallow");
  static_assert(!kSplit || kCons == 1, "split-K: one consumer warpgroup");
  static_assert(kSmemBytes <= kSmemLimit, "shared memory budget");
  static_assert(kABytes % kSwizzleAtom == 0 && kBBytes % kSwizzleAtom == 0, "tiles 1024-B aligned");
  static_assert(kBarOff % 8 == 0, "mbarrier alignment");
  static_assert(kThreads <= kLaunchBound, "launch bound");
  static_assert(kProducerRegs + kCons * kConsumerRegs <= ((65536 / kLaunchBound) & ~7) * (1 + kCons),
                "setmaxnreg: the register pool allocated at launch must cover the increased warpgroups");
};

template <int kCons, bool kRegEpi, bool kSplit>
__global__ void __launch_bounds__(Fp8PromoCfg<kCons, kRegEpi, kSplit>::kLaunchBound, 1)
    fused_fp8promo_kernel(const __grid_constant__ CUtensorMap tmap_x, const __grid_constant__ CUtensorMap tmap_w,
                          const __grid_constant__ KernelParams p) {
#if defined(__CUDA_ARCH__) && M3QKV_HAS_WGMMA
  using C = Fp8PromoCfg<kCons, kRegEpi, kSplit>;
  constexpr int kBM = C::kBM;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = ptx::smem_u32(smem_raw);
  const uint32_t base = (raw + kSwizzleAtom - 1) & ~static_cast<uint32_t>(kSwizzleAtom - 1);
  uint8_t* gbase = smem_raw + (base - raw);  // generic pointer of `base`
  const uint32_t full0 = base + C::kBarOff;
  const uint32_t empty0 = full0 + 8 * C::kStages;
  const uint32_t red_full = empty0 + 8 * C::kStages;  // split-K (kernel_sm90.cuh splitk_reduce)
  const uint32_t red_empty = red_full + 8;
  const uint32_t rank = kSplit ? ptx::cluster_ctarank() : 0u;
  const Work wk = work_of<kSplit>(p, rank);

  const int wg = threadIdx.x / kWarpgroup;
  const int warp = threadIdx.x / 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      ptx::mbarrier_init(full0 + 8 * s, 1);
      ptx::mbarrier_init(empty0 + 8 * s, 4 * kCons);
    }
    if (kSplit) {
      ptx::mbarrier_init(red_full, (p.split - 1) * kWarpgroup);
      // Register epilogue: every other rank reads this CTA's partial (splitk_reduce_spread);
      // staged epilogue: only the leader does (splitk_reduce).
      ptx::mbarrier_init(red_empty, (kRegEpi ? p.split - 1 : 1) * kWarpgroup);
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
  // PDL: everything above overlaps the predecessor's tail; every global read
  // and write is below.
  griddepcontrol_wait();

  if (wg == 0) {
    ptx::setmaxnreg_dec<C::kProducerRegs>();
    if (warp == 0 && ptx::elect_sync()) {
      produce<kBM, C::kStages>(p, wk, &tmap_x, &tmap_w, base + C::kAOff, base + C::kBOff, base + C::kSfaOff,
                               base + C::kSfbOff, full0, empty0);
    }
    griddepcontrol_launch_dependents();
  } else {
    ptx::setmaxnreg_inc<C::kConsumerRegs>();
    const int cw = wg - 1;  // consumer index: rows 64·cw .. of the tile
    const int t = threadIdx.x % kWarpgroup;
    const int l = t % 32;
    const int q = l % 4;                   // column pair 2q, 2q+1 of every 8
    const int r0 = 16 * (t / 32) + l / 4;  // fragment rows r0, r0 + 8 (in the warpgroup's 64)
    float* stg = reinterpret_cast<float*>(gbase + C::kStgOff) + cw * kRowsPerWg * kStageStride;
    // B scale words: column c = 8j + 2q + b of the head, 4 k-block bytes each,
    // at sf_chunk_word(c) = 32q + (8(j%4) + b)·16 + (j/4)·4 (2q + b < 8): one
    // lane base plus compile-time offsets.
    const int sfb_lane = 32 * q;

    PipeState<C::kStages> st;
    float acc[64];
    float partial[64];
    uint32_t red_phase = 0;
    for (int ti = wk.first; ti < p.num_tiles; ti += wk.step) {
      const Tile tl = tile_of(p, ti);
      const int sfa_off0 = sf_chunk_word(sf_chunk_row<kBM>(tl.mb, kRowsPerWg * cw + r0));
      const int sfa_off1 = sf_chunk_word(sf_chunk_row<kBM>(tl.mb, kRowsPerWg * cw + r0 + 8));
      // partial: every wgmma below ignores its input (scale_d = 0); zeroing it
      // here ends its live range over the previous tile's epilogue.
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[i] = partial[i] = 0.0f;

      for (int ks = wk.k0; ks < wk.k1; ++ks) {
        ptx::mbarrier_wait(full0 + 8 * st.idx, st.phase);
        const uint8_t* sfa = gbase + C::kSfaOff + st.idx * kSfChunk;
        const uint8_t* sfb = gbase + C::kSfbOff + st.idx * kSfChunk;
        const uint32_t sa0 = *reinterpret_cast<const uint32_t*>(sfa + sfa_off0);
        const uint32_t sa1 = *reinterpret_cast<const uint32_t*>(sfa + sfa_off1);
        uint32_t sb[kBN / 8][2];
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
          for (int b = 0; b < 2; ++b)
            sb[j][b] = *reinterpret_cast<const uint32_t*>(sfb + sfb_lane + (8 * (j % 4) + b) * 16 + (j / 4) * 4);

        const uint64_t da =
            wgmma::make_desc_kmajor_sw128(base + C::kAOff + st.idx * C::kABytes + cw * kRowsPerWg * kBK);
        const uint64_t db = wgmma::make_desc_kmajor_sw128(base + C::kBOff + st.idx * C::kBBytes);
#pragma unroll
        for (int kb = 0; kb < kBK / kMxBlock; ++kb) {
          fence_acc(partial);
          wgmma::fence_sync_aligned();
          wgmma::mma_async_m64n128k32_f32_e4m3_e4m3(partial, wgmma::desc_advance(da, kMxBlock * kb),
                                                    wgmma::desc_advance(db, kMxBlock * kb), 0u);
          wgmma::commit_group_sync_aligned();
          wgmma::wait_group_sync_aligned<0>();
          fence_acc(partial);
          if (kb == kBK / kMxBlock - 1) {
            // This warp is done with the stage (scale words in registers, the
            // last wgmma waited): hand it back before the last promotion.
            __syncwarp();
            if (l == 0) ptx::mbarrier_arrive(empty0 + 8 * st.idx);
          }
          const float fa0 = e8m0_to_f32_nobranch((sa0 >> (8 * kb)) & 0xffu);
          const float fa1 = e8m0_to_f32_nobranch((sa1 >> (8 * kb)) & 0xffu);
#pragma unroll
          for (int j = 0; j < kBN / 8; ++j) {
#pragma unroll
            for (int b = 0; b < 2; ++b) {
              const float fb = e8m0_to_f32_nobranch((sb[j][b] >> (8 * kb)) & 0xffu);
              acc[4 * j + b] = fma_rn(partial[4 * j + b], mul_rn(fa0, fb), acc[4 * j + b]);
              acc[4 * j + 2 + b] = fma_rn(partial[4 * j + 2 + b], mul_rn(fa1, fb), acc[4 * j + 2 + b]);
            }
          }
        }
        st.advance();
      }
      const int64_t row_base = static_cast<int64_t>(tl.mb) * kBM + kRowsPerWg * cw;
      finish_tile<kSplit, kRegEpi>(p, acc, tl, row_base, stg, 1 + cw, rank, reinterpret_cast<float*>(gbase + C::kStgOff),
                                   base + C::kStgOff, red_full, red_empty, &red_phase, ti == wk.first);
    }
  }
  splitk_exit_sync<kSplit>();
#endif
}

// The host entry points, through the shared family helpers of kernel_sm90.cuh.
struct Fp8PromoFamily {
  static constexpr const char* kName = "fused_fp8promo_kernel";
  template <int kCons, bool kRegEpi, bool kSplit>
  using Cfg = Fp8PromoCfg<kCons, kRegEpi, kSplit>;
  template <int kCons, bool kRegEpi, bool kSplit>
  static auto kernel() {
    return &fused_fp8promo_kernel<kCons, kRegEpi, kSplit>;
  }
};

}  // namespace

m3qkv_status launch_fp8promo(int cons, bool reg_epi, const CUtensorMap& tmap_x, const CUtensorMap& tmap_w,
                             const KernelParams& p, int grid, bool pdl, cudaStream_t stream) {
  return family_launch<Fp8PromoFamily>(cons, reg_epi, tmap_x, tmap_w, p, grid, pdl, stream);
}

cudaError_t prepare_fp8promo() { return family_prepare<Fp8PromoFamily>(); }

int max_clusters_fp8promo(bool reg_epi, int split) { return family_max_clusters<Fp8PromoFamily>(reg_epi, split); }

}  // namespace m3qkv::sm90
