// Device facts, cached per device ordinal (they cannot change while the
// process runs). The mutex guards only the map; the CUDA queries run outside
// it, so two threads may both query a new device once and store equal values.
#include "host/device.h"

#include <map>
#include <mutex>

#include "host/cuda.h"
#include "host/status.h"

namespace m3qkv {
namespace {

std::mutex& cache_mutex() {
  static std::mutex mu;
  return mu;
}
std::map<int, DeviceInfo>& cache() {
  static auto* m = new std::map<int, DeviceInfo>();
  return *m;
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
  const host::Cuda& c = host::cuda_unresolved();  // runtime calls only
  int count = 0;
  M3QKV_CUDA_TRY(fn, c.get_device_count(&count));
  if (count <= 0) return cuda_fail(fn, "cudaGetDeviceCount", cudaErrorNoDevice);
  if (device >= count) {
    return fail(M3QKV_ERROR_INVALID_ARGUMENT, "%s: device = %d is not a valid CUDA device (this process sees %d)", fn,
                device, count);
  }
  DeviceInfo d;
  d.device = device;
  M3QKV_CUDA_TRY(fn, c.device_get_attribute(&d.cc_major, cudaDevAttrComputeCapabilityMajor, device));
  M3QKV_CUDA_TRY(fn, c.device_get_attribute(&d.cc_minor, cudaDevAttrComputeCapabilityMinor, device));
  M3QKV_CUDA_TRY(fn, c.device_get_attribute(&d.num_sms, cudaDevAttrMultiProcessorCount, device));
  M3QKV_CUDA_TRY(fn, c.device_get_attribute(&d.l2_bytes, cudaDevAttrL2CacheSize, device));
  M3QKV_CUDA_TRY(fn, c.device_get_attribute(&d.max_smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  {
    std::lock_guard<std::mutex> lock(cache_mutex());
    cache()[device] = d;
  }
  *out = d;
  return M3QKV_SUCCESS;
}

namespace host {
void testing_forget_devices() {
  std::lock_guard<std::mutex> lock(cache_mutex());
  cache().clear();
}
}  // namespace host

}  // namespace m3qkv
