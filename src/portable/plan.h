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
// Lane layouts of the insert, chosen by head rows per SM R = m·heads / SMs.
// A quad per row gives the fewest instructions per row, but a lane's chain
// of 32 values is the call's latency when there are too few rows to hide it;
// more lanes per row shorten the chain (8-lane rows: 16 values, warp rows: 4)
// at more instructions per row (each lane of a class repeats the class's
// norm sum). The split layouts give the cache heads (k, v, index_k) more
// lanes than the q / index_q heads: with NVFP4 caches their group scales
// make theirs the longest chains. Every lane-row kernel fits 8 CTAs per SM,
// quad rows 5 (90 registers, 8 rows per warp), so at large R the wave count
// of each form decides. Each threshold sits at the crossover of the forced
// layouts in the bench (insert_<fmt>_quad / _warp / _l8 / _c32q8 / _c16q8 /
// _c16q8g beside insert_<fmt>, bench/README.md); the entry named is the
// point that fixes it:
//  * kInsertWarpRowsPerSmFlat: FP8 / BF16 KV in warp rows up to
//    insert_fp8_warp/TP:8/M:64 (R 5.8); NVFP4 KV never (insert_nvfp4_c32q8
//    as fast at R <= 3 and faster at M = 1 of TP1 / TP2 / TP4).
//  * kInsertC32Q8RowsPerSm: split c32q8 up to insert_<fmt>_c32q8/TP:4/M:512
//    (R 78) and /TP:1/M:128 (R 75).
//  * kInsertQuadBandRowsPerSm: above that, FP8 / BF16 in quad rows while they
//    fill one wave and the split layouts spill into a second
//    (insert_fp8_quad/TP:4/M:1024, /TP:1/M:256, R ~ 150).
//  * kInsertShortChainRowsPerSmFlat / _Nvfp4: split c16q8 up to
//    insert_fp8_c16q8/TP:1/M:2048 (R 1195) / insert_nvfp4_c16q8/TP:1/M:1024
//    (R 597), quad rows above, where the call is bandwidth-bound
//    (insert_nvfp4_quad/TP:1/M:4096).
//  * Cache-heavy layouts (cache heads >= 1/4 of the heads: TP8's 3 of 12):
//    kInsertC32Q8RowsPerSmHeavy, split c32q8 up to
//    insert_nvfp4_c32q8/TP:8/M:256 (R 23); kInsertC16Q8GuessRowsPerSmHeavy,
//    split c16q8 with the guess up to insert_nvfp4_c16q8g/TP:8/M:1024 (R 93);
//    split c16q8 above (insert_nvfp4_c16q8/TP:8/M:2048); FP8 / BF16 8-lane
//    rows above kInsertQuadBandRowsPerSm (insert_fp8_l8/TP:8/M:4096).
//  * The guess before griddepcontrol.wait (insert.cu, epi::row_guess) is in
//    every lane-row kernel; split c16q8 also has an instance without it,
//    which wins at R >= ~150 with the same registers
//    (insert_nvfp4_c16q8/TP:1/M:1024 against insert_nvfp4_c16q8g).
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
  bool owner_passes;    // resolve slot ownership for the whole call first (below)
};

// Slot ownership (docs/contract.md §4.4): each CTA round of the insert builds
// a table of its rows' slots from every later row's slot words, O(M) loads per
// round and so O(M²) per call. From kOwnerPassMinM rows the call resolves
// ownership once instead (common/slot_owners.cuh whole-call form: three O(M)
// passes, three more launches); below it the rounds' scans cost less than
// those launches. The threshold is an estimate, not a measured crossover.
constexpr int64_t kOwnerPassMinM = 2048;

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
  p.owner_passes = cache > 0 && m >= kOwnerPassMinM;
  return p;
}

// Output tiles of bm x bn of an [m, n] GEMM (n is a multiple of bn).
inline int64_t gemm_tiles(int64_t m, int64_t n, int bm, int bn) { return (n / bn) * ((m + bm - 1) / bm); }

}  // namespace m3qkv::portable
