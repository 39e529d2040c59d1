// Arithmetic and byte-permute wrappers the dequantizers use: one thin asm per
// instruction, named after the mnemonic, no logic beyond it.
#pragma once

#include <stdint.h>

namespace m3qkv::ptx {

// mul.rn.bf16x2 d, a, b;  PTX ISA 7.8+, sm_90 ("Half Precision Floating-Point
// Instructions: mul"). No .ftz form exists for bf16: subnormal inputs and
// results are kept (the SM90 dequantizer relies on it; the GPU test
// Sm90Dequant.AllBytesAllScales checks it on all 256 x 256 (byte, scale) pairs).
__device__ __forceinline__ uint32_t mul_rn_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// prmt.b32 d, a, b, c;  PTX ISA "prmt" (default mode): byte n of d is byte
// c[4n+2 : 4n] of the 8 bytes {b, a} (a = bytes 0-3); when bit 4n+3 of c is
// set, the sign bit of that byte replicated instead (0x00 or 0xFF).
// (__byte_perm uses only the 3 low bits of each selector nibble.)
__device__ __forceinline__ uint32_t prmt_b32(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

}  // namespace m3qkv::ptx
