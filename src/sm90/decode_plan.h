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
// fused_sm90_fp8 against sm90_decode / sm90_tile / sm90_prefill
// (bench/README.md): bf16 activations always take the swap-AB kernel (the
// only SM90 kernel that reads them); MXFP8 activations take it up to
// kSwapAbMaxMxfp8M tokens, where it matches the tile kernels, and the tile /
// prefill kernels above, where the transform warps' per-head activation
// conversion makes it slower. Called directly (sm90_fused_decode, automatic
// x_path) above kSwapAbTransformMaxM tokens it converts the activations once
// per call instead (decode_converts_x); that path is not routed to until the
// bench entry sm90_decode_xhat has been measured against sm90_tile.
constexpr int64_t kSwapAbTransformMaxM = 32;
constexpr int64_t kSwapAbMaxMxfp8M = 32;
constexpr bool decode_preferred(int64_t m, int heads, bool x_bf16) {
  if (m < 1 || m > kDecodeMaxM || heads < 1) return false;
  return x_bf16 || m <= kSwapAbMaxMxfp8M;
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

}  // namespace m3qkv::sm90
