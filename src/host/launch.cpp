// Launch failure messages (see launch.h).
#include "host/launch.h"

#include <climits>
#include <cstdio>

#include "host/cuda.h"

namespace m3qkv::host {

m3qkv_status launch_fail(const char* fn, const char* kernel, const LaunchShape& s, cudaError_t err) {
  char call[224];
  std::snprintf(call, sizeof(call),
                "cudaLaunchKernelEx(%s, grid %u, block %u, smem %zu, cluster %u, pdl %d, cooperative %d)", kernel,
                s.grid, s.threads, s.smem, s.cluster, s.pdl ? 1 : 0, s.cooperative ? 1 : 0);
  return cuda_fail(fn, call, err);
}

m3qkv_status co_resident_ctas(const char* fn, const char* kernel_name, const DeviceInfo& dev, const void* kernel,
                              unsigned threads, size_t smem, unsigned* out) {
  *out = 0;
  int per_sm = 0;
  const cudaError_t e =
      cuda_unresolved().occupancy_max_active_blocks(&per_sm, kernel, static_cast<int>(threads), smem);  // enter_* resolved it
  if (e != cudaSuccess) {
    char call[224];
    std::snprintf(call, sizeof(call), "cudaOccupancyMaxActiveBlocksPerMultiprocessor(%s, block %u, smem %zu)",
                  kernel_name, threads, smem);
    return cuda_fail(fn, call, e);
  }
  if (per_sm <= 0 || dev.num_sms <= 0)
    return fail(M3QKV_ERROR_UNSUPPORTED_DEVICE,
                "%s: %s (block %u, smem %zu) cannot have a CTA resident on an SM of device %d (%d per SM, %d SMs): "
                "its cooperative launch cannot run there",
                fn, kernel_name, threads, smem, dev.device, per_sm, dev.num_sms);
  const unsigned long long n = static_cast<unsigned long long>(per_sm) * static_cast<unsigned long long>(dev.num_sms);
  *out = n > UINT_MAX ? UINT_MAX : static_cast<unsigned>(n);
  return M3QKV_SUCCESS;
}

m3qkv_status cooperative_grid(const char* fn, const char* kernel_name, const DeviceInfo& dev, const void* kernel,
                              unsigned threads, size_t smem, long long want, unsigned* grid) {
  unsigned cap = 0;
  M3QKV_TRY(co_resident_ctas(fn, kernel_name, dev, kernel, threads, smem, &cap));
  *grid = clamp_grid(want, cap);
  return M3QKV_SUCCESS;
}

}  // namespace m3qkv::host
