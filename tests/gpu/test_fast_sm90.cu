// The fp8 fast mode (precision = 1, issue 29): the weight fold of
// m3qkv_prepare_weights_fp8 and the SM90 fast kernel (src/sm90/fast_sm90.cu)
// against the golden model. Every test name contains "Fast".
//
//  - FastFold.ShiftMatchesTheSoftFoldOnEveryCode: fold::shift_e4m3x4 on the
//    device (the cvt path on sm_89+) against the host's shift_e4m3, every
//    e4m3 code at every shift 0..40 and 254.
//  - FastPrepare.*: the prepare kernel's bytes and statistics against
//    golden::prepare_fp8 on weights with spread block exponents (NaN codes
//    and a NaN scale included); stats refused while capturing; shapes refused.
//  - FastSm90.*: the fast kernel on prepared weights (clusters of 1, 2 and 4
//    CTAs, odd row-block and head counts, a 4-CTA grid): the tap against the f64
//    product of the folded operands (the mode's own rounding only) and
//    against exact mode's product (the issue's 1e-3 target); every output
//    byte against the golden epilogue on the tap, both poison salts.
//  - FastApi.*: precision = 1 through m3qkv_testing_fused_qkv: the fast
//    kernel where sm90::fast_preferred, exact mode on the prepared weights
//    elsewhere (bit-exact with the golden model there); refused by the
//    portable backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "api/internal.h"
#include "common/fold_fp8.h"
#include "common/layouts.h"
#include "common/numerics.h"
#include "common/problem.h"
#include "common/test_util.h"
#include "golden/golden.h"
#include "gpu/backend_support.h"
#include "gpu/gpu_util.h"
#include "gpu/harness.h"
#include "sm90/plan_sm90.h"

namespace {

using namespace m3qkv_gpu;
using m3qkv_test::make_problem;
namespace golden = m3qkv::golden;

// ------------------------------------------------------------ the shift
constexpr int kShifts[] = {0, 1, 2, 3, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 25, 31, 32, 33, 40, 254};
constexpr int kNumShifts = sizeof(kShifts) / sizeof(kShifts[0]);

__global__ void shift_kernel(const int* shifts, uint8_t* out) {
  const int s = blockIdx.x, w = threadIdx.x;  // 64 threads x 4 codes
  const uint32_t in = static_cast<uint32_t>(4 * w) | (static_cast<uint32_t>(4 * w + 1) << 8) |
                      (static_cast<uint32_t>(4 * w + 2) << 16) | (static_cast<uint32_t>(4 * w + 3) << 24);
  const uint32_t r = m3qkv::fold::shift_e4m3x4(in, shifts[s]);
  std::memcpy(out + 256 * s + 4 * w, &r, 4);
}

TEST(FastFold, ShiftMatchesTheSoftFoldOnEveryCode) {
  M3QKV_REQUIRE_GPU();
  M3QKV_ALLOC(ds, sizeof(kShifts));
  M3QKV_ALLOC(dout, 256 * kNumShifts);
  CUDA_OK(ds.upload(std::vector<int>(kShifts, kShifts + kNumShifts)));
  shift_kernel<<<kNumShifts, 64>>>(ds.as<int>(), dout.as<uint8_t>());
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint8_t> got;
  CUDA_OK(dout.download(&got));
  int bad = 0;
  for (int s = 0; s < kNumShifts; ++s)
    for (int b = 0; b < 256; ++b) {
      const uint8_t want = m3qkv::fold::shift_e4m3(static_cast<uint8_t>(b), kShifts[s]);
      if (got[256 * s + b] != want && bad++ < 10)
        ADD_FAILURE() << "code 0x" << std::hex << b << std::dec << " shift " << kShifts[s] << ": device 0x" << std::hex
                      << int(got[256 * s + b]) << " host 0x" << int(want);
    }
  EXPECT_EQ(bad, 0);
}

// ------------------------------------------------------------ the prepare
// Weights whose blocks' exponents spread over 0..24 binades below the
// group's largest (the shifts that stay exact, round and flush), random
// codes with a few NaN codes, and one NaN scale.
void spread_weights(int64_t n, int64_t k, uint64_t seed, std::vector<uint8_t>* wq, std::vector<uint8_t>* wsf) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255), spread(0, 24), coin(0, 3);
  wq->resize(size_t(n * k));
  for (auto& b : *wq) {
    b = static_cast<uint8_t>(byte(rng));
    if ((b & 0x7f) == 0x7f && byte(rng) > 8) b ^= 1;  // keep NaN codes rare
  }
  const int64_t kb = k / 32;
  wsf->assign(size_t(m3qkv::f8_128x4_bytes(n, kb)), 0x7f);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < kb; ++c)
      (*wsf)[size_t(m3qkv::f8_128x4_offset(r, c, kb))] =
          static_cast<uint8_t>(130 - (coin(rng) == 0 ? spread(rng) : coin(rng)));
  (*wsf)[size_t(m3qkv::f8_128x4_offset(n / 2, 5, kb))] = 0xff;
}

struct Prepared {
  DeviceBuffer wq, wsf;
};

m3qkv_status prepare_on_device(const std::vector<uint8_t>& wq, const std::vector<uint8_t>& wsf, int64_t n, int64_t k,
                               Prepared* out, m3qkv_fold_stats* stats, cudaStream_t s = nullptr) {
  DeviceBuffer dwq(wq.size()), dwsf(wsf.size());
  if (dwq.upload(wq) != cudaSuccess || dwsf.upload(wsf) != cudaSuccess) return M3QKV_ERROR_CUDA_ERROR;
  size_t qb = 0, sb = 0;
  const m3qkv_status st = m3qkv_prepare_weights_fp8_sizes(n, k, &qb, &sb);
  if (st != M3QKV_SUCCESS) return st;
  out->wq.alloc(qb);
  out->wsf.alloc(sb);
  m3qkv_prepare_args a{};
  a.struct_size = sizeof(a);
  a.n = n;
  a.k = k;
  a.wq = dwq.get();
  a.wsf = dwsf.get();
  a.wq_out = out->wq.get();
  a.wsf_out = out->wsf.get();
  a.stats = stats;
  const m3qkv_status r = m3qkv_prepare_weights_fp8(&a, s);
  if (r == M3QKV_SUCCESS && cudaStreamSynchronize(s) != cudaSuccess) return M3QKV_ERROR_CUDA_ERROR;
  return r;
}

TEST(FastPrepare, BytesAndStatisticsEqualTheGoldenFold) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  const int64_t n = 256, k = 1024;
  std::vector<uint8_t> wq, wsf;
  spread_weights(n, k, m3qkv_test::test_seed() ^ 0x29, &wq, &wsf);
  std::vector<uint8_t> want_q, want_sf;
  golden::FoldStats want_st;
  golden::prepare_fp8(wq.data(), wsf.data(), n, k, &want_q, &want_sf, &want_st);
  ASSERT_GT(want_st.changed, 0) << "the data must make the fold round something";
  for (bool with_stats : {true, false}) {
    SCOPED_TRACE(with_stats ? "with stats" : "without stats");
    Prepared d;
    m3qkv_fold_stats st{-1, -1.0};
    ASSERT_EQ(prepare_on_device(wq, wsf, n, k, &d, with_stats ? &st : nullptr), M3QKV_SUCCESS) << m3qkv_last_error();
    std::vector<uint8_t> got_q, got_sf;
    CUDA_OK(d.wq.download(&got_q));
    CUDA_OK(d.wsf.download(&got_sf));
    ASSERT_EQ(got_q.size(), want_q.size());
    ASSERT_EQ(got_sf.size(), want_sf.size());
    int64_t bad_q = 0, bad_sf = 0;
    for (size_t i = 0; i < got_q.size(); ++i) bad_q += got_q[i] != want_q[i];
    for (size_t i = 0; i < got_sf.size(); ++i) bad_sf += got_sf[i] != want_sf[i];
    EXPECT_EQ(bad_q, 0) << "folded values differ from golden::prepare_fp8";
    EXPECT_EQ(bad_sf, 0) << "scale bytes differ";
    if (with_stats) {
      EXPECT_EQ(st.changed, want_st.changed);
      EXPECT_EQ(st.max_rel_change, want_st.max_rel_change);
      std::printf("[ fold ] spread weights %lld x %lld: %lld values changed, max group ||dw||/||w|| %.3e\n",
                  (long long)n, (long long)k, (long long)st.changed, st.max_rel_change);
    }
  }
}

TEST(FastPrepare, StatsRefusedWhileCapturingAndShapesChecked) {
  M3QKV_REQUIRE_GPU();
  const int64_t n = 128, k = 256;
  std::vector<uint8_t> wq, wsf;
  spread_weights(n, k, 7, &wq, &wsf);
  Stream s;
  CUDA_OK(s.error());
  m3qkv_fold_stats st{};
  DeviceBuffer dwq(wq.size()), dwsf(wsf.size()), oq(wq.size()), osf(wsf.size());
  CUDA_OK(dwq.upload(wq));
  CUDA_OK(dwsf.upload(wsf));
  cudaGraph_t g = nullptr;
  CUDA_OK(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeThreadLocal));
  m3qkv_prepare_args a{};
  a.struct_size = sizeof(a);
  a.n = n, a.k = k, a.wq = dwq.get(), a.wsf = dwsf.get(), a.wq_out = oq.get(), a.wsf_out = osf.get();
  a.stats = &st;
  EXPECT_EQ(m3qkv_prepare_weights_fp8(&a, s.get()), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(m3qkv_last_error()).find("capturing"), std::string::npos) << m3qkv_last_error();
  a.stats = nullptr;  // without statistics the prepare is capturable
  EXPECT_EQ(m3qkv_prepare_weights_fp8(&a, s.get()), M3QKV_SUCCESS) << m3qkv_last_error();
  CUDA_OK(cudaStreamEndCapture(s.get(), &g));
  CUDA_OK(cudaGraphDestroy(g));
  size_t qb = 0, sb = 0;
  EXPECT_EQ(m3qkv_prepare_weights_fp8_sizes(100, 256, &qb, &sb), M3QKV_ERROR_INVALID_SHAPE);
  EXPECT_EQ(m3qkv_prepare_weights_fp8_sizes(128, 100, &qb, &sb), M3QKV_ERROR_INVALID_SHAPE);
  a.wq_out = dwq.get();  // in place: outputs may not overlap inputs
  EXPECT_NE(m3qkv_prepare_weights_fp8(&a, s.get()), M3QKV_SUCCESS);
  EXPECT_NE(std::string(m3qkv_last_error()).find("wq_out"), std::string::npos) << m3qkv_last_error();
}

// ------------------------------------------------------------ the kernel
// A problem whose weights are replaced by their prepared form (host golden
// fold: the device's equals it, FastPrepare).
Problem prepared_problem(const ProblemConfig& cfg) {
  Problem p = make_problem(cfg);
  std::vector<uint8_t> q, sf;
  golden::FoldStats st;
  golden::prepare_fp8(p.wq.data(), p.wsf.data(), p.n(), p.k, &q, &sf, &st);
  p.wq = q;
  p.wsf = sf;
  return p;
}

ProblemConfig fast_config(const Heads& h, int64_t m, int64_t k, int kv_dtype) {
  ProblemConfig cfg = heads_config(h, m, k, /*exact=*/false, 128);
  cfg.kv_dtype = cfg.index_dtype = kv_dtype;
  return cfg;
}

struct FastCase {
  Heads heads;
  int64_t m, k;
  int kv_dtype;
  int grid;
  int cluster;  // sm90_fused_fast's: 0 automatic, 1, 2, 4
};
std::string fast_name(const FastCase& c) {
  return std::string(c.heads.name) + "_M" + std::to_string(c.m) + "_K" + std::to_string(c.k) + "_" +
         fmt_name(c.kv_dtype) + "_grid" + std::to_string(c.grid) + "_cluster" + std::to_string(c.cluster);
}
class FastSm90 : public ::testing::TestWithParam<FastCase> {};

TEST_P(FastSm90, TapWithinTheFoldedProductAndEpilogueBitExact) {
  M3QKV_REQUIRE_SM90();
  print_seed_once();
  const FastCase& c = GetParam();
  const Problem orig = make_problem(fast_config(c.heads, c.m, c.k, c.kv_dtype));
  const Problem p = prepared_problem(fast_config(c.heads, c.m, c.k, c.kv_dtype));
  const int64_t m = p.m, n = p.n(), k = p.k;
  // The mode's reference: both operands folded, summed in f64.
  std::vector<uint8_t> xf(p.xq.size()), xs(size_t(m * k / 128)), wf(p.wq.size()), ws(size_t(n * k / 128));
  golden::FoldStats sx, sw;
  golden::fold_mxfp8(p.xq.data(), p.xsf.data(), m, k, xf.data(), xs.data(), &sx);
  golden::fold_mxfp8(p.wq.data(), p.wsf.data(), n, k, wf.data(), ws.data(), &sw);
  EXPECT_EQ(sw.changed, 0) << "prepared weights fold to themselves";
  const auto folded = golden::folded_acc_f64(xf.data(), xs.data(), wf.data(), ws.data(), m, n, k);
  const auto exact =
      golden::mxfp8_acc_f64(orig.xq.data(), orig.xsf.data(), orig.wq.data(), orig.wsf.data(), m, n, k);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  const auto launch = [&c](const m3qkv_fused_args& a, const m3qkv::DeviceInfo& dev, float* tap, cudaStream_t s) {
    return sm90_fast_call(a, dev, tap, s, c.cluster);
  };
  std::vector<float> tap0;
  for (int salt = 0; salt < 2; ++salt) {
    SCOPED_TRACE("salt " + std::to_string(salt));
    Fetched got;
    std::vector<float> tap;
    ASSERT_NO_FATAL_FAILURE(run_direct(p, in, salt, c.grid, salt, launch, &got, &tap));
    ASSERT_EQ(tap.size(), folded.size());
    const ErrorFigure ef = relative_error(tap.data(), folded.data(), folded.size());
    const ErrorFigure ee = relative_error(tap.data(), exact.data(), exact.size());
    std::printf("[ fast ] %s: |acc-folded|/|folded| = %.3e (max %.3e), |acc-exact|/|exact| = %.3e, x values changed "
                "by the fold %lld of %lld\n",
                fast_name(c).c_str(), ef.rel_fro, ef.max_abs_over_max_ref, ee.rel_fro, (long long)sx.changed,
                (long long)(m * k));
    EXPECT_EQ(ef.non_finite, 0);
    // The fp8 MMA's own rounding of the folded product measures ~2e-4 (the
    // tensor core keeps fewer bits than f32 inside a group).
    EXPECT_LE(ef.rel_fro, 5e-4) << "beyond the fp8 MMA's own rounding of the folded product";
    EXPECT_LE(ee.rel_fro, 1e-3) << "the issue's accumulator target against exact mode";
    HostOutputs want = poisoned_host_outputs(p, salt);
    golden_epilogue(p, tap.data(), &want);
    expect_same_outputs(p, want, got, "fast " + fast_name(c) + " epilogue on tap");
    if (salt == 0) tap0 = tap;
    else {
      int64_t first = -1;
      EXPECT_EQ(count_f32_mismatch(tap.data(), tap0.data(), tap.size(), &first), 0)
          << "two runs of one call differ (first entry " << first << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, FastSm90,
                         ::testing::Values(FastCase{kTP4, 129, 6144, 1, 0, 0}, FastCase{kTP8, 300, 1024, 0, 0, 2},
                                           FastCase{kTP4, 1024, 2048, 1, 7, 0}, FastCase{kDense, 64, 1024, 2, 0, 0},
                                           FastCase{kTP1, 513, 512, 1, 0, 1}, FastCase{kTP1, 300, 512, 0, 0, 4}),
                         [](const ::testing::TestParamInfo<FastCase>& i) { return fast_name(i.param); });

// ------------------------------------------------------------ the API
// precision = 1 through the test entry of m3qkv_fused_qkv, forced to `backend`.
m3qkv_status run_precision1(const Problem& p, const DeviceInputs& in, m3qkv_backend_kind backend, Fetched* out,
                            std::vector<float>* tap) {
  DeviceOutputs d;
  if (d.init(p, 0) != cudaSuccess) return M3QKV_ERROR_CUDA_ERROR;
  m3qkv_fused_args a = p.args_with(in.mapper(), d.ptrs());
  a.precision = 1;
  DeviceBuffer dtap(size_t(p.m * p.n()) * 4);
  const m3qkv_status st = m3qkv_testing_fused_qkv(&a, dtap.as<float>(), backend, nullptr);
  if (st != M3QKV_SUCCESS) return st;
  if (cudaDeviceSynchronize() != cudaSuccess || fetch_outputs(d, out) != cudaSuccess ||
      dtap.download_as(tap) != cudaSuccess)
    return M3QKV_ERROR_CUDA_ERROR;
  return M3QKV_SUCCESS;
}

TEST(FastApi, ExactModeRunsWhereTheFastKernelDoesNotPay) {
  M3QKV_REQUIRE_SM90();
  // TP4 (20 heads: below kFastMinHeads) at M 1 / 64 / 1024, TP1 below kFastMinM.
  struct Case {
    Heads h;
    int64_t m;
  };
  for (const Case& c : {Case{kTP4, 1}, Case{kTP4, 64}, Case{kTP4, 1024}, Case{kTP1, m3qkv::sm90::kFastMinM - 1}}) {
    const int64_t m = c.m;
    SCOPED_TRACE(std::string(c.h.name) + " M " + std::to_string(m));
    ASSERT_FALSE(m3qkv::sm90::fast_preferred(m, c.h.nq + 2 * c.h.nkv + c.h.niq + c.h.nik));
    ProblemConfig cfg = fast_config(c.h, m, 1024, 1);
    cfg.exact_data = true;  // exact mode's accumulator is then the golden one bit for bit
    const Problem p = prepared_problem(cfg);
    DeviceInputs in;
    CUDA_OK(in.upload(p));
    Fetched got;
    std::vector<float> tap;
    ASSERT_EQ(run_precision1(p, in, M3QKV_BACKEND_SM90, &got, &tap), M3QKV_SUCCESS) << m3qkv_last_error();
    const std::vector<float> acc = golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
    int64_t first = -1;
    EXPECT_EQ(count_f32_mismatch(tap.data(), acc.data(), acc.size(), &first), 0) << "first " << first;
    HostOutputs want = poisoned_host_outputs(p, 0);
    golden_epilogue(p, acc.data(), &want);
    expect_same_outputs(p, want, got, "precision 1, M " + std::to_string(m));
  }
}

TEST(FastApi, TheFastKernelRunsWhereItPaysAndPortableRefuses) {
  M3QKV_REQUIRE_SM90();
  ASSERT_TRUE(m3qkv::sm90::fast_preferred(m3qkv::sm90::kFastMinM, kTP1.nq + 2 * kTP1.nkv + kTP1.niq + kTP1.nik));
  const Problem p = prepared_problem(fast_config(kTP1, m3qkv::sm90::kFastMinM, 512, 1));
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  Fetched got;
  std::vector<float> tap;
  ASSERT_EQ(run_precision1(p, in, M3QKV_BACKEND_SM90, &got, &tap), M3QKV_SUCCESS) << m3qkv_last_error();
  HostOutputs want = poisoned_host_outputs(p, 0);
  golden_epilogue(p, tap.data(), &want);
  expect_same_outputs(p, want, got, "precision 1, TP1 at kFastMinM");
  // The fast kernel's tap: not exact mode's on these weights (the fold of x and the fp8 MMA).
  const std::vector<float> acc = golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
  int64_t first = -1;
  EXPECT_GT(count_f32_mismatch(tap.data(), acc.data(), acc.size(), &first), 0) << "exact mode ran, not the fast kernel";
  EXPECT_EQ(run_precision1(p, in, M3QKV_BACKEND_PORTABLE, &got, &tap), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(m3qkv_last_error()).find("precision = 1"), std::string::npos) << m3qkv_last_error();
}

}  // namespace

// ------------------------------------------------------------ timeline
// Run by hand (--gtest_also_run_disabled_tests): per-CTA event times of the
// fast kernel (sm90_set_trace; events of the last tile unless "first"),
// warm L2, relative to the earliest entry: where a call's time goes.
template <bool kHave = kBuiltSm90>
void fast_trace(uint64_t* buf, int ctas) {
  if constexpr (kHave) m3qkv::sm90_set_trace(buf, ctas);
}

TEST(FastTiming, DISABLED_Timeline) {
  M3QKV_REQUIRE_SM90();
  constexpr int kCtas = 256;
  DeviceBuffer trace(size_t(kCtas) * m3qkv::kTraceEvents * sizeof(uint64_t));
  CUDA_OK(trace.error());
  for (int64_t m : {int64_t{64}, int64_t{4096}})
    for (int cluster : {1, 4}) {
      const Problem p = prepared_problem(fast_config(kTP4, m, 6144, 1));
      DeviceInputs in;
      CUDA_OK(in.upload(p));
      DeviceOutputs d;
      CUDA_OK(d.init(p, 0));
      m3qkv_fused_args a = p.args_with(in.mapper(), d.ptrs());
      m3qkv::DeviceInfo dev;
      M3QKV_OK(m3qkv::current_device_info(&dev));
      for (int i = 0; i < 3; ++i) M3QKV_OK(sm90_fast_call(a, dev, nullptr, nullptr, cluster));
      CUDA_OK(cudaMemset(trace.get(), 0, trace.size()));
      fast_trace(trace.as<uint64_t>(), kCtas);
      Event e0, e1;
      CUDA_OK(cudaEventRecord(e0.get(), nullptr));
      M3QKV_OK(sm90_fast_call(a, dev, nullptr, nullptr, cluster));
      CUDA_OK(cudaEventRecord(e1.get(), nullptr));
      fast_trace(nullptr, 0);
      CUDA_OK(cudaEventSynchronize(e1.get()));
      float ms = 0.f;
      CUDA_OK(cudaEventElapsedTime(&ms, e0.get(), e1.get()));
      std::vector<uint64_t> t;
      CUDA_OK(trace.download_as(&t));
      const int ev[] = {m3qkv::kTrEntry, m3qkv::kTrPdlWaitDone, m3qkv::kTrProducerStart, m3qkv::kTrConsFirstBf,
                        m3qkv::kTrConsMainDone, m3qkv::kTrConsEpiDone, m3qkv::kTrExit};
      const char* names[] = {"entry", "pdl_done", "producer", "first_stage", "last_main_done", "last_epi_done", "exit"};
      uint64_t t0 = ~0ull;
      int ctas = 0;
      for (int k = 0; k < kCtas; ++k)
        if (t[size_t(k) * m3qkv::kTraceEvents] != 0) t0 = std::min(t0, t[size_t(k) * m3qkv::kTraceEvents]), ++ctas;
      std::printf("[ trace ] fast TP4 M%lld cluster %d: call %.1f us (events), %d CTAs\n", (long long)m, cluster,
                  1e3 * double(ms), ctas);
      for (int e = 0; e < 7; ++e) {
        std::vector<double> v;
        for (int k = 0; k < kCtas; ++k) {
          const uint64_t x = t[size_t(k) * m3qkv::kTraceEvents + ev[e]];
          if (x != 0) v.push_back(1e-3 * double(x - t0));
        }
        std::sort(v.begin(), v.end());
        if (!v.empty())
          std::printf("[ trace ]   %-15s min %7.1f  median %7.1f  max %7.1f us\n", names[e], v.front(), v[v.size() / 2],
                      v.back());
      }
    }
}
