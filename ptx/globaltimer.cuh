// mov.u64 %globaltimer: a 64-bit nanosecond timer shared by the whole GPU
// (PTX ISA, special registers: %globaltimer). Used only by test-time
// instrumentation (per-CTA event timelines), never on a production path.
#pragma once

#include <stdint.h>

namespace m3qkv::ptx {

__device__ __forceinline__ uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace m3qkv::ptx
