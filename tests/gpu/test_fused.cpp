// m3qkv_fused_qkv on the GPU against the CPU golden model (docs/contract.md §3, §5.3, §3.8).
//
//  - GpuFusedExact: exact data (acc is exact on any hardware), every output
//    byte equal to the golden model, both poison salts, guard zones intact,
//    error_flags equal; and the tap accumulator equal to the golden one.
//  - GpuFusedRandom: random data; GEMM relative error of the tap vs the f64
//    reference (reported), epilogue bit-exact vs the golden epilogue run on
//    the kernel's own accumulator.
//  - GpuFusedLaunch: PDL / grid / cta_group give the same bytes; PDL chains
//    (quantize -> fused, fused -> fused) respect the data dependency.
//  - GpuFusedFlags: each error_flags bit alone, OR-ing into a preset value,
//    a null error_flags, M = 0.
// Every test runs for each backend of fused_backends() (portable, plus the
// automatically dispatched one when it differs).
#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdio>
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
#include "gpu/harness.h"

namespace {

using namespace m3qkv_gpu;
using m3qkv_test::make_problem;

// ---------------------------------------------------------------- configs
constexpr Heads kDenseMha{"DenseMha", 4, 4, 0, 0};  // nq == nkv

enum class QMode { Both, Bf16, Fp8 };
const char* qmode_name(QMode q) { return q == QMode::Both ? "qBoth" : (q == QMode::Bf16 ? "qBf16" : "qFp8"); }

struct ExactCase {
  Heads heads;
  int64_t m;
  int64_t k;
  int block_size;
  QMode q;
  bool unit_scales;        // k/v scales (1, 1), else (0.5, 2)
  int64_t stride_extra;    // bytes added to the packed page (multiple of 32)
  bool oor;                // out-of-range slots and positions
  double skip;             // fraction of slot_mapping entries < 0
};

std::string case_name(const ExactCase& c) {
  std::string s = std::string(c.heads.name) + "_M" + std::to_string(c.m) + "_K" + std::to_string(c.k) + "_B" +
                  std::to_string(c.block_size) + "_" + qmode_name(c.q) + (c.unit_scales ? "_kv1x1" : "_kv05x2") +
                  "_pad" + std::to_string(c.stride_extra);
  if (c.oor) s += "_OutOfRange";
  return s;
}

// Readable, deterministic parameter text in test listings (ctest names).
void PrintTo(const ExactCase& c, std::ostream* os) { *os << case_name(c); }

// K small enough that the f64 golden GEMM stays fast where M·N is large.
int64_t pick_k(const Heads& h, int64_t m) {
  const int64_t n = int64_t(h.nq + 2 * h.nkv + h.niq + h.nik) * 128;
  if (m * n >= (int64_t(1) << 22)) return 256;
  if (m <= 7 && n <= 2560) return 6144;  // the real hidden size where it is cheap
  return 512;
}

ProblemConfig to_config(const ExactCase& c, bool exact) {
  ProblemConfig cfg;
  cfg.m = c.m;
  cfg.k = c.k;
  cfg.nq = c.heads.nq;
  cfg.nkv = c.heads.nkv;
  cfg.niq = c.heads.niq;
  cfg.nik = c.heads.nik;
  cfg.block_size = c.block_size;
  cfg.kv_page_stride = m3qkv::kv_page_min_bytes(c.heads.nkv, c.block_size) + c.stride_extra;
  cfg.index_page_stride = m3qkv::nvfp4_slot_bytes(c.block_size) + c.stride_extra;
  cfg.q_bf16 = c.q != QMode::Fp8;
  cfg.q_fp8 = c.q != QMode::Bf16;
  if (c.unit_scales) {
    cfg.k_scale = 1.0f;
    cfg.v_scale = 1.0f;
  } else {
    cfg.k_scale = 0.5f;
    cfg.v_scale = 2.0f;
  }
  cfg.exact_data = exact;
  cfg.slot_skip_fraction = c.skip;
  cfg.out_of_range_slots = c.oor;
  cfg.out_of_range_positions = c.oor;
  return cfg;
}

std::vector<ExactCase> exact_cases() {
  std::vector<ExactCase> v;
  const Heads all[] = {kTP1, kTP2, kTP4, kTP8, kDense};
  const int64_t ms[] = {1, 7, 64, 127, 128, 129, 513, 2048};
  const int blocks[] = {16, 64, 128};
  const QMode qs[] = {QMode::Both, QMode::Bf16, QMode::Fp8};
  const int64_t pads[] = {64, 0, 4096 + 32};
  // Sweep 1: every head layout × every M; block size, q mode, scales and page
  // padding rotate so each value meets every layout.
  int i = 0;
  for (const Heads& h : all)
    for (int64_t m : ms) {
      v.push_back({h, m, pick_k(h, m), blocks[i % 3], qs[(i / 3) % 3], (i % 2) == 0, pads[(i / 2) % 3], false, 0.125});
      ++i;
    }
  // Sweep 2: block_size × q mode × scales on TP4, M = 129 (crosses a 128-row tile).
  for (int b : blocks)
    for (QMode q : qs)
      for (bool unit : {true, false}) v.push_back({kTP4, 129, 512, b, q, unit, 64, false, 0.125});
  // Sweep 3: out-of-range slots / positions (flags set, nothing written outside).
  v.push_back({kTP4, 129, 512, 16, QMode::Both, false, 64, true, 0.25});
  v.push_back({kTP8, 513, 512, 64, QMode::Fp8, true, 0, true, 0.25});
  v.push_back({kTP1, 64, 512, 128, QMode::Bf16, false, 4096 + 32, true, 0.25});
  v.push_back({kTP2, 7, 512, 16, QMode::Both, false, 64, true, 0.5});
  v.push_back({kDense, 127, 512, 64, QMode::Both, true, 64, true, 0.25});
  v.push_back({kDenseMha, 200, 512, 16, QMode::Both, false, 64, false, 0.125});
  return v;
}

// ------------------------------------------------------------ exact tests
class GpuFusedExact : public ::testing::TestWithParam<ExactCase> {};

TEST_P(GpuFusedExact, BitExactVsGolden) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  const ExactCase& c = GetParam();
  const Problem p = make_problem(to_config(c, /*exact=*/true));
  // Exact data: the golden f32 accumulator is THE accumulator on any hardware.
  const std::vector<float> acc = m3qkv::golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m,
                                                          p.n(), p.k);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  for (m3qkv_backend_kind b : fused_backends()) {
    for (int salt = 0; salt < 2; ++salt) {
      SCOPED_TRACE("backend " + backend_label(b) + ", poison salt " + std::to_string(salt));
      FusedRun run;
      run.backend = b;
      run.tap = salt == 0;  // the second run goes through the path without a tap
      Fetched got;
      std::vector<float> tap;
      ASSERT_NO_FATAL_FAILURE(run_fused(p, in, run, salt, &got, &tap));
      HostOutputs want = poisoned_host_outputs(p, salt);
      golden_epilogue(p, acc.data(), &want);
      expect_same_outputs(p, want, got, case_name(c) + " [" + backend_label(b) + "]");
      if (run.tap) {
        ASSERT_EQ(tap.size(), acc.size());
        int64_t first = -1;
        const int64_t bad = count_f32_mismatch(tap.data(), acc.data(), acc.size(), &first);
        EXPECT_EQ(bad, 0) << "tap accumulator differs from the exact golden accumulator in " << bad
                          << " entries; first [" << first / p.n() << ", " << first % p.n() << "]: got "
                          << (first >= 0 ? tap[size_t(first)] : 0.f) << ", expected "
                          << (first >= 0 ? acc[size_t(first)] : 0.f);
      }
      if (c.oor) {
        EXPECT_NE(got.flags & M3QKV_FLAG_SLOT_OUT_OF_RANGE, 0u);
        EXPECT_NE(got.flags & M3QKV_FLAG_POSITION_OUT_OF_RANGE, 0u);
        if (p.nik) EXPECT_NE(got.flags & M3QKV_FLAG_INDEX_SLOT_OUT_OF_RANGE, 0u);
      } else {
        EXPECT_EQ(got.flags, 0u);
      }
      if (HasFailure()) return;  // one backend/salt's report is enough
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, GpuFusedExact, ::testing::ValuesIn(exact_cases()),
                         [](const ::testing::TestParamInfo<ExactCase>& i) { return case_name(i.param); });

// The public entry point (automatic dispatch, no tap) on the M3 serving shape.
TEST(GpuFusedPublic, AutoDispatchTP4MatchesGolden) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  const ExactCase c{kTP4, 300, 6144, 128, QMode::Both, false, 64, false, 0.125};
  const Problem p = make_problem(to_config(c, true));
  const auto acc = m3qkv::golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  FusedRun run;
  run.backend = M3QKV_BACKEND_NONE;  // m3qkv_fused_qkv
  Fetched got;
  ASSERT_NO_FATAL_FAILURE(run_fused(p, in, run, 1, &got));
  HostOutputs want = poisoned_host_outputs(p, 1);
  golden_epilogue(p, acc.data(), &want);
  expect_same_outputs(p, want, got, "m3qkv_fused_qkv (auto) " + case_name(c));
}

// ----------------------------------------------------------- random tests
struct RandomCase {
  Heads heads;
  int64_t m, k;
  int block_size;
};
std::string random_name(const RandomCase& c) {
  return std::string(c.heads.name) + "_M" + std::to_string(c.m) + "_K" + std::to_string(c.k) + "_B" +
         std::to_string(c.block_size);
}

void PrintTo(const RandomCase& c, std::ostream* os) { *os << random_name(c); }

class GpuFusedRandom : public ::testing::TestWithParam<RandomCase> {};

// bf16-exact operands (e4m3·2^e) with f32 accumulation: the error is the f32
// summation error, ~1e-6 relative; 1e-5 would mean a lost scale or a
// truncated product.
constexpr double kMaxGemmRelError = 1e-5;

TEST_P(GpuFusedRandom, GemmErrorAndEpilogueOnTap) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  const RandomCase& c = GetParam();
  ExactCase ec{c.heads, c.m, c.k, c.block_size, QMode::Both, false, 64, false, 0.125};
  const Problem p = make_problem(to_config(ec, /*exact=*/false));
  const std::vector<double> ref =
      m3qkv::golden::mxfp8_acc_f64(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  for (m3qkv_backend_kind b : fused_backends()) {
    SCOPED_TRACE("backend " + backend_label(b));
    FusedRun run;
    run.backend = b;
    run.tap = true;
    Fetched got;
    std::vector<float> tap;
    ASSERT_NO_FATAL_FAILURE(run_fused(p, in, run, 0, &got, &tap));
    ASSERT_EQ(tap.size(), ref.size());
    const ErrorFigure e = relative_error(tap.data(), ref.data(), ref.size());
    const std::string key = "gemm_rel_error_" + backend_label(b);
    RecordProperty(key, std::to_string(e.rel_fro));
    std::printf("[ gemm ] %s %s: |acc-ref|/|ref| = %.3e, max|err|/max|ref| = %.3e, non-finite %" PRId64 "\n",
                backend_label(b).c_str(), random_name(c).c_str(), e.rel_fro, e.max_abs_over_max_ref, e.non_finite);
    EXPECT_EQ(e.non_finite, 0) << "the tap holds non-finite entries (unwritten?)";
    EXPECT_LE(e.rel_fro, kMaxGemmRelError);
    // The epilogue on the kernel's own accumulator is bit-exact.
    HostOutputs want = poisoned_host_outputs(p, 0);
    golden_epilogue(p, tap.data(), &want);
    expect_same_outputs(p, want, got, "random " + random_name(c) + " [" + backend_label(b) + "] epilogue on tap");
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuFusedRandom,
                         ::testing::Values(RandomCase{kTP4, 129, 6144, 128}, RandomCase{kTP4, 1, 6144, 128},
                                           RandomCase{kTP1, 64, 6144, 16}, RandomCase{kTP2, 513, 2048, 64},
                                           RandomCase{kTP8, 2048, 1024, 128}, RandomCase{kDense, 7, 6144, 64}),
                         [](const ::testing::TestParamInfo<RandomCase>& i) { return random_name(i.param); });

// ------------------------------------------------------- launch options
// use_pdl, grid and cta_group change how the work is launched, never a byte.
TEST(GpuFusedLaunch, PdlGridCtaGroupGiveSameBytes) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  const ExactCase c{kTP4, 513, 512, 64, QMode::Both, false, 64, true, 0.25};
  const Problem p = make_problem(to_config(c, true));
  const auto acc = m3qkv::golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
  HostOutputs want = poisoned_host_outputs(p, 0);
  golden_epilogue(p, acc.data(), &want);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  struct Opt {
    int pdl, grid, cta;
  };
  const Opt opts[] = {{0, 0, 0}, {1, 0, 0}, {1, 1, 0}, {0, 3, 1}, {1, 7, 2}, {0, 1000, 0}, {1, 0, 2}};
  for (m3qkv_backend_kind b : fused_backends()) {
    Fetched first;
    for (const Opt& o : opts) {
      const std::string what = backend_label(b) + " use_pdl=" + std::to_string(o.pdl) + " grid=" +
                               std::to_string(o.grid) + " cta_group=" + std::to_string(o.cta);
      SCOPED_TRACE(what);
      FusedRun run;
      run.backend = b;
      run.use_pdl = o.pdl;
      run.grid = o.grid;
      run.cta_group = o.cta;
      Fetched got;
      ASSERT_NO_FATAL_FAILURE(run_fused(p, in, run, 0, &got));
      expect_same_outputs(p, want, got, what);
      if (&o == &opts[0]) first = got;
      else expect_same_fetched(p, first, got, what + " vs use_pdl=0 grid=0");
    }
  }
}

// A PDL launch must still see its producer's writes: quantize (PDL) writes
// xq/xsf over a NaN poison, the fused op (PDL) reads them right after.
TEST(GpuFusedLaunch, PdlAfterQuantizeSeesItsOutput) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  const RandomCase rc{kTP4, 200, 2048, 64};
  ExactCase ec{rc.heads, rc.m, rc.k, rc.block_size, QMode::Both, false, 64, false, 0.125};
  Problem p = make_problem(to_config(ec, false));
  // bf16 activations, quantized by the golden model for the host side.
  std::mt19937_64 rng(p.cfg.seed ^ 0x51ULL);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> xf(size_t(p.m * p.k));
  for (auto& v : xf) v = nd(rng);
  const std::vector<uint16_t> x = m3qkv_test::to_bf16(xf);
  m3qkv::golden::mxfp8_quantize(x.data(), p.m, p.k, p.xq.data(), p.xsf.data());
  const auto ref = m3qkv::golden::mxfp8_acc_f64(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);

  DeviceInputs in;
  CUDA_OK(in.upload(p));
  M3QKV_ALLOC(dx, x.size() * 2);
  CUDA_OK(dx.upload(x));
  const auto ins = p.inputs();
  void* dxq = const_cast<void*>(in.get(ins[0]));
  void* dxsf = const_cast<void*>(in.get(ins[1]));
  for (m3qkv_backend_kind b : fused_backends()) {
    SCOPED_TRACE("backend " + backend_label(b));
    DeviceOutputs d;
    CUDA_OK(d.init(p, 0));
    m3qkv_fused_args a = p.args_with(in.mapper(), d.ptrs());
    a.use_pdl = 1;
    M3QKV_ALLOC(tap, size_t(p.acc_elems()) * 4);
    Stream s;
    CUDA_OK(s.error());
    for (int rep = 0; rep < 3; ++rep) {
      CUDA_OK(cudaMemsetAsync(dxq, 0x7F, p.xq.size(), s.get()));   // e4m3 NaN
      CUDA_OK(cudaMemsetAsync(dxsf, 0xFF, p.xsf.size(), s.get()));  // e8m0 NaN
      m3qkv_quantize_args qa{};
      qa.struct_size = sizeof qa;
      qa.m = p.m;
      qa.k = p.k;
      qa.x = dx.get();
      qa.xq = dxq;
      qa.xsf = dxsf;
      qa.use_pdl = 1;
      M3QKV_OK(m3qkv_mxfp8_quantize(&qa, s.get()));
      M3QKV_OK(m3qkv_testing_fused_qkv(&a, tap.as<float>(), b, s.get()));
    }
    CUDA_OK(cudaStreamSynchronize(s.get()));
    Fetched got;
    CUDA_OK(fetch_outputs(d, &got));
    std::vector<float> acc;
    CUDA_OK(tap.download_as(&acc));
    const ErrorFigure e = relative_error(acc.data(), ref.data(), ref.size());
    EXPECT_EQ(e.non_finite, 0) << "the fused kernel read the poisoned activations (PDL wait missing?)";
    EXPECT_LE(e.rel_fro, kMaxGemmRelError);
    HostOutputs want = poisoned_host_outputs(p, 0);
    golden_epilogue(p, acc.data(), &want);
    expect_same_outputs(p, want, got, "quantize -> fused with PDL [" + backend_label(b) + "]");
  }
}

// Two PDL launches writing the same caches: the later one's bytes win.
TEST(GpuFusedLaunch, PdlBackToBackWritesInOrder) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  ExactCase ec{kTP8, 257, 512, 16, QMode::Both, false, 64, false, 0.125};
  ProblemConfig ca = to_config(ec, true), cb = ca;
  ca.seed = m3qkv_test::test_seed() ^ 0xAAAA;
  cb.seed = m3qkv_test::test_seed() ^ 0xBBBB;
  const Problem pa = make_problem(ca), pb = make_problem(cb);
  const auto acc_a = m3qkv::golden::mxfp8_acc(pa.xq.data(), pa.xsf.data(), pa.wq.data(), pa.wsf.data(), pa.m, pa.n(), pa.k);
  const auto acc_b = m3qkv::golden::mxfp8_acc(pb.xq.data(), pb.xsf.data(), pb.wq.data(), pb.wsf.data(), pb.m, pb.n(), pb.k);
  // Golden: A then B on the same buffers (slots overlap partly: B wins there).
  HostOutputs want = poisoned_host_outputs(pa, 0);
  golden_epilogue(pa, acc_a.data(), &want);
  golden_epilogue(pb, acc_b.data(), &want);
  DeviceInputs ina, inb;
  CUDA_OK(ina.upload(pa));
  CUDA_OK(inb.upload(pb));
  for (m3qkv_backend_kind b : fused_backends()) {
    SCOPED_TRACE("backend " + backend_label(b));
    DeviceOutputs d;
    CUDA_OK(d.init(pa, 0));
    m3qkv_fused_args a = pa.args_with(ina.mapper(), d.ptrs());
    m3qkv_fused_args bb = pb.args_with(inb.mapper(), d.ptrs());
    a.use_pdl = bb.use_pdl = 1;
    Stream s;
    CUDA_OK(s.error());
    M3QKV_OK(m3qkv_testing_fused_qkv(&a, nullptr, b, s.get()));
    M3QKV_OK(m3qkv_testing_fused_qkv(&bb, nullptr, b, s.get()));
    CUDA_OK(cudaStreamSynchronize(s.get()));
    Fetched got;
    CUDA_OK(fetch_outputs(d, &got));
    expect_same_outputs(pb, want, got, "A then B with PDL [" + backend_label(b) + "]");
  }
}

// ------------------------------------------------------------ error flags
// Each guard sets its own bit and only it; flags are OR-ed into the preset
// value; a null error_flags changes nothing else.
TEST(GpuFusedFlags, EachBitAloneAndOrIntoPreset) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  ExactCase ec{kTP4, 64, 512, 16, QMode::Both, false, 64, false, 0.0};
  const Problem base = make_problem(to_config(ec, true));
  const auto acc = m3qkv::golden::mxfp8_acc(base.xq.data(), base.xsf.data(), base.wq.data(), base.wsf.data(), base.m,
                                            base.n(), base.k);
  struct Variant {
    const char* name;
    uint32_t expected;
  };
  const Variant variants[] = {{"none", 0u},
                              {"position_high", M3QKV_FLAG_POSITION_OUT_OF_RANGE},
                              {"position_negative", M3QKV_FLAG_POSITION_OUT_OF_RANGE},
                              {"slot", M3QKV_FLAG_SLOT_OUT_OF_RANGE},
                              {"index_slot", M3QKV_FLAG_INDEX_SLOT_OUT_OF_RANGE},
                              {"negative_slots_only", 0u}};
  for (const Variant& v : variants) {
    Problem p = base;
    const std::string n = v.name;
    if (n == "position_high") p.positions[5] = p.max_position;
    if (n == "position_negative") p.positions[63] = INT64_MIN;
    if (n == "slot") p.slot_mapping[10] = p.kv_capacity() + 3;
    if (n == "index_slot") p.index_slot_mapping[0] = INT64_MAX;
    if (n == "negative_slots_only") {
      p.slot_mapping[1] = -1;
      p.slot_mapping[2] = INT64_MIN;
      p.index_slot_mapping[3] = -5;
    }
    DeviceInputs in;
    CUDA_OK(in.upload(p));
    for (m3qkv_backend_kind b : fused_backends()) {
      const std::string what = std::string(v.name) + " [" + backend_label(b) + "]";
      SCOPED_TRACE(what);
      HostOutputs want = poisoned_host_outputs(p, 1, 0x100u);
      golden_epilogue(p, acc.data(), &want);
      ASSERT_EQ(want.flags, 0x100u | v.expected) << "golden model disagrees with the test's expectation";
      FusedRun run;
      run.backend = b;
      Fetched got;
      ASSERT_NO_FATAL_FAILURE(run_fused(p, in, run, 1, &got, nullptr, 0x100u));
      expect_same_outputs(p, want, got, what);
      // Without error_flags: same bytes (flags untouched, not compared).
      run.with_flags = false;
      Fetched got2;
      ASSERT_NO_FATAL_FAILURE(run_fused(p, in, run, 1, &got2, nullptr, 0x100u));
      EXPECT_EQ(got2.flags, 0x100u) << "error_flags = NULL, yet the flags buffer changed";
      expect_same_outputs(p, want, got2, what + " error_flags=NULL", /*compare_flags=*/false);
    }
  }
}

TEST(GpuFusedFlags, MZeroIsANoOp) {
  M3QKV_REQUIRE_GPU();
  ExactCase ec{kTP4, 5, 512, 16, QMode::Both, false, 64, false, 0.0};
  Problem p = make_problem(to_config(ec, true));
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  DeviceOutputs d;
  CUDA_OK(d.init(p, 0));
  m3qkv_fused_args a = p.args_with(in.mapper(), d.ptrs());
  a.m = 0;
  M3QKV_OK(m3qkv_fused_qkv(&a, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  Fetched got;
  CUDA_OK(fetch_outputs(d, &got));
  const HostOutputs want = poisoned_host_outputs(p, 0);
  expect_same_outputs(p, want, got, "m = 0");
}

}  // namespace
