// The numerics contract of docs/contract.md §3, written once for the CPU golden model, the
// tests and every GPU backend (host + device). Each primitive states its
// rounding explicitly: on the device through the __f*_r* intrinsics (which
// nvcc never contracts into an FMA), on the host through IEEE f32 arithmetic
// compiled with -ffp-contract=off (the golden model's flags).
#pragma once

#include <stdint.h>

#if defined(__CUDACC__)
#define M3_HD __host__ __device__ __forceinline__
#define M3_DEV __device__ __forceinline__
#else
#define M3_HD inline
#define M3_DEV inline
#endif

#if !defined(__CUDA_ARCH__)
#include <cmath>
#include <cstring>
#endif

namespace m3qkv {

constexpr int kHeadDim = 128;
constexpr int kRopeDim = 64;       // RoPE acts on columns 0..63 (NeoX halves 0..31 / 32..63)
constexpr int kRopeHalf = 32;
constexpr int kNvfp4Group = 16;    // NVFP4 values per scale byte
constexpr int kMxBlock = 32;       // MXFP8 values per e8m0 scale

// ---------------------------------------------------------------- bit casts
M3_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
M3_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
M3_HD bool is_nan_f32(float f) { return (f32_bits(f) & 0x7fffffffu) > 0x7f800000u; }
M3_HD float abs_f32(float f) { return bits_f32(f32_bits(f) & 0x7fffffffu); }
// IEEE maxNum: a NaN operand is ignored (docs/contract.md §3.5 "max ignores NaN").
// The host path is explicit: glibc's fmax returns NaN when an operand is a
// *signalling* NaN (IEEE 754-2008 maxNum), while the GPU's fmaxf ignores any
// NaN; a bf16 sNaN in the MX quantizer's input exposed the difference.
M3_HD float max_num(float a, float b) {
#if defined(__CUDA_ARCH__)
  return fmaxf(a, b);
#else
  if (is_nan_f32(b)) return a;
  if (is_nan_f32(a)) return b;
  return a < b ? b : a;
#endif
}

// ------------------------------------------------------- rounded arithmetic
// a·b + c with one rounding (RN).
M3_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
M3_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
M3_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
// RN(1/x), correctly rounded.
M3_HD float rcp_rn(float x) {
#if defined(__CUDA_ARCH__)
  return __frcp_rn(x);
#else
  return 1.0f / x;
#endif
}

#if !defined(__CUDA_ARCH__)
// a·b rounded toward zero. The product of two f32 is exact in f64 (48 < 53
// significant bits, exponent range ample), so RZ is "round the exact f64 to
// f32, step one ulp toward zero if that moved away from zero".
inline float mul_rz_host(float a, float b) {
  const double p = static_cast<double>(a) * static_cast<double>(b);
  if (std::isnan(p) || std::isinf(p) || p == 0.0) return static_cast<float>(p);
  float f = static_cast<float>(p);  // RN (may give inf on overflow)
  if (std::fabs(static_cast<double>(f)) > std::fabs(p)) f = std::nextafter(f, 0.0f);
  return f;
}

// Correctly rounded 1/sqrt(t) for t > 0 finite (NaN/inf/0/negatives follow
// IEEE: rsqrt(±0) = ±inf, rsqrt(+inf) = +0, rsqrt(<0) = NaN). The candidate
// from f64 is off by at most one ulp; it is fixed by deciding exactly, in
// integers, on which side of 1/sqrt(t) each neighbouring midpoint lies:
// m > 1/sqrt(t)  <=>  m²·t > 1, with m = Mm·2^em (25-bit Mm), t = Mt·2^et.
inline int rsqrt_mid_cmp(double mid, float t) {
  // returns sign(mid²·t - 1) exactly
  int em, et;
  const double fm = std::frexp(mid, &em);  // mid = fm·2^em, fm in [0.5,1)
  const double ft = std::frexp(static_cast<double>(t), &et);
  const unsigned __int128 Mm = static_cast<unsigned __int128>(std::ldexp(fm, 26));  // exact: mid has <= 26 bits
  const unsigned __int128 Mt = static_cast<unsigned __int128>(std::ldexp(ft, 24));  // t has <= 24 bits
  // mid²·t = Mm²·Mt · 2^(2(em-26) + (et-24))
  const unsigned __int128 prod = Mm * Mm * Mt;  // < 2^(52+24) fits
  const int e = 2 * (em - 26) + (et - 24);
  // compare prod·2^e with 1  <=>  prod with 2^-e
  if (e >= 0) return prod == 0 ? -1 : 1;  // prod >= 1 and e >= 0: >= 1; equality impossible unless prod==1,e==0
  const int s = -e;
  if (s >= 127) return -1;
  const unsigned __int128 one = static_cast<unsigned __int128>(1) << s;
  return prod > one ? 1 : (prod < one ? -1 : 0);
}
inline float rsqrt_rn_host(float t) {
  if (is_nan_f32(t) || t < 0.0f) return bits_f32(0x7fc00000u);
  if (t == 0.0f) return bits_f32(0x7f800000u | (f32_bits(t) & 0x80000000u));  // rsqrt(±0) = ±inf
  if (std::isinf(t)) return 0.0f;
  float r = static_cast<float>(1.0 / std::sqrt(static_cast<double>(t)));
  for (int it = 0; it < 4; ++it) {
    const double lo = (static_cast<double>(std::nextafter(r, 0.0f)) + r) * 0.5;
    const double hi = (static_cast<double>(std::nextafter(r, bits_f32(0x7f800000u))) + r) * 0.5;
    // y = 1/sqrt(t) must satisfy lo < y < hi (ties are impossible, see above).
    if (rsqrt_mid_cmp(hi, t) <= 0) { r = std::nextafter(r, bits_f32(0x7f800000u)); continue; }  // hi <= y
    if (rsqrt_mid_cmp(lo, t) >= 0) { r = std::nextafter(r, 0.0f); continue; }     // lo >= y
    break;
  }
  return r;
}
#endif

// value·rc rounded toward zero (NVFP4 quantizer, docs/contract.md §3.5).
M3_HD float mul_rz(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rz(a, b);
#else
  return mul_rz_host(a, b);
#endif
}
// Correctly rounded 1/sqrt(t) (docs/contract.md §3.1).
M3_HD float rsqrt_rn(float t) {
#if defined(__CUDA_ARCH__)
  return __frsqrt_rn(t);
#else
  return rsqrt_rn_host(t);
#endif
}

// ------------------------------------------------------------ conversions
// bf16 <-> f32. f32 -> bf16 as cvt.rn.bf16.f32: RN-even, overflow to inf;
// any NaN -> canonical 0x7FFF (CUDA 13 cuda_bf16.hpp host path; checked against
// the hardware over all f32 patterns by the GPU suite).
M3_HD float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }
M3_HD uint16_t f32_to_bf16_rn_soft(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  const uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16);
}

// e4m3 (OCP FP8 E4M3FN: bias 7, no inf, NaN = S.1111.111) -> f32, exact.
M3_HD float e4m3_to_f32(uint8_t b) {
  const uint32_t s = (b & 0x80u) << 24;
  const uint32_t e = (b >> 3) & 0xfu;
  const uint32_t m = b & 7u;
  if (e == 0xfu && m == 7u) return bits_f32(s | 0x7fc00000u);
  if (e == 0) {
    // subnormal: m · 2^-9
    const float v = static_cast<float>(m) * (1.0f / 512.0f);
    return (b & 0x80u) ? -v : v;
  }
  return bits_f32(s | ((e + 120u) << 23) | (m << 20));
}

// f32 -> e4m3 as cvt.rn.satfinite.e4m3x2.f32: RN-even to E4M3 (subnormals down
// to 2^-9), |x| >= 448 (incl. inf) -> ±448, any NaN -> 0x7F (the sign is dropped:
// CUDA 13 cuda_fp8.hpp __nv_cvt_float_to_fp8 host path canonicalizes NaN to
// 0x7FFFFFFF before converting; checked against the hardware by the GPU suite).
M3_HD uint8_t f32_to_e4m3_satfinite_rn_soft(float f) {
  const uint32_t u = f32_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fu;
  if (a >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);  // >= 448 (incl. inf): 448
  const int e = static_cast<int>(a >> 23);  // biased f32 exponent
  // Normal e4m3 needs unbiased exponent >= -6 (f32 biased >= 121).
  if (e >= 121) {
    // keep 3 mantissa bits of 23: drop 20 with RN-even
    const uint32_t lsb = (a >> 20) & 1u;
    const uint32_t r = (a + 0x7ffffu + lsb) >> 20;  // f32 exponent|3 mantissa bits, rounded
    // r = (e << 3 | m3) possibly carried; re-bias from 127 to 7: subtract 120 << 3
    const uint32_t code = r - (120u << 3);
    return static_cast<uint8_t>(sign | code);  // a < 448, so code <= 0x7E
  }
  // Subnormal range: value = k · 2^-9, k in 0..8 (8 = smallest normal 2^-6).
  // k = RN-even(|x| · 2^9); |x| < 2^-6 here, so |x|·2^9 < 8 exactly scaled.
  const float scaled = bits_f32(a) * 512.0f;  // exact (power-of-two scaling, no underflow: result >= 2^-140)
  uint32_t k = static_cast<uint32_t>(scaled);  // floor
  const float frac = scaled - static_cast<float>(k);  // exact
  if (frac > 0.5f || (frac == 0.5f && (k & 1u))) ++k;
  return static_cast<uint8_t>(sign | k);  // k == 8 is the code of 2^-6 (e = 1, m = 0)
}

// e8m0 scale byte -> f32: 2^(b - 127); 0xFF is NaN. 2^-127 is an f32 subnormal (exact).
M3_HD float e8m0_to_f32(uint8_t b) {
  if (b == 0xffu) return bits_f32(0x7fc00000u);
  if (b == 0) return bits_f32(0x00400000u);
  return bits_f32(static_cast<uint32_t>(b) << 23);
}

// e2m1 nibble (S.EE.M) -> f32: {0, .5, 1, 1.5, 2, 3, 4, 6}.
M3_HD float e2m1_to_f32(uint8_t c) {
  const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = mag[c & 7u];
  return (c & 8u) ? -v : v;
}

// f32 -> e2m1 as cvt.rn.satfinite.e2m1x2.f32: RN-even on {0,.5,1,1.5,2,3,4,6},
// |x| > 6 (incl. inf) -> ±6, NaN -> +6 (0x7; CUDA 13 cuda_fp4.hpp: "NaN converts to
// positive FP4_MAXNORM"). Returns the 4-bit code; -0 results keep the sign bit
// (callers clear it, docs/contract.md §3.5).
M3_HD uint8_t f32_to_e2m1_satfinite_rn_soft(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7u;
  const uint8_t sign = static_cast<uint8_t>((u >> 28) & 0x8u);
  const float a = abs_f32(f);
  // Ties (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5) go to the even code (mantissa bit 0).
  uint8_t c;
  if (a <= 0.25f) c = 0;
  else if (a < 0.75f) c = 1;
  else if (a <= 1.25f) c = 2;
  else if (a < 1.75f) c = 3;
  else if (a <= 2.5f) c = 4;
  else if (a < 3.5f) c = 5;
  else if (a <= 5.0f) c = 6;
  else c = 7;
  return static_cast<uint8_t>(sign | c);
}

// The same function without branches, for the device (the NVFP4 heads'
// epilogue encodes 32 values per lane; every instruction of it is on the
// critical path of a lone warp). With a = |f|:
//  * a >= 1 (bits >= 0x3F800000, which includes inf and NaN): the nearest
//    e2m1 code is the f32 exponent and top mantissa bit rounded to nearest
//    even in the integer domain ((bits + 0x1FFFFF + bit22) >> 22, minus the
//    code of 1.0's offset 252), saturated at 7 (inf and NaN land there too);
//  * a < 1: the code is 2a rounded to nearest even, which the f32 adder
//    computes: a + 2^22 has an ulp of 0.5, so RN(a + 2^22) = 2^22 + k / 2
//    with k in {0, 1, 2}, the mantissa field (ties 0.25, 0.75 go to the even
//    k, as cvt does);
//  * the sign bit is kept except for NaN (-> +6, code 0x7).
// Proven equal to f32_to_e2m1_satfinite_rn_soft on all 2^32 patterns, on
// the host (Numerics.E2m1BranchFreeEqualsReferenceOnAllF32Patterns) and on
// the device (GpuConversions.E2m1BranchFreeAllF32Patterns).
M3_HD uint8_t f32_to_e2m1_satfinite_rn_branchfree(float f) {
  const uint32_t u = f32_bits(f);
  const uint32_t au = u & 0x7fffffffu;
  const uint32_t hi = ((au + 0x1fffffu + ((au >> 22) & 1u)) >> 22) - 252u;  // a >= 1
  const uint32_t lo = f32_bits(add_rn(bits_f32(au), 4194304.0f /* 2^22 */)) - 0x4a800000u;  // a < 1
  const uint32_t c = au >= 0x3f800000u ? (hi < 7u ? hi : 7u) : lo;
  const uint32_t sign = au <= 0x7f800000u ? (u >> 28) & 0x8u : 0u;
  return static_cast<uint8_t>(sign | c);
}

// --------------------------------------------------- MXFP8 (OCP MX) rule
// 2^e as an f32 for e in [-149, 127] (exact; subnormal below -126).
M3_HD float exp2i_f32(int e) {
  if (e >= -126) return bits_f32(static_cast<uint32_t>(e + 127) << 23);
  return bits_f32(1u << (e + 149));
}
// floor(log2(a)) of a finite a > 0 (subnormals included), exact from the bits.
M3_HD int floor_log2_f32(float a) {
  const uint32_t u = f32_bits(a) & 0x7fffffffu;
  const int be = static_cast<int>(u >> 23);
  if (be != 0) return be - 127;
#if defined(__CUDA_ARCH__)
  return -149 + (31 - __clz(u));
#else
  return -149 + (31 - __builtin_clz(u));
#endif
}
// Shared exponent of one 32-value MX block (m3qkv_quantize_args):
// e = clamp(floor(log2(amax)) - 8, -127, 127), where amax is the max_num fold
// of |x| starting at +0 (NaN elements are ignored). amax = 0 (or all NaN)
// gives -127; amax = +inf gives 127 (finite elements then quantize to ±0,
// ±inf to ±448). NaN elements encode as 0x7F in any block. The scale byte is
// e + 127 (never 0xFF).
M3_HD int mx_shared_exponent(float amax) {
  if (!(amax > 0.0f)) return -127;                          // 0, or NaN defensively
  if (f32_bits(amax) >= 0x7f800000u) return 127;            // +inf
  const int e = floor_log2_f32(amax) - 8;
  return e < -127 ? -127 : (e > 127 ? 127 : e);
}
// One MX element: e4m3_satfinite_rn(x / 2^e), computed as x · 2^-e (the same
// real number, so the same single RN rounding; 2^-e is exact for |e| <= 127).
M3_HD uint8_t mx_quantize_value(float x, int e) {
  return f32_to_e4m3_satfinite_rn_soft(mul_rn(x, exp2i_f32(-e)));
}

// ----------------------------------------------------- epilogue primitives
// RMSNorm column class (docs/contract.md §3.1): four interleaved partial sums.
M3_HD int rms_class(int c) { return (c >> 1) & 3; }

// total = (s0 + s1) + (s2 + s3); t = fma(total, 2^-7, eps); r = rsqrt_rn(t).
M3_HD float rms_inv(float s0, float s1, float s2, float s3, float eps) {
  const float total = add_rn(add_rn(s0, s1), add_rn(s2, s3));
  return rsqrt_rn(fma_rn(total, 0.0078125f, eps));
}
// y = fma(n, w, n) with n = x·r (Gemma scale 1 + w).
M3_HD float rms_apply(float x, float r, float w) {
  const float n = mul_rn(x, r);
  return fma_rn(n, w, n);
}
// NeoX RoPE on one pair (i, i+32): y_i = fma(u, co, -(v·si)), y_{i+32} = fma(v, co, u·si).
M3_HD void rope_pair(float u, float v, float co, float si, float* yu, float* yv) {
  *yu = fma_rn(u, co, -mul_rn(v, si));
  *yv = fma_rn(v, co, mul_rn(u, si));
}

// NVFP4 group scale (docs/contract.md §3.5). `sf` is RN(1/k_scale) or RN(1/v_scale);
// has_sf = false for index_k. Returns the e4m3 scale byte and sets *rc.
M3_HD uint8_t nvfp4_group_scale(float amax, bool has_sf, float sf, float* rc) {
  float a = mul_rn(amax, 0.16666667163372040f /* RN(1/6) = 0x3E2AAAAB */);
  if (has_sf) a = mul_rn(a, sf);
  a = max_num(a, 0.001953125f /* 2^-9 */);
  const uint8_t s8 = f32_to_e4m3_satfinite_rn_soft(a);
  float r = rcp_rn(e4m3_to_f32(s8));
  if (has_sf) r = mul_rn(r, sf);
  *rc = r;
  return s8;
}
// One NVFP4 code: e2m1(RZ(value·rc)), magnitude-0 codes stored as +0.
M3_HD uint8_t nvfp4_encode(float value, float rc) {
#if defined(__CUDA_ARCH__)
  const uint8_t c = f32_to_e2m1_satfinite_rn_branchfree(mul_rz(value, rc));
#else
  const uint8_t c = f32_to_e2m1_satfinite_rn_soft(mul_rz(value, rc));
#endif
  return (c & 7u) ? c : 0u;
}

}  // namespace m3qkv
