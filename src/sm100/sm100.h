// Entry points of the SM100-family backend (CC 10.x), called by the
// dispatcher (src/api/api.cpp); same contract as src/portable/portable.h.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "host/device.h"

namespace m3qkv {

// The tile kernel (fused_sm100.cu) or, for small M, the decode variant
// (decode_sm100.cu): the rule is sm100::uses_decode (plan.h).
m3qkv_status sm100_fused(const m3qkv_fused_args& a, const DeviceInfo& dev, float* acc_tap, cudaStream_t s);
m3qkv_status sm100_warmup(const DeviceInfo& dev);

// Options of the decode variant (tests and benchmarks; sm100_fused uses the defaults).
struct Sm100DecodeOptions {
  int split = 0;        // 0 = the plan's; else forced, clamped to [1, min(K / 128, 64)]
  int skip_split = -1;  // test only: the last arriver leaves this split's partial out of the sum
};

// The decode variant (docs/sm100.md "Decode variant") for 1 <= M <= 128:
// weights as the MMA's M = 128 side, K split over a persistent grid, partials
// summed in a fixed order through a per-stream workspace. args.grid > 0 caps
// the grid. Arguments validated, m > 0.
m3qkv_status sm100_fused_decode(const m3qkv_fused_args& a, const DeviceInfo& dev, float* acc_tap, cudaStream_t s,
                                const Sm100DecodeOptions& opt = Sm100DecodeOptions{});

}  // namespace m3qkv
