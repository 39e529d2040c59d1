// The thread-local message and the CUDA-failure helper (see status.h).
#include "host/status.h"

#include <cstdarg>
#include <cstdio>

#include "host/driver.h"

namespace {

// One message per thread (SPEC §6). 1 KiB holds the longest message we format
// (function + argument name + a few 64-bit values) with room to spare;
// vsnprintf truncates rather than overflows if a message ever gets longer.
constexpr int kMessageBytes = 1024;
thread_local char t_last_error[kMessageBytes] = {0};

// Errors that mean "this process has no usable CUDA device at all" (no GPU,
// no driver, or only the toolkit's stub libcuda): an unsupported device, not
// a failed CUDA call.
bool is_no_device_error(cudaError_t err) {
  return err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver || err == cudaErrorStubLibrary;
}

}  // namespace

namespace m3qkv {

m3qkv_status fail(m3qkv_status st, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(t_last_error, sizeof(t_last_error), fmt, ap);
  va_end(ap);
  if (n < 0) {
    // Encoding error in the format: keep a message rather than garbage.
    std::snprintf(t_last_error, sizeof(t_last_error), "m3qkv: %s", m3qkv_status_string(st));
  }
  return st;
}

void clear_error() { t_last_error[0] = '\0'; }

const char* last_error_message() { return t_last_error; }

m3qkv_status cuda_fail(const char* fn, const char* call, cudaError_t err) {
  // The error is ours and is reported through the status (status.h rule).
  (void)cudaGetLastError();
  if (is_no_device_error(err)) {
    return fail(M3QKV_ERROR_UNSUPPORTED_DEVICE, "%s: no CUDA device is available (%s: %s)", fn, call,
                cudaGetErrorString(err));
  }
  return fail(M3QKV_ERROR_CUDA_ERROR, "%s: %s failed: %s (%s)", fn, call, cudaGetErrorName(err),
              cudaGetErrorString(err));
}

m3qkv_status cuda_fail(const char* fn, const char* call, CUresult err) {
  const char* name = nullptr;
  const host::Driver* d = host::driver_if_resolved();
  if (d == nullptr || d->get_error_name(err, &name) != CUDA_SUCCESS || name == nullptr) name = "unknown CUresult";
  return fail(M3QKV_ERROR_CUDA_ERROR, "%s: %s failed: %s (CUresult %d)", fn, call, name, static_cast<int>(err));
}

}  // namespace m3qkv
