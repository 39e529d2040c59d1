#pragma once
// What the GPU test files share about the backends of this build: which were
// compiled, the SM90 entry points behind that answer, the SM90 skip, and the
// cache-format names in case names. For .cu files only: the answer is nvcc's
// __CUDA_ARCH_LIST__, which the host pass sees too.
#include <gtest/gtest.h>

#include "gpu/gpu_util.h"
#include "sm90/sm90.h"

#ifndef __CUDA_ARCH_LIST__
#error "backend_support.h needs nvcc's __CUDA_ARCH_LIST__: include it from a .cu file"
#endif

namespace m3qkv_gpu {

constexpr bool arch_list_has(int want) {
  constexpr int kList[] = {__CUDA_ARCH_LIST__};
  for (int a : kList)
    if (a == want) return true;
  return false;
}
// The library compiles src/sm90 only when 90a is in M3QKV_CUDA_ARCHS, and a
// test .cu gets a gencode for every configured arch: without 900 the calls
// below are not even instantiated (no link error in an "80"- or "100f"-only
// build) and the SM90 tests skip.
constexpr bool kBuiltSm90 = arch_list_has(900);

template <bool kHave = kBuiltSm90>
m3qkv_status sm90_variant_call(const m3qkv_fused_args& a, const m3qkv::DeviceInfo& dev, float* tap, cudaStream_t s,
                               int variant, int block_m, int split = 0) {
  if constexpr (kHave)
    return m3qkv::sm90_fused_variant(a, dev, tap, s, variant, block_m, split);
  else
    return M3QKV_ERROR_UNSUPPORTED_DEVICE;
}
template <bool kHave = kBuiltSm90>
m3qkv_status sm90_decode_call(const m3qkv_fused_args& a, const m3qkv::DeviceInfo& dev, float* tap, cudaStream_t s,
                              int split, int x_path = 0, int reduce = 0) {
  if constexpr (kHave)
    return m3qkv::sm90_fused_decode(a, dev, tap, s, split, x_path, reduce);
  else
    return M3QKV_ERROR_UNSUPPORTED_DEVICE;
}

template <bool kHave = kBuiltSm90>
m3qkv_status sm90_fast_call(const m3qkv_fused_args& a, const m3qkv::DeviceInfo& dev, float* tap, cudaStream_t s,
                            int cluster = 0) {
  if constexpr (kHave)
    return m3qkv::sm90_fused_fast(a, dev, tap, s, cluster);
  else
    return M3QKV_ERROR_UNSUPPORTED_DEVICE;
}

// Cache format codes of the problem configs (0 NVFP4, 1 FP8, 2 BF16) in case names.
inline const char* fmt_name(int d) { return d == 0 ? "nvfp4" : (d == 1 ? "fp8" : "bf16"); }

}  // namespace m3qkv_gpu

// The SM90 tests' skip: no GPU, no sm_90a in this build, or not a CC 9.0 device.
#define M3QKV_REQUIRE_SM90()                                                                                       \
  do {                                                                                                             \
    M3QKV_REQUIRE_GPU();                                                                                           \
    if (!::m3qkv_gpu::kBuiltSm90)                                                                                  \
      GTEST_SKIP() << "library built without the sm_90a target (M3QKV_CUDA_ARCHS lacks 90a)";                      \
    if (::m3qkv_gpu::device_cc() != 90)                                                                            \
      GTEST_SKIP() << "the SM90 kernel needs compute capability 9.0 (device has " << ::m3qkv_gpu::device_cc() / 10 \
                   << "." << ::m3qkv_gpu::device_cc() % 10 << ")";                                                 \
  } while (0)
