// The host layer on the GPU (issue 12): contexts, streams, threads, checked
// mode, the clamped portable grid and the eps rule, each against the golden
// model byte for byte (exact data: the golden accumulator is the accumulator
// on any hardware).
//
//  - HostContexts.CallAfterDeviceReset (child): a call, cudaDeviceReset, fresh
//    buffers, a call again, for the automatic backend (decode and tile paths
//    on an H200) and the portable one forced, plus the gemm and insert ops.
//  - HostContexts.SixteenThreadsFirstCallAtOnce (child): the process's first
//    m3qkv calls, made by 16 threads at once on their own streams.
//  - HostContexts.WarmupFromAFreshProcess (child): m3qkv_warmup(d) leaves the
//    thread without a current context and the runtime device unset, creates
//    d's primary context and (with two GPUs) none on another device.
//  - HostContexts.SecondContextOnTheSameDevice: calls inside a context of
//    cuCtxCreate, and from the primary context on that context's stream.
//  - HostContexts.WarmupKeepsTheCallersContext, StreamOfAnotherDevice,
//    TwoDevicesTwoThreads (two GPUs; skipped with one).
//  - HostChecked.* (children, M3QKV_CHECKED=1): a valid call passes; a host
//    pointer, a freed pointer, a buffer one byte too small, a buffer past its
//    VMM mapping and another device's buffer are rejected with a message,
//    in a child process so that a miss (a fault) cannot take this one down.
//  - HostGrid.Int32MaxGridIsClamped: grid = INT32_MAX on gemm and insert gives
//    the bytes of grid = 0 in about its time.
//  - HostNumerics.AllZeroHeadRowGivesZeros: a zero token row gives 0, not NaN.
//
// Children are this binary run again with --gtest_filter on a DISABLED_
// test and M3QKV_CHILD=1 (DISABLED_ keeps them out of a normal run).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "api/internal.h"
#include "common/numerics.h"
#include "common/problem.h"
#include "common/test_util.h"
#include "golden/golden.h"
#include "gpu/gpu_util.h"
#include "gpu/harness.h"

namespace {

using namespace m3qkv_gpu;
using m3qkv_test::make_problem;

// ------------------------------------------------------ driver entry points
template <class F>
F entry(const char* name, int version) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &p, static_cast<unsigned>(version), cudaEnableDefault, &q) !=
          cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<F>(p);
}

struct Driver {
  // cuCtxCreate's ABI changed at 11.4 (exec affinity) and 12.5 (CUctxCreateParams):
  // the symbol must be asked for at the version of the signature used (asking
  // for 12000 gave the 11.4 form, and the 3.2-form call failed with 101, H200).
  PFN_cuCtxCreate_v12050 ctx_create = entry<PFN_cuCtxCreate_v12050>("cuCtxCreate", 12050);
  PFN_cuCtxDestroy_v4000 ctx_destroy = entry<PFN_cuCtxDestroy_v4000>("cuCtxDestroy", 12000);
  PFN_cuCtxGetCurrent_v4000 get_current = entry<PFN_cuCtxGetCurrent_v4000>("cuCtxGetCurrent", 12000);
  PFN_cuCtxPushCurrent_v4000 push = entry<PFN_cuCtxPushCurrent_v4000>("cuCtxPushCurrent", 12000);
  PFN_cuCtxPopCurrent_v4000 pop = entry<PFN_cuCtxPopCurrent_v4000>("cuCtxPopCurrent", 12000);
  PFN_cuCtxGetId_v12000 get_id = entry<PFN_cuCtxGetId_v12000>("cuCtxGetId", 12000);
  PFN_cuDevicePrimaryCtxGetState_v7000 primary_state =
      entry<PFN_cuDevicePrimaryCtxGetState_v7000>("cuDevicePrimaryCtxGetState", 12000);
  PFN_cuMemAddressReserve_v10020 reserve = entry<PFN_cuMemAddressReserve_v10020>("cuMemAddressReserve", 12000);
  PFN_cuMemAddressFree_v10020 address_free = entry<PFN_cuMemAddressFree_v10020>("cuMemAddressFree", 12000);
  PFN_cuMemCreate_v10020 mem_create = entry<PFN_cuMemCreate_v10020>("cuMemCreate", 12000);
  PFN_cuMemRelease_v10020 mem_release = entry<PFN_cuMemRelease_v10020>("cuMemRelease", 12000);
  PFN_cuMemMap_v10020 mem_map = entry<PFN_cuMemMap_v10020>("cuMemMap", 12000);
  PFN_cuMemUnmap_v10020 mem_unmap = entry<PFN_cuMemUnmap_v10020>("cuMemUnmap", 12000);
  PFN_cuMemSetAccess_v10020 set_access = entry<PFN_cuMemSetAccess_v10020>("cuMemSetAccess", 12000);
  PFN_cuMemGetAllocationGranularity_v10020 granularity =
      entry<PFN_cuMemGetAllocationGranularity_v10020>("cuMemGetAllocationGranularity", 12000);
  bool ok() const {
    return ctx_create && ctx_destroy && get_current && push && pop && get_id && primary_state && reserve &&
           address_free && mem_create && mem_release && mem_map && mem_unmap && set_access && granularity;
  }
};
const Driver& drv() {
  static const Driver d;
  return d;
}

#define CU_OK(call)                                                                    \
  do {                                                                                 \
    const CUresult r_ = (call);                                                        \
    ASSERT_EQ(r_, CUDA_SUCCESS) << #call << " failed with CUresult " << int(r_);       \
  } while (0)

#define REQUIRE_DRIVER()                                                               \
  do {                                                                                 \
    M3QKV_REQUIRE_GPU();                                                               \
    ASSERT_TRUE(drv().ok()) << "a driver entry point of the test is missing";          \
  } while (0)

// ------------------------------------------------------------- problems
// Exact data, fresh per process seed and tag.
Problem exact_problem(const Heads& h, int64_t m, uint64_t tag, int64_t k = 512) {
  ProblemConfig cfg = heads_config(h, m, k, /*exact=*/true, 16);
  cfg.slot_skip_fraction = 0.125;
  cfg.seed = m3qkv_test::test_seed() ^ (tag * 0x9E3779B97F4A7C15ULL);
  return make_problem(cfg);
}

std::vector<float> golden_acc(const Problem& p) {
  return m3qkv::golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
}

m3qkv_status fused_call(const m3qkv_fused_args& a, m3qkv_backend_kind b, cudaStream_t s) {
  return b == M3QKV_BACKEND_NONE ? m3qkv_fused_qkv(&a, s) : m3qkv_testing_fused_qkv(&a, nullptr, b, s);
}

// One fused call on `s` into fresh poisoned outputs, checked byte for byte
// (fatal on a CUDA error: call through ASSERT_NO_FATAL_FAILURE).
void call_and_check(const Problem& p, const std::vector<float>& acc, const DeviceInputs& in, m3qkv_backend_kind b,
                    cudaStream_t s, const std::string& what) {
  DeviceOutputs d;
  CUDA_OK(d.init(p, 0));
  CUDA_OK(cudaDeviceSynchronize());
  const m3qkv_fused_args a = p.args_with(in.mapper(), d.ptrs());
  M3QKV_OK(fused_call(a, b, s));
  CUDA_OK(cudaStreamSynchronize(s));
  CUDA_OK(cudaGetLastError());
  Fetched got;
  CUDA_OK(fetch_outputs(d, &got));
  HostOutputs want = poisoned_host_outputs(p, 0);
  golden_epilogue(p, acc.data(), &want);
  expect_same_outputs(p, want, got, what);
}

// A problem uploaded and checked on `s` for each backend this device runs.
void fused_round(const Heads& h, int64_t m, uint64_t tag, cudaStream_t s, const std::string& what) {
  const Problem p = exact_problem(h, m, tag);
  const std::vector<float> acc = golden_acc(p);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  for (m3qkv_backend_kind b : {M3QKV_BACKEND_NONE, M3QKV_BACKEND_PORTABLE}) {
    ASSERT_NO_FATAL_FAILURE(
        call_and_check(p, acc, in, b, s, what + " M " + std::to_string(m) + " " + backend_label(b)));
  }
}

// gemm then insert on the gemm's output (portable kernels), checked.
void unfused_round(const Problem& p, int32_t grid, cudaStream_t s, float* ms_out, const std::string& what) {
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  const auto ins = p.inputs();
  DeviceBuffer qkv;
  CUDA_OK(qkv.alloc(size_t(p.m * p.n()) * 2));
  m3qkv_gemm_args g{};
  g.struct_size = sizeof g;
  g.m = p.m;
  g.n = p.n();
  g.k = p.k;
  g.xq = in.get(ins[0]);
  g.xsf = in.get(ins[1]);
  g.wq = in.get(ins[2]);
  g.wsf = in.get(ins[3]);
  g.out = qkv.get();
  g.grid = grid;
  DeviceOutputs d;
  CUDA_OK(d.init(p, 0));
  CUDA_OK(cudaDeviceSynchronize());
  m3qkv_insert_args a = p.insert_args_with(in.mapper(), qkv.get(), d.ptrs());
  a.grid = grid;
  Event e0, e1;
  CUDA_OK(cudaEventRecord(e0.get(), s));
  M3QKV_OK(m3qkv_mxfp8_gemm(&g, s));
  M3QKV_OK(m3qkv_qknorm_rope_kv_insert(&a, s));
  CUDA_OK(cudaEventRecord(e1.get(), s));
  CUDA_OK(cudaStreamSynchronize(s));
  if (ms_out) CUDA_OK(cudaEventElapsedTime(ms_out, e0.get(), e1.get()));
  // The golden insert on the golden gemm output (bf16 of the exact accumulator).
  const std::vector<float> acc = golden_acc(p);
  std::vector<uint16_t> want_qkv(acc.size());
  for (size_t i = 0; i < acc.size(); ++i) want_qkv[i] = m3qkv::f32_to_bf16_rn_soft(acc[i]);
  std::vector<uint16_t> got_qkv(acc.size());
  CUDA_OK(cudaMemcpy(got_qkv.data(), qkv.get(), got_qkv.size() * 2, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got_qkv, want_qkv) << what << ": gemm output differs from bf16(golden accumulator)";
  Fetched got;
  CUDA_OK(fetch_outputs(d, &got));
  HostOutputs want = poisoned_host_outputs(p, 0);
  golden_insert(p, want_qkv.data(), &want);
  expect_same_outputs(p, want, got, what + " insert");
}

// ======================================================== contexts
TEST(HostContexts, CallAfterDeviceReset) {
  M3QKV_REQUIRE_GPU();
  expect_child_passes("DISABLED_HostChild.CallAfterDeviceReset");
}

TEST(DISABLED_HostChild, CallAfterDeviceReset) {
  CHILD_ONLY();
  ASSERT_TRUE(drv().ok());
  unsigned long long ids[2] = {0, 0};
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round == 0 ? "before cudaDeviceReset" : "after cudaDeviceReset");
    {
      Stream s;
      CUDA_OK(s.error());
      // M 1: the decode path on SM90; M 300: the tile path.
      for (int64_t m : {1, 300}) ASSERT_NO_FATAL_FAILURE(fused_round(kTP4, m, 100 + round, s.get(), "fused"));
      ASSERT_NO_FATAL_FAILURE(unfused_round(exact_problem(kTP4, 65, 200 + round), 0, s.get(), nullptr, "unfused"));
      CUcontext ctx = nullptr;
      CU_OK(drv().get_current(&ctx));
      CU_OK(drv().get_id(ctx, &ids[round]));
    }
    if (round == 0) CUDA_OK(cudaDeviceReset());
  }
  std::printf("[ info ] primary context id before the reset %llu, after %llu\n", ids[0], ids[1]);
  EXPECT_NE(ids[0], ids[1]) << "cudaDeviceReset kept the context id: per-context setup would be stale";
}

TEST(HostContexts, SixteenThreadsFirstCallAtOnce) {
  M3QKV_REQUIRE_GPU();
  expect_child_passes("DISABLED_HostChild.SixteenThreadsFirstCallAtOnce");
}

TEST(DISABLED_HostChild, SixteenThreadsFirstCallAtOnce) {
  CHILD_ONLY();
  constexpr int kThreads = 16;
  const Problem p = exact_problem(kTP4, 7, 300);
  const std::vector<float> acc = golden_acc(p);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  std::vector<DeviceOutputs> outs(kThreads);
  std::vector<Stream> streams(kThreads);
  std::vector<m3qkv_fused_args> args(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    CUDA_OK(outs[size_t(t)].init(p, 0));
    CUDA_OK(streams[size_t(t)].error());
    args[size_t(t)] = p.args_with(in.mapper(), outs[size_t(t)].ptrs());
  }
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<m3qkv_status> st(kThreads, M3QKV_ERROR_INTERNAL);
  std::vector<std::string> msg(kThreads);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ready++;
      while (ready.load() < kThreads) std::this_thread::yield();
      // Odd threads force the portable backend; even ones take the automatic one.
      const m3qkv_backend_kind b = t % 2 ? M3QKV_BACKEND_PORTABLE : M3QKV_BACKEND_NONE;
      st[size_t(t)] = fused_call(args[size_t(t)], b, streams[size_t(t)].get());
      msg[size_t(t)] = m3qkv_last_error();
    });
  }
  for (auto& th : threads) th.join();
  CUDA_OK(cudaDeviceSynchronize());
  HostOutputs want = poisoned_host_outputs(p, 0);
  golden_epilogue(p, acc.data(), &want);
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(st[size_t(t)], M3QKV_SUCCESS) << "thread " << t << ": " << msg[size_t(t)];
    Fetched got;
    CUDA_OK(fetch_outputs(outs[size_t(t)], &got));
    expect_same_outputs(p, want, got, "thread " + std::to_string(t));
  }
}

TEST(HostContexts, WarmupFromAFreshProcess) {
  M3QKV_REQUIRE_GPU();
  expect_child_passes("DISABLED_HostChild.WarmupFromAFreshProcess");
}

TEST(DISABLED_HostChild, WarmupFromAFreshProcess) {
  CHILD_ONLY();
  ASSERT_TRUE(drv().ok());
  const int n = device_count();
  CUcontext cur = reinterpret_cast<CUcontext>(1);
  CU_OK(drv().get_current(&cur));
  ASSERT_EQ(cur, nullptr) << "the child touched CUDA before the test";
  const auto active = [](int d) {
    unsigned flags = 0;
    int a = -1;
    EXPECT_EQ(drv().primary_state(d, &flags, &a), CUDA_SUCCESS);
    return a;
  };
  ASSERT_EQ(active(0), 0);
  if (n >= 2) {
    M3QKV_OK(m3qkv_warmup(1));
    EXPECT_EQ(active(0), 0) << "m3qkv_warmup(1) created a context on device 0";
    EXPECT_EQ(active(1), 1);
    CU_OK(drv().get_current(&cur));
    EXPECT_EQ(cur, nullptr) << "m3qkv_warmup(1) left a context current";
    int d1 = -1;
    CUDA_OK(cudaGetDevice(&d1));
    EXPECT_EQ(d1, 0) << "m3qkv_warmup(1) changed the runtime's current device";
    EXPECT_EQ(active(0), 0) << "cudaGetDevice created a context (test assumption)";
  }
  M3QKV_OK(m3qkv_warmup(0));
  EXPECT_EQ(active(0), 1) << "m3qkv_warmup(0) did not initialize device 0";
  CU_OK(drv().get_current(&cur));
  EXPECT_EQ(cur, nullptr) << "m3qkv_warmup(0) left a context current on a thread that had none";
  int d = -1;
  CUDA_OK(cudaGetDevice(&d));
  EXPECT_EQ(d, 0);
  // Calls after the warmup work as usual.
  Stream s;
  CUDA_OK(s.error());
  ASSERT_NO_FATAL_FAILURE(fused_round(kTP8, 3, 400, s.get(), "after warmup"));
}

TEST(HostContexts, WarmupKeepsTheCallersContext) {
  REQUIRE_DRIVER();
  CUDA_OK(cudaFree(nullptr));  // the primary context, current
  CUcontext mine = nullptr;
  CU_OK(drv().ctx_create(&mine, nullptr, 0, 0));  // now current (pushed)
  M3QKV_OK(m3qkv_warmup(0));
  CUcontext cur = nullptr;
  CU_OK(drv().get_current(&cur));
  EXPECT_EQ(cur, mine) << "m3qkv_warmup replaced the caller's current context";
  CU_OK(drv().ctx_destroy(mine));
}

TEST(HostContexts, SecondContextOnTheSameDevice) {
  REQUIRE_DRIVER();
  print_seed_once();
  CUDA_OK(cudaFree(nullptr));
  CUcontext primary = nullptr;
  CU_OK(drv().get_current(&primary));
  CUcontext second = nullptr;
  CU_OK(drv().ctx_create(&second, nullptr, 0, 0));  // current now
  {
    // Calls inside the second context, on its streams and on the NULL stream.
    Stream s;
    CUDA_OK(s.error());
    ASSERT_NO_FATAL_FAILURE(fused_round(kTP4, 1, 500, s.get(), "in a cuCtxCreate context"));
    ASSERT_NO_FATAL_FAILURE(fused_round(kTP2, 300, 501, nullptr, "in a cuCtxCreate context, NULL stream"));
    // From the primary context, on a stream of the second: its buffers are the
    // second context's, so m3qkv must launch there.
    const Problem p = exact_problem(kTP4, 64, 502);
    const std::vector<float> acc = golden_acc(p);
    DeviceInputs in;
    CUDA_OK(in.upload(p));
    DeviceOutputs d;
    CUDA_OK(d.init(p, 0));
    CUDA_OK(cudaDeviceSynchronize());
    const m3qkv_fused_args a = p.args_with(in.mapper(), d.ptrs());
    CUcontext popped = nullptr;
    CU_OK(drv().pop(&popped));
    ASSERT_EQ(popped, second);
    for (m3qkv_backend_kind b : {M3QKV_BACKEND_NONE, M3QKV_BACKEND_PORTABLE}) {
      M3QKV_OK(fused_call(a, b, s.get()));
      CUcontext cur = nullptr;
      CU_OK(drv().get_current(&cur));
      EXPECT_EQ(cur, primary) << "the call left the stream's context current";
    }
    CU_OK(drv().push(second));
    CUDA_OK(cudaStreamSynchronize(s.get()));
    Fetched got;
    CUDA_OK(fetch_outputs(d, &got));
    HostOutputs want = poisoned_host_outputs(p, 0);
    golden_epilogue(p, acc.data(), &want);
    expect_same_outputs(p, want, got, "from the primary context on the second context's stream");
  }
  CU_OK(drv().ctx_destroy(second));
  CUcontext cur = nullptr;
  CU_OK(drv().get_current(&cur));
  EXPECT_EQ(cur, primary);
  // The primary context still works after the second one is gone.
  Stream s;
  CUDA_OK(s.error());
  ASSERT_NO_FATAL_FAILURE(fused_round(kTP4, 1, 503, s.get(), "primary after cuCtxDestroy"));
}

TEST(HostContexts, StreamOfAnotherDevice) {
  REQUIRE_DRIVER();
  if (device_count() < 2) GTEST_SKIP() << "needs two GPUs";
  CUDA_OK(cudaSetDevice(1));
  {
    Stream s;  // on device 1
    CUDA_OK(s.error());
    const Problem p = exact_problem(kTP4, 7, 600);
    const std::vector<float> acc = golden_acc(p);
    DeviceInputs in;
    CUDA_OK(in.upload(p));
    DeviceOutputs d;
    CUDA_OK(d.init(p, 0));
    CUDA_OK(cudaDeviceSynchronize());
    const m3qkv_fused_args a = p.args_with(in.mapper(), d.ptrs());
    CUDA_OK(cudaSetDevice(0));
    M3QKV_OK(m3qkv_fused_qkv(&a, s.get()));
    int cur = -1;
    CUDA_OK(cudaGetDevice(&cur));
    EXPECT_EQ(cur, 0) << "the call changed the caller's device";
    CUDA_OK(cudaSetDevice(1));
    CUDA_OK(cudaStreamSynchronize(s.get()));
    Fetched got;
    CUDA_OK(fetch_outputs(d, &got));
    HostOutputs want = poisoned_host_outputs(p, 0);
    golden_epilogue(p, acc.data(), &want);
    expect_same_outputs(p, want, got, "device 1's stream from device 0");
  }
  CUDA_OK(cudaSetDevice(0));
}

// Issue 17: two threads, one per GPU, each calling the fused op (TP4, M = 1,
// 64, 4096; automatic backend) on its own stream for ~2 s, every output
// checked byte for byte against the golden model, every call's status
// SUCCESS; the calls of the two devices overlap in time.
TEST(HostContexts, TwoDevicesTwoThreads) {
  REQUIRE_DRIVER();
  if (device_count() < 2) GTEST_SKIP() << "needs two GPUs";
  struct Case {
    Problem p;
    std::vector<float> acc;
  };
  std::vector<Case> cases;
  for (int64_t m : {int64_t{1}, int64_t{64}, int64_t{4096}}) {
    Case c{exact_problem(kTP4, m, 1700 + static_cast<uint64_t>(m), m > 1024 ? 256 : 512), {}};
    c.acc = golden_acc(c.p);  // host only, shared read-only by both threads
    cases.push_back(std::move(c));
  }
  std::atomic<int> started{0};
  auto body = [&](int dev, int* calls) {
    CUDA_OK(cudaSetDevice(dev));
    Stream s;
    CUDA_OK(s.error());
    std::vector<DeviceInputs> ins(cases.size());
    for (size_t i = 0; i < cases.size(); ++i) CUDA_OK(ins[i].upload(cases[i].p));
    started.fetch_add(1);
    while (started.load() < 2) std::this_thread::yield();
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (std::chrono::steady_clock::now() < until && !::testing::Test::HasFailure()) {
      for (size_t i = 0; i < cases.size(); ++i) {
        const std::string what = "device " + std::to_string(dev) + " M " + std::to_string(cases[i].p.m);
        ASSERT_NO_FATAL_FAILURE(call_and_check(cases[i].p, cases[i].acc, ins[i], M3QKV_BACKEND_NONE, s.get(), what));
        ++*calls;
      }
    }
  };
  int calls0 = 0, calls1 = 0;
  std::thread t0(body, 0, &calls0), t1(body, 1, &calls1);
  t0.join();
  t1.join();
  std::printf("[ info ] two devices: %d checked calls on device 0, %d on device 1\n", calls0, calls1);
  EXPECT_GE(calls0, 3) << "device 0 made too few calls";
  EXPECT_GE(calls1, 3) << "device 1 made too few calls";
  CUDA_OK(cudaSetDevice(0));
}

// ======================================================== checked mode
TEST(HostChecked, ValidCallPasses) {
  M3QKV_REQUIRE_GPU();
  expect_child_passes("DISABLED_HostChild.CheckedValidCallPasses", "M3QKV_CHECKED=1");
}
TEST(HostChecked, HostPointerRejected) {
  M3QKV_REQUIRE_GPU();
  expect_child_passes("DISABLED_HostChild.CheckedHostPointer", "M3QKV_CHECKED=1");
}
TEST(HostChecked, FreedPointerRejected) {
  M3QKV_REQUIRE_GPU();
  expect_child_passes("DISABLED_HostChild.CheckedFreedPointer", "M3QKV_CHECKED=1");
}
TEST(HostChecked, BufferOneByteTooSmallRejected) {
  M3QKV_REQUIRE_GPU();
  expect_child_passes("DISABLED_HostChild.CheckedOneByteTooSmall", "M3QKV_CHECKED=1");
}
TEST(HostChecked, BufferPastItsMappingRejected) {
  M3QKV_REQUIRE_GPU();
  expect_child_passes("DISABLED_HostChild.CheckedPastVmmMapping", "M3QKV_CHECKED=1");
}
TEST(HostChecked, OtherDevicesBufferRejected) {
  M3QKV_REQUIRE_GPU();
  if (device_count() < 2) GTEST_SKIP() << "needs two GPUs";
  expect_child_passes("DISABLED_HostChild.CheckedOtherDevice", "M3QKV_CHECKED=1");
}

// A valid TP4 M 7 call in checked mode; `mutate` breaks one buffer, then the
// call must be rejected with INVALID_ARGUMENT and a message containing every
// needle, and nothing may have run (the stream synchronizes cleanly).
struct CheckedCall {
  Problem p = exact_problem(kTP4, 7, 700);
  DeviceInputs in;
  DeviceOutputs out;
  m3qkv_fused_args args{};
};
void checked_setup(CheckedCall* c) {
  ASSERT_TRUE(std::getenv("M3QKV_CHECKED") != nullptr) << "run by HostChecked.* with M3QKV_CHECKED=1";
  CUDA_OK(c->in.upload(c->p));
  CUDA_OK(c->out.init(c->p, 0));
  CUDA_OK(cudaDeviceSynchronize());
  c->args = c->p.args_with(c->in.mapper(), c->out.ptrs());
}
void expect_rejected(const m3qkv_fused_args& a, const std::vector<std::string>& needles) {
  Stream s;
  CUDA_OK(s.error());
  const m3qkv_status st = m3qkv_fused_qkv(&a, s.get());
  const std::string msg = m3qkv_last_error();
  std::printf("[ info ] %s: %s\n", m3qkv_status_string(st), msg.c_str());
  EXPECT_EQ(st, M3QKV_ERROR_INVALID_ARGUMENT) << msg;
  for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "missing '" << n << "' in " << msg;
  CUDA_OK(cudaStreamSynchronize(s.get()));
  CUDA_OK(cudaGetLastError());
}

TEST(DISABLED_HostChild, CheckedValidCallPasses) {
  CHILD_ONLY();
  ASSERT_TRUE(std::getenv("M3QKV_CHECKED") != nullptr);
  Stream s;
  CUDA_OK(s.error());
  ASSERT_NO_FATAL_FAILURE(fused_round(kTP4, 1, 710, s.get(), "checked mode"));
  ASSERT_NO_FATAL_FAILURE(fused_round(kTP1, 300, 711, s.get(), "checked mode"));
  ASSERT_NO_FATAL_FAILURE(unfused_round(exact_problem(kTP4, 65, 712), 0, s.get(), nullptr, "checked mode"));
}

TEST(DISABLED_HostChild, CheckedHostPointer) {
  CHILD_ONLY();
  CheckedCall c;
  ASSERT_NO_FATAL_FAILURE(checked_setup(&c));
  std::vector<uint8_t> host_xq(c.p.xq);  // malloc'd memory CUDA does not know
  m3qkv_fused_args a = c.args;
  a.xq = host_xq.data();
  ASSERT_NO_FATAL_FAILURE(expect_rejected(a, {"xq = 0x", "not memory CUDA knows", "device memory of device 0"}));
  void* pinned = nullptr;
  CUDA_OK(cudaMallocHost(&pinned, c.p.xq.size()));
  a.xq = pinned;
  ASSERT_NO_FATAL_FAILURE(expect_rejected(a, {"xq = 0x", "host memory"}));
  CUDA_OK(cudaFreeHost(pinned));
}

TEST(DISABLED_HostChild, CheckedFreedPointer) {
  CHILD_ONLY();
  CheckedCall c;
  ASSERT_NO_FATAL_FAILURE(checked_setup(&c));
  void* freed = nullptr;
  CUDA_OK(cudaMalloc(&freed, size_t(4) << 20));  // large: its own mapping, unmapped by cudaFree
  CUDA_OK(cudaFree(freed));
  m3qkv_fused_args a = c.args;
  a.q_out = freed;
  ASSERT_NO_FATAL_FAILURE(expect_rejected(a, {"q_out = 0x"}));
}

TEST(DISABLED_HostChild, CheckedOneByteTooSmall) {
  CHILD_ONLY();
  CheckedCall c;
  ASSERT_NO_FATAL_FAILURE(checked_setup(&c));
  const size_t need = c.p.q_out_bytes();  // bf16 [7, 16·128]
  void* small = nullptr;
  CUDA_OK(cudaMalloc(&small, need - 1));
  m3qkv_fused_args a = c.args;
  a.q_out = small;
  ASSERT_NO_FATAL_FAILURE(expect_rejected(a, {"q_out = 0x", "allocation", "ends 1 bytes earlier"}));
  CUDA_OK(cudaFree(small));
}

TEST(DISABLED_HostChild, CheckedPastVmmMapping) {
  CHILD_ONLY();
  ASSERT_TRUE(drv().ok());
  CheckedCall c;
  ASSERT_NO_FATAL_FAILURE(checked_setup(&c));
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t gran = 0;
  CU_OK(drv().granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUdeviceptr base = 0;
  CU_OK(drv().reserve(&base, 2 * gran, 0, 0, 0));
  CUmemGenericAllocationHandle h = 0;
  CU_OK(drv().mem_create(&h, gran, &prop, 0));
  CU_OK(drv().mem_map(base, gran, 0, h, 0));
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CU_OK(drv().set_access(base, gran, &access, 1));
  // q_out ends 16 bytes past the mapped first half of the reservation.
  m3qkv_fused_args a = c.args;
  a.q_out = reinterpret_cast<void*>(base + gran - c.p.q_out_bytes() + 16);
  ASSERT_NO_FATAL_FAILURE(expect_rejected(a, {"q_out = 0x", "last byte is not mapped"}));
  a.q_out = reinterpret_cast<void*>(base + gran - c.p.q_out_bytes());  // fits: accepted (and written)
  Stream s;
  CUDA_OK(s.error());
  M3QKV_OK(m3qkv_fused_qkv(&a, s.get()));
  CUDA_OK(cudaStreamSynchronize(s.get()));
  CU_OK(drv().mem_unmap(base, gran));
  CU_OK(drv().mem_release(h));
  CU_OK(drv().address_free(base, 2 * gran));
}

TEST(DISABLED_HostChild, CheckedOtherDevice) {
  CHILD_ONLY();
  CheckedCall c;
  ASSERT_NO_FATAL_FAILURE(checked_setup(&c));
  CUDA_OK(cudaSetDevice(1));
  void* other = nullptr;
  CUDA_OK(cudaMalloc(&other, c.p.q_out_bytes()));
  CUDA_OK(cudaSetDevice(0));
  m3qkv_fused_args a = c.args;
  a.q_out = other;
  ASSERT_NO_FATAL_FAILURE(expect_rejected(a, {"q_out = 0x", "is memory of device 1; the call runs on device 0"}));
  CUDA_OK(cudaFree(other));
}

// ======================================================== grid, numerics
TEST(HostGrid, Int32MaxGridIsClamped) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  const Problem p = exact_problem(kTP4, 65, 800);
  Stream s;
  CUDA_OK(s.error());
  float ms0 = 0.0f, ms_max = 0.0f;
  ASSERT_NO_FATAL_FAILURE(unfused_round(p, 0, s.get(), nullptr, "grid 0 (warm-up)"));
  ASSERT_NO_FATAL_FAILURE(unfused_round(p, 0, s.get(), &ms0, "grid 0"));
  ASSERT_NO_FATAL_FAILURE(unfused_round(p, INT32_MAX, s.get(), &ms_max, "grid INT32_MAX"));
  std::printf("[ info ] gemm + insert: grid 0 %.3f ms, grid INT32_MAX %.3f ms\n", ms0, ms_max);
  // 2^31 CTAs would take seconds; the clamped grid is the grid-0 grid.
  EXPECT_LT(ms_max, 2.0f * ms0 + 1.0f);
}

TEST(HostNumerics, AllZeroHeadRowGivesZeros) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  Problem p = exact_problem(kTP4, 5, 900);
  std::fill(p.xq.begin() + 2 * p.k, p.xq.begin() + 3 * p.k, uint8_t{0});  // token 2: every head row is 0
  const std::vector<float> acc = golden_acc(p);
  for (int64_t c = 0; c < p.n(); ++c) ASSERT_EQ(acc[size_t(2 * p.n() + c)], 0.0f);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  Stream s;
  CUDA_OK(s.error());
  for (m3qkv_backend_kind b : {M3QKV_BACKEND_NONE, M3QKV_BACKEND_PORTABLE}) {
    DeviceOutputs d;
    CUDA_OK(d.init(p, 0));
    CUDA_OK(cudaDeviceSynchronize());
    const m3qkv_fused_args a = p.args_with(in.mapper(), d.ptrs());
    M3QKV_OK(fused_call(a, b, s.get()));
    CUDA_OK(cudaStreamSynchronize(s.get()));
    Fetched got;
    CUDA_OK(fetch_outputs(d, &got));
    HostOutputs want = poisoned_host_outputs(p, 0);
    golden_epilogue(p, acc.data(), &want);
    expect_same_outputs(p, want, got, "zero row " + backend_label(b));
    // Zeros, no NaN; the sign may be negative where RoPE adds -(v·sin) of a
    // zero v (the golden bytes, compared above, decide the sign).
    const uint16_t* q = reinterpret_cast<const uint16_t*>(got.q_out.data());
    for (int64_t c = 0; c < p.nq * 128; ++c) {
      ASSERT_EQ(q[size_t(2 * p.nq * 128 + c)] & 0x7fffu, 0u) << backend_label(b) << ": q of the zero row, column " << c;
    }
  }
}

}  // namespace
