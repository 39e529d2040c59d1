// Shared-memory loads and stores by 32-bit shared-window address (PTX ISA
// "ld" / "st", state space .shared::cta): for roles whose register budget
// would otherwise hold 64-bit generic pointers (the SM90 swap-AB kernel's
// transform warps and A-fragment loads).
#pragma once

#include <stdint.h>

namespace m3qkv::ptx {

// ld.shared.b32 d, [addr];
__device__ __forceinline__ uint32_t ld_shared_b32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

// ld.shared.u16 d, [addr];  zero-extended into the 32-bit register (the
// byte pair in bits 0-15).
__device__ __forceinline__ uint32_t ld_shared_u16(uint32_t addr) {
  uint16_t v;
  asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(addr) : "memory");
  return v;
}

// ld.shared.v4.b32 {a, b, c, d}, [addr];  addr 16-B aligned.
__device__ __forceinline__ uint4 ld_shared_v4_b32(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
  return v;
}

// st.shared.v4.b32 [addr], {a, b, c, d};  addr 16-B aligned.
__device__ __forceinline__ void st_shared_v4_b32(uint32_t addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

}  // namespace m3qkv::ptx
