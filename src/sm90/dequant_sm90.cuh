// MXFP8 -> bf16 dequantization for the bf16-wgmma mainloop (variant A).
//
// e4m3 · 2^(s-127) is exact in bf16 whenever the product lies in bf16's range
// (8 exponent bits like f32; subnormals down to 2^-133): bf16 has 7 mantissa
// bits, e4m3 3. Integer form, two values per 32-bit word, no conversion unit:
//   * an e4m3 byte b = S.EEEE.MMM placed as bf16 bits S.0000EEEE.MMM0000
//     (((b & 0x7f) << 4) | ((b & 0x80) << 8)) is the bf16 number b·2^-120,
//     normals (E > 0: 2^(E-127)(1+M/8) vs 2^(E-7)(1+M/8)) and subnormals
//     (E = 0: 2^-126·M/8 vs 2^-6·M/8) alike, zeros included;
//   * one mul.rn.bf16x2 by 2^(s-7) then gives b·2^(s-127), exactly when the
//     result is representable. 2^(s-7) is a bf16 normal for s <= 134; above, a
//     second multiply (2^127 then 2^(s-134)) keeps every step exact.
// Not covered (documented in docs/sm90.md): e4m3 NaN bytes (0x7F/0xFF) decode
// as ±480·2^(s-127) instead of NaN, the e8m0 NaN scale 0xFF as 2^121, and
// products outside bf16's range (|e4m3·2^(s-127)| < 2^-133 or > 3.4e38) round.
#pragma once

#include <stdint.h>

#include "ptx/sm90_extra.cuh"

namespace m3qkv::sm90 {

// Two e4m3 bytes sitting in the HIGH byte of each 16-bit half -> bf16x2 of b·2^-120.
__device__ __forceinline__ uint32_t e4m3x2_hi_bytes_to_bf16x2_2m120(uint32_t v) {
  return ((v & 0x7f007f00u) >> 4) | (v & 0x80008000u);
}

// bf16x2 of 2^(e) in both halves, e + 127 in [1, 254].
__device__ __forceinline__ uint32_t bf16x2_pow2_biased(uint32_t biased) { return (biased << 7) | (biased << 23); }

// Multiplying by 2^(s-127) in bf16, exactly (see above): one mul.rn.bf16x2
// by 2^(s-7) for s <= 134, else two (2^127, then 2^(s-134)).
struct Pow2Bf16 {
  uint32_t m1, m2;
  bool big;
};
__device__ __forceinline__ Pow2Bf16 make_pow2_bf16(uint32_t s) {
  Pow2Bf16 f;
  f.big = s > 134u;
  f.m1 = bf16x2_pow2_biased(f.big ? 254u : s + 120u);
  f.m2 = bf16x2_pow2_biased(s - 7u);  // used only when big: s - 7 in [128, 248]
  return f;
}
// bf16x2 of b·2^-120 (e4m3x2_hi_bytes_to_bf16x2_2m120) times 2^(s-127).
__device__ __forceinline__ uint32_t scale_bf16x2(uint32_t v, const Pow2Bf16& f) {
  const uint32_t o = ptx::mul_rn_bf16x2(v, f.m1);
  return f.big ? ptx::mul_rn_bf16x2(o, f.m2) : o;
}
// Bytes (0, 1) and (2, 3) of an e4m3 word as bf16x2 pairs times 2^(s-127).
__device__ __forceinline__ uint32_t dequant_e4m3_lo_pair(uint32_t w, const Pow2Bf16& f) {
  // __byte_perm selector nibbles pick bytes of (w, 0): 4 = zero byte.
  return scale_bf16x2(e4m3x2_hi_bytes_to_bf16x2_2m120(__byte_perm(w, 0u, 0x1404u)), f);  // [0, b0, 0, b1]
}
__device__ __forceinline__ uint32_t dequant_e4m3_hi_pair(uint32_t w, const Pow2Bf16& f) {
  return scale_bf16x2(e4m3x2_hi_bytes_to_bf16x2_2m120(__byte_perm(w, 0u, 0x3424u)), f);  // [0, b2, 0, b3]
}

// 16 e4m3 (one 16-byte chunk, element 0 in the lowest byte) times 2^(s-127)
// -> 16 bf16 in two 16-byte chunks (elements 0..7 in *lo, 8..15 in *hi).
__device__ __forceinline__ void dequant16_e4m3_to_bf16(const uint4 in, uint32_t s, uint4* lo, uint4* hi) {
  const Pow2Bf16 f = make_pow2_bf16(s);
  const uint32_t w[4] = {in.x, in.y, in.z, in.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[2 * i] = dequant_e4m3_lo_pair(w[i], f);
    o[2 * i + 1] = dequant_e4m3_hi_pair(w[i], f);
  }
  *lo = make_uint4(o[0], o[1], o[2], o[3]);
  *hi = make_uint4(o[4], o[5], o[6], o[7]);
}

}  // namespace m3qkv::sm90
