// The SM100 (tcgen05) kernel run on an H100/H200 through the tcgen05 emulation
// (issue 6, docs/emulation.md): the same kernel source built for sm_90a with
// src/sm100/emu/ replacing Tensor Memory, the tensor core and the SM100-only TMA
// forms, forced with m3qkv_testing_fused_qkv(..., M3QKV_BACKEND_SM100, ...).
//
//  - Sm100EmuExact: exact data (acc exact on any hardware), every output byte
//    and the tap accumulator equal to the golden model, both poison salts;
//    cta_group 1 and 2 × TP1/TP2/TP4/TP8/dense × M ∈ {1, 129, 256, 640}, K and
//    block size (16, 128) and PDL rotating, slot −1 / out-of-range slots, and
//    `grid` overrides smaller than the tile count (every CTA loops over many
//    tiles: both TMEM accumulators, the 32-column overlap at cta_group 2).
//    After every run no emulated TMEM column may still be allocated. (Since
//    issue 15 the M = 1 cases at cta_group 1 run the decode variant, which
//    the API picks for M <= 128 unless cta_group is 2: this sweep then checks
//    that routing; tests/gpu/test_sm100_decode_emu.cu tests the variant.)
//  - Sm100EmuCacheFormats: FP8 / BF16 KV and index caches (docs/contract.md §4.3), both
//    cta_groups, interleaved / head-major / padded layouts, mixed with NVFP4.
//  - Sm100EmuLaunch: back-to-back PDL launches (the successor's prologue,
//    incl. its TMEM allocation, overlaps the predecessor), grouped-M
//    rasterization (weights larger than half the L2).
//  - Sm100EmuModel: the model's own bookkeeping on small test kernels (any
//    build, CC 9.0): a correct alloc / ld / dealloc sequence runs; a bad nCols,
//    a double alloc, an ld outside the warp's lane quarter and a TMEM leak
//    (a kernel exiting without dealloc, detected when the next kernel
//    allocates on the same SMs) trap.
//  - Sm100EmuMmaUnit: one block-scaled MMA pair on operands laid out by the
//    test itself (no swizzle with LBO/SBO, 128B swizzle with a K slice inside
//    the atom, 64B swizzle; negate A; E5M2 B; SF ids 0 and 1 with accumulate)
//    against a host reference (any build, CC 9.0).
//  - Sm100EmuNegative: a fault mask XORed into one descriptor field inside the
//    emulated instructions (test hook m3qkv_emu_set_fault) must change the
//    accumulator (SF ids, swizzle mode 128B -> 64B, SF source SBO 128 -> 64 B) or make the
//    launch trap (bit 46 of the fixed 0b001 field, a reserved swizzle code, the
//    scale type); the trapping ones run in a child process (death test: a
//    trap leaves the CUDA context unusable).
//
// The kernel tests (Exact, Launch, Negative) are skipped unless the library
// was built with -DM3QKV_TCGEN05_EMULATION=ON (the hooks below are then linked
// in) and the device is CC 9.0; Model and MmaUnit only need a CC 9.0 device.
#include <gtest/gtest.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <ostream>
#include <random>
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
#include "sm100/emu/tcgen05_emu.cuh"  // unit tests of the model itself (misuse traps)

// Test hooks of the emulation build (src/sm100/emu/tcgen05_emu.cuh); weak, so this
// file links against a normal build too (they are then null and the tests skip).
extern "C" {
__attribute__((weak)) int m3qkv_emu_present(void);
__attribute__((weak)) int m3qkv_emu_set_fault(unsigned long long a_desc_xor, unsigned long long b_desc_xor,
                                              unsigned long long sf_desc_xor, unsigned int idesc_xor);
__attribute__((weak)) int m3qkv_emu_tmem_leaks(void);
}

namespace {

using namespace m3qkv_gpu;
using m3qkv_test::make_problem;

bool emulation_build() { return m3qkv_emu_present != nullptr && m3qkv_emu_present() == 1; }

#define M3QKV_REQUIRE_EMULATION()                                                                               \
  do {                                                                                                          \
    M3QKV_REQUIRE_GPU();                                                                                        \
    if (!emulation_build()) GTEST_SKIP() << "library built without M3QKV_TCGEN05_EMULATION: emulation skipped"; \
    if (::m3qkv_gpu::device_cc() != 90)                                                                         \
      GTEST_SKIP() << "tcgen05 emulation runs on CC 9.0 only (device CC " << ::m3qkv_gpu::device_cc() << ")";  \
  } while (0)

int total_heads(const Heads& h) { return h.nq + 2 * h.nkv + h.niq + h.nik; }

struct EmuCase {
  Heads heads;
  int64_t m, k;
  int cta_group;
  int block_size;
  int pdl;
  int grid;  // 0 = persistent default
  bool oor;  // out-of-range slots / positions
};

std::string case_name(const EmuCase& c) {
  std::string s = std::string(c.heads.name) + "_M" + std::to_string(c.m) + "_K" + std::to_string(c.k) + "_CG" +
                  std::to_string(c.cta_group) + "_B" + std::to_string(c.block_size) + "_pdl" + std::to_string(c.pdl);
  if (c.grid) s += "_grid" + std::to_string(c.grid);
  if (c.oor) s += "_OutOfRange";
  return s;
}
void PrintTo(const EmuCase& c, std::ostream* os) { *os << case_name(c); }

m3qkv_test::ProblemConfig to_config(const EmuCase& c) {
  m3qkv_test::ProblemConfig cfg;
  cfg.m = c.m;
  cfg.k = c.k;
  cfg.nq = c.heads.nq;
  cfg.nkv = c.heads.nkv;
  cfg.niq = c.heads.niq;
  cfg.nik = c.heads.nik;
  cfg.block_size = c.block_size;
  cfg.exact_data = true;
  cfg.slot_skip_fraction = c.oor ? 0.25 : 0.125;  // slot −1 entries in every case
  cfg.out_of_range_slots = c.oor;
  cfg.out_of_range_positions = c.oor;
  return cfg;
}

std::vector<EmuCase> emu_cases() {
  std::vector<EmuCase> v;
  const Heads all[] = {kTP1, kTP2, kTP4, kTP8, kDense};
  const int64_t ms[] = {1, 129, 256, 640};
  const int64_t ks[] = {128, 256, 512};
  const int blocks[] = {16, 128};
  int i = 0;
  for (int cg : {1, 2})
    for (const Heads& h : all)
      for (int64_t m : ms) {
        // K ≤ 256 where M·N is large keeps the golden GEMM and the model fast.
        const int64_t k = m * total_heads(h) * 128 >= (int64_t(1) << 22) && ks[i % 3] > 256 ? 256 : ks[i % 3];
        v.push_back({h, m, k, cg, blocks[(i / 3) % 2], i % 2, 0, false});
        ++i;
      }
  // Grid overrides smaller than the tile count: every CTA (pair) runs many
  // tiles, so both accumulators alternate and (cta_group 2) the overlap
  // columns are handed from one tile to the next many times.
  v.push_back({kTP4, 640, 256, 1, 16, 0, 3, false});    // 100 tiles on 3 CTAs
  v.push_back({kTP4, 640, 256, 1, 128, 1, 7, false});   // 7 CTAs, PDL
  v.push_back({kTP8, 640, 384, 2, 16, 0, 4, false});    // 3 × 6 pair tiles on 2 pairs
  v.push_back({kTP2, 256, 256, 2, 128, 1, 2, false});   // 20 pair tiles (phantom head) on 1 pair, PDL
  v.push_back({kDense, 129, 512, 2, 16, 1, 6, false});  // 2 × 10 pair tiles on 3 pairs
  // Out-of-range slots / positions (flags, nothing written outside).
  v.push_back({kTP4, 129, 256, 1, 16, 0, 0, true});
  v.push_back({kTP2, 256, 256, 2, 128, 1, 0, true});
  return v;
}

void expect_no_tmem_leak(const std::string& what) {
  const int leaks = m3qkv_emu_tmem_leaks();
  EXPECT_EQ(leaks, 0) << what << ": emulated Tensor Memory still allocated on " << leaks
                      << " SM(s) after the kernel completed (negative: CUDA error)";
}

// Runs case c on the SM100 backend (both salts; tap on salt 0) and compares
// against the golden outputs built on the exact accumulator `acc`.
void run_and_compare(const m3qkv_test::Problem& p, const DeviceInputs& in, const EmuCase& c,
                     const std::vector<float>& acc) {
  for (int salt = 0; salt < 2; ++salt) {
    SCOPED_TRACE(case_name(c) + ", poison salt " + std::to_string(salt));
    FusedRun run;
    run.backend = M3QKV_BACKEND_SM100;
    run.tap = salt == 0;
    run.cta_group = c.cta_group;
    run.grid = c.grid;
    run.use_pdl = c.pdl;
    Fetched got;
    std::vector<float> tap;
    ASSERT_NO_FATAL_FAILURE(run_fused(p, in, run, salt, &got, &tap));
    HostOutputs want = poisoned_host_outputs(p, salt);
    golden_epilogue(p, acc.data(), &want);
    expect_same_outputs(p, want, got, case_name(c) + " [sm100 emulated]");
    if (run.tap) {
      ASSERT_EQ(tap.size(), acc.size());
      int64_t first = -1;
      const int64_t bad = count_f32_mismatch(tap.data(), acc.data(), acc.size(), &first);
      EXPECT_EQ(bad, 0) << "tap accumulator differs from the exact golden accumulator in " << bad << " entries; first ["
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
    expect_no_tmem_leak(case_name(c));
    if (::testing::Test::HasFailure()) return;
  }
}

// ------------------------------------------------------------ exact sweep
class Sm100EmuExact : public ::testing::TestWithParam<EmuCase> {};

TEST_P(Sm100EmuExact, BitExactVsGolden) {
  M3QKV_REQUIRE_EMULATION();
  print_seed_once();
  const EmuCase& c = GetParam();
  const m3qkv_test::Problem p = make_problem(to_config(c));
  const std::vector<float> acc =
      m3qkv::golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  CUDA_OK(cudaError_t(m3qkv_emu_set_fault(0, 0, 0, 0)));
  run_and_compare(p, in, c, acc);
}

INSTANTIATE_TEST_SUITE_P(Sweep, Sm100EmuExact, ::testing::ValuesIn(emu_cases()),
                         [](const ::testing::TestParamInfo<EmuCase>& i) { return case_name(i.param); });

// ------------------------------------------------------------ launches
// Two dependent launches with PDL on one stream, both cta_groups: the second
// kernel's prologue (barrier init, TMEM allocation on the same SMs) overlaps
// the first one's teardown; the emulated allocator blocks until the first
// kernel deallocated, as the hardware does. Both results must be exact.
TEST(Sm100EmuLaunch, BackToBackPdlBothCtaGroups) {
  M3QKV_REQUIRE_EMULATION();
  print_seed_once();
  CUDA_OK(cudaError_t(m3qkv_emu_set_fault(0, 0, 0, 0)));
  for (int cg : {1, 2}) {
    const EmuCase c{kTP4, 256, 256, cg, 16, 1, 0, false};
    const m3qkv_test::Problem p = make_problem(to_config(c));
    const auto acc = m3qkv::golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
    DeviceInputs in;
    CUDA_OK(in.upload(p));
    DeviceOutputs d1, d2;
    CUDA_OK(d1.init(p, 0));
    CUDA_OK(d2.init(p, 1));
    m3qkv_fused_args a1 = p.args_with(in.mapper(), d1.ptrs());
    m3qkv_fused_args a2 = p.args_with(in.mapper(), d2.ptrs());
    a1.use_pdl = a2.use_pdl = 1;
    a1.cta_group = a2.cta_group = cg;
    Stream s;
    CUDA_OK(s.error());
    for (int rep = 0; rep < 3; ++rep) {
      ASSERT_EQ(m3qkv_testing_fused_qkv(&a1, nullptr, M3QKV_BACKEND_SM100, s.get()), M3QKV_SUCCESS);
      ASSERT_EQ(m3qkv_testing_fused_qkv(&a2, nullptr, M3QKV_BACKEND_SM100, s.get()), M3QKV_SUCCESS);
    }
    CUDA_OK(cudaStreamSynchronize(s.get()));
    for (int salt = 0; salt < 2; ++salt) {
      Fetched got;
      CUDA_OK(fetch_outputs(salt == 0 ? d1 : d2, &got));
      HostOutputs want = poisoned_host_outputs(p, salt);
      golden_epilogue(p, acc.data(), &want);
      expect_same_outputs(p, want, got, "back-to-back PDL, cta_group " + std::to_string(cg));
    }
    expect_no_tmem_leak("back-to-back PDL");
  }
}

// Grouped-M rasterization: the launcher picks group_m > 1 when the weights
// exceed half the L2 (launch_sm100.cu choose_group_m); K is chosen so that
// TP4's weights (2560 rows) do, and M spans two m-tiles (kept small: the
// golden GEMM and the one-thread emulated MMA are slow at this K).
TEST(Sm100EmuLaunch, GroupedMRasterization) {
  M3QKV_REQUIRE_EMULATION();
  print_seed_once();
  int dev = 0, l2 = 0;
  CUDA_OK(cudaGetDevice(&dev));
  CUDA_OK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  const int64_t n = int64_t(total_heads(kTP4)) * 128;
  int64_t k = ((int64_t(l2) / 2) / n / 128 + 2) * 128;  // n·k > L2 / 2
  CUDA_OK(cudaError_t(m3qkv_emu_set_fault(0, 0, 0, 0)));
  for (int cg : {1, 2}) {
    const EmuCase c{kTP4, cg == 1 ? 129 : 257, k, cg, 16, 1, 0, false};
    SCOPED_TRACE(case_name(c));
    ASSERT_GT(n * k, int64_t(l2) / 2);
    const m3qkv_test::Problem p = make_problem(to_config(c));
    const auto acc = m3qkv::golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
    DeviceInputs in;
    CUDA_OK(in.upload(p));
    run_and_compare(p, in, c, acc);
  }
}

// ------------------------------------------------------- cache formats
// FP8 / BF16 KV and index caches (docs/contract.md §4.3) through the SM100
// kernel's epilogue (epi::epilogue_head_row on the TMEM row in registers),
// both cta_groups, exact data, both salts, against the golden model.
// Layouts: two token-major tensors with padded rows; one interleaved
// [nb, 2, bs, nkv, 128] allocation; head-major pages; mixed with NVFP4.
struct EmuFmtCase {
  EmuCase base;
  int kv, ix;
  bool head_major, interleaved;
  int64_t row_pad;
};
std::string fmt_name(int d) { return d == 0 ? "nvfp4" : (d == 1 ? "fp8" : "bf16"); }
std::string fmt_case_name(const EmuFmtCase& c) {
  return case_name(c.base) + "_kv" + fmt_name(c.kv) + "_ix" + fmt_name(c.ix) + (c.head_major ? "_HeadMajor" : "") +
         (c.interleaved ? "_Interleaved" : "") + (c.row_pad ? "_RowPad" + std::to_string(c.row_pad) : "");
}
void PrintTo(const EmuFmtCase& c, std::ostream* os) { *os << fmt_case_name(c); }

std::vector<EmuFmtCase> emu_fmt_cases() {
  std::vector<EmuFmtCase> v;
  for (int cg : {1, 2}) {
    v.push_back({{kTP4, 129, 256, cg, 16, 0, 0, false}, 1, 1, false, false, 16});
    v.push_back({{kTP2, 256, 256, cg, 128, 1, 0, false}, 2, 2, false, true, 0});
    v.push_back({{kTP1, 129, 128, cg, 16, 0, 0, true}, 1, 2, true, false, 0});
    v.push_back({{kTP8, 129, 256, cg, 128, 1, 0, false}, 2, 0, false, true, 32});
    v.push_back({{kDense, 129, 256, cg, 16, 0, 0, false}, 2, 0, true, false, 16});
    v.push_back({{kTP4, 256, 256, cg, 16, 1, 3, false}, 0, 1, false, false, 0});  // NVFP4 KV, fp8 index, small grid
  }
  return v;
}

class Sm100EmuCacheFormats : public ::testing::TestWithParam<EmuFmtCase> {};

TEST_P(Sm100EmuCacheFormats, BitExactVsGolden) {
  M3QKV_REQUIRE_EMULATION();
  print_seed_once();
  const EmuFmtCase& c = GetParam();
  m3qkv_test::ProblemConfig cfg = to_config(c.base);
  cfg.kv_dtype = c.kv;
  cfg.index_dtype = c.ix;
  cfg.kv_head_major = c.head_major;
  cfg.kv_interleaved = c.interleaved;
  cfg.kv_row_pad = c.row_pad;
  cfg.k_scale = 7.0f;
  cfg.v_scale = 0.375f;
  const m3qkv_test::Problem p = make_problem(cfg);
  const std::vector<float> acc =
      m3qkv::golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  CUDA_OK(cudaError_t(m3qkv_emu_set_fault(0, 0, 0, 0)));
  SCOPED_TRACE(fmt_case_name(c));
  run_and_compare(p, in, c.base, acc);
}

INSTANTIATE_TEST_SUITE_P(Formats, Sm100EmuCacheFormats, ::testing::ValuesIn(emu_fmt_cases()),
                         [](const ::testing::TestParamInfo<EmuFmtCase>& i) { return fmt_case_name(i.param); });

// ------------------------------------------------------------ model unit tests
enum class Misuse : int { None = 0, BadNcols = 1, DoubleAlloc = 2, WrongQuarter = 3, Leak = 4 };

// Warp 1 allocates (like the SM100 kernel), every warp of the first warpgroup
// loads 32 columns of its lane quarter, warp 1 deallocates; `misuse` breaks
// one rule.
__global__ void emu_model_kernel(int misuse, uint32_t* out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
  using namespace m3qkv::ptx;
  __shared__ uint32_t tmem_slot;
  const uint32_t warp = threadIdx.x / 32;
  const Misuse mu = static_cast<Misuse>(misuse);
  const uint32_t ncols = mu == Misuse::BadNcols ? 48u : 512u;
  if (warp == 1) {
    tcgen05_alloc<1>(emu::smem_addr(&tmem_slot), ncols);
    if (mu == Misuse::DoubleAlloc) tcgen05_alloc<1>(emu::smem_addr(&tmem_slot), 32);
    tcgen05_relinquish_alloc_permit<1>();
  }
  tcgen05_fence_before_thread_sync();
  __syncthreads();
  tcgen05_fence_after_thread_sync();
  const uint32_t base = *reinterpret_cast<volatile uint32_t*>(&tmem_slot);
  if (warp < 4) {
    const uint32_t quarter = mu == Misuse::WrongQuarter && warp == 2 ? 1u : warp;
    uint32_t r[32];
    tcgen05_ld_32x32b_x32(base + ((32u * quarter) << 16), r);
    tcgen05_wait_ld();
    uint32_t x = 0;
    for (int i = 0; i < 32; ++i) x ^= r[i];
    if (out) out[blockIdx.x * 128 + threadIdx.x] = x;
  }
  tcgen05_fence_before_thread_sync();
  __syncthreads();
  if (warp == 1 && mu != Misuse::Leak) {
    tcgen05_fence_after_thread_sync();
    tcgen05_dealloc<1>(base, ncols);
  }
#endif
}

// One CTA per SM (more than half the shared memory), every SM.
cudaError_t launch_model(int misuse) {
  int dev = 0, sms = 0, smem = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  const int dyn = smem / 2 + 4096;
  if (e == cudaSuccess) e = cudaFuncSetAttribute(emu_model_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dyn);
  if (e != cudaSuccess) return e;
  emu_model_kernel<<<sms, 192, dyn>>>(misuse, nullptr);
  e = cudaGetLastError();
  return e != cudaSuccess ? e : cudaDeviceSynchronize();
}

#define M3QKV_REQUIRE_CC90()                                                                                   \
  do {                                                                                                         \
    M3QKV_REQUIRE_GPU();                                                                                       \
    if (::m3qkv_gpu::device_cc() != 90)                                                                        \
      GTEST_SKIP() << "the model's unit kernels are sm_90a code (device CC " << ::m3qkv_gpu::device_cc() << ")"; \
  } while (0)

// Child process body of the trapping cases (a trap poisons the CUDA context).
void run_model_child(std::initializer_list<int> misuses) {
  for (int mu : misuses) {
    const cudaError_t e = launch_model(mu);
    if (e != cudaSuccess) {
      std::fprintf(stderr, "model kernel failed: misuse %d, %s\n", mu, cudaGetErrorName(e));
      std::exit(3);
    }
  }
  std::exit(0);
}

TEST(Sm100EmuModel, CorrectSequenceRunsTwice) {
  M3QKV_REQUIRE_CC90();
  // Twice: the second kernel allocates on the SMs the first one released.
  CUDA_OK(launch_model(int(Misuse::None)));
  CUDA_OK(launch_model(int(Misuse::None)));
}
TEST(Sm100EmuModel, NonPowerOfTwoColumnsTraps) {
  M3QKV_REQUIRE_CC90();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(run_model_child({int(Misuse::BadNcols)}), ::testing::ExitedWithCode(3), "model kernel failed");
}
TEST(Sm100EmuModel, DoubleAllocTraps) {
  M3QKV_REQUIRE_CC90();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(run_model_child({int(Misuse::DoubleAlloc)}), ::testing::ExitedWithCode(3), "model kernel failed");
}
TEST(Sm100EmuModel, LoadOutsideTheWarpsLaneQuarterTraps) {
  M3QKV_REQUIRE_CC90();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(run_model_child({int(Misuse::WrongQuarter)}), ::testing::ExitedWithCode(3), "model kernel failed");
}
TEST(Sm100EmuModel, LeakedTmemTrapsAtTheNextAllocation) {
  M3QKV_REQUIRE_CC90();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // The leaking kernel itself completes; the next one finds every SM's 512
  // columns still allocated and traps after the model's 4 s timeout.
  EXPECT_EXIT(run_model_child({int(Misuse::Leak), int(Misuse::None)}), ::testing::ExitedWithCode(3),
              "model kernel failed: misuse 0");
}

// One block-scaled MMA pair on operands laid out by this test (not by the
// kernel or desc.h): no swizzle (core matrices, LBO/SBO), 128B swizzle with the
// K slice 32 bytes into the atom, 64B swizzle; N = 16; SF ids 0 then 1 with
// accumulate; negate A; E5M2 B. D read back with tcgen05.ld and compared
// exactly with a host reference (values chosen so every sum is exact).
struct MmaUnit {
  int layout;  // 0 none, 1 SW128 (slice at byte 32 of the atom), 2 SW64
  bool neg_a;
  int fmt_b;   // 0 e4m3, 1 e5m2
};
constexpr int kUnitN = 16;

[[maybe_unused]] __host__ __device__ inline uint32_t unit_swizzle_bytes(int layout) { return layout == 1 ? 128u : layout == 2 ? 64u : 0u; }
// Byte offset of (row r, k byte kb < 32) of a K-major operand in this test's layouts.
[[maybe_unused]] __host__ __device__ inline uint32_t unit_offset(int layout, uint32_t r, uint32_t kb) {
  if (layout == 0) return (r / 8) * 256u + (kb / 16) * 128u + (r % 8) * 16u + kb % 16;  // SBO 256, LBO 128
  const uint32_t w = unit_swizzle_bytes(layout), mask = layout == 1 ? 7u : 3u;
  const uint32_t slice = layout == 1 ? 32u : 0u;
  const uint32_t lin = (r / 8) * (8 * w) + (r % 8) * w + slice + kb;  // SBO = 8 rows
  return lin ^ (((lin >> 7) & mask) << 4);
}
[[maybe_unused]] __host__ __device__ inline uint64_t unit_desc(uint32_t addr, int layout) {
  const uint64_t start = (addr & 0x3FFFFu) >> 4;
  const uint32_t w = unit_swizzle_bytes(layout);
  const uint64_t lbo = layout == 0 ? 128u >> 4 : 0u;
  const uint64_t sbo = layout == 0 ? 256u >> 4 : (8u * w) >> 4;
  const uint64_t swz = layout == 0 ? 0u : layout == 1 ? 2u : 4u;
  const uint64_t slice = layout == 1 ? 32u >> 4 : 0u;
  return (start + slice) | (lbo << 16) | (sbo << 32) | (1ull << 46) | (swz << 61);
}
// Table 43 fields, written here independently of src/sm100/desc.h.
[[maybe_unused]] __host__ __device__ inline uint32_t unit_idesc(uint32_t sf_id, bool neg_a, int fmt_b) {
  return (sf_id << 4) | (0u << 7) | (uint32_t(fmt_b) << 10) | (uint32_t(neg_a) << 13) | ((kUnitN >> 3) << 17) |
         (1u << 23) | ((128u >> 7) << 27) | (sf_id << 29);
}

__global__ void emu_mma_unit_kernel(const uint8_t* a_g, const uint8_t* b_g, const uint8_t* sfa_g, const uint8_t* sfb_g,
                                    MmaUnit u, float* out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
  using namespace m3qkv::ptx;
  __shared__ __align__(1024) uint8_t a_s[16384];
  __shared__ __align__(1024) uint8_t b_s[2048];
  __shared__ __align__(16) uint8_t sfa_s[512], sfb_s[512];
  __shared__ __align__(8) uint64_t bar;
  __shared__ uint32_t tmem_slot;
  const uint32_t t = threadIdx.x, warp = t / 32;
  for (uint32_t i = t; i < 128 * 32; i += blockDim.x) a_s[unit_offset(u.layout, i / 32, i % 32)] = a_g[i];
  for (uint32_t i = t; i < kUnitN * 32; i += blockDim.x) b_s[unit_offset(u.layout, i / 32, i % 32)] = b_g[i];
  for (uint32_t i = t; i < 512; i += blockDim.x) {
    sfa_s[i] = sfa_g[i];
    sfb_s[i] = sfb_g[i];
  }
  if (t == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(emu::smem_addr(&bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  if (warp == 0) {
    tcgen05_alloc<1>(emu::smem_addr(&tmem_slot), 32);
    tcgen05_relinquish_alloc_permit<1>();
  }
  tcgen05_fence_before_thread_sync();
  __syncthreads();
  tcgen05_fence_after_thread_sync();
  const uint32_t base = *reinterpret_cast<volatile uint32_t*>(&tmem_slot);
  if (t == 0) {
    const uint64_t sf_desc_a = (uint64_t(emu::smem_addr(sfa_s)) >> 4) | (uint64_t(128 >> 4) << 32) | (1ull << 46);
    const uint64_t sf_desc_b = (uint64_t(emu::smem_addr(sfb_s)) >> 4) | (uint64_t(128 >> 4) << 32) | (1ull << 46);
    tcgen05_cp_32x128b_warpx4<1>(base + 16, sf_desc_a);
    tcgen05_cp_32x128b_warpx4<1>(base + 20, sf_desc_b);
    const uint64_t da = unit_desc(emu::smem_addr(a_s), u.layout), db = unit_desc(emu::smem_addr(b_s), u.layout);
    tcgen05_mma_mxf8f6f4_block_scale<1>(base, da, db, unit_idesc(0, u.neg_a, u.fmt_b), base + 16, base + 20, false);
    tcgen05_mma_mxf8f6f4_block_scale<1>(base, da, db, unit_idesc(1, u.neg_a, u.fmt_b), base + 16, base + 20, true);
    tcgen05_commit<1>(emu::smem_addr(&bar));
  }
  __syncwarp();
  uint32_t ok = 0;
  while (!ok)
    asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n\tselp.u32 %0, 1, 0, p;\n\t}"
                 : "=r"(ok)
                 : "r"(emu::smem_addr(&bar))
                 : "memory");
  tcgen05_fence_after_thread_sync();
  uint32_t r[16];
  tcgen05_ld_32x32b_x16(base + ((32u * warp) << 16), r);
  tcgen05_wait_ld();
  for (int c = 0; c < kUnitN; ++c) out[t * kUnitN + c] = __uint_as_float(r[c]);
  tcgen05_fence_before_thread_sync();
  __syncthreads();
  if (warp == 0) {
    tcgen05_fence_after_thread_sync();
    tcgen05_dealloc<1>(base, 32);
  }
#endif
}

float e5m2_to_f32_host(uint8_t b) {  // E5M2 = the top byte of an f16
  const int s = b >> 7, e = (b >> 2) & 31, m = b & 3;
  const float mag = e == 0 ? std::ldexp(float(m), -16) : std::ldexp(float(4 + m), e - 17);
  return s ? -mag : mag;
}

void PrintTo(const MmaUnit& u, std::ostream* os) {
  *os << "layout " << u.layout << (u.neg_a ? " negA" : "") << (u.fmt_b ? " e5m2B" : "");
}

class Sm100EmuMmaUnit : public ::testing::TestWithParam<MmaUnit> {};

TEST_P(Sm100EmuMmaUnit, MatchesHostReference) {
  M3QKV_REQUIRE_CC90();
  print_seed_once();
  const MmaUnit u = GetParam();
  std::mt19937_64 rng(m3qkv_test::test_seed() ^ 0x5EED0000u ^ uint64_t(u.layout));
  // Values {0, ±1, ±2} (e4m3 0x38/0x40, e5m2 0x3C/0x40), scales 2^[-2, 2]: every sum exact.
  const uint8_t e4[5] = {0x00, 0x38, 0xB8, 0x40, 0xC0}, e5[5] = {0x00, 0x3C, 0xBC, 0x40, 0xC0};
  std::vector<uint8_t> a(128 * 32), b(kUnitN * 32), sfa(512), sfb(512);
  for (auto& x : a) x = e4[uint32_t(rng()) % 5];
  for (auto& x : b) x = (u.fmt_b ? e5 : e4)[uint32_t(rng()) % 5];
  for (auto& x : sfa) x = uint8_t(125 + uint32_t(rng()) % 5);
  for (auto& x : sfb) x = uint8_t(125 + uint32_t(rng()) % 5);
  // Reference: SF of row m for k block id = byte (m % 32, 4·(m / 32) + id) of the 512-B chunk.
  std::vector<float> want(128 * kUnitN);
  for (int m = 0; m < 128; ++m)
    for (int n = 0; n < kUnitN; ++n) {
      float d = 0.f;
      for (int id = 0; id < 2; ++id) {
        float dot = 0.f;
        for (int k = 0; k < 32; ++k) {
          const float av = m3qkv::e4m3_to_f32(a[m * 32 + k]) * (u.neg_a ? -1.f : 1.f);
          const float bv = u.fmt_b ? e5m2_to_f32_host(b[n * 32 + k]) : m3qkv::e4m3_to_f32(b[n * 32 + k]);
          dot += av * bv;
        }
        const float sa = m3qkv::e8m0_to_f32(sfa[(m % 32) * 16 + 4 * (m / 32) + id]);
        const float sb = m3qkv::e8m0_to_f32(sfb[(n % 32) * 16 + 4 * (n / 32) + id]);
        d += dot * sa * sb;
      }
      want[m * kUnitN + n] = d;
    }
  DeviceBuffer da, db, dsa, dsb, dout;
  CUDA_OK(da.alloc(a.size()));
  CUDA_OK(db.alloc(b.size()));
  CUDA_OK(dsa.alloc(512));
  CUDA_OK(dsb.alloc(512));
  CUDA_OK(dout.alloc(want.size() * sizeof(float)));
  CUDA_OK(cudaMemcpy(da.get(), a.data(), a.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(db.get(), b.data(), b.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dsa.get(), sfa.data(), 512, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dsb.get(), sfb.data(), 512, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dout.get(), 0xFF, want.size() * sizeof(float)));
  emu_mma_unit_kernel<<<1, 128>>>(static_cast<const uint8_t*>(da.get()), static_cast<const uint8_t*>(db.get()),
                                  static_cast<const uint8_t*>(dsa.get()), static_cast<const uint8_t*>(dsb.get()), u,
                                  static_cast<float*>(dout.get()));
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> got(want.size());
  CUDA_OK(cudaMemcpy(got.data(), dout.get(), got.size() * sizeof(float), cudaMemcpyDeviceToHost));
  // The sign of an exact-zero sum is not specified for the MMA (negated A
  // products can sum to -0 in the model where the host's order gives +0): the
  // unit test compares values with -0 == +0, every other bit exactly.
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] == 0.0f && want[i] == 0.0f) got[i] = want[i];
  int64_t first = -1;
  const int64_t bad = count_f32_mismatch(got.data(), want.data(), want.size(), &first);
  EXPECT_EQ(bad, 0) << "first [" << first / kUnitN << ", " << first % kUnitN << "]: got "
                    << (first >= 0 ? got[size_t(first)] : 0.f) << ", expected " << (first >= 0 ? want[size_t(first)] : 0.f);
}

std::vector<MmaUnit> mma_unit_cases() {
  return {MmaUnit{0, false, 0}, MmaUnit{1, false, 0}, MmaUnit{2, true, 1}, MmaUnit{0, true, 1}};
}
std::string mma_unit_name(const ::testing::TestParamInfo<MmaUnit>& i) {
  static const char* const kLayout[] = {"NoSwizzle", "Swizzle128Slice32", "Swizzle64"};
  return std::string(kLayout[i.param.layout]) + (i.param.neg_a ? "_NegA" : "") + (i.param.fmt_b ? "_E5M2B" : "");
}
INSTANTIATE_TEST_SUITE_P(Layouts, Sm100EmuMmaUnit, ::testing::ValuesIn(mma_unit_cases()), mma_unit_name);

// ------------------------------------------------------------ negative
// Descriptor bits (src/sm100/emu/tcgen05_emu.cuh decode; src/sm100/desc.h layout).
constexpr unsigned kIdescSfIds = (1u << 4) | (1u << 29);          // SFB id 0<->1, SFA id 0<->1 (per k slice)
constexpr unsigned long long kSwizzle128To64 = 6ull << 61;        // mode 2 (128B) -> 4 (64B)
// SF source SBO 128 B -> 64 B (rows overlap; stays inside the 512-B chunk: a
// larger SBO would read past the end of the kernel's shared memory).
constexpr unsigned long long kSfSboTo64 = uint64_t(0x08 ^ 0x04) << 32;
constexpr unsigned long long kBit46 = 1ull << 46;                 // fixed 0b001 -> 0b000
constexpr unsigned long long kSwizzleReserved = 1ull << 61;       // mode 2 -> 3 (reserved)
constexpr unsigned kIdescScaleType = 1u << 23;                    // UE8M0 -> UE4M3 (invalid for mxf8f6f4)

// Runs TP8, M = 256, K = 256 (every k slice and both pair CTAs involved) with
// a fault mask and returns the number of accumulator entries that differ.
int64_t mismatches_with_fault(int cg, unsigned long long a_xor, unsigned long long b_xor, unsigned long long sf_xor,
                              unsigned idesc_xor) {
  const EmuCase c{kTP8, 256, 256, cg, 16, 0, 0, false};
  const m3qkv_test::Problem p = make_problem(to_config(c));
  const auto acc = m3qkv::golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
  DeviceInputs in;
  EXPECT_EQ(in.upload(p), cudaSuccess);
  EXPECT_EQ(cudaError_t(m3qkv_emu_set_fault(a_xor, b_xor, sf_xor, idesc_xor)), cudaSuccess);
  FusedRun run;
  run.backend = M3QKV_BACKEND_SM100;
  run.tap = true;
  run.cta_group = cg;
  Fetched got;
  std::vector<float> tap;
  run_fused(p, in, run, 0, &got, &tap);
  EXPECT_EQ(cudaError_t(m3qkv_emu_set_fault(0, 0, 0, 0)), cudaSuccess);
  expect_no_tmem_leak("fault run");
  if (tap.size() != acc.size()) return -1;
  int64_t first = -1;
  return count_f32_mismatch(tap.data(), acc.data(), acc.size(), &first);
}

class Sm100EmuNegative : public ::testing::TestWithParam<int> {};  // cta_group

// Controls: the same run without a fault is exact (so a mismatch below is
// caused by the fault alone).
TEST_P(Sm100EmuNegative, NoFaultControlIsExact) {
  M3QKV_REQUIRE_EMULATION();
  print_seed_once();
  EXPECT_EQ(mismatches_with_fault(GetParam(), 0, 0, 0, 0), 0);
}
TEST_P(Sm100EmuNegative, WrongScaleFactorIdsChangeTheAccumulator) {
  M3QKV_REQUIRE_EMULATION();
  print_seed_once();
  EXPECT_GT(mismatches_with_fault(GetParam(), 0, 0, 0, kIdescSfIds), 0) << "the SF id fields are not read";
}
TEST_P(Sm100EmuNegative, WrongSwizzleModeOfAChangesTheAccumulator) {
  M3QKV_REQUIRE_EMULATION();
  print_seed_once();
  EXPECT_GT(mismatches_with_fault(GetParam(), kSwizzle128To64, 0, 0, 0), 0) << "A's swizzle mode is not read";
}
TEST_P(Sm100EmuNegative, WrongSwizzleModeOfBChangesTheAccumulator) {
  M3QKV_REQUIRE_EMULATION();
  print_seed_once();
  EXPECT_GT(mismatches_with_fault(GetParam(), 0, kSwizzle128To64, 0, 0), 0) << "B's swizzle mode is not read";
}
TEST_P(Sm100EmuNegative, WrongScaleSourceSboChangesTheAccumulator) {
  M3QKV_REQUIRE_EMULATION();
  print_seed_once();
  EXPECT_GT(mismatches_with_fault(GetParam(), 0, 0, kSfSboTo64, 0), 0) << "tcgen05.cp's SBO is not read";
}

// Faults the real instruction rejects: the emulated launch must trap. Run in
// a child process (re-executed test binary) since a trap poisons the context.
void run_trapping_fault(int cg, unsigned long long a_xor, unsigned idesc_xor) {
  const EmuCase c{kTP8, 256, 256, cg, 16, 0, 0, false};
  const m3qkv_test::Problem p = make_problem(to_config(c));
  DeviceInputs in;
  if (in.upload(p) != cudaSuccess) std::exit(10);
  if (m3qkv_emu_set_fault(a_xor, 0, 0, idesc_xor) != 0) std::exit(11);
  DeviceOutputs d;
  if (d.init(p, 0) != cudaSuccess) std::exit(12);
  m3qkv_fused_args a = p.args_with(in.mapper(), d.ptrs());
  a.cta_group = cg;
  const m3qkv_status st = m3qkv_testing_fused_qkv(&a, nullptr, M3QKV_BACKEND_SM100, nullptr);
  const cudaError_t e = cudaDeviceSynchronize();
  if (st != M3QKV_SUCCESS || e != cudaSuccess) {
    std::fprintf(stderr, "emulated launch failed: status %d, %s\n", int(st), cudaGetErrorName(e));
    std::exit(3);
  }
  std::exit(0);  // no trap: the emulation ignored the field
}

TEST_P(Sm100EmuNegative, ClearedBit46Traps) {
  M3QKV_REQUIRE_EMULATION();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(run_trapping_fault(GetParam(), kBit46, 0), ::testing::ExitedWithCode(3), "emulated launch failed");
}
TEST_P(Sm100EmuNegative, ReservedSwizzleCodeTraps) {
  M3QKV_REQUIRE_EMULATION();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(run_trapping_fault(GetParam(), kSwizzleReserved, 0), ::testing::ExitedWithCode(3),
              "emulated launch failed");
}
TEST_P(Sm100EmuNegative, E4M3ScaleTypeTraps) {
  M3QKV_REQUIRE_EMULATION();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(run_trapping_fault(GetParam(), 0, kIdescScaleType), ::testing::ExitedWithCode(3),
              "emulated launch failed");
}

INSTANTIATE_TEST_SUITE_P(CtaGroup, Sm100EmuNegative, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& i) { return "CG" + std::to_string(i.param); });

}  // namespace
