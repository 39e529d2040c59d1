// The SM100 decode variant (src/sm100/decode_sm100.cu, M <= 128) run on an
// H100/H200 through the tcgen05 emulation (docs/emulation.md), called through
// m3qkv::sm100_fused_decode (forced split sizes, grid caps, the test-only skip
// hook) and through the API (automatic routing). Skipped unless the library
// was built with -DM3QKV_TCGEN05_EMULATION=ON and the device is CC 9.0.
//
//  - Sm100EmuDecodeSplits / Sm100EmuDecodeExact: exact data (acc exact on
//    any hardware, whatever the split): TP1 / TP2 / TP4 / TP8 × M ∈ {1, 7, 64,
//    128} (token blocks 32, 32, 64, 128) × splits {the plan's, 1, 3 (uneven K
//    ranges), K / 128}, every output byte and the tap equal to the golden
//    model, both poison salts, the workspace's partial slots poisoned with NaN
//    before every run (a slot read before it is written cannot pass); dense
//    heads, grid caps (one CTA walking every unit: both accumulators, the
//    stage and SF-slot rings wrap across units), PDL on / off, block sizes
//    16 / 128, FP8 / BF16 caches, out-of-range slots; no emulated TMEM column
//    left allocated after any run.
//  - Sm100EmuDecodeLaunch: the API routes M <= 128 here (cta_group 0 / 1) and
//    cta_group 2 to the tile kernel, both exact; back-to-back PDL launches
//    decode -> tile -> decode on one stream.
//  - Sm100EmuDecodeNegative: leaving one split's partial out of the sum
//    (skip hook) changes the accumulator; descriptor faults injected into the
//    emulated instructions of this kernel's translation unit change it too
//    (the model's hooks reach both SM100 TUs).
//  - Sm100EmuDecodeRandom: random data: GEMM error of the tap vs the f64
//    reference (reported, <= 1e-5), epilogue bit-exact on the tap, the same
//    bytes on a second run, and the entries that change with the split (reported).
#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdio>
#include <string>
#include <vector>

#include "api/internal.h"
#include "common/problem.h"
#include "common/test_util.h"
#include "golden/golden.h"
#include "gpu/gpu_util.h"
#include "gpu/harness.h"
#include "host/device.h"
#include "api/validate.h"
#include "host/workspace.h"
#include "sm100/plan.h"
#if M3QKV_WITH_SM100
#include "sm100/sm100.h"
#endif

// Test hooks of the emulation build (src/sm100/emu/tcgen05_emu.cuh); weak, so this
// file links against a normal build too (they are then null and the tests skip).
extern "C" {
__attribute__((weak)) int m3qkv_emu_present(void);
__attribute__((weak)) int m3qkv_emu_set_fault(unsigned long long a_desc_xor, unsigned long long b_desc_xor,
                                              unsigned long long sf_desc_xor, unsigned int idesc_xor);
__attribute__((weak)) int m3qkv_emu_tmem_leaks(void);
__attribute__((weak)) int m3qkv_emu_units(void);
}

namespace {

using namespace m3qkv_gpu;
using m3qkv_test::make_problem;

bool emulation_build() { return m3qkv_emu_present != nullptr && m3qkv_emu_present() == 1; }

#define M3QKV_REQUIRE_DECODE_EMULATION()                                                                        \
  do {                                                                                                          \
    M3QKV_REQUIRE_GPU();                                                                                        \
    if (!emulation_build()) GTEST_SKIP() << "library built without M3QKV_TCGEN05_EMULATION: emulation skipped"; \
    if (::m3qkv_gpu::device_cc() != 90)                                                                         \
      GTEST_SKIP() << "tcgen05 emulation runs on CC 9.0 only (device CC " << ::m3qkv_gpu::device_cc() << ")";  \
  } while (0)

struct DecodeOpts {
  int split = 0;  // 0 = the plan's
  int skip_split = -1;
};

m3qkv_status decode_call(const m3qkv_fused_args& a, const m3qkv::DeviceInfo& dev, float* tap, cudaStream_t s,
                         const DecodeOpts& o) {
#if M3QKV_WITH_SM100
  m3qkv::Sm100DecodeOptions opt;
  opt.split = o.split;
  opt.skip_split = o.skip_split;
  return m3qkv::sm100_fused_decode(a, dev, tap, s, opt);
#else
  (void)a, (void)dev, (void)tap, (void)s, (void)o;
  return M3QKV_ERROR_UNSUPPORTED_DEVICE;
#endif
}

int total_heads(const Heads& h) { return h.nq + 2 * h.nkv + h.niq + h.nik; }

struct Case {
  Heads heads;
  int64_t m, k;
  int split;  // 0 = the plan's
  int grid;   // 0 = the plan's (a cap otherwise)
  int pdl;
  int block_size;
  int kv_dtype = 0, ix_dtype = 0;
  bool kv_interleaved = false;
  bool oor = false;  // out-of-range slots / positions
};

std::string fmt_name(int d) { return d == 0 ? "nvfp4" : (d == 1 ? "fp8" : "bf16"); }
std::string case_name(const Case& c) {
  std::string s = std::string(c.heads.name) + "_M" + std::to_string(c.m) + "_K" + std::to_string(c.k) + "_split" +
                  (c.split ? std::to_string(c.split) : std::string("Plan")) + "_B" + std::to_string(c.block_size) +
                  "_pdl" + std::to_string(c.pdl);
  if (c.grid) s += "_grid" + std::to_string(c.grid);
  if (c.kv_dtype || c.ix_dtype) s += "_kv" + fmt_name(c.kv_dtype) + "_ix" + fmt_name(c.ix_dtype);
  if (c.kv_interleaved) s += "_Interleaved";
  if (c.oor) s += "_OutOfRange";
  return s;
}
void PrintTo(const Case& c, std::ostream* os) { *os << case_name(c); }

m3qkv_test::ProblemConfig to_config(const Case& c, bool exact) {
  m3qkv_test::ProblemConfig cfg;
  cfg.m = c.m;
  cfg.k = c.k;
  cfg.nq = c.heads.nq;
  cfg.nkv = c.heads.nkv;
  cfg.niq = c.heads.niq;
  cfg.nik = c.heads.nik;
  cfg.block_size = c.block_size;
  cfg.exact_data = exact;
  cfg.slot_skip_fraction = c.oor ? 0.25 : 0.125;  // slot -1 entries in every case
  cfg.out_of_range_slots = c.oor;
  cfg.out_of_range_positions = c.oor;
  cfg.kv_dtype = c.kv_dtype;
  cfg.index_dtype = c.ix_dtype;
  cfg.kv_interleaved = c.kv_interleaved;
  if (c.kv_dtype || c.ix_dtype) {
    cfg.k_scale = 7.0f;
    cfg.v_scale = 0.375f;
  }
  return cfg;
}

void expect_no_tmem_leak(const std::string& what) {
  const int leaks = m3qkv_emu_tmem_leaks();
  EXPECT_EQ(leaks, 0) << what << ": emulated Tensor Memory still allocated on " << leaks
                      << " SM(s) after the kernel completed (negative: CUDA error)";
}

// One decode run on fresh poisoned outputs (salt) on a fresh stream, whose
// workspace partial slots are filled with NaN first: every slot the last
// arriver reads must have been written by this launch. The plan is the one
// the launcher computes (same inputs).
void run_decode(const m3qkv_test::Problem& p, const DeviceInputs& in, const Case& c, const DecodeOpts& o, int salt,
                bool with_tap, Fetched* out, std::vector<float>* tap_out) {
  DeviceOutputs d;
  CUDA_OK(d.init(p, salt));
  m3qkv_fused_args a = p.args_with(in.mapper(), d.ptrs());
  a.use_pdl = c.pdl;
  a.grid = c.grid;
  bool noop = true;
  m3qkv_fused_args checked;
  M3QKV_OK(m3qkv::validate_fused(&a, &checked, &noop));
  ASSERT_FALSE(noop);
  m3qkv::DeviceInfo dev;
  M3QKV_OK(m3qkv::current_device_info(&dev));
  Stream s;
  CUDA_OK(s.error());
  const m3qkv::splitk::Plan plan =
      m3qkv::sm100::plan_decode(p.m, int(p.n() / 128), int(p.k / 128), dev.num_sms, o.split, c.grid);
  ASSERT_GT(plan.nt, 0);
  if (plan.split > 1) {
    void* ws = nullptr;
    m3qkv::host::WorkspaceLease lease;
    M3QKV_OK(m3qkv::host::stream_workspace(dev, s.get(), m3qkv::host::splitk_workspace_bytes(plan), &ws, &lease));
    CUDA_OK(cudaMemsetAsync(static_cast<uint8_t*>(ws) + m3qkv::host::kSplitkPartialsOffset, 0xFF,
                            size_t(plan.partial_bytes), s.get()));
  }
  DeviceBuffer tap;
  const size_t tap_bytes = static_cast<size_t>(p.acc_elems()) * sizeof(float);
  if (with_tap) {
    CUDA_OK(tap.alloc(tap_bytes));
    CUDA_OK(cudaMemset(tap.get(), 0xFF, tap_bytes));  // NaN: an unwritten entry cannot pass
  }
  M3QKV_OK(decode_call(a, dev, with_tap ? tap.as<float>() : nullptr, s.get(), o));
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaStreamSynchronize(s.get()));
  CUDA_OK(fetch_outputs(d, out));
  if (with_tap && tap_out) CUDA_OK(tap.download_as(tap_out));
}

// Exact data: outputs vs the golden model on both salts, the tap on salt 0.
void check_exact(const m3qkv_test::Problem& p, const DeviceInputs& in, const Case& c, const std::vector<float>& acc,
                 const DecodeOpts& o, const std::string& what) {
  for (int salt = 0; salt < 2; ++salt) {
    SCOPED_TRACE(what + ", poison salt " + std::to_string(salt));
    Fetched got;
    std::vector<float> tap;
    ASSERT_NO_FATAL_FAILURE(run_decode(p, in, c, o, salt, salt == 0, &got, &tap));
    HostOutputs want = poisoned_host_outputs(p, salt);
    golden_epilogue(p, acc.data(), &want);
    expect_same_outputs(p, want, got, what + " [sm100 decode emulated]");
    if (salt == 0) {
      ASSERT_EQ(tap.size(), acc.size());
      int64_t first = -1;
      const int64_t bad = count_f32_mismatch(tap.data(), acc.data(), acc.size(), &first);
      EXPECT_EQ(bad, 0) << "tap differs from the exact golden accumulator in " << bad << " entries; first ["
                        << first / p.n() << ", " << first % p.n() << "]: got "
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
    expect_no_tmem_leak(what);
    if (::testing::Test::HasFailure()) return;
  }
}

std::vector<float> golden_acc(const m3qkv_test::Problem& p) {
  return m3qkv::golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
}

// ------------------------------------------------------------ exact sweep
// Every TP × M ∈ {1, 7, 64, 128} in one process each, running the plan's
// split and the forced splits 1 (no workspace), 3 (uneven K ranges: 1, 1, 2
// stages) and K / 128 (one stage per unit), PDL alternating, block size
// alternating by case. K = 512, 256 where M·N is large (CPU golden time).
struct SweepCase {
  Heads heads;
  int64_t m;
  int block_size;
};
std::string sweep_name(const SweepCase& c) {
  return std::string(c.heads.name) + "_M" + std::to_string(c.m) + "_B" + std::to_string(c.block_size);
}
void PrintTo(const SweepCase& c, std::ostream* os) { *os << sweep_name(c); }

std::vector<SweepCase> sweep_cases() {
  std::vector<SweepCase> v;
  int i = 0;
  for (const Heads& h : {kTP1, kTP2, kTP4, kTP8})
    for (int64_t m : {1, 7, 64, 128}) v.push_back({h, m, (i++ % 2) ? 128 : 16});
  return v;
}

class Sm100EmuDecodeSplits : public ::testing::TestWithParam<SweepCase> {};

TEST_P(Sm100EmuDecodeSplits, BitExactVsGoldenForEverySplit) {
  M3QKV_REQUIRE_DECODE_EMULATION();
  print_seed_once();
  const SweepCase& sc = GetParam();
  const int64_t k = sc.m * total_heads(sc.heads) >= 128 * 39 ? 256 : 512;
  const int ks = int(k / 128);
  const Case base{sc.heads, sc.m, k, 0, 0, 0, sc.block_size};
  const m3qkv_test::Problem p = make_problem(to_config(base, /*exact=*/true));
  const std::vector<float> acc = golden_acc(p);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  CUDA_OK(cudaError_t(m3qkv_emu_set_fault(0, 0, 0, 0)));
  int i = 0;
  for (int split : {0, 1, 3, ks}) {
    if (split > ks) continue;
    Case c = base;
    c.split = split;
    c.pdl = i++ % 2;
    DecodeOpts o;
    o.split = split;
    ASSERT_NO_FATAL_FAILURE(check_exact(p, in, c, acc, o, case_name(c)));
  }
}

INSTANTIATE_TEST_SUITE_P(TpByM, Sm100EmuDecodeSplits, ::testing::ValuesIn(sweep_cases()),
                         [](const ::testing::TestParamInfo<SweepCase>& i) { return sweep_name(i.param); });

// Shapes beyond the sweep: dense heads, grid caps, cache formats, out-of-range slots.
std::vector<Case> exact_cases() {
  std::vector<Case> v;
  v.push_back({kDense, 7, 512, 0, 0, 1, 16});
  // Grid caps: one CTA walks all 80 units (TP4 × 4 splits), 5 CTAs walk 36.
  v.push_back({kTP4, 64, 512, 4, 1, 0, 16});
  v.push_back({kTP8, 7, 512, 3, 5, 1, 128});
  v.push_back({kTP2, 128, 256, 2, 7, 0, 16});  // NT = 128: the 4-stage ring wraps across units
  // Cache formats other than NVFP4 (docs/contract.md §4.3) through the same epilogue.
  {
    Case c{kTP4, 64, 512, 0, 0, 1, 16};
    c.kv_dtype = 1;
    c.ix_dtype = 2;
    v.push_back(c);
    Case d{kTP8, 7, 256, 2, 0, 0, 128};
    d.kv_dtype = 2;
    d.ix_dtype = 1;
    d.kv_interleaved = true;
    v.push_back(d);
  }
  // Out-of-range slots / positions: flagged, nothing written outside.
  {
    Case c{kTP4, 64, 256, 2, 0, 0, 16};
    c.oor = true;
    v.push_back(c);
  }
  return v;
}

class Sm100EmuDecodeExact : public ::testing::TestWithParam<Case> {};

TEST_P(Sm100EmuDecodeExact, BitExactVsGolden) {
  M3QKV_REQUIRE_DECODE_EMULATION();
  print_seed_once();
  const Case& c = GetParam();
  const m3qkv_test::Problem p = make_problem(to_config(c, /*exact=*/true));
  const std::vector<float> acc = golden_acc(p);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  CUDA_OK(cudaError_t(m3qkv_emu_set_fault(0, 0, 0, 0)));
  DecodeOpts o;
  o.split = c.split;
  ASSERT_NO_FATAL_FAILURE(check_exact(p, in, c, acc, o, case_name(c)));
}

INSTANTIATE_TEST_SUITE_P(Shapes, Sm100EmuDecodeExact, ::testing::ValuesIn(exact_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return case_name(i.param); });

// ------------------------------------------------------------ launches
// Through the API: cta_group 0 / 1 route M <= 128 to the decode variant,
// cta_group 2 to the tile kernel (pairs); all exact.
TEST(Sm100EmuDecodeLaunch, ApiRoutesSmallMByCtaGroup_TP4_M7) {
  M3QKV_REQUIRE_DECODE_EMULATION();
  print_seed_once();
  ASSERT_TRUE(m3qkv::sm100::uses_decode(7, 0) && m3qkv::sm100::uses_decode(7, 1));
  ASSERT_FALSE(m3qkv::sm100::uses_decode(7, 2));
  const Case c{kTP4, 7, 512, 0, 0, 1, 16};
  const m3qkv_test::Problem p = make_problem(to_config(c, /*exact=*/true));
  const std::vector<float> acc = golden_acc(p);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  CUDA_OK(cudaError_t(m3qkv_emu_set_fault(0, 0, 0, 0)));
  for (int cg : {0, 1, 2}) {
    SCOPED_TRACE("cta_group " + std::to_string(cg));
    FusedRun run;
    run.backend = M3QKV_BACKEND_SM100;
    run.tap = true;
    run.cta_group = cg;
    run.use_pdl = 1;
    Fetched got;
    std::vector<float> tap;
    ASSERT_NO_FATAL_FAILURE(run_fused(p, in, run, cg % 2, &got, &tap));
    HostOutputs want = poisoned_host_outputs(p, cg % 2);
    golden_epilogue(p, acc.data(), &want);
    expect_same_outputs(p, want, got, "API M 7 cta_group " + std::to_string(cg));
    int64_t first = -1;
    EXPECT_EQ(count_f32_mismatch(tap.data(), acc.data(), acc.size(), &first), 0) << "first at " << first;
    expect_no_tmem_leak("API cta_group " + std::to_string(cg));
  }
}

// PDL chain on one stream: decode (TP4, M 64) -> tile kernel (M 256, whose
// prologue allocates TMEM before its griddepcontrol.wait) -> decode (TP8,
// M 7). Each successor's prologue may start while its predecessor runs;
// every result must be exact and no TMEM may stay allocated.
TEST(Sm100EmuDecodeLaunch, BackToBackPdlDecodeTileDecode) {
  M3QKV_REQUIRE_DECODE_EMULATION();
  print_seed_once();
  CUDA_OK(cudaError_t(m3qkv_emu_set_fault(0, 0, 0, 0)));
  const Case cases[3] = {{kTP4, 64, 512, 0, 0, 1, 16}, {kTP4, 256, 256, 0, 0, 1, 16}, {kTP8, 7, 512, 0, 0, 1, 128}};
  std::vector<m3qkv_test::Problem> probs;
  std::vector<std::vector<float>> accs;
  for (const Case& c : cases) {
    probs.push_back(make_problem(to_config(c, /*exact=*/true)));
    accs.push_back(golden_acc(probs.back()));
  }
  DeviceInputs in[3];
  DeviceOutputs d[3];
  m3qkv_fused_args a[3];
  for (int i = 0; i < 3; ++i) {
    CUDA_OK(in[i].upload(probs[i]));
    CUDA_OK(d[i].init(probs[i], i % 2));
    a[i] = probs[i].args_with(in[i].mapper(), d[i].ptrs());
    a[i].use_pdl = 1;
  }
  Stream s;
  CUDA_OK(s.error());
  for (int rep = 0; rep < 2; ++rep)
    for (int i = 0; i < 3; ++i) ASSERT_EQ(m3qkv_testing_fused_qkv(&a[i], nullptr, M3QKV_BACKEND_SM100, s.get()), M3QKV_SUCCESS);
  CUDA_OK(cudaStreamSynchronize(s.get()));
  for (int i = 0; i < 3; ++i) {
    Fetched got;
    CUDA_OK(fetch_outputs(d[i], &got));
    HostOutputs want = poisoned_host_outputs(probs[i], i % 2);
    golden_epilogue(probs[i], accs[i].data(), &want);
    expect_same_outputs(probs[i], want, got, "PDL chain launch " + std::to_string(i) + " " + case_name(cases[i]));
  }
  expect_no_tmem_leak("PDL chain");
}

// ------------------------------------------------------------ negative
// TP4, M 7, K 512, split 4 (every unit one stage); returns the tap's mismatches
// against the exact accumulator.
int64_t mismatches(const DecodeOpts& o, unsigned long long b_xor, unsigned idesc_xor) {
  const Case c{kTP4, 7, 512, o.split, 0, 0, 16};
  const m3qkv_test::Problem p = make_problem(to_config(c, /*exact=*/true));
  const std::vector<float> acc = golden_acc(p);
  DeviceInputs in;
  EXPECT_EQ(in.upload(p), cudaSuccess);
  EXPECT_EQ(cudaError_t(m3qkv_emu_set_fault(0, b_xor, 0, idesc_xor)), cudaSuccess);
  Fetched got;
  std::vector<float> tap;
  run_decode(p, in, c, o, 0, true, &got, &tap);
  EXPECT_EQ(cudaError_t(m3qkv_emu_set_fault(0, 0, 0, 0)), cudaSuccess);
  expect_no_tmem_leak("negative run");
  if (tap.size() != acc.size()) return -1;
  int64_t first = -1;
  return count_f32_mismatch(tap.data(), acc.data(), acc.size(), &first);
}

TEST(Sm100EmuDecodeNegative, NoFaultControlIsExact) {
  M3QKV_REQUIRE_DECODE_EMULATION();
  print_seed_once();
  DecodeOpts o;
  o.split = 4;
  EXPECT_EQ(mismatches(o, 0, 0), 0);
}
// Wrong split bookkeeping: one partial left out of the fixed-order sum (every
// split in turn, the last arriver's own included) must change the bytes.
TEST(Sm100EmuDecodeNegative, SkippedPartialChangesTheAccumulator) {
  M3QKV_REQUIRE_DECODE_EMULATION();
  print_seed_once();
  for (int skip = 0; skip < 4; ++skip) {
    DecodeOpts o;
    o.split = 4;
    o.skip_split = skip;
    EXPECT_GT(mismatches(o, 0, 0), 0) << "leaving out split " << skip << " changed nothing";
  }
}
// The emulation's fault hooks reach this kernel's translation unit (each SM100
// kernel file has its own model state): wrong SF ids and a wrong swizzle of
// the token tile (B) change the accumulator.
TEST(Sm100EmuDecodeNegative, DescriptorFaultsReachTheDecodeKernel) {
  M3QKV_REQUIRE_DECODE_EMULATION();
  print_seed_once();
  ASSERT_NE(m3qkv_emu_units, nullptr);
  EXPECT_EQ(m3qkv_emu_units(), 2) << "fused_sm100.cu and decode_sm100.cu each register their model state";
  DecodeOpts o;
  o.split = 2;
  EXPECT_GT(mismatches(o, 0, (1u << 4) | (1u << 29)), 0) << "SF ids not read by the decode kernel's MMA model";
  EXPECT_GT(mismatches(o, 6ull << 61, 0), 0) << "the token tile's swizzle mode not read";
}

// ------------------------------------------------------------ random data
class Sm100EmuDecodeRandom : public ::testing::TestWithParam<Case> {};

TEST_P(Sm100EmuDecodeRandom, GemmErrorEpilogueOnTapRunToRun) {
  M3QKV_REQUIRE_DECODE_EMULATION();
  print_seed_once();
  const Case& c = GetParam();
  const m3qkv_test::Problem p = make_problem(to_config(c, /*exact=*/false));
  const std::vector<double> ref =
      m3qkv::golden::mxfp8_acc_f64(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  CUDA_OK(cudaError_t(m3qkv_emu_set_fault(0, 0, 0, 0)));
  const DecodeOpts plan_split;
  Fetched got;
  std::vector<float> tap;
  ASSERT_NO_FATAL_FAILURE(run_decode(p, in, c, plan_split, 0, true, &got, &tap));
  ASSERT_EQ(tap.size(), ref.size());
  const ErrorFigure e = relative_error(tap.data(), ref.data(), ref.size());
  RecordProperty("gemm_rel_error_sm100_decode", std::to_string(e.rel_fro));
  std::printf("[ gemm ] sm100 decode %s: |acc-ref|/|ref| = %.3e, max|err|/max|ref| = %.3e, non-finite %" PRId64 "\n",
              case_name(c).c_str(), e.rel_fro, e.max_abs_over_max_ref, e.non_finite);
  EXPECT_EQ(e.non_finite, 0) << "the tap holds non-finite entries (unwritten?)";
  EXPECT_LE(e.rel_fro, 1e-5);
  HostOutputs want = poisoned_host_outputs(p, 0);
  golden_epilogue(p, tap.data(), &want);
  expect_same_outputs(p, want, got, "random " + case_name(c) + " epilogue on tap");

  // Run to run: the same bytes (fixed-order reduction, whichever unit is last).
  Fetched again;
  std::vector<float> tap2;
  ASSERT_NO_FATAL_FAILURE(run_decode(p, in, c, plan_split, 0, true, &again, &tap2));
  int64_t first = -1;
  EXPECT_EQ(count_f32_mismatch(tap.data(), tap2.data(), tap.size(), &first), 0) << "first at " << first;
  expect_same_fetched(p, got, again, "second run " + case_name(c));

  // Bytes vs the split size: the sum is grouped differently (reported only).
  DecodeOpts one;
  one.split = 1;
  Fetched unsplit;
  std::vector<float> tap1;
  ASSERT_NO_FATAL_FAILURE(run_decode(p, in, c, one, 0, true, &unsplit, &tap1));
  EXPECT_LE(relative_error(tap1.data(), ref.data(), ref.size()).rel_fro, 1e-5);
  const int64_t differ = count_f32_mismatch(tap.data(), tap1.data(), tap.size(), &first);
  std::printf("[ split ] %s: %" PRId64 " of %zu accumulator entries differ between the plan's split and split 1\n",
              case_name(c).c_str(), differ, tap.size());
  expect_no_tmem_leak("random " + case_name(c));
}

INSTANTIATE_TEST_SUITE_P(Shapes, Sm100EmuDecodeRandom,
                         ::testing::Values(Case{kTP4, 7, 512, 0, 0, 0, 128}, Case{kTP8, 64, 512, 0, 0, 1, 16},
                                           Case{kTP2, 128, 256, 0, 0, 0, 16}),
                         [](const ::testing::TestParamInfo<Case>& i) { return case_name(i.param); });

}  // namespace
