// The one launch-configuration builder of every backend: grid, block, dynamic
// shared memory, stream, and the launch attributes m3qkv uses (PDL, a 1-D
// cluster, cooperative), plus the cluster occupancy query built from the same
// config.
#pragma once

// cuda_runtime.h: the C++ launch and occupancy templates (nvcc includes it
// implicitly; host compilers need it spelled out).
#include <cuda_runtime.h>

#include <climits>
#include <cstddef>
#include <utility>

#include "host/device.h"
#include "host/status.h"

namespace m3qkv::host {

struct LaunchShape {
  unsigned grid = 1;
  unsigned threads = 1;
  size_t smem = 0;  // dynamic shared memory bytes
  bool pdl = false;  // programmatic stream serialization (the kernel calls griddepcontrol.wait)
  // 0: no cluster attribute; n >= 1: 1-D clusters of n CTAs (grid % n == 0).
  unsigned cluster = 0;
  // Every CTA co-resident (the kernel meets at a grid barrier): the driver
  // refuses a grid that cannot be (cudaErrorCooperativeLaunchTooLarge)
  // instead of letting it hang, e.g. in a green context with fewer SMs.
  bool cooperative = false;
};

constexpr int kMaxLaunchAttrs = 3;

// The configuration of `s` on `stream`; the attributes live in `attr`
// (storage owned by the caller, referenced by the result).
inline cudaLaunchConfig_t launch_config(const LaunchShape& s, cudaStream_t stream,
                                        cudaLaunchAttribute (&attr)[kMaxLaunchAttrs]) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(s.grid, 1, 1);
  cfg.blockDim = dim3(s.threads, 1, 1);
  cfg.dynamicSmemBytes = s.smem;
  cfg.stream = stream;
  unsigned n = 0;
  if (s.pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (s.cluster > 0) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = s.cluster;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (s.cooperative) {
    attr[n].id = cudaLaunchAttributeCooperative;
    attr[n].val.cooperative = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cfg;
}

// "<fn>: cudaLaunchKernelEx(<kernel>, grid .., block .., smem .., cluster .., pdl ..) failed: ..."
m3qkv_status launch_fail(const char* fn, const char* kernel, const LaunchShape& s, cudaError_t err);

// Launches `kernel` with shape `s` on `stream`. Only the launch's own status
// is looked at: cudaGetLastError here could report (and clear) an earlier,
// unrelated error of the caller's thread.
template <class... KArgs, class... Args>
m3qkv_status launch(const char* fn, const char* name, void (*kernel)(KArgs...), const LaunchShape& s,
                    cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr[kMaxLaunchAttrs];
  const cudaLaunchConfig_t cfg = launch_config(s, stream, attr);
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  if (e != cudaSuccess) return launch_fail(fn, name, s, e);
  return M3QKV_SUCCESS;
}

// cudaOccupancyMaxActiveClusters of `kernel` launched with `threads` threads,
// `smem` bytes and clusters of `cluster` CTAs; -1 when the query fails (its
// error is cleared: the caller treats -1 as "unknown", not as a failure).
template <class... KArgs>
int max_active_clusters(void (*kernel)(KArgs...), unsigned threads, size_t smem, unsigned cluster) {
  cudaLaunchAttribute attr[kMaxLaunchAttrs];
  const cudaLaunchConfig_t cfg =
      launch_config(LaunchShape{cluster, threads, smem, false, cluster, false}, nullptr, attr);
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
    (void)cudaGetLastError();  // our own failure (status.h rule)
    return -1;
  }
  return n;
}

// How many CTAs of `kernel` (`threads` threads, `smem` dynamic shared bytes)
// can be resident on dev's device at once: cudaOccupancyMaxActiveBlocksPerMultiprocessor
// (through the CUDA table, host/cuda.h) times its SMs. The ceiling of a
// cooperative launch, whose CTAs meet at a grid barrier: the driver refuses a
// larger grid (cudaErrorCooperativeLaunchTooLarge). Counts the device's SMs
// (dev.num_sms): a green context with fewer SMs can hold fewer. A failed
// query is M3QKV_ERROR_CUDA_ERROR naming the kernel; a kernel of which not
// one CTA fits an SM, M3QKV_ERROR_UNSUPPORTED_DEVICE. Call with dev from
// enter_* (its context current).
m3qkv_status co_resident_ctas(const char* fn, const char* kernel_name, const DeviceInfo& dev, const void* kernel,
                              unsigned threads, size_t smem, unsigned* out);
template <class... KArgs>
m3qkv_status co_resident_ctas(const char* fn, const char* kernel_name, const DeviceInfo& dev, void (*kernel)(KArgs...),
                              unsigned threads, size_t smem, unsigned* out) {
  return co_resident_ctas(fn, kernel_name, dev, reinterpret_cast<const void*>(kernel), threads, smem, out);
}

// The grid of a cooperative launch of `kernel`: `want` CTAs (a plan's grid or
// the caller's `grid` field, any value >= 0) clamped to [1, co_resident_ctas].
// A persistent kernel that strides its work by gridDim.x and meets at a grid
// barrier of gridDim.x arrivals runs correctly on any such grid.
// A cooperative grid: `want` clamped to [1, cap]; cap 0 = unknown (want, at least 1).
inline unsigned clamp_grid(long long want, unsigned cap) {
  if (want < 1) return 1u;
  if (cap > 0 && static_cast<unsigned long long>(want) > cap) return cap;
  return want > static_cast<long long>(UINT_MAX) ? UINT_MAX : static_cast<unsigned>(want);
}
m3qkv_status cooperative_grid(const char* fn, const char* kernel_name, const DeviceInfo& dev, const void* kernel,
                              unsigned threads, size_t smem, long long want, unsigned* grid);
template <class... KArgs>
m3qkv_status cooperative_grid(const char* fn, const char* kernel_name, const DeviceInfo& dev, void (*kernel)(KArgs...),
                              unsigned threads, size_t smem, long long want, unsigned* grid) {
  return cooperative_grid(fn, kernel_name, dev, reinterpret_cast<const void*>(kernel), threads, smem, want, grid);
}

}  // namespace m3qkv::host
