// The thread-local message and the CUDA-failure helper (see status.h).
#include "host/status.h"

#include <cstdarg>
#include <cstdio>

#include "host/cuda.h"

namespace {

// One message per thread (docs/contract.md §5.1). 1 KiB holds the longest message we format
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
bool is_no_device_error(CUresult err) {
  return err == CUDA_ERROR_NO_DEVICE || err == CUDA_ERROR_STUB_LIBRARY;
}

// The no-device message. The runtime reports a missing libcuda as
// cudaErrorInsufficientDriver ("driver version is insufficient"), which reads
// like "upgrade the driver"; cudaDriverGetVersion tells the cases apart: it
// answers 0 when no driver is installed.
m3qkv_status no_device(const char* fn, const char* call, cudaError_t err) {
  const char* why = "no CUDA-capable GPU is visible to this process";
  char buf[160];
  if (err == cudaErrorStubLibrary) {
    why = "only the CUDA toolkit's stub libcuda.so was found, not a driver";
  } else if (err == cudaErrorInsufficientDriver) {
    int version = 0;
    if (m3qkv::host::cuda_unresolved().driver_get_version(&version) != cudaSuccess || version == 0) {
      why = "no CUDA driver is installed (libcuda.so.1 could not be loaded)";
    } else {
      std::snprintf(buf, sizeof(buf), "the installed driver supports CUDA %d.%d, older than the CUDA %d.%d runtime "
                    "m3qkv was built with: update the driver", version / 1000, version % 1000 / 10,
                    CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
      return m3qkv::fail(M3QKV_ERROR_UNSUPPORTED_DEVICE, "%s: the CUDA driver is too old: %s (%s: %s)", fn, buf, call,
                         cudaGetErrorName(err));
    }
  }
  return m3qkv::fail(M3QKV_ERROR_UNSUPPORTED_DEVICE, "%s: no CUDA driver or GPU was found: %s (%s: %s)", fn, why, call,
                     cudaGetErrorName(err));
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
  (void)host::cuda_unresolved().get_last_error();
  if (is_no_device_error(err)) return no_device(fn, call, err);
  return fail(M3QKV_ERROR_CUDA_ERROR, "%s: %s failed: %s (%s)", fn, call, cudaGetErrorName(err),
              cudaGetErrorString(err));
}

m3qkv_status cuda_fail(const char* fn, const char* call, CUresult err) {
  if (is_no_device_error(err)) {
    return no_device(fn, call, err == CUDA_ERROR_STUB_LIBRARY ? cudaErrorStubLibrary : cudaErrorNoDevice);
  }
  const char* name = nullptr;
  const host::Cuda& c = host::cuda_unresolved();
  if (c.get_error_name == nullptr || c.get_error_name(err, &name) != CUDA_SUCCESS || name == nullptr) {
    name = "unknown CUresult";
  }
  return fail(M3QKV_ERROR_CUDA_ERROR, "%s: %s failed: %s (CUresult %d)", fn, call, name, static_cast<int>(err));
}

}  // namespace m3qkv
