// Status and backend names, and the thread-local last-error message.
#include <cstdarg>
#include <cstdio>

#include "api/internal.h"

namespace {

// One message per thread (SPEC §6). 1 KiB holds the longest message we format
// (function + argument name + a few 64-bit values) with room to spare;
// vsnprintf truncates rather than overflows if a message ever gets longer.
constexpr int kMessageBytes = 1024;
thread_local char t_last_error[kMessageBytes] = {0};

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

}  // namespace m3qkv

extern "C" {

const char* m3qkv_status_string(m3qkv_status status) {
  switch (status) {
    case M3QKV_SUCCESS: return "M3QKV_SUCCESS: no error";
    case M3QKV_ERROR_INVALID_ARGUMENT: return "M3QKV_ERROR_INVALID_ARGUMENT: an argument is outside its documented domain";
    case M3QKV_ERROR_MISALIGNED: return "M3QKV_ERROR_MISALIGNED: a pointer is not aligned as documented";
    case M3QKV_ERROR_UNSUPPORTED_DEVICE: return "M3QKV_ERROR_UNSUPPORTED_DEVICE: no m3qkv backend for this device";
    case M3QKV_ERROR_CUDA_ERROR: return "M3QKV_ERROR_CUDA_ERROR: a CUDA call failed";
    case M3QKV_ERROR_NULL_POINTER: return "M3QKV_ERROR_NULL_POINTER: a required pointer is NULL";
    case M3QKV_ERROR_STRUCT_SIZE: return "M3QKV_ERROR_STRUCT_SIZE: struct_size does not match this library";
    case M3QKV_ERROR_INVALID_SHAPE: return "M3QKV_ERROR_INVALID_SHAPE: a shape or head-count rule fails";
    case M3QKV_ERROR_TOO_LARGE: return "M3QKV_ERROR_TOO_LARGE: a size exceeds 64-bit arithmetic or a kernel limit";
    case M3QKV_ERROR_INTERNAL: return "M3QKV_ERROR_INTERNAL: internal error in m3qkv";
  }
  return "unknown m3qkv_status";
}

const char* m3qkv_backend_name(m3qkv_backend_kind kind) {
  switch (kind) {
    case M3QKV_BACKEND_NONE: return "none";
    case M3QKV_BACKEND_PORTABLE: return "portable";
    case M3QKV_BACKEND_SM90: return "sm90";
    case M3QKV_BACKEND_SM100: return "sm100";
  }
  return "unknown";
}

const char* m3qkv_last_error(void) { return t_last_error; }

}  // extern "C"
