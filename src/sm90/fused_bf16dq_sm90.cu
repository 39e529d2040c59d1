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
// Warp roles (512 threads for BM = 128, 384 for BM = 64):
//   warpgroup 0: TMA producer (one elected thread)       setmaxnreg.dec 40
//   warpgroup 1: transform, raw e4m3 stage -> 2 bf16 stages (BK 64 each)
//                                                         setmaxnreg.dec 96
//   warpgroup 2..1+kCons: consumers, 64 rows each         setmaxnreg.inc 184 (BM 128) / 232 (BM 64)
// Barriers: raw_full[s] (1 arrival + tx), raw_empty[s] (128 transform threads),
//           bf_full[s] (128 transform threads), bf_empty[s] (one arrival per consumer warp).
// Layouts: raw tiles are TMA 128-B swizzled (row r, 16-B chunk c at r·128 +
// ((c ^ r%8)·16)); bf16 tiles are [rows][64 bf16] with the same 128-B swizzle,
// the K-major layout wgmma's descriptor describes (ptx/wgmma.cuh).
#include "sm90/dequant_sm90.cuh"
#include "sm90/epilogue_regs_sm90.cuh"
#include "sm90/kernel_sm90.cuh"

namespace m3qkv::sm90 {
namespace {

constexpr int kBKbf = 64;  // bf16 stage K: one 128-byte swizzle row of bf16 per tile row

template <int kCons, bool kRegEpi>
struct Bf16DqCfg {
  static constexpr int kBM = kRowsPerWg * kCons;
  static constexpr int kThreads = kWarpgroup * (2 + kCons);
  // raw (TMA) stages
  static constexpr int kABytes = kBM * kBK;
  static constexpr int kBBytes = kBN * kBK;
  static constexpr int kRawStageBytes = kABytes + kBBytes + 2 * kSfChunk;
  // bf16 stages
  static constexpr int kAbfBytes = kBM * kBKbf * 2;
  static constexpr int kBbfBytes = kBN * kBKbf * 2;
  static constexpr int kBfStageBytes = kAbfBytes + kBbfBytes;
  static constexpr int kStagingBytes = kRegEpi ? 0 : kCons * kRowsPerWg * kStageStride * 4;
  static constexpr int kReserve = kSwizzleAtom + 256;
  // Picked to fill the budget (static_assert below); the staged epilogue's
  // [64][129] f32 buffers cost about one raw + one bf16 stage per consumer.
  //                     staged          register epilogue
  //   BM 128 (kCons 2)  raw 2, bf16 2   raw 3, bf16 3
  //   BM 64  (kCons 1)  raw 3, bf16 4   raw 4, bf16 5
  static constexpr int kRawStages = kCons == 2 ? (kRegEpi ? 3 : 2) : (kRegEpi ? 4 : 3);
  static constexpr int kBfStages = kCons == 2 ? (kRegEpi ? 3 : 2) : (kRegEpi ? 5 : 4);
  static constexpr int kAOff = 0;
  static constexpr int kBOff = kAOff + kRawStages * kABytes;
  static constexpr int kAbfOff = kBOff + kRawStages * kBBytes;
  static constexpr int kBbfOff = kAbfOff + kBfStages * kAbfBytes;
  static constexpr int kSfaOff = kBbfOff + kBfStages * kBbfBytes;
  static constexpr int kSfbOff = kSfaOff + kRawStages * kSfChunk;
  static constexpr int kStgOff = kSfbOff + kRawStages * kSfChunk;
  static constexpr int kBarOff = kStgOff + kStagingBytes;
  static constexpr int kSmemBytes = kBarOff + 8 * (2 * kRawStages + 2 * kBfStages) + kSwizzleAtom;
  static constexpr int kLaunchBound = kThreads;
  static constexpr int kProducerRegs = 40;
  static constexpr int kTransformRegs = 96;
  static constexpr int kConsumerRegs = kCons == 2 ? 184 : 232;

  static_assert(kRawStages * kRawStageBytes + kBfStages * kBfStageBytes + kStagingBytes + kReserve <= kSmemLimit,
                "shared memory budget");
  static_assert(kSmemBytes <= kSmemLimit, "shared memory budget");
  static_assert(kABytes % kSwizzleAtom == 0 && kAbfBytes % kSwizzleAtom == 0 && kBbfBytes % kSwizzleAtom == 0,
                "tiles 1024-B aligned");
  static_assert(kBKbf * 2 == kSwizzleBytes, "one swizzle row of bf16 per tile row and bf16 stage");
  static_assert(kBK == 2 * kBKbf, "a raw stage is two bf16 stages");
  static_assert(kProducerRegs + kTransformRegs + kCons * kConsumerRegs <= (65536 / kLaunchBound) * (2 + kCons),
                "setmaxnreg: the register pool allocated at launch must cover the increased warpgroups");
};

// Converts row `r` (16-B chunks 4h..4h+3 of the raw stage = K 64h..64h+63) of
// one operand tile into the bf16 stage. `sf` = the row's 4 scale bytes.
__device__ __forceinline__ void convert_row_half(const uint8_t* raw_tile, uint8_t* bf_tile, int r, int h, uint32_t sf) {
  const int sw = r % 8;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int c = 4 * h + i;  // raw chunk: K 16c .. 16c+15, MX block c/2
    const uint4 in = *reinterpret_cast<const uint4*>(raw_tile + r * kSwizzleBytes + ((c ^ sw) << 4));
    uint4 lo, hi;
    dequant16_e4m3_to_bf16(in, (sf >> (8 * (c / 2))) & 0xffu, &lo, &hi);
    *reinterpret_cast<uint4*>(bf_tile + r * kSwizzleBytes + (((2 * i) ^ sw) << 4)) = lo;
    *reinterpret_cast<uint4*>(bf_tile + r * kSwizzleBytes + (((2 * i + 1) ^ sw) << 4)) = hi;
  }
}

template <int kCons, bool kRegEpi>
__global__ void __launch_bounds__(Bf16DqCfg<kCons, kRegEpi>::kLaunchBound, 1)
    fused_bf16dq_kernel(const __grid_constant__ CUtensorMap tmap_x, const __grid_constant__ CUtensorMap tmap_w,
                        const __grid_constant__ KernelParams p) {
#if defined(__CUDA_ARCH__) && M3QKV_HAS_WGMMA
  using C = Bf16DqCfg<kCons, kRegEpi>;
  constexpr int kBM = C::kBM;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = ptx::smem_u32(smem_raw);
  const uint32_t base = (raw + kSwizzleAtom - 1) & ~static_cast<uint32_t>(kSwizzleAtom - 1);
  uint8_t* gbase = smem_raw + (base - raw);
  const uint32_t raw_full0 = base + C::kBarOff;
  const uint32_t raw_empty0 = raw_full0 + 8 * C::kRawStages;
  const uint32_t bf_full0 = raw_empty0 + 8 * C::kRawStages;
  const uint32_t bf_empty0 = bf_full0 + 8 * C::kBfStages;

  const int wg = threadIdx.x / kWarpgroup;
  const int warp = threadIdx.x / 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kRawStages; ++s) {
      ptx::mbarrier_init(raw_full0 + 8 * s, 1);
      ptx::mbarrier_init(raw_empty0 + 8 * s, kWarpgroup);
    }
    for (int s = 0; s < C::kBfStages; ++s) {
      ptx::mbarrier_init(bf_full0 + 8 * s, kWarpgroup);
      ptx::mbarrier_init(bf_empty0 + 8 * s, 4 * kCons);
    }
    ptx::fence_mbarrier_init_release_cluster();
  }
  if (threadIdx.x == 32) {
    ptx::prefetch_tensormap(&tmap_x);
    ptx::prefetch_tensormap(&tmap_w);
  }
  __syncthreads();
  griddepcontrol_wait();

  if (wg == 0) {
    ptx::setmaxnreg_dec<C::kProducerRegs>();
    if (warp == 0 && ptx::elect_sync()) {
      produce<kBM, C::kRawStages>(p, &tmap_x, &tmap_w, base + C::kAOff, base + C::kBOff, base + C::kSfaOff,
                                  base + C::kSfbOff, raw_full0, raw_empty0);
    }
    griddepcontrol_launch_dependents();
  } else if (wg == 1) {
    ptx::setmaxnreg_dec<C::kTransformRegs>();
    // Thread r converts row r of the B tile and, when r < BM, row r of the A tile.
    const int r = threadIdx.x - kWarpgroup;
    PipeState<C::kRawStages> rs;
    PipeState<C::kBfStages> bs;
    for (int ti = blockIdx.x; ti < p.num_tiles; ti += gridDim.x) {
      const Tile tl = tile_of(p, ti);
      const int sfa_off = sf_chunk_word(sf_chunk_row<kBM>(tl.mb, r < kBM ? r : 0));
      const int sfb_off = sf_chunk_word(r);
      for (int ks = 0; ks < p.k_stages; ++ks) {
        ptx::mbarrier_wait(raw_full0 + 8 * rs.idx, rs.phase);
        const uint8_t* a_raw = gbase + C::kAOff + rs.idx * C::kABytes;
        const uint8_t* b_raw = gbase + C::kBOff + rs.idx * C::kBBytes;
        const uint32_t sfa = *reinterpret_cast<const uint32_t*>(gbase + C::kSfaOff + rs.idx * kSfChunk + sfa_off);
        const uint32_t sfb = *reinterpret_cast<const uint32_t*>(gbase + C::kSfbOff + rs.idx * kSfChunk + sfb_off);
#pragma unroll
        for (int h = 0; h < kBK / kBKbf; ++h) {
          ptx::mbarrier_wait(bf_empty0 + 8 * bs.idx, bs.phase ^ 1u);
          uint8_t* a_bf = gbase + C::kAbfOff + bs.idx * C::kAbfBytes;
          uint8_t* b_bf = gbase + C::kBbfOff + bs.idx * C::kBbfBytes;
          if (r < kBM) convert_row_half(a_raw, a_bf, r, h, sfa);
          convert_row_half(b_raw, b_bf, r, h, sfb);
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
  } else {
    ptx::setmaxnreg_inc<C::kConsumerRegs>();
    const int cw = wg - 2;
    const int l = threadIdx.x % 32;
    float* stg = reinterpret_cast<float*>(gbase + C::kStgOff) + cw * kRowsPerWg * kStageStride;
    PipeState<C::kBfStages> bs;
    float acc[64];
    for (int ti = blockIdx.x; ti < p.num_tiles; ti += gridDim.x) {
      const Tile tl = tile_of(p, ti);
      // The first wgmma ignores D (scale_d = 0); zeroing ends the live range of
      // the previous tile's values, so the epilogue does not hold 64 extra registers.
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
      const int n_bf = p.k_stages * (kBK / kBKbf);
      uint32_t prev = 0;
      for (int s = 0; s < n_bf; ++s) {
        ptx::mbarrier_wait(bf_full0 + 8 * bs.idx, bs.phase);
        const uint64_t da =
            wgmma::make_desc_kmajor_sw128(base + C::kAbfOff + bs.idx * C::kAbfBytes + cw * kRowsPerWg * kSwizzleBytes);
        const uint64_t db = wgmma::make_desc_kmajor_sw128(base + C::kBbfOff + bs.idx * C::kBbfBytes);
        fence_acc(acc);
        wgmma::fence_sync_aligned();
#pragma unroll
        for (int kk = 0; kk < kBKbf / 16; ++kk) {
          // scale_d = 0 on the first k16 of the tile: D = A·B starts the sum.
          wgmma::mma_async_m64n128k16_f32_bf16_bf16(acc, wgmma::desc_advance(da, 32 * kk),
                                                    wgmma::desc_advance(db, 32 * kk), (s | kk) != 0 ? 1u : 0u);
        }
        wgmma::commit_group_sync_aligned();
        // Keep one stage of wgmma in flight; the one before it has finished
        // reading its shared memory and is released.
        wgmma::wait_group_sync_aligned<1>();
        fence_acc(acc);
        if (s > 0) {
          __syncwarp();
          if (l == 0) ptx::mbarrier_arrive(bf_empty0 + 8 * prev);
        }
        prev = bs.idx;
        bs.advance();
      }
      wgmma::wait_group_sync_aligned<0>();
      fence_acc(acc);
      __syncwarp();
      if (l == 0) ptx::mbarrier_arrive(bf_empty0 + 8 * prev);
      const int64_t row_base = static_cast<int64_t>(tl.mb) * kBM + kRowsPerWg * cw;
      if constexpr (kRegEpi)
        epilogue_block_regs(p, acc, tl, row_base);
      else
        epilogue_block(p, acc, tl, row_base, stg, 1 + cw);
    }
  }
#endif
}

template <int kCons, bool kRegEpi>
cudaError_t launch_one(const CUtensorMap& tx, const CUtensorMap& tw, const KernelParams& p, int grid, bool pdl,
                       cudaStream_t stream) {
  using C = Bf16DqCfg<kCons, kRegEpi>;
  const LaunchShape s{grid, C::kThreads, C::kSmemBytes, pdl};
  return launch_kernel(fused_bf16dq_kernel<kCons, kRegEpi>, s, stream, tx, tw, p);
}

template <int kCons, bool kRegEpi>
cudaError_t set_smem() {
  return cudaFuncSetAttribute(fused_bf16dq_kernel<kCons, kRegEpi>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              Bf16DqCfg<kCons, kRegEpi>::kSmemBytes);
}

}  // namespace

cudaError_t launch_bf16dq(int cons, bool reg_epi, const CUtensorMap& tmap_x, const CUtensorMap& tmap_w,
                          const KernelParams& p, int grid, bool pdl, cudaStream_t stream) {
  if (reg_epi)
    return cons == 1 ? launch_one<1, true>(tmap_x, tmap_w, p, grid, pdl, stream)
                     : launch_one<2, true>(tmap_x, tmap_w, p, grid, pdl, stream);
  return cons == 1 ? launch_one<1, false>(tmap_x, tmap_w, p, grid, pdl, stream)
                   : launch_one<2, false>(tmap_x, tmap_w, p, grid, pdl, stream);
}

cudaError_t prepare_bf16dq() {
  cudaError_t e = set_smem<1, false>();
  if (e == cudaSuccess) e = set_smem<2, false>();
  if (e == cudaSuccess) e = set_smem<1, true>();
  if (e == cudaSuccess) e = set_smem<2, true>();
  return e;
}

}  // namespace m3qkv::sm90
