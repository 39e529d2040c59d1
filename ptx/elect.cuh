// elect.sync (PTX ISA 9.x §9.7.13.x "elect.sync", sm_90+): elects one leader
// lane among the active lanes of `membermask`; all of them must execute it.
#pragma once

#include <stdint.h>

namespace m3qkv::ptx {

// elect.sync %r|%p, membermask;  returns true in exactly one lane.
__device__ __forceinline__ bool elect_sync(uint32_t membermask = 0xffffffffu) {
  uint32_t is_leader;
  asm volatile(
      "{\n\t.reg .pred p;\n\t.reg .b32 r;\n\t"
      "elect.sync r|p, %1;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(is_leader)
      : "r"(membermask));
  return is_leader != 0;
}

}  // namespace m3qkv::ptx
