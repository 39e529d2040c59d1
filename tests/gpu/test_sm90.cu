// The SM90 tile kernels (src/sm90) on a CC 9.0 device: variant A (bf16
// dequant), its form on activations converted once per call and the prefill
// kernel, called through the backend entry m3qkv::sm90_fused_variant (which
// also reaches the instances the automatic route does not take). Skipped on
// any other device. The swap-AB kernel: test_sm90_decode.cu.
//
//  - Sm90Exact: exact data (acc exact on any hardware), TP1/TP2/TP4/TP8/dense x
//    M in {1, 64, 129, 2048}: every output byte equal to the golden model with
//    both poison salts (guard zones intact), error_flags equal, tap equal to
//    the golden accumulator.
//  - Sm90Shapes: tile height 64 / 128, persistent grids of 1 and 7 CTAs, PDL,
//    the real K = 6144, out-of-range slots / positions.
//  - Sm90Random: random data: GEMM error of the tap vs the f64 reference
//    (reported), epilogue bit-exact on the kernel's own accumulator.
//  - Sm90Dequant: the variant-A e4m3·2^e -> bf16 integer dequantizer against
//    the exact product on all 256 x 256 (byte, scale) pairs.
//  - Sm90Api: m3qkv_testing_fused_qkv forced to SM90 (skipped in a build
//    without the SM90 kernel).
#include <gtest/gtest.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "api/internal.h"
#include "api/validate.h"
#include "common/layouts.h"
#include "common/numerics.h"
#include "common/problem.h"
#include "common/test_util.h"
#include "golden/golden.h"
#include "gpu/gpu_util.h"
#include "gpu/backend_support.h"
#include "gpu/harness.h"
#include "sm90/sm90.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#include "sm90/dequant_sm90.cuh"
#endif

namespace {

using namespace m3qkv_gpu;
using m3qkv_test::make_problem;

template <bool kHave = kBuiltSm90>
int sm90_clusters(const m3qkv::DeviceInfo& dev, int split) {
  if constexpr (kHave)
    return m3qkv::sm90_max_active_clusters(dev, split);
  else
    return 0;
}

const char* variant_name(int v) {
  return v == m3qkv::kSm90Bf16Dequant       ? "A_bf16dq"
         : v == m3qkv::kSm90Bf16DequantPreA ? "A_preA"
         : v == m3qkv::kSm90Bf16Prefill     ? "prefill"
                                            : "auto";
}

ProblemConfig config(const Heads& h, int64_t m, int64_t k, bool exact, int block_size = 16) {
  return heads_config(h, m, k, exact, block_size);
}

// One launch options set of the SM90 entry.
struct Sm90Run {
  int variant = m3qkv::kSm90Bf16Dequant;
  int block_m = 0;  // 0 = automatic
  int grid = 0;
  int split = 0;  // split-K cluster size, 0 = automatic, 1 = off
  int use_pdl = 0;
  bool tap = true;
};

// The prefill instance (variant A, activations pre-converted): runs where its
// plan has 128-row tiles without split-K (block_m 128 forces that on every M).
Sm90Run pre_a_run(int variant = m3qkv::kSm90Bf16DequantPreA) {
  Sm90Run r;
  r.variant = variant;
  r.block_m = 128;
  return r;
}
// The prefill kernel (both operands pre-converted, epilogue warpgroup): the same plans.
Sm90Run prefill_run() { return pre_a_run(m3qkv::kSm90Bf16Prefill); }

// A problem's inputs and (salt-0 poisoned) outputs on the device, its args
// and the current device: the set-up of the tests that only look at statuses.
struct OnDevice {
  DeviceInputs in;
  DeviceOutputs d;
  m3qkv_fused_args a{};
  m3qkv::DeviceInfo dev;
  void init(const Problem& p) {
    CUDA_OK(in.upload(p));
    CUDA_OK(d.init(p, 0));
    a = p.args_with(in.mapper(), d.ptrs());
    M3QKV_OK(m3qkv::current_device_info(&dev));
  }
};

// Runs sm90_fused_variant once on fresh poisoned outputs (salt) and fetches
// them; on `stream` where given, else on a fresh stream (a fresh workspace).
void run_sm90(const Problem& p, const DeviceInputs& in, const Sm90Run& run, int salt, Fetched* out,
              std::vector<float>* acc, cudaStream_t stream = nullptr) {
  const auto launch = [&run](const m3qkv_fused_args& a, const m3qkv::DeviceInfo& dev, float* tap, cudaStream_t s) {
    return sm90_variant_call(a, dev, tap, s, run.variant, run.block_m, run.split);
  };
  run_direct(p, in, run.use_pdl, run.grid, salt, launch, out, run.tap ? acc : nullptr, stream);
}

std::string run_name(const Sm90Run& r) {
  return std::string(variant_name(r.variant)) + " block_m " +
         std::to_string(r.block_m) + " grid " + std::to_string(r.grid) + " split " + std::to_string(r.split) +
         " pdl " + std::to_string(r.use_pdl);
}

// Exact data: outputs and tap vs the golden model, both salts.
void check_exact(const Problem& p, const DeviceInputs& in, const std::vector<float>& acc, const Sm90Run& run,
                 const std::string& what) {
  check_exact_direct(p, acc, what + " [" + run_name(run) + "]", [&](int salt, Fetched* out, std::vector<float>* tap) {
    Sm90Run r = run;
    r.tap = tap != nullptr;
    run_sm90(p, in, r, salt, out, tap);
  });
}

// ------------------------------------------------------------ exact sweep
struct ExactCase {
  Heads heads;
  int64_t m;
};
std::string exact_name(const ExactCase& c) { return std::string(c.heads.name) + "_M" + std::to_string(c.m); }

std::vector<ExactCase> exact_cases() {
  std::vector<ExactCase> v;
  for (const Heads& h : {kTP1, kTP2, kTP4, kTP8, kDense})
    for (int64_t m : {1, 64, 129, 2048}) v.push_back({h, m});
  return v;
}

class Sm90Exact : public ::testing::TestWithParam<ExactCase> {};

TEST_P(Sm90Exact, BothVariantsBitExactVsGolden) {
  M3QKV_REQUIRE_SM90();
  print_seed_once();
  const ExactCase& c = GetParam();
  // K: 4 TMA stages (the ring wraps inside a tile), 2 where M·N is large (CPU golden time).
  const int64_t n = int64_t(c.heads.nq + 2 * c.heads.nkv + c.heads.niq + c.heads.nik) * 128;
  const int64_t k = c.m * n >= (int64_t(1) << 22) ? 256 : 512;
  const Problem p = make_problem(config(c.heads, c.m, k, /*exact=*/true));
  const std::vector<float> acc =
      m3qkv::golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  ASSERT_NO_FATAL_FAILURE(check_exact(p, in, acc, Sm90Run{}, exact_name(c)));
  ASSERT_NO_FATAL_FAILURE(check_exact(p, in, acc, pre_a_run(), exact_name(c)));
  ASSERT_NO_FATAL_FAILURE(check_exact(p, in, acc, prefill_run(), exact_name(c)));
}

INSTANTIATE_TEST_SUITE_P(Sweep, Sm90Exact, ::testing::ValuesIn(exact_cases()),
                         [](const ::testing::TestParamInfo<ExactCase>& i) { return exact_name(i.param); });

// ------------------------------------------------------- launch shapes
// Tile heights, persistent grids (1 CTA walks every tile: the pipelines wrap
// across tiles), PDL, and the real K.
TEST(Sm90Shapes, TileHeightsGridsPdlGiveGoldenBytes_TP4_M129_K6144) {
  M3QKV_REQUIRE_SM90();
  print_seed_once();
  ProblemConfig cfg = config(kTP4, 129, 6144, /*exact=*/true, 64);
  const Problem p = make_problem(cfg);
  const std::vector<float> acc =
      m3qkv::golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  for (int bm : {64, 128})
    for (int grid : {0, 1, 7})
      for (int pdl : {0, 1}) {
        if (grid == 1 && pdl == 1) continue;
        Sm90Run run;
        run.block_m = bm;
        run.grid = grid;
        run.use_pdl = pdl;
        ASSERT_NO_FATAL_FAILURE(check_exact(p, in, acc, run, "TP4_M129_K6144"));
        if (HasFailure()) return;
      }
  // The prefill instance: persistent grids (one CTA walks all 40 tiles: both
  // producers' rings wrap across tiles), PDL on its first kernel.
  // The prefill kernel: the same, and its hand-off buffers wrap across tiles.
  for (const Sm90Run& base : {pre_a_run(), prefill_run()})
    for (int grid : {0, 1, 7})
      for (int pdl : {0, 1}) {
        Sm90Run run = base;
        run.grid = grid;
        run.use_pdl = pdl;
        ASSERT_NO_FATAL_FAILURE(check_exact(p, in, acc, run, "TP4_M129_K6144"));
        if (HasFailure()) return;
      }
}

// The one-launch prefill paths meet at a grid barrier whose count lives in
// the stream workspace and must be back at zero for the next launch: one
// stream, the pre-A and prefill kernels one after the other, with and
// without PDL, on the plan's grid and on 1 and 7 CTAs (a CTA walks several
// tiles and converts several groups per thread), every call golden. A count
// left non-zero would hang the next launch's barrier (the suite's time limit).
TEST(Sm90Shapes, OneLaunchPrefillBarrierReusedOnOneStream) {
  M3QKV_REQUIRE_SM90();
  print_seed_once();
  const Problem p = make_problem(config(kTP8, 300, 512, /*exact=*/true, 16));
  const std::vector<float> acc =
      m3qkv::golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  Stream s;
  CUDA_OK(s.error());
  int call = 0;
  for (int grid : {0, 1, 7, 0})
    for (const Sm90Run& base : {pre_a_run(), prefill_run()})
      for (int pdl : {1, 0}) {
        Sm90Run run = base;
        run.grid = grid;
        run.use_pdl = pdl;
        run.tap = false;
        SCOPED_TRACE("call " + std::to_string(call++) + ": " + run_name(run));
        Fetched got;
        ASSERT_NO_FATAL_FAILURE(run_sm90(p, in, run, call % 2, &got, nullptr, s.get()));
        HostOutputs want = poisoned_host_outputs(p, call % 2);
        golden_epilogue(p, acc.data(), &want);
        expect_same_outputs(p, want, got, "one stream [" + run_name(run) + "]");
        if (HasFailure()) return;
      }
}

// The automatic choice (what sm90_fused runs: variant -1) over the prefill
// M range of issue 11, K short (CPU golden time): from M = 1024 the prefill
// kernel, from M = 512 variant A with pre-converted activations (and where
// the plan has 128-row tiles without split-K), below it variant A (TP4 M =
// 300: 64-row tiles with split-K); every byte golden either way.
TEST(Sm90Shapes, AutomaticPrefillChoiceGivesGoldenBytes) {
  M3QKV_REQUIRE_SM90();
  print_seed_once();
  // Issue 11's M list at every TP (16384 at TP8 only, and TP1 to 2048: CPU golden time).
  std::vector<std::pair<Heads, int64_t>> cases = {{kTP4, 300}, {kDense, 1000}, {kTP8, 16384}};
  for (const Heads& h : {kTP1, kTP2, kTP4, kTP8})
    for (int64_t m : {512, 513, 1000, 2048, 4096})
      if (h.nq < 64 || m <= 2048) cases.push_back({h, m});
  for (const auto& [h, m] : cases) {
    const Problem p = make_problem(config(h, m, 256, /*exact=*/true, 128));
    const std::vector<float> acc =
        m3qkv::golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
    DeviceInputs in;
    CUDA_OK(in.upload(p));
    Sm90Run run;
    run.variant = m3qkv::kSm90AutoVariant;
    run.use_pdl = 1;
    ASSERT_NO_FATAL_FAILURE(check_exact(p, in, acc, run, std::string(h.name) + "_M" + std::to_string(m) + "_K256"));
    if (HasFailure()) return;
  }
}

// The prefill instances are refused, not run, where they do not apply: 64-row
// tiles (block_m 64, or the automatic height at small M), split-K; and a
// variant number that is not one (1 was variant B, removed; 4 never existed).
TEST(Sm90Shapes, PrefillInstanceRefusedWhereItDoesNotApply) {
  M3QKV_REQUIRE_SM90();
  print_seed_once();
  const Problem p = make_problem(config(kTP4, 64, 256, /*exact=*/true));
  OnDevice od;
  ASSERT_NO_FATAL_FAILURE(od.init(p));
  const m3qkv_fused_args& a = od.a;
  const m3qkv::DeviceInfo& dev = od.dev;
  for (int bad : {1, 4}) {
    EXPECT_EQ(sm90_variant_call(a, dev, nullptr, nullptr, bad, 128, 0), M3QKV_ERROR_INVALID_ARGUMENT)
        << "variant " << bad;
    EXPECT_NE(std::string(m3qkv_last_error()).find("is not 0"), std::string::npos) << m3qkv_last_error();
  }
  const int v = m3qkv::kSm90Bf16DequantPreA;
  EXPECT_EQ(sm90_variant_call(a, dev, nullptr, nullptr, v, 0, 0), M3QKV_ERROR_INVALID_ARGUMENT);  // auto: 64 rows
  EXPECT_EQ(sm90_variant_call(a, dev, nullptr, nullptr, v, 64, 2), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(sm90_variant_call(a, dev, nullptr, nullptr, v, 64, 0), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(m3qkv_last_error()).find("variant 2"), std::string::npos) << m3qkv_last_error();
  const int pf = m3qkv::kSm90Bf16Prefill;
  EXPECT_EQ(sm90_variant_call(a, dev, nullptr, nullptr, pf, 0, 0), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(sm90_variant_call(a, dev, nullptr, nullptr, pf, 64, 0), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(m3qkv_last_error()).find("variant 3"), std::string::npos) << m3qkv_last_error();
}

// Split-K over a cluster (64-row tiles; M = 320: 5 row blocks, the last one
// partial, 100 tiles): forced cluster sizes (5: uneven K ranges,
// 9 or 10 stages of 48), off, automatic; a grid of 2 clusters walks all 20
// tiles (the reduction barriers' phases wrap across tiles); PDL on.
TEST(Sm90Shapes, SplitKClustersGiveGoldenBytes_TP4_K6144) {
  M3QKV_REQUIRE_SM90();
  print_seed_once();
  for (int64_t m : {1, 64, 128, 320}) {
    const Problem p = make_problem(config(kTP4, m, 6144, /*exact=*/true, 64));
    const std::vector<float> acc =
        m3qkv::golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
    DeviceInputs in;
    CUDA_OK(in.upload(p));
    for (int split : {0, 1, 2, 5, 8})
      for (int grid : {0, 10}) {
        if (grid != 0 && split != 5) continue;
        Sm90Run run;
        run.split = split;
        run.grid = grid;
        run.use_pdl = split == 2 ? 1 : 0;
        ASSERT_NO_FATAL_FAILURE(check_exact(p, in, acc, run, "TP4_M" + std::to_string(m) + "_K6144"));
        if (HasFailure()) return;
      }
  }
}

// Split-K with a 128-row tile, or a cluster size past 8, is refused, not run.
TEST(Sm90Shapes, SplitKRefusedWhereItDoesNotApply) {
  M3QKV_REQUIRE_SM90();
  print_seed_once();
  for (int64_t m : {64, 2048}) {
    const Problem p = make_problem(config(kTP8, m, 256, /*exact=*/true));
    OnDevice od;
    ASSERT_NO_FATAL_FAILURE(od.init(p));
    const m3qkv_fused_args& a = od.a;
    const m3qkv::DeviceInfo& dev = od.dev;
    const int bm = m == 64 ? 128 : 0;  // TP8 M 2048: 192 tiles of 128 rows, automatic block_m is 128
    EXPECT_EQ(sm90_variant_call(a, dev, nullptr, nullptr, m3qkv::kSm90Bf16Dequant, bm, 2),
              M3QKV_ERROR_INVALID_ARGUMENT)
        << "M " << m << " block_m " << bm;
    EXPECT_EQ(sm90_variant_call(a, dev, nullptr, nullptr, m3qkv::kSm90Bf16Dequant, 0, 9),
              M3QKV_ERROR_INVALID_ARGUMENT);
  }
}

TEST(Sm90Shapes, OutOfRangeSlotsAndPositionsFlaggedNotWritten_TP1_M200) {
  M3QKV_REQUIRE_SM90();
  print_seed_once();
  ProblemConfig cfg = config(kTP1, 200, 256, /*exact=*/true, 128);
  cfg.out_of_range_slots = true;
  cfg.out_of_range_positions = true;
  cfg.slot_skip_fraction = 0.25;
  const Problem p = make_problem(cfg);
  const std::vector<float> acc =
      m3qkv::golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  for (const Sm90Run& run : {Sm90Run{}, prefill_run()}) {
    ASSERT_NO_FATAL_FAILURE(check_exact(p, in, acc, run, "TP1_M200_OutOfRange"));
    Fetched got;
    ASSERT_NO_FATAL_FAILURE(run_sm90(p, in, run, 0, &got, nullptr));
    EXPECT_NE(got.flags & M3QKV_FLAG_SLOT_OUT_OF_RANGE, 0u);
    EXPECT_NE(got.flags & M3QKV_FLAG_INDEX_SLOT_OUT_OF_RANGE, 0u);
    EXPECT_NE(got.flags & M3QKV_FLAG_POSITION_OUT_OF_RANGE, 0u);
    if (HasFailure()) return;
  }
}

// ------------------------------------------------------------ random data
// Every instance sums exact bf16 products in f32 (error ~1e-6 relative, as
// the portable path; a lost scale or block gives O(1)).
constexpr double kMaxRelError = 1e-5;

struct RandomCase {
  Heads heads;
  int64_t m;
  int64_t k;
};
std::string random_name(const RandomCase& c) {
  return std::string(c.heads.name) + "_M" + std::to_string(c.m) + "_K" + std::to_string(c.k);
}
class Sm90Random : public ::testing::TestWithParam<RandomCase> {};

TEST_P(Sm90Random, GemmErrorAndEpilogueOnTap) {
  M3QKV_REQUIRE_SM90();
  print_seed_once();
  const RandomCase& c = GetParam();
  const Problem p = make_problem(config(c.heads, c.m, c.k, /*exact=*/false, 128));
  const std::vector<double> ref =
      m3qkv::golden::mxfp8_acc_f64(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  // Variant A on its own plan, then on the prefill instances' tiles (BM 128,
  // no split-K), then the two prefill instances: the same wgmma chain over
  // the same bf16 operands, so their taps must agree with A's on BM 128 bit
  // for bit (checked after the loop).
  std::vector<Sm90Run> runs{Sm90Run{}};
  Sm90Run a128;
  a128.block_m = 128;
  runs.push_back(a128);
  runs.push_back(pre_a_run());
  runs.push_back(prefill_run());
  std::vector<std::vector<float>> taps;
  for (const Sm90Run& run : runs) {
    {
      const int v = run.variant;
      SCOPED_TRACE(run_name(run));
      Fetched got;
      std::vector<float> tap;
      ASSERT_NO_FATAL_FAILURE(run_sm90(p, in, run, 0, &got, &tap));
      ASSERT_EQ(tap.size(), ref.size());
      const ErrorFigure e = relative_error(tap.data(), ref.data(), ref.size());
      RecordProperty(std::string("gemm_rel_error_sm90_") + variant_name(v), std::to_string(e.rel_fro));
      std::printf("[ gemm ] sm90 %s %s: |acc-ref|/|ref| = %.3e, max|err|/max|ref| = %.3e, non-finite %" PRId64 "\n",
                  variant_name(v), random_name(c).c_str(), e.rel_fro, e.max_abs_over_max_ref, e.non_finite);
      EXPECT_EQ(e.non_finite, 0) << "the tap holds non-finite entries (unwritten?)";
      EXPECT_LE(e.rel_fro, kMaxRelError);
      HostOutputs want = poisoned_host_outputs(p, 0);
      golden_epilogue(p, tap.data(), &want);
      expect_same_outputs(p, want, got, "random " + random_name(c) + " [" + variant_name(v) + "] epilogue on tap");
      taps.push_back(std::move(tap));
    }
  }
  ASSERT_EQ(taps.size(), runs.size());
  const std::vector<float>& ta = taps[taps.size() - 3];
  for (size_t r = taps.size() - 2; r < taps.size(); ++r) {
    int64_t first = -1;
    const int64_t bad = count_f32_mismatch(taps[r].data(), ta.data(), ta.size(), &first);
    EXPECT_EQ(bad, 0) << variant_name(runs[r].variant)
                      << ": the accumulator differs from variant A's (BM 128, no split) in " << bad
                      << " entries; first " << first;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Sm90Random,
                         ::testing::Values(RandomCase{kTP4, 129, 6144}, RandomCase{kTP4, 1, 6144},
                                           RandomCase{kTP8, 300, 1024}, RandomCase{kDense, 64, 2048}),
                         [](const ::testing::TestParamInfo<RandomCase>& i) { return random_name(i.param); });

// ------------------------------------------------------ dequantizer (A)
// out[s·256 + b] = bf16 bits of dequant(e4m3 byte b, e8m0 scale s), through
// dequant16_e4m3_to_bf16 (the transform of variant A and the one-launch
// paths' conversion, sm90/convert_sm90.cuh).
__global__ void dequant_all_kernel(uint16_t* out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t s = blockIdx.x;         // scale byte
  const uint32_t b0 = threadIdx.x * 16;  // 16 consecutive e4m3 bytes
  uint32_t w[4];
  for (int i = 0; i < 4; ++i)
    w[i] = (b0 + 4 * i) | ((b0 + 4 * i + 1) << 8) | ((b0 + 4 * i + 2) << 16) | ((b0 + 4 * i + 3) << 24);
  uint4 lo, hi;
  m3qkv::sm90::dequant16_e4m3_to_bf16(make_uint4(w[0], w[1], w[2], w[3]), s, &lo, &hi);
  const uint32_t o[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  for (int i = 0; i < 8; ++i) {
    out[s * 256 + b0 + 2 * i] = static_cast<uint16_t>(o[i] & 0xffffu);
    out[s * 256 + b0 + 2 * i + 1] = static_cast<uint16_t>(o[i] >> 16);
  }
#else
  (void)out;
#endif
}

TEST(Sm90Dequant, AllBytesAllScalesExactWhereBf16CanHoldTheProduct) {
  M3QKV_REQUIRE_SM90();
  DeviceBuffer d(256 * 256 * sizeof(uint16_t));
  CUDA_OK(d.error());
  CUDA_OK(cudaMemset(d.get(), 0xFF, d.size()));
  dequant_all_kernel<<<256, 16>>>(d.as<uint16_t>());
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint16_t> got;
  CUDA_OK(d.download_as(&got));
  int64_t checked = 0, bad = 0;
  for (int s = 0; s < 255; ++s) {  // 0xFF: NaN scale, outside the domain (docs/sm90.md)
    for (int b = 0; b < 256; ++b) {
      if ((b & 0x7f) == 0x7f) continue;  // e4m3 NaN: outside the domain
      const double v = static_cast<double>(m3qkv::e4m3_to_f32(static_cast<uint8_t>(b))) *
                       static_cast<double>(m3qkv::e8m0_to_f32(static_cast<uint8_t>(s)));
      const float f =
          static_cast<float>(v);  // exact: a 4-bit significand times a power of two in f32 range? checked next
      if (static_cast<double>(f) != v) continue;  // below f32's range: bf16 cannot hold it either
      const uint16_t want = m3qkv::f32_to_bf16_rn_soft(f);
      if (static_cast<double>(m3qkv::bf16_to_f32(want)) != v) continue;  // not representable in bf16
      ++checked;
      const uint16_t g = got[size_t(s) * 256 + size_t(b)];
      // +-0: the sign of a zero product is that of the e4m3 byte.
      if (g != want) {
        if (++bad <= 10)
          ADD_FAILURE() << "dequant(byte 0x" << std::hex << b << ", scale 0x" << s << ") = 0x" << g << ", want 0x"
                        << want << std::dec;
      }
    }
  }
  EXPECT_EQ(bad, 0);
  // The domain is not vacuous: every byte with scales 2^-100 .. 2^100 is in it.
  EXPECT_GE(checked, int64_t(201) * 254);
}

// ---------------------------------------------------------------- timing
// Measurements where the lead runs the suite (disabled by default; they fail
// only when a launch fails):
//   m3qkv_gpu_tests --gtest_also_run_disabled_tests --gtest_filter='Sm90Timing.*'
// (cudaEvent timing of back-to-back launches after 3 warm-ups, warm L2; the
// bench has the cold-L2 graph figures.)
// Decode sizes: split-K cluster sizes of variant A side by side.
TEST(Sm90Timing, DISABLED_SplitK_TP4_SmallM_K6144) {
  M3QKV_REQUIRE_SM90();
  print_seed_once();
  for (int64_t m : {1, 64, 128, 512}) {
    const Problem p = make_problem(config(kTP4, m, 6144, /*exact=*/false, 128));
    OnDevice od;
    ASSERT_NO_FATAL_FAILURE(od.init(p));
    Stream s;
    CUDA_OK(s.error());
    Event e0, e1;
    CUDA_OK(e0.error());
    CUDA_OK(e1.error());
    if (m == 1) {
      std::printf("[ time ] sm90 A max active clusters of 2..8:");
      for (int sp = 2; sp <= m3qkv::kSm90MaxSplit; ++sp) std::printf(" %d", sm90_clusters(od.dev, sp));
      std::printf("\n");
    }
    for (int split : {1, 0, 2, 3, 4, 6, 8}) {
      const int v = m3qkv::kSm90Bf16Dequant;
      for (int i = 0; i < 3; ++i) M3QKV_OK(sm90_variant_call(od.a, od.dev, nullptr, s.get(), v, 0, split));
      CUDA_OK(cudaEventRecord(e0.get(), s.get()));
      constexpr int kIters = 50;
      for (int i = 0; i < kIters; ++i) M3QKV_OK(sm90_variant_call(od.a, od.dev, nullptr, s.get(), v, 0, split));
      CUDA_OK(cudaEventRecord(e1.get(), s.get()));
      CUDA_OK(cudaEventSynchronize(e1.get()));
      float ms = 0.f;
      CUDA_OK(cudaEventElapsedTime(&ms, e0.get(), e1.get()));
      std::printf("[ time ] sm90 A TP4 M%lld K6144 split %d: %.1f us\n", static_cast<long long>(m), split,
                  1e3 * double(ms) / kIters);
    }
  }
}

// The three tile-kernel instances on the same 128-row plan at M = 4096 (TP4,
// K = 6144): A, A with pre-converted activations, the prefill kernel.
TEST(Sm90Timing, DISABLED_TileInstances_TP4_M4096_K6144) {
  M3QKV_REQUIRE_SM90();
  print_seed_once();
  const Problem p = make_problem(config(kTP4, 4096, 6144, /*exact=*/false, 128));
  OnDevice od;
  ASSERT_NO_FATAL_FAILURE(od.init(p));
  Stream s;
  CUDA_OK(s.error());
  Event e0, e1;
  CUDA_OK(e0.error());
  CUDA_OK(e1.error());
  const double flop = 2.0 * double(p.m) * double(p.n()) * double(p.k);
  for (int v : {m3qkv::kSm90Bf16Dequant, m3qkv::kSm90Bf16DequantPreA, m3qkv::kSm90Bf16Prefill}) {
    for (int i = 0; i < 3; ++i) M3QKV_OK(sm90_variant_call(od.a, od.dev, nullptr, s.get(), v, 128));
    CUDA_OK(cudaEventRecord(e0.get(), s.get()));
    constexpr int kIters = 20;
    for (int i = 0; i < kIters; ++i) M3QKV_OK(sm90_variant_call(od.a, od.dev, nullptr, s.get(), v, 128));
    CUDA_OK(cudaEventRecord(e1.get(), s.get()));
    CUDA_OK(cudaEventSynchronize(e1.get()));
    float ms = 0.f;
    CUDA_OK(cudaEventElapsedTime(&ms, e0.get(), e1.get()));
    const double us = 1e3 * double(ms) / kIters;
    std::printf("[ time ] sm90 %s TP4 M4096 K6144: %.1f us, %.1f TFLOP/s\n", variant_name(v), us,
                flop / (us * 1e-6) / 1e12);
    RecordProperty(std::string("us_") + variant_name(v), std::to_string(us));
  }
}

// Where one call's time goes (the automatic choice: variant A, or its prefill
// instance from M = 512, whose timeline is that of the GEMM kernel): per-CTA %globaltimer
// stamps of sm90::TraceEvent (sm90.h), printed as percentiles over the CTAs
// relative to the earliest kernel entry, for one call after an L2 flush
// (cold weights, as in serving) and one warm call. A measurement, not a check.
template <bool kHave = kBuiltSm90>
void sm90_trace(uint64_t* buf, int ctas) {
  if constexpr (kHave) m3qkv::sm90_set_trace(buf, ctas);
}

TEST(Sm90Timing, DISABLED_Timeline_TP4) {
  M3QKV_REQUIRE_SM90();
  print_seed_once();
  constexpr int kCtas = 1024;
  DeviceBuffer trace(size_t(kCtas) * m3qkv::kTraceEvents * sizeof(uint64_t));
  CUDA_OK(trace.error());
  DeviceBuffer flush(size_t(256) << 20);  // > 50 MiB L2
  CUDA_OK(flush.error());
  const char* names[] = {"entry", "pdl_wait_done", "producer_start", "xf_first_raw", "xf_done",
                         "cons_first_bf", "cons_main_done", "cons_reduced", "cons_epi_done", "exit"};
  for (int64_t m : {1, 64, 512, 4096}) {
    const Problem p = make_problem(config(kTP4, m, 6144, /*exact=*/false, 128));
    DeviceInputs in;
    CUDA_OK(in.upload(p));
    DeviceOutputs d;
    CUDA_OK(d.init(p, 0));
    m3qkv_fused_args a = p.args_with(in.mapper(), d.ptrs());
    m3qkv::DeviceInfo dev;
    M3QKV_OK(m3qkv::current_device_info(&dev));
    Stream s;
    CUDA_OK(s.error());
    Event e0, e1;
    CUDA_OK(e0.error());
    CUDA_OK(e1.error());
    for (int cold = 1; cold >= 0; --cold) {
      for (int i = 0; i < 3; ++i)
        M3QKV_OK(sm90_variant_call(a, dev, nullptr, s.get(), m3qkv::kSm90AutoVariant, 0));
      if (cold) CUDA_OK(cudaMemsetAsync(flush.get(), cold, flush.size(), s.get()));
      CUDA_OK(cudaMemsetAsync(trace.get(), 0, trace.size(), s.get()));
      sm90_trace(trace.as<uint64_t>(), kCtas);
      CUDA_OK(cudaEventRecord(e0.get(), s.get()));
      M3QKV_OK(sm90_variant_call(a, dev, nullptr, s.get(), m3qkv::kSm90AutoVariant, 0));
      CUDA_OK(cudaEventRecord(e1.get(), s.get()));
      sm90_trace(nullptr, 0);
      CUDA_OK(cudaEventSynchronize(e1.get()));
      float ms = 0.f;
      CUDA_OK(cudaEventElapsedTime(&ms, e0.get(), e1.get()));
      std::vector<uint64_t> t;
      CUDA_OK(trace.download_as(&t));
      int ctas = 0;
      uint64_t t0 = ~0ull;
      for (int c = 0; c < kCtas; ++c)
        if (t[size_t(c) * m3qkv::kTraceEvents + m3qkv::kTrEntry] != 0) {
          ++ctas;
          t0 = std::min(t0, t[size_t(c) * m3qkv::kTraceEvents + m3qkv::kTrEntry]);
        }
      std::printf("[ trace ] TP4 M%lld K6144 %s L2: call %.1f us (events), %d CTAs traced\n",
                  static_cast<long long>(m), cold ? "cold" : "warm", 1e3 * double(ms), ctas);
      ASSERT_GT(ctas, 0);
      for (int ev = 0; ev <= m3qkv::kTrExit; ++ev) {
        std::vector<double> v;
        for (int c = 0; c < kCtas; ++c) {
          const uint64_t x = t[size_t(c) * m3qkv::kTraceEvents + ev];
          if (t[size_t(c) * m3qkv::kTraceEvents + m3qkv::kTrEntry] != 0 && x != 0) v.push_back(1e-3 * double(x - t0));
        }
        if (v.empty()) {
          std::printf("[ trace ]   %-15s (no CTA)\n", names[ev]);
          continue;
        }
        std::sort(v.begin(), v.end());
        std::printf("[ trace ]   %-15s n %4zu  min %8.2f  p50 %8.2f  p90 %8.2f  max %8.2f us\n", names[ev], v.size(),
                    v.front(), v[v.size() / 2], v[v.size() * 9 / 10], v.back());
      }
    }
  }
}

// -------------------------------------------------------- through the API
TEST(Sm90Api, ForcedBackendMatchesGolden_TP4_M129) {
  M3QKV_REQUIRE_SM90();
  print_seed_once();
  const Problem p = make_problem(config(kTP4, 129, 512, /*exact=*/true));
  const std::vector<float> acc =
      m3qkv::golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  DeviceOutputs d;
  CUDA_OK(d.init(p, 0));
  m3qkv_fused_args a = p.args_with(in.mapper(), d.ptrs());
  Stream s;
  CUDA_OK(s.error());
  const m3qkv_status st = m3qkv_testing_fused_qkv(&a, nullptr, M3QKV_BACKEND_SM90, s.get());
  if (st == M3QKV_ERROR_UNSUPPORTED_DEVICE)
    GTEST_SKIP() << "this build has no SM90 kernel (M3QKV_HAVE_SM90_KERNEL undefined): "
                 << m3qkv_last_error();
  ASSERT_EQ(st, M3QKV_SUCCESS) << m3qkv_last_error();
  CUDA_OK(cudaStreamSynchronize(s.get()));
  Fetched got;
  CUDA_OK(fetch_outputs(d, &got));
  HostOutputs want = poisoned_host_outputs(p, 0);
  golden_epilogue(p, acc.data(), &want);
  expect_same_outputs(p, want, got, "API forced SM90 TP4_M129");
}

}  // namespace
