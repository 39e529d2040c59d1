// The fp8 fast mode's weight fold (src/common/fold_fp8.h, golden
// fold_weights_fp8) against an independent rounding: every e4m3 code at
// every shift, the group scale, and the fold of whole weights (identity when
// a group's exponents agree; the statistics on known and on random data).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/fold_fp8.h"
#include "common/layouts.h"
#include "common/numerics.h"
#include "golden/golden.h"

namespace {

using namespace m3qkv;

// The e4m3 value of a code, by its definition (bias 7, 3 mantissa bits, no inf).
double e4m3_value(int b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return (b & 0x80) ? -mag : mag;
}
bool is_nan_code(int b) { return (b & 0x7f) == 0x7f; }

// RN-even onto the e4m3 grid by search: the nearest code's value; on a tie
// the one with an even mantissa; the sign of x kept for zeros.
int round_e4m3_by_search(double x) {
  int best = -1;
  double best_d = INFINITY;
  for (int b = 0; b < 0x7f; ++b) {  // magnitudes 0 .. 448
    const double d = std::fabs(std::fabs(x) - e4m3_value(b));
    if (d < best_d || (d == best_d && (b & 1) == 0)) best = b, best_d = d;
  }
  return (std::signbit(x) ? 0x80 : 0) | best;
}

TEST(FoldFp8, EveryCodeAtEveryShiftRoundsAsTheGridSays) {
  for (int b = 0; b < 256; ++b) {
    if (is_nan_code(b)) continue;
    for (int shift = 0; shift <= 24; ++shift) {
      const int want = round_e4m3_by_search(std::ldexp(e4m3_value(b), -shift) + (b & 0x80 ? -0.0 : 0.0));
      ASSERT_EQ(fold::shift_e4m3(uint8_t(b), shift), want) << "code 0x" << std::hex << b << std::dec << " shift "
                                                          << shift;
    }
  }
}

TEST(FoldFp8, NanCodesAndShiftZeroAreKept) {
  for (int shift : {0, 1, 7, 19, 20, 254}) {
    EXPECT_EQ(fold::shift_e4m3(0x7f, shift), 0x7f);
    EXPECT_EQ(fold::shift_e4m3(0xff, shift), 0xff);
  }
  for (int b = 0; b < 256; ++b) EXPECT_EQ(fold::shift_e4m3(uint8_t(b), 0), b);
  EXPECT_EQ(fold::shift_e4m3(0x80 | 0x7e, 254), 0x80) << "-448 far down: -0";
}

TEST(FoldFp8, GroupScaleIsTheLargestExponentAndNanIfAnyIs) {
  EXPECT_EQ(fold::group_exponent(120, 127, 3, 126), 127);
  EXPECT_EQ(fold::group_exponent(0, 0, 0, 0), 0);
  EXPECT_EQ(fold::group_exponent(254, 1, 2, 3), 254);
  EXPECT_EQ(fold::group_exponent(120, 0xff, 3, 126), 0xff);
}

// A weight [n, k] of random e4m3 bytes (no NaN) with scale bytes from `scale(r, block)`.
template <class F>
void make_weight(int64_t n, int64_t k, uint64_t seed, F scale, std::vector<uint8_t>* wq, std::vector<uint8_t>* wsf) {
  std::mt19937_64 rng(seed);
  wq->resize(size_t(n * k));
  for (auto& b : *wq) {
    do b = uint8_t(rng()); while (is_nan_code(b));
  }
  wsf->assign(size_t(f8_128x4_bytes(n, k / 32)), 0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k / 32; ++c) (*wsf)[size_t(f8_128x4_offset(r, c, k / 32))] = scale(r, c);
}

TEST(FoldFp8, EqualExponentsFoldToTheSameBytes) {
  const int64_t n = 130, k = 256;
  std::vector<uint8_t> wq, wsf;
  make_weight(n, k, 11, [](int64_t r, int64_t c) { return uint8_t(100 + (r + c / 4) % 40); }, &wq, &wsf);
  std::vector<uint8_t> out(wq.size(), 0xAA), sc(size_t(n * k / 128), 0xAA);
  golden::FoldStats st;
  st.changed = -1;
  golden::fold_weights_fp8(wq.data(), wsf.data(), n, k, out.data(), sc.data(), &st);
  EXPECT_EQ(out, wq);
  EXPECT_EQ(st.changed, 0);
  EXPECT_EQ(st.max_rel_change, 0.0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t g = 0; g < k / 128; ++g) EXPECT_EQ(sc[size_t(r * 2 + g)], 100 + (r + g) % 40);
}

// One group with exponents (E, E-1, E-4, E-12): every element is shift_e4m3
// of its byte by E - e; changed counts the values that moved (checked by
// value, in doubles, independently of the fold's own bookkeeping).
TEST(FoldFp8, MixedExponentsShiftEachBlockAndCountTheChanges) {
  const int64_t n = 3, k = 128;
  const uint8_t exps[4] = {130, 129, 126, 118};
  std::vector<uint8_t> wq, wsf;
  make_weight(n, k, 12, [&](int64_t, int64_t c) { return exps[c]; }, &wq, &wsf);
  std::vector<uint8_t> out(wq.size()), sc(static_cast<size_t>(n));
  golden::FoldStats st;
  golden::fold_weights_fp8(wq.data(), wsf.data(), n, k, out.data(), sc.data(), &st);
  int64_t changed = 0;
  for (int64_t r = 0; r < n; ++r) {
    EXPECT_EQ(sc[size_t(r)], 130);
    for (int64_t c = 0; c < k; ++c) {
      const int shift = 130 - exps[c / 32];
      const size_t i = size_t(r * k + c);
      EXPECT_EQ(out[i], fold::shift_e4m3(wq[i], shift)) << r << "," << c;
      const double before = e4m3_value(wq[i]) * std::ldexp(1.0, exps[c / 32] - 127);
      const double after = e4m3_value(out[i]) * std::ldexp(1.0, 130 - 127);
      changed += before != after;
    }
  }
  EXPECT_EQ(st.changed, changed);
  EXPECT_GT(changed, 0) << "a 12-binade shift must move some of 32 random values";
  EXPECT_GT(st.max_rel_change, 0.0);
  EXPECT_LT(st.max_rel_change, 1.0);
}

// Weights as MXFP8 quantizes them (N(0, 0.02), m3qkv's own quantizer): the
// fold's statistics, printed for the docs; the blocks of a 128-K group
// usually share an exponent or differ by one, which the fold keeps exact for
// all but the smallest values.
TEST(FoldFp8, RealisticWeightsChangeLittle) {
  const int64_t n = 256, k = 1024;
  std::mt19937_64 rng(13);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<uint16_t> w(size_t(n * k));
  for (auto& v : w) v = f32_to_bf16_rn_soft(dist(rng));
  std::vector<uint8_t> wq(size_t(n * k)), wsf(size_t(f8_128x4_bytes(n, k / 32)));
  golden::mxfp8_quantize(w.data(), n, k, wq.data(), wsf.data());
  std::vector<uint8_t> out(wq.size()), sc(size_t(n * k / 128));
  golden::FoldStats st;
  golden::fold_weights_fp8(wq.data(), wsf.data(), n, k, out.data(), sc.data(), &st);
  std::printf("[ fold ] N(0, 0.02) weights %lld x %lld: %lld of %lld values changed (%.3f %%), max ||dw||/||w|| of a "
              "group %.3e\n",
              (long long)n, (long long)k, (long long)st.changed, (long long)(n * k), 100.0 * st.changed / (n * k),
              st.max_rel_change);
  EXPECT_LT(st.changed, n * k / 10);
  EXPECT_LT(st.max_rel_change, 0.05);
}

}  // namespace
