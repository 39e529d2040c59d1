// Compile-time configuration of the SM100 fused kernel and the parameters the
// host launcher (launch_sm100.cu) passes to it (fused_sm100.cu). Every byte
// and column budget is derived here once, with static asserts; docs/sm100.md
// explains the choices.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/epilogue.cuh"
#include "m3qkv/m3qkv.h"
#include "sm100/desc.h"

namespace m3qkv::sm100 {

// Opt-in shared memory per block on the SM100 family (B200/GB200/B300/GB300):
// 227 KB (CUDA C++ Programming Guide, compute capability 10.x table).
constexpr uint32_t kSmemPerBlockOptin = 232448;
// Tensor Memory per SM: 128 lanes × 512 columns × 32 bit (PTX ISA §9.7.16.1).
constexpr uint32_t kTmemColumns = 512;
// Registers per SM (64K 32-bit registers, CC 10.x).
constexpr uint32_t kRegistersPerSm = 65536;

template <int CG>
struct Config {
  static_assert(CG == 1 || CG == 2, "cta_group is 1 or 2");
  static constexpr int kCtaGroup = CG;

  // ---- tile shape --------------------------------------------------------
  static constexpr uint32_t BM = 128;                // A rows per CTA = TMEM lanes
  static constexpr uint32_t BK = 128;                // K per pipeline stage (4 MX blocks)
  static constexpr uint32_t BN = 128 * CG;           // accumulator columns per CTA = MMA N
  static constexpr uint32_t kHeadsPerTile = CG;      // one head per epilogue warpgroup
  static constexpr uint32_t kRowsPerTile = BM * CG;  // token rows per (pair) tile
  static constexpr uint32_t kBRowsPerCta = 128;      // each CTA loads 128 weight rows (half of N at CG 2)
  static constexpr uint32_t UMMA_M = BM * CG;        // m128 (1 SM) or m256 (pair)
  static constexpr uint32_t UMMA_N = BN;
  static constexpr uint32_t UMMA_K = 32;  // kind::mxf8f6f4: K = 32 per MMA, one scale block
  static constexpr uint32_t kMmaPerStage = BK / UMMA_K;
  static_assert(mma_shape_valid(CG, UMMA_M, UMMA_N), "tcgen05.mma shape");
  static_assert(kMmaPerStage == 4, "one 512-B F8_128x4 chunk = 4 scale columns = one BK = 128 stage");

  // ---- shared memory per stage (bytes; identical layout in both CTAs) ----
  static constexpr uint32_t kABytes = BM * BK;               // e4m3 [128][128], 128B-swizzled
  static constexpr uint32_t kBBytes = kBRowsPerCta * BK;     // e4m3 [128][128], 128B-swizzled
  static constexpr uint32_t kSfaBytes = kSfChunkBytes;       // this CTA's 128 rows × 4 scale columns
  static constexpr uint32_t kSfbBytes = kSfChunkBytes * CG;  // all N rows (pair: both halves, multicast)
  static constexpr uint32_t kStageBytes = kABytes + kBBytes + kSfaBytes + kSfbBytes;
  static_assert(kABytes % 1024 == 0 && kBBytes % 1024 == 0, "128B-swizzle tiles need 1024-B alignment");
  // Bytes the leader's full barrier expects per stage: every TMA of the pair
  // signals the even CTA (cta_group::2), and each SFB multicast delivers its
  // 512 B to both CTAs, each delivery counted on the leader.
  static constexpr uint32_t kTxBytesPerStage = CG * (kABytes + kBBytes + kSfaBytes) + CG * CG * kSfChunkBytes;

  // ---- barriers and bookkeeping (after the stages) ------------------------
  static constexpr uint32_t kMaxStages = 8;
  static constexpr uint32_t kNumAccBufs = 2;
  // full[S], empty[S], tmem_full[2], tmem_empty[2], tmem_ovl[2], + TMEM base word
  static constexpr uint32_t kBarrierBytes = (2 * kMaxStages + 3 * kNumAccBufs) * 8 + 16;
  static constexpr uint32_t kAlignSlack = 1024;  // dynamic smem base rounded up to 1024 B in the kernel
  // One slot-owner table per epilogue warpgroup (its head's 128 rows of the
  // tile; common/slot_owners.cuh), after the barriers: 3 KiB each, which the
  // stages leave free (6 stages either way).
  using OwnerTable = epi::SlotOwnerTable<BM>;
  static constexpr uint32_t kOwnersBytes = sizeof(OwnerTable) * CG;
  static constexpr uint32_t kStagesFit = (kSmemPerBlockOptin - kAlignSlack - kBarrierBytes - kOwnersBytes) / kStageBytes;
  static constexpr uint32_t kStages = kStagesFit > kMaxStages ? kMaxStages : kStagesFit;
  static_assert(kStages >= 3, "pipeline needs at least 3 stages");
  static constexpr uint32_t kOwnersOff = kStages * kStageBytes + kBarrierBytes;  // from the aligned base
  static constexpr uint32_t kSmemBytes = kAlignSlack + kOwnersOff + kOwnersBytes;
  static_assert(kOwnersOff % 8 == 0, "owner tables: 8-B words");
  static_assert(kSmemBytes <= kSmemPerBlockOptin, "shared memory budget");
  // > half of the SM's shared memory: one CTA per SM, so TMEM (512 columns)
  // and the register split below are never shared with another CTA of ours.
  static_assert(2 * kSmemBytes > kSmemPerBlockOptin, "one CTA per SM");

  // ---- warps ---------------------------------------------------------------
  static constexpr uint32_t kTmaWarp = 0;
  static constexpr uint32_t kMmaWarp = 1;  // also allocates / frees TMEM
  // cta_group 2: two idle padding warps so warps 0-3 form one warpgroup that
  // can give registers back (setmaxnreg works per warpgroup).
  static constexpr uint32_t kNumNonEpiWarps = CG == 1 ? 2 : 4;
  static constexpr uint32_t kNumEpiWarps = 4 * CG;  // one warpgroup per 128-column head
  static constexpr uint32_t kFirstEpiWarp = kNumNonEpiWarps;
  static constexpr uint32_t kNumThreads = 32 * (kNumNonEpiWarps + kNumEpiWarps);
  // setmaxnreg split (cta_group 2 only). The CTA starts with 65536 / 384 ->
  // 168 registers per thread (ptxas rounds to a multiple of 8) and
  // setmaxnreg moves registers only within that CTA pool (USETMAXREG ...
  // CTAPOOL): an increase waits until enough were released, so the split must
  // satisfy producer·128 + epilogue·256 <= 168·384 = 64512 or the second
  // epilogue warpgroup waits forever. 24·128 + 240·256 = 64512 (the same
  // split FlashAttention-3 uses for three warpgroups). The epilogue needs
  // the 240: its row is 128 live f32 plus the conversions (232 spills).
  static constexpr uint32_t kLaunchRegs = (kRegistersPerSm / kNumThreads) / 8 * 8;
  static constexpr uint32_t kProducerRegs = 24;
  static constexpr uint32_t kEpilogueRegs = 240;
  static_assert(CG == 1 || kProducerRegs * 128 + kEpilogueRegs * 128 * CG <= kLaunchRegs * kNumThreads,
                "register split must fit the CTA's launch-time register pool");
  static_assert(CG == 1 || kNumNonEpiWarps == 4, "producer warps form warpgroup 0");
  // Named barrier of epilogue warpgroup wg (0 is __syncthreads): its owner table's build.
  static constexpr uint32_t kOwnersBarrier0 = 1;

  // ---- Tensor Memory map (columns; every lane) ------------------------------
  // Accumulator buffer b starts at kAccBase[b]. At cta_group 2 two N = 256
  // buffers do not fit next to the scale factors, so buffer 1 starts 32
  // columns early: columns [224, 256) belong to both (head 1 cols 96..127 of
  // buffer 0, head 0 cols 0..31 of buffer 1).
  static constexpr uint32_t kAccBase0 = 0;
  static constexpr uint32_t kAccBase1 = CG == 1 ? BN : BN - 32;
  static constexpr uint32_t kOverlapCols = kAccBase0 + BN > kAccBase1 ? kAccBase0 + BN - kAccBase1 : 0;
  static constexpr uint32_t kAccEnd = kAccBase1 + BN;
  // Scale factors: per slot 4 columns of SFA + 4 per 128 rows of SFB.
  static constexpr uint32_t kSfaCols = 4;
  static constexpr uint32_t kSfbCols = 4 * CG;
  static constexpr uint32_t kSfSlotCols = kSfaCols + kSfbCols;
  static constexpr uint32_t kSfBase = kAccEnd;
  static constexpr uint32_t kSfSlotsFit = (kTmemColumns - kSfBase) / kSfSlotCols;
  static constexpr uint32_t kSfSlots = kSfSlotsFit < kStages ? kSfSlotsFit : kStages;
  static_assert(kSfSlots >= 2, "scale-factor slots: cp of k-block g+1 overlaps the MMAs of g");
  static_assert(kSfBase + kSfSlots * kSfSlotCols <= kTmemColumns, "TMEM budget");
  static_assert(CG == 1 ? kOverlapCols == 0 : kOverlapCols == 32, "overlap of the two accumulators");
  static constexpr uint32_t kTmemAllocCols = kTmemColumns;  // power of 2 in [32, 512]
};

// Everything the kernel needs besides the four tensor maps.
struct Params {
  epi::EpilogueParams ep;
  int64_t m;             // tokens
  int32_t num_heads;     // nq + 2nkv + niq + nik (N / 128)
  int32_t num_k_blocks;  // K / 128
  int32_t num_m_tiles;   // ceil(M / (128·CG))
  int32_t num_n_tiles;   // ceil(num_heads / CG) (odd count at CG 2: a phantom head)
  int32_t num_tiles;
  int32_t group_m;  // grouped-M rasterization width (m-tiles per group)
  float* acc_tap;   // test-only f32 [M, N] accumulator copy, or null
};

struct TensorMaps {
  CUtensorMap a, b, sfa, sfb;
};

// Implemented in fused_sm100.cu (the kernel's translation unit).
template <int CG>
cudaError_t set_kernel_attributes();
// cudaOccupancyMaxActiveClusters with clusters of CG CTAs (-1 when the query fails).
template <int CG>
int max_active_clusters();
template <int CG>
m3qkv_status launch_kernel(const TensorMaps& tm, const Params& p, unsigned grid, bool use_pdl, cudaStream_t s);

}  // namespace m3qkv::sm100
