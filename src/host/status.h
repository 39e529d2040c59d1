// The host layer's error vocabulary, used by every file under src/: the
// thread-local message, the status helpers and the one CUDA-failure helper.
//
// The CUDA last-error rule (every m3qkv failure path follows it):
//   - m3qkv never calls cudaGetLastError / cudaPeekAtLastError on a path that
//     succeeds, so an error the caller left pending stays pending.
//   - A failing runtime call made by m3qkv has already replaced the thread's
//     last error with its own (the runtime keeps one slot). cuda_fail reports
//     it through the status and the message, then clears it, so the caller's
//     next cudaGetLastError does not return an error m3qkv already reported.
//     Sticky errors (a dead context) stay sticky whatever anyone does.
//   - Driver API calls (CUresult) never touch the runtime's last error:
//     their cuda_fail overload clears nothing.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "m3qkv/m3qkv.h"

namespace m3qkv {

// Records a thread-local message (printf-style) and returns `st`.
m3qkv_status fail(m3qkv_status st, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
// Clears the thread-local message (called on entry of every API function).
void clear_error();
// The thread-local message ("" when none); m3qkv_last_error returns it.
const char* last_error_message();

// The one CUDA-failure helper: "<fn>: <call> failed: <name> (<text>)" as
// M3QKV_ERROR_CUDA_ERROR, or M3QKV_ERROR_UNSUPPORTED_DEVICE when the error
// means the process has no usable CUDA device; the last-error rule above.
m3qkv_status cuda_fail(const char* fn, const char* call, cudaError_t err);
m3qkv_status cuda_fail(const char* fn, const char* call, CUresult err);

}  // namespace m3qkv

// Returns from the enclosing function when `expr` (an m3qkv_status) fails.
#define M3QKV_TRY(expr)                                \
  do {                                                 \
    const m3qkv_status m3qkv_st_ = (expr);             \
    if (m3qkv_st_ != M3QKV_SUCCESS) return m3qkv_st_;  \
  } while (0)

// Runs a CUDA runtime (cudaError_t) or driver (CUresult) call; on failure
// returns cuda_fail(fn, "<the call's text>", error). Both success codes are 0.
#define M3QKV_CUDA_TRY(fn, call)                                                   \
  do {                                                                             \
    const auto m3qkv_err_ = (call);                                                \
    if (m3qkv_err_ != decltype(m3qkv_err_){}) return ::m3qkv::cuda_fail(fn, #call, m3qkv_err_); \
  } while (0)
