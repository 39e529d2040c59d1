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
// Lane layouts of the insert, read off the H200 (bench/RESULTS.md v11:
// insert_<fmt>_quad / _warp / _mixed forced, every TP x M to 2048):
//  * warp rows (a warp per (row, head), 4 values per lane) for FP8 / BF16 KV
//    up to kInsertWarpRowsPerSmFlat head rows per SM: there a quad per row
//    leaves the GPU mostly idle and each row's serial chain (32 values per
//    lane) is the call's latency (TP4 M = 1: 1.88 against 2.16 µs). Above,
//    the quad layout's fewer instructions per row win (the warp form repeats
//    the norm sums in each of its 8 quads): quad rows.
//  * NVFP4 KV: the cache rows' chain (group amax, scale, software e2m1
//    encode) makes the few k / v / index_k warps the long pole of a quad
//    grid (TP4 M = 512: 5.4 µs against FP8's 4.2). Warp rows up to
//    kInsertWarpRowsPerSmNvfp4 head rows per SM (TP4 M = 16: 2.17 against
//    mixed 2.28 µs), mixed (cache heads in warp rows first, q / index_q in
//    quad rows) up to kInsertMixedRowsPerSmNvfp4 (TP4 M = 512: 4.7 µs, TP8
//    M = 1024, 93 per SM: 6.95 against quad 7.25); above, the warp rows'
//    extra instructions cost more than the imbalance and quad rows win
//    again (TP4 M = 1024, 155 per SM: 7.69 against mixed 7.96). Thresholds
//    of v12 (the leaner NVFP4 encode, RESULTS.md; v11 had mixed up to 160).
constexpr int64_t kInsertWarpRowsPerSmFlat = 12;
constexpr int64_t kInsertWarpRowsPerSmNvfp4 = 3;
constexpr int64_t kInsertMixedRowsPerSmNvfp4 = 120;

// Lane layout: automatic, or forced (tests and the bench: m3qkv_testing_insert_layout).
enum class InsertLayout : int { kAuto = 0, kQuadRows = 1, kWarpRows = 2, kMixed = 3 };

struct InsertPlan {
  InsertLayout layout;  // never kAuto
  int64_t cache_items;  // mixed: the (row, cache head) warp items, first
  int64_t items;        // warps of work in all: (row, head) or (8-row group, head) items
  unsigned grid;
};

// heads = nq + 2·nkv + niq + nik, cache = 2·nkv + nik of them.
inline InsertPlan insert_plan(int64_t m, int heads, int cache, bool kv_nvfp4, int num_sms, int32_t override_grid,
                              InsertLayout layout) {
  const int64_t rows = m * heads;
  InsertPlan p;
  p.layout = layout;
  if (layout == InsertLayout::kAuto) {
    if (kv_nvfp4)
      p.layout = rows <= static_cast<int64_t>(num_sms) * kInsertWarpRowsPerSmNvfp4    ? InsertLayout::kWarpRows
                 : rows <= static_cast<int64_t>(num_sms) * kInsertMixedRowsPerSmNvfp4 ? InsertLayout::kMixed
                                                                                        : InsertLayout::kQuadRows;
    else
      p.layout = rows <= static_cast<int64_t>(num_sms) * kInsertWarpRowsPerSmFlat ? InsertLayout::kWarpRows
                                                                                   : InsertLayout::kQuadRows;
  }
  const int64_t groups = (m + kInsertRowsPerWarp - 1) / kInsertRowsPerWarp;
  p.cache_items = p.layout == InsertLayout::kMixed ? m * cache : 0;
  p.items = p.layout == InsertLayout::kWarpRows ? rows
            : p.layout == InsertLayout::kMixed  ? p.cache_items + groups * (heads - cache)
                                                : groups * heads;
  p.grid = plan_grid(p.items, kInsertThreads / 32, override_grid);
  return p;
}

// Output tiles of bm x bn of an [m, n] GEMM (n is a multiple of bn).
inline int64_t gemm_tiles(int64_t m, int64_t n, int bm, int bn) { return (n / bn) * ((m + bm - 1) / bm); }

}  // namespace m3qkv::portable
