// bf16 activations (x_bf16, W8A16; issue 28 item 2) on the GPU against the
// golden model. Every test name contains "XBf16" (--gtest_filter='*XBf16*').
//
//  - GpuXBf16/<case>.PortableBitExact: exact bf16 data (8-bit significands,
//    problem.h kExactBf16Log2Bound: acc exact on any f32-accumulating
//    hardware), every KV format x every index format, TP1 / TP4 / TP8 / dense,
//    M from 1 to 300 (one and several 64-row tiles), the KV layouts of the
//    cache-format tests; the portable backend forced; every output byte and
//    the guard zones against the golden model with both poison salts,
//    error_flags, and the f32 tap equal to the golden accumulator bit for bit.
//  - GpuXBf16/<case>.Sm90ForcedBitExact: the same through the SM90 backend
//    forced (m3qkv_testing_fused_qkv); skips unless the device is CC 9.0 and
//    the library has the SM90 backend. Covers the SM90 x_bf16 path once it
//    lands (src/sm90).
//  - GpuXBf16Random.DequantizedXMatchesTheMxfp8PathBytewise: random MXFP8 data
//    and x_bf16 = its exact dequantized values: the portable backend writes the
//    same bytes (and tap bits) on both paths (it stages the same bf16 tile).
//  - GpuXBf16Random.Bf16ErrorFigureAndEpilogueBitExact: random unquantized
//    bf16 activations: tap within 1e-5 of the f64 reference (reported), the
//    epilogue bit-exact against the golden epilogue on the kernel's tap.
//  - GpuXBf16Launch.GridAndPdlGiveTheGoldenBytes: small persistent grids and
//    PDL on the bf16 path.
//  - GpuXBf16Gemm.*: m3qkv_mxfp8_gemm with x_bf16 (exact: bit-exact; random:
//    within one bf16 ulp of the f64 reference), poisoned guarded output.
//  - GpuXBf16Sm100.RefusedByName: where the SM100 kernel can be forced (CC
//    10.x, or the tcgen05-emulation build on CC 9.0): INVALID_ARGUMENT naming
//    x_bf16 and the sm100 backend, nothing written.
//  - GpuXBf16Public.AutoDispatchTp4K6144: the serving shape through
//    m3qkv_fused_qkv (automatic backend; refused where that is sm100).
//  - GpuXBf16Checked.TooSmallBf16ActivationsRejected (child, M3QKV_CHECKED=1):
//    an x_bf16 allocation 16 bytes short of M·K·2 is refused naming x_bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "api/internal.h"
#include "common/layouts.h"
#include "common/numerics.h"
#include "common/problem.h"
#include "common/test_util.h"
#include "golden/golden.h"
#include "gpu/gpu_util.h"
#include "gpu/backend_support.h"
#include "gpu/harness.h"

namespace {

using namespace m3qkv_gpu;
using m3qkv_test::make_problem;

struct XLayout {
  const char* name;
  bool head_major;
  int64_t row_pad;
  bool interleaved;
};
const XLayout kXLayouts[] = {
    {"TokMajorSep", false, 0, false},
    {"TokMajorInterleaved", false, 0, true},
    {"HeadMajorRowPad16", true, 16, false},
};

struct XCase {
  Heads heads;
  int kv, ix;
  int64_t m, k;
  int block_size;
  int layout;
  bool oor;
};
std::string xcase_name(const XCase& c) {
  std::string s = std::string(c.heads.name) + "_kv" + fmt_name(c.kv) + "_ix" + fmt_name(c.ix) + "_M" +
                  std::to_string(c.m) + "_K" + std::to_string(c.k) + "_B" + std::to_string(c.block_size);
  if (c.kv != 0) s += std::string("_") + kXLayouts[c.layout].name;
  if (c.oor) s += "_OutOfRange";
  return s;
}
void PrintTo(const XCase& c, std::ostream* os) { *os << xcase_name(c); }

ProblemConfig xconfig(const XCase& c, bool exact) {
  ProblemConfig cfg;
  cfg.m = c.m;
  cfg.k = c.k;
  cfg.nq = c.heads.nq;
  cfg.nkv = c.heads.nkv;
  cfg.niq = c.heads.niq;
  cfg.nik = c.heads.nik;
  cfg.block_size = c.block_size;
  cfg.exact_data = exact;
  cfg.x_bf16 = true;
  cfg.kv_dtype = c.kv;
  cfg.index_dtype = c.heads.nik ? c.ix : 0;
  cfg.k_scale = 7.0f;  // RN(1/7) inexact
  cfg.v_scale = 0.375f;
  const XLayout& l = kXLayouts[c.layout];
  cfg.kv_head_major = l.head_major;
  cfg.kv_row_pad = l.row_pad;
  cfg.kv_interleaved = l.interleaved;
  cfg.slot_skip_fraction = c.oor ? 0.25 : 0.125;
  cfg.out_of_range_slots = c.oor;
  cfg.out_of_range_positions = c.oor;
  return cfg;
}

std::vector<XCase> xcases() {
  std::vector<XCase> v;
  const Heads hs[] = {kTP4, kTP8, kTP1, kDense};
  const int64_t ms[] = {1, 7, 64, 129, 300};
  int i = 0;
  for (int kv : {0, 1, 2})
    for (int ix : {0, 1, 2})
      for (const Heads& h : hs) {
        if (h.nik == 0 && ix != 0) continue;  // dense: no index cache
        const int64_t m = h.nkv == 4 ? (i % 2 ? 7 : 37) : ms[i % 5];  // TP1 (77 heads): small M keeps the golden GEMM short
        const int64_t k = (m <= 7 && h.nkv == 1) ? 6144 : 256;       // the real hidden size where it is cheap
        v.push_back({h, kv, ix, m, k, (i % 2) ? 128 : 16, i % 3, i % 4 == 1});
        ++i;
      }
  return v;
}

void expect_flags(const Problem& p, bool oor, uint32_t flags) {
  if (oor) {
    EXPECT_NE(flags & M3QKV_FLAG_SLOT_OUT_OF_RANGE, 0u);
    EXPECT_NE(flags & M3QKV_FLAG_POSITION_OUT_OF_RANGE, 0u);
    if (p.nik) EXPECT_NE(flags & M3QKV_FLAG_INDEX_SLOT_OUT_OF_RANGE, 0u);
  } else {
    EXPECT_EQ(flags, 0u);
  }
}

void expect_tap_equal(const Problem& p, const std::vector<float>& tap, const std::vector<float>& acc) {
  ASSERT_EQ(tap.size(), acc.size());
  int64_t first = -1;
  const int64_t bad = count_f32_mismatch(tap.data(), acc.data(), acc.size(), &first);
  EXPECT_EQ(bad, 0) << "tap differs from the golden accumulator in " << bad << " entries; first [" << first / p.n()
                    << ", " << first % p.n() << "]: got " << (first >= 0 ? tap[size_t(first)] : 0.f) << ", expected "
                    << (first >= 0 ? acc[size_t(first)] : 0.f);
}

// Exact data, backend b forced: both salts (the tap on salt 0), outputs and
// tap against the golden model.
void check_exact(const Problem& p, const XCase& c, m3qkv_backend_kind b) {
  ASSERT_TRUE(p.xq.empty() && p.xsf.empty() && !p.x_bf16.empty());
  const std::vector<float> acc = m3qkv_test::problem_acc(p);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  for (int salt = 0; salt < 2; ++salt) {
    const std::string what = xcase_name(c) + " [x_bf16, " + backend_label(b) + "] salt " + std::to_string(salt);
    SCOPED_TRACE(what);
    FusedRun run;
    run.backend = b;
    run.tap = salt == 0;
    Fetched got;
    std::vector<float> tap;
    ASSERT_NO_FATAL_FAILURE(run_fused(p, in, run, salt, &got, &tap));
    HostOutputs want = poisoned_host_outputs(p, salt);
    golden_epilogue(p, acc.data(), &want);
    expect_same_outputs(p, want, got, what);
    expect_flags(p, c.oor, got.flags);
    if (run.tap) expect_tap_equal(p, tap, acc);
    if (::testing::Test::HasFailure()) return;
  }
}

class GpuXBf16 : public ::testing::TestWithParam<XCase> {};

TEST_P(GpuXBf16, PortableBitExact) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  const XCase& c = GetParam();
  const Problem p = make_problem(xconfig(c, /*exact=*/true));
  check_exact(p, c, M3QKV_BACKEND_PORTABLE);
}

TEST_P(GpuXBf16, Sm90ForcedBitExact) {
  M3QKV_REQUIRE_GPU();
  if (device_cc() != 90) GTEST_SKIP() << "the SM90 backend runs on CC 9.0 only (device: CC " << device_cc() << ")";
  if (!arch_list_has(900)) GTEST_SKIP() << "this build has no sm_90a target";
  print_seed_once();
  const XCase& c = GetParam();
  const Problem p = make_problem(xconfig(c, /*exact=*/true));
  check_exact(p, c, M3QKV_BACKEND_SM90);
}

INSTANTIATE_TEST_SUITE_P(Formats, GpuXBf16, ::testing::ValuesIn(xcases()),
                         [](const ::testing::TestParamInfo<XCase>& i) { return xcase_name(i.param); });

// ------------------------------------------------------------ random data
ProblemConfig random_config(const Heads& h, int64_t m, int64_t k, int kv, int ix) {
  XCase c{h, kv, ix, m, k, 16, 0, false};
  ProblemConfig cfg = xconfig(c, /*exact=*/false);
  cfg.x_bf16 = false;
  return cfg;
}

// x_bf16 = the dequantized MXFP8 activations: the portable kernel stages the
// same bf16 A tile on both paths, so every byte and every tap bit agree.
// From M = 2048 the SM90 backend runs bf16 activations on the prefill kernel
// (decode_plan.h kXbf16PrefillMinM: the caller's x is its x̂, only ŵ is
// converted): exact data, golden bytes and tap, a partial last row block
// (M = 2049), an odd head count (TP2: 39), out-of-range slots and positions.
TEST(GpuXBf16Prefill, LargeMRoutesToThePrefillKernelBitExact) {
  M3QKV_REQUIRE_GPU();
  if (device_cc() != 90) GTEST_SKIP() << "the SM90 backend runs on CC 9.0 only (device: CC " << device_cc() << ")";
  if (!arch_list_has(900)) GTEST_SKIP() << "this build has no sm_90a target";
  print_seed_once();
  const XCase cases[] = {{kTP8, 1, 1, 2048, 256, 128, 0, false}, {kTP2, 2, 1, 2049, 256, 16, 2, true},
                         {kTP4, 0, 0, 4096, 128, 128, 0, false}};
  for (const XCase& c : cases) {
    const Problem p = make_problem(xconfig(c, /*exact=*/true));
    ASSERT_NO_FATAL_FAILURE(check_exact(p, c, M3QKV_BACKEND_SM90));
  }
}

TEST(GpuXBf16Random, DequantizedXMatchesTheMxfp8PathBytewise) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  struct Shape {
    Heads h;
    int64_t m, k;
    int kv, ix;
  };
  const Shape shapes[] = {{kTP4, 7, 6144, 0, 0}, {kTP4, 129, 512, 1, 1}, {kTP8, 300, 256, 2, 0}, {kDense, 65, 384, 1, 0}};
  for (const Shape& s : shapes) {
    const Problem p = make_problem(random_config(s.h, s.m, s.k, s.kv, s.ix));
    const Problem q = m3qkv_test::with_dequantized_x_bf16(p);
    const std::string what = std::string(s.h.name) + " M" + std::to_string(s.m) + " K" + std::to_string(s.k) + " kv " +
                             fmt_name(s.kv) + " (random, x_bf16 = dequantized xq)";
    SCOPED_TRACE(what);
    DeviceInputs inp, inq;
    CUDA_OK(inp.upload(p));
    CUDA_OK(inq.upload(q));
    FusedRun run;
    run.backend = M3QKV_BACKEND_PORTABLE;
    run.tap = true;
    Fetched gp, gq;
    std::vector<float> tp, tq;
    ASSERT_NO_FATAL_FAILURE(run_fused(p, inp, run, 0, &gp, &tp));
    ASSERT_NO_FATAL_FAILURE(run_fused(q, inq, run, 0, &gq, &tq));
    expect_same_fetched(p, gp, gq, what);
    int64_t first = -1;
    EXPECT_EQ(count_f32_mismatch(tp.data(), tq.data(), tp.size(), &first), 0) << "first " << first;
    // And both are the golden epilogue on that accumulator (not vacuous: written).
    HostOutputs want = poisoned_host_outputs(q, 0);
    golden_epilogue(q, tq.data(), &want);
    expect_same_outputs(q, want, gq, what);
    if (HasFailure()) return;
  }
}

TEST(GpuXBf16Random, Bf16ErrorFigureAndEpilogueBitExact) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  for (int64_t m : {int64_t{5}, int64_t{200}}) {
    ProblemConfig cfg = random_config(kTP4, m, m < 64 ? 6144 : 512, 1, 2);
    cfg.x_bf16 = true;
    const Problem p = make_problem(cfg);
    SCOPED_TRACE(p.cfg.describe());
    const auto ref = m3qkv::golden::w8a16_acc_f64(p.x_bf16.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
    DeviceInputs in;
    CUDA_OK(in.upload(p));
    FusedRun run;
    run.backend = M3QKV_BACKEND_PORTABLE;
    run.tap = true;
    Fetched got;
    std::vector<float> tap;
    ASSERT_NO_FATAL_FAILURE(run_fused(p, in, run, 1, &got, &tap));
    const ErrorFigure e = relative_error(tap.data(), ref.data(), ref.size());
    std::printf("[ xbf16 ] portable M=%" PRId64 " K=%" PRId64 ": |tap-ref|/|ref| = %.3e, max|err|/max|ref| = %.3e\n",
                p.m, p.k, e.rel_fro, e.max_abs_over_max_ref);
    RecordProperty("xbf16_rel_error_M" + std::to_string(m), std::to_string(e.rel_fro));
    EXPECT_EQ(e.non_finite, 0);
    EXPECT_LE(e.rel_fro, 1e-5);
    EXPECT_LE(e.max_abs_over_max_ref, 1e-5);
    HostOutputs want = poisoned_host_outputs(p, 1);
    golden_epilogue(p, tap.data(), &want);
    expect_same_outputs(p, want, got, "random x_bf16, golden epilogue on the tap");
  }
}

// ------------------------------------------------------------ launch options
TEST(GpuXBf16Launch, GridAndPdlGiveTheGoldenBytes) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  const XCase c{kTP4, 1, 1, 300, 512, 16, 1, false};
  const Problem p = make_problem(xconfig(c, /*exact=*/true));
  const std::vector<float> acc = m3qkv_test::problem_acc(p);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  const int grids[] = {1, 3, 0, 7};
  for (int i = 0; i < 4; ++i) {
    FusedRun run;
    run.backend = M3QKV_BACKEND_PORTABLE;
    run.grid = grids[i];
    run.use_pdl = i % 2;
    const std::string what = "grid " + std::to_string(run.grid) + " use_pdl " + std::to_string(run.use_pdl);
    SCOPED_TRACE(what);
    Fetched got;
    ASSERT_NO_FATAL_FAILURE(run_fused(p, in, run, i % 2, &got));
    HostOutputs want = poisoned_host_outputs(p, i % 2);
    golden_epilogue(p, acc.data(), &want);
    expect_same_outputs(p, want, got, what);
  }
}

// ------------------------------------------------------------ mxfp8_gemm
void run_gemm_x_bf16(const Problem& p, const DeviceInputs& in, int salt, std::vector<uint16_t>* out) {
  GuardedBuffer o;
  CUDA_OK(o.init(size_t(p.m * p.n()) * 2, salt));
  const auto ins = p.inputs();
  m3qkv_gemm_args g{};
  g.struct_size = sizeof g;
  g.m = p.m;
  g.n = p.n();
  g.k = p.k;
  g.x_bf16 = in.get(ins.back());
  ASSERT_NE(g.x_bf16, nullptr);
  g.wq = in.get(ins[2]);
  g.wsf = in.get(ins[3]);
  g.out = o.payload();
  g.use_pdl = salt;
  M3QKV_OK(m3qkv_mxfp8_gemm(&g, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint8_t> bytes;
  bool guards_ok = false;
  int64_t bad = 0;
  CUDA_OK(o.fetch(&bytes, &guards_ok, &bad));
  EXPECT_TRUE(guards_ok) << "m3qkv_mxfp8_gemm (x_bf16) wrote outside out[M, N], first at " << bad;
  out->resize(bytes.size() / 2);
  std::memcpy(out->data(), bytes.data(), bytes.size());
}

TEST(GpuXBf16Gemm, ExactDataBitExact) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  for (int64_t m : {int64_t{1}, int64_t{70}, int64_t{257}}) {
    const XCase c{kTP4, 0, 0, m, 512, 16, 0, false};
    const Problem p = make_problem(xconfig(c, /*exact=*/true));
    std::vector<uint16_t> want(size_t(p.m * p.n()));
    m3qkv_gemm_args h{};
    h.struct_size = sizeof h;
    h.m = p.m;
    h.n = p.n();
    h.k = p.k;
    h.x_bf16 = p.x_bf16.data();
    h.wq = p.wq.data();
    h.wsf = p.wsf.data();
    h.out = want.data();
    m3qkv::golden::gemm_bf16(h);
    DeviceInputs in;
    CUDA_OK(in.upload(p));
    for (int salt = 0; salt < 2; ++salt) {
      std::vector<uint16_t> got;
      ASSERT_NO_FATAL_FAILURE(run_gemm_x_bf16(p, in, salt, &got));
      ASSERT_EQ(got.size(), want.size());
      int64_t bad = 0, first = -1;
      for (size_t i = 0; i < want.size(); ++i)
        if (got[i] != want[i] && bad++ == 0) first = int64_t(i);
      EXPECT_EQ(bad, 0) << "M " << m << " salt " << salt << ": " << bad << " outputs differ; first " << first;
    }
  }
}

TEST(GpuXBf16Gemm, RandomDataWithinOneBf16Ulp) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  ProblemConfig cfg = random_config(kTP8, 130, 768, 0, 0);
  cfg.x_bf16 = true;
  const Problem p = make_problem(cfg);
  const auto ref = m3qkv::golden::w8a16_acc_f64(p.x_bf16.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  std::vector<uint16_t> got;
  ASSERT_NO_FATAL_FAILURE(run_gemm_x_bf16(p, in, 0, &got));
  double max_ref = 0.0;
  for (double r : ref) max_ref = std::max(max_ref, std::fabs(r));
  int64_t far = 0, first = -1, exact = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (got[i] == m3qkv::f32_to_bf16_rn_soft(static_cast<float>(ref[i]))) {
      ++exact;
      continue;
    }
    int e = 0;
    std::frexp(ref[i] != 0.0 ? ref[i] : 1e-30, &e);
    if (std::fabs(double(m3qkv::bf16_to_f32(got[i])) - ref[i]) > std::ldexp(1.0, e - 8) + 1e-5 * max_ref && far++ == 0)
      first = int64_t(i);
  }
  std::printf("[ xbf16 ] m3qkv_mxfp8_gemm (x_bf16): equal to bf16_rn(f64 ref) %.4f%%\n",
              100.0 * double(exact) / double(ref.size()));
  EXPECT_EQ(far, 0) << "first " << first;
  EXPECT_GT(exact, int64_t(ref.size()) / 2);
}

// ------------------------------------------------------------ sm100, public
TEST(GpuXBf16Sm100, RefusedByName) {
  M3QKV_REQUIRE_GPU();
  const XCase c{kTP4, 0, 0, 7, 256, 16, 0, false};
  const Problem p = make_problem(xconfig(c, /*exact=*/true));
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  DeviceOutputs d;
  CUDA_OK(d.init(p, 0));
  CUDA_OK(cudaDeviceSynchronize());
  const m3qkv_fused_args a = p.args_with(in.mapper(), d.ptrs());
  Stream s;
  CUDA_OK(s.error());
  const m3qkv_status st = m3qkv_testing_fused_qkv(&a, nullptr, M3QKV_BACKEND_SM100, s.get());
  if (st == M3QKV_ERROR_UNSUPPORTED_DEVICE) GTEST_SKIP() << "the sm100 kernel cannot run here: " << m3qkv_last_error();
  EXPECT_EQ(st, M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(m3qkv_last_error(),
               "m3qkv_fused_qkv: x_bf16 (bf16 activations) is not supported by the sm100 backend; pass xq/xsf or use "
               "M3QKV_BACKEND=sm90/portable");
  CUDA_OK(cudaStreamSynchronize(s.get()));
  Fetched got;
  CUDA_OK(fetch_outputs(d, &got));
  const HostOutputs untouched = poisoned_host_outputs(p, 0);
  expect_same_outputs(p, untouched, got, "refused call wrote nothing");
}

TEST(GpuXBf16Public, AutoDispatchTp4K6144) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  int dev = 0;
  CUDA_OK(cudaGetDevice(&dev));
  m3qkv_backend_kind k = M3QKV_BACKEND_NONE;
  M3QKV_OK(m3qkv_backend(dev, &k));
  for (int fmt : {1, 0, 2}) {
    for (int64_t m : {int64_t{1}, int64_t{7}, int64_t{200}}) {
      const XCase c{kTP4, fmt, fmt, m, 6144, 128, fmt == 1 ? 0 : 1, false};
      const Problem p = make_problem(xconfig(c, /*exact=*/true));
      const std::string what = "m3qkv_fused_qkv (auto: " + backend_label(k) + ") " + xcase_name(c);
      SCOPED_TRACE(what);
      DeviceInputs in;
      CUDA_OK(in.upload(p));
      if (k == M3QKV_BACKEND_SM100) {
        DeviceOutputs d;
        CUDA_OK(d.init(p, 0));
        const m3qkv_fused_args a = p.args_with(in.mapper(), d.ptrs());
        EXPECT_EQ(m3qkv_fused_qkv(&a, nullptr), M3QKV_ERROR_INVALID_ARGUMENT);
        continue;
      }
      const std::vector<float> acc = m3qkv_test::problem_acc(p);
      FusedRun run;
      run.backend = M3QKV_BACKEND_NONE;  // the public entry point
      run.use_pdl = 1;
      Fetched got;
      ASSERT_NO_FATAL_FAILURE(run_fused(p, in, run, 1, &got));
      HostOutputs want = poisoned_host_outputs(p, 1);
      golden_epilogue(p, acc.data(), &want);
      expect_same_outputs(p, want, got, what);
      if (HasFailure()) return;
    }
  }
}

// ------------------------------------------------------------ checked mode
TEST(GpuXBf16Checked, TooSmallBf16ActivationsRejected) {
  M3QKV_REQUIRE_GPU();
  expect_child_passes("DISABLED_GpuXBf16Child.CheckedTooSmallBf16Activations", "M3QKV_CHECKED=1");
}

TEST(DISABLED_GpuXBf16Child, CheckedTooSmallBf16Activations) {
  CHILD_ONLY();
  ASSERT_TRUE(std::getenv("M3QKV_CHECKED") != nullptr);
  const XCase c{kTP4, 0, 0, 7, 512, 16, 0, false};
  const Problem p = make_problem(xconfig(c, /*exact=*/true));
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  DeviceOutputs d;
  CUDA_OK(d.init(p, 0));
  CUDA_OK(cudaDeviceSynchronize());
  m3qkv_fused_args a = p.args_with(in.mapper(), d.ptrs());
  const size_t need = p.x_bf16.size() * 2;  // M·K·2
  DeviceBuffer small(need - 16);
  CUDA_OK(small.error());
  a.x_bf16 = small.get();
  Stream s;
  CUDA_OK(s.error());
  EXPECT_EQ(m3qkv_fused_qkv(&a, s.get()), M3QKV_ERROR_INVALID_ARGUMENT);
  const std::string msg = m3qkv_last_error();
  EXPECT_NE(msg.find("x_bf16 = 0x"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ends 16 bytes earlier"), std::string::npos) << msg;
  // A host pointer is refused too; the right size passes and is exact.
  std::vector<uint16_t> host(p.x_bf16);
  a.x_bf16 = host.data();
  EXPECT_EQ(m3qkv_fused_qkv(&a, s.get()), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(m3qkv_last_error()).find("x_bf16 = 0x"), std::string::npos) << m3qkv_last_error();
  a = p.args_with(in.mapper(), d.ptrs());
  M3QKV_OK(m3qkv_testing_fused_qkv(&a, nullptr, M3QKV_BACKEND_PORTABLE, s.get()));
  CUDA_OK(cudaStreamSynchronize(s.get()));
  Fetched got;
  CUDA_OK(fetch_outputs(d, &got));
  HostOutputs want = poisoned_host_outputs(p, 0);
  const std::vector<float> acc = m3qkv_test::problem_acc(p);
  golden_epilogue(p, acc.data(), &want);
  expect_same_outputs(p, want, got, "checked mode, x_bf16");
}

}  // namespace
