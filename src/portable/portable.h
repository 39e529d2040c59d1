// Entry points of the portable backend (CC >= 8.0), called by the dispatcher
// (src/api/api.cpp). Arguments are already validated and m > 0. Each returns
// M3QKV_SUCCESS or a status with a message after the launch. `acc_tap` (test
// only, may be null): the fused kernel also writes its f32 accumulator
// [M, N] there, so the tests can run the golden epilogue on it.
#pragma once

#include <cuda_runtime_api.h>

#include "host/device.h"

namespace m3qkv {

m3qkv_status portable_fused(const m3qkv_fused_args& a, const DeviceInfo& dev, float* acc_tap, cudaStream_t s);
m3qkv_status portable_gemm(const m3qkv_gemm_args& a, const DeviceInfo& dev, cudaStream_t s);
// layout: the insert's lane layout (portable::InsertLayout; 0 = the plan's
// choice), a plan input the API takes from its testing hook.
m3qkv_status portable_insert(const m3qkv_insert_args& a, const DeviceInfo& dev, cudaStream_t s, int layout);
m3qkv_status portable_quantize(const m3qkv_quantize_args& a, const DeviceInfo& dev, cudaStream_t s);
// m3qkv_prepare_weights_fp8: the fold of common/fold_fp8.h, one thread per
// (row, 128-K group); with a.stats, the statistics through a temporary device
// word pair, waiting for the stream (refused while it captures).
m3qkv_status portable_prepare(const m3qkv_prepare_args& a, const DeviceInfo& dev, cudaStream_t s);
// Shared-memory attributes and module loading ahead of the first call.
m3qkv_status portable_warmup(const DeviceInfo& dev);

}  // namespace m3qkv
