// The launch plans of the three backends (src/portable/plan.h,
// src/sm90/plan_sm90.h, src/sm100/plan.h): pure functions of the shape, the
// device facts and the occupancy numbers, checked against values worked out
// by hand from the rules written next to each function.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <string>

#include "m3qkv/m3qkv.h"
#include "portable/plan.h"
#include "sm100/plan.h"
#include "sm90/plan_sm90.h"

namespace {

// ---------------------------------------------------------------- portable
TEST(PortablePlan, OneCtaPerWorkItemGroup) {
  EXPECT_EQ(m3qkv::portable::plan_grid(20, 1, 0), 20u);
  EXPECT_EQ(m3qkv::portable::plan_grid(140, 128, 0), 2u);  // insert: TP4 M 7 = 140 head rows, 128 per CTA
  EXPECT_EQ(m3qkv::portable::plan_grid(128, 128, 0), 1u);
  EXPECT_EQ(m3qkv::portable::plan_grid(0, 128, 0), 1u);
  EXPECT_EQ(m3qkv::portable::plan_grid(int64_t{1} << 40, 1, 0), static_cast<unsigned>(INT_MAX));
}

TEST(PortablePlan, OverrideIsClampedToTheWorkItems) {
  EXPECT_EQ(m3qkv::portable::plan_grid(20, 1, 7), 7u);
  EXPECT_EQ(m3qkv::portable::plan_grid(20, 1, 20), 20u);
  EXPECT_EQ(m3qkv::portable::plan_grid(20, 1, 21), 20u);
  EXPECT_EQ(m3qkv::portable::plan_grid(20, 1, INT32_MAX), 20u) << "grid = INT32_MAX would launch 2^31 CTAs";
  EXPECT_EQ(m3qkv::portable::plan_grid(140, 128, INT32_MAX), 2u);
  EXPECT_EQ(m3qkv::portable::plan_grid(140, 128, 1), 1u);
}

// The insert's lane layout by head rows per SM R (plan.h; 132 SMs). FP8 /
// BF16: warp rows up to 6 per SM (792 rows); split c32q8 up to 80 (10560);
// quad rows up to 200 (26400); split c16q8 up to 1200 (158400); quad above.
// NVFP4: split c32q8 from the first row up to 80, split c16q8 up to 800
// (105600), quad above. Cache-heavy layouts (4 · cache heads >= heads):
// c32q8 up to 25 (3300), c16q8 + guess up to 100 (13200), then c16q8 (FP8 /
// BF16: up to 200, then 8-lane rows up to 1200). Each layout's work items;
// forced layouts and the grid override honoured. Hand-worked edges for TP4
// (20 heads, 3 cache), TP8 (12, 3: cache-heavy) and TP1 (77, 9).
TEST(PortablePlan, InsertLayoutByHeadRowsPerSm) {
  using m3qkv::portable::InsertLayout;
  using m3qkv::portable::insert_plan;
  namespace pp = m3qkv::portable;
  static_assert(pp::kInsertWarpRowsPerSmFlat == 6 && pp::kInsertC32Q8RowsPerSm == 80 &&
                    pp::kInsertC32Q8RowsPerSmHeavy == 25 && pp::kInsertC16Q8GuessRowsPerSmHeavy == 100 &&
                    pp::kInsertQuadBandRowsPerSm == 200 && pp::kInsertShortChainRowsPerSmNvfp4 == 800 &&
                    pp::kInsertShortChainRowsPerSmFlat == 1200,
                "the cases below are worked for these thresholds");
  auto layout = [](int64_t m, int heads, int cache, bool nvfp4, int sms = 132) {
    return insert_plan(m, heads, cache, nvfp4, sms, 0, InsertLayout::kAuto).layout;
  };
  // The automatic plan of (m, heads, cache, nvfp4) on 132 SMs, field by field.
  auto expect_plan = [](int64_t m, int heads, int cache, bool nvfp4, InsertLayout want, int64_t cache_items,
                        int64_t items, unsigned grid) {
    const auto q = insert_plan(m, heads, cache, nvfp4, 132, 0, InsertLayout::kAuto);
    EXPECT_EQ(q.layout, want) << "M = " << m << ", " << heads << " heads";
    EXPECT_EQ(q.cache_items, cache_items) << "M = " << m;
    EXPECT_EQ(q.items, items) << "M = " << m;
    EXPECT_EQ(q.grid, grid) << "M = " << m;
  };
  // TP4 FP8 M = 1: 20 warps in 5 CTAs of 4.
  expect_plan(1, 20, 3, false, InsertLayout::kWarpRows, 0, 20, 5);
  // TP4 FP8: M = 39 -> 780 rows (warp), 40 -> 800: split c32q8, 40 rows x 3
  // cache heads, then 10 groups of 4 x 17 q / index_q heads (290 warps, 73
  // CTAs); 528 -> 10560 (c32q8), 529: quad rows, 67 groups of 8 x 20, up to
  // 1320 (26400); 1321: split c16q8 (661 row pairs x 3 + 331 groups x 17) up
  // to 7920 (158400); 7921: quad.
  EXPECT_EQ(layout(39, 20, 3, false), InsertLayout::kWarpRows);
  expect_plan(40, 20, 3, false, InsertLayout::kSplitC32Q8, 40 * 3, 40 * 3 + 10 * 17, 73);
  EXPECT_EQ(layout(528, 20, 3, false), InsertLayout::kSplitC32Q8);
  expect_plan(529, 20, 3, false, InsertLayout::kQuadRows, 0, 67 * 20, 335);
  EXPECT_EQ(layout(1320, 20, 3, false), InsertLayout::kQuadRows);
  expect_plan(1321, 20, 3, false, InsertLayout::kSplitC16Q8, 661 * 3, 661 * 3 + 331 * 17, 1903);
  EXPECT_EQ(layout(7920, 20, 3, false), InsertLayout::kSplitC16Q8);
  EXPECT_EQ(layout(7921, 20, 3, false), InsertLayout::kQuadRows);
  // TP4 NVFP4: M = 1 already split c32q8 (3 cache heads + 1 group x 17); up
  // to 528, then split c16q8 up to 5280 (105600), 5281: quad.
  expect_plan(1, 20, 3, true, InsertLayout::kSplitC32Q8, 3, 3 + 17, 5);
  EXPECT_EQ(layout(528, 20, 3, true), InsertLayout::kSplitC32Q8);
  expect_plan(529, 20, 3, true, InsertLayout::kSplitC16Q8, 265 * 3, 265 * 3 + 133 * 17, 764);
  EXPECT_EQ(layout(5280, 20, 3, true), InsertLayout::kSplitC16Q8);
  EXPECT_EQ(layout(5281, 20, 3, true), InsertLayout::kQuadRows);
  // TP8 (cache-heavy: 4 · 3 >= 12). FP8: warp rows up to M = 66 (792), c32q8
  // up to 275 (3300), c16q8 + guess up to 1100 (13200), c16q8 up to 2200
  // (26400), 8-lane up to 13200 (158400), quad from 13201. NVFP4: c32q8 up
  // to 275, c16q8 + guess from 276 (138 row pairs x 3 + 69 groups x 9 = 1035
  // warps, 259 CTAs) up to 1100, c16q8 up to 8800 (105600), quad from 8801.
  EXPECT_EQ(layout(66, 12, 3, false), InsertLayout::kWarpRows);
  EXPECT_EQ(layout(67, 12, 3, false), InsertLayout::kSplitC32Q8);
  EXPECT_EQ(layout(275, 12, 3, false), InsertLayout::kSplitC32Q8);
  EXPECT_EQ(layout(276, 12, 3, false), InsertLayout::kSplitC16Q8Guess);
  EXPECT_EQ(layout(1100, 12, 3, false), InsertLayout::kSplitC16Q8Guess);
  EXPECT_EQ(layout(1101, 12, 3, false), InsertLayout::kSplitC16Q8);
  EXPECT_EQ(layout(2200, 12, 3, false), InsertLayout::kSplitC16Q8);
  EXPECT_EQ(layout(2201, 12, 3, false), InsertLayout::kLane8Rows);
  EXPECT_EQ(layout(13200, 12, 3, false), InsertLayout::kLane8Rows);
  EXPECT_EQ(layout(13201, 12, 3, false), InsertLayout::kQuadRows);
  EXPECT_EQ(layout(1, 12, 3, true), InsertLayout::kSplitC32Q8);
  EXPECT_EQ(layout(275, 12, 3, true), InsertLayout::kSplitC32Q8);
  expect_plan(276, 12, 3, true, InsertLayout::kSplitC16Q8Guess, 138 * 3, 138 * 3 + 69 * 9, 259);
  EXPECT_EQ(layout(1100, 12, 3, true), InsertLayout::kSplitC16Q8Guess);
  EXPECT_EQ(layout(1101, 12, 3, true), InsertLayout::kSplitC16Q8);
  EXPECT_EQ(layout(8800, 12, 3, true), InsertLayout::kSplitC16Q8);
  EXPECT_EQ(layout(8801, 12, 3, true), InsertLayout::kQuadRows);
  // One more head without a cache row is no longer cache-heavy (4 · 3 < 13):
  // FP8 M = 276 (3588 rows) keeps c32q8, M = 813 (10569 > 10560) takes quad rows.
  EXPECT_EQ(layout(276, 13, 3, false), InsertLayout::kSplitC32Q8);
  EXPECT_EQ(layout(813, 13, 3, false), InsertLayout::kQuadRows);
  // TP1 (77 heads, 9 cache). FP8: warp rows up to M = 10 (770), c32q8 up to
  // 137 (10549), quad up to 342 (26334), c16q8 up to 2057 (158389), quad
  // from 2058. NVFP4: c32q8 up to 137, c16q8 up to 1371 (105567), quad from
  // 1372. Fewer SMs move the edges.
  EXPECT_EQ(layout(10, 77, 9, false), InsertLayout::kWarpRows);
  EXPECT_EQ(layout(11, 77, 9, false), InsertLayout::kSplitC32Q8);
  EXPECT_EQ(layout(10, 77, 9, false, 100), InsertLayout::kSplitC32Q8);
  EXPECT_EQ(layout(137, 77, 9, false), InsertLayout::kSplitC32Q8);
  EXPECT_EQ(layout(138, 77, 9, false), InsertLayout::kQuadRows);
  EXPECT_EQ(layout(342, 77, 9, false), InsertLayout::kQuadRows);
  EXPECT_EQ(layout(343, 77, 9, false), InsertLayout::kSplitC16Q8);
  EXPECT_EQ(layout(2057, 77, 9, false), InsertLayout::kSplitC16Q8);
  EXPECT_EQ(layout(2058, 77, 9, false), InsertLayout::kQuadRows);
  EXPECT_EQ(layout(1, 77, 9, true), InsertLayout::kSplitC32Q8);
  EXPECT_EQ(layout(137, 77, 9, true), InsertLayout::kSplitC32Q8);
  EXPECT_EQ(layout(138, 77, 9, true), InsertLayout::kSplitC16Q8);
  EXPECT_EQ(layout(1371, 77, 9, true), InsertLayout::kSplitC16Q8);
  EXPECT_EQ(layout(1372, 77, 9, true), InsertLayout::kQuadRows);
  // Forced at any size; the split layouts' two item kinds (M = 5: 3 row pairs
  // x 3 cache heads + 2 groups of 4 x 17; c32q8: 5 x 3 + 2 x 17).
  auto p = insert_plan(16384, 20, 3, false, 132, 0, InsertLayout::kWarpRows);
  EXPECT_EQ(p.layout, InsertLayout::kWarpRows);
  EXPECT_EQ(p.items, 16384 * 20);
  // Slot ownership resolved for the whole call from kOwnerPassMinM rows, where there are cache heads.
  EXPECT_TRUE(p.owner_passes);
  EXPECT_TRUE(insert_plan(m3qkv::portable::kOwnerPassMinM, 20, 3, true, 132, 0, InsertLayout::kAuto).owner_passes);
  EXPECT_FALSE(insert_plan(m3qkv::portable::kOwnerPassMinM - 1, 20, 3, true, 132, 0, InsertLayout::kAuto).owner_passes);
  EXPECT_FALSE(insert_plan(16384, 20, 0, true, 132, 0, InsertLayout::kAuto).owner_passes);
  p = insert_plan(1, 20, 3, true, 132, 0, InsertLayout::kQuadRows);
  EXPECT_EQ(p.layout, InsertLayout::kQuadRows);
  EXPECT_EQ(p.items, 20);
  p = insert_plan(5, 20, 3, false, 132, 0, InsertLayout::kSplitC16Q8);
  EXPECT_EQ(p.layout, InsertLayout::kSplitC16Q8);
  EXPECT_EQ(p.cache_items, 9);
  EXPECT_EQ(p.items, 9 + 34);
  EXPECT_EQ(p.grid, 11u);
  p = insert_plan(5, 20, 3, false, 132, 0, InsertLayout::kSplitC16Q8Guess);
  EXPECT_EQ(p.layout, InsertLayout::kSplitC16Q8Guess);
  EXPECT_EQ(p.cache_items, 9);
  EXPECT_EQ(p.items, 9 + 34);
  p = insert_plan(5, 20, 3, true, 132, 0, InsertLayout::kSplitC32Q8);
  EXPECT_EQ(p.cache_items, 15);
  EXPECT_EQ(p.items, 15 + 34);
  p = insert_plan(5, 20, 3, false, 132, 0, InsertLayout::kLane8Rows);
  EXPECT_EQ(p.layout, InsertLayout::kLane8Rows);
  EXPECT_EQ(p.cache_items, 0);
  EXPECT_EQ(p.items, 2 * 20);
  EXPECT_EQ(p.grid, 10u);
  EXPECT_EQ(insert_plan(8, 20, 3, false, 132, 0, InsertLayout::kLane8Rows).items, 2 * 20);
  EXPECT_EQ(insert_plan(9, 20, 3, false, 132, 0, InsertLayout::kLane8Rows).items, 3 * 20);
  // The grid override clamps as plan_grid does.
  EXPECT_EQ(insert_plan(1, 20, 3, false, 132, 3, InsertLayout::kAuto).grid, 3u);
  EXPECT_EQ(insert_plan(1, 20, 3, false, 132, INT32_MAX, InsertLayout::kAuto).grid, 5u);
}

TEST(PortablePlan, GemmTiles) {
  EXPECT_EQ(m3qkv::portable::gemm_tiles(7, 2560, 64, 128), 20);
  EXPECT_EQ(m3qkv::portable::gemm_tiles(64, 2560, 64, 128), 20);
  EXPECT_EQ(m3qkv::portable::gemm_tiles(65, 2560, 64, 128), 40);
  EXPECT_EQ(m3qkv::portable::gemm_tiles(4096, 9856, 64, 128), 64 * 77);
}

// -------------------------------------------------------------------- SM90
namespace sm90 = m3qkv::sm90;

// H200-like: 132 SMs, resident clusters of c CTAs as the occupancy query could answer.
sm90::PlanInput h200(int64_t m, int64_t heads, int64_t k = 6144) {
  sm90::PlanInput in;
  in.m = m;
  in.heads = heads;
  in.k = k;
  in.num_sms = 132;
  const int mc[] = {0, 0, 66, 44, 32, 26, 22, 18, 16};
  for (int c = 0; c <= sm90::kPlanMaxSplit; ++c) in.max_clusters[c] = mc[c];
  return in;
}

sm90::Plan plan90(const sm90::PlanInput& in) {
  sm90::Plan p;
  EXPECT_EQ(sm90::plan("test", in, &p), M3QKV_SUCCESS) << m3qkv_last_error();
  return p;
}

TEST(Sm90Plan, DecodeSplitsKOverClusters) {
  // TP4 M 1: 20 tiles of 64 rows, ks 48. Modelled costs (one wave each):
  // none 56, c=2 33, 3 26, 4 23, 5 22, 6 21, 7 21, 8 21: the first minimum is 6.
  const sm90::Plan p = plan90(h200(1, 20));
  EXPECT_EQ(p.cons, 1);
  EXPECT_EQ(p.bm, 64);
  EXPECT_EQ(p.m_blocks, 1);
  EXPECT_EQ(p.tiles, 20);
  EXPECT_EQ(p.split, 6);
  EXPECT_EQ(p.grid, 20 * 6) << "one cluster per tile: 22 resident, 20 tiles";
}

TEST(Sm90Plan, TwoWavesPreferTheCheapestSplit) {
  // TP4 M 512: 80 tiles of 128 rows < 132 SMs -> BM 64, 160 tiles, 2 waves
  // unsplit (112); c=2: 3 waves x 33 = 99; c=3: 4 x 26 = 104; c=4: 5 x 23 = 115.
  const sm90::Plan p = plan90(h200(512, 20));
  EXPECT_EQ(p.bm, 64);
  EXPECT_EQ(p.tiles, 160);
  EXPECT_EQ(p.split, 2);
  EXPECT_EQ(p.grid, 66 * 2);
}

TEST(Sm90Plan, UnknownOccupancyMeansNoSplit) {
  sm90::PlanInput in = h200(1, 20);
  for (int& c : in.max_clusters) c = 0;
  const sm90::Plan p = plan90(in);
  EXPECT_EQ(p.split, 1);
  EXPECT_EQ(p.grid, 20);
}

TEST(Sm90Plan, PrefillUses128RowTilesAndOneCtaPerSm) {
  // TP4 M 4096: 32 x 20 = 640 tiles of 128 rows >= 132 SMs.
  const sm90::Plan p = plan90(h200(4096, 20));
  EXPECT_EQ(p.cons, 2);
  EXPECT_EQ(p.bm, 128);
  EXPECT_EQ(p.tiles, 640);
  EXPECT_EQ(p.split, 1) << "no split-K with two consumer warpgroups";
  EXPECT_EQ(p.grid, 132);
}

TEST(Sm90Plan, PrefillInstanceWhereTheTilesFillTheSms) {
  // Activations pre-converted (variant 2) on the 128-row, unsplit plans only.
  // TP4 (20 heads): 7 x 20 = 140 tiles of 128 rows from M = 769; 6 x 20 = 120 < 132 below.
  EXPECT_TRUE(sm90::pre_a_applies(plan90(h200(4096, 20)), 4096, 6144));
  EXPECT_TRUE(sm90::pre_a_applies(plan90(h200(769, 20)), 769, 6144));
  EXPECT_FALSE(sm90::pre_a_applies(plan90(h200(768, 20)), 768, 6144)) << "64-row tiles";
  EXPECT_FALSE(sm90::pre_a_applies(plan90(h200(512, 20)), 512, 6144)) << "64-row tiles with split-K";
  EXPECT_FALSE(sm90::pre_a_applies(plan90(h200(1, 20)), 1, 6144));
  // TP1 (77 heads): 2 x 77 = 154 tiles from M = 129.
  EXPECT_TRUE(sm90::pre_a_applies(plan90(h200(129, 77)), 129, 6144));
  EXPECT_FALSE(sm90::pre_a_applies(plan90(h200(128, 77)), 128, 6144));
  // Forced 128-row tiles apply at any M; forced 64-row tiles never.
  sm90::PlanInput in = h200(1, 20);
  in.block_m = 128;
  EXPECT_TRUE(sm90::pre_a_applies(plan90(in), 1, 6144));
  in = h200(4096, 20);
  in.block_m = 64;
  EXPECT_FALSE(sm90::pre_a_applies(plan90(in), 4096, 6144));
  // The x̂ cap: M·K·2 <= 512 MiB (M = 43690 at K = 6144), then variant A.
  EXPECT_TRUE(sm90::pre_a_applies(plan90(h200(43690, 20)), 43690, 6144));
  EXPECT_FALSE(sm90::pre_a_applies(plan90(h200(43691, 20)), 43691, 6144));
}

TEST(Sm90Plan, AutomaticChoiceTakesTheHighTilesFromM512) {
  // From M = 512 the automatic variant asks for 128-row tiles, so the prefill
  // instance runs even where they leave SMs idle (TP4 M 512: 80 tiles).
  EXPECT_EQ(sm90::auto_block_m(511), 0);
  EXPECT_EQ(sm90::auto_block_m(512), 128);
  EXPECT_EQ(sm90::auto_block_m(1 << 20), 128);
  sm90::PlanInput in = h200(512, 20);
  in.block_m = sm90::auto_block_m(in.m);
  const sm90::Plan p = plan90(in);
  EXPECT_EQ(p.tiles, 80);
  EXPECT_EQ(p.grid, 80);
  EXPECT_TRUE(sm90::pre_a_applies(p, 512, 6144));
  in = h200(1024, 12);  // TP8: 96 tiles of 128 rows
  in.block_m = sm90::auto_block_m(in.m);
  EXPECT_TRUE(sm90::pre_a_applies(plan90(in), 1024, 6144));
}

TEST(Sm90Plan, PrefillKernelFromM1024WhereItsCopiesFit) {
  EXPECT_FALSE(sm90::prefer_prefill(1023));
  EXPECT_TRUE(sm90::prefer_prefill(1024));
  // Same plans as pre-A, (M + N)·K·2 <= 512 MiB: TP1 N = 9856 at K = 6144 leaves M <= 33834.
  EXPECT_TRUE(sm90::prefill_applies(plan90(h200(4096, 77)), 4096, 9856, 6144));
  EXPECT_TRUE(sm90::prefill_applies(plan90(h200(33834, 77)), 33834, 9856, 6144));
  EXPECT_FALSE(sm90::prefill_applies(plan90(h200(33835, 77)), 33835, 9856, 6144));
  EXPECT_FALSE(sm90::prefill_applies(plan90(h200(512, 20)), 512, 2560, 6144)) << "64-row split-K plan";
  // bf16 activations: only ŵ in the workspace, N·K·2 <= 512 MiB whatever M
  // (N = 43690 at K = 6144; M 40000 would not fit beside x̂).
  EXPECT_TRUE(sm90::prefill_applies(plan90(h200(40000, 77)), 40000, 9856, 6144, false));
  EXPECT_FALSE(sm90::prefill_applies(plan90(h200(40000, 77)), 40000, 9856, 6144, true));
  EXPECT_TRUE(sm90::prefill_applies(plan90(h200(4096, 341)), 4096, 43648, 6144, false));
  EXPECT_FALSE(sm90::prefill_applies(plan90(h200(4096, 342)), 4096, 43776, 6144, false));
}

// The one-launch prefill kernels take every SM for their conversion unless
// the caller set the grid: 96 tiles on 132 SMs -> 132; 200 tiles -> the
// plan's 132; an override of 7 -> 7.
// precision = 1: the fast kernel at TP1 (77 heads) and TP2 (39) from M = 1024,
// exact mode at TP4 (20) and TP8 (11) at every M and below M = 1024 anywhere.
TEST(Sm90Plan, FastKernelWhereItBeatsExactMode) {
  using m3qkv::sm90::fast_preferred;
  for (int64_t m : {1024, 2048, 4096, 16384}) {
    EXPECT_TRUE(fast_preferred(m, 77)) << m;
    EXPECT_TRUE(fast_preferred(m, 39)) << m;
    EXPECT_FALSE(fast_preferred(m, 20)) << m;
    EXPECT_FALSE(fast_preferred(m, 11)) << m;
  }
  for (int64_t m : {1, 64, 512, 1023}) EXPECT_FALSE(fast_preferred(m, 77)) << m;
}

// The fast kernel's cluster and grid: 2 row blocks per cluster where there
// are two and such clusters fit, the 2 heads of a lone row block, 2 x 2 only
// when asked and schedulable, none where pairs are not schedulable; the
// caller's grid caps it in whole clusters.
TEST(Sm90Plan, FastPlanClustersAndGrid) {
  using m3qkv::sm90::fast_plan;
  using m3qkv::sm90::FastPlanInput;
  FastPlanInput in;
  in.m_blocks = 32, in.heads = 20, in.num_sms = 132;
  in.resident[0] = 132, in.resident[1] = 66, in.resident[2] = 32;
  auto f = fast_plan(in);  // 16 x 20 cluster tiles of 2 row blocks on 66 resident clusters
  EXPECT_EQ(f.clu_m, 2);
  EXPECT_EQ(f.clu_h, 1);
  EXPECT_EQ(f.grid, 132);
  in.cluster = 4;
  f = fast_plan(in);
  EXPECT_EQ(f.clu_m * f.clu_h, 4);
  EXPECT_EQ(f.grid, 128);  // 32 resident clusters of 4
  in.resident[2] = 0;
  f = fast_plan(in);  // 2 x 2 not schedulable: 2 row blocks
  EXPECT_EQ(f.clu_m, 2);
  EXPECT_EQ(f.clu_h, 1);
  in.cluster = 0, in.m_blocks = 1;
  f = fast_plan(in);  // a lone row block: its 2 heads share the x' tile
  EXPECT_EQ(f.clu_m, 1);
  EXPECT_EQ(f.clu_h, 2);
  EXPECT_EQ(f.grid, 20);  // 10 cluster tiles
  in.m_blocks = 3, in.heads = 77, in.resident[1] = 0;
  f = fast_plan(in);  // pairs of CTAs not schedulable: none, one CTA per tile up to the SMs
  EXPECT_EQ(f.clu_m * f.clu_h, 1);
  EXPECT_EQ(f.grid, 132);
  in.resident[0] = 0;
  EXPECT_EQ(fast_plan(in).grid, 132);  // unknown residency: num_sms / size
  in.resident[0] = 132, in.resident[1] = 66, in.grid = 7;
  f = fast_plan(in);  // the caller's grid caps it, in whole clusters
  EXPECT_EQ(f.clu_m, 2);
  EXPECT_EQ(f.grid, 6);
  in.grid = 1;
  EXPECT_EQ(fast_plan(in).grid, 2);  // at least one cluster
  in.grid = 0, in.cluster = 1;
  f = fast_plan(in);
  EXPECT_EQ(f.clu_m * f.clu_h, 1);
  EXPECT_EQ(f.grid, 132);  // 231 tiles, 132 resident
}

TEST(Sm90Plan, OneLaunchGridTakesEverySmUnlessOverridden) {
  m3qkv::sm90::Plan p;
  p.tiles = 96;
  p.grid = 96;
  EXPECT_EQ(m3qkv::sm90::one_launch_grid(p, 132, 0), 132);
  p.tiles = 200;
  p.grid = 132;
  EXPECT_EQ(m3qkv::sm90::one_launch_grid(p, 132, 0), 132);
  p.tiles = 96;
  p.grid = 7;
  EXPECT_EQ(m3qkv::sm90::one_launch_grid(p, 132, 7), 7);
}

TEST(Sm90Plan, GridOverrideIsClampedToTheTiles) {
  sm90::PlanInput in = h200(4096, 20);
  in.grid = 7;
  EXPECT_EQ(plan90(in).grid, 7);
  in.grid = INT32_MAX;
  EXPECT_EQ(plan90(in).grid, 640);
  // With split-K the override counts CTAs: grid / split clusters, at least
  // one, at most one per tile.
  in = h200(1, 20);
  in.grid = 13;
  EXPECT_EQ(plan90(in).grid, 12);
  in.grid = 5;
  EXPECT_EQ(plan90(in).grid, 6);
  in.grid = INT32_MAX;
  EXPECT_EQ(plan90(in).grid, 120);
}

TEST(Sm90Plan, ForcedTileHeightAndSplit) {
  sm90::PlanInput in = h200(1, 20);
  in.block_m = 128;
  EXPECT_EQ(plan90(in).cons, 2);
  EXPECT_EQ(plan90(in).split, 1);
  in = h200(4096, 20);
  in.block_m = 64;
  EXPECT_EQ(plan90(in).tiles, 64 * 20);
  in = h200(1, 20, 256);  // ks = 2
  in.split = 8;
  EXPECT_EQ(plan90(in).split, 2) << "a forced split is clamped to K / 128";
  in.split = 1;
  EXPECT_EQ(plan90(in).split, 1);
}

TEST(Sm90Plan, RejectsWhatTheKernelsCannotRun) {
  sm90::Plan p;
  sm90::PlanInput in = h200(4096, 20);
  in.split = 4;  // 128-row tiles here
  EXPECT_EQ(sm90::plan("f", in, &p), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(m3qkv_last_error()).find("f: split-K needs 64-row tiles"), std::string::npos);
  in = h200(1, 20);
  in.split = 9;
  EXPECT_EQ(sm90::plan("f", in, &p), M3QKV_ERROR_INVALID_ARGUMENT);
  in = h200(1, 20);
  in.block_m = 32;
  EXPECT_EQ(sm90::plan("f", in, &p), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(sm90::plan("f", h200(INT32_MAX, 20), &p), M3QKV_ERROR_TOO_LARGE);
}

// ------------------------------------------------------------------- SM100
namespace sm100 = m3qkv::sm100;

TEST(Sm100Plan, CtaGroupByWaveQuantization) {
  EXPECT_EQ(sm100::choose_cta_group(1, 20, 148), 1);     // 20 tiles: 1 wave; 10 pair tiles: 2 units
  EXPECT_EQ(sm100::choose_cta_group(4096, 20, 148), 1);  // 640 -> 5 waves; 160 pairs -> 6 units
  EXPECT_EQ(sm100::choose_cta_group(256, 4, 4), 2);      // 8 tiles on 4 SMs: 2; 2 pairs on 2 pairs: 2 (tie)
  EXPECT_EQ(sm100::choose_cta_group(256 * 74, 2, 148), 2);
  EXPECT_EQ(sm100::choose_cta_group(256, 4, 1), 1) << "one SM cannot hold a pair";
}

TEST(Sm100Plan, GroupedMWhenTheWeightsDoNotFitHalfTheL2) {
  EXPECT_EQ(sm100::choose_group_m(2560, 6144, 32, 50 << 20), 1);  // 15 MiB of weights in a 50 MiB L2
  EXPECT_EQ(sm100::choose_group_m(2560, 6144, 32, 16 << 20), 16);
  EXPECT_EQ(sm100::choose_group_m(2560, 6144, 3, 16 << 20), 3);
  EXPECT_EQ(sm100::choose_group_m(2560, 6144, 32, 0), 16) << "unknown L2: grouped";
}

sm100::PlanInput b200(int64_t m, int heads) {
  sm100::PlanInput in;
  in.m = m;
  in.k = 6144;
  in.heads = heads;
  in.num_sms = 148;
  in.l2_bytes = 126 << 20;
  in.resident_clusters[1] = 148;
  in.resident_clusters[2] = 74;
  return in;
}

sm100::Plan plan100(const sm100::PlanInput& in) {
  sm100::Plan p;
  EXPECT_EQ(sm100::plan("test", in, &p), M3QKV_SUCCESS) << m3qkv_last_error();
  return p;
}

TEST(Sm100Plan, TilesAndPersistentGrid) {
  sm100::Plan p = plan100(b200(1, 20));
  EXPECT_EQ(p.cta_group, 1);
  EXPECT_EQ(p.num_m_tiles, 1);
  EXPECT_EQ(p.num_n_tiles, 20);
  EXPECT_EQ(p.num_tiles, 20);
  EXPECT_EQ(p.grid, 20u) << "at most one CTA per tile";
  p = plan100(b200(256 * 74, 2));
  EXPECT_EQ(p.cta_group, 2);
  EXPECT_EQ(p.num_m_tiles, 74);
  EXPECT_EQ(p.num_n_tiles, 1);
  EXPECT_EQ(p.grid, 148u);
  sm100::PlanInput in = b200(4096, 39);  // TP2: odd head count
  in.cta_group = 2;
  p = plan100(in);
  EXPECT_EQ(p.num_n_tiles, 20) << "the phantom head";
  EXPECT_EQ(p.num_m_tiles, 16);
  EXPECT_EQ(p.grid, 148u);
}

TEST(Sm100Plan, GridOverrideInWholeClustersClampedToTheTiles) {
  sm100::PlanInput in = b200(256 * 74, 2);
  in.grid = 7;
  EXPECT_EQ(plan100(in).grid, 6u);
  in.grid = 1;
  EXPECT_EQ(plan100(in).grid, 2u);
  in.grid = INT32_MAX;
  EXPECT_EQ(plan100(in).grid, 148u);
  in = b200(4096, 20);
  in.resident_clusters[1] = -1;  // the occupancy query failed
  EXPECT_EQ(plan100(in).grid, 148u);
}

TEST(Sm100Plan, RejectsCoordinatesBeyond32Bits) {
  sm100::PlanInput in = b200(INT32_MAX, 20);
  in.cta_group = 2;
  sm100::Plan p;
  EXPECT_EQ(sm100::plan("f", in, &p), M3QKV_ERROR_TOO_LARGE);
  EXPECT_NE(std::string(m3qkv_last_error()).find("f: m = 2147483647"), std::string::npos);
}

}  // namespace
