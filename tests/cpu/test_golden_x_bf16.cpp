// The golden model with bf16 activations (x_bf16, W8A16; issue 28 item 2):
//  - x_bf16 holding exactly the dequantized values of (xq, xsf) gives the
//    bits of the MXFP8 path: the accumulator and every output byte, on exact
//    and random data, every cache format;
//  - on random bf16 data the accumulator is within 1e-5 (relative) of an
//    independent f64 reference (bf16 and e4m3 decoded from first principles,
//    a naive k-order sum);
//  - the exact-data construction with bf16 activations holds its bound
//    (problem.h kExactBf16Log2Bound) and uses all 8 significant bits, and its
//    accumulator is order-independent in f32;
//  - m3qkv_mxfp8_gemm's golden reads x_bf16 too.
// Fresh seeds (M3QKV_TEST_SEED replays one), poisoned outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
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
// bf16 -> f64 from the bit pattern (independent of numerics.h).
double ref_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return double(f);
}
// docs/contract.md §4.1 F8_128x4, typed from the contract text.
int64_t ref_sf_offset(int64_t r, int64_t c, int64_t cols) {
  const int64_t kt = (cols + 3) / 4;
  return ((r / 128) * kt + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + (c % 4);
}
std::vector<double> ref_decode(const std::vector<uint8_t>& q, const std::vector<uint8_t>& sf, int64_t rows, int64_t k) {
  std::vector<double> out(size_t(rows * k));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t kk = 0; kk < k; ++kk)
      out[size_t(r * k + kk)] = m3qkv_test::ref_e4m3_value(q[size_t(r * k + kk)]) *
                                std::ldexp(1.0, int(sf[size_t(ref_sf_offset(r, kk / 32, k / 32))]) - 127);
  return out;
}

ProblemConfig config(int64_t m, int64_t k, int nq, int nkv, int niq, int nik, bool exact, int kv, int ix) {
  ProblemConfig c;
  c.m = m;
  c.k = k;
  c.nq = nq;
  c.nkv = nkv;
  c.niq = niq;
  c.nik = nik;
  c.exact_data = exact;
  c.kv_dtype = kv;
  c.index_dtype = nik ? ix : 0;
  c.k_scale = 0.75f;
  c.v_scale = 3.0f;
  c.out_of_range_slots = true;
  c.out_of_range_positions = true;
  return c;
}

// Outputs that are not "all poison" nor "all zero": the comparison below would
// pass vacuously on a golden model that wrote nothing.
void expect_written(const Problem& p, const g::HostOutputs& o, uint8_t poison) {
  size_t changed = 0, nonzero = 0;
  const auto* q = reinterpret_cast<const uint8_t*>(o.q_out.data());
  for (size_t i = 0; i < o.q_out.size() * 2; ++i) {
    changed += q[i] != poison;
    nonzero += q[i] != 0;
  }
  EXPECT_GT(changed, o.q_out.size()) << p.cfg.describe();
  EXPECT_GT(nonzero, o.q_out.size()) << p.cfg.describe();
  size_t kv_changed = 0;
  for (uint8_t b : o.kv_cache) kv_changed += b != poison;
  EXPECT_GT(kv_changed, 0u);
}

struct Shape {
  int64_t m, k;
  int nq, nkv, niq, nik;
};
const Shape kShapes[] = {{7, 512, 16, 1, 1, 1}, {130, 256, 8, 1, 1, 1}, {33, 384, 16, 2, 0, 0}};

TEST(GoldenXBf16, DequantizedActivationsGiveTheBitsOfTheMxfp8Path) {
  int cases = 0;
  for (bool exact : {true, false})
    for (const Shape& s : kShapes)
      for (int kv : {0, 1, 2}) {
        const int ix = (kv + 1) % 3;
        const Problem p = m3qkv_test::make_problem(config(s.m, s.k, s.nq, s.nkv, s.niq, s.nik, exact, kv, ix));
        const Problem q = g::with_dequantized_x_bf16(p);
        SCOPED_TRACE(q.cfg.describe());
        ASSERT_TRUE(q.cfg.x_bf16);
        ASSERT_TRUE(q.xq.empty() && q.xsf.empty());
        ASSERT_EQ(q.x_bf16.size(), size_t(p.m * p.k));
        // x_bf16 holds the MXFP8 values (first-principles decode), every one.
        const auto xd = ref_decode(p.xq, p.xsf, p.m, p.k);
        size_t nonzero = 0;
        for (size_t i = 0; i < xd.size(); ++i) {
          ASSERT_EQ(ref_bf16(q.x_bf16[i]), xd[i]) << "element " << i;
          nonzero += xd[i] != 0;
        }
        ASSERT_GT(nonzero, size_t(p.m));
        // The args carry x_bf16 and no MXFP8 activations.
        g::HostOutputs scratch;
        const m3qkv_fused_args a = q.host_args(scratch.ptrs());
        EXPECT_EQ(a.x_bf16, q.x_bf16.data());
        EXPECT_EQ(a.xq, nullptr);
        EXPECT_EQ(a.xsf, nullptr);
        // The accumulator: the same bits.
        const auto acc_q = g::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
        const auto acc_b = g::w8a16_acc(q.x_bf16.data(), q.wq.data(), q.wsf.data(), q.m, q.n(), q.k);
        const auto acc_f = g::problem_acc(q);
        ASSERT_EQ(acc_q.size(), acc_b.size());
        for (size_t i = 0; i < acc_q.size(); ++i) {
          ASSERT_EQ(bits(acc_q[i]), bits(acc_b[i])) << "acc " << i;
          ASSERT_EQ(bits(acc_b[i]), bits(acc_f[i])) << "acc " << i;
        }
        // Every output byte (fused_qkv through the args), poisoned alike.
        for (uint8_t poison : {uint8_t(0xA5), uint8_t(0x5A)}) {
          const g::HostOutputs want = g::golden_outputs(p, poison);
          const g::HostOutputs got = g::golden_outputs(q, poison);
          EXPECT_EQ(m3qkv_test::compare_outputs(p, want, got), "");
          EXPECT_EQ(want.flags, got.flags);
          EXPECT_NE(got.flags, 0u);  // out-of-range slots / positions flagged
          expect_written(q, got, poison);
        }
        ++cases;
      }
  EXPECT_EQ(cases, 18);
}

// Random bf16 activations (not MXFP8-representable) against an f64 sum of
// products decoded from first principles, in plain k order.
TEST(GoldenXBf16, RandomBf16ActivationsMatchAnIndependentF64Reference) {
  ProblemConfig cfg = config(37, 384, 8, 1, 1, 1, /*exact=*/false, 0, 0);
  cfg.x_bf16 = true;
  const Problem p = m3qkv_test::make_problem(cfg);
  ASSERT_TRUE(p.xq.empty() && p.xsf.empty());
  ASSERT_EQ(p.x_bf16.size(), size_t(p.m * p.k));
  const int64_t n = p.n(), k = p.k;
  // Not vacuous: most values need more than e4m3's 4 significant bits.
  size_t wide = 0;
  for (uint16_t h : p.x_bf16) wide += (h & 0x7) != 0;
  EXPECT_GT(wide, p.x_bf16.size() / 2);
  // The same draws as the MXFP8 problem of this seed: quantized, they are its xq / xsf.
  {
    ProblemConfig c2 = cfg;
    c2.x_bf16 = false;
    const Problem pq = m3qkv_test::make_problem(c2);
    std::vector<uint8_t> xq(size_t(p.m * k)), xsf(size_t(m3qkv::f8_128x4_bytes(p.m, k / 32)));
    g::mxfp8_quantize(p.x_bf16.data(), p.m, k, xq.data(), xsf.data());
    EXPECT_EQ(xq, pq.xq);
    EXPECT_EQ(xsf, pq.xsf);
    EXPECT_EQ(p.wq, pq.wq);
  }
  const auto acc = g::problem_acc(p);
  const auto acc64 = g::w8a16_acc_f64(p.x_bf16.data(), p.wq.data(), p.wsf.data(), p.m, n, k);
  const auto wd = ref_decode(p.wq, p.wsf, n, k);
  double max_rel = 0.0;
  int64_t nonzero = 0;
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0, sa = 0.0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const double t = ref_bf16(p.x_bf16[size_t(i * k + kk)]) * wd[size_t(j * k + kk)];
        s += t;
        sa += std::fabs(t);
      }
      const double got = acc[size_t(i * n + j)];
      const double err = std::fabs(got - s);
      ASSERT_LE(err, 1e-5 * std::fabs(s) + 1e-12 * sa) << i << "," << j << ": got " << got << ", f64 " << s;
      ASSERT_LE(std::fabs(acc64[size_t(i * n + j)] - s), 1e-12 * sa) << i << "," << j;
      if (s != 0) {
        max_rel = std::max(max_rel, err / std::fabs(s));
        ++nonzero;
      }
    }
  EXPECT_GT(nonzero, p.m * n / 2);
  std::printf("w8a16_acc vs independent f64: max |acc - ref| / |ref| = %.3g (seed %llu)\n", max_rel,
              (unsigned long long)p.cfg.seed);
}

// The exact bf16 construction: x = ±j·2^(bx−6), j in [1, 255], at most
// kExactMaxNonzero per row; every partial sum an integer < 2^17 times the
// row's smallest product, so a shuffled f32 sum equals the golden acc.
TEST(GoldenXBf16, ExactBf16DataHoldsItsBoundAndIsOrderIndependent) {
  ProblemConfig cfg = config(40, 1024, 16, 1, 1, 1, /*exact=*/true, 0, 0);
  cfg.x_bf16 = true;
  const Problem p = m3qkv_test::make_problem(cfg);
  ASSERT_TRUE(p.xq.empty() && p.xsf.empty());
  const int64_t n = p.n(), k = p.k;
  const auto acc = g::problem_acc(p);
  const auto wd = ref_decode(p.wq, p.wsf, n, k);
  std::mt19937_64 rng(p.cfg.seed);
  int max_nnz = 0, eight_bit = 0;
  double max_units = 0;
  std::vector<double> prods;
  for (int64_t i = 0; i < p.m; ++i) {
    std::vector<int64_t> nz;
    int row_e = 1000;
    for (int64_t kk = 0; kk < k; ++kk) {
      const double v = ref_bf16(p.x_bf16[size_t(i * k + kk)]);
      if (v == 0) continue;
      nz.push_back(kk);
      // |v| = j·2^(e − 8) with 128 <= j < 256 an integer (at most 8 significant
      // bits); its lowest set bit is 2^(e − 8 + ctz(j)). The row's unit is the
      // smallest lowest bit: the largest power of two dividing every value.
      int e = 0;
      const double f = std::frexp(std::fabs(v), &e);  // |v| = f·2^e, f in [0.5, 1)
      const double j = std::ldexp(f, 8);
      ASSERT_EQ(j, std::floor(j)) << "more than 8 significant bits";
      const unsigned ji = static_cast<unsigned>(j);
      eight_bit += (ji & 1u) == 1u;
      row_e = std::min(row_e, e - 8 + __builtin_ctz(ji));
    }
    max_nnz = std::max(max_nnz, int(nz.size()));
    ASSERT_LE(int(nz.size()), m3qkv_test::kExactMaxNonzero);
    for (int64_t j = 0; j < n; ++j) {
      prods.clear();
      double mn = INFINITY, sum_abs = 0;
      for (int64_t kk : nz) {
        const double t = ref_bf16(p.x_bf16[size_t(i * k + kk)]) * wd[size_t(j * k + kk)];
        prods.push_back(t);
        sum_abs += std::fabs(t);
      }
      if (prods.empty()) continue;
      // p_min of the row and weight row: the x unit times the weight's smallest scale.
      for (int64_t kk : nz) mn = std::min(mn, std::fabs(wd[size_t(j * k + kk)]));
      // w values are powers of two, so the smallest divides the others.
      const double unit = std::ldexp(1.0, row_e) * mn;
      for (double t : prods) ASSERT_EQ(t / unit, std::floor(t / unit)) << "product not a multiple of the unit";
      ASSERT_LT(sum_abs / unit, std::ldexp(1.0, m3qkv_test::kExactBf16Log2Bound)) << i << "," << j;
      max_units = std::max(max_units, sum_abs / unit);
      std::shuffle(prods.begin(), prods.end(), rng);
      float s = 0.0f;
      for (double t : prods) s += float(t);
      ASSERT_EQ(bits(s), bits(acc[size_t(i * n + j)])) << i << "," << j;
    }
  }
  EXPECT_GT(max_nnz, 60);
  EXPECT_GT(eight_bit, 100) << "values with 8 significant bits";
  std::printf("exact bf16 data: max nonzeros %d, max sum|products|/unit %.0f (< 2^%d), 8-bit values %d\n", max_nnz,
              max_units, m3qkv_test::kExactBf16Log2Bound, eight_bit);
}

TEST(GoldenXBf16, GemmReadsTheBf16Activations) {
  for (bool exact : {true, false}) {
    ProblemConfig cfg = config(9, 256, 8, 1, 1, 1, exact, 0, 0);
    cfg.x_bf16 = true;
    const Problem p = m3qkv_test::make_problem(cfg);
    std::vector<uint16_t> out(size_t(p.m * p.n()), 0xA5A5);
    m3qkv_gemm_args a;
    std::memset(&a, 0, sizeof(a));
    a.struct_size = sizeof(a);
    a.m = p.m;
    a.n = p.n();
    a.k = p.k;
    a.x_bf16 = p.x_bf16.data();
    a.wq = p.wq.data();
    a.wsf = p.wsf.data();
    a.out = out.data();
    g::gemm_bf16(a);
    const auto acc = g::w8a16_acc(p.x_bf16.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
    size_t nonzero = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_EQ(out[i], m3qkv::f32_to_bf16_rn_soft(acc[i])) << i;
      nonzero += out[i] != 0;
    }
    EXPECT_GT(nonzero, out.size() / 2);
  }
}

}  // namespace
