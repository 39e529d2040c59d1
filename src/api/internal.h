// Internal host-layer interfaces: error reporting, validation and the backend
// launchers. Not installed.
#pragma once

#include <cstdarg>

#include "m3qkv/m3qkv.h"

namespace m3qkv {

// Records a thread-local message (printf-style) and returns `st`.
m3qkv_status fail(m3qkv_status st, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
// Clears the thread-local message (called on entry of every API function).
void clear_error();

// Full argument validation (SPEC §2, §6, §8). Launches nothing. On success
// *noop is set when m == 0 (nothing to do).
m3qkv_status validate_fused(const m3qkv_fused_args* a, bool* noop);
m3qkv_status validate_insert(const m3qkv_insert_args* a, bool* noop);
m3qkv_status validate_gemm(const m3qkv_gemm_args* a, bool* noop);
m3qkv_status validate_quantize(const m3qkv_quantize_args* a, bool* noop);

// Device facts the dispatcher needs (cached per device).
struct DeviceInfo {
  int device = -1;
  int cc_major = 0, cc_minor = 0;
  int num_sms = 0;
  int l2_bytes = 0;
  int max_smem_optin = 0;
};
m3qkv_status query_device(int device, DeviceInfo* out);
m3qkv_status current_device_info(DeviceInfo* out);

// Backend launchers: arguments are already validated and m > 0. Each returns
// M3QKV_SUCCESS or M3QKV_ERROR_CUDA_ERROR (with a message) after the launch.
// `acc_tap` (test only, may be null): the fused kernels also write their f32
// accumulator [M, N] there, so the tests can run the golden epilogue on it.
m3qkv_status portable_fused(const m3qkv_fused_args& a, const DeviceInfo& dev, float* acc_tap, cudaStream_t s);
m3qkv_status portable_gemm(const m3qkv_gemm_args& a, const DeviceInfo& dev, cudaStream_t s);
m3qkv_status portable_insert(const m3qkv_insert_args& a, const DeviceInfo& dev, cudaStream_t s);
m3qkv_status portable_quantize(const m3qkv_quantize_args& a, const DeviceInfo& dev, cudaStream_t s);
m3qkv_status sm90_fused(const m3qkv_fused_args& a, const DeviceInfo& dev, float* acc_tap, cudaStream_t s);
m3qkv_status sm100_fused(const m3qkv_fused_args& a, const DeviceInfo& dev, float* acc_tap, cudaStream_t s);
m3qkv_status portable_warmup(const DeviceInfo& dev);
m3qkv_status sm90_warmup(const DeviceInfo& dev);
m3qkv_status sm100_warmup(const DeviceInfo& dev);

}  // namespace m3qkv

// Test-only entry point (not in the public header, not exported from the
// shared library; tests link the static library): m3qkv_fused_qkv that also
// writes the kernel's f32 accumulator [M, N] to `acc_tap` (device pointer),
// and lets the test force a backend (M3QKV_BACKEND_NONE = automatic).
extern "C" m3qkv_status m3qkv_testing_fused_qkv(const m3qkv_fused_args* args, float* acc_tap,
                                                m3qkv_backend_kind force_backend, cudaStream_t stream);

// Dispatch rule (api.cpp): CC 10.x -> sm100_fused when M3QKV_WITH_SM100;
// CC 9.0 -> sm90_fused when M3QKV_WITH_SM90 && M3QKV_HAVE_SM90_KERNEL (the
// Hopper kernel defines that macro in CMake when it lands); any CC >= 8.0 ->
// portable; else M3QKV_ERROR_UNSUPPORTED_DEVICE. m3qkv_mxfp8_gemm,
// m3qkv_qknorm_rope_kv_insert and m3qkv_mxfp8_quantize always use the
// portable kernels.
