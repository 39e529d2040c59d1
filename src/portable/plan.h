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
// head) items, one item per warp, in one of two lane layouts.
constexpr int kInsertThreads = 128;    // 4 warps
constexpr int kInsertRowsPerWarp = 8;  // quad rows: a warp = one head of 8 token rows, a quad per row
// Lane layouts of the insert, read off the H200 (bench/RESULTS.md v13:
// insert_<fmt>_quad / _warp / _mixed / _l16 / _l8 forced, every TP, M 1-4096,
// two runs), by head rows per SM R = m·heads / SMs. A quad per row gives the
// fewest instructions per row, but a lane's chain of 32 values is the call's
// latency when there are too few rows to hide it; more lanes per row shorten
// the chain (8-lane rows: 16 values, warp rows: 4) at more instructions per
// row (each lane of a class repeats the class's norm sum).
//  * "Cache-heavy" layouts (cache heads >= 1/4 of the heads: TP8's 3 of 12)
//    take 8-lane rows over a wider band than the others (TP8 M = 1024, 93
//    rows per SM: NVFP4 8-lane 5.91 / mixed 6.92 / quad 7.25 µs, FP8 4.90 /
//    quad 5.33; TP4 M = 1024, 155 per SM: FP8 quad 6.06 / 8-lane 6.55).
//  * NVFP4 KV: warp rows up to kInsertWarpRowsPerSmNvfp4 (M = 1: the cache
//    rows' encode chain is the call); mixed (cache heads in warp rows first,
//    q / index_q in quad rows) up to kInsertMixedRowsPerSmNvfp4, or
//    kInsertMixedRowsPerSmNvfp4Heavy where the warp-row cache items are a
//    large share of the work (TP4 M = 512, 78 per SM: mixed 4.69 / 8-lane
//    5.43; TP8 M = 512, 46 per SM: 8-lane 3.86 / mixed 4.06); 8-lane rows up to
//    kInsertLane8RowsPerSmMax (TP1 M = 1024, 597 per SM: 18.1 / quad 19.3);
//    quad rows above, where the call is bandwidth-bound and quad rows' fewer
//    instructions win (TP1 M = 4096, 2390 per SM: 62.5 / 8-lane 67.2).
//  * FP8 / BF16 KV: warp rows up to kInsertWarpRowsPerSmFlat, 16-lane rows up
//    to kInsertLane16RowsPerSmFlat (-Heavy) (TP2 M = 64, 19 per SM: 2.41 /
//    quad 2.56 / warp 3.12), 8-lane rows up to kInsertLane8RowsPerSmFlat
//    (TP4 M = 256, 39 per SM: 2.96 / quad 3.30), or for cache-heavy layouts
//    up to kInsertLane8RowsPerSmMax; quad rows above (TP1 M = 256, 149 per
//    SM: 4.98 / 8-lane 5.82).
constexpr int64_t kInsertWarpRowsPerSmNvfp4 = 3;
constexpr int64_t kInsertMixedRowsPerSmNvfp4 = 120;
constexpr int64_t kInsertMixedRowsPerSmNvfp4Heavy = 30;
constexpr int64_t kInsertWarpRowsPerSmFlat = 3;
constexpr int64_t kInsertLane16RowsPerSmFlat = 20;
constexpr int64_t kInsertLane16RowsPerSmFlatHeavy = 30;
constexpr int64_t kInsertLane8RowsPerSmFlat = 40;
constexpr int64_t kInsertLane8RowsPerSmMax = 800;

// Lane layout: automatic, or forced (tests and the bench: m3qkv_testing_insert_layout).
enum class InsertLayout : int { kAuto = 0, kQuadRows = 1, kWarpRows = 2, kMixed = 3, kLane16Rows = 4, kLane8Rows = 5 };
// Rows per warp item of a layout (mixed: of its quad items).
inline int insert_rows_per_item(InsertLayout l) {
  return l == InsertLayout::kWarpRows     ? 1
         : l == InsertLayout::kLane16Rows ? 2
         : l == InsertLayout::kLane8Rows  ? 4
                                          : kInsertRowsPerWarp;
}

struct InsertPlan {
  InsertLayout layout;  // never kAuto
  int64_t cache_items;  // mixed: the (row, cache head) warp items, first
  int64_t items;        // warps of work in all: (row, head) or (8-row group, head) items
  unsigned grid;
};

// The automatic layout (the thresholds above): R head rows per SM.
inline InsertLayout insert_auto_layout(int64_t m, int heads, int cache, bool kv_nvfp4, int num_sms) {
  const int64_t rows = m * heads;
  const int64_t sms = num_sms;
  const bool heavy = 4 * cache >= heads;
  if (kv_nvfp4) {
    if (rows <= sms * kInsertWarpRowsPerSmNvfp4) return InsertLayout::kWarpRows;
    if (rows <= sms * (heavy ? kInsertMixedRowsPerSmNvfp4Heavy : kInsertMixedRowsPerSmNvfp4))
      return InsertLayout::kMixed;
    return rows <= sms * kInsertLane8RowsPerSmMax ? InsertLayout::kLane8Rows : InsertLayout::kQuadRows;
  }
  if (rows <= sms * kInsertWarpRowsPerSmFlat) return InsertLayout::kWarpRows;
  if (rows <= sms * (heavy ? kInsertLane16RowsPerSmFlatHeavy : kInsertLane16RowsPerSmFlat))
    return InsertLayout::kLane16Rows;
  return rows <= sms * (heavy ? kInsertLane8RowsPerSmMax : kInsertLane8RowsPerSmFlat) ? InsertLayout::kLane8Rows
                                                                                      : InsertLayout::kQuadRows;
}

// heads = nq + 2·nkv + niq + nik, cache = 2·nkv + nik of them.
inline InsertPlan insert_plan(int64_t m, int heads, int cache, bool kv_nvfp4, int num_sms, int32_t override_grid,
                              InsertLayout layout) {
  InsertPlan p;
  p.layout = layout == InsertLayout::kAuto ? insert_auto_layout(m, heads, cache, kv_nvfp4, num_sms) : layout;
  const int per_item = insert_rows_per_item(p.layout);
  const int64_t groups = (m + per_item - 1) / per_item;
  p.cache_items = p.layout == InsertLayout::kMixed ? m * cache : 0;
  p.items = p.layout == InsertLayout::kMixed ? p.cache_items + groups * (heads - cache) : groups * heads;
  p.grid = plan_grid(p.items, kInsertThreads / 32, override_grid);
  return p;
}

// Output tiles of bm x bn of an [m, n] GEMM (n is a multiple of bn).
inline int64_t gemm_tiles(int64_t m, int64_t n, int bm, int bn) { return (n / bn) * ((m + bm - 1) / bm); }

}  // namespace m3qkv::portable
