// MXFP8 -> bf16 dequantization for the bf16-wgmma mainloops, per register and per operand.
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

#include "common/layouts.h"
#include "common/numerics.h"
#include "ptx/arith.cuh"
#include "sm90/sm90.h"

namespace m3qkv::sm90 {

// bf16x2 of 2^(e) in both halves, e + 127 in [1, 254].
__device__ __forceinline__ uint32_t bf16x2_pow2_biased(uint32_t biased) { return (biased << 7) | (biased << 23); }

// Multiplying by 2^(s-127) in bf16, exactly (see above): one mul.rn.bf16x2
// by m1 = 2^(s-7) for s <= 134; else two, by m1 = 2^127 then m2 = 2^(s-134)
// (m2 = 1 for s <= 134, so the two-multiply form is right for every s).
struct Pow2Bf16 {
  uint32_t m1, m2;
};
__device__ __forceinline__ Pow2Bf16 make_pow2_bf16(uint32_t s) {
  const bool big = s > 134u;
  Pow2Bf16 f;
  f.m1 = bf16x2_pow2_biased(big ? 254u : s + 120u);
  f.m2 = bf16x2_pow2_biased(big ? s - 7u : 127u);  // s - 7 in [128, 248]; 127 = 1.0
  return f;
}
// Whether any of the 4 scale bytes of `w` needs the two-multiply form.
__device__ __forceinline__ bool any_big_scale(uint32_t w) { return __vcmpgtu4(w, 0x86868686u) != 0u; }

// Two e4m3 bytes of `w` placed as the bf16x2 of b·2^-120 in 3 operations: prmt
// puts each byte in the low byte of its half with its sign replicated above
// it ([b, sign(b)·0xFF]); shifted left by 4, bits 4-10 hold the magnitude and
// bit 15 the sign (the shift moves the low half's replicated bits into the
// high half's bits 0-3, which the mask clears). kSel = 0x9180: bytes (0, 1);
// 0xB3A2: bytes (2, 3). Checked through dequant16_e4m3_to_bf16 on all 256
// bytes x 256 scales (tests/gpu/test_sm90.cu, Sm90Dequant).
template <uint32_t kSel>
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2_2m120(uint32_t w) {
  return (ptx::prmt_b32(w, 0u, kSel) << 4) & 0x87f087f0u;
}
// Bytes (0, 1) / (2, 3) of an e4m3 word as bf16x2 times 2^(s-127): kBig =
// the two-multiply form (valid for every s), else one multiply (s <= 134).
template <bool kBig>
__device__ __forceinline__ uint32_t scale_bf16x2(uint32_t v, const Pow2Bf16& f) {
  const uint32_t o = ptx::mul_rn_bf16x2(v, f.m1);
  return kBig ? ptx::mul_rn_bf16x2(o, f.m2) : o;
}
template <bool kBig>
__device__ __forceinline__ uint32_t dequant_e4m3_lo_pair(uint32_t w, const Pow2Bf16& f) {
  return scale_bf16x2<kBig>(e4m3x2_to_bf16x2_2m120<0x9180u>(w), f);
}
template <bool kBig>
__device__ __forceinline__ uint32_t dequant_e4m3_hi_pair(uint32_t w, const Pow2Bf16& f) {
  return scale_bf16x2<kBig>(e4m3x2_to_bf16x2_2m120<0xB3A2u>(w), f);
}

// 16 e4m3 (one 16-byte chunk, element 0 in the lowest byte) times 2^(s-127)
// -> 16 bf16 in two 16-byte chunks (elements 0..7 in *lo, 8..15 in *hi).
__device__ __forceinline__ void dequant16_e4m3_to_bf16(const uint4 in, uint32_t s, uint4* lo, uint4* hi) {
  const Pow2Bf16 f = make_pow2_bf16(s);
  const uint32_t w[4] = {in.x, in.y, in.z, in.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[2 * i] = dequant_e4m3_lo_pair<false>(w[i], f);
    o[2 * i + 1] = dequant_e4m3_hi_pair<false>(w[i], f);
  }
  if (s > 134u) {
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] = ptx::mul_rn_bf16x2(o[i], f.m2);
  }
  *lo = make_uint4(o[0], o[1], o[2], o[3]);
  *hi = make_uint4(o[4], o[5], o[6], o[7]);
}

// ---------------------------------------------------- whole operands
// The once-per-call conversions of whole operands (sm90.h DequantJob): the
// tile kernels' in-grid phase (convert_sm90.cuh) and the swap-AB kernel's
// converted activations (decode_sm90.cu).
constexpr int kConvertGroup = 16;  // e4m3 per group: one 16-B load
constexpr int kConvertUnroll = 4;  // groups per thread per round (64 B of loads in flight)
constexpr int kChunkK = 4 * kMxBlock;  // K of one F8_128x4 chunk (4 scale columns); k is a multiple of it
static_assert(kMxBlock % kConvertGroup == 0, "a group lies in one MX block");

// 16 e4m3 `v` times 2^(s-127) as 16 bf16 at `out` (32 B, 16-B aligned).
__device__ __forceinline__ void convert_group_store(const uint4 v, uint32_t s, uint8_t* out) {
  uint4 lo, hi;
  dequant16_e4m3_to_bf16(v, s, &lo, &hi);
  reinterpret_cast<uint4*>(out)[0] = lo;
  reinterpret_cast<uint4*>(out)[1] = hi;
}

// Thread `t` of `T` converts groups t, t + T, ... of job x then of job w
// (K = k each), kConvertUnroll groups per round with their loads issued together.
__device__ __forceinline__ void convert_jobs(const DequantJob& x, const DequantJob& w, int64_t k, int64_t t,
                                             int64_t T) {
  const int64_t per_row = k / kConvertGroup;
  const int64_t nx = x.rows * per_row;
  const int64_t n = nx + w.rows * per_row;
  for (int64_t i0 = t; i0 < n; i0 += kConvertUnroll * T) {
    uint4 v[kConvertUnroll];
    uint32_t s[kConvertUnroll];
    uint8_t* out[kConvertUnroll];
#pragma unroll
    for (int u = 0; u < kConvertUnroll; ++u) {
      const int64_t i = i0 + u * T;
      out[u] = nullptr;
      if (i >= n) continue;
      const bool in_x = i < nx;  // field by field: a reference to either job would copy both to the stack
      const uint8_t* q = in_x ? x.q : w.q;
      const uint8_t* sf = in_x ? x.sf : w.sf;
      const int64_t g = in_x ? i : i - nx;
      const int64_t row = g / per_row;
      const int64_t c = g - row * per_row;  // K 16c .. 16c + 15: MX block c / 2
      v[u] = *reinterpret_cast<const uint4*>(q + row * k + kConvertGroup * c);
      // f8_128x4_offset(row, c / 2, k / 32) for k a multiple of 128 (one 512-B chunk per 128 rows x 128 K)
      const uint8_t* chunk = sf + ((row / 128) * (k / kChunkK) + c / (kChunkK / kConvertGroup)) * 512;
      s[u] = chunk[f8_128x4_chunk_word(static_cast<int>(row % 128)) + (c / (kMxBlock / kConvertGroup)) % 4];
      out[u] = (in_x ? x.out : w.out) + (row * k + kConvertGroup * c) * 2;
    }
#pragma unroll
    for (int u = 0; u < kConvertUnroll; ++u)
      if (out[u] != nullptr) convert_group_store(v[u], s[u], out[u]);
  }
}

}  // namespace m3qkv::sm90
