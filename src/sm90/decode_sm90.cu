// SM90 swap-AB kernel, the one SM90 mainloop for every M: the weights are the
// wgmma M side (one 128-row head per unit), the tokens the N side (a token
// block of 16..128), K is split across a persistent grid where the (head,
// token block) pairs do not fill the SMs, and the f32 partials meet through a
// workspace in L2 (src/common/splitk_reduce.cuh). docs/sm90.md has the design.
//
//   warps 0-7  consumers: two warpgroups, rows 0-63 / 64-127 of the head. Per
//              64-K step each thread loads its 2 weight rows' byte pairs from
//              the 128B-swizzled weight tile and dequantizes them straight
//              into one of two A-fragment sets (e4m3 · 2^e is exact in bf16),
//              then 4 × wgmma m64nNTk16 (A from registers, B = the bf16
//              activation tile). At the end of a unit: partial -> workspace,
//              arrival count, and in the last arriving unit the fixed-order sum
//              and the epilogue.
//   warp 8     TMA producer (one elected lane): per 128-K stage the head's
//              weight tile, the token block's activations (e4m3 + scale chunk,
//              or two bf16 boxes) and the weight scale chunk, through a ring of
//              kStages.
//   warps 9-11 transform (e4m3 activations): a stage's raw activations x
//              2^(scale - 127) -> the bf16 B tile of a B slot. bf16 activations
//              are TMA-written in the B operand's layout and need none.
//
// K order. The A fragment of wgmma m64nNk16 gives lane q = l % 4 the K columns
// {2q, 2q+1, 2q+8, 2q+9} of each k16 slice (a_fragment_byte, decode_config.h,
// CPU-checked against the PTX layout): the consumers load exactly those byte
// pairs, so the B tile is plain K-major bf16 and the sum over K is the
// hardware's, as docs/contract.md §3 leaves it.
//
// Ordering. Raw stage i: full[i] (TMA bytes) -> consumers (W) and transform
// (X) read it -> empty[i] (every reader arrives; with bf16 activations the
// consumers arrive once the wgmma group that read X retired) -> the producer
// refills it. B slot j (e4m3; stage g uses slot g % kBSlots): the transform
// waits bempty[j] (the wgmma group of stage g - kBSlots retired in both
// warpgroups), writes the tile, fence.proxy.async, arrives bfull[j]; the
// consumers wait bfull[j], issue the stage's wgmmas, and release slot j after
// the next stage's first wait_group 1 (or the unit's wait_group 0). The
// reduction tile T aliases the B ring: the transform starts a unit's stages
// only after tfree, which every consumer arrives at once the previous unit's
// finish_unit is done with T.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "common/epilogue_quad.cuh"
#include "common/splitk_reduce.cuh"
#include "common/trace.cuh"
#include "common/layouts.h"
#include "common/ring.h"
#include "host/launch.h"
#include "ptx/elect.cuh"
#include "ptx/fence.cuh"
#include "ptx/globaltimer.cuh"
#include "ptx/griddepcontrol.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/setmaxnreg.cuh"
#include "ptx/smem.cuh"
#include "ptx/barrier.cuh"
#include "ptx/cluster.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"
#include "sm90/decode_config.h"
#include "sm90/dequant_sm90.cuh"

namespace m3qkv::sm90::decode {
namespace {


template <int NT>
__device__ __forceinline__ void mma_rs(float (&acc)[NT / 2], const uint32_t (&a)[4], uint64_t desc_b, uint32_t scale_d) {
  if constexpr (NT == 16)
    wgmma::mma_async_m64n16k16_f32_bf16_bf16_rs(acc, a, desc_b, scale_d);
  else if constexpr (NT == 32)
    wgmma::mma_async_m64n32k16_f32_bf16_bf16_rs(acc, a, desc_b, scale_d);
  else if constexpr (NT == 64)
    wgmma::mma_async_m64n64k16_f32_bf16_bf16_rs(acc, a, desc_b, scale_d);
  else
    wgmma::mma_async_m64n128k16_f32_bf16_bf16_rs(acc, a, desc_b, scale_d);
}

template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) wgmma::fence_operand(r[i]);
}
// One A set: the fragments of one 64-K step (4 k16 slices × 4 registers).
using ASet = uint32_t[kMmasPerStep][4];
__device__ __forceinline__ void fence_regs(ASet& a) {
#pragma unroll
  for (int s = 0; s < kMmasPerStep; ++s)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[s][i])::"memory");
}

// The reduction tile T[NT][128] f32 (splitk::tile_index layout) aliases the B ring.
using splitk::tile_index;

// The A fragments of step c2 of a stage: rows r and r + 8 (r % 8 = lane / 4),
// the byte pairs at 16s + 2q and 16s + 2q + 8 of each k16 slice s (K order:
// a_fragment_byte), read from the 128B-swizzled weight tile and dequantized
// with the row's scale of their MX block 2·c2 + s/2. a[s] is slice s.
template <bool kBig>
__device__ __forceinline__ void load_a_step(uint32_t w_tile, int c2, int r, int q, uint32_t sw_r, uint32_t sw_r8,
                                            ASet& a) {
  // sw128_offset(row, byte) with the row's unit XOR applied below (r % 8 = (r + 8) % 8).
  const uint32_t row = w_tile + static_cast<uint32_t>(r * 128);
  const uint32_t row8 = row + 8 * 128;
  const uint32_t x7 = static_cast<uint32_t>(r & 7);
#pragma unroll
  for (int s = 0; s < kMmasPerStep; ++s) {
    const int blk = 2 * c2 + s / 2;
    const Pow2Bf16 fr = make_pow2_bf16((sw_r >> (8 * blk)) & 0xffu);
    const Pow2Bf16 fr8 = make_pow2_bf16((sw_r8 >> (8 * blk)) & 0xffu);
    const uint32_t unit = ((static_cast<uint32_t>(4 * c2 + s) ^ x7) << 4) + 2 * q;
    a[s][0] = dequant_e4m3_lo_pair<kBig>(ptx::ld_shared_u16(row + unit), fr);       // row r,     K 2q, 2q+1
    a[s][1] = dequant_e4m3_lo_pair<kBig>(ptx::ld_shared_u16(row8 + unit), fr8);     // row r + 8
    a[s][2] = dequant_e4m3_lo_pair<kBig>(ptx::ld_shared_u16(row + unit + 8), fr);   // row r,     K 2q+8, 2q+9
    a[s][3] = dequant_e4m3_lo_pair<kBig>(ptx::ld_shared_u16(row8 + unit + 8), fr8); // row r + 8
  }
}

// Transform task (token n, 16-B unit u of its 128-B e4m3 row): 16 activations
// times 2^(scale of MX block u/2 - 127) -> two 16-B units of bf16 in the token's
// row of the B buffer of step u/4. Raw X and B buffers are both 128B-swizzled
// (unit v of row n at v ^ (n % 8)), so the 8 tokens of a quarter warp hit 8
// different bank groups in both.
template <bool kBig>
__device__ __forceinline__ void convert_x_task(uint32_t x_tile, uint32_t b_slot, uint32_t b_buf_bytes, int n, int u,
                                               uint32_t sx) {
  const Pow2Bf16 f = make_pow2_bf16((sx >> (8 * (u / 2))) & 0xffu);
  const uint4 w = ptx::ld_shared_v4_b32(x_tile + static_cast<uint32_t>(sw128_offset(n, 16 * u)));
  const uint32_t dst = b_slot + static_cast<uint32_t>(u / 4) * b_buf_bytes;
  const int v0 = 2 * (u % 4);
  ptx::st_shared_v4_b32(dst + sw128_offset(n, 16 * v0), dequant_e4m3_lo_pair<kBig>(w.x, f),
                        dequant_e4m3_hi_pair<kBig>(w.x, f), dequant_e4m3_lo_pair<kBig>(w.y, f),
                        dequant_e4m3_hi_pair<kBig>(w.y, f));
  ptx::st_shared_v4_b32(dst + sw128_offset(n, 16 * (v0 + 1)), dequant_e4m3_lo_pair<kBig>(w.z, f),
                        dequant_e4m3_hi_pair<kBig>(w.z, f), dequant_e4m3_lo_pair<kBig>(w.w, f),
                        dequant_e4m3_hi_pair<kBig>(w.w, f));
}

// The barriers of the kernel (shared-memory addresses; Config's offsets).
struct Bars {
  uint32_t full0, empty0, bfull0, bempty0, tfree;
  uint32_t red_full, red_empty;  // cluster plans (splitk::finish_unit_ranks)
};

// -------------------------------------------------------------------- roles

template <int NT, int XB>
__device__ __forceinline__ void producer(const Params& p, const CUtensorMap* tmap_w, const CUtensorMap* tmap_x,
                                         uint32_t stage0, const Bars& b) {
  using C = Config<NT, XB>;
  trace_event(p, kTrSetup);
  ptx::prefetch_tensormap(tmap_w);
  ptx::prefetch_tensormap(tmap_x);
  // (An L2 prefetch of the unit's weight tiles here, ahead of the wait, put
  // the whole unit's stream in front of the first stage's load on the copy
  // engine: CHANGELOG.md.)
  griddepcontrol_wait();
  trace_event(p, kTrPdlDone);
  Ring<C::kStages> ring;
  for (int u = blockIdx.x; u < p.units; u += gridDim.x) {
    const splitk::Unit w = unit_of(p, u);
    const uint8_t* wsf = p.wsf + static_cast<int64_t>(w.head) * p.k_stages * kSfChunk;
    const uint8_t* xsf = XB == kXE4m3 ? p.xsf + static_cast<int64_t>((w.tb * NT) / 128) * p.k_stages * kSfChunk : nullptr;
    for (int kb = w.k0; kb < w.k1; ++kb) {
      const uint32_t st = stage0 + ring.idx * C::kStageBytes;
      const uint32_t full = b.full0 + 8 * ring.idx;
      ptx::mbarrier_wait(b.empty0 + 8 * ring.idx, ring.phase ^ 1u);
      ptx::mbarrier_arrive_expect_tx(full, C::kTxBytes);
      ptx::cp_async_bulk_tensor_2d(st + C::kWOff, tmap_w, kb * kBK, w.head * kHeadRows, full);
      if constexpr (XB == kXE4m3) {
        ptx::cp_async_bulk_tensor_2d(st + C::kXOff, tmap_x, kb * kBK, w.tb * NT, full);
        ptx::cp_async_bulk_shared_global(st + C::kXsfOff, xsf + static_cast<int64_t>(kb) * kSfChunk, kSfChunk, full);
      } else {
#pragma unroll
        for (int c2 = 0; c2 < kStepsPerStage; ++c2)  // box coordinates in bytes: 128 B = 64 bf16 per box
          ptx::cp_async_bulk_tensor_2d(st + C::kXOff + c2 * C::kXHalfBytes, tmap_x, kb * 2 * kBK + c2 * 128,
                                       w.tb * NT, full);
      }
      ptx::cp_async_bulk_shared_global(st + C::kWsfOff, wsf + static_cast<int64_t>(kb) * kSfChunk, kSfChunk, full);
      ring.advance();
    }
  }
}

// Warps 9-11 (e4m3 activations): every stage's activations into the B slot of that stage.
template <int NT, int XB>
__device__ __forceinline__ void transform(const Params& p, uint32_t smem_s) {
  using C = Config<NT, XB>;
  static_assert(C::kTransform, "bf16 activations need no transform");
  // Barrier addresses as constant offsets of the one base register.
  const Bars b{smem_s + C::kBarOff + C::kFullOff,   smem_s + C::kBarOff + C::kEmptyOff,
               smem_s + C::kBarOff + C::kBFullOff,  smem_s + C::kBarOff + C::kBEmptyOff,
               smem_s + C::kBarOff + C::kTFreeOff,  0u, 0u};
  const int tt = static_cast<int>(threadIdx.x) - kTransformWarp0 * 32;  // 0 .. kTransformThreads-1
  constexpr int kTasks = NT * (kBK / 16);                             // (token, 16-B unit of its row)
  static_assert(kTasks % 32 == 0 && kTransformThreads % 32 == 0, "a full block's task loop is warp-uniform");
  const int lane = tt % 32;
  Ring<C::kStages> ring;
  Ring<C::kBSlots> bring;  // B slot of the stage and the parity of its use
  uint32_t tfree_parity = 0;
  for (int u = blockIdx.x; u < p.units; u += gridDim.x) {
    // Only the unit's token block and stage range.
    const uint32_t uu = static_cast<uint32_t>(u) / static_cast<uint32_t>(p.split);
    const uint32_t split_s = static_cast<uint32_t>(u) - uu * static_cast<uint32_t>(p.split);
    const int tb = static_cast<int>(uu % static_cast<uint32_t>(p.token_blocks));
    const int k0 = splitk::k0(p.k_stages, static_cast<int>(split_s), p.split);
    const int k1 = splitk::k0(p.k_stages, static_cast<int>(split_s) + 1, p.split);
    // Only the block's tokens are converted: a B column past them feeds only
    // accumulator columns nobody reads (the columns of a product are
    // independent), so its stale bytes may stay: at M = 1 a stage is 8
    // tasks, not 128.
    const int mt = splitk::block_tokens(p.m, tb, NT);
    const int tasks = mt * (kBK / 16);
    // T (the previous unit's reduction tile) aliases the B ring.
    if (u != static_cast<int>(blockIdx.x)) {
      ptx::mbarrier_wait(b.tfree, tfree_parity);
      tfree_parity ^= 1u;
    }
    for (int kb = k0; kb < k1; ++kb) {
      const uint32_t st = smem_s + C::kStageOff + ring.idx * C::kStageBytes;
      const uint32_t slot = bring.idx;
      ptx::mbarrier_wait(b.full0 + 8 * ring.idx, ring.phase);
      ptx::mbarrier_wait(b.bempty0 + 8 * slot, bring.phase ^ 1u);
      const uint32_t bslot = smem_s + C::kRingOff + slot * C::kBSlotBytes;
      // One task: 16 activations of token n, 16-B unit `unit` (all lanes call
      // it: the scale choice is a warp vote; `live` = the lane has a task).
      auto task = [&](int n, int unit, bool live) {
        const uint32_t sx = ptx::ld_shared_b32(st + C::kXsfOff + f8_128x4_chunk_word((tb * NT) % 128 + n));
        // Scales above 2^7 need a second multiply: a warp-uniform choice
        // (MXFP8 scales sit near 2^-8).
        const bool big = __any_sync(0xffffffffu, live && any_big_scale(sx));
        if (!live) return;
        if (big)
          convert_x_task<true>(st + C::kXOff, bslot, C::kBBufBytes, n, unit, sx);
        else
          convert_x_task<false>(st + C::kXOff, bslot, C::kBBufBytes, n, unit, sx);
      };
      // Consecutive lanes: consecutive tokens (bank groups).
      if (mt == NT) {
#pragma unroll 2
        for (int k = tt; k < kTasks; k += kTransformThreads) task(k % NT, k / NT, true);
      } else {
        for (int kw = tt - lane; kw < tasks; kw += kTransformThreads) {  // warp-uniform trip count
          const bool live = kw + lane < tasks;
          const int k = live ? kw + lane : 0;
          task(k % mt, k / mt, live);
        }
      }
      // Generic-proxy stores read next by wgmma (async proxy): fence in every
      // writing thread before its release.
      ptx::fence_proxy_async_shared_cta();
      ptx::mbarrier_arrive(b.empty0 + 8 * ring.idx);
      ptx::mbarrier_arrive(b.bfull0 + 8 * slot);
      ring.advance();
      bring.advance();
    }
  }
}

// The end of a unit in the 256 consumer threads: accumulators -> T, then the
// shared split-K end (splitk::finish_unit: partial -> workspace, arrival; the
// last arriver sums the partials in the order s = 0..S-1 and runs the
// epilogue). Returns after a barrier that frees T / the B ring.
template <int NT>
__device__ __forceinline__ bool finish_unit(const Params& p, const splitk::Unit& w, int u, float (&acc)[NT / 2],
                                            float* T, uint32_t t_smem, epi::SlotOwnerTable<NT>* owners,
                                            volatile uint32_t* flag, const Bars& b, uint32_t parity) {
  const int t = threadIdx.x;
  const int wg = t / kWarpgroup, warp = (t % kWarpgroup) / 32, l = t % 32, q = l % 4;
  const int r0 = 64 * wg + 16 * warp + l / 4;
  // Accumulator fragment: acc[4j + 2h + b] = D[row r0 + 8h][token 8j + 2q + b].
#pragma unroll
  for (int j = 0; j < NT / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int b = 0; b < 2; ++b) T[tile_index(8 * j + 2 * q + b, r0 + 8 * h)] = acc[4 * j + 2 * h + b];
  ptx::bar_sync(kBarrierNamed, kConsumerThreads);
  static_assert(kTrSummed == kTrArrived + splitk::kMarkSummed && kTrOwners == kTrArrived + splitk::kMarkOwners,
                "trace events in splitk::Mark order");
  const auto mark = [&](int step) {  // timeline: splitk::Mark steps as trace events
    if (t == 0) trace_event(p, kTrArrived + step);
  };
  // The cluster's S tiles meet in distributed shared memory. The unit's split
  // w.s is the CTA's %cluster_ctarank: 1-D clusters of consecutive CTAs
  // (rank = blockIdx.x % S, CUDA programming guide "Thread Block Clusters")
  // and a grid that is a multiple of S (cluster_plan), checked by the forced
  // cluster tests' golden bytes.
  if (p.cluster > 1) {
    splitk::finish_unit_cluster<NT, kConsumerThreads, kBarrierNamed>(
        p, w, t, T, t_smem, owners, b.red_full, b.red_empty, parity, mark);
    return w.s == 0;
  }
  // Sixteen partial loads in flight per thread (no spill within the 168
  // registers): at NT <= 32, 2 items × 8 splits, so a last arriver of up to 8
  // splits waits one L2 round trip for its partials, not two; above, 4 × 4.
  // Spread plans (every unit resident: a cooperative launch): the S units
  // wait for each other and each finishes its share of the rows.
  constexpr int kItems = NT <= 32 ? 2 : 4;
  return splitk::finish_unit<NT, kConsumerThreads, kBarrierNamed, kItems, 16 / kItems>(
      p, w, u, t, T, owners, flag, /*skip_split=*/-1, p.spread != 0, mark);
}

// One stage of the consumers, one 64-K step at a time with two A sets (one
// per step): step c2's set is dequantized while the previous step's 4 wgmmas
// run; wait_group 1 after each commit retires the step before. The B operand
// is the stage's B slot (e4m3 activations, after bfull) or the raw stage's X
// (bf16). What the previous stage's last group read (its B slot, or its raw
// stage) is released at this stage's first wait (`pending`, an mbarrier
// address, 0 = none); with e4m3 activations the raw stage is released as soon
// as both steps' weights are read.
template <int NT, int XB>
__device__ __forceinline__ void consume_stage(uint32_t st, uint32_t b_tile, uint32_t empty, uint32_t bfull,
                                              uint32_t bfull_parity, uint32_t release, uint32_t& pending, int r,
                                              int q, bool first, float (&acc)[NT / 2], ASet& a0, ASet& a1) {
  using C = Config<NT, XB>;
  const uint32_t sw_r = ptx::ld_shared_b32(st + C::kWsfOff + f8_128x4_chunk_word(r));
  const uint32_t sw_r8 = ptx::ld_shared_b32(st + C::kWsfOff + f8_128x4_chunk_word(r + 8));
  // Scales above 2^7 need a second multiply: a warp-uniform choice, so the
  // common case issues one multiply per pair (MXFP8 scales sit near 2^-8).
  const bool big = __any_sync(0xffffffffu, any_big_scale(sw_r) || any_big_scale(sw_r8));
  const uint64_t db = wgmma::make_desc_kmajor_sw128(b_tile);
#pragma unroll
  for (int c2 = 0; c2 < kStepsPerStage; ++c2) {
    ASet& a = c2 == 0 ? a0 : a1;
    if (big)
      load_a_step<true>(st + C::kWOff, c2, r, q, sw_r, sw_r8, a);
    else
      load_a_step<false>(st + C::kWOff, c2, r, q, sw_r, sw_r8, a);
    if constexpr (C::kTransform) {
      if (c2 == kStepsPerStage - 1) ptx::mbarrier_arrive(empty);  // this thread's reads of the raw stage are done
      if (c2 == 0) ptx::mbarrier_wait(bfull, bfull_parity);
    }
    // No register fence on acc inside the unit: its only writers are the
    // wgmmas, so a fence here would "define" registers of a group in flight
    // and serialize it (ptxas C7515).
    wgmma::fence_sync_aligned();
#pragma unroll
    for (int s = 0; s < kMmasPerStep; ++s)
      mma_rs<NT>(acc, a[s], wgmma::desc_advance(db + c2 * (C::kBBufBytes >> 4), 32 * s),
                 (first && c2 == 0 && s == 0) ? 0u : 1u);
    wgmma::commit_group_sync_aligned();
    wgmma::wait_group_sync_aligned<1>();
    if (c2 == 0) {
      // The previous stage's last group retired.
      if (pending != 0u) ptx::mbarrier_arrive(pending);
      pending = release;
    }
    // The group before this one retired: the other set may be rewritten.
    fence_regs(c2 == 0 ? a1 : a0);
  }
}

template <int NT, int XB>
__device__ __forceinline__ void consumer(const Params& p, uint8_t* smem, uint32_t smem_s, const Bars& b,
                                         volatile uint32_t* flag) {
  using C = Config<NT, XB>;
  const int t = threadIdx.x;
  const int wg = t / kWarpgroup, warp = (t % kWarpgroup) / 32, l = t % 32, q = l % 4;
  const int r = 64 * wg + 16 * warp + l / 4;  // weight rows r and r + 8 of the head
  float* T = reinterpret_cast<float*>(smem + C::kRingOff);
  auto* owners = reinterpret_cast<typename C::OwnerTable*>(smem + C::kOwnersOff);
  griddepcontrol_wait();  // the epilogue reads inputs and the workspace of this launch

  Ring<C::kStages> ring;
  uint32_t g = 0;         // stages walked by this CTA: B slot g % kBSlots
  uint32_t pending = 0u;  // what the previous stage's wgmmas read (an mbarrier to arrive at), 0 = none
  // The two A sets (steps 0 and 1 of every stage). A set stays live until the
  // wait that retires its group.
  ASet a0, a1;
  int units = 0, lasts = 0;
  for (int u = blockIdx.x; u < p.units; u += gridDim.x) {
    const splitk::Unit w = unit_of(p, u);
    float acc[C::kAccRegs];  // the unit's first wgmma ignores D (scale_d = 0)
    auto stage = [&](int kb) {
      ptx::mbarrier_wait(b.full0 + 8 * ring.idx, ring.phase);
      if (t == 0 && units == 0 && kb == w.k0) trace_event(p, kTrFirstFull);
      const uint32_t st = smem_s + C::kStageOff + ring.idx * C::kStageBytes;
      const uint32_t empty = b.empty0 + 8 * ring.idx;
      if constexpr (C::kTransform) {
        const uint32_t slot = g % C::kBSlots;
        consume_stage<NT, XB>(st, smem_s + C::kRingOff + slot * C::kBSlotBytes, empty, b.bfull0 + 8 * slot,
                              (g / C::kBSlots) & 1u, b.bempty0 + 8 * slot, pending, r, q, kb == w.k0, acc, a0, a1);
      } else {
        consume_stage<NT, XB>(st, st + C::kXOff, empty, 0u, 0u, empty, pending, r, q, kb == w.k0, acc, a0, a1);
      }
      ring.advance();
      ++g;
    };
    for (int kb = w.k0; kb < w.k1; ++kb) stage(kb);
    wgmma::wait_group_sync_aligned<0>();
    fence_regs(acc);
    fence_regs(a0);
    fence_regs(a1);
    // The last stage's group retired (e4m3: the transform reuses its B slot only after tfree).
    ptx::mbarrier_arrive(pending);
    pending = 0u;
    if (t == 0) trace_event(p, kTrMainDone);
    // Both warpgroups' wgmmas have read the B ring before T overwrites it.
    ptx::bar_sync(kBarrierNamed, kConsumerThreads);
    lasts += finish_unit<NT>(p, w, u, acc, T, smem_s + C::kRingOff, owners, flag, b, units & 1) ? 1 : 0;
    // Every thread's T accesses are done: each releases them to the transform.
    if constexpr (C::kTransform) ptx::mbarrier_arrive(b.tfree);
    if (t == 0) trace_event(p, kTrEpiDone);
    ++units;
  }
  if (t == 0) {
    trace_value(p, kTrUnits, static_cast<uint64_t>(units));
    trace_value(p, kTrLastArrivals, static_cast<uint64_t>(lasts));
  }
}

}  // namespace

template <int NT, int XB>
__global__ void __launch_bounds__(kThreads, 1)
    m3qkv_sm90_decode_kernel(const __grid_constant__ CUtensorMap tmap_w, const __grid_constant__ CUtensorMap tmap_x,
                             const __grid_constant__ Params p) {
#if defined(__CUDA_ARCH__) && M3QKV_HAS_WGMMA
  using C = Config<NT, XB>;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = ptx::smem_u32(smem_raw);
  const uint32_t base = (raw + kSwizzleAtom - 1) & ~static_cast<uint32_t>(kSwizzleAtom - 1);
  uint8_t* smem = smem_raw + (base - raw);
  const uint32_t bar = base + C::kBarOff;
  const Bars b{bar + C::kFullOff,  bar + C::kEmptyOff,    bar + C::kBFullOff,   bar + C::kBEmptyOff,
               bar + C::kTFreeOff, bar + C::kRedFullOff, bar + C::kRedEmptyOff};
  volatile uint32_t* flag = reinterpret_cast<volatile uint32_t*>(smem + C::kBarOff + C::kFlagOff);
  if (threadIdx.x == 0) {
    trace_event(p, kTrEntry);
    for (int s = 0; s < C::kStages; ++s) {
      ptx::mbarrier_init(b.full0 + 8 * s, 1);
      ptx::mbarrier_init(b.empty0 + 8 * s, C::kEmptyArrivals);
    }
    for (int s = 0; s < C::kBSlots; ++s) {
      ptx::mbarrier_init(b.bfull0 + 8 * s, C::kBFullArrivals);
      ptx::mbarrier_init(b.bempty0 + 8 * s, C::kBEmptyArrivals);
    }
    ptx::mbarrier_init(b.tfree, C::kTFreeArrivals);
    if (p.cluster > 1) {  // one arrival per peer rank and unit
      ptx::mbarrier_init(b.red_full, p.cluster - 1);
      ptx::mbarrier_init(b.red_empty, p.cluster - 1);
    }
    ptx::fence_mbarrier_init_release_cluster();  // visible to the async proxy (TMA complete_tx) and the peers
  }
  if (p.cluster > 1) {  // every CTA's barriers initialized before a peer's remote arrival
    ptx::barrier_cluster_arrive();
    ptx::barrier_cluster_wait();
  } else {
    __syncthreads();
  }
  if (threadIdx.x >= kConsumerThreads) {
    ptx::setmaxnreg_dec<C::kWg2Regs>();
    const int warp = threadIdx.x / 32;
    if (warp == kProducerWarp) {
      if (ptx::elect_sync()) producer<NT, XB>(p, &tmap_w, &tmap_x, base + C::kStageOff, b);
      __syncwarp();
    } else if constexpr (C::kTransform) {
      transform<NT, XB>(p, base);
    }
    griddepcontrol_launch_dependents();
  } else {
    ptx::setmaxnreg_inc<C::kConsumerRegs>();
    consumer<NT, XB>(p, smem, base, b, flag);
  }
  if (p.cluster > 1) {
    // No CTA leaves while a peer may still read its shared memory (the CUDA
    // programming guide's rule for distributed shared memory); every role
    // reaches this point, and the barrier is .aligned: whole warps.
    __syncwarp();
    ptx::barrier_cluster_arrive();
    ptx::barrier_cluster_wait();
  }
#endif
}

// The converted activations: x̂ = MXFP8 x in bf16, in the launch workspace,
// for the bf16 instance that follows (PDL on this grid: its trigger comes
// after this thread's stores, and its griddepcontrol.wait waits for the whole grid).
__global__ void __launch_bounds__(kConvertThreads) m3qkv_sm90_convert_x_kernel(const DequantJob x, int64_t k) {
#if defined(__CUDA_ARCH__) && M3QKV_HAS_WGMMA
  griddepcontrol_wait();  // xq, xsf: the caller's (a previous grid's output)
  convert_jobs(x, DequantJob{}, k, static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x,
               static_cast<int64_t>(gridDim.x) * blockDim.x);
  griddepcontrol_launch_dependents();
#endif
}

// ----------------------------------------------------------------- host side

template <int NT, int XB>
cudaError_t decode_set_smem() {
  return cudaFuncSetAttribute(m3qkv_sm90_decode_kernel<NT, XB>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              Config<NT, XB>::kSmemBytes);
}

namespace {
uint64_t* g_trace = nullptr;
int g_trace_ctas = 0;
}  // namespace

void decode_set_trace(uint64_t* device_buffer, int ctas) {
  g_trace = ctas > 0 ? device_buffer : nullptr;
  g_trace_ctas = g_trace != nullptr ? ctas : 0;
}

template <int XB>
cudaError_t prepare_format() {
  cudaError_t e = decode_set_smem<16, XB>();
  if (e == cudaSuccess) e = decode_set_smem<32, XB>();
  if (e == cudaSuccess) e = decode_set_smem<64, XB>();
  if (e == cudaSuccess) e = decode_set_smem<128, XB>();
  return e;
}

cudaError_t prepare_decode() {
  cudaError_t e = prepare_format<kXE4m3>();
  return e == cudaSuccess ? prepare_format<kXBf16>() : e;
}

int max_clusters(int ctas) {
  // Every instance takes more than half of the SM's shared memory (Config's
  // static_assert): one CTA per SM, so any instance gives the same count.
  return host::max_active_clusters(m3qkv_sm90_decode_kernel<128, kXE4m3>, kThreads,
                                   Config<128, kXE4m3>::kSmemBytes, static_cast<unsigned>(ctas));
}

template <int NT, int XB>
m3qkv_status launch_decode_nt(const CUtensorMap& tw, const CUtensorMap& tx, const Params& p, int grid, bool pdl,
                              cudaStream_t s) {
  host::LaunchShape shape;
  shape.grid = static_cast<unsigned>(grid);
  shape.threads = kThreads;
  shape.smem = Config<NT, XB>::kSmemBytes;
  shape.pdl = pdl;
  shape.cluster = p.cluster > 1 ? static_cast<unsigned>(p.cluster) : 0u;
  shape.cooperative = p.spread != 0;  // its units wait on each other: all resident, or the launch is refused
  Params pt = p;
  pt.trace = g_trace;
  pt.trace_ctas = g_trace_ctas;
  return host::launch("m3qkv_fused_qkv", "m3qkv_sm90_decode_kernel", m3qkv_sm90_decode_kernel<NT, XB>, shape, s, tw,
                      tx, pt);
}

template <int XB>
m3qkv_status launch_format(int nt, const CUtensorMap& tw, const CUtensorMap& tx, const Params& p, int grid, bool pdl,
                           cudaStream_t s) {
  switch (nt) {
    case 16: return launch_decode_nt<16, XB>(tw, tx, p, grid, pdl, s);
    case 32: return launch_decode_nt<32, XB>(tw, tx, p, grid, pdl, s);
    case 64: return launch_decode_nt<64, XB>(tw, tx, p, grid, pdl, s);
    case 128: return launch_decode_nt<128, XB>(tw, tx, p, grid, pdl, s);
    default: return fail(M3QKV_ERROR_INTERNAL, "m3qkv_fused_qkv: no SM90 kernel for token block %d", nt);
  }
}

m3qkv_status launch_decode(int nt, int xb, const CUtensorMap& tw, const CUtensorMap& tx, const Params& p, int grid,
                           bool pdl, const DequantJob& conv, int num_sms, cudaStream_t s) {
  if (conv.rows > 0) {
    const int64_t k = static_cast<int64_t>(p.k_stages) * kBK;
    const int64_t rounds = (conv.rows * (k / kConvertGroup) + kConvertUnroll - 1) / kConvertUnroll;
    host::LaunchShape cs;
    cs.grid = static_cast<unsigned>(std::min<int64_t>((rounds + kConvertThreads - 1) / kConvertThreads,
                                                      int64_t{kConvertCtasPerSm} * num_sms));
    cs.threads = kConvertThreads;
    cs.pdl = pdl;
    M3QKV_TRY(host::launch("m3qkv_fused_qkv", "m3qkv_sm90_convert_x_kernel", m3qkv_sm90_convert_x_kernel, cs, s,
                           conv, k));
    pdl = true;  // on the conversion, our own launch
  }
  if (xb == kXBf16) return launch_format<kXBf16>(nt, tw, tx, p, grid, pdl, s);
  return launch_format<kXE4m3>(nt, tw, tx, p, grid, pdl, s);
}

}  // namespace m3qkv::sm90::decode
