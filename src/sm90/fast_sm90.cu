// SM90 fp8 fast mode (docs/sm90.md "fp8 fast mode", budgets in
// fast_config.h): two launches on the call's stream.
//
// fold_x: the activations folded per (row, 128-K group) exactly as the
// weights were (common/fold_fp8.h fold_group), into x' in the stream
// workspace, and both operands' group scales as f32 in the layouts a stage
// copies (fast_config.h: sx per tile row, sw per head column in the
// consumers' order; padding rows 1.0).
//
// The GEMM (programmatic dependent launch on fold_x): per 128-row x one-head
// tile and per 128-K stage, four fp8 wgmma m64n128k32 into a group
// accumulator t, then the promotion acc += (t · sx[row]) · sw[col] in f32
// (t · sx is exact: sx is a power of two), then the prefill kernel's
// hand-off to an epilogue warpgroup that runs the unchanged epilogue.
// Clusters of clu_m x clu_h CTAs take adjacent tiles (row blocks 2·MB + rm,
// heads 2·H + rh): the CTAs of one row block each load 1/clu_h of its x'
// tile and multicast it to each other, those of one head 1/clu_m of its w'
// tile, which cuts the bytes each SM pulls from L2 per stage. A CTA whose
// tile lies past M or the heads loads its shares and stores nothing.
//
// Warp roles:
//   warpgroup 0:         producer, one elected thread: per stage x', w'
//                        and their scale floats on full[s]       setmaxnreg.dec 40
//   warpgroups 1, 2:     consumers, 64 rows each: mma + promotion per stage,
//                        taking turns at the tensor pipe (kTurnBarrier0/1),
//                        then the block into hand-off buffer c   setmaxnreg.inc 152
//   warpgroup 3:         epilogue (prefill_sm90.cu)              setmaxnreg.inc 168
// Barriers: full[s] (1 arrival + the stage's bytes, its shares arriving from
// the peers' multicasts), empty[s] (one arrival per consumer warp of this CTA
// and of each peer that writes into it, after the scale floats were read),
// ho_full[c] / ho_empty[c] as in the prefill kernel. A cluster barrier after the barrier
// init (no peer multicasts into an uninitialized barrier) and one before
// exit (no peer arrives on a barrier of an exited CTA).
#include <algorithm>

#include "common/fold_fp8.h"
#include "sm90/epilogue_regs_sm90.cuh"
#include "sm90/fast_config.h"
#include "sm90/kernel_sm90.cuh"

namespace m3qkv::sm90 {
namespace {

namespace ff = fast;

struct FoldXParams {
  const uint8_t* xq;   // e4m3 [M, K]
  const uint8_t* xsf;  // F8_128x4 [ceil(M/128)·128, K/32]
  const uint8_t* wsf;  // the prepared weights' F8_128x4 [N, K/32]
  uint8_t* xq_out;     // x' e4m3 [M, K]
  float* sx;           // [m_blocks][K/128][kBM]
  float* sw;           // [heads][K/128][kSwBytes / 4]
  int64_t m, k, n;
};

// Position of head column c in a stage's sw floats (fast_config.h).
__host__ __device__ __forceinline__ int sw_slot(int c) {
  const int q = (c % 8) / 2, j = c / 8, b = c % 2;
  return q * ff::kSwQuadStride + 2 * j + b;
}

__global__ void __launch_bounds__(ff::kFoldThreads) fold_x_kernel(const FoldXParams p) {
#if defined(__CUDA_ARCH__) && M3QKV_HAS_WGMMA
  griddepcontrol_wait();  // xq, xsf: the caller's (a previous grid's output)
  const int64_t groups = p.k / fold::kGroupK;
  const int64_t x_items = f8_128x4_padded_rows(p.m) * groups;
  const int64_t items = x_items + p.n * groups;
  for (int64_t it = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; it < items;
       it += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (it >= x_items) {  // a weight row's group scale
      const int64_t r = (it - x_items) / groups, g = (it - x_items) % groups;
      const uint32_t w =
          *reinterpret_cast<const uint32_t*>(p.wsf + f8_128x4_offset(r, fold::kBlocksPerGroup * g, p.k / kMxBlock));
      p.sw[((r / kBN) * groups + g) * (ff::kSwBytes / 4) + sw_slot(static_cast<int>(r % kBN))] =
          e8m0_to_f32(fold::group_exponent(w, w >> 8, w >> 16, w >> 24));
      continue;
    }
    const int64_t r = it / groups;
    const int64_t g = it - r * groups;
    uint8_t big = 127;  // padding rows: scale 1.0 (their values are TMA zero fill)
    if (r < p.m) {
      const uint32_t sf =
          *reinterpret_cast<const uint32_t*>(p.xsf + f8_128x4_offset(r, fold::kBlocksPerGroup * g, p.k / kMxBlock));
      const uint4* src = reinterpret_cast<const uint4*>(p.xq + r * p.k + g * fold::kGroupK);
      uint32_t q[fold::kGroupK / 4];
#pragma unroll
      for (int v = 0; v < fold::kGroupK / 16; ++v) {
        const uint4 u = src[v];
        q[4 * v] = u.x, q[4 * v + 1] = u.y, q[4 * v + 2] = u.z, q[4 * v + 3] = u.w;
      }
      big = fold::fold_group(q, sf, q);
      uint4* dst = reinterpret_cast<uint4*>(p.xq_out + r * p.k + g * fold::kGroupK);
#pragma unroll
      for (int v = 0; v < fold::kGroupK / 16; ++v) dst[v] = make_uint4(q[4 * v], q[4 * v + 1], q[4 * v + 2], q[4 * v + 3]);
    }
    p.sx[((r / ff::kBM) * groups + g) * ff::kBM + r % ff::kBM] = e8m0_to_f32(big);
  }
  // After this thread's stores: the GEMM's CTAs launch once every fold CTA
  // is done with its part (its griddepcontrol.wait then waits for the whole grid).
  griddepcontrol_launch_dependents();
#endif
}

// This CTA's place in its cluster and the tile it takes of cluster tile t.
struct FastRole {
  int rm, rh;         // row-block and head index in the cluster
  int csize;          // clu_m · clu_h
  uint16_t mask_x;    // the CTAs sharing this CTA's x' tile (same rm)
  uint16_t mask_w;    // the CTAs sharing its w' tile (same rh)
  int peers;          // CTAs whose multicasts write into this one (besides itself)
};
__device__ __forceinline__ FastRole fast_role(const KernelParams& p) {
  FastRole r;
  r.csize = p.clu_m * p.clu_h;
  const int rank = static_cast<int>(blockIdx.x) % r.csize;  // 1-D clusters of consecutive CTAs
  r.rm = rank % p.clu_m;
  r.rh = rank / p.clu_m;
  r.mask_x = r.mask_w = 0;
  for (int i = 0; i < p.clu_h; ++i) r.mask_x |= static_cast<uint16_t>(1u << (i * p.clu_m + r.rm));
  for (int i = 0; i < p.clu_m; ++i) r.mask_w |= static_cast<uint16_t>(1u << (r.rh * p.clu_m + i));
  r.peers = (p.clu_h - 1) + (p.clu_m - 1);
  return r;
}
struct FastTile {
  Tile tl;
  bool valid;  // inside M's row blocks and the heads
};
// Cluster tile t: the banded order of tile_of over the grid of cluster tiles
// (ceil(m_blocks / clu_m) x ceil(heads / clu_h)), then this CTA's tile in it.
__device__ __forceinline__ FastTile fast_tile(const KernelParams& p, const FastRole& r, int t) {
  const int cmb = (p.m_blocks + p.clu_m - 1) / p.clu_m;
  const int chd = (p.heads + p.clu_h - 1) / p.clu_h;
  const int band_tiles = p.band_heads * cmb;
  const int band = t / band_tiles;
  const int rest = t - band * band_tiles;
  const int h0 = band * p.band_heads;
  const int bh = min(p.band_heads, chd - h0);
  const int cm = rest / bh;
  FastTile f;
  f.tl.mb = cm * p.clu_m + r.rm;
  f.tl.head = (h0 + (rest - cm * bh)) * p.clu_h + r.rh;
  f.valid = f.tl.mb < p.m_blocks && f.tl.head < p.heads;
  return f;
}
__device__ __forceinline__ int cluster_tiles(const KernelParams& p) {
  return ((p.m_blocks + p.clu_m - 1) / p.clu_m) * ((p.heads + p.clu_h - 1) / p.clu_h);
}
__device__ __forceinline__ void wait_stage(uint32_t bar, uint32_t parity, int csize) {
  if (csize > 1)
    ptx::mbarrier_wait_cluster(bar, parity);  // completed by the peers' multicasts / remote arrivals
  else
    ptx::mbarrier_wait(bar, parity);
}

// The producer (one elected thread): per stage this CTA's share of the x'
// tile (rows rh·128/clu_h ..) to mask_x and of the w' tile (rows rm·128/clu_m
// ..) to mask_w, at the same offsets in every destination, and its own scale
// floats; full[s] expects the whole stage. The scales of a tile past M or
// the heads are read from the last real one (their values are never used).
__device__ __forceinline__ void produce_fast(const KernelParams& p, const FastRole& r, const CUtensorMap* tmap_x,
                                             const CUtensorMap* tmap_w, uint32_t a0, uint32_t b0, uint32_t sx0,
                                             uint32_t sw0, uint32_t full0, uint32_t empty0) {
  constexpr uint32_t kTx = ff::kABytes + ff::kBBytes + ff::kSxBytes + ff::kSwBytes;
  const int xrows = ff::kBM / p.clu_h, wrows = kBN / p.clu_m;
  const uint32_t xoff = static_cast<uint32_t>(r.rh * xrows * kSwizzleBytes);
  const uint32_t woff = static_cast<uint32_t>(r.rm * wrows * kSwizzleBytes);
  const int step = static_cast<int>(gridDim.x) / r.csize;
  Ring<ff::kStages> st;
  for (int t = static_cast<int>(blockIdx.x) / r.csize; t < cluster_tiles(p); t += step) {
    const FastTile ft = fast_tile(p, r, t);
    const uint8_t* sx = p.xsf + static_cast<int64_t>(min(ft.tl.mb, p.m_blocks - 1)) * p.k_stages * ff::kSxBytes;
    const uint8_t* sw = p.wsf + static_cast<int64_t>(min(ft.tl.head, p.heads - 1)) * p.k_stages * ff::kSwBytes;
    const int xrow = ft.tl.mb * ff::kBM + r.rh * xrows, wrow = ft.tl.head * kBN + r.rm * wrows;
    for (int ks = 0; ks < p.k_stages; ++ks) {
      const uint32_t full = full0 + 8 * st.idx;
      wait_stage(empty0 + 8 * st.idx, st.phase ^ 1u, r.csize);
      ptx::mbarrier_arrive_expect_tx(full, kTx);
      const uint32_t a = a0 + st.idx * ff::kABytes + xoff, b = b0 + st.idx * ff::kBBytes + woff;
      if (p.clu_h > 1)
        ptx::cp_async_bulk_tensor_2d_multicast(a, tmap_x, ks * kBK, xrow, full, r.mask_x);
      else
        ptx::cp_async_bulk_tensor_2d(a, tmap_x, ks * kBK, xrow, full);
      if (p.clu_m > 1)
        ptx::cp_async_bulk_tensor_2d_multicast(b, tmap_w, ks * kBK, wrow, full, r.mask_w);
      else
        ptx::cp_async_bulk_tensor_2d(b, tmap_w, ks * kBK, wrow, full);
      ptx::cp_async_bulk_shared_global(sx0 + st.idx * ff::kSxBytes, sx + static_cast<int64_t>(ks) * ff::kSxBytes,
                                       ff::kSxBytes, full);
      ptx::cp_async_bulk_shared_global(sw0 + st.idx * ff::kSwBytes, sw + static_cast<int64_t>(ks) * ff::kSwBytes,
                                       ff::kSwBytes, full);
      st.advance();
    }
  }
}

// One tile's mainloop of a consumer warpgroup: per stage the group product t
// (four fp8 wgmma m64n128k32, t = 0 at the group's first), then acc += (t ·
// sx) · sw per element, in fragment order (ptx/wgmma.cuh: register 4j + 2h
// + b is row 16w + l/4 + 8h, column 8j + 2(l%4) + b). The stage is released
// once the wgmma finished and the scale floats were read, here and in every
// peer that multicasts into this CTA (they reuse the stage for all of us).
// Turns: warpgroup 0 issues stage s after warpgroup 1 issued s - 1 (bar.sync
// kTurnBarrier0, which warpgroup 1's bar.arrive completes), warpgroup 1
// issues s after warpgroup 0 issued s, so the tensor pipe runs one
// warpgroup's wgmma while the other promotes (woken by one full barrier,
// both would otherwise multiply, then both promote). `turns` counts this
// warpgroup's issued stages over the kernel.
__device__ __forceinline__ void mainloop_fast(float (&acc)[64], Ring<ff::kStages>& bs, int cw, const FastRole& r,
                                              uint32_t a0, uint32_t b0, const float* sx0, const float* sw0,
                                              uint32_t full0, uint32_t empty0, const KernelParams& p,
                                              bool trace_first, uint32_t& turns) {
  const int t = threadIdx.x % kWarpgroup;
  const int l = t % 32;
  const int r0 = kRowsPerWg * cw + 16 * (t / 32) + l / 4;
  const int q = l % 4;
  // The peers' empty barriers (ranks of the other CTA of this row block / head).
  const uint32_t rank = static_cast<uint32_t>(r.rh * p.clu_m + r.rm);
  const uint32_t peer_x = rank ^ static_cast<uint32_t>(p.clu_m);  // other rh, same rm (clu_h = 2)
  const uint32_t peer_w = rank ^ 1u;                               // other rm, same rh (clu_m = 2)
  float g[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
  for (int s = 0; s < p.k_stages; ++s) {
    wait_stage(full0 + 8 * bs.idx, bs.phase, r.csize);
    if (trace_first && s == 0) trace_event(p, kTrConsFirstBf);
    const uint64_t da = wgmma::make_desc_kmajor_sw128(a0 + bs.idx * ff::kABytes + cw * kRowsPerWg * kSwizzleBytes);
    const uint64_t db = wgmma::make_desc_kmajor_sw128(b0 + bs.idx * ff::kBBytes);
    if (cw == 1 || turns != 0) ptx::bar_sync(cw == 0 ? ff::kTurnBarrier0 : ff::kTurnBarrier1, ff::kTurnThreads);
    fence_acc(g);
    wgmma::fence_sync_aligned();
#pragma unroll
    for (int kk = 0; kk < ff::kMmasPerStage; ++kk)
      wgmma::mma_async_m64n128k32_f32_e4m3_e4m3(g, wgmma::desc_advance(da, ff::kMmaK * kk),
                                                wgmma::desc_advance(db, ff::kMmaK * kk), kk != 0 ? 1u : 0u);
    wgmma::commit_group_sync_aligned();
    ptx::bar_arrive(cw == 0 ? ff::kTurnBarrier1 : ff::kTurnBarrier0, ff::kTurnThreads);
    ++turns;
    const float* sx = sx0 + bs.idx * (ff::kSxBytes / 4);
    const float4* sw = reinterpret_cast<const float4*>(sw0 + bs.idx * (ff::kSwBytes / 4) + q * ff::kSwQuadStride);
    const float sxa = sx[r0], sxb = sx[r0 + 8];
    wgmma::wait_group_sync_aligned<0>();
    fence_acc(g);
    // Eight 16-B loads of this quad's 32 column scales (columns 8j + 2q, +1
    // for j = 2i, 2i + 1), in two halves that keep the register count.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float4 w4[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) w4[i] = sw[4 * half + i];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int j0 = 2 * (4 * half + i);
        const float w[4] = {w4[i].x, w4[i].y, w4[i].z, w4[i].w};
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          const int j = j0 + jj;
          acc[4 * j + 0] = fmaf(g[4 * j + 0] * sxa, w[2 * jj], acc[4 * j + 0]);
          acc[4 * j + 1] = fmaf(g[4 * j + 1] * sxa, w[2 * jj + 1], acc[4 * j + 1]);
          acc[4 * j + 2] = fmaf(g[4 * j + 2] * sxb, w[2 * jj], acc[4 * j + 2]);
          acc[4 * j + 3] = fmaf(g[4 * j + 3] * sxb, w[2 * jj + 1], acc[4 * j + 3]);
        }
      }
    }
    __syncwarp();
    if (l == 0) {
      const uint32_t e = empty0 + 8 * bs.idx;
      ptx::mbarrier_arrive(e);
      if (p.clu_h > 1) ptx::mbarrier_arrive_remote_cta(ptx::mapa_shared_cluster(e, peer_x));
      if (p.clu_m > 1) ptx::mbarrier_arrive_remote_cta(ptx::mapa_shared_cluster(e, peer_w));
    }
    bs.advance();
  }
}

__device__ __forceinline__ void cluster_sync_all() {
  __syncwarp();  // barrier.cluster is .aligned: whole warps
  ptx::barrier_cluster_arrive();
  ptx::barrier_cluster_wait();
}

__global__ void __launch_bounds__(ff::kThreads, 1)
    fused_fast_kernel(const __grid_constant__ CUtensorMap tmap_x, const __grid_constant__ CUtensorMap tmap_w,
                      const __grid_constant__ KernelParams p) {
#if defined(__CUDA_ARCH__) && M3QKV_HAS_WGMMA
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = ptx::smem_u32(smem_raw);
  const uint32_t base = (raw + kSwizzleAtom - 1) & ~static_cast<uint32_t>(kSwizzleAtom - 1);
  uint8_t* gbase = smem_raw + (base - raw);
  const uint32_t full0 = base + ff::kBarOff;
  const uint32_t empty0 = full0 + 8 * ff::kStages;
  const uint32_t ho_full0 = empty0 + 8 * ff::kStages;
  const uint32_t ho_empty0 = ho_full0 + 8 * ff::kCons;
  float* handoff = reinterpret_cast<float*>(gbase + ff::kHandoffOff);
  const float* sx0 = reinterpret_cast<const float*>(gbase + ff::kSxOff);
  const float* sw0 = reinterpret_cast<const float*>(gbase + ff::kSwOff);
  const FastRole role = fast_role(p);
  const int step = static_cast<int>(gridDim.x) / role.csize;
  const int first = static_cast<int>(blockIdx.x) / role.csize;

  const int wg = threadIdx.x / kWarpgroup;
  const int warp = threadIdx.x / 32;
  if (threadIdx.x == 0) {
    trace_event(p, kTrEntry);
    for (int s = 0; s < ff::kStages; ++s) {
      ptx::mbarrier_init(full0 + 8 * s, 1);
      ptx::mbarrier_init(empty0 + 8 * s, 4 * ff::kCons * (1 + role.peers));
    }
    for (int c = 0; c < ff::kCons; ++c) {
      ptx::mbarrier_init(ho_full0 + 8 * c, kWarpgroup);
      ptx::mbarrier_init(ho_empty0 + 8 * c, kWarpgroup);
    }
    ptx::fence_mbarrier_init_release_cluster();
  }
  if (threadIdx.x == 32) {
    ptx::prefetch_tensormap(&tmap_x);
    ptx::prefetch_tensormap(&tmap_w);
  }
  cluster_sync_all();  // every CTA's barriers initialized before any multicast or remote arrival
  griddepcontrol_wait();  // x' (fold_x) and, through it, the caller's inputs
  if (threadIdx.x == 0) trace_event(p, kTrPdlWaitDone);

  if (wg == 0) {
    ptx::setmaxnreg_dec<ff::kProducerRegs>();
    if (warp == 0 && ptx::elect_sync()) {
      trace_event(p, kTrProducerStart);
      produce_fast(p, role, &tmap_x, &tmap_w, base + ff::kAOff, base + ff::kBOff, base + ff::kSxOff,
                   base + ff::kSwOff, full0, empty0);
    }
    griddepcontrol_launch_dependents();
  } else if (wg <= ff::kCons) {
    ptx::setmaxnreg_inc<ff::kConsumerRegs>();
    const int cw = wg - 1;
    const bool cons_t0 = threadIdx.x == kWarpgroup;
    Ring<ff::kStages> bs;
    float acc[64];
    uint32_t ho_phase = 0, turns = 0;
    for (int t = first; t < cluster_tiles(p); t += step) {
      mainloop_fast(acc, bs, cw, role, base + ff::kAOff, base + ff::kBOff, sx0, sw0, full0, empty0, p,
                    cons_t0 && t == first, turns);
      if (cons_t0) trace_event(p, kTrConsMainDone);
      ptx::mbarrier_wait(ho_empty0 + 8 * cw, ho_phase ^ 1u);  // parity 1 first: a fresh barrier's previous phase
      handoff_store(handoff + cw * 64 * kWarpgroup, acc);
      ptx::mbarrier_arrive(ho_full0 + 8 * cw);
      ho_phase ^= 1u;
    }
    // Warpgroup 1's last bar.arrive on kTurnBarrier0 has no later turn of
    // warpgroup 0 to meet it: meet it here, so the barrier ends empty.
    if (cw == 0 && turns != 0) ptx::bar_sync(ff::kTurnBarrier0, ff::kTurnThreads);
  } else {
    ptx::setmaxnreg_inc<ff::kEpilogueRegs>();
    const bool epi_t0 = threadIdx.x == (1 + ff::kCons) * kWarpgroup;
    BlockOwners& owners = *reinterpret_cast<BlockOwners*>(gbase + ff::kOwnersOff);
    uint32_t ho_phase = 0;
    for (int t = first; t < cluster_tiles(p); t += step) {
      const FastTile ft = fast_tile(p, role, t);
#pragma unroll 1
      for (int c = 0; c < ff::kCons; ++c) {
        const int64_t row_base = static_cast<int64_t>(ft.tl.mb) * ff::kBM + kRowsPerWg * c;
        if (ft.valid) block_owners(owners, p, ft.tl, row_base, ff::kOwnersBarrier);  // overlaps the mainloop
        ptx::mbarrier_wait(ho_full0 + 8 * c, ho_phase);
        if (ft.valid) epilogue_block_handoff(p, owners.view(), handoff + c * 64 * kWarpgroup, ft.tl, row_base);
        ptx::mbarrier_arrive(ho_empty0 + 8 * c);
      }
      ho_phase ^= 1u;
    }
    if (epi_t0) trace_event(p, kTrConsEpiDone);
  }
  cluster_sync_all();  // no peer still arrives on (or multicasts into) this CTA
  if (threadIdx.x == 0) trace_event(p, kTrExit);
#endif
}

}  // namespace

cudaError_t prepare_fast() {
  return cudaFuncSetAttribute(fused_fast_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, ff::kSmemBytes);
}

int max_clusters_fast(int ctas) {
  return host::max_active_clusters(fused_fast_kernel, ff::kThreads, ff::kSmemBytes, static_cast<unsigned>(ctas));
}

m3qkv_status launch_fast(const FastLaunch& f, const CUtensorMap& tmap_x, const CUtensorMap& tmap_w,
                         const KernelParams& p, int grid, bool pdl, int num_sms, cudaStream_t stream) {
  FoldXParams fp;
  fp.xq = f.xq;
  fp.xsf = f.xsf;
  fp.wsf = f.wsf;
  fp.xq_out = f.xq_out;
  fp.sx = f.sx;
  fp.sw = f.sw;
  fp.m = p.m;
  fp.k = static_cast<int64_t>(p.k_stages) * kBK;
  fp.n = static_cast<int64_t>(p.heads) * kBN;
  const int64_t items = (f8_128x4_padded_rows(fp.m) + fp.n) * (fp.k / fold::kGroupK);
  host::LaunchShape fs;
  fs.grid = static_cast<unsigned>(
      std::min<int64_t>((items + ff::kFoldThreads - 1) / ff::kFoldThreads, int64_t{ff::kFoldCtasPerSm} * num_sms));
  fs.threads = ff::kFoldThreads;
  fs.pdl = pdl;
  M3QKV_TRY(host::launch("m3qkv_fused_qkv", "fold_x_kernel", fold_x_kernel, fs, stream, fp));
  host::LaunchShape s;
  s.grid = static_cast<unsigned>(grid);
  s.threads = ff::kThreads;
  s.smem = ff::kSmemBytes;
  s.pdl = true;  // on fold_x, our own launch: its trigger comes after its stores
  s.cluster = p.clu_m * p.clu_h > 1 ? static_cast<unsigned>(p.clu_m * p.clu_h) : 0u;
  return host::launch("m3qkv_fused_qkv", "fused_fast_kernel", fused_fast_kernel, s, stream, tmap_x, tmap_w, p);
}

}  // namespace m3qkv::sm90
