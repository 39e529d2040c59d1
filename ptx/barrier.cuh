// Named-barrier wrappers: one thin asm per instruction, named after the
// mnemonic. PTX ISA "Parallel Synchronization and Communication Instructions:
// bar, barrier" (barrier{.cta}: ids 0-15; id 0 is __syncthreads').
#pragma once

#include <stdint.h>

namespace m3qkv::ptx {

// bar.sync id, nthreads;  PTX ISA "barrier{.cta}": a named barrier for a
// subset of the CTA (one consumer warpgroup). id 0 is __syncthreads'.
__device__ __forceinline__ void bar_sync(uint32_t id, uint32_t nthreads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(nthreads) : "memory");
}

// bar.arrive id, nthreads;  PTX ISA "barrier{.cta}": counts this warp's
// threads towards the barrier without waiting (the producer side of an
// ordering handshake whose consumer side is bar.sync on the same id).
__device__ __forceinline__ void bar_arrive(uint32_t id, uint32_t nthreads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(nthreads) : "memory");
}

}  // namespace m3qkv::ptx
