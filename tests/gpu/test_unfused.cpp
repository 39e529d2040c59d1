// The unfused ops on the GPU against the golden model:
//  - m3qkv_mxfp8_gemm: bit-exact bf16_rn(acc) on exact data; on random data
//    the error figure vs f64 and every element within one bf16 ulp of
//    bf16_rn(f64 reference);
//  - m3qkv_qknorm_rope_kv_insert: bit-exact vs golden::insert on random bf16
//    projections (zero rows, saturating rows, skipped / out-of-range slots),
//    in the plan's lane layout and in each one forced (quad rows, warp rows,
//    8-lane rows, the split c32q8 and c16q8 with and without the guess);
//  - m3qkv_mxfp8_quantize: bit-exact vs golden::mxfp8_quantize on random
//    bf16 incl. zero rows and extreme values (padding scale rows included);
//  - the unfused pair gemm -> insert with PDL equals the golden composition.
// Outputs live in guarded poisoned buffers (harness.h), both poison salts.
#include <gtest/gtest.h>

#include <cinttypes>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/layouts.h"
#include "common/numerics.h"
#include "common/problem.h"
#include "common/test_util.h"
#include "golden/golden.h"
#include "gpu/gpu_util.h"
#include "gpu/harness.h"

namespace {

using namespace m3qkv_gpu;
using m3qkv_test::make_problem;

struct Shape {
  const char* name;
  int64_t m;
  int nq, nkv, niq, nik;
  int64_t k;
  int block_size;
};
std::string shape_name(const Shape& s) {
  return std::string(s.name) + "_M" + std::to_string(s.m) + "_K" + std::to_string(s.k) + "_B" +
         std::to_string(s.block_size);
}
void PrintTo(const Shape& s, std::ostream* os) { *os << shape_name(s); }
ProblemConfig shape_config(const Shape& s, bool exact) {
  ProblemConfig c;
  c.m = s.m;
  c.k = s.k;
  c.nq = s.nq;
  c.nkv = s.nkv;
  c.niq = s.niq;
  c.nik = s.nik;
  c.block_size = s.block_size;
  c.exact_data = exact;
  return c;
}

// Runs m3qkv_mxfp8_gemm on p's operands into a guarded poisoned [M, N] bf16.
void run_gemm(const Problem& p, const DeviceInputs& in, int salt, std::vector<uint8_t>* out, bool* guards_ok) {
  GuardedBuffer o;
  CUDA_OK(o.init(size_t(p.m * p.n()) * 2, salt));
  const auto ins = p.inputs();
  m3qkv_gemm_args g{};
  g.struct_size = sizeof g;
  g.m = p.m;
  g.n = p.n();
  g.k = p.k;
  g.xq = in.get(ins[0]);
  g.xsf = in.get(ins[1]);
  g.wq = in.get(ins[2]);
  g.wsf = in.get(ins[3]);
  g.out = o.payload();
  M3QKV_OK(m3qkv_mxfp8_gemm(&g, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  int64_t bad = 0;
  CUDA_OK(o.fetch(out, guards_ok, &bad));
}

// ------------------------------------------------------------------- gemm
class GpuGemm : public ::testing::TestWithParam<Shape> {};

TEST_P(GpuGemm, ExactDataBitExact) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  const Problem p = make_problem(shape_config(GetParam(), true));
  std::vector<uint16_t> want(size_t(p.m * p.n()));
  m3qkv_gemm_args h{};
  h.struct_size = sizeof h;
  h.m = p.m;
  h.n = p.n();
  h.k = p.k;
  h.xq = p.xq.data();
  h.xsf = p.xsf.data();
  h.wq = p.wq.data();
  h.wsf = p.wsf.data();
  h.out = want.data();
  m3qkv::golden::gemm_bf16(h);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  for (int salt = 0; salt < 2; ++salt) {
    std::vector<uint8_t> got;
    bool guards_ok = false;
    ASSERT_NO_FATAL_FAILURE(run_gemm(p, in, salt, &got, &guards_ok));
    EXPECT_TRUE(guards_ok) << "m3qkv_mxfp8_gemm wrote outside out[M, N] (rows past M?)";
    ASSERT_EQ(got.size(), want.size() * 2);
    const uint16_t* g = reinterpret_cast<const uint16_t*>(got.data());
    int64_t bad = 0, first = -1;
    for (size_t i = 0; i < want.size(); ++i)
      if (g[i] != want[i] && bad++ == 0) first = int64_t(i);
    EXPECT_EQ(bad, 0) << "salt " << salt << ": " << bad << " bf16 outputs differ; first [" << first / p.n() << ", "
                      << first % p.n() << "]: got 0x" << std::hex << (first >= 0 ? g[first] : 0) << ", expected 0x"
                      << (first >= 0 ? want[size_t(first)] : 0);
  }
}

// bf16 output: each element is within one bf16 ulp of bf16_rn(f64 ref), plus
// the f32 accumulation error (allowed as 1e-5 of the largest |ref|: an element
// that cancels to ~0 may carry it whole).
TEST_P(GpuGemm, RandomDataErrorFigure) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  const Problem p = make_problem(shape_config(GetParam(), false));
  const auto ref = m3qkv::golden::mxfp8_acc_f64(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  std::vector<uint8_t> got;
  bool guards_ok = false;
  ASSERT_NO_FATAL_FAILURE(run_gemm(p, in, 0, &got, &guards_ok));
  EXPECT_TRUE(guards_ok);
  const uint16_t* g = reinterpret_cast<const uint16_t*>(got.data());
  double max_ref = 0.0;
  for (double r : ref) max_ref = std::max(max_ref, std::fabs(r));
  std::vector<float> out(ref.size());
  int64_t exact = 0, far = 0, first_far = -1;
  for (size_t i = 0; i < ref.size(); ++i) {
    out[i] = m3qkv::bf16_to_f32(g[i]);
    const uint16_t w = m3qkv::f32_to_bf16_rn_soft(static_cast<float>(ref[i]));
    if (w == g[i]) {
      ++exact;
      continue;
    }
    int e = 0;
    std::frexp(ref[i] != 0.0 ? ref[i] : 1e-30, &e);
    const double ulp = std::ldexp(1.0, e - 8);  // bf16: 8 significant bits
    if (std::fabs(double(out[i]) - ref[i]) > ulp + 1e-5 * max_ref && far++ == 0) first_far = int64_t(i);
  }
  const ErrorFigure e = relative_error(out.data(), ref.data(), ref.size());
  RecordProperty("gemm_bf16_rel_error", std::to_string(e.rel_fro));
  std::printf("[ gemm ] m3qkv_mxfp8_gemm %s: |bf16(out)-ref|/|ref| = %.3e, equal to bf16_rn(ref) %.4f%%\n",
              shape_name(GetParam()).c_str(), e.rel_fro, 100.0 * double(exact) / double(ref.size()));
  EXPECT_EQ(e.non_finite, 0);
  EXPECT_LE(e.rel_fro, std::ldexp(1.0, -9) + 1e-5) << "more than bf16 rounding";
  EXPECT_EQ(far, 0) << "elements further than one bf16 ulp + 1e-5·max|ref| from the f64 reference; first " << first_far;
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuGemm,
                         ::testing::Values(Shape{"TP8", 1, 8, 1, 1, 1, 512, 16}, Shape{"TP4", 7, 16, 1, 1, 1, 6144, 16},
                                           Shape{"TP2", 129, 32, 2, 2, 1, 512, 16},
                                           Shape{"TP8", 513, 8, 1, 1, 1, 1024, 16},
                                           Shape{"TP4", 2048, 16, 1, 1, 1, 256, 16},
                                           Shape{"TP1", 64, 64, 4, 4, 1, 512, 16}),
                         [](const ::testing::TestParamInfo<Shape>& i) { return shape_name(i.param); });

// ----------------------------------------------------------------- insert
// A random bf16 projection [M, N]: rows ~N(0, 2^[-3,3]), a zero row, a row
// large enough to saturate the fp8 outputs, and one all-zero V head.
std::vector<uint16_t> random_qkv(const Problem& p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  const int64_t n = p.n();
  std::vector<float> v(size_t(p.m * n));
  for (int64_t r = 0; r < p.m; ++r) {
    double rs = std::exp2(ud(rng) * 6.0 - 3.0);
    if (r == 1) rs = 0.0;     // zero row: RMSNorm of zeros, amax 0 scale clamp
    if (r == 2) rs = 3000.0;  // saturates q_fp8 / index_q
    for (int64_t c = 0; c < n; ++c) v[size_t(r * n + c)] = float(nd(rng) * rs);
  }
  if (p.m > 3) {  // an all-zero V head of token 3
    const int64_t v0 = int64_t(p.nq + p.nkv) * 128;
    for (int c = 0; c < 128; ++c) v[size_t(3 * n + v0 + c)] = 0.0f;
  }
  return m3qkv_test::to_bf16(v);
}

struct InsertCase {
  Shape s;
  bool q_bf16, q_fp8;
  bool oor;
  double skip;
};
std::string insert_name(const InsertCase& c) {
  return shape_name(c.s) + (c.q_bf16 && c.q_fp8 ? "_qBoth" : (c.q_bf16 ? "_qBf16" : "_qFp8")) +
         (c.oor ? "_OutOfRange" : "");
}

void PrintTo(const InsertCase& c, std::ostream* os) { *os << insert_name(c); }

class GpuInsert : public ::testing::TestWithParam<InsertCase> {};

TEST_P(GpuInsert, BitExactVsGoldenInsert) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  const InsertCase& c = GetParam();
  ProblemConfig cfg = shape_config(c.s, false);
  cfg.k = 128;  // the GEMM operands are not used
  cfg.q_bf16 = c.q_bf16;
  cfg.q_fp8 = c.q_fp8;
  cfg.out_of_range_slots = c.oor;
  cfg.out_of_range_positions = c.oor;
  cfg.slot_skip_fraction = c.skip;
  const Problem p = make_problem(cfg);
  const std::vector<uint16_t> qkv = random_qkv(p, p.cfg.seed ^ 0x1A5EULL);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  M3QKV_ALLOC(dqkv, qkv.size() * 2);
  CUDA_OK(dqkv.upload(qkv));
  for (int run = 0; run < 2 + 2 * kInsertLayoutCount; ++run) {
    // The plan's layout with and without PDL, then each layout forced, both salts.
    const int layout = run < 2 ? 0 : kInsertLayouts[(run - 2) / 2];
    const int salt = run % 2, pdl = run < 2 ? run : 1;
    {
      InsertLayoutScope forced(layout);
      const std::string what = insert_name(c) + " layout " +
                               (layout == 0 ? std::string("auto") : insert_layout_name(layout)) + " salt " +
                               std::to_string(salt) + " use_pdl " + std::to_string(pdl);
      SCOPED_TRACE(what);
      DeviceOutputs d;
      CUDA_OK(d.init(p, salt));
      m3qkv_insert_args a = p.insert_args_with(in.mapper(), dqkv.get(), d.ptrs());
      a.use_pdl = pdl;
      M3QKV_OK(m3qkv_qknorm_rope_kv_insert(&a, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      Fetched got;
      CUDA_OK(fetch_outputs(d, &got));
      HostOutputs want = poisoned_host_outputs(p, salt);
      golden_insert(p, qkv.data(), &want);
      expect_same_outputs(p, want, got, "m3qkv_qknorm_rope_kv_insert " + what);
      if (HasFailure()) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuInsert,
    ::testing::Values(InsertCase{Shape{"TP4", 129, 16, 1, 1, 1, 128, 16}, true, true, false, 0.125},
                      InsertCase{Shape{"TP1", 64, 64, 4, 4, 1, 128, 128}, true, false, true, 0.25},
                      InsertCase{Shape{"TP8", 513, 8, 1, 1, 1, 128, 64}, false, true, false, 0.125},
                      InsertCase{Shape{"Dense", 7, 16, 2, 0, 0, 128, 16}, true, true, true, 0.25},
                      InsertCase{Shape{"TP2", 2048, 32, 2, 2, 1, 128, 16}, true, false, false, 0.125},
                      InsertCase{Shape{"TP4", 1, 16, 1, 1, 1, 128, 128}, true, true, false, 0.0}),
    [](const ::testing::TestParamInfo<InsertCase>& i) { return insert_name(i.param); });

// gemm (PDL) -> insert (PDL) through a poisoned bf16 buffer equals the golden
// composition bf16_rn(acc) -> insert, on exact data.
TEST(GpuUnfusedPair, GemmThenInsertWithPdl) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  ProblemConfig cfg = shape_config(Shape{"TP4", 300, 16, 1, 1, 1, 1024, 64}, true);
  cfg.out_of_range_slots = true;
  const Problem p = make_problem(cfg);
  std::vector<uint16_t> qkv(size_t(p.m * p.n()));
  m3qkv_gemm_args h{};
  h.struct_size = sizeof h;
  h.m = p.m;
  h.n = p.n();
  h.k = p.k;
  h.xq = p.xq.data();
  h.xsf = p.xsf.data();
  h.wq = p.wq.data();
  h.wsf = p.wsf.data();
  h.out = qkv.data();
  m3qkv::golden::gemm_bf16(h);
  HostOutputs want = poisoned_host_outputs(p, 0);
  golden_insert(p, qkv.data(), &want);

  DeviceInputs in;
  CUDA_OK(in.upload(p));
  M3QKV_ALLOC(dqkv, qkv.size() * 2);
  DeviceOutputs d;
  CUDA_OK(d.init(p, 0));
  const auto ins = p.inputs();
  m3qkv_gemm_args g = h;
  g.xq = in.get(ins[0]);
  g.xsf = in.get(ins[1]);
  g.wq = in.get(ins[2]);
  g.wsf = in.get(ins[3]);
  g.out = dqkv.get();
  g.use_pdl = 1;
  m3qkv_insert_args a = p.insert_args_with(in.mapper(), dqkv.get(), d.ptrs());
  a.use_pdl = 1;
  Stream s;
  CUDA_OK(s.error());
  for (int rep = 0; rep < 3; ++rep) {
    CUDA_OK(cudaMemsetAsync(dqkv.get(), 0xFF, qkv.size() * 2, s.get()));  // bf16 NaN
    M3QKV_OK(m3qkv_mxfp8_gemm(&g, s.get()));
    M3QKV_OK(m3qkv_qknorm_rope_kv_insert(&a, s.get()));
  }
  CUDA_OK(cudaStreamSynchronize(s.get()));
  Fetched got;
  CUDA_OK(fetch_outputs(d, &got));
  expect_same_outputs(p, want, got, "gemm -> insert (PDL)");
}

// --------------------------------------------------------------- quantize
struct QuantCase {
  int64_t m, k;
  bool specials;  // ±inf / NaN elements
};
std::string quant_name(const QuantCase& c) {
  return "M" + std::to_string(c.m) + "_K" + std::to_string(c.k) + (c.specials ? "_InfNaN" : "");
}

// bf16 [m, k]: rows ~N(0, 2^[-30, 30]) with zero rows, single-nonzero blocks,
// bf16 extremes (max finite, min normal, min subnormal), values on e4m3
// rounding / saturation boundaries; with `specials`, ±inf and NaN too.
std::vector<uint16_t> quant_input(int64_t m, int64_t k, bool specials, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<uint16_t> x(size_t(m * k));
  const uint16_t extremes[] = {0x7F7F, 0xFF7F, 0x0080, 0x8080, 0x0001, 0x8001, 0x0000, 0x8000,
                               0x43E0 /*448*/, 0x43E8 /*464*/, 0x43F0 /*480*/, 0x3B80, 0x3A00, 0x4170};
  for (int64_t r = 0; r < m; ++r) {
    const int kind = int(r % 7);
    const double rs = std::exp2(double(int64_t(rng() % 61) - 30));
    for (int64_t c = 0; c < k; ++c) {
      uint16_t v;
      switch (kind) {
        case 0: v = 0; break;                                                       // zero row
        case 1: v = (c % 32 == int64_t(rng() % 32)) ? m3qkv::f32_to_bf16_rn_soft(float(nd(rng) * rs)) : 0; break;
        case 2: v = extremes[rng() % (sizeof extremes / 2)]; break;                // extremes
        default: v = m3qkv::f32_to_bf16_rn_soft(float(nd(rng) * rs)); break;
      }
      x[size_t(r * k + c)] = v;
    }
  }
  if (specials)
    for (int i = 0; i < 64 && m * k > 0; ++i) {
      const uint16_t sp[] = {0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81};
      x[size_t(rng() % uint64_t(m * k))] = sp[rng() % 5];
    }
  return x;
}

void PrintTo(const QuantCase& c, std::ostream* os) { *os << quant_name(c); }

class GpuQuantize : public ::testing::TestWithParam<QuantCase> {};

TEST_P(GpuQuantize, BitExactVsGoldenQuantizer) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  const QuantCase& c = GetParam();
  const std::vector<uint16_t> x = quant_input(c.m, c.k, c.specials, m3qkv_test::test_seed() ^ uint64_t(c.m * 131 + c.k));
  const size_t sf_bytes = size_t(m3qkv::f8_128x4_bytes(c.m, c.k / 32));
  std::vector<uint8_t> want_q(size_t(c.m * c.k)), want_sf(sf_bytes);
  m3qkv::golden::mxfp8_quantize(x.data(), c.m, c.k, want_q.data(), want_sf.data());
  M3QKV_ALLOC(dx, x.size() * 2);
  CUDA_OK(dx.upload(x));
  for (int salt = 0; salt < 2; ++salt) {
    SCOPED_TRACE("salt " + std::to_string(salt));
    GuardedBuffer q, sf;
    CUDA_OK(q.init(want_q.size(), salt));
    CUDA_OK(sf.init(sf_bytes, salt));
    m3qkv_quantize_args a{};
    a.struct_size = sizeof a;
    a.m = c.m;
    a.k = c.k;
    a.x = dx.get();
    a.xq = q.payload();
    a.xsf = sf.payload();
    a.use_pdl = salt;
    M3QKV_OK(m3qkv_mxfp8_quantize(&a, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint8_t> gq, gsf;
    bool ok_q = false, ok_sf = false;
    int64_t bad = 0;
    CUDA_OK(q.fetch(&gq, &ok_q, &bad));
    CUDA_OK(sf.fetch(&gsf, &ok_sf, &bad));
    EXPECT_TRUE(ok_q) << "xq written outside [M, K]";
    EXPECT_TRUE(ok_sf) << "xsf written outside its padded size";
    const int64_t fq = first_diff(want_q.data(), gq.data(), want_q.size());
    EXPECT_LT(fq, 0) << count_diff(want_q.data(), gq.data(), want_q.size()) << " xq bytes differ; first [" << fq / c.k
                     << ", " << fq % c.k << "] (bf16 in 0x" << std::hex << (fq >= 0 ? x[size_t(fq)] : 0)
                     << "): got 0x" << int(fq >= 0 ? gq[size_t(fq)] : 0) << ", expected 0x"
                     << int(fq >= 0 ? want_q[size_t(fq)] : 0);
    const int64_t fs = first_diff(want_sf.data(), gsf.data(), sf_bytes);
    EXPECT_LT(fs, 0) << count_diff(want_sf.data(), gsf.data(), sf_bytes) << " xsf bytes differ; first at byte " << fs
                     << ": got 0x" << std::hex << int(fs >= 0 ? gsf[size_t(fs)] : 0) << ", expected 0x"
                     << int(fs >= 0 ? want_sf[size_t(fs)] : 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuQuantize,
                         ::testing::Values(QuantCase{1, 128, false}, QuantCase{7, 6144, false},
                                           QuantCase{128, 512, false}, QuantCase{129, 6144, false},
                                           QuantCase{513, 1024, false}, QuantCase{2048, 256, false},
                                           QuantCase{129, 512, true}),
                         [](const ::testing::TestParamInfo<QuantCase>& i) { return quant_name(i.param); });

}  // namespace
