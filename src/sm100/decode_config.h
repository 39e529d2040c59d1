// Compile-time configuration of the SM100 decode kernel (decode_sm100.cu)
// and the parameters the launcher (launch_sm100.cu) passes; its plan target
// (token blocks, M range, the busy-SM rule) is decode::kTarget in plan.h.
// Every byte and column budget is derived here once, with static asserts;
// docs/sm100.md ("Decode variant") explains the choices.
//
// The MMA swaps A and B: A = the weights (M = 128 rows = one head), B = the
// tokens (N = NT, a token block), D[c][t] in TMEM lane c (head column),
// column t (token); K split across a persistent grid (src/common/splitk_plan.h).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/epilogue.cuh"
#include "common/splitk_plan.h"
#include "m3qkv/m3qkv.h"
#include "sm100/config.h"  // kSmemPerBlockOptin, kTmemColumns, kRegistersPerSm
#include "sm100/desc.h"
#include "sm100/plan.h"  // decode::kTarget, the plan's token blocks

namespace m3qkv::sm100::decode {

// The token block's scale rows inside its 512-B xsf chunk: tokens
// [tb·NT, tb·NT + NT) are rows r0 = (tb·NT) % 128 .. r0 + NT - 1 of the
// chunk's 128 rows. tcgen05.cp.32x128b.warpx4 puts row r at lane r % 32,
// column r / 32 of the slot (docs/sm100.md §4); the MMA reads the scale of B
// column n at lane n % 32, column sfb + n / 32 (PTX ISA §9.7.16.10.7.3,
// Figure 240, block32: one scale per B column in a byte sub-column; the
// lane / column reading of the figure is the same interpretation the tile
// kernel's N = 128 SFB and the emulation use). The address names a column
// only (lane field 0), so with r0 % 32 == 0, sfb = slot + r0 / 32 gives
// column n the scale of row r0 + n.
M3_SM100_HDC uint32_t sfx_col_offset(int tb, int nt) { return static_cast<uint32_t>(((tb * nt) % 128) / 32); }

// tcgen05.alloc takes a power of 2 in [32, 512] columns (PTX ISA §9.7.16.7.1).
constexpr uint32_t tmem_alloc_cols(uint32_t need) {
  uint32_t c = 32;
  while (c < need) c *= 2;
  return c;
}

template <int NT>
struct DecodeConfig {
  static_assert(NT == 32 || NT == 64 || NT == 128, "token block = MMA N");
  static_assert(128 % NT == 0 && NT % 32 == 0, "a block's scale rows start at a 32-row column of its chunk");
  static constexpr int kNt = NT;

  // ---- MMA: m128nNTk32, A = weights (K-major), B = tokens (K-major) -------
  static constexpr uint32_t UMMA_M = 128;  // one head
  static constexpr uint32_t UMMA_N = NT;
  static constexpr uint32_t UMMA_K = 32;   // kind::mxf8f6f4: K = 32 per MMA, one scale block
  static constexpr uint32_t BK = 128;      // K per pipeline stage (4 MX blocks)
  static constexpr uint32_t kMmaPerStage = BK / UMMA_K;
  static_assert(mma_shape_valid(1, UMMA_M, UMMA_N), "tcgen05.mma shape (PTX ISA §9.7.16.2.1, Table 39)");
  static_assert(kMmaPerStage == 4, "one 512-B F8_128x4 chunk = 4 scale columns = one BK = 128 stage");

  // ---- shared memory --------------------------------------------------------
  // [T: NT × 128 f32][stages × (W | X | SFW | SFX)][full × S][empty × S]
  // [tmem_full × 2][tmem_empty × 2][last-arriver flag][TMEM base]
  static constexpr uint32_t kWBytes = 128 * BK;  // e4m3 [128][128], 128B-swizzled
  static constexpr uint32_t kXBytes = NT * BK;   // e4m3 [NT][128], 128B-swizzled (rows >= M zero-filled)
  static constexpr uint32_t kSfwBytes = kSfChunkBytes;  // the head's 128 rows × 4 scale columns
  static constexpr uint32_t kSfxBytes = kSfChunkBytes;  // the token block's 128-row chunk
  static constexpr uint32_t kStageBytes = kWBytes + kXBytes + kSfwBytes + kSfxBytes;
  static constexpr uint32_t kTxBytes = kStageBytes;  // every byte of a stage arrives by TMA
  static constexpr uint32_t kTileBytes = NT * 128 * 4;  // the reduction / epilogue tile T
  static constexpr uint32_t kMaxStages = 8;
  static constexpr uint32_t kNumAccBufs = 2;
  static constexpr uint32_t kBarrierBytes = (2 * kMaxStages + 2 * kNumAccBufs) * 8 + 16;
  static constexpr uint32_t kAlignSlack = 1024;  // dynamic smem base rounded up to 1024 B in the kernel
  // The last arriver's slot-owner table of its token block (splitk::finish_unit;
  // common/slot_owners.cuh), after the barriers (2-4 KiB: no stage lost).
  using OwnerTable = epi::SlotOwnerTable<NT>;
  static constexpr uint32_t kOwnersBytes = sizeof(OwnerTable);
  static constexpr uint32_t kStagesFit =
      (kSmemPerBlockOptin - kAlignSlack - kBarrierBytes - kOwnersBytes - kTileBytes) / kStageBytes;
  static constexpr uint32_t kStages = kStagesFit > kMaxStages ? kMaxStages : kStagesFit;
  static constexpr uint32_t kTileOff = 0;
  static constexpr uint32_t kStageOff = kTileOff + kTileBytes;
  static constexpr uint32_t kWOff = 0;  // in-stage offsets
  static constexpr uint32_t kXOff = kWBytes;
  static constexpr uint32_t kSfwOff = kWBytes + kXBytes;
  static constexpr uint32_t kSfxOff = kSfwOff + kSfwBytes;
  static constexpr uint32_t kBarOff = kStageOff + kStages * kStageBytes;
  static constexpr uint32_t kOwnersOff = kBarOff + kBarrierBytes;
  static constexpr uint32_t kSmemBytes = kAlignSlack + kOwnersOff + kOwnersBytes;
  static_assert(kOwnersOff % 8 == 0, "owner table: 8-B words");
  static_assert(kStages >= 4, "at least 4 stages (64 KiB of weights) in flight per SM");
  static_assert(kSmemBytes <= kSmemPerBlockOptin, "shared memory budget");
  static_assert(kStageOff % 1024 == 0 && kStageBytes % 1024 == 0 && kXOff % 1024 == 0,
                "128B-swizzle tiles at 1024-B boundaries (descriptor base offset 0)");
  static_assert(kSfwOff % 16 == 0 && kSfxOff % 16 == 0, "TMA / tcgen05.cp sources 16-B aligned");
  // > half of the SM's shared memory: one CTA per SM, never next to the tile
  // kernel either (its CTAs use > half as well), so TMEM is ours alone on the SM.
  static_assert(2 * kSmemBytes > kSmemPerBlockOptin, "one CTA per SM");

  // ---- warps ---------------------------------------------------------------
  static constexpr uint32_t kTmaWarp = 0;
  static constexpr uint32_t kMmaWarp = 1;  // also allocates / frees TMEM
  static constexpr uint32_t kFirstEpiWarp = 2;
  // Two epilogue warpgroups (warps 2-9): warp w reads TMEM lane quarter w % 4
  // (PTX ISA §9.7.16.8.1); warpgroup h = 0, 1 takes tokens [h·NT/2, h·NT/2 + NT/2).
  static constexpr uint32_t kNumEpiWarps = 8;
  static constexpr uint32_t kEpiThreads = 32 * kNumEpiWarps;
  static constexpr uint32_t kNumThreads = 32 * (kFirstEpiWarp + kNumEpiWarps);
  static constexpr uint32_t kEpiColsPerWarp = NT / 2;  // TMEM columns (tokens) per epilogue warp
  static_assert(kEpiColsPerWarp % 16 == 0, "tcgen05.ld 32x32b.x16 / .x32 chunks");
  // Named barriers (0 is __syncthreads): the TMEM base handed from the MMA
  // warp to the epilogue (warps 1-9: warp 0 is already streaming), and the
  // epilogue group's own barrier (splitk::finish_unit).
  static constexpr uint32_t kTmemReadyBarrier = 1;
  static constexpr uint32_t kTmemReadyThreads = kNumThreads - 32;
  static constexpr uint32_t kEpiBarrier = 2;
  // No setmaxnreg: 320 threads get 65536 / 320 -> 200 registers each.
  static constexpr uint32_t kRegsPerThread = (kRegistersPerSm / kNumThreads) / 8 * 8;
  static_assert(kRegsPerThread >= 200, "register budget of __launch_bounds__(kNumThreads, 1)");

  // ---- Tensor Memory map (columns; every lane) ------------------------------
  // [acc 0: NT][acc 1: NT][SF slots × R: SFW 4 | SFX 4]
  static constexpr uint32_t kAccBase0 = 0;
  static constexpr uint32_t kAccBase1 = NT;
  static constexpr uint32_t kSfwCols = 4;
  static constexpr uint32_t kSfxCols = 4;
  static constexpr uint32_t kSfSlotCols = kSfwCols + kSfxCols;
  static constexpr uint32_t kSfBase = kAccBase1 + NT;
  // The smallest power-of-2 allocation holding both accumulators and 4 SF
  // slots; the slots then fill what it leaves (at most one per stage).
  static constexpr uint32_t kTmemAllocCols = tmem_alloc_cols(kSfBase + 4 * kSfSlotCols);
  static constexpr uint32_t kSfSlotsFit = (kTmemAllocCols - kSfBase) / kSfSlotCols;
  static constexpr uint32_t kSfSlots = kSfSlotsFit < kStages ? kSfSlotsFit : kStages;
  static_assert(kSfSlots >= 2, "scale-factor slots: cp of k-block g+1 overlaps the MMAs of g");
  static_assert(kSfBase + kSfSlots * kSfSlotCols <= kTmemAllocCols && kTmemAllocCols <= kTmemColumns, "TMEM budget");
};

// Everything the kernel needs besides the four tensor maps.
struct DecodeParams {
  int32_t m;             // tokens
  int32_t heads;         // N / 128
  int32_t k_stages;      // K / 128 (= Kt of the F8_128x4 layouts)
  int32_t token_blocks;  // ceil(M / NT)
  int32_t split;         // S
  int32_t units;         // heads · token_blocks · split
  uint32_t* counters;    // workspace: [heads · token_blocks] arrival counters, zero between launches
  float* partials;       // workspace: [units][NT][128] f32 partial slots
  float* acc_tap;        // test only: f32 accumulator [M, N], or null
  int64_t n;             // N (tap row stride)
  epi::EpilogueParams epi;
  int32_t l2_prefetch;      // 1: the first unit's weight stages are prefetched to L2 before griddepcontrol.wait
  int32_t test_skip_split;  // test only: the last arriver leaves this split out of the sum (-1: none)
};

struct DecodeTensorMaps {
  CUtensorMap w, x, sfw, sfx;  // wq box 128×128, xq box 128×NT (both SW128); wsf / xsf rows of 256 B, box 256×2
};

// Host entry points of decode_sm100.cu.
cudaError_t set_decode_attributes();  // cudaFuncSetAttribute (max dynamic smem) of every instance
uint32_t decode_smem_bytes_max();     // the largest instance's dynamic shared memory
// nt = 32, 64 or 128 (the plan's token block).
m3qkv_status launch_decode(int nt, const DecodeTensorMaps& tm, const DecodeParams& p, int grid, bool pdl,
                           cudaStream_t s);

}  // namespace m3qkv::sm100::decode
