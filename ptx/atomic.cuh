// Global-memory synchronization with the PTX memory model's acquire/release
// operations (PTX ISA 9.x §8 "Memory Consistency Model", §9.7.9.8 ld, §9.7.9.10
// st, §9.7.13.5 atom): one thin wrapper per instruction, gpu scope.
#pragma once

#include <stdint.h>

namespace m3qkv::ptx {

// atom.add.acq_rel.gpu.u32: returns the old value.
__device__ __forceinline__ uint32_t atom_add_acq_rel_gpu_u32(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
// ld.acquire.gpu.u32
__device__ __forceinline__ uint32_t ld_acquire_gpu_u32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// st.release.gpu.u32
__device__ __forceinline__ void st_release_gpu_u32(uint32_t* p, uint32_t v) {
  asm volatile("st.release.gpu.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// st.relaxed.gpu.u32
__device__ __forceinline__ void st_relaxed_gpu_u32(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.gpu.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

}  // namespace m3qkv::ptx
