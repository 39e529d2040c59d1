// Global-memory synchronization with the PTX memory model's acquire/release
// operations (PTX ISA, "Memory Consistency Model"; the instructions in "Data
// Movement and Conversion Instructions: ld" / "...: st" and "Parallel
// Synchronization and Communication Instructions: atom"): one thin wrapper per
// instruction, gpu scope. Their use in the grid barrier (sm90/convert_sm90.cuh)
// is exercised by Sm90Shapes.OneLaunchPrefillBarrierReusedOnOneStream.
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
