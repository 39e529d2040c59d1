// Device facts, cached per device ordinal (they cannot change while the
// process runs). The mutex guards only the map; the CUDA queries run outside
// it, so two threads may both query a new device once and store equal values.
#include "host/device.h"

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>

#include "host/status.h"

namespace m3qkv {
namespace {

std::mutex& cache_mutex() {
  static std::mutex mu;
  return mu;
}
std::map<int, DeviceInfo>& cache() {
  static std::map<int, DeviceInfo> m;
  return m;
}

}  // namespace

m3qkv_status query_device(int device, DeviceInfo* out, const char* fn) {
  if (device < 0) {
    return fail(M3QKV_ERROR_INVALID_ARGUMENT, "%s: device = %d is not a valid CUDA device ordinal", fn, device);
  }
  {
    std::lock_guard<std::mutex> lock(cache_mutex());
    const auto it = cache().find(device);
    if (it != cache().end()) {
      *out = it->second;
      return M3QKV_SUCCESS;
    }
  }
  int count = 0;
  M3QKV_CUDA_TRY(fn, cudaGetDeviceCount(&count));
  if (count <= 0) return fail(M3QKV_ERROR_UNSUPPORTED_DEVICE, "%s: no CUDA device is available", fn);
  if (device >= count) {
    return fail(M3QKV_ERROR_INVALID_ARGUMENT, "%s: device = %d is not a valid CUDA device (this process sees %d)", fn,
                device, count);
  }
  DeviceInfo d;
  d.device = device;
  M3QKV_CUDA_TRY(fn, cudaDeviceGetAttribute(&d.cc_major, cudaDevAttrComputeCapabilityMajor, device));
  M3QKV_CUDA_TRY(fn, cudaDeviceGetAttribute(&d.cc_minor, cudaDevAttrComputeCapabilityMinor, device));
  M3QKV_CUDA_TRY(fn, cudaDeviceGetAttribute(&d.num_sms, cudaDevAttrMultiProcessorCount, device));
  M3QKV_CUDA_TRY(fn, cudaDeviceGetAttribute(&d.l2_bytes, cudaDevAttrL2CacheSize, device));
  M3QKV_CUDA_TRY(fn, cudaDeviceGetAttribute(&d.max_smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  {
    std::lock_guard<std::mutex> lock(cache_mutex());
    cache()[device] = d;
  }
  *out = d;
  return M3QKV_SUCCESS;
}

// The device the caller's stream belongs to is the current device.
m3qkv_status current_device_info(DeviceInfo* out, const char* fn) {
  int device = -1;
  M3QKV_CUDA_TRY(fn, cudaGetDevice(&device));
  return query_device(device, out, fn);
}

}  // namespace m3qkv
