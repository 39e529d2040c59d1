// Conversions and rounded primitives of common/numerics.h against independent
// first-principles references written here (nearest-value searches over the
// code tables, the FPU in round-toward-zero mode, long double + an exact
// integer check). None of the references calls the code under test.
#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/numerics.h"
#include "common/ref_e4m3.h"
#include "common/test_util.h"

namespace {

using namespace m3qkv;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float fbits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
bool same_or_both_nan(float a, float b) { return (std::isnan(a) && std::isnan(b)) || bits(a) == bits(b); }

// ---------------------------------------------------------------- e4m3
// First-principles reference: tests/common/ref_e4m3.h.
using m3qkv_test::ref_e4m3_encode;
using m3qkv_test::ref_e4m3_value;

TEST(E4m3, DecodeAll256Codes) {
  for (int c = 0; c < 256; ++c) {
    const float got = e4m3_to_f32(uint8_t(c));
    const double want = ref_e4m3_value(c);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
    } else {
      EXPECT_EQ(double(got), want) << "code " << c;
      EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << "code " << c;
    }
  }
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), 0.001953125f);  // 2^-9
  EXPECT_EQ(e4m3_to_f32(0x08), 0.015625f);     // 2^-6, smallest normal
}

TEST(E4m3, EncodeHandCases) {
  EXPECT_EQ(f32_to_e4m3_satfinite_rn_soft(1.0f), 0x38);
  EXPECT_EQ(f32_to_e4m3_satfinite_rn_soft(-448.0f), 0xfe);
  EXPECT_EQ(f32_to_e4m3_satfinite_rn_soft(1000.0f), 0x7e);    // satfinite
  EXPECT_EQ(f32_to_e4m3_satfinite_rn_soft(-INFINITY), 0xfe);  // inf -> max finite
  EXPECT_EQ(f32_to_e4m3_satfinite_rn_soft(0x1p-10f), 0x00);   // half the smallest subnormal: tie to 0
  EXPECT_EQ(f32_to_e4m3_satfinite_rn_soft(0x3p-11f), 0x01);   // 0.75 units of 2^-9 -> 1
  EXPECT_EQ(f32_to_e4m3_satfinite_rn_soft(0x3p-10f), 0x02);   // 1.5 units of 2^-9: tie -> even 2
  EXPECT_EQ(f32_to_e4m3_satfinite_rn_soft(0x5p-10f), 0x02);   // 2.5 units: tie -> even 2
  EXPECT_EQ(f32_to_e4m3_satfinite_rn_soft(0x1.1p0f), 0x38);   // 1.0625 = 1 + half ulp: tie -> even (1.0)
  EXPECT_EQ(f32_to_e4m3_satfinite_rn_soft(0x1.3p0f), 0x3a);   // 1.1875 = 1.125 + half ulp: tie -> 1.25
  EXPECT_EQ(f32_to_e4m3_satfinite_rn_soft(-0x1p-12f), 0x80);  // underflow keeps the sign
  EXPECT_EQ(f32_to_e4m3_satfinite_rn_soft(std::nanf("")), 0x7f);
  EXPECT_EQ(f32_to_e4m3_satfinite_rn_soft(-std::nanf("")), 0x7f);  // canonical NaN, sign dropped
}

TEST(E4m3, EncodeEveryCodeMidpointAndNeighbours) {
  std::vector<float> pts;
  for (int c = 0; c <= 0x7e; ++c) {
    const float v = float(ref_e4m3_value(c));
    pts.push_back(v);
    if (c < 0x7e) {
      const float mid = float((ref_e4m3_value(c) + ref_e4m3_value(c + 1)) / 2);  // exact in f32
      pts.push_back(mid);
      pts.push_back(std::nextafter(mid, 0.0f));
      pts.push_back(std::nextafter(mid, 1e30f));
    }
    pts.push_back(std::nextafter(v, 0.0f));
    pts.push_back(std::nextafter(v, 1e30f));
  }
  // Around the saturation point and beyond: 464 is the midpoint 448|480.
  for (float v : {447.99997f, 448.0f, 448.00003f, 463.99997f, 464.0f, 464.00003f, 480.0f, 1e6f, 3.4e38f}) pts.push_back(v);
  // f32 subnormals and the underflow boundary 2^-10 (half the smallest e4m3 subnormal).
  for (uint32_t u : {0x00000001u, 0x00000002u, 0x007fffffu, 0x00800000u, 0x3a7fffffu, 0x3a800000u, 0x3a800001u})
    pts.push_back(fbits(u));
  pts.push_back(INFINITY);
  pts.push_back(std::nanf(""));
  pts.push_back(fbits(0x7f800001u));  // signalling-pattern NaN
  int n = 0;
  for (float p : pts)
    for (float s : {p, -p}) {
      ASSERT_EQ(f32_to_e4m3_satfinite_rn_soft(s), ref_e4m3_encode(s)) << "x = " << s << " bits 0x" << std::hex << bits(s);
      ++n;
    }
  EXPECT_GT(n, 1000);
}

// Sample: (a) every 65537th f32 bit pattern over all 2^32 (65537 is odd, so it
// visits every exponent and sign); (b) stratified over every f32 exponent that
// can reach e4m3 (2^-12 .. 2^10) and both signs: each of the 16 top-mantissa
// prefixes (sign of result digits) combined with the 20 low bits in
// {0, 1, round-bit-1, round-bit ± 1, all ones} and 8 random values — exactly
// the classes that decide RN-even at 3 kept bits.
TEST(E4m3, EncodeStratifiedSample) {
  std::mt19937_64 rng(m3qkv_test::test_seed());
  uint64_t checked = 0;
  for (uint64_t u = 0; u < (1ull << 32); u += 65537) {
    const float x = fbits(uint32_t(u));
    ASSERT_EQ(f32_to_e4m3_satfinite_rn_soft(x), ref_e4m3_encode(x)) << "bits 0x" << std::hex << u;
    ++checked;
  }
  for (uint32_t sign : {0u, 0x80000000u})
    for (uint32_t e = 127 - 12; e <= 127 + 10; ++e)
      for (uint32_t top = 0; top < 8; ++top) {
        std::vector<uint32_t> lows = {0, 1, 0x80000, 0x7ffff, 0x80001, 0xfffff};
        for (int i = 0; i < 8; ++i) lows.push_back(uint32_t(rng()) & 0xfffff);
        for (uint32_t low : lows) {
          const uint32_t u = sign | (e << 23) | (top << 20) | low;
          const float x = fbits(u);
          ASSERT_EQ(f32_to_e4m3_satfinite_rn_soft(x), ref_e4m3_encode(x)) << "bits 0x" << std::hex << u;
          ++checked;
        }
      }
  EXPECT_GT(checked, 70000u);
}

// ---------------------------------------------------------------- e2m1
double ref_e2m1_value(int code) {
  const int s = code >> 3, e = (code >> 1) & 3, m = code & 1;
  const double mag = e == 0 ? 0.5 * m : std::ldexp(1.0 + 0.5 * m, e - 1);
  return s ? -mag : mag;
}
// Nearest of the 8 magnitudes, ties to the even code, |x| > 6 -> 6, NaN -> +6.
uint8_t ref_e2m1_encode(float x) {
  if (std::isnan(x)) return 0x7;
  const uint8_t sign = std::signbit(x) ? 8 : 0;
  const double a = std::fabs(double(x));
  if (a > 6.0) return uint8_t(sign | 7);  // satfinite (f64 distances to 4 and 6 tie for huge |x|)
  int best = 0;
  double bd = a;
  for (int c = 1; c < 8; ++c) {
    const double d = std::fabs(a - ref_e2m1_value(c));
    if (d < bd || (d == bd && (c & 1) == 0)) {
      best = c;
      bd = d;
    }
  }
  return uint8_t(sign | best);
}

TEST(E2m1, DecodeAll16Codes) {
  const double want[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(double(e2m1_to_f32(uint8_t(c))), want[c]) << c;
    EXPECT_EQ(double(e2m1_to_f32(uint8_t(c))), ref_e2m1_value(c)) << c;
  }
  EXPECT_TRUE(std::signbit(e2m1_to_f32(8)));
}

TEST(E2m1, EncodeEveryBoundary) {
  // Hand list of the rounding boundaries: midpoints go to the even code.
  struct Case { float x; uint8_t code; };
  const Case hand[] = {{0.25f, 0}, {0.75f, 2}, {1.25f, 2}, {1.75f, 4}, {2.5f, 4}, {3.5f, 6}, {5.0f, 6},
                       {6.0f, 7},  {7.0f, 7},  {1e30f, 7}, {INFINITY, 7}, {0.0f, 0}, {-0.0f, 8}, {-5.0f, 14}};
  for (const auto& c : hand) EXPECT_EQ(f32_to_e2m1_satfinite_rn_soft(c.x), c.code) << c.x;
  EXPECT_EQ(f32_to_e2m1_satfinite_rn_soft(std::nanf("")), 0x7);
  EXPECT_EQ(f32_to_e2m1_satfinite_rn_soft(-std::nanf("")), 0x7);
  std::vector<float> pts;
  for (int c = 0; c < 8; ++c) {
    const float v = float(ref_e2m1_value(c));
    for (float p : {v, std::nextafter(v, 0.0f), std::nextafter(v, 100.0f)}) pts.push_back(p);
    if (c < 7) {
      const float mid = float((ref_e2m1_value(c) + ref_e2m1_value(c + 1)) / 2);
      for (float p : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 100.0f)}) pts.push_back(p);
    }
  }
  for (float p : {6.0000005f, 1e-45f, 1e-38f, 3.4e38f, INFINITY}) pts.push_back(p);
  for (float p : pts)
    for (float s : {p, -p}) ASSERT_EQ(f32_to_e2m1_satfinite_rn_soft(s), ref_e2m1_encode(s)) << s;
  // Dense: every f32 in [0, 8) with a stride of 97 ulps, and every 65537th pattern.
  for (uint32_t u = 0; u <= bits(8.0f); u += 97)
    for (uint32_t sg : {0u, 0x80000000u})
      ASSERT_EQ(f32_to_e2m1_satfinite_rn_soft(fbits(u | sg)), ref_e2m1_encode(fbits(u | sg))) << std::hex << u;
  for (uint64_t u = 0; u < (1ull << 32); u += 65537)
    ASSERT_EQ(f32_to_e2m1_satfinite_rn_soft(fbits(uint32_t(u))), ref_e2m1_encode(fbits(uint32_t(u))));
}

// ---------------------------------------------------------------- bf16
// Reference: the two bf16 neighbours of x (truncation and truncation + 1 unit),
// the nearer one by exact f64 distance, ties to the even pattern; the unit
// above 0x7F7F is infinity (distance measured to 2^128). NaN -> 0x7FFF.
uint16_t ref_bf16(float x) {
  if (std::isnan(x)) return 0x7fff;
  const uint32_t u = bits(x);
  const uint16_t lo = uint16_t(u >> 16);
  const uint16_t hi = uint16_t(lo + 1);
  if ((u & 0xffff) == 0) return lo;
  const double dx = std::fabs(double(x));
  const double vlo = std::fabs(double(fbits(uint32_t(lo) << 16)));
  const double vhi = ((hi & 0x7fff) == 0x7f80) ? std::ldexp(1.0, 128) : std::fabs(double(fbits(uint32_t(hi) << 16)));
  const double dlo = dx - vlo, dhi = vhi - dx;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(Bf16, RoundingSample) {
  const uint32_t hand[][2] = {
      {0x3f800000u, 0x3f80}, {0x3f808000u, 0x3f80} /* tie, even down */, {0x3f818000u, 0x3f82} /* tie, even up */,
      {0x3f808001u, 0x3f81}, {0x3f807fffu, 0x3f80}, {0x7f7fffffu, 0x7f80} /* overflow to inf */,
      {0x7f7f7fffu, 0x7f7f}, {0x7f7f8000u, 0x7f80} /* tie at the top: even = inf */, {0x7f800000u, 0x7f80},
      {0xff800000u, 0xff80}, {0x7fc00000u, 0x7fff}, {0xffc00001u, 0x7fff}, {0x7f800001u, 0x7fff},
      {0x00000001u, 0x0000}, {0x00008000u, 0x0000} /* subnormal tie to even */, {0x00018000u, 0x0002},
      {0x80008001u, 0x8001}, {0x807fffffu, 0x8080}};
  for (const auto& h : hand) EXPECT_EQ(f32_to_bf16_rn_soft(fbits(h[0])), h[1]) << std::hex << h[0];
  for (const auto& h : hand) EXPECT_EQ(ref_bf16(fbits(h[0])), h[1]) << "reference " << std::hex << h[0];
  // every 4099th f32 pattern + every pattern whose low 16 bits are a tie class
  for (uint64_t u = 0; u < (1ull << 32); u += 4099) {
    const float x = fbits(uint32_t(u));
    ASSERT_EQ(f32_to_bf16_rn_soft(x), ref_bf16(x)) << std::hex << u;
  }
  for (uint32_t hi = 0; hi < 0x10000; hi += 7)
    for (uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      const float x = fbits((hi << 16) | low);
      ASSERT_EQ(f32_to_bf16_rn_soft(x), ref_bf16(x)) << std::hex << ((hi << 16) | low);
    }
  for (int c = 0; c < 0x10000; ++c) {  // decode: every bf16 pattern is the top half of an f32
    EXPECT_EQ(bits(bf16_to_f32(uint16_t(c))), uint32_t(c) << 16);
  }
}

// ------------------------------------------------------------- mul_rz
// Reference: the FPU itself in round-toward-zero mode (volatile operands so
// the product is computed at run time, under the mode).
TEST(MulRz, MatchesFesetroundTowardZero) {
  std::mt19937_64 rng(m3qkv_test::test_seed() ^ 0x1234);
  const size_t n = 2000000;
  std::vector<float> a(n), b(n), ref(n);
  for (size_t i = 0; i < n; ++i) {
    const int kind = int(i % 4);
    if (kind == 0) {  // any bit pattern: covers NaN, inf, subnormal, overflow, underflow
      a[i] = fbits(uint32_t(rng()));
      b[i] = fbits(uint32_t(rng()));
    } else if (kind == 1) {  // normal range values (the quantizer's domain)
      a[i] = std::ldexp(float(rng() % 16777216) / 16777216.0f + 0.5f, int(rng() % 40) - 20);
      b[i] = std::ldexp(float(rng() % 16777216) / 16777216.0f + 0.5f, int(rng() % 40) - 20);
      if (rng() & 1) a[i] = -a[i];
    } else if (kind == 2) {  // products near the subnormal range
      a[i] = fbits(uint32_t(rng() % 0x3f000000u) | (uint32_t(rng()) & 0x80000000u));
      b[i] = fbits(uint32_t(rng() % 0x07000000u) + 0x00000001u);
    } else {  // products near overflow
      a[i] = fbits(0x5f000000u + uint32_t(rng() % 0x01000000u));
      b[i] = fbits((0x5f000000u + uint32_t(rng() % 0x01000000u)) | (uint32_t(rng()) & 0x80000000u));
    }
  }
  const int old = std::fegetround();
  ASSERT_EQ(std::fesetround(FE_TOWARDZERO), 0);
  for (size_t i = 0; i < n; ++i) {
    volatile float x = a[i], y = b[i];
    volatile float p = x * y;
    ref[i] = p;
  }
  std::fesetround(old);
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  size_t subn = 0, ovf = 0;
  for (size_t i = 0; i < n; ++i) {
    const float got = mul_rz(a[i], b[i]);
    ASSERT_TRUE(same_or_both_nan(got, ref[i])) << std::hexfloat << a[i] << " * " << b[i] << " = " << got << " want "
                                               << ref[i];
    if (ref[i] != 0 && std::fpclassify(ref[i]) == FP_SUBNORMAL) ++subn;
    if (std::fabs(ref[i]) == 3.4028234663852886e38f) ++ovf;
  }
  EXPECT_GT(subn, 1000u);  // the sample really reaches the subnormal range
  EXPECT_GT(ovf, 1000u);   // and the RZ overflow (FLT_MAX instead of inf)
}

// ------------------------------------------------------------ rsqrt_rn
// Reference: candidate from long double, then an exact decision written here:
// r = RN(1/sqrt(t)) iff the midpoints lo, hi around r satisfy lo²·t < 1 < hi²·t.
// mid = M·2^em with M < 2^26, t = T·2^et with T < 2^24: compare M²·T with 2^-(2em+et).
int ref_cmp_mid(double mid, float t) {  // sign(mid²·t - 1)
  int em, et;
  const uint64_t M = uint64_t(std::ldexp(std::frexp(mid, &em), 30));  // frac·2^30, exact (<= 26 bits)
  const uint64_t T = uint64_t(std::ldexp(std::frexp(double(t), &et), 30));
  // mid = M·2^(em-30), t = T·2^(et-30): mid²·t = M²·T·2^(2em+et-90)
  const unsigned __int128 p = (unsigned __int128)M * M * T;  // < 2^90
  const int sh = 90 - (2 * em + et);  // compare p with 2^sh
  if (sh < 0) return 1;
  if (sh >= 127) return -1;
  const unsigned __int128 one = (unsigned __int128)1 << sh;
  return p < one ? -1 : (p > one ? 1 : 0);
}
float ref_rsqrt(float t) {
  const float c = float(1.0L / std::sqrt((long double)t));
  float found = NAN;
  int hits = 0;
  for (float r : {std::nextafter(c, 0.0f), c, std::nextafter(c, INFINITY)}) {
    const double lo = (double(std::nextafter(r, 0.0f)) + r) / 2, hi = (double(std::nextafter(r, INFINITY)) + r) / 2;
    if (ref_cmp_mid(lo, t) < 0 && ref_cmp_mid(hi, t) > 0) {
      found = r;
      ++hits;
    }
  }
  EXPECT_EQ(hits, 1) << "t = " << std::hexfloat << t;
  return found;
}

TEST(RsqrtRn, CorrectlyRounded) {
  std::mt19937_64 rng(m3qkv_test::test_seed() ^ 0x5678);
  std::vector<float> ts = {1.0f, 4.0f, 0.25f, 2.0f, 0.5f, 1e-6f, 1.00000095367431640625f, 3.4028234663852886e38f,
                           1.17549435e-38f, 1.4e-45f, 0x1p-149f, 0x1p-148f, 0x1.fffffep+127f, 0x1.000002p0f,
                           0x1.fffffep-1f, 0x1p-127f};
  for (int i = 0; i < 300000; ++i) ts.push_back(fbits(1u + uint32_t(rng() % 0x7f7fffffu)));        // any finite t > 0
  for (int i = 0; i < 200000; ++i) ts.push_back(fbits(0x3f000000u + uint32_t(rng() % 0x02000000u)));  // t in [0.5, 2)
  for (float t : ts) {
    const float want = ref_rsqrt(t);
    ASSERT_EQ(bits(rsqrt_rn(t)), bits(want)) << std::hexfloat << "t = " << t;
  }
  EXPECT_EQ(rsqrt_rn(4.0f), 0.5f);
  EXPECT_EQ(rsqrt_rn(0x1p-148f), 0x1p74f);
  EXPECT_EQ(bits(rsqrt_rn(0x1.000010p0f)), 0x3f7ffff8u);  // t = 1 + 8·2^-23 (eps 1e-6 on a unit row)
  EXPECT_EQ(rsqrt_rn(0.0f), INFINITY);
  EXPECT_EQ(rsqrt_rn(-0.0f), -INFINITY);  // IEEE rsqrt(-0) = -inf, as __frsqrt_rn gives on the H200
  EXPECT_EQ(rsqrt_rn(INFINITY), 0.0f);
  EXPECT_TRUE(std::isnan(rsqrt_rn(-1.0f)));
  EXPECT_TRUE(std::isnan(rsqrt_rn(std::nanf(""))));
}

// -------------------------------------------------------- small helpers
TEST(Numerics, E8m0AndExp2) {
  for (int b = 0; b < 255; ++b) EXPECT_EQ(double(e8m0_to_f32(uint8_t(b))), std::ldexp(1.0, b - 127)) << b;
  EXPECT_TRUE(std::isnan(e8m0_to_f32(0xff)));
  for (int e = -149; e <= 127; ++e) EXPECT_EQ(double(exp2i_f32(e)), std::ldexp(1.0, e)) << e;
  for (uint32_t u : {0x00000001u, 0x00000003u, 0x00400000u, 0x007fffffu, 0x00800000u, 0x3f800000u, 0x3fffffffu,
                     0x7f7fffffu}) {
    int e;
    std::frexp(double(fbits(u)), &e);
    EXPECT_EQ(floor_log2_f32(fbits(u)), e - 1) << std::hex << u;
  }
}

TEST(Numerics, MaxNumIgnoresNan) {
  EXPECT_EQ(max_num(0.0f, std::nanf("")), 0.0f);
  EXPECT_EQ(max_num(std::nanf(""), 2.0f), 2.0f);
  EXPECT_EQ(max_num(1.0f, INFINITY), INFINITY);
  // Signalling NaNs are ignored too (glibc's fmax would return NaN for them;
  // the H200 run of the MX quantizer test caught that on a bf16 0x7F81 input).
  const float snan = fbits(0x7f810000u), neg_snan = fbits(0xff810000u);
  EXPECT_EQ(max_num(0.5f, snan), 0.5f);
  EXPECT_EQ(max_num(snan, 0.5f), 0.5f);
  EXPECT_EQ(max_num(0.25f, neg_snan), 0.25f);
  float amax = 0.0f;
  for (float v : {3.0f, snan, 1.0f}) amax = max_num(amax, abs_f32(v));
  EXPECT_EQ(amax, 3.0f);
}

// OCP MX shared exponent: e = clamp(floor(log2(amax)) - 8, -127, 127).
TEST(Numerics, MxSharedExponent) {
  EXPECT_EQ(mx_shared_exponent(0.0f), -127);
  EXPECT_EQ(mx_shared_exponent(1.0f), -8);        // 1 = 2^0
  EXPECT_EQ(mx_shared_exponent(1.9999999f), -8);  // floor(log2) = 0
  EXPECT_EQ(mx_shared_exponent(448.0f), 0);       // 2^8·1.75: e = 0, 448 stays 448
  EXPECT_EQ(mx_shared_exponent(512.0f), 1);
  EXPECT_EQ(mx_shared_exponent(0x1p-126f), -127);  // -134 clamped
  EXPECT_EQ(mx_shared_exponent(0x1p-119f), -127);
  EXPECT_EQ(mx_shared_exponent(0x1p-118f), -126);
  EXPECT_EQ(mx_shared_exponent(0x1p-133f), -127);  // bf16 subnormal
  EXPECT_EQ(mx_shared_exponent(0x1.fep127f), 119);
  EXPECT_EQ(mx_shared_exponent(INFINITY), 127);
  // 511 / 2^0 = 511 > 448 saturates; 3.0 with e = -7 (amax 2^1..): 3·2^7 = 384
  EXPECT_EQ(mx_quantize_value(511.0f, 0), 0x7e);
  EXPECT_EQ(mx_quantize_value(3.0f, -7), ref_e4m3_encode(384.0f));
  EXPECT_EQ(mx_quantize_value(-1.0f, 127), 0x80);  // -2^-127 rounds to -0
  EXPECT_EQ(mx_quantize_value(-INFINITY, 127), 0xfe);
}

}  // namespace

// The device NVFP4 path encodes with the branch-free e2m1 encoder: equal to
// the reference encoder on every f32 bit pattern (host side; the GPU suite
// repeats it on the device, GpuConversions.E2m1BranchFreeAllF32Patterns).
TEST(Numerics, E2m1BranchFreeEqualsReferenceOnAllF32Patterns) {
  uint64_t bad = 0, first = 0;
  for (uint64_t i = 0; i < (uint64_t{1} << 32); ++i) {
    const float f = m3qkv::bits_f32(static_cast<uint32_t>(i));
    if (m3qkv::f32_to_e2m1_satfinite_rn_branchfree(f) != m3qkv::f32_to_e2m1_satfinite_rn_soft(f) && bad++ == 0)
      first = i;
  }
  EXPECT_EQ(bad, 0u) << "first mismatch at f32 bits 0x" << std::hex << first;
}
