// Pieces shared by the SM90 tile kernels (fused_bf16dq_sm90.cu: variant A and
// its pre-converted-activations instance; prefill_sm90.cu): kernel
// parameters, the persistent tile order, the TMA producers, the bf16
// mainloop, pipeline bookkeeping and the split-K reduction.
//
// Tile: BM = 64·kCons rows (kCons consumer warpgroups of 64 rows each) × one
// 128-column head; K is walked in TMA stages of BK = 128 (one 128-byte swizzle
// row of e4m3 per tile row, and exactly one 512-byte F8_128x4 scale chunk per
// 128 rows).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <utility>

#include "common/epilogue.cuh"
#include "common/layouts.h"
#include "common/numerics.h"
#include "common/ring.h"
#include "common/trace.cuh"
#include "host/launch.h"
#include "ptx/cluster.cuh"
#include "ptx/elect.cuh"
#include "ptx/fence.cuh"
#include "ptx/globaltimer.cuh"
#include "ptx/griddepcontrol.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/setmaxnreg.cuh"
#include "ptx/barrier.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"
#include "sm90/dequant_sm90.cuh"
#include "sm90/sm90.h"

namespace m3qkv::sm90 {

constexpr int kWarpgroup = 128;             // threads of one warpgroup
constexpr int kBN = kHeadDim;               // one head per tile: the epilogue needs whole head rows
constexpr int kBK = 128;                    // K per TMA stage (bytes of e4m3 per tile row)
constexpr int kSwizzleBytes = 128;          // CU_TENSOR_MAP_SWIZZLE_128B row
constexpr int kSwizzleAtom = 1024;          // 8 rows x 128 B
constexpr int kSfChunk = 512;               // F8_128x4: 128 rows x 4 scale columns (= BK) contiguous
constexpr int kRowsPerWg = 64;              // wgmma M
constexpr int kSmemLimit = 232448;          // sm_90 opt-in dynamic shared memory per block (227 KiB)
static_assert(kBK == kSwizzleBytes, "one swizzle row of e4m3 per tile row and stage");
static_assert(kBK == 4 * kMxBlock, "one F8_128x4 chunk (4 scale columns) per stage");

// Everything a kernel needs besides the two tensor maps.
struct KernelParams {
  int32_t m;           // tokens
  int32_t heads;       // N / 128
  int32_t m_blocks;    // ceil(M / BM)
  int32_t band_heads;  // grouped rasterization: heads per band
  int32_t k_stages;    // K / 128
  int32_t num_tiles;   // m_blocks · heads
  int32_t split;       // CTAs per tile = cluster size (split-K, kSplit kernels); 1 otherwise
  // The fp8 fast kernel's cluster (fast_sm90.cu): clu_m row blocks x clu_h
  // heads of adjacent tiles, 1 or 2 each; 1 x 1 elsewhere.
  int32_t clu_m = 1, clu_h = 1;
  const uint8_t* xsf;  // F8_128x4 [ceil(M/128)·128, K/32]
  const uint8_t* wsf;  // F8_128x4 [N, K/32]
  float* acc_tap;      // test only: f32 accumulator [M, N], or null
  int64_t n;           // N (tap row stride)
  epi::EpilogueParams epi;
  uint64_t* trace;     // test only: per-CTA event times [trace_ctas][kTraceEvents] (ns), or null
  int32_t trace_ctas;
  static constexpr int kTraceEvents = m3qkv::kTraceEvents;  // sm90.h; common/trace.cuh
  // The one-launch prefill paths (pre-A, prefill): what the grid converts
  // before its mainloop and the grid barrier's two words in the workspace's
  // zeroed head (host::kGridSyncOffset); conv_sync null elsewhere.
  DequantJob conv_x, conv_w;  // the one-launch paths' conversion (convert_sm90.cuh); rows = 0: nothing
  uint32_t* conv_sync = nullptr;
};

// Test-only timeline (common/trace.cuh): events and layout in sm90.h (TraceEvent, sm90_set_trace).

struct Tile {
  int mb;    // row block (BM rows)
  int head;  // projection head = 128-column block
};

// Grouped rasterization for L2: tiles run in bands of `band_heads` heads; in a
// band the head index is fastest, so the CTAs resident at one time share a
// few heads' weights and a few row blocks' activations.
__device__ __forceinline__ Tile tile_of(const KernelParams& p, int t) {
  const int band_tiles = p.band_heads * p.m_blocks;
  const int band = t / band_tiles;
  const int r = t - band * band_tiles;
  const int h0 = band * p.band_heads;
  const int bh = min(p.band_heads, p.heads - h0);
  Tile tl;
  tl.mb = r / bh;
  tl.head = h0 + (r - tl.mb * bh);
  return tl;
}

// What one CTA walks: tiles first, first + step, ... and K stages [k0, k1) of each.
// Without split-K: tiles blockIdx.x + i·gridDim.x, the whole K. With split-K
// (kSplit kernels, launched as 1-D clusters of p.split CTAs): the cluster takes
// tiles (blockIdx.x / split) + i·(gridDim.x / split), CTA rank r of the cluster
// the K stages [r·ks/split, (r+1)·ks/split) (the host keeps split <= ks, so no
// range is empty).
struct Work {
  int first, step, k0, k1;
};
template <bool kSplit>
__device__ __forceinline__ Work work_of(const KernelParams& p, uint32_t rank) {
  Work w;
  if constexpr (kSplit) {
    w.first = static_cast<int>(blockIdx.x) / p.split;
    w.step = static_cast<int>(gridDim.x) / p.split;
    w.k0 = static_cast<int>(rank) * p.k_stages / p.split;
    w.k1 = (static_cast<int>(rank) + 1) * p.k_stages / p.split;
  } else {
    w.first = static_cast<int>(blockIdx.x);
    w.step = static_cast<int>(gridDim.x);
    w.k0 = 0;
    w.k1 = p.k_stages;
  }
  return w;
}

// Row of the 512-byte F8_128x4 scale chunk a tile row reads: the chunk covers
// 128 rows; a 64-row tile (BM = 64) uses its half selected by the block parity
// (the row's 4 scale bytes: f8_128x4_chunk_word, common/layouts.h).
template <int kBM>
__device__ __forceinline__ int sf_chunk_row(int mb, int row_in_tile) {
  return kBM == 128 ? row_in_tile : 64 * (mb & 1) + row_in_tile;
}

// The TMA producer (one elected thread): per stage the A tile (BM x 128 B), the
// B tile (128 x 128 B) and the two 512-byte scale chunks, all completing on
// full[stage]; waits empty[stage] before reusing it. kWithA = false: the B
// tile and its scale chunk only (variant A with pre-converted activations,
// whose A tiles arrive in bf16 by their own producer: produce_a_bf16).
template <int kBM, int kStages, bool kWithA = true>
__device__ __forceinline__ void produce(const KernelParams& p, const Work& wk, const CUtensorMap* tmap_x,
                                        const CUtensorMap* tmap_w,
                                        uint32_t a0, uint32_t b0, uint32_t sfa0, uint32_t sfb0, uint32_t full0,
                                        uint32_t empty0) {
  constexpr uint32_t kABytes = kBM * kBK, kBBytes = kBN * kBK;
  constexpr uint32_t kTx = (kWithA ? kABytes + kSfChunk : 0u) + kBBytes + kSfChunk;
  Ring<kStages> st;
  for (int t = wk.first; t < p.num_tiles; t += wk.step) {
    const Tile tl = tile_of(p, t);
    const uint8_t* sfa = p.xsf + static_cast<int64_t>((tl.mb * kBM) / 128) * p.k_stages * kSfChunk;
    const uint8_t* sfb = p.wsf + static_cast<int64_t>(tl.head) * p.k_stages * kSfChunk;
    for (int ks = wk.k0; ks < wk.k1; ++ks) {
      const uint32_t full = full0 + 8 * st.idx;
      ptx::mbarrier_wait(empty0 + 8 * st.idx, st.phase ^ 1u);
      ptx::mbarrier_arrive_expect_tx(full, kTx);
      if constexpr (kWithA) {
        ptx::cp_async_bulk_tensor_2d(a0 + st.idx * kABytes, tmap_x, ks * kBK, tl.mb * kBM, full);
        ptx::cp_async_bulk_shared_global(sfa0 + st.idx * kSfChunk, sfa + static_cast<int64_t>(ks) * kSfChunk,
                                         kSfChunk, full);
      }
      ptx::cp_async_bulk_tensor_2d(b0 + st.idx * kBBytes, tmap_w, ks * kBK, tl.head * kBN, full);
      ptx::cp_async_bulk_shared_global(sfb0 + st.idx * kSfChunk, sfb + static_cast<int64_t>(ks) * kSfChunk, kSfChunk,
                                       full);
      st.advance();
    }
  }
}

// The TMA producer of the bf16-copy instances (one elected thread): bf16
// stage s (K 64s .. 64s + 63, s over 2·[k0, k1)) of tile (mb, head) gets the
// x̂ tile [kBM rows][64 bf16] at a0 + s·kBM·128 and, where `tmap_wbf` is not
// null (the prefill kernel), the ŵ tile [128 rows][64 bf16] at b0 + s·128·128,
// both with the 128-B swizzle, completing on full[s] with their bytes; it
// waits empty[s] before reusing a stage. Copies as bytes: column 128·s.
template <int kBM, int kStages>
__device__ __forceinline__ void produce_bf16(const KernelParams& p, const Work& wk, const CUtensorMap* tmap_xbf,
                                             const CUtensorMap* tmap_wbf, uint32_t a0, uint32_t b0, uint32_t full0,
                                             uint32_t empty0) {
  constexpr uint32_t kABytes = kBM * kSwizzleBytes, kBBytes = kBN * kSwizzleBytes;
  const uint32_t tx = kABytes + (tmap_wbf != nullptr ? kBBytes : 0u);
  Ring<kStages> st;
  for (int t = wk.first; t < p.num_tiles; t += wk.step) {
    const Tile tl = tile_of(p, t);
    for (int s = 2 * wk.k0; s < 2 * wk.k1; ++s) {
      const uint32_t full = full0 + 8 * st.idx;
      ptx::mbarrier_wait(empty0 + 8 * st.idx, st.phase ^ 1u);
      ptx::mbarrier_arrive_expect_tx(full, tx);
      ptx::cp_async_bulk_tensor_2d(a0 + st.idx * kABytes, tmap_xbf, s * kSwizzleBytes, tl.mb * kBM, full);
      if (tmap_wbf != nullptr)
        ptx::cp_async_bulk_tensor_2d(b0 + st.idx * kBBytes, tmap_wbf, s * kSwizzleBytes, tl.head * kBN, full);
      st.advance();
    }
  }
}
// Keeps the compiler from moving reads/writes of wgmma accumulator registers
// across the (asm volatile) fence / commit / wait.
__device__ __forceinline__ void fence_acc(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) wgmma::fence_operand(d[i]);
}

// One tile's mainloop of a consumer warpgroup over `n_bf` bf16 stages (BK 64:
// 4 x wgmma.m64n128k16 each), for every bf16-stage kernel (variant A and the
// prefill kernel): stage s's A operand at a0 + s·a_bytes (this warpgroup's 64
// rows), its B operand at b0 + s·b_bytes, both [rows][64 bf16] with the 128-B
// swizzle; full[s] says the stage is complete, one arrival per warp on
// empty[s] releases it once the wgmma that read it is done. One stage of
// wgmma stays in flight. The accumulator starts from zero (scale_d = 0 on the
// first k16), which also ends the previous tile's live range.
template <int kBfStages>
__device__ __forceinline__ void mainloop_bf16(float (&acc)[64], Ring<kBfStages>& bs, int n_bf, uint32_t a0,
                                              uint32_t a_bytes, uint32_t b0, uint32_t b_bytes, uint32_t full0,
                                              uint32_t empty0, const KernelParams& p, bool trace_first) {
  const int l = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
  uint32_t prev = 0;
  for (int s = 0; s < n_bf; ++s) {
    ptx::mbarrier_wait(full0 + 8 * bs.idx, bs.phase);
    if (trace_first && s == 0) trace_event(p, kTrConsFirstBf);
    const uint64_t da = wgmma::make_desc_kmajor_sw128(a0 + bs.idx * a_bytes);
    const uint64_t db = wgmma::make_desc_kmajor_sw128(b0 + bs.idx * b_bytes);
    fence_acc(acc);
    wgmma::fence_sync_aligned();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      // scale_d = 0 on the first k16 of the tile: D = A·B starts the sum.
      wgmma::mma_async_m64n128k16_f32_bf16_bf16(acc, wgmma::desc_advance(da, 32 * kk), wgmma::desc_advance(db, 32 * kk),
                                                (s | kk) != 0 ? 1u : 0u);
    }
    wgmma::commit_group_sync_aligned();
    // Keep one stage of wgmma in flight; the one before it has finished
    // reading its shared memory and is released.
    wgmma::wait_group_sync_aligned<1>();
    fence_acc(acc);
    if (s > 0) {
      __syncwarp();
      if (l == 0) ptx::mbarrier_arrive(empty0 + 8 * prev);
    }
    prev = bs.idx;
    bs.advance();
  }
  wgmma::wait_group_sync_aligned<0>();
  fence_acc(acc);
  __syncwarp();
  if (l == 0) ptx::mbarrier_arrive(empty0 + 8 * prev);
}

constexpr int kPartBytes = kRowsPerWg * kBN * 4;  // one warpgroup's partial block
// Split-K reduction spread over the cluster (variant A's split-K instance).
// Every CTA holds the partial sum of its K range in `acc`. The 64 x 128 block
// is 8 row groups g = 2w + h (warp w of the consumer warpgroup, fragment half
// h: rows 16w + 8h .. +7); CTA rank g % split finalizes group g: it adds the
// partials of ALL ranks for that group in the fixed order rank 0, 1, ...,
// split-1 (((p0 + p1) + p2) ...: deterministic) and runs the epilogue on those
// rows. Every warp owns at most one half (split >= 2), so each thread pulls
// and finalizes at most 32 values, and the epilogue runs on `split` CTAs at
// once (a single leader pulling every partial serialized the pulls and the
// epilogue on one warpgroup).
// Protocol: each rank stores its partial in its own `part` (after red_empty
// says every reader of the previous tile is done), arrives on every other
// rank's red_full (count (split-1)·128), waits its own red_full, pulls, then
// arrives on every other rank's red_empty (count (split-1)·128).
// Returns the mask of this warp's halves (bit h) that this CTA finalizes.
__device__ __forceinline__ uint32_t splitk_reduce_spread(const KernelParams& p, float (&acc)[64], uint32_t rank,
                                                         float* part, uint32_t part_s, uint32_t red_full,
                                                         uint32_t red_empty, uint32_t phase, bool first_tile) {
  const int t = threadIdx.x % kWarpgroup;
  const int w = t / 32;
  const uint32_t split = static_cast<uint32_t>(p.split);
  if (!first_tile) ptx::mbarrier_wait_cluster(red_empty, phase ^ 1u);  // previous tile's readers are done
#pragma unroll
  for (int i = 0; i < 64; ++i) part[i * kWarpgroup + t] = acc[i];
  for (uint32_t r = 0; r < split; ++r)
    if (r != rank) ptx::mbarrier_arrive_remote(ptx::mapa_shared_cluster(red_full, r));
  ptx::mbarrier_wait_cluster(red_full, phase);
  uint32_t hmask = 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (static_cast<uint32_t>(2 * w + h) % split != rank) continue;  // warp-uniform
    hmask |= 1u << h;
    // Fragment registers of half h: 4j + 2h + b. The sum is built in place in
    // acc; this rank's own partial is read back from its buffer like the
    // others' (it is overwritten in the registers by then), which keeps the
    // register count of the instance unchanged.
    for (uint32_t r = 0; r < split; ++r) {
      const uint32_t src = ptx::mapa_shared_cluster(part_s, r) + 4u * static_cast<uint32_t>(t);
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          const int i = 4 * j + 2 * h + b;
          const float x = ptx::ld_shared_cluster_f32(src + 4u * kWarpgroup * i);
          acc[i] = r == 0 ? x : acc[i] + x;
        }
    }
  }
  for (uint32_t r = 0; r < split; ++r)
    if (r != rank) ptx::mbarrier_arrive_remote(ptx::mapa_shared_cluster(red_empty, r));
  return hmask;
}

// Split-K exit: no CTA of the cluster leaves before every CTA is done with the
// others' shared memory. The red_empty handshake already orders the other
// ranks' DSMEM reads before a rank's exit, but a CTA's shared memory may be reused by
// a new CTA as soon as it exits, and the CUDA programming guide
// ("Distributed Shared Memory") makes a cluster barrier before exit the rule
// that guarantees it; compute-sanitizer racecheck checks exactly that rule.
// Every thread of every role reaches this point (no role returns early);
// __syncwarp first because the barrier is .aligned and roles diverge inside warps.
template <bool kSplit>
__device__ __forceinline__ void splitk_exit_sync() {
  if constexpr (kSplit) {
    __syncwarp();
    ptx::barrier_cluster_arrive();
    ptx::barrier_cluster_wait();
  }
}

// Host entry points of the kernel files (launch_sm90.cu calls them).
// Variant A: `cons` = consumer warpgroups (1: BM = 64, 2: BM = 128); p.split
// > 1 selects the split-K instance (cons must be 1; grid a multiple of p.split).
m3qkv_status launch_bf16dq(int cons, const CUtensorMap& tmap_x, const CUtensorMap& tmap_w, const KernelParams& p,
                           int grid, bool pdl, cudaStream_t stream);
cudaError_t prepare_bf16dq();  // cudaFuncSetAttribute (max dynamic smem) of every instance
// Variant A with pre-converted activations (the prefill instance: BM 128,
// register epilogue, no split-K), one cooperative launch: the grid first
// converts p.conv_x (x̂, bf16 [M][K] in the workspace) and meets at the grid
// barrier p.conv_sync (convert_sm90.cuh), then the GEMM reads x̂ through
// `tmap_xbf` (x̂ as bytes: inner 2K, box 128 x 128 rows, 128-B swizzle).
// `pdl` as `use_pdl` of the call.
// max_ctas: the co-resident CTAs (co_resident_pre_a, once per context; 0 =
// unknown): the grid is clamped to it, as the grid barrier needs every CTA resident.
m3qkv_status launch_bf16dq_pre_a(const CUtensorMap& tmap_xbf, const CUtensorMap& tmap_w, const KernelParams& p,
                                 int grid, bool pdl, unsigned max_ctas, cudaStream_t stream);
m3qkv_status co_resident_pre_a(const DeviceInfo& dev, unsigned* ctas);
// The prefill kernel (prefill_sm90.cu), one cooperative launch: the grid
// converts p.conv_x (rows M) and p.conv_w (rows N) into their bf16 copies,
// meets at the grid barrier, then the TMA-fed bf16 GEMM with the epilogue
// warpgroup reads them through tmap_xbf / tmap_wbf (bytes: inner 2K, boxes
// 128 B x 128 rows, 128-B swizzle). `pdl` as `use_pdl` of the call.
m3qkv_status launch_prefill(const CUtensorMap& tmap_xbf, const CUtensorMap& tmap_wbf, const KernelParams& p, int grid,
                            bool pdl, unsigned max_ctas, cudaStream_t stream);
m3qkv_status co_resident_prefill(const DeviceInfo& dev, unsigned* ctas);
cudaError_t prepare_prefill();
// The fp8 fast mode (fast_sm90.cu), two launches: fold_x folds f.xq / f.xsf
// into f.xq_out (x' [M][K]) and writes the group scales of x' and of the
// prepared weights (f.wsf) as f32 into f.sx / f.sw (fast_config.h layouts;
// all three in the stream workspace, sizes fast_workspace_bytes), then the
// GEMM (PDL on it) reads x' through `tmap_x` and the prepared weights through
// `tmap_w` (boxes 128 B x 128 rows, 128-B swizzle), with p.xsf = f.sx and
// p.wsf = f.sw as bytes. `pdl`: the call's use_pdl, for fold_x.
struct FastLaunch {
  const uint8_t* xq;
  const uint8_t* xsf;
  const uint8_t* wsf;
  uint8_t* xq_out;
  float* sx;
  float* sw;
};
// p.clu_m x p.clu_h CTAs per cluster (grid a multiple of that): tmap_x's box
// is 128 / clu_h rows, tmap_w's 128 / clu_m (each CTA loads its share of a
// tile shared by the cluster and multicasts it).
m3qkv_status launch_fast(const FastLaunch& f, const CUtensorMap& tmap_x, const CUtensorMap& tmap_w,
                         const KernelParams& p, int grid, bool pdl, int num_sms, cudaStream_t stream);
cudaError_t prepare_fast();
// cudaOccupancyMaxActiveClusters of the fast kernel with clusters of `ctas` CTAs (-1 on error).
int max_clusters_fast(int ctas);
// cudaOccupancyMaxActiveClusters of variant A's split-K instance with clusters of `split` CTAs (-1 on error).
int max_clusters_bf16dq(int split);

}  // namespace m3qkv::sm90
