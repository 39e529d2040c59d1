// Launch failure messages (see launch.h).
#include "host/launch.h"

#include <cstdio>

namespace m3qkv::host {

m3qkv_status launch_fail(const char* fn, const char* kernel, const LaunchShape& s, cudaError_t err) {
  char call[224];
  std::snprintf(call, sizeof(call),
                "cudaLaunchKernelEx(%s, grid %u, block %u, smem %zu, cluster %u, pdl %d, cooperative %d)", kernel,
                s.grid, s.threads, s.smem, s.cluster, s.pdl ? 1 : 0, s.cooperative ? 1 : 0);
  return cuda_fail(fn, call, err);
}

}  // namespace m3qkv::host
