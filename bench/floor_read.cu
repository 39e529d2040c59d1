// The read floor of the benchmark (floor_read/TP:t/M:0): a plain kernel that
// reads a layer's weight and weight-scale bytes once with 16-byte streaming
// loads, grid-stride, so every figure of a decode sweep has the physical limit
// of its weight stream beside it (same rotation over cold sets, same graph).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "floor_read.h"

namespace {

__global__ void __launch_bounds__(512) floor_read_kernel(const uint4* a, size_t na, const uint4* b, size_t nb,
                                                        uint32_t* sink) {
  uint32_t acc = 0;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < na + nb; i += stride) {
    const uint4 v = __ldcs(i < na ? a + i : b + (i - na));
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  // Keeps the loads alive; the sink word of a block is never read.
  if (acc == 0x9E3779B9u) sink[blockIdx.x] = acc;
}

}  // namespace

cudaError_t m3qkv_bench_floor_read(const void* a, size_t a_bytes, const void* b, size_t b_bytes, uint32_t* sink,
                                   int blocks, cudaStream_t s) {
  floor_read_kernel<<<blocks, 512, 0, s>>>(static_cast<const uint4*>(a), a_bytes / 16, static_cast<const uint4*>(b),
                                           b_bytes / 16, sink);
  return cudaGetLastError();
}

namespace {
__global__ void empty_kernel(int) {}
}  // namespace

cudaError_t m3qkv_bench_empty_launch(cudaStream_t s) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(132);
  cfg.blockDim = dim3(128);
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, empty_kernel, 0);
}
