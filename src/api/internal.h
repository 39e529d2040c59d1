// Test-only entry points of the library (not in the public header, not
// exported from the shared library; tests link the static library). Nothing
// under src/ includes this file except src/api/*.cpp: the host layer lives in
// src/host/, the backends' entry points in src/{portable,sm90,sm100}/.
#pragma once

#include "m3qkv/m3qkv.h"

// m3qkv_fused_qkv that also writes the kernel's f32 accumulator [M, N] to
// `acc_tap` (device pointer), and lets the test force a backend
// (M3QKV_BACKEND_NONE = automatic).
extern "C" m3qkv_status m3qkv_testing_fused_qkv(const m3qkv_fused_args* args, float* acc_tap,
                                                m3qkv_backend_kind force_backend, cudaStream_t stream);

// Test-only fault (api/fault.h): after every fused launch of `backend`
// (m3qkv_fused_qkv, m3qkv_selftest, m3qkv_warmup's self-test), byte `offset`
// of `output` ("q_out", "q_fp8_out" or "index_q_out") is XOR-ed with
// `xor_mask` (1 ... 255) in device memory, on the call's stream (which it
// synchronizes: not under capture). backend = M3QKV_BACKEND_NONE clears it.
extern "C" m3qkv_status m3qkv_testing_inject_fault(m3qkv_backend_kind backend, const char* output, long long offset,
                                                   unsigned xor_mask);

// The standalone insert's lane layout (api/overrides.h, portable/plan.h
// insert_plan), process-wide: 0 = the plan's choice, 1 = a quad per row
// (8 rows per warp), 2 = a warp per row, 3 = mixed (a warp per cache-head row,
// a quad per q / index_q row). Returns M3QKV_ERROR_INVALID_ARGUMENT for any
// other value.
extern "C" m3qkv_status m3qkv_testing_insert_layout(int layout);

// Host-cost breakdown (host/timing.h): with timing on (for every thread;
// off by default), each entry point records the ns spent in each phase of
// the host path; m3qkv_testing_host_phases writes those of this thread's
// last call (at most `capacity`, in phase order) and returns how many.
extern "C" void m3qkv_testing_host_timing(int enable);
extern "C" int m3qkv_testing_host_phases(unsigned long long* ns, int capacity);
extern "C" const char* m3qkv_testing_host_phase_name(int phase);

// Dispatch rule (api.cpp): an explicit choice first (m3qkv_set_backend or the
// warmup's self-test fallback, then M3QKV_BACKEND: api/backend_choice.h),
// checked against the build and the device; else CC 10.x -> sm100_fused when
// M3QKV_WITH_SM100; CC 9.0 -> sm90_fused when M3QKV_WITH_SM90 &&
// M3QKV_HAVE_SM90_KERNEL (the Hopper kernel defines that macro in CMake);
// any CC >= 8.0 -> portable; else M3QKV_ERROR_UNSUPPORTED_DEVICE.
// m3qkv_mxfp8_gemm, m3qkv_qknorm_rope_kv_insert and m3qkv_mxfp8_quantize
// always use the portable kernels.
