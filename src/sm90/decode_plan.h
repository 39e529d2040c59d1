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
// Whether the decode kernel beats the tile kernel (split-K over a cluster)
// for M tokens and `heads` heads of 128 rows at K = 6144, read off the
// crossover bench on the H200 (bench/RESULTS.md v6, sm90_decode/sm90_tile,
// cold L2, graph replay, µs decode / tile):
//   heads  M=32        M=64        M=128       M=256
//   12     16.9/20.2   21.8/20.0   38.1/23.1   40.9/34.8   (TP8)
//   20     18.1/22.0   24.0/21.9   38.5/34.8   47.5/60.4   (TP4)
//   39     24.0/28.8   30.2/28.6   47.2/49.7   87.4/94.6   (TP2)
//   77     50.4/50.8   68.4/50.2   87.0/95.6   278/146     (TP1)
// M <= 32 always (token blocks of 16 or 32: the tile kernel pads to 64 rows);
// 33..64 never (the 64-token block's dequantization is not amortized enough);
// 65..128 from 32 heads up, 129..256 for 16..48 heads. The table is the rule
// until a model of both kernels replaces it; the margins under 10 % (TP1 M=32,
// TP2 M=64/128) are within run-to-run spread.
constexpr bool decode_preferred(int64_t m, int heads) {
  if (m < 1 || m > kDecodeMaxM) return false;
  if (m <= 32) return true;
  if (m <= 64) return false;
  if (m <= 128) return heads >= 32;
  return heads >= 16 && heads <= 48;
}
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
// The same through the per-thread memo (the launcher's per-call path).
inline splitk::Plan plan_decode_memo(int64_t m, int heads, int ks, int num_sms, int split_override = 0,
                                     int grid_override = 0) {
  return splitk::plan_memo(kDecodeTarget, m, heads, ks, num_sms, split_override, grid_override);
}

}  // namespace m3qkv::sm90
