// Dispatch tests shared by every build configuration (see api_dispatch_harness.h).
// The including TU defines, before including this file:
//   DISPATCH_SUITE                       test suite name
//   kBuiltPortable, kBuiltSm90, kBuiltSm100   which backends that configuration has
//   kSm100OnSm90                         tcgen05-emulation build: sm100 may be forced on CC 9.0
// and, for a configuration without any backend, DISPATCH_NO_BACKEND 1: the
// tests that need a backend on some device are then not compiled (they could
// only skip there).
// The expected backend per device is spelled out from the rule in
// src/api/internal.h: CC 10.x -> sm100, CC 9.0 -> sm90, CC >= 8.0 -> portable.
#pragma once

#ifndef DISPATCH_NO_BACKEND
#define DISPATCH_NO_BACKEND 0
#endif

#include <gtest/gtest.h>

#include <cstddef>
#include <map>
#include <set>
#include <thread>

#include "api/selftest.h"
#include "common/layouts.h"
#include "golden/golden.h"
#include "api/backend_choice.h"

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

// Whether the automatic backend of device d has another one behind it.
bool automatic_has_fallback(int d);

// Automatic choice: the emulated sm100 kernel is never picked automatically.
m3qkv_backend_kind expected_fused(int d) {
  if (kBuiltSm100 && is_cc(d, 10)) return M3QKV_BACKEND_SM100;
  if (can_run(M3QKV_BACKEND_SM90, d)) return M3QKV_BACKEND_SM90;
  if (can_run(M3QKV_BACKEND_PORTABLE, d)) return M3QKV_BACKEND_PORTABLE;
  return M3QKV_BACKEND_NONE;
}

bool automatic_has_fallback(int d) {
  return expected_fused(d) != M3QKV_BACKEND_PORTABLE && can_run(M3QKV_BACKEND_PORTABLE, d);
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

// Each test starts as a process without M3QKV_BACKEND / M3QKV_SELFTEST_ON_WARMUP,
// without per-device choices and without a fault, and leaves none behind.
void reset_backend_settings() {
  m3qkv::api::testing_set_env(nullptr, nullptr);
  m3qkv::api::testing_forget_choices();
  m3qkv_testing_inject_fault(M3QKV_BACKEND_NONE, nullptr, 0, 0);
}

class DISPATCH_SUITE : public testing::Test {
 protected:
  void SetUp() override {
    launch_log().reset();
    reset_backend_settings();
  }
  void TearDown() override {
    launch_log().reset();
    reset_backend_settings();
    m3qkv::api::testing_use_real_env();
  }
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

// bf16 activations (x_bf16): the portable and SM90 launchers receive the
// args unchanged (x_bf16 set, xq / xsf NULL), automatically and forced; the
// SM100 backend refuses them by name and launches nothing; the MXFP8 call
// still reaches every backend with x_bf16 = NULL. m3qkv_mxfp8_gemm with
// x_bf16 runs the portable GEMM.
TEST_F(DISPATCH_SUITE, XBf16ReachesPortableAndSm90AndSm100RefusesIt) {
  m3qkv_fused_args a = good_fused();
  a.xq = nullptr;
  a.xsf = nullptr;
  a.x_bf16 = dptr(8);
  const m3qkv_fused_args q = good_fused();
  const std::string refused =
      "m3qkv_fused_qkv: x_bf16 (bf16 activations) is not supported by the sm100 backend; pass xq/xsf or use "
      "M3QKV_BACKEND=sm90/portable";
  const auto expect_call = [&](m3qkv_backend_kind b, m3qkv_status st) {
    if (b == M3QKV_BACKEND_SM100) {
      EXPECT_EQ(st, M3QKV_ERROR_INVALID_ARGUMENT);
      EXPECT_EQ(std::string(m3qkv_last_error()), refused);
      EXPECT_TRUE(launch_log().all.empty());
    } else {
      ASSERT_EQ(st, M3QKV_SUCCESS) << m3qkv_last_error();
      EXPECT_EQ(launch_log().all, std::vector<std::string>{fused_launcher(b)});
      EXPECT_EQ(launch_log().x_bf16s, std::vector<const void*>{a.x_bf16});
    }
  };
  for (int d = 0; d < kNumFake; ++d) {
    SCOPED_TRACE("device " + std::to_string(d));
    fake_set_current_device(d);
    launch_log().reset();
    const m3qkv_backend_kind want = expected_fused(d);
    const m3qkv_status st = Under::fused(&a);
    if (want == M3QKV_BACKEND_NONE) {
      EXPECT_EQ(st, M3QKV_ERROR_UNSUPPORTED_DEVICE);
      EXPECT_TRUE(launch_log().all.empty());
      continue;
    }
    expect_call(want, st);
    for (m3qkv_backend_kind b : {M3QKV_BACKEND_PORTABLE, M3QKV_BACKEND_SM90, M3QKV_BACKEND_SM100}) {
      if (!can_run(b, d)) continue;
      SCOPED_TRACE(std::string("force ") + m3qkv_backend_name(b));
      launch_log().reset();
      expect_call(b, Under::testing_fused(&a, nullptr, b));
      launch_log().reset();
      ASSERT_EQ(Under::testing_fused(&q, nullptr, b), M3QKV_SUCCESS) << m3qkv_last_error();
      EXPECT_EQ(launch_log().x_bf16s, std::vector<const void*>{nullptr});
    }
  }
  m3qkv_gemm_args g = good_gemm();
  g.xq = nullptr;
  g.xsf = nullptr;
  g.x_bf16 = dptr(8);
  fake_set_current_device(kCC80);
  launch_log().reset();
  const m3qkv_status st = Under::gemm(&g);
  if (can_run(M3QKV_BACKEND_PORTABLE, kCC80)) {
    EXPECT_EQ(st, M3QKV_SUCCESS) << m3qkv_last_error();
    EXPECT_EQ(launch_log().all, std::vector<std::string>{"portable_gemm"});
  } else {
    EXPECT_EQ(st, M3QKV_ERROR_UNSUPPORTED_DEVICE);
  }
}

// batch_invariant = 1: the portable and SM90 launchers receive it (the SM90
// launcher then takes the swap-AB kernel unsplit at every M); SM100 refuses
// it by name and launches nothing.
TEST_F(DISPATCH_SUITE, BatchInvariantReachesPortableAndSm90AndSm100RefusesIt) {
  m3qkv_fused_args a = good_fused();
  a.batch_invariant = 1;
  for (int d = 0; d < kNumFake; ++d) {
    SCOPED_TRACE("device " + std::to_string(d));
    fake_set_current_device(d);
    for (m3qkv_backend_kind b : {M3QKV_BACKEND_PORTABLE, M3QKV_BACKEND_SM90, M3QKV_BACKEND_SM100}) {
      if (!can_run(b, d)) continue;
      SCOPED_TRACE(std::string("force ") + m3qkv_backend_name(b));
      launch_log().reset();
      const m3qkv_status st = Under::testing_fused(&a, nullptr, b);
      if (b == M3QKV_BACKEND_SM100) {
        EXPECT_EQ(st, M3QKV_ERROR_INVALID_ARGUMENT);
        EXPECT_EQ(std::string(m3qkv_last_error()),
                  "m3qkv_fused_qkv: batch_invariant = 1 is not supported by the sm100 backend; use "
                  "M3QKV_BACKEND=sm90/portable or batch_invariant = 0");
        EXPECT_TRUE(launch_log().all.empty());
      } else {
        ASSERT_EQ(st, M3QKV_SUCCESS) << m3qkv_last_error();
        EXPECT_EQ(launch_log().all, std::vector<std::string>{fused_launcher(b)});
      }
    }
  }
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
#if !DISPATCH_NO_BACKEND
TEST_F(DISPATCH_SUITE, WarmupFromAFreshThreadLeavesNoContext) {
  const int d = kCC103;
  ASSERT_NE(expected_fused(d), M3QKV_BACKEND_NONE);
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
#endif  // !DISPATCH_NO_BACKEND

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

// ======================================================== backend choice
const m3qkv_backend_kind kKinds[] = {M3QKV_BACKEND_PORTABLE, M3QKV_BACKEND_SM90, M3QKV_BACKEND_SM100};

// M3QKV_BACKEND names a backend: m3qkv_backend reports it and m3qkv_fused_qkv
// launches it where it can run; elsewhere both fail with UNSUPPORTED_DEVICE
// naming the variable, never falling back. "auto" is the automatic choice.
TEST_F(DISPATCH_SUITE, EnvBackendOverride) {
  const m3qkv_fused_args a = good_fused();
  for (m3qkv_backend_kind b : kKinds) {
    m3qkv::api::testing_set_env(m3qkv_backend_name(b), nullptr);
    for (int d = 0; d < kNumFake; ++d) {
      SCOPED_TRACE(std::string("M3QKV_BACKEND=") + m3qkv_backend_name(b) + ", device " + std::to_string(d));
      fake_set_current_device(d);
      launch_log().reset();
      m3qkv_backend_kind k = static_cast<m3qkv_backend_kind>(-1);
      const m3qkv_status q = Under::backend(d, &k);
      const m3qkv_status f = Under::fused(&a);
      if (can_run(b, d)) {
        EXPECT_EQ(q, M3QKV_SUCCESS) << m3qkv_last_error();
        EXPECT_EQ(k, b);
        EXPECT_EQ(f, M3QKV_SUCCESS) << m3qkv_last_error();
        EXPECT_EQ(launch_log().all, std::vector<std::string>{fused_launcher(b)});
      } else {
        EXPECT_EQ(q, M3QKV_ERROR_UNSUPPORTED_DEVICE);
        EXPECT_EQ(k, M3QKV_BACKEND_NONE);
        EXPECT_EQ(f, M3QKV_ERROR_UNSUPPORTED_DEVICE);
        EXPECT_TRUE(contains(m3qkv_last_error(), std::string("m3qkv_fused_qkv: M3QKV_BACKEND = ") + m3qkv_backend_name(b)))
            << m3qkv_last_error();
        EXPECT_TRUE(launch_log().all.empty()) << "an impossible choice launched something";
      }
    }
  }
  m3qkv::api::testing_set_env("auto", nullptr);
  for (int d = 0; d < kNumFake; ++d) {
    m3qkv_backend_kind k = static_cast<m3qkv_backend_kind>(-1);
    EXPECT_EQ(Under::backend(d, &k), M3QKV_SUCCESS) << m3qkv_last_error();
    EXPECT_EQ(k, expected_fused(d)) << "M3QKV_BACKEND=auto, device " << d;
  }
}

// An unknown value is an error of every call that chooses a fused backend,
// naming the value; the unfused ops (portable only) do not depend on it.
TEST_F(DISPATCH_SUITE, EnvBackendUnknownNameIsAnError) {
  for (const char* bad : {"sm9", "SM90", "portable ", "cuda", "none"}) {
    SCOPED_TRACE(std::string("M3QKV_BACKEND=") + bad);
    m3qkv::api::testing_set_env(bad, nullptr);
    const std::string needle = std::string("M3QKV_BACKEND = \"") + bad + "\" is not one of auto, portable, sm90, sm100";
    fake_set_current_device(kCC90);
    launch_log().reset();
    const m3qkv_fused_args a = good_fused();
    EXPECT_EQ(Under::fused(&a), M3QKV_ERROR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(m3qkv_last_error(), "m3qkv_fused_qkv: " + needle)) << m3qkv_last_error();
    m3qkv_backend_kind k = M3QKV_BACKEND_SM90;
    EXPECT_EQ(Under::backend(kCC90, &k), M3QKV_ERROR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(m3qkv_last_error(), "m3qkv_backend: " + needle)) << m3qkv_last_error();
    EXPECT_EQ(k, M3QKV_BACKEND_NONE);
    EXPECT_EQ(Under::warmup(kCC90), M3QKV_ERROR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(m3qkv_last_error(), "m3qkv_warmup: " + needle)) << m3qkv_last_error();
    EXPECT_TRUE(launch_log().all.empty());
    const m3qkv_gemm_args g = good_gemm();
    EXPECT_EQ(Under::gemm(&g), can_run(M3QKV_BACKEND_PORTABLE, kCC90) ? M3QKV_SUCCESS : M3QKV_ERROR_UNSUPPORTED_DEVICE)
        << m3qkv_last_error();
  }
}

// m3qkv_set_backend: validated at once (nothing changes on an error), wins
// over M3QKV_BACKEND, reported by m3qkv_backend, NONE goes back.
TEST_F(DISPATCH_SUITE, SetBackend) {
  const m3qkv_fused_args a = good_fused();
  for (int d = 0; d < kNumFake; ++d) {
    for (m3qkv_backend_kind b : kKinds) {
      SCOPED_TRACE(std::string("set ") + m3qkv_backend_name(b) + ", device " + std::to_string(d));
      reset_backend_settings();
      fake_set_current_device(d);
      launch_log().reset();
      const m3qkv_status st = Under::set_backend(d, b);
      m3qkv_backend_kind k = static_cast<m3qkv_backend_kind>(-1);
      if (!can_run(b, d)) {
        EXPECT_EQ(st, M3QKV_ERROR_UNSUPPORTED_DEVICE);
        EXPECT_TRUE(contains(m3qkv_last_error(), std::string("m3qkv_set_backend: kind = ") + m3qkv_backend_name(b)))
            << m3qkv_last_error();
        EXPECT_EQ(Under::backend(d, &k), M3QKV_SUCCESS);
        EXPECT_EQ(k, expected_fused(d)) << "a refused choice changed the backend";
        continue;
      }
      ASSERT_EQ(st, M3QKV_SUCCESS) << m3qkv_last_error();
      EXPECT_EQ(Under::backend(d, &k), M3QKV_SUCCESS);
      EXPECT_EQ(k, b);
      EXPECT_EQ(Under::fused(&a), M3QKV_SUCCESS) << m3qkv_last_error();
      EXPECT_EQ(launch_log().last, fused_launcher(b));
      // It wins over the environment (even an environment that names another one).
      m3qkv::api::testing_set_env(b == M3QKV_BACKEND_PORTABLE ? "sm100" : "portable", nullptr);
      EXPECT_EQ(Under::backend(d, &k), M3QKV_SUCCESS) << m3qkv_last_error();
      EXPECT_EQ(k, b);
      // NONE: back to the environment / the automatic choice.
      m3qkv::api::testing_set_env(nullptr, nullptr);
      EXPECT_EQ(Under::set_backend(d, M3QKV_BACKEND_NONE), M3QKV_SUCCESS);
      EXPECT_EQ(Under::backend(d, &k), M3QKV_SUCCESS);
      EXPECT_EQ(k, expected_fused(d));
    }
  }
  EXPECT_EQ(Under::set_backend(kCC90, static_cast<m3qkv_backend_kind>(9)), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(m3qkv_last_error(), "m3qkv_set_backend: kind = 9 is not an m3qkv_backend_kind"))
      << m3qkv_last_error();
  EXPECT_EQ(Under::set_backend(kCC90, static_cast<m3qkv_backend_kind>(-1)), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(Under::set_backend(kNumFake + 5, M3QKV_BACKEND_PORTABLE), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(m3qkv_last_error(), "is not a valid CUDA device")) << m3qkv_last_error();
  m3qkv::host::testing_install_cuda(&fake_table());  // forget the devices seen so far
  fake_cuda().get_count_err = cudaErrorNoDevice;
  EXPECT_EQ(Under::set_backend(kCC90, M3QKV_BACKEND_PORTABLE), M3QKV_ERROR_UNSUPPORTED_DEVICE);
  EXPECT_TRUE(contains(m3qkv_last_error(), "m3qkv_set_backend: ")) << m3qkv_last_error();
  fake_cuda().get_count_err = cudaSuccess;
}

// ======================================================== self-test
// A "kernel" for the self-test on the scripted CUDA: the golden model run on
// the fake device memory behind the call's pointers (what a correct backend
// writes). The accumulator is cached by the operands' bytes: every kernel of
// a self-test runs the same problems.
m3qkv_status golden_kernel(const char* what, const m3qkv_fused_args& a) {
  bool missing = false;
  const auto h = [&](const void* p) -> void* {
    if (p == nullptr) return nullptr;
    void* q = fake_cuda().host_ptr(p, 1);
    missing |= q == nullptr;
    return q;
  };
  m3qkv_fused_args x = a;
  x.xq = h(a.xq), x.xsf = h(a.xsf), x.wq = h(a.wq), x.wsf = h(a.wsf);
  x.positions = static_cast<const int64_t*>(h(a.positions));
  x.cos_sin_cache = h(a.cos_sin_cache);
  x.q_norm_weight = h(a.q_norm_weight), x.k_norm_weight = h(a.k_norm_weight);
  x.index_q_norm_weight = h(a.index_q_norm_weight), x.index_k_norm_weight = h(a.index_k_norm_weight);
  x.slot_mapping = static_cast<const int64_t*>(h(a.slot_mapping));
  x.index_slot_mapping = static_cast<const int64_t*>(h(a.index_slot_mapping));
  x.kv_cache = h(a.kv_cache), x.v_cache = h(a.v_cache), x.index_cache = h(a.index_cache);
  x.q_out = h(a.q_out), x.q_fp8_out = h(a.q_fp8_out), x.index_q_out = h(a.index_q_out);
  x.error_flags = static_cast<uint32_t*>(h(a.error_flags));
  if (missing) return m3qkv::fail(M3QKV_ERROR_INTERNAL, "%s: a pointer outside the fake allocations", what);
  const int64_t n = int64_t(a.nq + 2 * a.nkv + a.niq + a.nik) * 128;
  const size_t xsf_bytes = size_t(m3qkv::f8_128x4_bytes(a.m, a.k / 32));
  const size_t wsf_bytes = size_t(m3qkv::f8_128x4_bytes(n, a.k / 32));
  uint64_t key = 1469598103934665603ull;
  const auto mix = [&](const void* p, size_t bytes) {
    for (size_t i = 0; i < bytes; ++i) key = (key ^ static_cast<const uint8_t*>(p)[i]) * 1099511628211ull;
  };
  mix(&a.m, sizeof(a.m));
  mix(&n, sizeof(n));
  mix(x.xq, size_t(a.m * a.k));
  mix(x.xsf, xsf_bytes);
  mix(x.wq, size_t(n * a.k));
  mix(x.wsf, wsf_bytes);
  static std::map<uint64_t, std::vector<float>> cache;
  auto it = cache.find(key);
  if (it == cache.end()) {
    it = cache.emplace(key, m3qkv::golden::mxfp8_acc(static_cast<const uint8_t*>(x.xq), static_cast<const uint8_t*>(x.xsf),
                                                     static_cast<const uint8_t*>(x.wq), static_cast<const uint8_t*>(x.wsf),
                                                     a.m, n, a.k))
             .first;
  }
  uint32_t flags = 0;
  m3qkv::golden::epilogue(x, it->second.data(), &flags);
  if (x.error_flags) *x.error_flags |= flags;
  return M3QKV_SUCCESS;
}

const char* path_launcher(int path) {
  switch (path) {
    case m3qkv::selftest::kPortable: return "portable_fused";
    case m3qkv::selftest::kSm90Tile: return "sm90_fused_variant";
    case m3qkv::selftest::kSm90Decode: return "sm90_fused_decode";
    default: return "sm100_fused";
  }
}
int problems_of(int path) {
  int n = 0;
  for (const auto& p : m3qkv::selftest::problems()) n += m3qkv::selftest::path_takes(path, p.cfg.m);
  return n;
}

m3qkv_selftest_report fresh_report() {
  m3qkv_selftest_report r;
  std::memset(&r, 0x5A, sizeof r);  // not zero: every field the call fills must be filled
  r.struct_size = sizeof r;
  return r;
}

// The report's struct_size is checked (nothing written on a wrong one); a
// NULL report is NULL_POINTER.
TEST_F(DISPATCH_SUITE, SelftestReportStructSize) {
  EXPECT_EQ(Under::selftest(kCC90, nullptr), M3QKV_ERROR_NULL_POINTER);
  EXPECT_TRUE(contains(m3qkv_last_error(), "m3qkv_selftest: report = NULL")) << m3qkv_last_error();
  for (size_t size : {size_t{0}, sizeof(m3qkv_selftest_report) - 1, sizeof(m3qkv_selftest_report) + 8, size_t{8}}) {
    m3qkv_selftest_report r;
    std::memset(&r, 0x5A, sizeof r);
    r.struct_size = size;
    m3qkv_selftest_report before = r;
    EXPECT_EQ(Under::selftest(kCC90, &r), M3QKV_ERROR_STRUCT_SIZE) << size;
    EXPECT_TRUE(contains(m3qkv_last_error(), "report->struct_size = " + std::to_string(size) +
                                                 " is not sizeof(m3qkv_selftest_report) = " +
                                                 std::to_string(sizeof(m3qkv_selftest_report))))
        << m3qkv_last_error();
    EXPECT_EQ(std::memcmp(&r, &before, sizeof r), 0) << "a report of the wrong size was written";
  }
  EXPECT_TRUE(launch_log().all.empty());
  // The released layout (LP64): a field that moves breaks callers built against it.
  static_assert(sizeof(void*) != 8 || sizeof(m3qkv_selftest_entry) == 312, "m3qkv_selftest_entry layout");
  static_assert(sizeof(void*) != 8 || (offsetof(m3qkv_selftest_report, entries) == 296 &&
                                       sizeof(m3qkv_selftest_report) == 296 + M3QKV_SELFTEST_MAX_ENTRIES * 312),
                "m3qkv_selftest_report layout");
}

// Without a GPU (or a backend for the device) the self-test says so and fills
// the report with that status; nothing is allocated or launched.
TEST_F(DISPATCH_SUITE, SelftestWithoutGpuIsUnsupportedDevice) {
  for (cudaError_t e : {cudaErrorNoDevice, cudaErrorInsufficientDriver}) {
    fake_cuda().get_count_err = e;
    m3qkv_selftest_report r = fresh_report();
    EXPECT_EQ(Under::selftest(0, &r), M3QKV_ERROR_UNSUPPORTED_DEVICE) << cudaGetErrorName(e);
    const std::string msg = m3qkv_last_error();
    EXPECT_TRUE(contains(msg, "m3qkv_selftest: ")) << msg;
    EXPECT_TRUE(contains(msg, "no CUDA driver or GPU was found") || contains(msg, "the CUDA driver is too old")) << msg;
    EXPECT_EQ(r.struct_size, sizeof r);
    EXPECT_EQ(r.status, M3QKV_ERROR_UNSUPPORTED_DEVICE);
    EXPECT_EQ(r.device, 0);
    EXPECT_EQ(r.num_entries, 0);
    EXPECT_EQ(r.problems, int(m3qkv::selftest::problems().size()));
    EXPECT_STREQ(r.message, msg.c_str());
  }
  fake_cuda().get_count_err = cudaSuccess;
  // A device too old (or without its target): its reason, as m3qkv_fused_qkv gives it.
  for (int d = 0; d < kNumFake; ++d) {
    if (expected_fused(d) != M3QKV_BACKEND_NONE) continue;
    m3qkv_selftest_report r = fresh_report();
    EXPECT_EQ(Under::selftest(d, &r), M3QKV_ERROR_UNSUPPORTED_DEVICE);
    EXPECT_TRUE(contains(m3qkv_last_error(), why_none(d))) << m3qkv_last_error();
    EXPECT_EQ(r.status, M3QKV_ERROR_UNSUPPORTED_DEVICE);
  }
  EXPECT_TRUE(fake_cuda().mallocs.empty());
  EXPECT_TRUE(launch_log().all.empty());
}

// The whole self-test on the scripted CUDA with "kernels" that write the
// golden bytes: every kernel this configuration has for the device runs every
// problem it takes and passes; the others are NOT_AVAILABLE with a reason;
// every allocation is freed, the stream destroyed, the caller's context kept.
TEST_F(DISPATCH_SUITE, SelftestRunsEveryKernelThatCanRun) {
  for (int d = 0; d < kNumFake; ++d) {
    if (expected_fused(d) == M3QKV_BACKEND_NONE) continue;
    SCOPED_TRACE("device " + std::to_string(d));
    reset_fake_cuda();
    launch_log().reset();
    launch_log().emulate = &golden_kernel;
    fake_set_current_device(kCC86);
    const size_t callers = current_ctx();
    m3qkv_selftest_report r = fresh_report();
    const m3qkv_status st = Under::selftest(d, &r);
    ASSERT_EQ(st, M3QKV_SUCCESS) << m3qkv_last_error();
    std::printf("[ info ] self-test on the scripted CUDA, device %d: %.1f ms (%s)\n", d, r.total_us / 1000.0,
                r.message);
    EXPECT_STREQ(m3qkv_last_error(), "");
    EXPECT_EQ(r.status, M3QKV_SUCCESS);
    EXPECT_EQ(r.device, d);
    EXPECT_EQ(r.cc_major, fake_cuda().cc[size_t(d)].first);
    EXPECT_EQ(r.num_entries, int(m3qkv::selftest::kPaths));
    EXPECT_TRUE(contains(r.message, "PASS")) << r.message;
    std::vector<std::string> want_launches;
    std::vector<int> want_cta;
    for (int p = 0; p < m3qkv::selftest::kPaths; ++p) {
      const m3qkv_selftest_entry& e = r.entries[p];
      const auto& info = m3qkv::selftest::path_info(p);
      SCOPED_TRACE(info.name);
      EXPECT_EQ(e.backend, info.backend);
      EXPECT_EQ(e.variant, info.variant);
      EXPECT_STREQ(e.name, info.name);
      if (!can_run(info.backend, d)) {
        EXPECT_EQ(e.result, M3QKV_SELFTEST_NOT_AVAILABLE);
        EXPECT_TRUE(contains(e.message, "not available")) << e.message;
        EXPECT_EQ(e.problems, 0);
        continue;
      }
      EXPECT_EQ(e.result, M3QKV_SELFTEST_PASS) << e.message;
      EXPECT_EQ(e.problems, problems_of(p));
      EXPECT_EQ(e.wrong_bytes, 0);
      EXPECT_EQ(e.problem, -1);
      EXPECT_EQ(e.offset, -1);
      EXPECT_EQ(e.expected, -1);
      EXPECT_STREQ(e.output, "");
      EXPECT_EQ(e.portable_agrees, p == m3qkv::selftest::kPortable || !can_run(M3QKV_BACKEND_PORTABLE, d) ? -1 : 1);
      EXPECT_GE(e.time_us, 0);
      for (int i = 0; i < e.problems; ++i) {
        want_launches.push_back(path_launcher(p));
        want_cta.push_back(p == m3qkv::selftest::kSm100Cta1 ? 1 : p == m3qkv::selftest::kSm100Cta2 ? 2 : 0);
      }
    }
    EXPECT_EQ(launch_log().all, want_launches);
    EXPECT_EQ(launch_log().cta_groups, want_cta);
    EXPECT_EQ(launch_log().dev.device, d);
    // Nothing left behind.
    std::set<void*> freed(fake_cuda().frees.begin(), fake_cuda().frees.end());
    for (const auto& m : fake_cuda().mallocs) EXPECT_EQ(freed.count(m.first), 1u) << "not freed: " << m.first;
    EXPECT_EQ(fake_cuda().streams_created, fake_cuda().streams_destroyed);
    EXPECT_EQ(current_ctx(), callers) << "the caller's context changed";
    EXPECT_EQ(t_ctx_stack.size(), 1u);
    EXPECT_TRUE(fake_cuda().set_device_log.empty()) << "the self-test changed the runtime's current device";
  }
}

// The test-only fault flips one q_out byte of every launch of one backend:
// exactly that backend's kernels fail, the report names the first wrong byte
// (problem 0, q_out, the offset, golden byte and golden ^ mask) and counts one
// per problem it hit; the others pass; compared with the portable kernel the
// faulty one disagrees.
TEST_F(DISPATCH_SUITE, SelftestReportsExactlyTheFaultyBackend) {
  const int64_t kOffset = 37;
  const unsigned kMask = 0x10;
  for (int d = 0; d < kNumFake; ++d) {
    for (m3qkv_backend_kind faulty : kKinds) {
      if (!can_run(faulty, d)) continue;
      SCOPED_TRACE("device " + std::to_string(d) + ", fault in " + m3qkv_backend_name(faulty));
      reset_fake_cuda();
      launch_log().reset();
      launch_log().emulate = &golden_kernel;
      ASSERT_EQ(m3qkv_testing_inject_fault(faulty, "q_out", kOffset, kMask), M3QKV_SUCCESS) << m3qkv_last_error();
      m3qkv_selftest_report r = fresh_report();
      const m3qkv_status st = Under::selftest(d, &r);
      const std::string msg = m3qkv_last_error();
      m3qkv_testing_inject_fault(M3QKV_BACKEND_NONE, nullptr, 0, 0);
      ASSERT_EQ(st, M3QKV_ERROR_SELFTEST_FAILED) << msg;
      EXPECT_EQ(r.status, M3QKV_ERROR_SELFTEST_FAILED);
      EXPECT_STREQ(r.message, msg.c_str());
      int first = -1;
      for (int p = 0; p < m3qkv::selftest::kPaths; ++p) {
        const m3qkv_selftest_entry& e = r.entries[p];
        const auto& info = m3qkv::selftest::path_info(p);
        SCOPED_TRACE(info.name);
        if (!can_run(info.backend, d)) {
          EXPECT_EQ(e.result, M3QKV_SELFTEST_NOT_AVAILABLE);
          continue;
        }
        if (info.backend != faulty) {
          EXPECT_EQ(e.result, M3QKV_SELFTEST_PASS) << e.message;
          if (p != m3qkv::selftest::kPortable && faulty == M3QKV_BACKEND_PORTABLE) {
            EXPECT_EQ(e.portable_agrees, 0) << "a correct kernel must disagree with the faulty portable one";
          }
          continue;
        }
        if (first < 0) first = p;
        EXPECT_EQ(e.result, M3QKV_SELFTEST_FAIL) << e.message;
        // The first problem with a q_out is the first wrong one; every
        // problem with a q_out gets one flipped byte.
        int64_t want_wrong = 0, want_problem = -1;
        const auto& probs = m3qkv::selftest::problems();
        for (size_t i = 0; i < probs.size(); ++i) {
          if (!m3qkv::selftest::path_takes(p, probs[i].cfg.m) || !probs[i].cfg.q_bf16) continue;
          if (want_problem < 0) want_problem = int64_t(i);
          ++want_wrong;
        }
        EXPECT_EQ(e.problem, want_problem);
        EXPECT_STREQ(e.output, "q_out");
        EXPECT_EQ(e.offset, kOffset);
        ASSERT_GE(e.expected, 0);
        EXPECT_EQ(e.got, e.expected ^ int(kMask));
        EXPECT_EQ(e.wrong_bytes, want_wrong);
        EXPECT_TRUE(contains(e.message, "q_out byte 37")) << e.message;
        if (p != m3qkv::selftest::kPortable && can_run(M3QKV_BACKEND_PORTABLE, d)) {
          EXPECT_EQ(e.portable_agrees, 0);
        }
      }
      ASSERT_GE(first, 0);
      EXPECT_TRUE(contains(msg, std::string("first: ") + m3qkv::selftest::path_info(first).name)) << msg;
      EXPECT_TRUE(contains(msg, "q_out byte 37")) << msg;
    }
  }
}

// A kernel that does nothing (no golden writer): every byte it must write is
// still poison, and the report says so; a launcher error is ERROR with its
// message; both leave nothing allocated.
#if !DISPATCH_NO_BACKEND
TEST_F(DISPATCH_SUITE, SelftestCatchesUnwrittenOutputsAndLaunchErrors) {
  const int d = kCC90;
  ASSERT_NE(expected_fused(d), M3QKV_BACKEND_NONE);
  m3qkv_selftest_report r = fresh_report();
  ASSERT_EQ(Under::selftest(d, &r), M3QKV_ERROR_SELFTEST_FAILED);
  for (int p = 0; p < m3qkv::selftest::kPaths; ++p) {
    const m3qkv_selftest_entry& e = r.entries[p];
    if (!can_run(m3qkv::selftest::path_info(p).backend, d)) continue;
    EXPECT_EQ(e.result, M3QKV_SELFTEST_FAIL) << e.name;
    EXPECT_EQ(e.problem, 0) << e.name;
    EXPECT_STREQ(e.output, "q_out") << e.name;
    // Problem 0's q_out is the image's first buffer, after one guard zone:
    // its byte `offset` still holds the poison of image byte 256 + offset.
    ASSERT_GE(e.offset, 0) << e.name;
    EXPECT_LT(e.offset, 4096) << e.name;
    EXPECT_EQ(e.got, m3qkv::golden::poison_byte(size_t(256 + e.offset))) << e.name;
    EXPECT_NE(e.got, e.expected) << e.name;
    EXPECT_GT(e.wrong_bytes, 1000) << e.name;
  }
  reset_fake_cuda();
  launch_log().reset();
  launch_log().result = M3QKV_ERROR_CUDA_ERROR;
  r = fresh_report();
  ASSERT_EQ(Under::selftest(d, &r), M3QKV_ERROR_SELFTEST_FAILED);
  for (int p = 0; p < m3qkv::selftest::kPaths; ++p) {
    const m3qkv_selftest_entry& e = r.entries[p];
    if (!can_run(m3qkv::selftest::path_info(p).backend, d)) continue;
    EXPECT_EQ(e.result, M3QKV_SELFTEST_ERROR) << e.name;
    EXPECT_EQ(e.problem, 0) << e.name;
    EXPECT_EQ(e.problems, 0) << e.name;
    EXPECT_TRUE(contains(e.message, "scripted failure")) << e.message;
  }
  std::set<void*> freed(fake_cuda().frees.begin(), fake_cuda().frees.end());
  for (const auto& m : fake_cuda().mallocs) EXPECT_EQ(freed.count(m.first), 1u);
  // A failing copy of the self-test's own: CUDA_ERROR naming it, nothing left.
  reset_fake_cuda();
  launch_log().reset();
  fake_cuda().memcpy_err = cudaErrorInvalidValue;
  r = fresh_report();
  EXPECT_EQ(Under::selftest(d, &r), M3QKV_ERROR_CUDA_ERROR);
  EXPECT_TRUE(contains(m3qkv_last_error(), "cudaMemcpyAsync (self-test inputs)")) << m3qkv_last_error();
  EXPECT_EQ(r.status, M3QKV_ERROR_CUDA_ERROR);
  freed = std::set<void*>(fake_cuda().frees.begin(), fake_cuda().frees.end());
  for (const auto& m : fake_cuda().mallocs) EXPECT_EQ(freed.count(m.first), 1u);
  EXPECT_EQ(fake_cuda().streams_created, fake_cuda().streams_destroyed);
}
#endif  // !DISPATCH_NO_BACKEND

// ======================================================== warmup self-test
// M3QKV_SELFTEST_ON_WARMUP=1: the automatic backend's self-test; when it
// fails, the next backend that passes is used (WARNING_BACKEND_FALLBACK, the
// reason in the message, m3qkv_backend and m3qkv_fused_qkv follow); a later
// warmup that passes goes back. An explicit choice is never replaced.
TEST_F(DISPATCH_SUITE, WarmupSelftestFallsBackFromTheAutomaticBackend) {
  for (int d = 0; d < kNumFake; ++d) {
    const m3qkv_backend_kind automatic = expected_fused(d);
    if (automatic == M3QKV_BACKEND_NONE) continue;
    SCOPED_TRACE("device " + std::to_string(d));
    reset_backend_settings();
    reset_fake_cuda();
    launch_log().reset();
    launch_log().emulate = &golden_kernel;
    m3qkv::api::testing_set_env(nullptr, "1");
    ASSERT_EQ(Under::warmup(d), M3QKV_SUCCESS) << m3qkv_last_error();
    EXPECT_STREQ(m3qkv_last_error(), "");
    // Only the automatic backend's kernels ran (besides the warmups).
    int launches = 0;
    for (const std::string& l : launch_log().all) {
      if (l.find("warmup") != std::string::npos) continue;
      ++launches;
      EXPECT_TRUE(l.find(m3qkv_backend_name(automatic)) != std::string::npos) << l;
    }
    EXPECT_GT(launches, 0) << "the self-test did not run";
    if (automatic == M3QKV_BACKEND_PORTABLE) continue;  // nothing to fall back to
    ASSERT_EQ(m3qkv_testing_inject_fault(automatic, "q_out", 5, 1), M3QKV_SUCCESS);
    const m3qkv_status st = Under::warmup(d);
    const std::string msg = m3qkv_last_error();
    ASSERT_EQ(st, M3QKV_WARNING_BACKEND_FALLBACK) << msg;
    EXPECT_TRUE(contains(msg, std::string("the self-test of ") + m3qkv_backend_name(automatic) +
                                  ", the automatic backend, FAILED"))
        << msg;
    EXPECT_TRUE(contains(msg, "q_out byte 5")) << msg;
    EXPECT_TRUE(contains(msg, "now uses portable, which passed")) << msg;
    m3qkv_backend_kind k = M3QKV_BACKEND_NONE;
    EXPECT_EQ(Under::backend(d, &k), M3QKV_SUCCESS);
    EXPECT_EQ(k, M3QKV_BACKEND_PORTABLE);
    launch_log().reset();  // a recorder only: good_fused() has fake pointers
    const m3qkv_fused_args a = good_fused();
    fake_set_current_device(d);
    EXPECT_EQ(Under::fused(&a), M3QKV_SUCCESS) << m3qkv_last_error();
    EXPECT_EQ(launch_log().last, "portable_fused");
    // Fixed: the next warmup goes back to the automatic backend.
    launch_log().emulate = &golden_kernel;
    m3qkv_testing_inject_fault(M3QKV_BACKEND_NONE, nullptr, 0, 0);
    EXPECT_EQ(Under::warmup(d), M3QKV_SUCCESS) << m3qkv_last_error();
    EXPECT_EQ(Under::backend(d, &k), M3QKV_SUCCESS);
    EXPECT_EQ(k, automatic);
    // Explicitly chosen and failing: an error, and it stays chosen.
    ASSERT_EQ(Under::set_backend(d, automatic), M3QKV_SUCCESS);
    m3qkv_testing_inject_fault(automatic, "q_out", 5, 1);
    EXPECT_EQ(Under::warmup(d), M3QKV_ERROR_SELFTEST_FAILED);
    EXPECT_TRUE(contains(m3qkv_last_error(), "chosen by m3qkv_set_backend")) << m3qkv_last_error();
    EXPECT_EQ(Under::backend(d, &k), M3QKV_SUCCESS);
    EXPECT_EQ(k, automatic);
    m3qkv_testing_inject_fault(M3QKV_BACKEND_NONE, nullptr, 0, 0);
  }
}

#if !DISPATCH_NO_BACKEND
TEST_F(DISPATCH_SUITE, WarmupSelftestWithNoPassingBackendAndBadFlag) {
  const int d = kCC90;
  ASSERT_NE(expected_fused(d), M3QKV_BACKEND_NONE);
  m3qkv::api::testing_set_env(nullptr, "1");
  // Kernels that write nothing: every backend fails.
  EXPECT_EQ(Under::warmup(d), M3QKV_ERROR_SELFTEST_FAILED);
  const bool several = automatic_has_fallback(d);
  EXPECT_TRUE(contains(m3qkv_last_error(), several ? "no other backend passed" : "no other backend to fall back to"))
      << m3qkv_last_error();
  m3qkv_backend_kind k = M3QKV_BACKEND_NONE;
  EXPECT_EQ(Under::backend(d, &k), M3QKV_SUCCESS);
  EXPECT_EQ(k, expected_fused(d)) << "a failed self-test with nothing better must not change the backend";
  m3qkv::api::testing_set_env(nullptr, "yes");
  EXPECT_EQ(Under::warmup(d), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(m3qkv_last_error(), "M3QKV_SELFTEST_ON_WARMUP = \"yes\" is not 0 or 1")) << m3qkv_last_error();
  m3qkv::api::testing_set_env(nullptr, "0");
  launch_log().reset();
  EXPECT_EQ(Under::warmup(d), M3QKV_SUCCESS) << m3qkv_last_error();
  for (const std::string& l : launch_log().all) EXPECT_TRUE(l.find("warmup") != std::string::npos) << l;
}
#endif  // !DISPATCH_NO_BACKEND

}  // namespace
