// The golden model (src/golden): hand-worked NVFP4 / RMSNorm / RoPE cases
// with their bit patterns, f64 comparisons, the MXFP8 quantizer and GEMM
// against first-principles references, the exact-data bound of the problem
// builder, an end-to-end M = 7 TP4 run decoded back against an f64 epilogue,
// and the §6 guards.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/layouts.h"
#include "common/numerics.h"
#include "common/problem.h"
#include "common/ref_e4m3.h"
#include "common/test_util.h"
#include "golden/golden.h"

namespace {

namespace g = m3qkv::golden;
using m3qkv_test::Problem;
using m3qkv_test::ProblemConfig;

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
double bf16v(uint16_t h) { return double(fbits(uint32_t(h) << 16)); }

// --- first-principles e4m3 (independent of numerics.h) ---
// First-principles reference: tests/common/ref_e4m3.h.
using m3qkv_test::ref_e4m3_encode;
using m3qkv_test::ref_e4m3_value;
// docs/contract.md §4.1 F8_128x4, typed again here from the contract's text.
int64_t ref_sf_offset(int64_t r, int64_t c, int64_t cols) {
  const int64_t kt = (cols + 3) / 4;
  return ((r / 128) * kt + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + (c % 4);
}

// An MXFP8 operand decoded from first principles (table of ref_e4m3_value,
// scales through the contract-typed swizzle formula): f64 [rows, k].
std::vector<double> ref_decode(const std::vector<uint8_t>& q, const std::vector<uint8_t>& sf, int64_t rows, int64_t k) {
  double lut[256];
  for (int c = 0; c < 256; ++c) lut[c] = ref_e4m3_value(c);
  std::vector<double> out(size_t(rows * k));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t kk = 0; kk < k; ++kk)
      out[size_t(r * k + kk)] =
          lut[q[size_t(r * k + kk)]] * std::ldexp(1.0, int(sf[size_t(ref_sf_offset(r, kk / 32, k / 32))]) - 127);
  return out;
}

// ------------------------------------------------------ NVFP4 quantizer
// Group 0 (no scale factor): amax 9 -> a = RN(9·RN(1/6)) = 1.5 exactly (9·0x3E2AAAAB
// = 1.50000004 rounds to 1.5) -> s8 = 0x3C, rc = RN(1/1.5) = 0x3F2AAAAB (0.6666667).
//   9            -> 9·rc = 6.00000018 -> RZ 6.0        -> code 7
//   0x3EC00001   -> 0.37500003·rc = 0.2500000273 exact; RN would give 0.25000003 (code 1),
//                   RZ gives 0.25 exactly, a tie -> even -> code 0  (the RZ case)
//   0xBFF00001   -> -1.8750001·rc = -1.2500001 -> RZ -1.25 tie -> 1.0 -> code 0xA (RN: 0xB)
//   0, -0        -> code 0 (the -0 code is stored as +0)
//   3            -> 2.00000006 -> RZ 2.0 -> code 4
//   0.1          -> 0.0667 -> code 0
//   -4.5         -> -3.00000009 -> RZ -3.0 -> code 0xD
// Group 1 (amax under the 2^-9 floor): amax 0.005 -> a = 0.00083 -> 2^-9 -> s8 = 0x01, rc = 512.
//   0.005 -> 2.56 -> code 5 (3.0);  -0.001 -> -0.512 -> 0x9;  0.0004 -> 0.2048 -> 0;
//   2^-10 -> 0.5 -> code 1;  3·2^-11 -> 0.75 tie -> 1.0 -> code 2
// Group 2 (|x| > 4096): amax 5000 -> a = 833.3 -> saturates to 448 = 0x7E, rc = RN(1/448).
//   5000 -> 11.2 -> saturates -> 7;  -2000 -> -4.46 -> 0xE;  4096 -> 9.1 -> 7;  1000 -> 2.23 -> 4
// Group 3: all -0 -> amax 0 -> floor -> s8 = 0x01; every code 0.
// Group 4: NaN ignored by amax: amax 3 -> a = RN(3·RN(1/6)) = 0.5 -> s8 = 0x30, rc = 2.
//   NaN -> NaN·2 -> e2m1 NaN -> +6 (code 7);  3 -> 6 -> code 7
// Groups 5..7: zeros -> s8 = 0x01, codes 0.
TEST(Nvfp4Quant, HandWorkedGroups) {
  float y[128] = {};
  const float g0[] = {9.0f, fbits(0x3ec00001u), fbits(0xbff00001u), 0.0f, -0.0f, 3.0f, 0.1f, -4.5f};
  std::copy(std::begin(g0), std::end(g0), y);
  const float g1[] = {0.005f, -0.001f, 0.0004f, 0x1p-10f, 0x3p-11f};
  std::copy(std::begin(g1), std::end(g1), y + 16);
  const float g2[] = {5000.0f, -2000.0f, 4096.0f, 1000.0f};
  std::copy(std::begin(g2), std::end(g2), y + 32);
  for (int i = 48; i < 64; ++i) y[i] = -0.0f;
  y[64] = std::nanf("");
  y[65] = 3.0f;
  uint8_t data[64], sc[8];
  std::memset(data, 0xcc, sizeof(data));
  std::memset(sc, 0xcc, sizeof(sc));
  g::nvfp4_quant_head(y, false, 1.0f, data, sc);
  const uint8_t want_sc[8] = {0x3c, 0x01, 0x7e, 0x01, 0x30, 0x01, 0x01, 0x01};
  uint8_t want_data[64] = {};
  want_data[0] = 0x07;   // codes 7 | 0 << 4
  want_data[1] = 0x0a;   // 0xA | 0 << 4
  want_data[2] = 0x40;   // 0 (from -0) | 4 << 4
  want_data[3] = 0xd0;   // 0 | 0xD << 4
  want_data[8] = 0x95;   // 5 | 9 << 4
  want_data[9] = 0x10;   // 0 | 1 << 4
  want_data[10] = 0x02;  // 2 | 0 << 4
  want_data[16] = 0xe7;  // 7 | 0xE << 4
  want_data[17] = 0x47;  // 7 | 4 << 4
  want_data[32] = 0x77;  // 7 (NaN) | 7 << 4
  for (int i = 0; i < 8; ++i) EXPECT_EQ(sc[i], want_sc[i]) << "group " << i;
  for (int i = 0; i < 64; ++i) EXPECT_EQ(data[i], want_data[i]) << "byte " << i;
  // The f32 constants the comments rely on.
  EXPECT_EQ(bits(m3qkv::rcp_rn(1.5f)), 0x3f2aaaabu);
  EXPECT_EQ(m3qkv::mul_rn(9.0f, 0.16666667163372040f), 1.5f);
  EXPECT_EQ(m3qkv::mul_rn(3.0f, 0.16666667163372040f), 0.5f);
}

// k/v scales 0.5, 2, 1: sf = RN(1/scale) = 2, 0.5, 1. Group [6, 1.5, -0.75, 0...]:
// a = 1·sf -> s8 = e4m3(sf) = 0x40 / 0x30 / 0x38, rc = RN(1/s)·sf = 1 in each case, so
// the codes are those of the raw values: 6 -> 7, 1.5 -> 3, -0.75 -> tie -> -1.0 = 0xA.
TEST(Nvfp4Quant, KvScalesHalfTwoOne) {
  float y[128] = {};
  for (int g = 0; g < 8; ++g) {
    y[g * 16 + 0] = 6.0f;
    y[g * 16 + 1] = 1.5f;
    y[g * 16 + 2] = -0.75f;
  }
  struct Case { float scale; uint8_t s8; };
  for (const Case c : {Case{0.5f, 0x40}, Case{2.0f, 0x30}, Case{1.0f, 0x38}}) {
    uint8_t data[64], sc[8];
    g::nvfp4_quant_head(y, true, m3qkv::rcp_rn(c.scale), data, sc);
    for (int g = 0; g < 8; ++g) {
      EXPECT_EQ(sc[g], c.s8) << "scale " << c.scale;
      EXPECT_EQ(data[g * 8 + 0], 0x37) << "scale " << c.scale;  // 7 | 3 << 4
      EXPECT_EQ(data[g * 8 + 1], 0x0a) << "scale " << c.scale;  // 0xA | 0 << 4
      for (int i = 2; i < 8; ++i) EXPECT_EQ(data[g * 8 + i], 0) << "scale " << c.scale;
    }
  }
  // A non-power-of-two scale: v_scale 3 -> sf = RN(1/3) = 0x3EAAAAAB; amax 6 -> a = RN(1·sf)
  // = 0.33333334 -> e4m3 RN: 0.3333 between 0.3125 (0x2A) and 0.34375 (0x2B), nearer 0.34375.
  uint8_t data[64], sc[8];
  g::nvfp4_quant_head(y, true, m3qkv::rcp_rn(3.0f), data, sc);
  EXPECT_EQ(sc[0], 0x2b);
  // rc = RN(RN(1/0.34375)·sf) = RN(2.9090909·0.33333334) = 0.969697; 6·rc = 5.82 -> 7; 1.5·rc = 1.45 -> 3
  EXPECT_EQ(data[0], 0x37);
}

// --------------------------------------------------- RMSNorm / RoPE
TEST(HeadRmsRope, HandWorkedBits) {
  float x[128], y[128];
  uint16_t w[128];
  for (int c = 0; c < 128; ++c) {
    x[c] = 1.0f;
    w[c] = 0x3f00;  // bf16 0.5: Gemma scale 1.5
  }
  // eps = 0: classes sum 32 each, total 128, t = 1, r = 1, y = fma(1, 0.5, 1) = 1.5.
  g::head_rms(x, w, 0.0f, y);
  for (int c = 0; c < 128; ++c) ASSERT_EQ(bits(y[c]), 0x3fc00000u);
  // eps = 1e-6 (0x358637BD): t = RN(1 + eps) = 1 + 8·2^-23; r = RN(1/sqrt(t)) = 1 - 8·2^-24
  // (0x3F7FFFF8: exact value 1 - 8·2^-24 + 3.4e-13); y = RN(1.5·r) = 1.5 - 6·2^-23 = 0x3FBFFFFA.
  g::head_rms(x, w, 1e-6f, y);
  for (int c = 0; c < 128; ++c) ASSERT_EQ(bits(y[c]), 0x3fbffffau);

  // RoPE, pair 0: u = 1 + 2^-17, v = 1, co = si = bf16 0x3F81 = 1 + 2^-7.
  //   y0  = fma(u, co, -(v·si)) = (1 + 2^-7 + 2^-17 + 2^-24) - (1 + 2^-7) = 2^-17 + 2^-24 = 0x37010000
  //         (without the fma, RN(u·co) ties to 1 + 2^-7 + 2^-17 and the result would be 2^-17)
  //   y32 = fma(v, co, RN(u·si)) = (1 + 2^-7) + (1 + 2^-7 + 2^-17) = 2 + 2^-6 + 2^-17 = 0x40010020
  // pair 1: u = 2, v = 0, co = 0.5, si = -1: y1 = fma(2, .5, -(0·-1)) = 1; y33 = fma(0, .5, 2·-1) = -2.
  // columns 64..127 unchanged.
  uint16_t cs[64];
  for (int i = 0; i < 64; ++i) cs[i] = 0;
  cs[0] = 0x3f81;
  cs[32] = 0x3f81;
  cs[1] = 0x3f00;
  cs[33] = 0xbf80;
  for (int c = 0; c < 128; ++c) y[c] = 0.0f;
  y[0] = fbits(0x3f800040u);
  y[32] = 1.0f;
  y[1] = 2.0f;
  y[33] = 0.0f;
  y[100] = 3.25f;
  g::head_rope(y, cs);
  EXPECT_EQ(bits(y[0]), 0x37010000u);
  EXPECT_EQ(bits(y[32]), 0x40010020u);
  EXPECT_EQ(y[1], 1.0f);
  EXPECT_EQ(y[33], -2.0f);
  EXPECT_EQ(y[100], 3.25f);
  for (int i = 2; i < 32; ++i) EXPECT_EQ(bits(y[i]), 0u) << i;  // 0·0 - 0·0 = +0
}

// docs/contract.md §3.1-3.2 transcribed literally (explicit std::fma, the four classes in
// their own loops): the golden model must match it bit for bit.
void spec_rms_rope_f32(const float* x, const uint16_t* w, float eps, const uint16_t* cs, float* y) {
  float s[4];
  for (int cls = 0; cls < 4; ++cls) {
    s[cls] = 0.0f;
    for (int c = 0; c < 128; ++c)
      if (((c >> 1) & 3) == cls) s[cls] = std::fma(x[c], x[c], s[cls]);
  }
  const float total = (s[0] + s[1]) + (s[2] + s[3]);
  const float t = std::fma(total, 0.0078125f, eps);
  // long double then RN to f32: this double rounding differs from RN(1/sqrt(t)) only
  // within 2^-64 (relative) of an f32 midpoint; rsqrt_rn itself is checked in test_numerics.
  const float r = float(1.0L / std::sqrt((long double)t));
  for (int c = 0; c < 128; ++c) {
    const float n = x[c] * r;
    y[c] = std::fma(n, float(bf16v(w[c])), n);
  }
  for (int i = 0; i < 32; ++i) {
    const float u = y[i], v = y[i + 32], co = float(bf16v(cs[i])), si = float(bf16v(cs[32 + i]));
    const float vs = v * si, us = u * si;
    y[i] = std::fma(u, co, -vs);
    y[i + 32] = std::fma(v, co, us);
  }
}

double ulp_of(double v) {
  const float f = std::fabs(float(v));
  return double(std::nextafter(f, INFINITY)) - double(f);
}

TEST(HeadRmsRope, MatchesSpecTranscriptionAndF64) {
  std::mt19937_64 rng(m3qkv_test::test_seed() ^ 0x77);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int64_t over1 = 0, total_vals = 0;
  double worst_rms_ulp = 0;
  for (int it = 0; it < 3000; ++it) {
    float x[128], y[128], ys[128];
    uint16_t w[128], cs[64];
    const float scale = std::ldexp(1.0f, int(rng() % 40) - 20);
    const bool few_bits = it % 2 == 0;  // exact f32 sums of squares: isolates the rounding steps
    for (int c = 0; c < 128; ++c) {
      x[c] = few_bits ? std::ldexp(float(int(rng() % 31) - 15), int(rng() % 5) - 2) * scale : nd(rng) * scale;
      w[c] = m3qkv::f32_to_bf16_rn_soft(nd(rng) * 0.1f);
    }
    for (int i = 0; i < 64; ++i) {
      const double ang = double(rng() % 100000) * std::pow(10000.0, -2.0 * (i % 32) / 64.0);
      cs[i] = m3qkv::f32_to_bf16_rn_soft(float(i < 32 ? std::cos(ang) : std::sin(ang)));
    }
    // The smallest eps the API accepts (it rejects eps <= 0), and M3's.
    const float eps = (it % 3 == 0) ? 1e-45f : 1e-6f;
    g::head_rms_rope(x, w, eps, cs, y);
    spec_rms_rope_f32(x, w, eps, cs, ys);
    for (int c = 0; c < 128; ++c) ASSERT_EQ(bits(y[c]), bits(ys[c])) << "it " << it << " c " << c;

    // f64: RMSNorm within 2 ulp when the f32 sum of squares is exact.
    double ss = 0;
    for (int c = 0; c < 128; ++c) ss += double(x[c]) * x[c];
    const double r = 1.0 / std::sqrt(ss / 128.0 + double(eps));
    double yr[128];
    for (int c = 0; c < 128; ++c) yr[c] = double(x[c]) * r * (1.0 + bf16v(w[c]));
    float yn[128];
    g::head_rms(x, w, eps, yn);
    for (int c = 0; c < 128; ++c) {
      if (yr[c] == 0) {
        ASSERT_EQ(yn[c], 0.0f);
        continue;
      }
      // Error in units of eps·|y| (eps = 2^-23, the ulp of the value's binade scaled to
      // the value). Exact-sum rows: four roundings (t, r, n, y), each <= 2^-24
      // relative, the t one halved by the square root: <= 3.5·2^-24 = 1.75 eps.
      // General rows add the f32 sums of 32 squares per class (<= ~33·2^-24 in t,
      // halved in r): <= ~20·2^-24 = 10 eps.
      const double e = std::fabs(double(yn[c]) - yr[c]) / (0x1p-23 * std::fabs(yr[c]));
      if (few_bits) {
        ASSERT_LE(e, 2.0) << "it " << it << " c " << c;
        worst_rms_ulp = std::max(worst_rms_ulp, e);
      } else {
        ASSERT_LE(e, 12.0) << "it " << it << " c " << c;
      }
    }
    // RoPE on the golden RMSNorm output vs f64 from the same f32 inputs: within
    // 2 ulp of the result, or (under cancellation) within the rounding of the
    // single intermediate product: 0.5 ulp(y) + 0.5 ulp(v·si).
    double yrr[128];
    for (int c = 0; c < 128; ++c) yrr[c] = yn[c];
    for (int i = 0; i < 32; ++i) {
      const double u = yn[i], v = yn[i + 32], co = bf16v(cs[i]), si = bf16v(cs[32 + i]);
      yrr[i] = u * co - v * si;
      yrr[i + 32] = v * co + u * si;
    }
    for (int i = 0; i < 64; ++i) {
      const double e = std::fabs(double(y[i]) - yrr[i]);
      const double inter = i < 32 ? double(yn[i + 32]) * bf16v(cs[32 + i]) : double(yn[i - 32]) * bf16v(cs[i]);
      ++total_vals;
      if (yrr[i] != 0 && e > 1.0 * ulp_of(yrr[i])) ++over1;
      ASSERT_TRUE(e <= 2 * ulp_of(yrr[i]) || e <= 0.5 * ulp_of(yrr[i]) + 0.5 * ulp_of(inter))
          << "it " << it << " i " << i;
    }
    for (int c = 64; c < 128; ++c) ASSERT_EQ(y[c], yn[c]);
  }
  std::printf("RMSNorm worst error (exact-sum rows): %.3f eps·|y|; RoPE values beyond 1 ulp: %lld of %lld\n",
              worst_rms_ulp, (long long)over1, (long long)total_vals);
}

// -------------------------------------------------------------- MXFP8
TEST(Mxfp8Quantize, OcpRuleFromFirstPrinciples) {
  std::mt19937_64 rng(m3qkv_test::test_seed() ^ 0x99);
  std::normal_distribution<double> nd(0.0, 1.0);
  const int64_t m = 130, k = 256, cols = k / 32;  // 130 rows: 126 padding rows in the second 128-row block
  std::vector<uint16_t> x(size_t(m * k));
  for (int64_t r = 0; r < m; ++r)
    for (int64_t i = 0; i < k; ++i)
      x[size_t(r * k + i)] = m3qkv::f32_to_bf16_rn_soft(float(nd(rng) * std::ldexp(1.0, int(r % 60) - 30)));
  // special blocks (row, block): zeros, ±inf, NaN among finite values, bf16 subnormals, 448·2^k, huge
  auto blk = [&](int64_t r, int64_t c) { return x.data() + r * k + c * 32; };
  std::fill(blk(0, 0), blk(0, 0) + 32, uint16_t(0x8000));  // all -0
  blk(1, 1)[5] = 0x7f80;                                    // +inf
  blk(2, 2)[7] = 0xff80;                                    // -inf
  blk(3, 3)[0] = 0x7fc0;                                    // NaN, others finite
  for (int i = 0; i < 32; ++i) blk(4, 4)[i] = uint16_t(i + 1);  // bf16 subnormals 2^-133·(i+1)
  for (int i = 0; i < 32; ++i) blk(5, 5)[i] = m3qkv::f32_to_bf16_rn_soft(float(i % 2 ? 448.0 : -7.0));
  for (int i = 0; i < 32; ++i) blk(6, 6)[i] = uint16_t(0x7f7f - i);  // near bf16 max
  std::vector<uint8_t> xq(size_t(m * k), 0xcc), xsf(size_t(m3qkv::f8_128x4_bytes(m, cols)), 0xcc);
  g::mxfp8_quantize(x.data(), m, k, xq.data(), xsf.data());
  for (int64_t r = 0; r < 256; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t s = xsf[size_t(ref_sf_offset(r, c, cols))];
      if (r >= m) {
        ASSERT_EQ(s, 0x7f) << "padding row " << r;
        continue;
      }
      double amax = 0;
      bool inf = false;
      for (int i = 0; i < 32; ++i) {
        const double v = bf16v(x[size_t(r * k + c * 32 + i)]);
        if (std::isinf(v)) inf = true;
        if (!std::isnan(v)) amax = std::max(amax, std::fabs(v));
      }
      int e;
      if (inf) e = 127;
      else if (amax == 0) e = -127;
      else {
        int ex;
        std::frexp(amax, &ex);  // amax = f·2^ex, f in [0.5, 1): floor(log2) = ex - 1
        e = std::min(127, std::max(-127, ex - 1 - 8));
      }
      ASSERT_EQ(int(s), e + 127) << "row " << r << " block " << c;
      for (int i = 0; i < 32; ++i) {
        const double v = bf16v(x[size_t(r * k + c * 32 + i)]);
        ASSERT_EQ(xq[size_t(r * k + c * 32 + i)], ref_e4m3_encode(std::ldexp(v, -e)))
            << "row " << r << " block " << c << " i " << i;
      }
    }
  EXPECT_EQ(xsf[size_t(ref_sf_offset(0, 0, cols))], 0);     // zero block: 2^-127
  EXPECT_EQ(xsf[size_t(ref_sf_offset(1, 1, cols))], 0xfe);  // inf block: 2^127
  EXPECT_EQ(xsf[size_t(ref_sf_offset(5, 5, cols))], 127);   // 448 = 1.75·2^8: e = 0
}

TEST(Mxfp8Acc, MatchesNaiveF64) {
  ProblemConfig cfg;
  cfg.m = 37;
  cfg.k = 384;
  cfg.nq = 8;
  cfg.nkv = 1;
  cfg.niq = 0;
  cfg.nik = 0;
  const Problem p = m3qkv_test::make_problem(cfg);
  const int64_t n = p.n(), k = p.k;
  const auto acc = g::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, n, k);
  const auto xd = ref_decode(p.xq, p.xsf, p.m, k), wd = ref_decode(p.wq, p.wsf, n, k);
  double max_rel = 0;
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, sa = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const double a = xd[size_t(i * k + kk)], b = wd[size_t(j * k + kk)];
        s += a * b;
        sa += std::fabs(a * b);
      }
      const double got = acc[size_t(i * n + j)];
      // both are f64 sums rounded once to f32: equal up to 1 f32 ulp (order differs)
      ASSERT_LE(std::fabs(got - s), ulp_of(s) + 1e-15 * sa) << i << "," << j;
      if (sa > 0) max_rel = std::max(max_rel, std::fabs(got - s) / sa);
    }
  std::printf("mxfp8_acc vs naive f64: max |diff|/sum|products| = %.3g (seed %llu)\n", max_rel,
              (unsigned long long)p.cfg.seed);
}

// ----------------------------------------------------------- exact data
// Brute force over every dot product of an exact-data problem: all nonzero
// products are powers of two, count <= kExactMaxNonzero, max/min <= 2^4, so the
// sum of magnitudes in units of the smallest product is < 2^11. Then the acc
// must be order-independent: a random-order f32 sum equals the golden acc.
TEST(ExactData, BoundHoldsAndAccIsOrderIndependent) {
  ProblemConfig cfg;
  cfg.m = 40;
  cfg.k = 1024;
  cfg.nq = 16;
  cfg.nkv = 1;
  cfg.niq = 1;
  cfg.nik = 1;
  cfg.exact_data = true;
  const Problem p = m3qkv_test::make_problem(cfg);
  const int64_t n = p.n(), k = p.k, cols = k / 32;
  const auto acc = g::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, n, k);
  std::mt19937_64 rng(p.cfg.seed);
  int max_nnz = 0, max_log2_ratio = 0, distinct_nonzero = 0;
  std::vector<double> prods;
  bool saw_neg = false, saw_pos = false;
  for (int64_t r = 0; r < p.m; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int e = int(p.xsf[size_t(ref_sf_offset(r, c, cols))]) - 127;
      ASSERT_TRUE(e >= -2 && e <= 2) << "x scale 2^" << e;
    }
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int e = int(p.wsf[size_t(ref_sf_offset(r, c, cols))]) - 127;
      ASSERT_TRUE(e >= -2 && e <= 2) << "w scale 2^" << e;
    }
  for (uint8_t b : p.xq) ASSERT_TRUE(ref_e4m3_value(b) == 0 || std::fabs(ref_e4m3_value(b)) == 1 || std::fabs(ref_e4m3_value(b)) == 2);
  for (uint8_t b : p.wq) ASSERT_TRUE(std::fabs(ref_e4m3_value(b)) == 1 || std::fabs(ref_e4m3_value(b)) == 2);
  const auto xd = ref_decode(p.xq, p.xsf, p.m, k), wd = ref_decode(p.wq, p.wsf, n, k);
  std::vector<int64_t> nz;
  for (int64_t i = 0; i < p.m; ++i) {
    nz.clear();
    for (int64_t kk = 0; kk < k; ++kk)
      if (xd[size_t(i * k + kk)] != 0) nz.push_back(kk);
    for (int64_t j = 0; j < n; ++j) {
      prods.clear();
      for (int64_t kk : nz) {
        const double v = xd[size_t(i * k + kk)] * wd[size_t(j * k + kk)];
        if (v != 0) prods.push_back(v);
      }
      if (prods.empty()) continue;
      double mn = INFINITY, mx = 0, sum_abs = 0;
      for (double v : prods) {
        int ex;
        ASSERT_EQ(std::fabs(std::frexp(v, &ex)), 0.5) << "product not a power of two";
        mn = std::min(mn, std::fabs(v));
        mx = std::max(mx, std::fabs(v));
        sum_abs += std::fabs(v);
      }
      max_nnz = std::max(max_nnz, int(prods.size()));
      max_log2_ratio = std::max(max_log2_ratio, int(std::lround(std::log2(mx / mn))));
      ASSERT_LE(int(prods.size()), m3qkv_test::kExactMaxNonzero);
      ASSERT_LT(sum_abs / mn, 2048.0) << "bound of problem.h violated at " << i << "," << j;
      // any order, in f32: identical to the golden acc
      std::shuffle(prods.begin(), prods.end(), rng);
      float s = 0.0f;
      for (double v : prods) s += float(v);
      ASSERT_EQ(bits(s), bits(acc[size_t(i * n + j)])) << i << "," << j;
      if (s != 0) ++distinct_nonzero;
      saw_neg |= s < 0;
      saw_pos |= s > 0;
    }
  }
  EXPECT_LE(max_log2_ratio, m3qkv_test::kExactLog2Ratio);
  EXPECT_GT(max_nnz, 60);  // not trivially sparse
  EXPECT_GT(distinct_nonzero, int(p.m * n / 2));
  EXPECT_TRUE(saw_neg && saw_pos);
  std::printf("exact data: max nonzero products %d, max log2(max/min) %d\n", max_nnz, max_log2_ratio);
}

// ------------------------------------------------------------ decoders
TEST(Decode, HandPlacedTokenBytes) {
  // nkv 1, block_size 16, page stride 2·1152 + 64 = 2368; slot id 21 -> page 1, token 5.
  const int bs = 16;
  const int64_t stride = 2368;
  std::vector<uint8_t> cache(size_t(3 * stride), 0);
  // K slot base 2368: data of token 5 at +320; linear scale g at +1024 + 5·8 + g.
  cache[2368 + 320] = 0xa7;   // c0 = code 7 (6.0), c1 = code 0xA (-1.0)
  cache[2368 + 1064] = 0x40;  // g0 scale 2.0
  // V slot base 2368 + 1152 = 3520: data at +320, swizzled scale g0 at +1024 + (4+0)·8 + 0 + 1 = +1057,
  // g1 at +1024 + (4+0)·8 + 4 + 1 = +1061.
  cache[3520 + 320] = 0x03;      // c0 = code 3 (1.5)
  cache[3520 + 320 + 8] = 0x04;  // c16 = code 4 (2.0)
  cache[3520 + 1057] = 0x30;     // 0.5
  cache[3520 + 1061] = 0x48;     // 4.0
  float out[128];
  g::decode_nvfp4_token(cache.data(), stride, bs, 0, 21, false, 0.5f, out);  // k_scale 2 -> sf 0.5
  EXPECT_EQ(out[0], 24.0f);  // 6·2/0.5
  EXPECT_EQ(out[1], -4.0f);  // -1·2/0.5
  for (int c = 2; c < 128; ++c) EXPECT_EQ(out[c], 0.0f);
  g::decode_nvfp4_token(cache.data(), stride, bs, 1, 21, true, 2.0f, out);  // v_scale 0.5 -> sf 2
  EXPECT_EQ(out[0], 0.375f);  // 1.5·0.5/2
  EXPECT_EQ(out[16], 4.0f);   // 2·4/2
  float e[3];
  const uint8_t eb[3] = {0x7e, 0x01, 0xb8};
  g::decode_e4m3(eb, 3, e);
  EXPECT_EQ(e[0], 448.0f);
  EXPECT_EQ(e[1], 0x1p-9f);
  EXPECT_EQ(e[2], -1.0f);
}

// ---------------------------------------------------------- end to end
// Independent f64 epilogue (docs/contract.md §3 in real arithmetic) on an f64 accumulator.
void ref_head_f64(const double* x, const uint16_t* w, double eps, const uint16_t* cs, double* y) {
  double ss = 0;
  for (int c = 0; c < 128; ++c) ss += x[c] * x[c];
  const double r = 1.0 / std::sqrt(ss / 128.0 + eps);
  for (int c = 0; c < 128; ++c) y[c] = x[c] * r * (1.0 + bf16v(w[c]));
  for (int i = 0; i < 32; ++i) {
    const double u = y[i], v = y[i + 32], co = bf16v(cs[i]), si = bf16v(cs[32 + i]);
    y[i] = u * co - v * si;
    y[i + 32] = v * co + u * si;
  }
}

// Decoded NVFP4 head vs f64 values: scale byte within e4m3 rounding of
// max(amax·sf/6, 2^-9); each value within half an e2m1 step (+ saturation)
// of the scaled grid, plus a 1e-4·amax slack for the f32-vs-f64 epilogue.
void check_nvfp4_head(const float* dec, const uint8_t* sc, const double* yref, double sf, const char* what, int64_t t) {
  for (int gi = 0; gi < 8; ++gi) {
    double amax = 0;
    for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(yref[gi * 16 + i]));
    const double s = ref_e4m3_value(sc[gi]);
    const double a = std::max(amax / 6.0 * sf, std::ldexp(1.0, -9));
    ASSERT_LE(std::fabs(s - a), a * 0x1p-4 + 0x1p-10 + 1e-5 * a) << what << " token " << t << " group " << gi;
    for (int i = 0; i < 16; ++i) {
      const int c = gi * 16 + i;
      const double q = std::fabs(yref[c]) * sf / s;  // position on the e2m1 grid
      const double qc = std::min(q, 6.0);
      const double half = qc < 2 ? 0.25 : (qc < 4 ? 0.5 : 1.0);
      const double tol = (half + (q - qc)) * s / sf + 1e-4 * amax + 1e-30;
      ASSERT_LE(std::fabs(double(dec[c]) - yref[c]), tol)
          << what << " token " << t << " col " << c << " ref " << yref[c] << " got " << dec[c];
    }
  }
}

// Bytes no token may write (everything except the (token, head) bytes of
// written slots) must keep the poison: compare two runs poisoned differently.
void check_untouched(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, const std::vector<uint8_t>& written,
                     const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (written[i]) {
      ASSERT_EQ(a[i], b[i]) << what << " byte " << i << " written differently";
    } else {
      ASSERT_EQ(a[i], 0xa5) << what << " byte " << i << " changed";
      ASSERT_EQ(b[i], 0x5a) << what << " byte " << i << " changed";
    }
  }
}

void mark_token(std::vector<uint8_t>& mask, int64_t stride, int bs, int slot_in_page, int64_t slot, bool v) {
  const int64_t base = (slot / bs) * stride + int64_t(slot_in_page) * bs * 72;
  const int t = int(slot % bs);
  for (int i = 0; i < 64; ++i) mask[size_t(base + t * 64 + i)] = 1;
  for (int gi = 0; gi < 8; ++gi)
    mask[size_t(base + bs * 64 + (v ? ((t / 4) * 4 + gi / 2) * 8 + (gi % 2) * 4 + t % 4 : t * 8 + gi))] = 1;
}

TEST(GoldenEndToEnd, M7Tp4K6144DecodesBackToF64Epilogue) {
  ProblemConfig cfg;
  cfg.m = 7;
  cfg.k = 6144;
  cfg.nq = 16;
  cfg.nkv = 1;
  cfg.niq = 1;
  cfg.nik = 1;
  cfg.block_size = 16;
  cfg.slot_skip_fraction = 0.0;
  cfg.q_fp8_scale = 0.0625f;
  cfg.k_scale = 0.5f;
  cfg.v_scale = 2.0f;
  Problem p = m3qkv_test::make_problem(cfg);
  p.slot_mapping[2] = -1;        // skipped KV write
  p.index_slot_mapping[4] = -1;  // skipped index write
  p.index_slot_mapping[5] = -3;
  SCOPED_TRACE(p.cfg.describe());
  const int64_t n = p.n(), k = p.k;
  ASSERT_EQ(n, 2560);

  auto o1 = m3qkv_test::golden_outputs(p, 0xa5);
  auto o2 = m3qkv_test::golden_outputs(p, 0x5a);
  EXPECT_EQ(o1.flags, 0u);

  // f64 accumulator from first principles.
  std::vector<double> acc(size_t(p.m * n));
  {
    const auto xd = ref_decode(p.xq, p.xsf, p.m, k), wd = ref_decode(p.wq, p.wsf, n, k);
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t kk = 0; kk < k; ++kk) s += xd[size_t(i * k + kk)] * wd[size_t(j * k + kk)];
        acc[size_t(i * n + j)] = s;
      }
  }
  const double ksf = 1.0 / 0.5, vsf = 1.0 / 2.0;  // RN(1/k_scale), RN(1/v_scale): exact here
  double max_q_rel = 0;
  int64_t fp8_checked = 0;
  for (int64_t t = 0; t < p.m; ++t) {
    const int64_t pos = p.positions[size_t(t)];
    const uint16_t* cs = p.cos_sin_cache.data() + pos * 64;
    double y[128];
    float dec[128];
    // q heads: bf16 within bf16 rounding; fp8 within e4m3 rounding (x 1/q_fp8_scale).
    for (int h = 0; h < p.nq; ++h) {
      ref_head_f64(&acc[size_t(t * n + h * 128)], p.q_norm_weight.data(), p.cfg.eps, cs, y);
      double rms = 0;
      for (double v : y) rms += v * v;
      rms = std::sqrt(rms / 128);
      for (int c = 0; c < 128; ++c) {
        const size_t o = size_t((t * p.nq + h) * 128 + c);
        const double q = bf16v(o1.q_out[o]);
        ASSERT_LE(std::fabs(q - y[c]), std::fabs(y[c]) * 0x1p-8 + 1e-5 * rms) << "q t" << t << " h" << h << " c" << c;
        max_q_rel = std::max(max_q_rel, std::fabs(q - y[c]) / rms);
        const double ys = std::min(std::fabs(y[c]) / 0.0625, 448.0);
        const double q8 = std::fabs(ref_e4m3_value(o1.q_fp8_out[o]));
        ASSERT_LE(std::fabs(q8 - ys), std::max(ys * 0x1p-4, 0x1p-10) + 1e-5 * rms / 0.0625) << "q_fp8 t" << t;
        if (ys > 0x1p-8) { ASSERT_EQ(std::signbit(ref_e4m3_value(o1.q_fp8_out[o])), std::signbit(y[c])); }
        ++fp8_checked;
      }
    }
    // index_q (head nq + 2nkv): e4m3, unit scale.
    ref_head_f64(&acc[size_t(t * n + (p.nq + 2) * 128)], p.index_q_norm_weight.data(), p.cfg.eps, cs, y);
    for (int c = 0; c < 128; ++c) {
      const double ys = std::min(std::fabs(y[c]), 448.0);
      ASSERT_LE(std::fabs(std::fabs(ref_e4m3_value(o1.index_q_out[size_t(t * 128 + c)])) - ys),
                std::max(ys * 0x1p-4, 0x1p-10) + 1e-5)
          << "index_q t" << t << " c" << c;
    }
    // K, V (slot), index_k (index slot).
    const int64_t slot = p.slot_mapping[size_t(t)];
    if (slot >= 0) {
      uint8_t codes[128], sc[8];
      ref_head_f64(&acc[size_t(t * n + p.nq * 128)], p.k_norm_weight.data(), p.cfg.eps, cs, y);
      g::decode_nvfp4_token(o1.kv_cache.data(), p.kv_page_stride, p.block_size, 0, slot, false, float(ksf), dec);
      g::read_nvfp4_token(o1.kv_cache.data(), p.kv_page_stride, p.block_size, 0, slot, false, codes, sc);
      check_nvfp4_head(dec, sc, y, ksf, "k", t);
      double v[128];
      for (int c = 0; c < 128; ++c) v[c] = acc[size_t(t * n + (p.nq + 1) * 128 + c)];
      g::decode_nvfp4_token(o1.kv_cache.data(), p.kv_page_stride, p.block_size, 1, slot, true, float(vsf), dec);
      g::read_nvfp4_token(o1.kv_cache.data(), p.kv_page_stride, p.block_size, 1, slot, true, codes, sc);
      check_nvfp4_head(dec, sc, v, vsf, "v", t);
    }
    const int64_t islot = p.index_slot_mapping[size_t(t)];
    if (islot >= 0) {
      uint8_t codes[128], sc[8];
      ref_head_f64(&acc[size_t(t * n + (p.nq + 3) * 128)], p.index_k_norm_weight.data(), p.cfg.eps, cs, y);
      g::decode_nvfp4_token(o1.index_cache.data(), p.index_page_stride, p.block_size, 0, islot, false, 1.0f, dec);
      g::read_nvfp4_token(o1.index_cache.data(), p.index_page_stride, p.block_size, 0, islot, false, codes, sc);
      check_nvfp4_head(dec, sc, y, 1.0, "index_k", t);
    }
  }
  // Every byte of q outputs written; caches: exactly the bytes of written tokens.
  for (size_t i = 0; i < o1.q_out.size(); ++i) ASSERT_EQ(o1.q_out[i], o2.q_out[i]);
  for (size_t i = 0; i < o1.q_fp8_out.size(); ++i) ASSERT_EQ(o1.q_fp8_out[i], o2.q_fp8_out[i]);
  for (size_t i = 0; i < o1.index_q_out.size(); ++i) ASSERT_EQ(o1.index_q_out[i], o2.index_q_out[i]);
  std::vector<uint8_t> kvw(o1.kv_cache.size(), 0), ixw(o1.index_cache.size(), 0);
  for (int64_t t = 0; t < p.m; ++t) {
    if (p.slot_mapping[size_t(t)] >= 0) {
      mark_token(kvw, p.kv_page_stride, p.block_size, 0, p.slot_mapping[size_t(t)], false);
      mark_token(kvw, p.kv_page_stride, p.block_size, 1, p.slot_mapping[size_t(t)], true);
    }
    if (p.index_slot_mapping[size_t(t)] >= 0)
      mark_token(ixw, p.index_page_stride, p.block_size, 0, p.index_slot_mapping[size_t(t)], false);
  }
  check_untouched(o1.kv_cache, o2.kv_cache, kvw, "kv_cache");
  check_untouched(o1.index_cache, o2.index_cache, ixw, "index_cache");
  std::printf("q bf16 max |err|/rms vs f64 epilogue: %.3g; %lld fp8 values checked\n", max_q_rel,
              (long long)fp8_checked);
}

// §6 guards: out-of-range slots are not written and flag; out-of-range positions
// are clamped for the read and flag. Reference: the same problem with the
// positions clamped by hand and the bad slots replaced by skips, which must
// give identical bytes and no flags.
TEST(GoldenGuards, OutOfRangeSlotsAndPositions) {
  ProblemConfig cfg;
  cfg.m = 96;
  cfg.k = 256;
  cfg.nq = 8;
  cfg.nkv = 2;
  cfg.niq = 2;
  cfg.nik = 1;
  cfg.block_size = 16;
  cfg.max_position = 64;
  cfg.out_of_range_slots = true;
  cfg.out_of_range_positions = true;
  const Problem p = m3qkv_test::make_problem(cfg);
  SCOPED_TRACE(p.cfg.describe());
  Problem fixed = p;
  int bad_pos = 0, bad_slot = 0, bad_islot = 0;
  for (int64_t t = 0; t < p.m; ++t) {
    auto& pos = fixed.positions[size_t(t)];
    if (pos < 0) { pos = 0; ++bad_pos; }
    if (pos >= p.max_position) { pos = p.max_position - 1; ++bad_pos; }
    if (fixed.slot_mapping[size_t(t)] >= p.kv_capacity()) { fixed.slot_mapping[size_t(t)] = -1; ++bad_slot; }
    if (fixed.index_slot_mapping[size_t(t)] >= p.index_capacity()) { fixed.index_slot_mapping[size_t(t)] = -1; ++bad_islot; }
  }
  ASSERT_GT(bad_pos, 0);
  ASSERT_GT(bad_slot, 0);
  ASSERT_GT(bad_islot, 0);
  const auto a = m3qkv_test::golden_outputs(p, 0xa5);
  const auto b = m3qkv_test::golden_outputs(fixed, 0xa5);
  EXPECT_EQ(a.flags, M3QKV_FLAG_SLOT_OUT_OF_RANGE | M3QKV_FLAG_INDEX_SLOT_OUT_OF_RANGE | M3QKV_FLAG_POSITION_OUT_OF_RANGE);
  EXPECT_EQ(b.flags, 0u);
  EXPECT_TRUE(a.q_out == b.q_out);
  EXPECT_TRUE(a.q_fp8_out == b.q_fp8_out);
  EXPECT_TRUE(a.index_q_out == b.index_q_out);
  EXPECT_TRUE(a.kv_cache == b.kv_cache);
  EXPECT_TRUE(a.index_cache == b.index_cache);
  // and the clamped read really is row 0 / the last row: a flagged token differs from an unclamped rerun
  // only through cos/sin, so its q equals the run at the clamped position (checked above via `fixed`).
  EXPECT_EQ(g::clamp_position(-5, 64), 0);
  EXPECT_EQ(g::clamp_position(INT64_MAX, 64), 63);
  EXPECT_EQ(g::clamp_position(17, 64), 17);
}

// Flag bits one at a time.
TEST(GoldenGuards, EachFlagAlone) {
  ProblemConfig cfg;
  cfg.m = 4;
  cfg.k = 128;
  cfg.nq = 2;
  cfg.nkv = 1;
  cfg.slot_skip_fraction = 0;
  Problem p = m3qkv_test::make_problem(cfg);
  {
    Problem q = p;
    q.slot_mapping[1] = q.kv_capacity();
    EXPECT_EQ(m3qkv_test::golden_outputs(q, 0).flags, M3QKV_FLAG_SLOT_OUT_OF_RANGE);
  }
  {
    Problem q = p;
    q.index_slot_mapping[3] = INT64_MAX;
    EXPECT_EQ(m3qkv_test::golden_outputs(q, 0).flags, M3QKV_FLAG_INDEX_SLOT_OUT_OF_RANGE);
  }
  {
    Problem q = p;
    q.positions[0] = q.max_position;
    EXPECT_EQ(m3qkv_test::golden_outputs(q, 0).flags, M3QKV_FLAG_POSITION_OUT_OF_RANGE);
  }
  {
    Problem q = p;
    q.slot_mapping[0] = -1;
    q.slot_mapping[1] = INT64_MIN;  // negative: skip, no flag
    EXPECT_EQ(m3qkv_test::golden_outputs(q, 0).flags, 0u);
  }
}

// insert() = the epilogue on float(bf16 qkv); dense layer (niq = nik = 0), q_fp8 only.
TEST(GoldenInsert, MatchesEpilogueOnBf16Projection) {
  ProblemConfig cfg;
  cfg.m = 33;
  cfg.k = 256;
  cfg.nq = 4;
  cfg.nkv = 2;
  cfg.niq = 0;
  cfg.nik = 0;
  cfg.q_bf16 = false;
  cfg.block_size = 4;
  const Problem p = m3qkv_test::make_problem(cfg);
  const auto acc = g::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
  const auto qkv = m3qkv_test::to_bf16(acc);
  std::vector<float> accb(acc.size());
  for (size_t i = 0; i < acc.size(); ++i) accb[i] = float(bf16v(qkv[i]));
  auto a = p.make_outputs(0x33);
  auto b = p.make_outputs(0x33);
  uint32_t fa = 0, fb = 0;
  g::insert(p.host_insert_args(qkv.data(), a.ptrs()), &fa);
  g::epilogue(p.host_args(b.ptrs()), accb.data(), &fb);
  EXPECT_TRUE(a.q_out.empty());
  EXPECT_TRUE(a.q_fp8_out == b.q_fp8_out);
  EXPECT_TRUE(a.kv_cache == b.kv_cache);
  EXPECT_EQ(fa, fb);
  // something was written
  EXPECT_NE(std::count(a.kv_cache.begin(), a.kv_cache.end(), uint8_t(0x33)), int64_t(a.kv_cache.size()));
}

// gemm_bf16 = bf16_rn(acc).
TEST(GoldenGemm, Bf16OfAcc) {
  ProblemConfig cfg;
  cfg.m = 9;
  cfg.k = 128;
  cfg.nq = 1;
  cfg.nkv = 1;
  cfg.niq = 0;
  cfg.nik = 0;
  const Problem p = m3qkv_test::make_problem(cfg);
  const auto acc = g::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
  std::vector<uint16_t> out(acc.size(), 0xdead);
  m3qkv_gemm_args a;
  std::memset(&a, 0, sizeof(a));
  a.struct_size = sizeof(a);
  a.m = p.m;
  a.n = p.n();
  a.k = p.k;
  a.xq = p.xq.data();
  a.xsf = p.xsf.data();
  a.wq = p.wq.data();
  a.wsf = p.wsf.data();
  a.out = out.data();
  g::gemm_bf16(a);
  for (size_t i = 0; i < acc.size(); ++i) {
    const double d = std::fabs(bf16v(out[i]) - double(acc[i]));
    int ex;
    std::frexp(double(acc[i]), &ex);                       // |acc| in [2^(ex-1), 2^ex)
    ASSERT_LE(d, std::ldexp(1.0, ex - 1 - 8)) << i;         // RN to 8 significant bits: half ulp = 2^(ex-1-8)
    if (acc[i] != 0) { ASSERT_EQ(std::signbit(bf16v(out[i])), std::signbit(acc[i])); }
  }
}

// The problem builder's own promises (tests that use it rely on them).
TEST(ProblemBuilder, Invariants) {
  ProblemConfig cfg;
  cfg.m = 300;
  cfg.k = 256;
  cfg.nq = 8;
  cfg.nkv = 2;
  cfg.niq = 2;
  cfg.nik = 1;
  cfg.block_size = 16;
  cfg.slot_skip_fraction = 0.25;
  const Problem p = m3qkv_test::make_problem(cfg);
  EXPECT_EQ(p.kv_page_stride, 2 * 2 * 16 * 72 + 64);
  EXPECT_EQ(p.index_page_stride, 16 * 72 + 64);
  EXPECT_EQ(p.kv_cache_bytes(), size_t(p.num_blocks * p.kv_page_stride));
  std::set<int64_t> kv, ix, pages;
  int skipped = 0;
  for (int64_t t = 0; t < p.m; ++t) {
    const int64_t s = p.slot_mapping[size_t(t)], is = p.index_slot_mapping[size_t(t)];
    ASSERT_LT(s, p.kv_capacity());
    ASSERT_LT(is, p.index_capacity());
    if (s >= 0) {
      ASSERT_TRUE(kv.insert(s).second) << "duplicate slot " << s;
      pages.insert(s / p.block_size);
    } else {
      ++skipped;
    }
    if (is >= 0) { ASSERT_TRUE(ix.insert(is).second) << "duplicate index slot " << is; }
    ASSERT_GE(p.positions[size_t(t)], 0);
    ASSERT_LT(p.positions[size_t(t)], p.max_position);
  }
  EXPECT_GT(pages.size(), 3u);
  EXPECT_GT(skipped, 0);
  EXPECT_LT(skipped, int(p.m));
  // inputs are not trivial
  EXPECT_GT(std::count_if(p.xq.begin(), p.xq.end(), [](uint8_t b) { return (b & 0x7f) != 0; }), int64_t(p.xq.size() / 2));
  EXPECT_GT(std::count_if(p.xq.begin(), p.xq.end(), [](uint8_t b) { return (b & 0x80) != 0; }), int64_t(p.xq.size() / 4));
  // args_with maps every non-empty input exactly once and nothing else
  int calls = 0;
  std::set<std::string> names;
  m3qkv_test::OutputPtrs out;
  const auto a = p.args_with(
      [&](const m3qkv_test::HostBuffer& b) {
        ++calls;
        names.insert(b.name);
        EXPECT_GT(b.bytes, 0u);
        return reinterpret_cast<const void*>(uintptr_t(0x1000) * calls);
      },
      out);
  EXPECT_EQ(calls, 12);
  EXPECT_EQ(names.size(), 12u);
  EXPECT_EQ(a.struct_size, sizeof(m3qkv_fused_args));
  EXPECT_EQ(a.m, p.m);
  EXPECT_EQ(a.k, p.k);
  EXPECT_EQ(a.num_blocks, p.num_blocks);
  EXPECT_NE(a.xq, nullptr);
  EXPECT_NE(a.index_slot_mapping, nullptr);
  // dense: the index inputs are null
  cfg.niq = cfg.nik = 0;
  const Problem d = m3qkv_test::make_problem(cfg);
  const auto ad = d.host_args(out);
  EXPECT_EQ(ad.index_q_norm_weight, nullptr);
  EXPECT_EQ(ad.index_k_norm_weight, nullptr);
  EXPECT_EQ(ad.index_slot_mapping, nullptr);
  EXPECT_EQ(d.index_cache_bytes(), 0u);
}

TEST(ProblemBuilder, CompareOutputsNamesTheByte) {
  ProblemConfig cfg;
  cfg.m = 8;
  cfg.k = 128;
  cfg.nq = 2;
  cfg.nkv = 1;
  cfg.slot_skip_fraction = 0;
  const Problem p = m3qkv_test::make_problem(cfg);
  const auto a = m3qkv_test::golden_outputs(p, 0xa5);
  auto b = a;
  EXPECT_EQ(m3qkv_test::compare_outputs(p, a, b), "");
  // V scale of token 5 group 3 of the slot of token 0: flip it
  const int64_t slot = p.slot_mapping[0];
  const int t = int(slot % p.block_size);
  const int64_t byte = (slot / p.block_size) * p.kv_page_stride + 1 * p.block_size * 72 + p.block_size * 64 +
                       ((t / 4) * 4 + 3 / 2) * 8 + (3 % 2) * 4 + t % 4;
  b.kv_cache[size_t(byte)] ^= 1;
  b.q_out[130] ^= 1;
  const std::string r = m3qkv_test::compare_outputs(p, a, b);
  EXPECT_NE(r.find("V head 0 token " + std::to_string(t)), std::string::npos) << r;
  EXPECT_NE(r.find("scale of group 3"), std::string::npos) << r;
  EXPECT_NE(r.find("token 0 head 1 col 2"), std::string::npos) << r;
}

}  // namespace
