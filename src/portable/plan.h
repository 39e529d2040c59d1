// Launch plan of the portable kernels: pure host arithmetic (no CUDA), unit
// tested on the CPU (tests/cpu/test_plans.cpp). launch.cu only builds the
// parameters and launches what this says.
#pragma once

#include <climits>
#include <cstdint>

namespace m3qkv::portable {

// CTAs of a grid-stride kernel over `items` work items, `per_block` items per
// CTA at one item per thread (GEMM kernels: per_block = 1, one tile per CTA):
// ceil(items / per_block), at least 1. The caller's override (> 0) is clamped
// to that count, as SM90 and SM100 clamp theirs: more CTAs would only idle,
// and grid = INT32_MAX would launch 2^31 of them.
inline unsigned plan_grid(int64_t items, int64_t per_block, int32_t override_grid) {
  int64_t g = (items + per_block - 1) / per_block;
  if (g < 1) g = 1;
  if (g > INT_MAX) g = INT_MAX;
  if (override_grid > 0 && override_grid < g) g = override_grid;
  return static_cast<unsigned>(g);
}

// The standalone insert (src/portable/insert.cu): 4-warp CTAs over (rows,
// head) items, one item per warp, in one of six lane layouts (below).
constexpr int kInsertThreads = 128;    // 4 warps
constexpr int kInsertRowsPerWarp = 8;  // quad rows: a warp = one head of 8 token rows, a quad per row
// Lane layouts of the insert, read off the H200 (bench/RESULTS.md v13:
// insert_<fmt>_quad / _warp / _l8 / _c32q8 / _c16q8 forced, every TP, M
// 1-2048 in four runs, 4096 in one; each figure pair from one run; the
// split figures from the last, on the final kernels), by head
// rows per SM R = m·heads / SMs. A quad per row gives the fewest
// instructions per row, but a lane's chain of 32 values is the call's
// latency when there are too few rows to hide it; more lanes per row shorten
// the chain (8-lane rows: 16 values, warp rows: 4) at more instructions per
// row (each lane of a class repeats the class's norm sum). The split layouts
// give the cache heads (k, v, index_k) more lanes than the q / index_q
// heads: with NVFP4 caches their group scales make theirs the longest chains.
//  * NVFP4 KV: warp rows up to kInsertWarpRowsPerSm (M = 1); split c32q8 up
//    to kInsertC32Q8RowsPerSmNvfp4 (TP2 M = 64, 19 per SM: 2.44 / c16q8 2.54
//    / 8-lane 3.12; an earlier run: 2.48 / the mixed layout of v12, cache
//    heads in warp rows + quad rows, 2.98); split
//    c16q8 up to kInsertShortChainRowsPerSmMax (TP8 M = 512, 46 per SM: 3.32
//    / c32q8 3.96 / 8-lane 3.89; TP1 M = 1024, 597 per SM: 17.7 / 8-lane
//    18.3); quad rows above, where the call is bandwidth-bound and quad rows'
//    fewer instructions win (TP1 M = 4096, 2390 per SM: 62.5 / 8-lane 67.2).
//  * FP8 / BF16 KV: warp rows up to kInsertWarpRowsPerSm; split c16q8 up to
//    kInsertC16Q8RowsPerSmFlat (TP4 M = 256, 39 per SM: 2.75 / 8-lane 2.96;
//    another run: 8-lane 3.09 / quad 3.35); then quad rows (TP4 M = 512, 78
//    per SM: 4.29 / c16q8 4.40), except in cache-heavy layouts (cache heads
//    >= 1/4 of the heads: TP8's 3 of 12), which keep shorter chains: 8-lane
//    rows up to kInsertShortChainRowsPerSmMax (TP8 M = 1024, 93 per SM:
//    8-lane 4.90 / quad 5.33 µs, where TP4 M = 1024, 155 per SM, has quad
//    6.06 / 8-lane 6.55).
//  * The guess before griddepcontrol.wait (insert.cu, epi::row_guess) is in
//    every lane-row kernel but split c16q8, which has a second instance with
//    it, c16q8 + guess (v14, H200, both forms in one run): 80 registers
//    instead of 62, faster where the rows are few enough that latency, not
//    occupancy, bounds the call: FP8 / BF16 through their whole c16q8 band
//    (TP1 M = 16, 9 per SM: 1.83 / 2.09 µs; TP8 M = 64, 6 per SM: 1.81 /
//    2.07), NVFP4 up to kInsertC16Q8GuessRowsPerSmNvfp4 (TP1 M = 128, 75 per
//    SM: 3.78 / 4.37; TP4 M = 512, 78 per SM: 4.14 / 4.70) except in the
//    cache-heavy layouts (TP8 M = 512, 47 per SM: 3.71 / 3.31); slower above
//    (TP2 M = 512, 151 per SM: 6.96 / 6.73; TP1 M = 1024: 21.2 / 17.8).
constexpr int64_t kInsertWarpRowsPerSm = 3;
constexpr int64_t kInsertC32Q8RowsPerSmNvfp4 = 25;
constexpr int64_t kInsertC16Q8RowsPerSmFlat = 40;
constexpr int64_t kInsertC16Q8GuessRowsPerSmNvfp4 = 80;
constexpr int64_t kInsertShortChainRowsPerSmMax = 800;

// Lane layout: automatic, or forced (tests and the bench: m3qkv_testing_insert_layout).
enum class InsertLayout : int {
  kAuto = 0,
  kQuadRows = 1,
  kWarpRows = 2,
  kLane8Rows = 3,
  kSplitC32Q8 = 4,  // cache heads in warp rows, q / index_q in 8-lane rows
  kSplitC16Q8 = 5,  // cache heads in 16-lane rows, q / index_q in 8-lane rows
  kSplitC16Q8Guess = 6,  // split c16q8 with the guess before griddepcontrol.wait
};
inline bool insert_split_c16q8(InsertLayout l) {
  return l == InsertLayout::kSplitC16Q8 || l == InsertLayout::kSplitC16Q8Guess;
}
// Rows per warp item of a layout's q / index_q heads and of its cache heads
// (different in the split layouts only).
inline int insert_rows_per_item(InsertLayout l) {
  return l == InsertLayout::kWarpRows ? 1
         : l == InsertLayout::kLane8Rows || l == InsertLayout::kSplitC32Q8 || insert_split_c16q8(l)
             ? 4
             : kInsertRowsPerWarp;
}
inline int insert_cache_rows_per_item(InsertLayout l) {
  return l == InsertLayout::kSplitC32Q8 ? 1 : insert_split_c16q8(l) ? 2 : insert_rows_per_item(l);
}

struct InsertPlan {
  InsertLayout layout;  // never kAuto
  int64_t cache_items;  // split layouts: the (row group, cache head) items, first
  int64_t items;        // warps of work in all: (row group, head) items
  unsigned grid;
};

// The automatic layout (the thresholds above): R head rows per SM.
inline InsertLayout insert_auto_layout(int64_t m, int heads, int cache, bool kv_nvfp4, int num_sms) {
  const int64_t rows = m * heads;
  const int64_t sms = num_sms;
  if (rows <= sms * kInsertWarpRowsPerSm) return InsertLayout::kWarpRows;
  if (rows > sms * kInsertShortChainRowsPerSmMax) return InsertLayout::kQuadRows;
  const bool heavy = 4 * cache >= heads;
  if (kv_nvfp4) {
    if (rows <= sms * kInsertC32Q8RowsPerSmNvfp4) return InsertLayout::kSplitC32Q8;
    return !heavy && rows <= sms * kInsertC16Q8GuessRowsPerSmNvfp4 ? InsertLayout::kSplitC16Q8Guess
                                                                   : InsertLayout::kSplitC16Q8;
  }
  if (rows <= sms * kInsertC16Q8RowsPerSmFlat) return InsertLayout::kSplitC16Q8Guess;
  return heavy ? InsertLayout::kLane8Rows : InsertLayout::kQuadRows;
}

// heads = nq + 2·nkv + niq + nik, cache = 2·nkv + nik of them.
inline InsertPlan insert_plan(int64_t m, int heads, int cache, bool kv_nvfp4, int num_sms, int32_t override_grid,
                              InsertLayout layout) {
  InsertPlan p;
  p.layout = layout == InsertLayout::kAuto ? insert_auto_layout(m, heads, cache, kv_nvfp4, num_sms) : layout;
  const int per_item = insert_rows_per_item(p.layout), per_cache_item = insert_cache_rows_per_item(p.layout);
  const int64_t groups = (m + per_item - 1) / per_item;
  const bool split = per_cache_item != per_item;
  p.cache_items = split ? (m + per_cache_item - 1) / per_cache_item * cache : 0;
  p.items = split ? p.cache_items + groups * (heads - cache) : groups * heads;
  p.grid = plan_grid(p.items, kInsertThreads / 32, override_grid);
  return p;
}

// Output tiles of bm x bn of an [m, n] GEMM (n is a multiple of bn).
inline int64_t gemm_tiles(int64_t m, int64_t n, int bm, int bn) { return (n / bn) * ((m + bm - 1) / bm); }

}  // namespace m3qkv::portable
