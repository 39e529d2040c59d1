// Status and backend names, and the thread-local last-error message (the C
// side of host/status.h).
#include "host/status.h"

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
    case M3QKV_ERROR_SELFTEST_FAILED: return "M3QKV_ERROR_SELFTEST_FAILED: a kernel failed the self-test (wrong bytes or no run)";
    case M3QKV_WARNING_BACKEND_FALLBACK:
      return "M3QKV_WARNING_BACKEND_FALLBACK: not an error: the self-test failed the automatic backend, a slower one that passed is used";
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

const char* m3qkv_last_error(void) { return m3qkv::last_error_message(); }

}  // extern "C"
