// The SM90 swap-AB kernel's target for the shared split-K plan
// (src/common/splitk_plan.h, CPU-tested in tests/cpu/test_decode_plan.cpp):
// wgmma N = 16, 32, 64 or 128 tokens per block, any number of blocks.
// docs/sm90.md explains the design.
#pragma once

#include <stdint.h>

#include "common/splitk_plan.h"

namespace m3qkv::sm90 {

// Largest M the plan covers (the kernel's 32-bit token index); token blocks
// of 128 above M = 64, each converting its weight tiles once.
constexpr int64_t kDecodeMaxM = (int64_t{1} << 31) - 256;
// Routing of sm90_fused (docs/sm90.md "Routing"), read off the bench entries
// fused_sm90_fp8 against sm90_decode / sm90_decode_xhat / sm90_tile
// (bench/README.md): bf16 activations take the swap-AB kernel below
// kXbf16PrefillMinM tokens; MXFP8 activations take it up to
// kSwapAbMaxMxfp8M tokens, converted by its transform warps up to
// kSwapAbTransformMaxM and once per call above (decode_converts_x: the
// transform warps would convert them again for every head), and the pre-A /
// prefill tile kernels from 512 tokens, where the swap-AB plan leaves SMs idle
// (e.g. TP4 M = 512: 80 (head, token block) pairs on 132 SMs).
constexpr int64_t kSwapAbTransformMaxM = 32;
constexpr int64_t kSwapAbMaxMxfp8M = 511;
// With few heads (TP8's 12) the tile kernels' unsplit 128-row tiles fill under
// half of the SMs up to 768 tokens (heads · ceil(M/128) <= 72), while the
// swap-AB plan splits K; from 1024 tokens the prefill kernel is faster again
// (bench pairs sm90_decode_xhat / sm90_A_preA / sm90_prefill, CHANGELOG v28, v30).
constexpr int kSwapAbFewHeads = 12;
constexpr int64_t kSwapAbMaxMxfp8MFewHeads = 767;
// bf16 activations take the prefill kernel from kXbf16PrefillMinM tokens:
// they are its x̂ already (only the weights are converted per call); there it
// took 0.71-0.97x this kernel's time on the H200 (TP1 / TP4 / TP8, M 2048 -
// 16384, CHANGELOG v28). At M = 1024 the prefill kernel, even with x
// converted, is 6-12 % slower than this one on every TP (h200.json).
constexpr int64_t kXbf16PrefillMinM = 2048;
constexpr bool decode_preferred(int64_t m, int heads, bool x_bf16) {
  if (m < 1 || m > kDecodeMaxM || heads < 1) return false;
  if (x_bf16) return m < kXbf16PrefillMinM;
  return m <= (heads <= kSwapAbFewHeads ? kSwapAbMaxMxfp8MFewHeads : kSwapAbMaxMxfp8M);
}
constexpr bool decode_converts_x(int64_t m) { return m > kSwapAbTransformMaxM; }
// Most splits the plan considers (a unit is at least one 128-K stage).
constexpr int kDecodeMaxSplit = 64;
// Token blocks = the wgmma N the kernel is instantiated for; no busy-SM rule
// (the cost model alone picks the split, as measured on the H200).
// Partials bounded at 32 MiB (at TP4 M = 1024 that allows split 3 of 8 token blocks).
constexpr int64_t kDecodeMaxPartialBytes = int64_t{32} << 20;
constexpr splitk::Target kDecodeTarget{{16, 32, 64, 128}, 4, kDecodeMaxM, kDecodeMaxSplit, 0, kDecodeMaxPartialBytes};

// The SM90 plan for M tokens (1 <= m <= kDecodeMaxM), `heads` heads of 128
// rows, K = 128·ks, on `num_sms` SMs. split_override > 0 forces S (clamped to
// [1, min(ks, kDecodeMaxSplit)]); grid_override > 0 caps the grid.
inline splitk::Plan plan_decode(int64_t m, int heads, int ks, int num_sms, int split_override = 0,
                                int grid_override = 0) {
  return splitk::plan(kDecodeTarget, m, heads, ks, num_sms, split_override, grid_override);
}
// The same through the per-thread memo (the launcher's per-call path).
inline splitk::Plan plan_decode_memo(int64_t m, int heads, int ks, int num_sms, int split_override = 0,
                                     int grid_override = 0) {
  return splitk::plan_memo(kDecodeTarget, m, heads, ks, num_sms, split_override, grid_override);
}

// Split-K over a cluster: the S units of a (head, token block) run on the S
// CTAs of one 1-D cluster (rank = split s) and meet through distributed
// shared memory, each rank summing and finishing its share of the token rows
// (splitk::finish_unit_ranks): no workspace, no L2 round trips, and the
// epilogue spread over S CTAs instead of one last arriver's.
constexpr int kDecodeMaxCluster = 8;  // portable cluster size
// The model's terms for the two reductions, in cost_x64 units (1/64 stage,
// ~0.5 µs a stage on the H200), read off the bench pairs sm90_decode /
// sm90_decode_l2 and their _xhat forms (bench/results/h200.json, the plan
// counters say which plan ran): the L2 tail grows with the block's tokens
// (partial stores and loads, one CTA's epilogue of every row); a cluster
// launch costs once per call; every unit of a cluster holds all S ranks until
// the slowest has finished, so a cluster walking several short units loses to
// the L2 plan (hence the unit-length floor).
constexpr int64_t kL2TailPerTokenX64 = 6;
constexpr int64_t kClusterCallX64 = 280;
constexpr int64_t kClusterUnitPerTokenX64 = 3;
constexpr int kClusterMinUnitStages = 12;

enum class DecodeReduce : int { kAuto = 0, kL2 = 1, kCluster = 2, kSpread = 3 };

// Whether the L2 plan `l2` can run spread (splitk::Plan::spread): S > 1 and
// every unit resident at once (units <= grid).
constexpr bool spread_fits(const splitk::Plan& l2) {
  return l2.nt > 0 && l2.split > 1 && l2.cluster <= 1 && l2.units <= l2.grid;
}
// The automatic plan spreads from blocks of this many tokens, where the last
// arriver's sum and epilogue of the block's rows set the tail (H200 bench,
// sm90_decode_spread against sm90_decode_l2: 0.78-0.96x from M = 16; at M =
// 1 and 4 the meeting costs more than the one CTA's few rows, 1.02-1.07x).
constexpr int64_t kSpreadMinTokens = 16;

// The plan `l2` (plan_decode's, for the same m, heads, ks, num_sms and
// overrides) in its cluster form where that is cheaper (kAuto) or asked for
// (kCluster), else spread where it fits and is asked for (kSpread) or, by
// default, from kSpreadMinTokens (the plans that went through L2: where the
// cluster model picks clusters, e.g. TP4 M = 64 and 128, the bench has not
// shown spread faster on the converted activations); unchanged otherwise.
// clusters[c]: co-resident clusters of c CTAs (cudaOccupancyMaxActiveClusters;
// 0 = not schedulable or unknown). split_override > 0 keeps the plan's split
// (its clamped override); grid_override > 0 caps the CTAs.
inline splitk::Plan cluster_plan(const splitk::Plan& l2, int64_t m, int heads, int ks, int num_sms, int split_override,
                                 int grid_override, const int (&clusters)[kDecodeMaxCluster + 1], DecodeReduce mode) {
  splitk::Plan spread = l2;
  spread.spread = true;
  const bool spread_ok = spread_fits(l2) && (mode == DecodeReduce::kSpread ||
                                            (mode == DecodeReduce::kAuto && (m < l2.nt ? m : l2.nt) >= kSpreadMinTokens));
  const splitk::Plan& fallback = spread_ok ? spread : l2;
  if (l2.nt == 0 || mode == DecodeReduce::kL2 || mode == DecodeReduce::kSpread) return fallback;
  const int64_t pairs = static_cast<int64_t>(heads) * l2.token_blocks;
  const int64_t cap = grid_override > 0 ? grid_override : num_sms;
  const int s_lo = split_override > 0 ? l2.split : 2;
  const int s_hi = split_override > 0 ? l2.split : (ks < kDecodeMaxCluster ? ks : kDecodeMaxCluster);
  int best = 0;
  int64_t best_cost = -1, best_clusters = 0;
  for (int S = s_lo < 2 ? 2 : s_lo; S <= s_hi && S <= kDecodeMaxCluster; ++S) {
    int64_t nc = clusters[S] < cap / S ? clusters[S] : cap / S;
    if (nc > pairs) nc = pairs;
    if (nc < 1) continue;
    const int64_t rounds = (pairs + nc - 1) / nc;
    // A preference of the model, not a limit: a forced cluster plan (kCluster) may walk short units.
    if (mode == DecodeReduce::kAuto && rounds > 1 && (ks + S - 1) / S < kClusterMinUnitStages) continue;
    // cost_x64's terms (stages, the per-unit hand-off), the unit's lockstep end, the launch.
    const int64_t tokens = m < l2.nt ? m : l2.nt;
    const int64_t cost =
        rounds * (static_cast<int64_t>((ks + S - 1) / S) * 64 + 32 + tokens * kClusterUnitPerTokenX64) +
        kClusterCallX64;
    if (best_cost < 0 || cost < best_cost) best = S, best_cost = cost, best_clusters = nc;
  }
  if (best == 0) return fallback;
  if (mode == DecodeReduce::kAuto) {
    const int64_t per_cta = (l2.units + l2.grid - 1) / l2.grid;
    const int64_t tokens = m < l2.nt ? m : l2.nt;  // the fullest block
    const int64_t l2_cost =
        splitk::cost_x64(per_cta, l2.max_unit_stages, l2.split, tokens) + per_cta * tokens * kL2TailPerTokenX64;
    if (best_cost >= l2_cost) return fallback;
  }
  splitk::Plan p = l2;
  p.split = best;
  p.cluster = best;
  p.units = pairs * best;
  p.grid = static_cast<int>(best_clusters * best);
  p.max_unit_stages = (ks + best - 1) / best;
  p.counter_bytes = 0;
  p.partial_bytes = 0;
  return p;
}

}  // namespace m3qkv::sm90
