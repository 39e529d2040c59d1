// Entry points of the SM100-family backend (CC 10.x), called by the
// dispatcher (src/api/api.cpp); same contract as src/portable/portable.h.
#pragma once

#include <cuda_runtime_api.h>

#include "host/device.h"

namespace m3qkv {

m3qkv_status sm100_fused(const m3qkv_fused_args& a, const DeviceInfo& dev, float* acc_tap, cudaStream_t s);
m3qkv_status sm100_warmup(const DeviceInfo& dev);

}  // namespace m3qkv
