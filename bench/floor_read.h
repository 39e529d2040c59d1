// See floor_read.cu.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

// Reads a_bytes of a and b_bytes of b (multiples of 16, 16-B aligned) once;
// `sink` holds `blocks` words.
cudaError_t m3qkv_bench_floor_read(const void* a, size_t a_bytes, const void* b, size_t b_bytes, uint32_t* sink,
                                   int blocks, cudaStream_t s);
// One launch of an empty kernel (132 CTAs of 128 threads), the host-cost
// entries' floor for the launch phase, by each way a library can launch
// (host_launch_<how>): the runtime's cudaLaunchKernelEx with the PDL attribute
// (as m3qkv launches today; host_launch_empty), without it, the <<<>>>
// launch, the driver's cuLaunchKernelEx on the CUfunction of the current
// context (cudaGetFuncBySymbol) or on the context-free CUkernel
// (cudaGetKernel), and the runtime / driver launch of a kernel with a
// 512-byte parameter block (the fused op's size class).
enum class EmptyLaunch {
  kRuntimeExPdl,
  kRuntimeEx,
  kChevron,
  kRuntimeExPdlBig,
  kDriverExPdl,
  kDriverEx,
  kDriverExPdlBig,
  kDriverKernelExPdl,
};
cudaError_t m3qkv_bench_empty_launch(cudaStream_t s, EmptyLaunch how);
