// m3qkv_selftest, the backend override and the warmup's self-test mode on the
// GPU (issue 16). The self-test's own logic (report fields, fault reporting,
// fallback order, cleanup) is also tested on the CPU with scripted CUDA
// (tests/cpu/api_dispatch_tests.h); here it runs the real kernels.
//
//  - Selftest.PassesOnThisDevice: every kernel the build has for the device
//    passes (H200: portable, sm90 tile, sm90 decode), bit-exact with the golden
//    model and the portable kernel; the timing of each kernel is printed and a
//    warm call takes under a second.
//  - Selftest.LeavesNoTrace: after a warm call, more calls leave the free
//    device memory (cudaMemGetInfo), the caller's current device and context
//    and a pending CUDA error exactly as they were.
//  - Selftest.FaultIsReportedForExactlyThatBackend: the test-only fault flips
//    q_out byte 37 of one backend; the report names that backend's kernels,
//    problem, output, offset, the golden byte (checked against the golden
//    model here) and golden ^ mask; the other kernels pass.
//  - Selftest.WarmupFallsBack (child, M3QKV_SELFTEST_ON_WARMUP=1): the fault in
//    the automatic backend makes m3qkv_warmup return
//    M3QKV_WARNING_BACKEND_FALLBACK; m3qkv_backend then says portable and
//    m3qkv_fused_qkv gives the golden bytes; without the fault the next
//    warmup goes back.
//  - Selftest.EnvBackendPortable / EnvBackendUnknown / EnvBackendSm100OnHopper
//    (children with M3QKV_BACKEND set): the override is reported and used, an
//    unknown name or a backend the device cannot run is an error at the call.
//  - Sm100EmuSelftest.PassesForTheEmulatedKernel (tcgen05 emulation build):
//    the emulated SM100 kernel passes at cta_group 1 and 2, no TMEM leaked.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "api/internal.h"
#include "api/selftest.h"
#include "golden/golden.h"
#include "golden/problem.h"
#include "gpu/gpu_util.h"
#include "gpu/harness.h"

#ifndef M3QKV_TCGEN05_EMULATION
#define M3QKV_TCGEN05_EMULATION 0
#endif

// Linked only into a tcgen05 emulation build (src/sm100/emu/tcgen05_emu.cuh).
extern "C" __attribute__((weak)) int m3qkv_emu_tmem_leaks(void);

namespace {

using namespace m3qkv_gpu;
namespace st = m3qkv::selftest;

const char* result_name(int r) {
  switch (r) {
    case M3QKV_SELFTEST_NOT_AVAILABLE: return "not available";
    case M3QKV_SELFTEST_PASS: return "PASS";
    case M3QKV_SELFTEST_FAIL: return "FAIL";
    case M3QKV_SELFTEST_ERROR: return "ERROR";
  }
  return "?";
}

void print_report(const m3qkv_selftest_report& r) {
  std::printf("[ selftest ] device %d CC %d.%d: %s, %d problems, %.1f ms in all\n", r.device, r.cc_major, r.cc_minor,
              m3qkv_status_string(static_cast<m3qkv_status>(r.status)), r.problems, r.total_us / 1000.0);
  for (int i = 0; i < r.num_entries; ++i) {
    const m3qkv_selftest_entry& e = r.entries[i];
    std::printf("[ selftest ]   %-18s %-13s %d problems %8.2f ms  portable_agrees %2d  %s\n", e.name,
                result_name(e.result), e.problems, e.time_us / 1000.0, e.portable_agrees, e.message);
  }
  std::printf("[ selftest ]   %s\n", r.message);
}

m3qkv_status selftest(int device, m3qkv_selftest_report* r) {
  std::memset(r, 0, sizeof(*r));
  r->struct_size = sizeof(*r);
  return m3qkv_selftest(device, r);
}

// The calling thread's current context, through the runtime's driver entry
// point (a direct cuCtxGetCurrent would make the binary need libcuda.so.1 to
// start, and the suite must start and skip on machines without a driver).
CUresult current_context(CUcontext* out) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess || p == nullptr) {
    (void)cudaGetLastError();
    return CUDA_ERROR_NOT_FOUND;
  }
  return reinterpret_cast<PFN_cuCtxGetCurrent_v4000>(p)(out);
}

int current_device() {
  int d = -1;
  return cudaGetDevice(&d) == cudaSuccess ? d : -1;
}

// Whether backend b runs on this device in this build (what the report must say).
bool runs_here(m3qkv_backend_kind b) {
  const int cc = device_cc();
  switch (b) {
    case M3QKV_BACKEND_PORTABLE: return cc >= 80;
    case M3QKV_BACKEND_SM90: return cc == 90 && M3QKV_WITH_SM90;
    case M3QKV_BACKEND_SM100: return M3QKV_WITH_SM100 && (cc / 10 == 10 || (M3QKV_TCGEN05_EMULATION && cc == 90));
    default: return false;
  }
}

int problems_of(int path) {
  int n = 0;
  for (const auto& p : st::problems()) n += st::path_takes(path, p.cfg.m);
  return n;
}

// Clears the test-only fault on every way out of a test.
struct FaultGuard {
  ~FaultGuard() { m3qkv_testing_inject_fault(M3QKV_BACKEND_NONE, nullptr, 0, 0); }
};

TEST(Selftest, PassesOnThisDevice) {
  M3QKV_REQUIRE_GPU();
  const int dev = current_device();
  m3qkv_selftest_report r;
  const m3qkv_status first = selftest(dev, &r);
  print_report(r);
  ASSERT_EQ(first, M3QKV_SUCCESS) << m3qkv_last_error();
  EXPECT_STREQ(m3qkv_last_error(), "");
  const int64_t first_us = r.total_us;
  ASSERT_EQ(selftest(dev, &r), M3QKV_SUCCESS) << m3qkv_last_error();
  print_report(r);
  std::printf("[ selftest ] first call %.1f ms (loads the kernels), second %.1f ms\n", first_us / 1000.0,
              r.total_us / 1000.0);
  EXPECT_EQ(r.status, M3QKV_SUCCESS);
  EXPECT_EQ(r.device, dev);
  EXPECT_EQ(r.cc_major * 10 + r.cc_minor, device_cc());
  EXPECT_EQ(r.problems, int(st::problems().size()));
  ASSERT_EQ(r.num_entries, int(st::kPaths));
  int passed = 0;
  for (int p = 0; p < st::kPaths; ++p) {
    const m3qkv_selftest_entry& e = r.entries[p];
    SCOPED_TRACE(e.name);
    if (!runs_here(st::path_info(p).backend)) {
      EXPECT_EQ(e.result, M3QKV_SELFTEST_NOT_AVAILABLE);
      continue;
    }
    ++passed;
    EXPECT_EQ(e.result, M3QKV_SELFTEST_PASS) << e.message;
    EXPECT_EQ(e.problems, problems_of(p));
    EXPECT_EQ(e.wrong_bytes, 0);
    EXPECT_EQ(e.portable_agrees, p == st::kPortable ? -1 : 1);
    EXPECT_GT(e.time_us, 0);
  }
  // The H200's kernels: portable and both SM90 kernels.
  if (device_cc() == 90 && M3QKV_WITH_SM90) EXPECT_GE(passed, 3);
  if (!M3QKV_TCGEN05_EMULATION) EXPECT_LT(r.total_us, 1000000) << "a warm self-test must take well under a second";
}

TEST(Selftest, LeavesNoTrace) {
  M3QKV_REQUIRE_GPU();
  const int dev = current_device();
  m3qkv_selftest_report r;
  ASSERT_EQ(selftest(dev, &r), M3QKV_SUCCESS) << m3qkv_last_error();  // loads every kernel once
  CUDA_OK(cudaDeviceSynchronize());
  size_t free0 = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free0, &total));
  CUcontext ctx0 = nullptr;
  ASSERT_EQ(current_context(&ctx0), CUDA_SUCCESS);
  // A pending (not sticky) error of the caller's: it must still be there after.
  EXPECT_EQ(cudaSetDevice(device_count() + 7), cudaErrorInvalidDevice);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(selftest(dev, &r), M3QKV_SUCCESS) << m3qkv_last_error();
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice) << "the self-test cleared or replaced the caller's error";
  EXPECT_EQ(current_device(), dev);
  CUcontext ctx1 = nullptr;
  ASSERT_EQ(current_context(&ctx1), CUDA_SUCCESS);
  EXPECT_EQ(ctx1, ctx0) << "the self-test changed the current context";
  size_t free1 = 0;
  CUDA_OK(cudaMemGetInfo(&free1, &total));
  std::printf("[ selftest ] free device memory before %zu, after three more self-tests %zu (difference %lld)\n",
              free0, free1, static_cast<long long>(free0) - static_cast<long long>(free1));
  EXPECT_EQ(free1, free0) << "the self-test left device memory allocated";
}

TEST(Selftest, FaultIsReportedForExactlyThatBackend) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  FaultGuard guard;
  const int dev = current_device();
  m3qkv_backend_kind automatic = M3QKV_BACKEND_NONE;
  M3QKV_OK(m3qkv_backend(dev, &automatic));
  std::vector<m3qkv_backend_kind> faulty{M3QKV_BACKEND_PORTABLE};
  if (automatic != M3QKV_BACKEND_PORTABLE) faulty.push_back(automatic);
  const int64_t kOffset = 37;
  const unsigned kMask = 0x10;
  for (m3qkv_backend_kind b : faulty) {
    SCOPED_TRACE(std::string("fault in ") + m3qkv_backend_name(b));
    M3QKV_OK(m3qkv_testing_inject_fault(b, "q_out", kOffset, kMask));
    m3qkv_selftest_report r;
    const m3qkv_status s = selftest(dev, &r);
    const std::string msg = m3qkv_last_error();
    print_report(r);
    M3QKV_OK(m3qkv_testing_inject_fault(M3QKV_BACKEND_NONE, nullptr, 0, 0));
    ASSERT_EQ(s, M3QKV_ERROR_SELFTEST_FAILED) << msg;
    EXPECT_NE(msg.find("q_out byte 37"), std::string::npos) << msg;
    for (int p = 0; p < st::kPaths; ++p) {
      const m3qkv_selftest_entry& e = r.entries[p];
      SCOPED_TRACE(e.name);
      if (!runs_here(st::path_info(p).backend)) continue;
      if (st::path_info(p).backend != b) {
        EXPECT_EQ(e.result, M3QKV_SELFTEST_PASS) << e.message;
        if (b == M3QKV_BACKEND_PORTABLE) EXPECT_EQ(e.portable_agrees, 0);
        continue;
      }
      ASSERT_EQ(e.result, M3QKV_SELFTEST_FAIL) << e.message;
      int want_problem = -1, want_wrong = 0;
      for (size_t i = 0; i < st::problems().size(); ++i) {
        const auto& cfg = st::problems()[i].cfg;
        if (!st::path_takes(p, cfg.m) || !cfg.q_bf16) continue;
        if (want_problem < 0) want_problem = int(i);
        ++want_wrong;
      }
      EXPECT_EQ(e.problem, want_problem);
      EXPECT_STREQ(e.output, "q_out");
      EXPECT_EQ(e.offset, kOffset);
      EXPECT_EQ(e.wrong_bytes, want_wrong);
      EXPECT_EQ(e.got, e.expected ^ int(kMask));
      // The reported golden byte is the golden model's.
      const m3qkv::golden::Problem prob = m3qkv::golden::build_problem(st::problems()[size_t(e.problem)].cfg);
      const m3qkv::golden::HostOutputs want = m3qkv::golden::golden_outputs(prob, 0);
      ASSERT_GT(want.q_out.size() * 2, size_t(kOffset));
      EXPECT_EQ(e.expected, reinterpret_cast<const uint8_t*>(want.q_out.data())[kOffset]);
      if (p != st::kPortable) EXPECT_EQ(e.portable_agrees, 0);
    }
  }
  // The fault is gone: everything passes again.
  m3qkv_selftest_report r;
  EXPECT_EQ(selftest(dev, &r), M3QKV_SUCCESS) << m3qkv_last_error();
}

// ---------------------------------------------------------------- children
TEST(Selftest, WarmupFallsBack) {
  M3QKV_REQUIRE_GPU();
  m3qkv_backend_kind automatic = M3QKV_BACKEND_NONE;
  M3QKV_OK(m3qkv_backend(current_device(), &automatic));
  if (automatic == M3QKV_BACKEND_PORTABLE) GTEST_SKIP() << "the automatic backend is portable: nothing to fall back to";
  expect_child_passes("DISABLED_SelftestChild.WarmupFallsBack", "M3QKV_SELFTEST_ON_WARMUP=1");
}

// One exact TP4 problem through the public entry point, checked byte for byte.
void public_call_is_golden(int64_t m, const std::string& what) {
  m3qkv::golden::ProblemConfig cfg;
  cfg.m = m;
  cfg.k = 256;
  cfg.exact_data = true;
  cfg.seed = m3qkv_test::test_seed() ^ 0x16;
  const Problem p = m3qkv::golden::build_problem(cfg);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  FusedRun run;
  run.backend = M3QKV_BACKEND_NONE;  // the public m3qkv_fused_qkv, its backend choice
  Fetched got;
  ASSERT_NO_FATAL_FAILURE(run_fused(p, in, run, 0, &got));
  HostOutputs want = poisoned_host_outputs(p, 0);
  const std::vector<float> acc =
      m3qkv::golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
  golden_epilogue(p, acc.data(), &want);
  expect_same_outputs(p, want, got, what);
}

TEST(DISABLED_SelftestChild, WarmupFallsBack) {
  CHILD_ONLY();
  FaultGuard guard;
  const int dev = current_device();
  m3qkv_backend_kind automatic = M3QKV_BACKEND_NONE;
  M3QKV_OK(m3qkv_backend(dev, &automatic));
  ASSERT_NE(automatic, M3QKV_BACKEND_PORTABLE);
  M3QKV_OK(m3qkv_warmup(dev));  // passes: no fault yet
  EXPECT_STREQ(m3qkv_last_error(), "");
  M3QKV_OK(m3qkv_testing_inject_fault(automatic, "q_out", 37, 0x10));
  const m3qkv_status s = m3qkv_warmup(dev);
  const std::string msg = m3qkv_last_error();
  std::printf("[ selftest ] m3qkv_warmup: %s: %s\n", m3qkv_status_string(s), msg.c_str());
  ASSERT_EQ(s, M3QKV_WARNING_BACKEND_FALLBACK) << msg;
  EXPECT_NE(msg.find(std::string("the self-test of ") + m3qkv_backend_name(automatic) + ", the automatic backend, FAILED"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("q_out byte 37"), std::string::npos) << msg;
  EXPECT_NE(msg.find("now uses portable, which passed"), std::string::npos) << msg;
  m3qkv_backend_kind now = M3QKV_BACKEND_NONE;
  M3QKV_OK(m3qkv_backend(dev, &now));
  EXPECT_EQ(now, M3QKV_BACKEND_PORTABLE);
  // The fault stays armed for the automatic backend: correct bytes now prove
  // the public entry point runs the portable one (decode and tile sizes).
  ASSERT_NO_FATAL_FAILURE(public_call_is_golden(1, "after the fallback, M 1"));
  ASSERT_NO_FATAL_FAILURE(public_call_is_golden(300, "after the fallback, M 300"));
  M3QKV_OK(m3qkv_testing_inject_fault(M3QKV_BACKEND_NONE, nullptr, 0, 0));
  M3QKV_OK(m3qkv_warmup(dev));
  M3QKV_OK(m3qkv_backend(dev, &now));
  EXPECT_EQ(now, automatic) << "a warmup that passes goes back to the automatic backend";
}

TEST(Selftest, EnvBackendPortable) {
  M3QKV_REQUIRE_GPU();
  expect_child_passes("DISABLED_SelftestChild.EnvBackendPortable", "M3QKV_BACKEND=portable");
}

TEST(DISABLED_SelftestChild, EnvBackendPortable) {
  CHILD_ONLY();
  FaultGuard guard;
  const int dev = current_device();
  m3qkv_backend_kind now = M3QKV_BACKEND_NONE;
  M3QKV_OK(m3qkv_backend(dev, &now));
  EXPECT_EQ(now, M3QKV_BACKEND_PORTABLE);
  // A fault in every other backend cannot reach a portable call.
  for (m3qkv_backend_kind b : {M3QKV_BACKEND_SM90, M3QKV_BACKEND_SM100}) {
    M3QKV_OK(m3qkv_testing_inject_fault(b, "q_out", 3, 0x01));
    ASSERT_NO_FATAL_FAILURE(public_call_is_golden(1, std::string("M3QKV_BACKEND=portable, fault in ") +
                                                         m3qkv_backend_name(b) + ", M 1"));
    ASSERT_NO_FATAL_FAILURE(public_call_is_golden(300, std::string("M3QKV_BACKEND=portable, fault in ") +
                                                           m3qkv_backend_name(b) + ", M 300"));
  }
  // m3qkv_set_backend wins over the environment.
  m3qkv_backend_kind automatic_hw = device_cc() == 90 && M3QKV_WITH_SM90 ? M3QKV_BACKEND_SM90 : M3QKV_BACKEND_NONE;
  if (automatic_hw != M3QKV_BACKEND_NONE) {
    M3QKV_OK(m3qkv_set_backend(dev, automatic_hw));
    M3QKV_OK(m3qkv_backend(dev, &now));
    EXPECT_EQ(now, automatic_hw);
    M3QKV_OK(m3qkv_set_backend(dev, M3QKV_BACKEND_NONE));
    M3QKV_OK(m3qkv_backend(dev, &now));
    EXPECT_EQ(now, M3QKV_BACKEND_PORTABLE);
  }
}

TEST(Selftest, EnvBackendUnknown) {
  M3QKV_REQUIRE_GPU();
  expect_child_passes("DISABLED_SelftestChild.EnvBackendUnknown", "M3QKV_BACKEND=hopper");
}

TEST(DISABLED_SelftestChild, EnvBackendUnknown) {
  CHILD_ONLY();
  const int dev = current_device();
  m3qkv_backend_kind now = M3QKV_BACKEND_SM90;
  EXPECT_EQ(m3qkv_backend(dev, &now), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(now, M3QKV_BACKEND_NONE);
  EXPECT_NE(std::string(m3qkv_last_error()).find("M3QKV_BACKEND = \"hopper\" is not one of auto, portable, sm90, sm100"),
            std::string::npos)
      << m3qkv_last_error();
  EXPECT_EQ(m3qkv_warmup(dev), M3QKV_ERROR_INVALID_ARGUMENT);
  // The fused call fails before launching; its outputs keep the poison.
  m3qkv::golden::ProblemConfig cfg;
  cfg.m = 3;
  cfg.k = 128;
  cfg.exact_data = true;
  const Problem p = m3qkv::golden::build_problem(cfg);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  DeviceOutputs d;
  CUDA_OK(d.init(p, 0));
  CUDA_OK(cudaDeviceSynchronize());
  const m3qkv_fused_args a = p.args_with(in.mapper(), d.ptrs());
  EXPECT_EQ(m3qkv_fused_qkv(&a, nullptr), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(m3qkv_last_error()).find("m3qkv_fused_qkv: M3QKV_BACKEND = \"hopper\""), std::string::npos)
      << m3qkv_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  Fetched got;
  CUDA_OK(fetch_outputs(d, &got));
  expect_same_outputs(p, poisoned_host_outputs(p, 0), got, "nothing written after the refused call");
  // The self-test does not depend on the choice.
  m3qkv_selftest_report r;
  EXPECT_EQ(selftest(dev, &r), M3QKV_SUCCESS) << m3qkv_last_error();
}

TEST(Selftest, EnvBackendSm100OnHopper) {
  M3QKV_REQUIRE_GPU();
  if (device_cc() != 90 || M3QKV_TCGEN05_EMULATION) GTEST_SKIP() << "needs a CC 9.0 device and a build without emulation";
  expect_child_passes("DISABLED_SelftestChild.EnvBackendSm100OnHopper", "M3QKV_BACKEND=sm100");
}

TEST(DISABLED_SelftestChild, EnvBackendSm100OnHopper) {
  CHILD_ONLY();
  const int dev = current_device();
  m3qkv_backend_kind now = M3QKV_BACKEND_PORTABLE;
  EXPECT_EQ(m3qkv_backend(dev, &now), M3QKV_ERROR_UNSUPPORTED_DEVICE);
  EXPECT_EQ(now, M3QKV_BACKEND_NONE);
  const std::string msg = m3qkv_last_error();
  EXPECT_TRUE(msg.find("M3QKV_BACKEND = sm100 cannot run on device") != std::string::npos ||
              msg.find("M3QKV_BACKEND = sm100, but this library was built without") != std::string::npos)
      << msg;
  EXPECT_EQ(m3qkv_warmup(dev), M3QKV_ERROR_UNSUPPORTED_DEVICE) << "never a silent fallback";
  EXPECT_EQ(m3qkv_set_backend(dev, M3QKV_BACKEND_SM100), M3QKV_ERROR_UNSUPPORTED_DEVICE);
  // An explicit portable choice is allowed and then wins over the environment.
  M3QKV_OK(m3qkv_set_backend(dev, M3QKV_BACKEND_PORTABLE));
  M3QKV_OK(m3qkv_backend(dev, &now));
  EXPECT_EQ(now, M3QKV_BACKEND_PORTABLE);
  ASSERT_NO_FATAL_FAILURE(public_call_is_golden(7, "m3qkv_set_backend(portable) over M3QKV_BACKEND=sm100"));
}

// ------------------------------------------------------- tcgen05 emulation
TEST(Sm100EmuSelftest, PassesForTheEmulatedKernel) {
  M3QKV_REQUIRE_GPU();
  if (!M3QKV_TCGEN05_EMULATION || m3qkv_emu_tmem_leaks == nullptr)
    GTEST_SKIP() << "library built without M3QKV_TCGEN05_EMULATION: emulation skipped";
  if (device_cc() != 90) GTEST_SKIP() << "tcgen05 emulation runs on CC 9.0 only";
  m3qkv_selftest_report r;
  const m3qkv_status s = selftest(current_device(), &r);
  print_report(r);
  ASSERT_EQ(s, M3QKV_SUCCESS) << m3qkv_last_error();
  for (int p : {int(st::kSm100Cta1), int(st::kSm100Cta2)}) {
    const m3qkv_selftest_entry& e = r.entries[p];
    SCOPED_TRACE(e.name);
    EXPECT_EQ(e.result, M3QKV_SELFTEST_PASS) << e.message;
    EXPECT_EQ(e.problems, int(st::problems().size()));
    EXPECT_EQ(e.portable_agrees, 1);
    EXPECT_NE(std::string(e.message).find("emulation"), std::string::npos) << e.message;
  }
  EXPECT_EQ(m3qkv_emu_tmem_leaks(), 0) << "SMs with Tensor Memory columns still allocated";
}

}  // namespace
