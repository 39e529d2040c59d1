// Data prefetch. PTX ISA 9.x §9.7.9.15 "prefetch, prefetchu":
//   prefetch{.space}.level [a];  .space = .global, .local; .level = .L1, .L2
// brings the line holding `a` into the given cache level; no result, no
// completion, and (L2 being the point of coherence of global memory) no way
// for a later load to see data older than the writes before it.
#pragma once

#include <stdint.h>

namespace m3qkv::ptx {

__device__ __forceinline__ void prefetch_global_l2(const void* a) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(reinterpret_cast<uint64_t>(a)) : "memory");
}

}  // namespace m3qkv::ptx
