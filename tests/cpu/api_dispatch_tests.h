// Dispatch tests shared by every build configuration (see api_dispatch_harness.h).
// The including TU defines, before including this file:
//   DISPATCH_SUITE                       test suite name
//   kBuiltPortable, kBuiltSm90, kBuiltSm100   which backends that configuration has
//   kSm100OnSm90                         tcgen05-emulation build: sm100 may be forced on CC 9.0
// The expected backend per device is spelled out from the rule in
// src/api/internal.h: CC 10.x -> sm100, CC 9.0 -> sm90, CC >= 8.0 -> portable.
#pragma once

#include <gtest/gtest.h>

#include <thread>

namespace {

bool is_cc(int d, int major, int minor = -1) {
  const auto cc = fake_cuda().cc[static_cast<size_t>(d)];
  return cc.first == major && (minor < 0 || cc.second == minor);
}
bool at_least_80(int d) { return fake_cuda().cc[static_cast<size_t>(d)].first >= 8; }

// Whether a forced backend can run on fake device d in this configuration.
bool can_run(m3qkv_backend_kind b, int d) {
  switch (b) {
    case M3QKV_BACKEND_PORTABLE: return kBuiltPortable && at_least_80(d);
    case M3QKV_BACKEND_SM90: return kBuiltSm90 && is_cc(d, 9, 0);
    case M3QKV_BACKEND_SM100: return kBuiltSm100 && (is_cc(d, 10) || (kSm100OnSm90 && is_cc(d, 9, 0)));
    default: return false;
  }
}

// Automatic choice: the emulated sm100 kernel is never picked automatically.
m3qkv_backend_kind expected_fused(int d) {
  if (kBuiltSm100 && is_cc(d, 10)) return M3QKV_BACKEND_SM100;
  if (can_run(M3QKV_BACKEND_SM90, d)) return M3QKV_BACKEND_SM90;
  if (can_run(M3QKV_BACKEND_PORTABLE, d)) return M3QKV_BACKEND_PORTABLE;
  return M3QKV_BACKEND_NONE;
}

const char* fused_launcher(m3qkv_backend_kind b) {
  switch (b) {
    case M3QKV_BACKEND_PORTABLE: return "portable_fused";
    case M3QKV_BACKEND_SM90: return "sm90_fused";
    case M3QKV_BACKEND_SM100: return "sm100_fused";
    default: return "";
  }
}

// The part of the UNSUPPORTED_DEVICE message that says why device d has no backend.
std::string why_none(int d) {
  if (!at_least_80(d)) return "compute capability 7.5; m3qkv needs 8.0 or newer";
  return "built without the sm_80 target";
}

class DISPATCH_SUITE : public testing::Test {
 protected:
  void SetUp() override { launch_log().reset(); }
  void TearDown() override { launch_log().reset(); }
  FakeCudaInstall cuda_;
};

TEST_F(DISPATCH_SUITE, BackendQueryPerDevice) {
  for (int d = 0; d < kNumFake; ++d) {
    m3qkv_backend_kind k = static_cast<m3qkv_backend_kind>(-1);
    EXPECT_EQ(Under::backend(d, &k), M3QKV_SUCCESS) << "device " << d << ": " << m3qkv_last_error();
    EXPECT_EQ(k, expected_fused(d)) << "device " << d;
  }
  m3qkv_backend_kind k = M3QKV_BACKEND_SM90;
  const int n = static_cast<int>(fake_cuda().cc.size());
  EXPECT_EQ(Under::backend(n, &k), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(m3qkv_last_error(), "m3qkv_backend: device = " + std::to_string(n) +
                                               " is not a valid CUDA device (this process sees " + std::to_string(n) +
                                               ")"))
      << m3qkv_last_error();
  EXPECT_EQ(k, M3QKV_BACKEND_NONE);
  EXPECT_EQ(Under::backend(kCC80, nullptr), M3QKV_ERROR_NULL_POINTER);
}

TEST_F(DISPATCH_SUITE, FusedDispatchesPerDevice) {
  float* tap = dptr<float>(40);
  const auto stream = reinterpret_cast<cudaStream_t>(dptr(41));
  const m3qkv_fused_args a = good_fused();
  for (int d = 0; d < kNumFake; ++d) {
    SCOPED_TRACE("device " + std::to_string(d));
    fake_set_current_device(d);
    launch_log().reset();
    const m3qkv_backend_kind want = expected_fused(d);
    const m3qkv_status st = Under::testing_fused(&a, tap, M3QKV_BACKEND_NONE, stream);
    if (want == M3QKV_BACKEND_NONE) {
      EXPECT_EQ(st, M3QKV_ERROR_UNSUPPORTED_DEVICE);
      EXPECT_TRUE(contains(m3qkv_last_error(), "m3qkv_fused_qkv: ")) << m3qkv_last_error();
      EXPECT_TRUE(contains(m3qkv_last_error(), why_none(d))) << m3qkv_last_error();
      EXPECT_TRUE(launch_log().all.empty());
      continue;
    }
    ASSERT_EQ(st, M3QKV_SUCCESS) << m3qkv_last_error();
    EXPECT_STREQ(m3qkv_last_error(), "");
    EXPECT_EQ(launch_log().all, std::vector<std::string>{fused_launcher(want)});
    EXPECT_EQ(launch_log().dev.device, d);
    EXPECT_EQ(launch_log().dev.cc_major, fake_cuda().cc[static_cast<size_t>(d)].first);
    EXPECT_EQ(launch_log().dev.cc_minor, fake_cuda().cc[static_cast<size_t>(d)].second);
    EXPECT_EQ(launch_log().dev.num_sms, 100 + d);
    EXPECT_EQ(launch_log().dev.l2_bytes, (1 << 20) * (d + 1));
    EXPECT_EQ(launch_log().dev.max_smem_optin, 1000 * (d + 1));
    EXPECT_EQ(launch_log().acc_tap, tap);
    EXPECT_EQ(launch_log().stream, stream);
    // The public entry point takes the same path without a tap.
    launch_log().reset();
    ASSERT_EQ(Under::fused(&a, stream), M3QKV_SUCCESS) << m3qkv_last_error();
    EXPECT_EQ(launch_log().last, fused_launcher(want));
    EXPECT_EQ(launch_log().acc_tap, nullptr);
  }
}

TEST_F(DISPATCH_SUITE, UnfusedOpsUseThePortableKernels) {
  const m3qkv_insert_args i = good_insert();
  const m3qkv_gemm_args g = good_gemm();
  const m3qkv_quantize_args q = good_quantize();
  for (int d = 0; d < kNumFake; ++d) {
    SCOPED_TRACE("device " + std::to_string(d));
    fake_set_current_device(d);
    launch_log().reset();
    const bool ok = can_run(M3QKV_BACKEND_PORTABLE, d);
    const m3qkv_status want = ok ? M3QKV_SUCCESS : M3QKV_ERROR_UNSUPPORTED_DEVICE;
    const auto check = [&](m3qkv_status st, const char* fn) {
      const std::string msg = m3qkv_last_error();
      EXPECT_EQ(st, want) << msg;
      if (!ok) {
        EXPECT_TRUE(contains(msg, std::string(fn) + ": ")) << msg;
        EXPECT_TRUE(contains(msg, why_none(d))) << msg;
      }
    };
    check(Under::insert(&i), "m3qkv_qknorm_rope_kv_insert");
    check(Under::gemm(&g), "m3qkv_mxfp8_gemm");
    check(Under::quantize(&q), "m3qkv_mxfp8_quantize");
    const std::vector<std::string> launched =
        ok ? std::vector<std::string>{"portable_insert", "portable_gemm", "portable_quantize"}
           : std::vector<std::string>{};
    EXPECT_EQ(launch_log().all, launched);
  }
}

TEST_F(DISPATCH_SUITE, ForcedBackends) {
  const m3qkv_fused_args a = good_fused();
  for (int d = 0; d < kNumFake; ++d) {
    for (m3qkv_backend_kind b : {M3QKV_BACKEND_PORTABLE, M3QKV_BACKEND_SM90, M3QKV_BACKEND_SM100}) {
      SCOPED_TRACE("device " + std::to_string(d) + ", force " + m3qkv_backend_name(b));
      fake_set_current_device(d);
      launch_log().reset();
      const m3qkv_status st = Under::testing_fused(&a, nullptr, b);
      if (can_run(b, d)) {
        EXPECT_EQ(st, M3QKV_SUCCESS) << m3qkv_last_error();
        EXPECT_EQ(launch_log().all, std::vector<std::string>{fused_launcher(b)});
      } else {
        EXPECT_EQ(st, M3QKV_ERROR_UNSUPPORTED_DEVICE);
        EXPECT_TRUE(contains(m3qkv_last_error(), std::string("force_backend = ") + m3qkv_backend_name(b)))
            << m3qkv_last_error();
        EXPECT_TRUE(launch_log().all.empty());
      }
    }
  }
  EXPECT_EQ(Under::testing_fused(&a, nullptr, static_cast<m3qkv_backend_kind>(9)), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(launch_log().all.empty());
}

TEST_F(DISPATCH_SUITE, EmptyOrInvalidCallsNeverTouchTheDevice) {
  const int before = fake_cuda().calls.load();
  m3qkv_fused_args a = good_fused();
  a.m = 0;
  a.xq = nullptr;
  EXPECT_EQ(Under::fused(&a), M3QKV_SUCCESS);
  m3qkv_gemm_args g = good_gemm();
  g.m = 0;
  EXPECT_EQ(Under::gemm(&g), M3QKV_SUCCESS);
  a = good_fused();
  a.k = 100;
  EXPECT_EQ(Under::fused(&a), M3QKV_ERROR_INVALID_SHAPE);
  m3qkv_quantize_args q = good_quantize();
  q.xsf = dptr<char>(2) + 1;
  EXPECT_EQ(Under::quantize(&q), M3QKV_ERROR_MISALIGNED);
  EXPECT_EQ(fake_cuda().calls.load(), before) << "a call that launches nothing reached CUDA";
  EXPECT_TRUE(launch_log().all.empty());
}

TEST_F(DISPATCH_SUITE, CudaErrorsAreReported) {
  const m3qkv_fused_args a = good_fused();
  const int consumed = fake_cuda().get_last_error_calls.load();
  fake_cuda().ctx_get_current_err = CUDA_ERROR_NOT_INITIALIZED;
  EXPECT_EQ(Under::fused(&a), M3QKV_ERROR_CUDA_ERROR);
  std::string msg = m3qkv_last_error();
  EXPECT_TRUE(contains(msg, "m3qkv_fused_qkv: c->ctx_get_current(&cur) failed: CUDA_ERROR_FAKE")) << msg;
  EXPECT_EQ(fake_cuda().get_last_error_calls.load(), consumed) << "a driver error touched the runtime's last error";
  fake_cuda().ctx_get_current_err = CUDA_SUCCESS;

  // A runtime error is cleared after it is reported (host/status.h rule).
  m3qkv::host::testing_install_cuda(&fake_table());  // forget that the runtime was seen working
  fake_cuda().get_count_err = cudaErrorInitializationError;
  EXPECT_EQ(Under::fused(&a), M3QKV_ERROR_CUDA_ERROR);
  msg = m3qkv_last_error();
  EXPECT_TRUE(contains(msg, "m3qkv_fused_qkv: c.get_device_count(&count) failed: cudaErrorInitializationError"))
      << msg;
  EXPECT_GT(fake_cuda().get_last_error_calls.load(), consumed) << "the CUDA error was left pending";

  // No device: the message says so, whatever the runtime's wording.
  for (cudaError_t e : {cudaErrorNoDevice, cudaErrorInsufficientDriver, cudaErrorStubLibrary}) {
    fake_cuda().get_count_err = e;
    EXPECT_EQ(Under::fused(&a), M3QKV_ERROR_UNSUPPORTED_DEVICE) << cudaGetErrorName(e);
    EXPECT_TRUE(contains(m3qkv_last_error(), "m3qkv_fused_qkv: the CUDA driver is too old") ||
                contains(m3qkv_last_error(), "m3qkv_fused_qkv: no CUDA driver or GPU was found"))
        << m3qkv_last_error();
  }
  fake_cuda().get_count_err = cudaErrorInsufficientDriver;
  fake_cuda().driver_version = 0;  // cudaDriverGetVersion's answer without a driver
  EXPECT_EQ(Under::fused(&a), M3QKV_ERROR_UNSUPPORTED_DEVICE);
  EXPECT_TRUE(contains(m3qkv_last_error(), "no CUDA driver or GPU was found: no CUDA driver is installed"))
      << m3qkv_last_error();
  fake_cuda().driver_version = 12020;  // a real driver, older than the runtime
  EXPECT_EQ(Under::fused(&a), M3QKV_ERROR_UNSUPPORTED_DEVICE);
  EXPECT_TRUE(contains(m3qkv_last_error(), "the CUDA driver is too old: the installed driver supports CUDA 12.2"))
      << m3qkv_last_error();
  fake_cuda().get_count_err = cudaSuccess;

  // A failing attribute query is reported and not cached.
  const int kFailing = fresh_device(8, 0);
  fake_cuda().attr_fail_device = kFailing;
  m3qkv_backend_kind k = M3QKV_BACKEND_SM100;
  EXPECT_EQ(Under::backend(kFailing, &k), M3QKV_ERROR_CUDA_ERROR);
  EXPECT_TRUE(contains(m3qkv_last_error(), "m3qkv_backend: c.device_get_attribute")) << m3qkv_last_error();
  EXPECT_TRUE(contains(m3qkv_last_error(), "cudaErrorInvalidValue")) << m3qkv_last_error();
  EXPECT_EQ(k, M3QKV_BACKEND_NONE);
  fake_cuda().attr_fail_device = -1;
  EXPECT_EQ(Under::backend(kFailing, &k), M3QKV_SUCCESS) << m3qkv_last_error();
  EXPECT_EQ(k, expected_fused(kFailing));
  EXPECT_TRUE(launch_log().all.empty());
}

TEST_F(DISPATCH_SUITE, DeviceFactsAreCachedPerDevice) {
  m3qkv::DeviceInfo d1, d2;
  ASSERT_EQ(Under::query(kCC86, &d1), M3QKV_SUCCESS);
  const int calls = fake_cuda().attr_calls.load();
  ASSERT_EQ(Under::query(kCC86, &d2), M3QKV_SUCCESS);
  EXPECT_EQ(fake_cuda().attr_calls.load(), calls) << "second query went to the driver";
  EXPECT_EQ(d2.device, kCC86);
  EXPECT_EQ(d2.cc_major, 8);
  EXPECT_EQ(d2.cc_minor, 6);
  EXPECT_EQ(d2.num_sms, 100 + kCC86);
  EXPECT_EQ(d1.num_sms, d2.num_sms);
  EXPECT_EQ(Under::query(-2, &d1), M3QKV_ERROR_INVALID_ARGUMENT);
}

TEST_F(DISPATCH_SUITE, DeviceCacheIsThreadSafe) {
  const int kFresh = fresh_device(9, 0);
  std::vector<m3qkv::DeviceInfo> got(8);
  std::vector<m3qkv_status> st(8, M3QKV_ERROR_INTERNAL);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t) {
    threads.emplace_back([&, t] { st[t] = Under::query(kFresh, &got[t]); });
  }
  for (auto& th : threads) th.join();
  for (size_t t = 0; t < got.size(); ++t) {
    EXPECT_EQ(st[t], M3QKV_SUCCESS);
    EXPECT_EQ(got[t].device, kFresh);
    EXPECT_EQ(got[t].cc_major, 9);
    EXPECT_EQ(got[t].num_sms, 100 + kFresh);
  }
}

TEST_F(DISPATCH_SUITE, LauncherFailureIsReturnedAsIs) {
  fake_set_current_device(kCC80);
  launch_log().result = M3QKV_ERROR_CUDA_ERROR;
  const m3qkv_fused_args a = good_fused();
  const m3qkv_status st = Under::fused(&a);
  if (expected_fused(kCC80) == M3QKV_BACKEND_NONE) {
    EXPECT_EQ(st, M3QKV_ERROR_UNSUPPORTED_DEVICE);
    return;
  }
  EXPECT_EQ(st, M3QKV_ERROR_CUDA_ERROR);
  EXPECT_TRUE(contains(m3qkv_last_error(), "portable_fused: scripted failure")) << m3qkv_last_error();
}

// The test-only host-cost breakdown (host/timing.h) records the phases of
// the last call of this thread, in order, only while it is on.
TEST_F(DISPATCH_SUITE, HostPhaseTiming) {
  unsigned long long ns[16] = {};
  const int n = m3qkv_testing_host_phases(ns, 16);
  ASSERT_EQ(n, 7);
  for (int i = 0; i < n; ++i) EXPECT_STRNE(m3qkv_testing_host_phase_name(i), "unknown");
  EXPECT_STREQ(m3qkv_testing_host_phase_name(0), "validate");
  EXPECT_STREQ(m3qkv_testing_host_phase_name(7), "unknown");
  m3qkv_testing_host_timing(1);
  m3qkv_gemm_args g = good_gemm();
  const m3qkv_status st = Under::gemm(&g);
  m3qkv_testing_host_timing(0);
  m3qkv_testing_host_phases(ns, 16);
  EXPECT_GT(ns[0], 0u) << "validation took no time";
  if (st == M3QKV_SUCCESS) EXPECT_GT(ns[1], 0u) << "context resolution took no time";
  unsigned long long before[16] = {};
  m3qkv_testing_host_phases(before, 16);
  EXPECT_EQ(Under::gemm(&g), st);
  m3qkv_testing_host_phases(ns, 16);
  for (int i = 0; i < n; ++i) EXPECT_EQ(ns[i], before[i]) << "timing off still recorded phase " << i;
}

TEST_F(DISPATCH_SUITE, WarmupPerDevice) {
  for (int d = 0; d < kNumFake; ++d) {
    SCOPED_TRACE("device " + std::to_string(d));
    reset_fake_cuda();
    launch_log().reset();
    fake_set_current_device(kCC86);  // the caller's device, restored afterwards
    const size_t callers = current_ctx();
    const m3qkv_backend_kind fused = expected_fused(d);
    const m3qkv_status st = Under::warmup(d);
    EXPECT_TRUE(fake_cuda().set_device_log.empty()) << "warmup changed the runtime's current device";
    EXPECT_EQ(current_ctx(), callers);
    EXPECT_EQ(t_ctx_stack.size(), 1u);
    if (fused == M3QKV_BACKEND_NONE) {
      EXPECT_EQ(st, M3QKV_ERROR_UNSUPPORTED_DEVICE);
      EXPECT_TRUE(contains(m3qkv_last_error(), "m3qkv_warmup: ")) << m3qkv_last_error();
      EXPECT_TRUE(launch_log().all.empty());
      EXPECT_TRUE(fake_cuda().retain_log.empty());
      continue;
    }
    ASSERT_EQ(st, M3QKV_SUCCESS) << m3qkv_last_error();
    std::vector<std::string> want;
    if (can_run(M3QKV_BACKEND_PORTABLE, d)) want.push_back("portable_warmup");
    if (fused == M3QKV_BACKEND_SM90) want.push_back("sm90_warmup");
    if (fused == M3QKV_BACKEND_SM100 || (kSm100OnSm90 && can_run(M3QKV_BACKEND_SM100, d)))
      want.push_back("sm100_warmup");
    EXPECT_EQ(launch_log().all, want);
    EXPECT_EQ(launch_log().dev.device, d);
    EXPECT_NE(launch_log().dev.context, nullptr);
    // Only device d's primary context was touched.
    EXPECT_EQ(fake_cuda().retain_log, std::vector<int>{d});
  }
  EXPECT_EQ(Under::warmup(-1), M3QKV_ERROR_INVALID_ARGUMENT);
}

// A thread that never touched CUDA: warmup(d) leaves it without a current
// context and with its runtime device unset (no context on device 0 either).
TEST_F(DISPATCH_SUITE, WarmupFromAFreshThreadLeavesNoContext) {
  const int d = kCC103;
  if (expected_fused(d) == M3QKV_BACKEND_NONE) GTEST_SKIP() << "no backend for the device in this configuration";
  std::thread t([&] {
    ASSERT_EQ(current_ctx(), 0u);
    EXPECT_EQ(Under::warmup(d), M3QKV_SUCCESS) << m3qkv_last_error();
    EXPECT_EQ(current_ctx(), 0u);
    EXPECT_EQ(t_runtime_device, -1);
  });
  t.join();
  EXPECT_TRUE(fake_cuda().set_device_log.empty());
  EXPECT_EQ(fake_cuda().retain_log, std::vector<int>{d});
}

// The call's device is its stream's: a stream of another device's context is
// launched with that context current, and the caller's context is back after.
TEST_F(DISPATCH_SUITE, StreamOfAnotherDeviceRunsOnThatDevice) {
  fake_set_current_device(kCC80);
  const size_t callers = current_ctx();
  const int other = kCC90;
  const cudaStream_t s = fake_cuda().new_stream([&] {
    std::lock_guard<std::mutex> lock(fake_cuda().mu);
    return fake_cuda().primary_of(other);
  }());
  const m3qkv_fused_args a = good_fused();
  const m3qkv_status st = Under::fused(&a, s);
  if (expected_fused(other) == M3QKV_BACKEND_NONE) {
    EXPECT_EQ(st, M3QKV_ERROR_UNSUPPORTED_DEVICE);
  } else {
    ASSERT_EQ(st, M3QKV_SUCCESS) << m3qkv_last_error();
    EXPECT_EQ(launch_log().last, fused_launcher(expected_fused(other)));
    EXPECT_EQ(launch_log().dev.device, other);
    EXPECT_EQ(launch_log().stream, s);
  }
  EXPECT_EQ(current_ctx(), callers);
  EXPECT_EQ(t_ctx_stack.size(), 1u);
}

// A thread without a context calling on the NULL stream gets the runtime's
// current device's primary context, as the launch itself would.
TEST_F(DISPATCH_SUITE, FreshThreadOnTheNullStreamUsesTheCurrentDevice) {
  fake_cuda().default_device = kCC86;
  std::thread t([] {
    const m3qkv_gemm_args g = good_gemm();
    const m3qkv_status st = Under::gemm(&g);
    if (!can_run(M3QKV_BACKEND_PORTABLE, kCC86)) return;
    EXPECT_EQ(st, M3QKV_SUCCESS) << m3qkv_last_error();
    EXPECT_EQ(launch_log().dev.device, kCC86);
    EXPECT_NE(current_ctx(), 0u);
  });
  t.join();
  if (can_run(M3QKV_BACKEND_PORTABLE, kCC86)) EXPECT_EQ(fake_cuda().set_device_log, std::vector<int>{kCC86});
  fake_cuda().default_device = 0;
}

}  // namespace
