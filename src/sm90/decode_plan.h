// The SM90 decode kernel's target for the shared split-K plan
// (src/common/splitk_plan.h, CPU-tested in tests/cpu/test_decode_plan.cpp):
// wgmma N = 16, 32, 64 or 128 tokens per block, two blocks of 128 at most.
// docs/sm90_decode.md explains the design.
#pragma once

#include <stdint.h>

#include "common/splitk_plan.h"

namespace m3qkv::sm90 {

// Largest M the decode plan covers: two token blocks of 128. Above, the
// weights would be converted once per token block (re-read from L2) four or
// more times, where the tile kernel converts them once per 64 rows anyway.
constexpr int64_t kDecodeMaxM = 2 * 128;
// Most splits the plan considers (a unit is at least one 128-K stage).
constexpr int kDecodeMaxSplit = 64;
// Token blocks = the wgmma N the kernel is instantiated for; no busy-SM rule
// (the cost model alone picks the split, as measured on the H200).
constexpr splitk::Target kDecodeTarget{{16, 32, 64, 128}, 4, kDecodeMaxM, kDecodeMaxSplit, 0};

// The SM90 plan for M tokens (1 <= m <= kDecodeMaxM), `heads` heads of 128
// rows, K = 128·ks, on `num_sms` SMs. split_override > 0 forces S (clamped to
// [1, min(ks, kDecodeMaxSplit)]); grid_override > 0 caps the grid.
inline splitk::Plan plan_decode(int64_t m, int heads, int ks, int num_sms, int split_override = 0,
                                int grid_override = 0) {
  return splitk::plan(kDecodeTarget, m, heads, ks, num_sms, split_override, grid_override);
}

}  // namespace m3qkv::sm90
