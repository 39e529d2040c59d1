// Launch plans of the SM100 kernels: which kernel (the tile kernel or, for
// small M, the decode variant), and for the tile kernel cta_group, tiles,
// grouped-M width and persistent grid; the decode variant's split-K plan is
// src/common/splitk_plan.h with the target below. Pure host arithmetic (no
// CUDA) on the shape, the device facts and the cluster occupancy, unit tested
// on the CPU (tests/cpu/test_plans.cpp, tests/cpu/test_decode_plan.cpp);
// launch_sm100.cu builds the parameters and launches what this says.
#pragma once

#include <cstdint>

#include "common/layouts.h"
#include "common/splitk_plan.h"
#include "host/status.h"

namespace m3qkv::sm100 {

// ------------------------------------------------------------ decode variant
namespace decode {
// Largest M the decode variant takes: one token block (MMA N <= 128,
// decode_config.h), so every weight byte is streamed from HBM once and enters
// one SM. (The split-K plan would take two blocks; whether the decode variant
// still beats the tile kernel at 129..256 tokens, where the tile kernel has
// 2·heads tiles and no reduction, needs a Blackwell measurement.)
constexpr int64_t kMaxM = 128;
// Most splits considered (a unit is at least one 128-K stage).
constexpr int kMaxSplit = 64;
// Token blocks NT = 32, 64, 128 (MMA N; not 8 or 16: decode_config.h
// sfx_col_offset says why). At least 90 % of the SMs stream weights whenever
// some split allows it (issue 15), else the cost model alone decides.
constexpr splitk::Target kTarget{{32, 64, 128}, 3, kMaxM, kMaxSplit, 90};
}  // namespace decode

// The kernel for M tokens and the caller's cta_group (0 = auto, 1, 2): the
// decode variant for 1 <= M <= decode::kMaxM, where the tile kernel would run
// one CTA per head (TP4: 20 of 148 SMs) while the work is streaming the
// weights; unless cta_group 2 is asked for (the decode variant is a 1-SM
// kernel; pairs stay the tile kernel's).
inline bool uses_decode(int64_t m, int cta_group) { return m >= 1 && m <= decode::kMaxM && cta_group != 2; }

// The decode variant's plan (heads of 128 rows, K = 128·ks, num_sms SMs;
// split / grid overrides as splitk::plan).
inline splitk::Plan plan_decode(int64_t m, int heads, int ks, int num_sms, int split_override = 0,
                                int grid_override = 0) {
  return splitk::plan(decode::kTarget, m, heads, ks, num_sms, split_override, grid_override);
}
// The same through the per-thread memo (the launcher's per-call path).
inline splitk::Plan plan_decode_memo(int64_t m, int heads, int ks, int num_sms, int split_override = 0,
                                     int grid_override = 0) {
  return splitk::plan_memo(decode::kTarget, m, heads, ks, num_sms, split_override, grid_override);
}

// --------------------------------------------------------------- tile kernel

struct PlanInput {
  int64_t m = 0;
  int64_t k = 0;
  int heads = 0;      // nq + 2 nkv + niq + nik
  int cta_group = 0;  // the caller's: 0 = auto, 1, 2
  int32_t grid = 0;   // the caller's override, 0 = auto
  int num_sms = 0;
  int l2_bytes = 0;
  // cudaOccupancyMaxActiveClusters of the cta_group cg instance, [cg] for
  // cg = 1, 2; <= 0 = unknown (then one cluster per cg SMs).
  int resident_clusters[3] = {};
};

struct Plan {
  int cta_group = 1;
  int64_t num_m_tiles = 0;  // ceil(M / (128·cta_group))
  int64_t num_n_tiles = 0;  // ceil(heads / cta_group) (odd count at 2: a phantom head)
  int64_t num_tiles = 0;
  int group_m = 1;  // grouped-M rasterization width (m-tiles per group)
  unsigned grid = 0;  // CTAs, a multiple of cta_group
};

inline int64_t plan_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// cta_group by wave quantization. Unit of time: one 128×128×K tile on one
// SM. cta_group 1 runs tiles1 = ceil(M/128)·heads such tiles, num_sms at a
// time. cta_group 2 runs tiles2 = ceil(M/256)·ceil(heads/2) pair tiles
// (256×256, 4 units of work on 2 SMs = 2 units of time), num_sms/2 at a time.
// Padding (M tail, the phantom head of an odd head count) counts as work.
// Ties go to cta_group 2: half the B traffic per FLOP and one N = 256 MMA.
inline int choose_cta_group(int64_t m, int heads, int num_sms) {
  if (num_sms < 2) return 1;
  const int64_t tiles1 = plan_ceil_div(m, 128) * heads;
  const int64_t tiles2 = plan_ceil_div(m, 256) * plan_ceil_div(heads, 2);
  const int64_t time1 = plan_ceil_div(tiles1, num_sms);
  const int64_t time2 = 2 * plan_ceil_div(tiles2, num_sms / 2);
  return time2 <= time1 ? 2 : 1;
}

// Grouped-M width: when the weights fit in half the L2 they stay resident
// whatever the order (group 1: heads fastest); otherwise groups of up to 16
// m-tiles walk m fastest so the CTAs running together share weight tiles.
inline int choose_group_m(int64_t n, int64_t k, int64_t num_m_tiles, int l2_bytes) {
  const int64_t weight_bytes = n * k;
  if (l2_bytes > 0 && weight_bytes <= static_cast<int64_t>(l2_bytes) / 2) return 1;
  return static_cast<int>(num_m_tiles < 16 ? num_m_tiles : 16);
}

inline m3qkv_status plan(const char* fn, const PlanInput& in, Plan* out) {
  Plan p;
  p.cta_group = in.cta_group == 1 || in.cta_group == 2 ? in.cta_group : choose_cta_group(in.m, in.heads, in.num_sms);
  const int cg = p.cta_group;
  const int64_t n = static_cast<int64_t>(in.heads) * kHeadDim;
  p.num_m_tiles = plan_ceil_div(in.m, 128 * cg);
  p.num_n_tiles = plan_ceil_div(in.heads, cg);
  p.num_tiles = p.num_m_tiles * p.num_n_tiles;
  // Kernel coordinates are int32: rows of A (incl. the pair's padding), SF
  // rows of 256 B, tile indices.
  const int64_t sfa_bytes = f8_128x4_bytes(in.m, in.k / kMxBlock);
  if (p.num_m_tiles * 128 * cg > INT32_MAX || sfa_bytes / 256 > INT32_MAX || p.num_tiles > INT32_MAX)
    return fail(M3QKV_ERROR_TOO_LARGE, "%s: m = %lld, k = %lld exceed the SM100 kernel's 32-bit tile coordinates", fn,
                static_cast<long long>(in.m), static_cast<long long>(in.k));
  p.group_m = choose_group_m(n, in.k, p.num_m_tiles, in.l2_bytes);
  // Persistent grid: as many clusters as can be resident, at most one per
  // tile; `grid` overrides the CTA count (rounded down to whole clusters, at
  // least one, at most one per tile).
  int64_t clusters;
  if (in.grid > 0) {
    clusters = in.grid / cg > 0 ? in.grid / cg : 1;
  } else {
    const int resident = in.resident_clusters[cg];
    clusters = resident > 0 ? resident : in.num_sms / cg;
    if (clusters < 1) clusters = 1;
  }
  if (clusters > p.num_tiles) clusters = p.num_tiles;
  p.grid = static_cast<unsigned>(clusters * cg);
  *out = p;
  return M3QKV_SUCCESS;
}

}  // namespace m3qkv::sm100
