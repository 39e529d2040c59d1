// Launch plan of the SM90 fused kernels: tile height, split-K, persistent
// grid. Pure host arithmetic (no CUDA) on the shape, the SM count and the
// cluster occupancy numbers, unit tested on the CPU (tests/cpu/test_plans.cpp);
// launch_sm90.cu builds the parameters and launches what this says.
#pragma once

#include <algorithm>
#include <cstdint>

#include "host/status.h"

namespace m3qkv::sm90 {

constexpr int kPlanBK = 128;      // K per stage (static_assert'ed against kernel_sm90.cuh kBK)
constexpr int kPlanMaxSplit = 8;  // portable cluster size limit (= kSm90MaxSplit)

// precision 1 (the fp8 fast mode) runs its kernel from kFastMinM tokens on
// at least kFastMinHeads heads; elsewhere the exact kernels on the prepared
// weights, which are as fast or faster there. Measured on the H200 (bench
// sm90_fast against fused_sm90_fp8, M 1024-16384): 0.82-0.94x the exact
// time at TP1 / TP2 (77 / 39 heads), 0.97-1.14x at TP4 / TP8 (20 / 11).
constexpr int64_t kFastMinM = 1024;
constexpr int64_t kFastMinHeads = 32;
inline bool fast_preferred(int64_t m, int64_t heads) { return m >= kFastMinM && heads >= kFastMinHeads; }

// The fast kernel's cluster and grid (fast_sm90.cu: 128-row x one-head
// tiles). The cluster: 2 row blocks sharing each weight tile where they
// exist and such clusters fit (automatic: measured fastest, 2-4 % ahead of
// none, and ahead of 2 x 2, whose four CTAs wait on each other's stages),
// else the 2 heads of a lone row block, else one CTA; 4 = 2 x 2 only when
// asked. The persistent grid: one cluster per cluster tile up to the
// resident clusters (num_sms / size where unknown), capped by the caller's grid.
struct FastPlanInput {
  int64_t m_blocks = 0, heads = 0;
  int cluster = 0;  // 0 automatic, 1, 2, 4
  int num_sms = 0;
  int32_t grid = 0;  // the caller's override, 0 = auto
  // Resident clusters of 1, 2, 4 CTAs (index log2; <= 0: not schedulable or unknown).
  int resident[3] = {};
};
struct FastPlan {
  int clu_m = 1, clu_h = 1;
  int grid = 0;
};
inline FastPlan fast_plan(const FastPlanInput& in) {
  int cm = in.m_blocks >= 2 ? 2 : 1, ch = in.heads >= 2 ? 2 : 1;
  if (in.cluster == 1) cm = ch = 1;
  if (in.cluster != 4 && cm * ch == 4) ch = 1;
  if (cm * ch == 4 && in.resident[2] <= 0) ch = 1;
  if (cm * ch == 2 && in.resident[1] <= 0) cm = ch = 1;
  const int csize = cm * ch;
  const int64_t ctiles = ((in.m_blocks + cm - 1) / cm) * ((in.heads + ch - 1) / ch);
  const int res = in.resident[csize / 2];
  int64_t clusters = std::min<int64_t>(ctiles, res > 0 ? res : in.num_sms / csize);
  if (in.grid > 0) clusters = std::min<int64_t>(clusters, std::max(1, in.grid / csize));
  FastPlan f;
  f.clu_m = cm;
  f.clu_h = ch;
  f.grid = static_cast<int>(std::max<int64_t>(1, clusters)) * csize;
  return f;
}

struct PlanInput {
  int64_t m = 0;
  int64_t heads = 0;  // nq + 2 nkv + niq + nik
  int64_t k = 0;
  int num_sms = 0;
  int32_t grid = 0;  // the caller's override, 0 = auto
  int block_m = 0;   // 0 = auto, 64, 128
  int split = 0;     // 0 = auto, 1 = off, 2..8 = forced
  // Resident clusters of c CTAs of the split-K instance that would run
  // (cudaOccupancyMaxActiveClusters), for c = 2..kPlanMaxSplit; <= 0 =
  // not schedulable or unknown: no split of that size is chosen.
  int max_clusters[kPlanMaxSplit + 1] = {};
};

struct Plan {
  int cons = 1;  // consumer warpgroups: 1 (BM = 64) or 2 (BM = 128)
  int bm = 64;
  int64_t m_blocks = 0;
  int64_t tiles = 0;
  int split = 1;  // CTAs per tile (cluster size); 1 = no split
  int grid = 0;   // CTAs (a multiple of split)
};

// Split-K cost model, fitted on the H200 (TP4, K = 6144, M = 1 / 64 / 128 /
// 512, cluster sizes 1..8; docs/sm90.md "Performance log" step 2), in stage
// times: waves · (kFixed + ceil(ks / sp) + (sp - 1) · kRank), waves from the
// resident clusters. A stage costs ~1.2 (B) / 1.5 (A) us per CTA, a wave
// ~12 us besides its stages (~8 stages), each extra rank ~1.4 us (the
// leader's DSMEM pull, ~1 stage).
constexpr int64_t kSplitFixedStages = 8;
constexpr int64_t kSplitRankStages = 1;

inline m3qkv_status plan(const char* fn, const PlanInput& in, Plan* out) {
  if (in.block_m != 0 && in.block_m != 64 && in.block_m != 128)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT, "%s: block_m = %d is not 0, 64 or 128", fn, in.block_m);
  if (in.split < 0 || in.split > kPlanMaxSplit)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT, "%s: split = %d is not in [0, %d]", fn, in.split, kPlanMaxSplit);
  if (in.m > INT32_MAX - 256 || in.k / kPlanBK > INT32_MAX)
    return fail(M3QKV_ERROR_TOO_LARGE, "%s: m = %lld exceeds the SM90 kernel's 32-bit row index", fn,
                static_cast<long long>(in.m));
  Plan p;
  // Tile height: two consumer warpgroups (BM = 128) when that already gives
  // every SM a tile; otherwise BM = 64 doubles the tile count for M > 64 (and
  // for M <= 64 drops the idle second warpgroup). Decode sizes (M <= 64) still
  // run one tile per head: the cluster split-K design (docs/sm90.md) is what
  // fills the machine there.
  const int64_t tiles128 = (in.m + 127) / 128 * in.heads;
  p.cons = in.block_m == 64 ? 1 : in.block_m == 128 ? 2 : (tiles128 < in.num_sms ? 1 : 2);
  p.bm = 64 * p.cons;
  p.m_blocks = (in.m + p.bm - 1) / p.bm;
  p.tiles = p.m_blocks * in.heads;
  if (p.tiles > INT32_MAX)
    return fail(M3QKV_ERROR_TOO_LARGE, "%s: %lld tiles exceed the SM90 scheduler's 32-bit index", fn,
                static_cast<long long>(p.tiles));

  // Split-K with 64-row tiles (chosen when 128-row tiles would leave SMs
  // idle): at decode sizes the tiles (one per head) leave most SMs idle, and
  // a few more tiles than SMs (M = 512 at TP4: 160 tiles) run in 2 waves; a
  // cluster of `sp` CTAs sharing a tile, each K / sp, fixes both. Automatic
  // choice: the smallest modelled time (above).
  const int ks = static_cast<int>(in.k / kPlanBK);
  if (in.split > 1) {
    if (p.cons != 1)
      return fail(M3QKV_ERROR_INVALID_ARGUMENT, "%s: split-K needs 64-row tiles (block_m %d, M %lld gives 128)", fn,
                  in.block_m, static_cast<long long>(in.m));
    p.split = in.split < ks ? in.split : ks;
  } else if (in.split == 0 && p.cons == 1) {
    const int64_t sms = in.num_sms > 0 ? in.num_sms : 1;
    int64_t best = ((p.tiles + sms - 1) / sms) * (kSplitFixedStages + ks);
    for (int c = 2; c <= kPlanMaxSplit && c <= ks; ++c) {
      const int64_t mc = in.max_clusters[c];
      if (mc <= 0) continue;
      const int64_t cost = ((p.tiles + mc - 1) / mc) * (kSplitFixedStages + (ks + c - 1) / c + (c - 1) * kSplitRankStages);
      if (cost < best) {
        best = cost;
        p.split = c;
      }
    }
  }

  // Persistent grid: with split-K as many clusters as are resident (the
  // override asks for max(1, grid / split) clusters), else one CTA per SM;
  // never more than one cluster / CTA per tile.
  int64_t grid;
  if (p.split > 1) {
    const int64_t mc = in.max_clusters[p.split];
    int64_t clusters = in.grid > 0 ? in.grid / p.split : (mc > 0 ? mc : 1);
    if (clusters < 1) clusters = 1;
    if (clusters > p.tiles) clusters = p.tiles;
    grid = clusters * p.split;
  } else {
    const int64_t auto_grid = p.tiles < in.num_sms ? p.tiles : in.num_sms;
    grid = in.grid > 0 ? (in.grid < p.tiles ? in.grid : p.tiles) : auto_grid;
  }
  p.grid = static_cast<int>(grid);
  *out = p;
  return M3QKV_SUCCESS;
}

// Prefill step 1 (docs/sm90.md): variant A with the activations converted
// once per call into the stream workspace (x̂, M·K·2 bytes after its zeroed
// head) applies to the 128-row tiles without split-K, i.e. where the tiles
// already fill the SMs. Capped at kPreAMaxBytes of x̂ (M = 43690 at K =
// 6144): past it the call runs variant A instead of growing the workspace.
constexpr int64_t kPreAMaxBytes = int64_t{512} << 20;
// The automatic choice's tile height from M = kPreAMinM up: 128 rows (so the
// pre-A / prefill instances), even where 128-row tiles leave SMs idle: the
// 64-row split-K plan lost at TP4 / TP8 M = 512 and 1024 (bench entries
// sm90_A_regs against sm90_A_preA). Below it the plan decides.
constexpr int64_t kPreAMinM = 512;
inline int auto_block_m(int64_t m) { return m >= kPreAMinM ? 128 : 0; }
// From M = kPrefillMinM the automatic choice is the prefill kernel (both
// operands converted per call; ŵ costs N·K·3 bytes whatever M) where it
// applies: sm90_prefill beats sm90_A_preA from M = 1024 at every TP (at
// M = 512 the conversion of ŵ is not amortized).
constexpr int64_t kPrefillMinM = 1024;
inline bool prefer_prefill(int64_t m) { return m >= kPrefillMinM; }
inline bool pre_a_applies(const Plan& p, int64_t m, int64_t k) {
  return p.cons == 2 && p.split == 1 && m > 0 && k > 0 && m <= kPreAMaxBytes / 2 / k;
}
// Prefill step 2 (both operands converted: x̂ and ŵ, (M + N)·K·2 bytes of
// workspace, the same cap) on the same plans.
// With bf16 activations (x_bf16) x̂ is the caller's tensor: only ŵ is in the
// workspace (N·K·2 bytes, the same cap).
inline bool prefill_applies(const Plan& p, int64_t m, int64_t n, int64_t k, bool x_in_workspace = true) {
  if (!(p.cons == 2 && p.split == 1 && m > 0 && n > 0 && k > 0)) return false;
  return x_in_workspace ? m <= kPreAMaxBytes / 2 / k - n : n <= kPreAMaxBytes / 2 / k;
}
// The grid of the one-launch pre-A and prefill kernels, which convert their
// operands before the mainloop (convert_sm90.cuh): one CTA per SM even where
// there are fewer tiles (the extra CTAs convert, meet at the grid barrier
// and leave), so that every SM converts (a grid of only the tiles' CTAs left
// the conversion on fewer SMs: slower at TP8 M = 1024, 96 tiles). A caller's
// grid override stands as the plan set it.
inline int one_launch_grid(const Plan& p, int num_sms, int32_t override_grid) {
  if (override_grid > 0 || p.grid >= num_sms) return p.grid;
  return num_sms;
}

}  // namespace m3qkv::sm90
