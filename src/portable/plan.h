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
// Lane layouts of the insert, read off the H200 by head rows per SM R =
// m·heads / SMs (bench/RESULTS.md v15: insert_<fmt>_quad / _warp / _l8 /
// _c32q8 / _c16q8 / _c16q8g forced, every TP, M 1-4096, all in one run,
// figures below in µs from it). A quad per row gives the fewest instructions
// per row, but a lane's chain of 32 values is the call's latency when there
// are too few rows to hide it; more lanes per row shorten the chain (8-lane
// rows: 16 values, warp rows: 4) at more instructions per row (each lane of a
// class repeats the class's norm sum). The split layouts give the cache heads
// (k, v, index_k) more lanes than the q / index_q heads: with NVFP4 caches
// their group scales make theirs the longest chains. Since every lane-row
// kernel fits 8 CTAs per SM (63-64 registers, v15) the split layouts lead
// through mid R; what remains is the wave count of each form (quad rows: 5
// CTAs per SM at 90 registers, 8 rows per warp).
//  * FP8 / BF16 KV: warp rows up to kInsertWarpRowsPerSmFlat (TP8 M = 64,
//    5.8 per SM: 1.59 / c32q8 1.69); NVFP4 KV never (c32q8 within 0.04 of
//    them at R <= 3, ahead at TP1 / TP2 / TP4 M = 1).
//  * Split c32q8 up to kInsertC32Q8RowsPerSm (TP4 M = 512, 78 per SM: NVFP4
//    3.51 / c16q8 4.27, FP8 3.39 / c16q8 + guess 3.68; TP1 M = 128, 75 per
//    SM: NVFP4 3.22 / 3.76, FP8 2.90 / quad 3.57).
//  * Above it, FP8 / BF16: quad rows up to kInsertQuadBandRowsPerSm, where
//    they fill one wave and the split layouts spill into a second (R ~ 150:
//    TP4 M = 1024 quad 5.80 / c32q8 6.11 / c16q8 6.13; TP1 M = 256 4.71 /
//    4.96 / 5.02), then split c16q8 up to kInsertShortChainRowsPerSmFlat
//    (TP1 M = 2048, 1195 per SM: 29.54 / 8-lane 30.93 / quad 32.18), quad
//    rows above, where the call is bandwidth-bound. NVFP4: split c16q8 up to
//    kInsertShortChainRowsPerSmNvfp4 (TP1 M = 1024, 597 per SM: 16.64 /
//    8-lane 17.73 / quad 18.63), quad rows above (TP1 M = 4096, 2390 per SM:
//    59.10 / 8-lane 62.42 / c16q8 67.10).
//  * Cache-heavy layouts (cache heads >= 1/4 of the heads: TP8's 3 of 12):
//    split c32q8 only up to kInsertC32Q8RowsPerSmHeavy (TP8 M = 256, 23 per
//    SM: NVFP4 2.08 / c16q8 + guess 2.33), then split c16q8 with the guess
//    up to kInsertC16Q8GuessRowsPerSmHeavy (TP8 M = 1024, 93 per SM: NVFP4
//    5.10 / c32q8 5.24 / c16q8 5.25; M = 512: 2.96 / 3.14 / 3.15), split c16q8
//    above (TP8 M = 2048, 186 per SM: NVFP4 7.39 / guess 7.63), FP8 / BF16
//    8-lane rows above kInsertQuadBandRowsPerSm (TP8 M = 4096, 372 per SM:
//    10.75 / c16q8 11.25).
//  * The guess before griddepcontrol.wait (insert.cu, epi::row_guess) is in
//    every lane-row kernel; split c16q8 also has an instance without it, the
//    faster one at R >= ~150 with the same registers (TP1 M = 1024 NVFP4:
//    16.64 / 17.81 µs; TP8 M = 2048 above).
constexpr int64_t kInsertWarpRowsPerSmFlat = 6;
constexpr int64_t kInsertC32Q8RowsPerSm = 80;
constexpr int64_t kInsertC32Q8RowsPerSmHeavy = 25;
constexpr int64_t kInsertC16Q8GuessRowsPerSmHeavy = 100;
constexpr int64_t kInsertQuadBandRowsPerSm = 200;
constexpr int64_t kInsertShortChainRowsPerSmNvfp4 = 800;
constexpr int64_t kInsertShortChainRowsPerSmFlat = 1200;

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
  const auto within = [&](int64_t per_sm) { return rows <= sms * per_sm; };  // R <= per_sm
  const bool heavy = 4 * cache >= heads;
  if (!kv_nvfp4 && within(kInsertWarpRowsPerSmFlat)) return InsertLayout::kWarpRows;
  if (!within(kv_nvfp4 ? kInsertShortChainRowsPerSmNvfp4 : kInsertShortChainRowsPerSmFlat))
    return InsertLayout::kQuadRows;
  if (heavy) {
    if (within(kInsertC32Q8RowsPerSmHeavy)) return InsertLayout::kSplitC32Q8;
    if (within(kInsertC16Q8GuessRowsPerSmHeavy)) return InsertLayout::kSplitC16Q8Guess;
    return kv_nvfp4 || within(kInsertQuadBandRowsPerSm) ? InsertLayout::kSplitC16Q8 : InsertLayout::kLane8Rows;
  }
  if (within(kInsertC32Q8RowsPerSm)) return InsertLayout::kSplitC32Q8;
  return !kv_nvfp4 && within(kInsertQuadBandRowsPerSm) ? InsertLayout::kQuadRows : InsertLayout::kSplitC16Q8;
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
