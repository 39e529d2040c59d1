// Shared-memory loads and stores by 32-bit shared-window address (PTX ISA
// "ld" / "st", state space .shared::cta): for roles whose register budget
// cannot hold 64-bit generic pointers (the SM90 transform warps, 32 registers).
#pragma once

#include <stdint.h>

namespace m3qkv::ptx {

// ld.shared.b32 d, [addr];
__device__ __forceinline__ uint32_t ld_shared_b32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

// st.shared.v4.b32 [addr], {a, b, c, d};  addr 16-B aligned.
__device__ __forceinline__ void st_shared_v4_b32(uint32_t addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

}  // namespace m3qkv::ptx
