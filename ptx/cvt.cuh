// cvt / rcp wrappers: one thin inline-asm wrapper per instruction, named after
// the mnemonic. No logic beyond the instruction. Each wrapper exists only where
// the instruction does; M3QKV_HAS_<NAME> says so (0 in host passes), so callers
// write `#if M3QKV_HAS_CVT_RN_SATFINITE_E4M3X2_F32 ... #else <software> #endif`.
//
// Packing of the x2 forms (PTX ISA, "Data Movement and Conversion Instructions:
// cvt"): for `cvt.*x2.f32 d, a, b` the result of `a` goes to the UPPER half of d
// and the result of `b` to the lower half. The wrappers take (lo, hi) in memory
// order and pass them as (a = hi, b = lo), so lo lands in the low byte / half /
// nibble — the element order of our caches and outputs.
#pragma once

#include <stdint.h>

// ---- cvt.rn.satfinite.e4m3x2.f32: PTX ISA 7.8, sm_89+ ----------------------
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define M3QKV_HAS_CVT_RN_SATFINITE_E4M3X2_F32 1
// Returns e4m3(lo) | e4m3(hi) << 8.
__device__ __forceinline__ uint16_t cvt_rn_satfinite_e4m3x2_f32(float lo, float hi) {
  uint16_t d;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
  return d;
}
#else
#define M3QKV_HAS_CVT_RN_SATFINITE_E4M3X2_F32 0
#endif

// ---- cvt.rn.f16x2.e4m3x2: PTX ISA 7.8, sm_89+ -------------------------------
// The byte pair `pair` (lo byte = element 0) to two f16, lo byte in the low half
// (the packing rule above). Every e4m3 value is an f16 value, so this is exact.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define M3QKV_HAS_CVT_RN_F16X2_E4M3X2 1
__device__ __forceinline__ uint32_t cvt_rn_f16x2_e4m3x2(uint16_t pair) {
  uint32_t d;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(d) : "h"(pair));
  return d;
}
#else
#define M3QKV_HAS_CVT_RN_F16X2_E4M3X2 0
#endif

// ---- cvt.f32.f16: PTX ISA 1.0, every target (widening: exact) --------------
#if defined(__CUDA_ARCH__)
#define M3QKV_HAS_CVT_F32_F16 1
__device__ __forceinline__ float cvt_f32_f16(uint16_t h) {
  float d;
  asm("cvt.f32.f16 %0, %1;" : "=f"(d) : "h"(h));
  return d;
}
#else
#define M3QKV_HAS_CVT_F32_F16 0
#endif

// ---- cvt.rn.bf16x2.f32: PTX ISA 7.0, sm_80+ ---------------------------------
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define M3QKV_HAS_CVT_RN_BF16X2_F32 1
// Returns bf16(lo) | bf16(hi) << 16.
__device__ __forceinline__ uint32_t cvt_rn_bf16x2_f32(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
#else
#define M3QKV_HAS_CVT_RN_BF16X2_F32 0
#endif

// ---- cvt.rn.satfinite.e2m1x2.f32: PTX ISA 8.6, sm_100a/sm_101a (family
// sm_100f from PTX ISA 8.8). The destination is a .b8 register, widened here.
#if defined(__CUDA_ARCH__) &&                                                        \
    (defined(__CUDA_ARCH_FEAT_SM100_ALL) || defined(__CUDA_ARCH_FEAT_SM103_ALL) ||  \
     (defined(__CUDA_ARCH_FAMILY_SPECIFIC__) && __CUDA_ARCH_FAMILY_SPECIFIC__ >= 1000 && \
      __CUDA_ARCH_FAMILY_SPECIFIC__ < 1100))
#define M3QKV_HAS_CVT_RN_SATFINITE_E2M1X2_F32 1
// Returns e2m1(lo) | e2m1(hi) << 4 (one byte, in the low 8 bits).
__device__ __forceinline__ uint32_t cvt_rn_satfinite_e2m1x2_f32(float lo, float hi) {
  uint32_t d;
  asm("{\n\t.reg .b8 b;\n\t"
      "cvt.rn.satfinite.e2m1x2.f32 b, %1, %2;\n\t"
      "cvt.u32.u8 %0, b;\n\t}"
      : "=r"(d)
      : "f"(hi), "f"(lo));
  return d;
}
#else
#define M3QKV_HAS_CVT_RN_SATFINITE_E2M1X2_F32 0
#endif

// ---- rcp.approx.ftz.f32: PTX ISA 1.0 (".ftz" form), every target -----------
// PTX ISA "Floating Point Instructions: rcp". Approximate: usable for RN(1/s)
// only on inputs where a GPU test proves equality (the 126 positive finite e4m3).
#if defined(__CUDA_ARCH__)
#define M3QKV_HAS_RCP_APPROX_FTZ_F32 1
__device__ __forceinline__ float rcp_approx_ftz_f32(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
#else
#define M3QKV_HAS_RCP_APPROX_FTZ_F32 0
#endif
