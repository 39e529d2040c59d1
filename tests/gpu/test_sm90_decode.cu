// The SM90 decode kernel (src/sm90/decode_sm90.cu, M <= 256) on a CC 9.0
// device, called through m3qkv::sm90_fused_decode (forced split sizes and
// grids) and through the public API (automatic routing). Skipped elsewhere.
//
//  - Sm90DecodeExact: exact data (acc exact on any hardware), every head
//    layout x M in {1, 2, 7, 16, 33, 64, 129, 256} x block sizes 16 / 128,
//    automatic plan: every output byte equal to the golden model with both
//    poison salts, error_flags equal, tap equal to the golden accumulator.
//  - Sm90DecodeShapes: forced splits (1, 2, max, auto) x persistent grids
//    (1, 7, auto) x PDL, split 2 through L2 and over clusters, out-of-range
//    slots / positions, the API route.
//  - Sm90DecodeRandom: random data, K = 6144 and others: GEMM error of the tap
//    vs the f64 reference (reported, <= 1e-5), epilogue bit-exact on the tap,
//    the same bytes on a second run, the same bytes through L2 and over a
//    cluster, and how many accumulator entries change with the split size
//    (reported: the summation order differs).
#include <gtest/gtest.h>

#include <algorithm>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <string>
#include <vector>

#include "api/internal.h"
#include "api/validate.h"
#include "common/problem.h"
#include "common/test_util.h"
#include "golden/golden.h"
#include "gpu/gpu_util.h"
#include "gpu/backend_support.h"
#include "gpu/harness.h"
#include "sm90/decode_config.h"
#include "sm90/decode_plan.h"
#include "sm90/sm90.h"

namespace {

using namespace m3qkv_gpu;
using m3qkv_test::make_problem;

template <bool kHave = kBuiltSm90>
void decode_trace(uint64_t* buf, int ctas) {
  if constexpr (kHave) m3qkv::sm90::decode::decode_set_trace(buf, ctas);
}

ProblemConfig config(const Heads& h, int64_t m, int64_t k, bool exact, int block_size) {
  return heads_config(h, m, k, exact, block_size);
}

struct DecodeRun {
  int split = 0;  // 0 = the plan's
  int grid = 0;
  int use_pdl = 0;
  bool tap = true;
  int x_path = 0;  // m3qkv::Sm90DecodeX
  int reduce = 0;  // m3qkv::Sm90DecodeReduce
};
std::string run_name(const DecodeRun& r) {
  return "split " + std::to_string(r.split) + " grid " + std::to_string(r.grid) + " pdl " + std::to_string(r.use_pdl) +
         " x_path " + std::to_string(r.x_path) + " reduce " + std::to_string(r.reduce);
}

// On `stream` where given, else on a fresh stream (so a fresh workspace).
void run_decode(const Problem& p, const DeviceInputs& in, const DecodeRun& run, int salt, Fetched* out,
                std::vector<float>* acc, cudaStream_t stream = nullptr) {
  const auto launch = [&run](const m3qkv_fused_args& a, const m3qkv::DeviceInfo& dev, float* tap, cudaStream_t s) {
    return sm90_decode_call(a, dev, tap, s, run.split, run.x_path, run.reduce);
  };
  run_direct(p, in, run.use_pdl, run.grid, salt, launch, out, run.tap ? acc : nullptr, stream);
}

// Exact data: outputs and tap vs the golden model, both salts.
void check_exact(const Problem& p, const DeviceInputs& in, const std::vector<float>& acc, const DecodeRun& run,
                 const std::string& what) {
  check_exact_direct(p, acc, what + " [" + run_name(run) + "]", [&](int salt, Fetched* out, std::vector<float>* tap) {
    DecodeRun r = run;
    r.tap = tap != nullptr;
    run_decode(p, in, r, salt, out, tap);
  });
}

std::vector<float> golden_acc(const Problem& p) {
  return m3qkv::golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
}

// ------------------------------------------------------------ exact sweep
struct ExactCase {
  Heads heads;
  int64_t m;
  int block_size;
};
std::string exact_name(const ExactCase& c) {
  return std::string(c.heads.name) + "_M" + std::to_string(c.m) + "_B" + std::to_string(c.block_size);
}
std::vector<ExactCase> exact_cases() {
  std::vector<ExactCase> v;
  for (const Heads& h : {kTP1, kTP2, kTP4, kTP8, kDense})
    for (int64_t m : {1, 2, 7, 16, 33, 64, 129, 256, 300})
      for (int bs : {16, 128}) v.push_back({h, m, bs});
  return v;
}
class Sm90DecodeExact : public ::testing::TestWithParam<ExactCase> {};

TEST_P(Sm90DecodeExact, BitExactVsGolden) {
  M3QKV_REQUIRE_SM90();
  print_seed_once();
  const ExactCase& c = GetParam();
  // K: 4 stages (splits up to 4 per head), 2 where M·N is large (CPU golden time).
  const int64_t n = int64_t(c.heads.nq + 2 * c.heads.nkv + c.heads.niq + c.heads.nik) * 128;
  const int64_t k = c.m * n >= (int64_t(1) << 20) ? 256 : 512;
  const Problem p = make_problem(config(c.heads, c.m, k, /*exact=*/true, c.block_size));
  const std::vector<float> acc = golden_acc(p);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  ASSERT_NO_FATAL_FAILURE(check_exact(p, in, acc, DecodeRun{}, exact_name(c)));
}

INSTANTIATE_TEST_SUITE_P(Sweep, Sm90DecodeExact, ::testing::ValuesIn(exact_cases()),
                         [](const ::testing::TestParamInfo<ExactCase>& i) { return exact_name(i.param); });

// ------------------------------------------------------- launch shapes
// K = 2048 (16 stages): forced splits 1 (no workspace), 2, 16 (one stage per
// unit) and the plan's; grids of 1 CTA (walks every unit: the stage ring and
// the B ring wrap across units) and 7; PDL on and off.
TEST(Sm90DecodeShapes, ForcedSplitsGridsPdl_TP4_K2048) {
  M3QKV_REQUIRE_SM90();
  print_seed_once();
  for (int64_t m : {1, 64, 129}) {
    const Problem p = make_problem(config(kTP4, m, 2048, /*exact=*/true, 16));
    const std::vector<float> acc = golden_acc(p);
    DeviceInputs in;
    CUDA_OK(in.upload(p));
    for (int split : {0, 1, 2, 16})
      for (int grid : {0, 1, 7})
        for (int pdl : {0, 1}) {
          if ((grid != 0 || split == 16) && pdl == 1) continue;
          DecodeRun run;
          run.split = split;
          run.grid = grid;
          run.use_pdl = pdl;
          ASSERT_NO_FATAL_FAILURE(check_exact(p, in, acc, run, "TP4_M" + std::to_string(m) + "_K2048"));
          if (HasFailure()) return;
        }
    // Split 2 through L2, spread and over clusters of 2, forced; a grid of 7
    // CTAs (3 clusters) walks many pairs per cluster: the reduction barriers'
    // phases wrap (a spread plan needs every unit resident: the full grid
    // only). PDL on the full grid.
    for (int reduce : {m3qkv::kSm90DecodeReduceL2, m3qkv::kSm90DecodeReduceCluster, m3qkv::kSm90DecodeReduceSpread})
      for (int grid : {0, 7}) {
        if (reduce == m3qkv::kSm90DecodeReduceSpread && grid != 0) continue;
        DecodeRun run;
        run.split = 2;
        run.grid = grid;
        run.use_pdl = grid == 0 ? 1 : 0;
        run.reduce = reduce;
        ASSERT_NO_FATAL_FAILURE(check_exact(p, in, acc, run, "TP4_M" + std::to_string(m) + "_K2048"));
        if (HasFailure()) return;
      }
  }
}

// TP8 and TP1 at the real K with the plan's split (11 / 5 at M = 1): uneven
// stage ranges (48 / 11), many units per CTA (TP1).
TEST(Sm90DecodeShapes, RealKPlanSplits_TP8_TP1_K6144) {
  M3QKV_REQUIRE_SM90();
  print_seed_once();
  for (const Heads& h : {kTP8, kTP1})
    for (int64_t m : {1, 16}) {
      const Problem p = make_problem(config(h, m, 6144, /*exact=*/true, 128));
      const std::vector<float> acc = golden_acc(p);
      DeviceInputs in;
      CUDA_OK(in.upload(p));
      ASSERT_NO_FATAL_FAILURE(check_exact(p, in, acc, DecodeRun{}, std::string(h.name) + "_M" + std::to_string(m)));
      if (HasFailure()) return;
    }
}

TEST(Sm90DecodeShapes, OutOfRangeSlotsAndPositionsFlaggedNotWritten_TP1_M200) {
  M3QKV_REQUIRE_SM90();
  print_seed_once();
  ProblemConfig cfg = config(kTP1, 200, 256, /*exact=*/true, 128);
  cfg.out_of_range_slots = true;
  cfg.out_of_range_positions = true;
  cfg.slot_skip_fraction = 0.25;
  const Problem p = make_problem(cfg);
  const std::vector<float> acc = golden_acc(p);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  ASSERT_NO_FATAL_FAILURE(check_exact(p, in, acc, DecodeRun{}, "TP1_M200_OutOfRange"));
  Fetched got;
  ASSERT_NO_FATAL_FAILURE(run_decode(p, in, DecodeRun{}, 0, &got, nullptr));
  EXPECT_NE(got.flags & M3QKV_FLAG_SLOT_OUT_OF_RANGE, 0u);
  EXPECT_NE(got.flags & M3QKV_FLAG_INDEX_SLOT_OUT_OF_RANGE, 0u);
  EXPECT_NE(got.flags & M3QKV_FLAG_POSITION_OUT_OF_RANGE, 0u);
}

// One stream, plans whose arrival counters differ in size (TP1: 512 B at
// M = 1, 768 B at M = 200, split 4 both): every call finds its counters zero
// whatever the earlier calls wrote into the workspace (the partials once
// began right after a plan's own counters, inside the next plan's).
TEST(Sm90DecodeShapes, CountersOfAGrowingPlanOnOneStream_TP1) {
  M3QKV_REQUIRE_SM90();
  print_seed_once();
  Stream s;
  CUDA_OK(s.error());
  for (int64_t m : {1, 200, 1, 200}) {
    SCOPED_TRACE("M " + std::to_string(m));
    const Problem p = make_problem(config(kTP1, m, 1024, /*exact=*/true, 128));
    const std::vector<float> acc = golden_acc(p);
    DeviceInputs in;
    CUDA_OK(in.upload(p));
    DecodeRun run;
    run.split = 4;
    run.tap = false;
    Fetched got;
    ASSERT_NO_FATAL_FAILURE(run_decode(p, in, run, 1, &got, nullptr, s.get()));
    HostOutputs want = poisoned_host_outputs(p, 1);
    golden_epilogue(p, acc.data(), &want);
    expect_same_outputs(p, want, got, "TP1 M " + std::to_string(m) + " on one stream");
    if (HasFailure()) return;
  }
}

// One call of the public API (automatic backend and route) on exact random
// data, outputs poisoned (salt 1): the golden model's bytes.
void expect_api_golden(const Heads& h, int64_t m, const std::string& what) {
  const Problem p = make_problem(config(h, m, 1024, /*exact=*/true, 16));
  const std::vector<float> acc = golden_acc(p);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  FusedRun run;
  run.backend = M3QKV_BACKEND_NONE;
  Fetched got;
  ASSERT_NO_FATAL_FAILURE(run_fused(p, in, run, 1, &got));
  HostOutputs want = poisoned_host_outputs(p, 1);
  golden_epilogue(p, acc.data(), &want);
  expect_same_outputs(p, want, got, what + std::to_string(m));
}

// The public API routes MXFP8 activations to the swap-AB kernel up to
// kSwapAbMaxMxfp8M tokens and to the tile kernels above, bf16 ones below
// kXbf16PrefillMinM and to the prefill kernel from there
// (sm90::decode_preferred): either way the golden model's bytes.
TEST(Sm90DecodeShapes, ApiRoutesDecodeSizes_TP4) {
  M3QKV_REQUIRE_SM90();
  print_seed_once();
  const int heads = kTP4.nq + 2 * kTP4.nkv + kTP4.niq + kTP4.nik;
  ASSERT_TRUE(m3qkv::sm90_uses_decode(3, heads, false) &&
              m3qkv::sm90_uses_decode(m3qkv::sm90::kXbf16PrefillMinM - 1, heads, true));
  ASSERT_FALSE(m3qkv::sm90_uses_decode(m3qkv::sm90::kSwapAbMaxMxfp8M + 1, heads, false) ||
               m3qkv::sm90_uses_decode(m3qkv::sm90::kXbf16PrefillMinM, heads, true));
  ASSERT_TRUE(!m3qkv::sm90::decode_converts_x(32) && m3qkv::sm90::decode_converts_x(33));
  for (int64_t m : {3, 64, 256, 600, 1300}) ASSERT_NO_FATAL_FAILURE(expect_api_golden(kTP4, m, "API TP4 M "));
}

// TP8's 12 heads keep MXFP8 on the swap-AB kernel up to kSwapAbMaxMxfp8MFewHeads
// tokens (the tile kernels' 128-row tiles would fill under half of the SMs):
// the golden model's bytes on both sides of that bound.
TEST(Sm90DecodeShapes, ApiRoutesDecodeSizes_TP8) {
  M3QKV_REQUIRE_SM90();
  print_seed_once();
  const int heads = kTP8.nq + 2 * kTP8.nkv + kTP8.niq + kTP8.nik;
  ASSERT_TRUE(m3qkv::sm90_uses_decode(m3qkv::sm90::kSwapAbMaxMxfp8MFewHeads, heads, false));
  ASSERT_FALSE(m3qkv::sm90_uses_decode(m3qkv::sm90::kSwapAbMaxMxfp8MFewHeads + 1, heads, false));
  for (int64_t m : {600, 767, 768}) ASSERT_NO_FATAL_FAILURE(expect_api_golden(kTP8, m, "API TP8 M "));
}

// Issue 30's grid rule: any `grid` is clamped to what every path can run —
// the cooperative (pre-A / prefill) launches to the co-resident CTAs — so
// every value gives status 0 and the golden bytes, at the M of each SM90 path.
TEST(Sm90DecodeShapes, AnyGridRunsOnEveryPath_TP4) {
  M3QKV_REQUIRE_SM90();
  print_seed_once();
  for (int64_t m : {1, 64, 1024, 4096}) {
    const Problem p = make_problem(config(kTP4, m, m >= 1024 ? 256 : 512, /*exact=*/true, 128));
    const std::vector<float> acc = golden_acc(p);
    DeviceInputs in;
    CUDA_OK(in.upload(p));
    HostOutputs want = poisoned_host_outputs(p, 1);
    golden_epilogue(p, acc.data(), &want);
    for (int32_t grid : {1, 7, 132, 133, 1000000, INT32_MAX}) {
      FusedRun run;
      run.backend = M3QKV_BACKEND_NONE;
      run.grid = grid;
      Fetched got;
      ASSERT_NO_FATAL_FAILURE(run_fused(p, in, run, 1, &got)) << "M " << m << " grid " << grid;
      expect_same_outputs(p, want, got, "API TP4 M " + std::to_string(m) + " grid " + std::to_string(grid));
    }
  }
}

// --------------------------------------------------------- batch invariance
// batch_invariant = 1 (issue 28 item 3): the same tokens give the same bytes
// at M = 1, 7, 64, 300 and 4096, whatever the grid and the tokens after them.
// Random (inexact) data, so the f32 sums depend on their order. Run A: the
// first M tokens alone; run B: all 4096 tokens with those past M writing no
// cache entry (slot -1), so both runs write the same cache rows; compared:
// the caches whole and the first M rows of q_out / index_q_out. MXFP8 and
// bf16 activations; the automatic backend (SM90) and the portable one.
void invariant_run(const Problem& p, int64_t m, int32_t grid, m3qkv_backend_kind b, Fetched* out) {
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  DeviceOutputs o;
  CUDA_OK(o.init(p, 0, 0));
  m3qkv_fused_args a = p.args_with(in.mapper(), o.ptrs());
  a.m = m;
  a.grid = grid;
  a.batch_invariant = 1;
  M3QKV_OK(m3qkv_testing_fused_qkv(&a, nullptr, b, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(fetch_outputs(o, out));
}

TEST(Sm90BatchInvariance, SameTokensSameBytesAtEveryM) {
  M3QKV_REQUIRE_SM90();
  print_seed_once();
  constexpr int64_t kFull = 4096;
  for (bool bf16 : {false, true}) {
    ProblemConfig cfg = config(kTP4, kFull, 512, /*exact=*/false, 128);
    cfg.x_bf16 = bf16;
    cfg.slot_skip_fraction = 0.0;  // every token writes its row
    const Problem p = make_problem(cfg);
    for (m3qkv_backend_kind b : {M3QKV_BACKEND_SM90, M3QKV_BACKEND_PORTABLE}) {
      for (int64_t m : {1, 7, 64, 300, 4096}) {
        const std::string what = std::string(bf16 ? "x_bf16" : "MXFP8") + " " + backend_label(b) + " M " +
                                 std::to_string(m);
        SCOPED_TRACE(what);
        Problem tail = p;  // tokens >= m write no cache entry
        for (int64_t t = m; t < kFull; ++t) tail.slot_mapping[size_t(t)] = tail.index_slot_mapping[size_t(t)] = -1;
        Fetched alone, among;
        ASSERT_NO_FATAL_FAILURE(invariant_run(p, m, m == 7 ? 5 : 0, b, &alone));
        ASSERT_NO_FATAL_FAILURE(invariant_run(tail, kFull, m == 300 ? 133 : 0, b, &among));
        const auto prefix_equal = [&](const char* name, const std::vector<uint8_t>& x, const std::vector<uint8_t>& y,
                                      size_t row_bytes) {
          const size_t n = size_t(m) * row_bytes;
          ASSERT_GE(x.size(), n);
          ASSERT_GE(y.size(), n);
          size_t first = n;
          for (size_t i = 0; i < n && first == n; ++i)
            if (x[i] != y[i]) first = i;
          EXPECT_EQ(first, n) << what << ": " << name << " differs at byte " << first << " (token " << first / row_bytes
                              << ")";
        };
        prefix_equal("q_out", alone.q_out, among.q_out, size_t(p.nq) * 128 * 2);
        prefix_equal("index_q_out", alone.index_q_out, among.index_q_out, size_t(p.niq) * 128);
        EXPECT_TRUE(alone.kv_cache == among.kv_cache) << what << ": kv_cache";
        EXPECT_TRUE(alone.v_cache == among.v_cache) << what << ": v_cache";
        EXPECT_TRUE(alone.index_cache == among.index_cache) << what << ": index_cache";
        if (HasFailure()) return;
      }
    }
  }
}

// ------------------------------------------------------------ random data
struct RandomCase {
  Heads heads;
  int64_t m;
  int64_t k;
};
std::string random_name(const RandomCase& c) {
  return std::string(c.heads.name) + "_M" + std::to_string(c.m) + "_K" + std::to_string(c.k);
}
class Sm90DecodeRandom : public ::testing::TestWithParam<RandomCase> {};

TEST_P(Sm90DecodeRandom, GemmErrorEpilogueOnTapRunToRun) {
  M3QKV_REQUIRE_SM90();
  print_seed_once();
  const RandomCase& c = GetParam();
  const Problem p = make_problem(config(c.heads, c.m, c.k, /*exact=*/false, 128));
  const std::vector<double> ref =
      m3qkv::golden::mxfp8_acc_f64(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  Fetched got;
  std::vector<float> tap;
  ASSERT_NO_FATAL_FAILURE(run_decode(p, in, DecodeRun{}, 0, &got, &tap));
  ASSERT_EQ(tap.size(), ref.size());
  const ErrorFigure e = relative_error(tap.data(), ref.data(), ref.size());
  RecordProperty("gemm_rel_error_sm90_decode", std::to_string(e.rel_fro));
  std::printf("[ gemm ] sm90 decode %s: |acc-ref|/|ref| = %.3e, max|err|/max|ref| = %.3e, non-finite %" PRId64 "\n",
              random_name(c).c_str(), e.rel_fro, e.max_abs_over_max_ref, e.non_finite);
  EXPECT_EQ(e.non_finite, 0) << "the tap holds non-finite entries (unwritten?)";
  EXPECT_LE(e.rel_fro, 1e-5);
  HostOutputs want = poisoned_host_outputs(p, 0);
  golden_epilogue(p, tap.data(), &want);
  expect_same_outputs(p, want, got, "random " + random_name(c) + " epilogue on tap");

  // Run to run: the same bytes (fixed-order reduction, whichever unit is last).
  Fetched again;
  std::vector<float> tap2;
  ASSERT_NO_FATAL_FAILURE(run_decode(p, in, DecodeRun{}, 0, &again, &tap2));
  int64_t first = -1;
  EXPECT_EQ(count_f32_mismatch(tap.data(), tap2.data(), tap.size(), &first), 0) << "first at " << first;
  expect_same_fetched(p, got, again, "second run " + random_name(c));

  // Bytes vs the split size: the sum is grouped differently (reported only).
  DecodeRun one;
  one.split = 1;
  Fetched unsplit;
  std::vector<float> tap1;
  ASSERT_NO_FATAL_FAILURE(run_decode(p, in, one, 0, &unsplit, &tap1));
  const ErrorFigure e1 = relative_error(tap1.data(), ref.data(), ref.size());
  EXPECT_LE(e1.rel_fro, 1e-5);
  const int64_t differ = count_f32_mismatch(tap.data(), tap1.data(), tap.size(), &first);
  std::printf("[ split ] %s: %" PRId64 " of %zu accumulator entries differ between the plan's split and split 1\n",
              random_name(c).c_str(), differ, tap.size());

  // The activations converted in the kernel and once per call: the same bf16
  // tile, so the same accumulator and output bytes (forced both ways, fresh streams).
  Fetched by_path[2];
  std::vector<float> tap_path[2];
  for (int i = 0; i < 2; ++i) {
    DecodeRun r;
    r.x_path = i == 0 ? m3qkv::kSm90DecodeXTransform : m3qkv::kSm90DecodeXConverted;
    ASSERT_NO_FATAL_FAILURE(run_decode(p, in, r, 0, &by_path[i], &tap_path[i]));
  }
  EXPECT_EQ(count_f32_mismatch(tap_path[0].data(), tap_path[1].data(), tap.size(), &first), 0)
      << "converted vs transformed activations, first at " << first;
  // Split 4 through L2 (last arriver, spread) and over clusters of 4: the
  // same additions in the same order, so the same accumulator and output bytes.
  const int reduces[3] = {m3qkv::kSm90DecodeReduceL2, m3qkv::kSm90DecodeReduceCluster,
                          m3qkv::kSm90DecodeReduceSpread};
  const char* const reduce_names[3] = {"through L2", "over a cluster", "through L2, spread"};
  // A spread plan needs every unit resident at once (units <= grid): TP4 M1,
  // TP4 M64 and TP8 M33 at split 4; elsewhere the call is refused.
  bool spread_fits = false;
  {
    DeviceOutputs d;
    CUDA_OK(d.init(p, 0));
    m3qkv_fused_args a = p.args_with(in.mapper(), d.ptrs());
    m3qkv::DeviceInfo dev;
    M3QKV_OK(m3qkv::current_device_info(&dev));
    m3qkv::splitk::Plan plan;
    int clusters[9] = {};
    M3QKV_OK(m3qkv::sm90_decode_plan(a, dev, 4, m3qkv::kSm90DecodeReduceSpread, &plan, clusters));
    spread_fits = plan.spread;
    EXPECT_EQ(spread_fits, plan.units <= dev.num_sms) << random_name(c) << ": " << plan.units << " units";
    if (!spread_fits)
      EXPECT_EQ(sm90_decode_call(a, dev, nullptr, nullptr, 4, 0, m3qkv::kSm90DecodeReduceSpread),
                M3QKV_ERROR_INVALID_ARGUMENT)
          << random_name(c) << ": a spread plan of " << plan.units << " units on " << dev.num_sms << " SMs";
  }
  Fetched by_reduce[3];
  std::vector<float> tap_reduce[3];
  for (int i = 0; i < (spread_fits ? 3 : 2); ++i) {
    DecodeRun r;
    r.split = 4;
    r.reduce = reduces[i];
    ASSERT_NO_FATAL_FAILURE(run_decode(p, in, r, 0, &by_reduce[i], &tap_reduce[i]));
  }
  for (int i = 1; i < (spread_fits ? 3 : 2); ++i) {
    EXPECT_EQ(count_f32_mismatch(tap_reduce[0].data(), tap_reduce[i].data(), tap.size(), &first), 0)
        << "split 4 through L2 vs " << reduce_names[i] << ", first at " << first;
    expect_same_fetched(p, by_reduce[0], by_reduce[i],
                        std::string("split 4, L2 vs ") + reduce_names[i] + " " + random_name(c));
  }
  EXPECT_EQ(count_f32_mismatch(tap.data(), tap_path[1].data(), tap.size(), &first), 0)
      << "automatic vs converted activations, first at " << first;
  expect_same_fetched(p, by_path[0], by_path[1], "converted vs transformed activations " + random_name(c));
}

INSTANTIATE_TEST_SUITE_P(Shapes, Sm90DecodeRandom,
                         ::testing::Values(RandomCase{kTP4, 1, 6144}, RandomCase{kTP4, 64, 6144},
                                           RandomCase{kTP8, 33, 6144}, RandomCase{kTP1, 7, 2048},
                                           RandomCase{kTP2, 256, 1024}, RandomCase{kDense, 129, 2048}),
                         [](const ::testing::TestParamInfo<RandomCase>& i) { return random_name(i.param); });

// ------------------------------------------------------------ timeline
// Not a check: the per-CTA %globaltimer timeline of one decode call (cold L2:
// a 256 MiB memset first; then warm), median / p90 over CTAs, µs from the
// earliest kernel entry. Run with --gtest_also_run_disabled_tests.
TEST(Sm90DecodeTiming, DISABLED_Timeline) {
  M3QKV_REQUIRE_SM90();
  print_seed_once();
  namespace dec = m3qkv::sm90::decode;
  constexpr int kCtas = 1024;
  DeviceBuffer trace(size_t(kCtas) * dec::kTraceEvents * sizeof(uint64_t));
  CUDA_OK(trace.error());
  DeviceBuffer flush(size_t(256) << 20);  // > 50 MiB L2
  CUDA_OK(flush.error());
  const char* names[] = {"entry", "setup", "pdl_done", "first_full", "main_done", "arrived", "summed", "owners",
                         "unit_done"};
  struct Case {
    Heads h;
    int64_t m;
    int cache = M3QKV_CACHE_NVFP4;  // KV and index cache format (the bench's fused_sm90_fp8 is FP8)
  };
  for (const Case& c : {Case{kTP4, 1}, Case{kTP4, 1, M3QKV_CACHE_FP8}, Case{kTP4, 64}, Case{kTP4, 128},
                        Case{kTP4, 256}, Case{kTP8, 1}, Case{kTP1, 1}})
   for (int reduce : {m3qkv::kSm90DecodeReduceL2, m3qkv::kSm90DecodeReduceSpread, m3qkv::kSm90DecodeReduceAuto}) {
    ProblemConfig cfg = config(c.h, c.m, 6144, /*exact=*/false, 128);
    cfg.kv_dtype = cfg.index_dtype = c.cache;
    const Problem p = make_problem(cfg);
    DeviceInputs in;
    CUDA_OK(in.upload(p));
    DeviceOutputs d;
    CUDA_OK(d.init(p, 0));
    m3qkv_fused_args a = p.args_with(in.mapper(), d.ptrs());
    m3qkv::DeviceInfo dev;
    M3QKV_OK(m3qkv::current_device_info(&dev));
    m3qkv::splitk::Plan plan;
    int clusters[9] = {};
    M3QKV_OK(m3qkv::sm90_decode_plan(a, dev, 0, reduce, &plan, clusters));
    if (reduce == m3qkv::kSm90DecodeReduceSpread && !plan.spread) continue;  // more units than CTAs
    std::printf("[ trace ] co-resident clusters of 2..8 CTAs: %d %d %d %d %d %d %d\n", clusters[2], clusters[3],
                clusters[4], clusters[5], clusters[6], clusters[7], clusters[8]);
    Stream s;
    CUDA_OK(s.error());
    Event e0, e1;
    CUDA_OK(e0.error());
    CUDA_OK(e1.error());
    for (int cold = 1; cold >= 0; --cold) {
      for (int i = 0; i < 3; ++i) M3QKV_OK(sm90_decode_call(a, dev, nullptr, s.get(), 0, 0, reduce));
      if (cold) CUDA_OK(cudaMemsetAsync(flush.get(), cold, flush.size(), s.get()));
      CUDA_OK(cudaMemsetAsync(trace.get(), 0, trace.size(), s.get()));
      decode_trace(trace.as<uint64_t>(), kCtas);
      CUDA_OK(cudaEventRecord(e0.get(), s.get()));
      M3QKV_OK(sm90_decode_call(a, dev, nullptr, s.get(), 0, 0, reduce));
      CUDA_OK(cudaEventRecord(e1.get(), s.get()));
      decode_trace(nullptr, 0);
      CUDA_OK(cudaEventSynchronize(e1.get()));
      float ms = 0.f;
      CUDA_OK(cudaEventElapsedTime(&ms, e0.get(), e1.get()));
      std::vector<uint64_t> t;
      CUDA_OK(trace.download_as(&t));
      auto at = [&](int cta, int ev) { return t[size_t(cta) * dec::kTraceEvents + ev]; };
      int ctas = 0;
      uint64_t t0 = ~0ull, lasts = 0, units = 0;
      for (int k = 0; k < kCtas; ++k)
        if (at(k, dec::kTrEntry) != 0) {
          ++ctas;
          t0 = std::min(t0, at(k, dec::kTrEntry));
          units += at(k, dec::kTrUnits);
          lasts += at(k, dec::kTrLastArrivals);
        }
      std::printf("[ trace ] %s M%lld K6144 %s caches, %s L2: call %.1f us (events); plan nt %d split %d cluster %d "
                  "spread %d grid %d units %lld; %d CTAs traced, %llu units, %llu last arrivals\n",
                  c.h.name, static_cast<long long>(c.m), c.cache == M3QKV_CACHE_FP8 ? "FP8" : "NVFP4",
                  cold ? "cold" : "warm", 1e3 * double(ms), plan.nt,
                  plan.split, plan.cluster, plan.spread ? 1 : 0, plan.grid, static_cast<long long>(plan.units), ctas,
                  static_cast<unsigned long long>(units), static_cast<unsigned long long>(lasts));
      ASSERT_GT(ctas, 0);
      // The last arrivers one by one (head = unit / split when each CTA has one unit).
      if (plan.units == plan.grid)
        for (int k = 0; k < kCtas; ++k)
          if (at(k, dec::kTrEntry) != 0 && at(k, dec::kTrLastArrivals) != 0)
            std::printf("[ trace ]   last arriver CTA %3d head %2lld: arrived %7.2f  summed %7.2f  owners %7.2f  "
                        "done %7.2f us\n",
                        k, static_cast<long long>(k / plan.split), 1e-3 * double(at(k, dec::kTrArrived) - t0),
                        1e-3 * double(at(k, dec::kTrSummed) - t0), 1e-3 * double(at(k, dec::kTrOwners) - t0),
                        1e-3 * double(at(k, dec::kTrEpiDone) - t0));
      for (int ev = 0; ev <= dec::kTrEpiDone; ++ev) {
        std::vector<double> v;
        for (int k = 0; k < kCtas; ++k)
          if (at(k, dec::kTrEntry) != 0 && at(k, ev) != 0) v.push_back(1e-3 * double(at(k, ev) - t0));
        if (v.empty()) {
          std::printf("[ trace ]   %-11s (no CTA)\n", names[ev]);
          continue;
        }
        std::sort(v.begin(), v.end());
        std::printf("[ trace ]   %-11s n %4zu  min %8.2f  p50 %8.2f  p90 %8.2f  max %8.2f us\n", names[ev], v.size(),
                    v.front(), v[v.size() / 2], v[v.size() * 9 / 10], v.back());
      }
    }
  }
}

}  // namespace
