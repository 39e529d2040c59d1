// Test harness for the dispatch layer of src/api/api.cpp without a GPU.
//
// A test TU defines M3QKV_WITH_PORTABLE / M3QKV_WITH_SM90 / M3QKV_WITH_SM100
// (and optionally M3QKV_HAVE_SM90_KERNEL) plus DISPATCH_PREFIX, then includes
// this header. It compiles its own copy of api.cpp in which
//   - the backend launchers / warmups are replaced by recorders,
//   - the entry points are renamed DISPATCH_PREFIX##<name> so several copies
//     (one per build configuration) link into one test binary next to the
//     real library.
// The host layer (validation, errors, contexts, device facts) is the real one
// from m3qkv_static, running on the scripted CUDA of fake_cuda.h, which the
// suite's fixture installs. Nothing here touches a real GPU, so these tests
// behave the same on CPU-only and GPU machines.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "api/internal.h"
#include "fake_cuda.h"
#include "host/device.h"
#include "host/status.h"
#include "api/validate.h"
#include "m3qkv/m3qkv.h"
#include "portable/portable.h"
#include "sm100/sm100.h"
#include "sm90/sm90.h"
#include "valid_args.h"

#ifndef DISPATCH_PREFIX
#error "define DISPATCH_PREFIX before including api_dispatch_harness.h"
#endif

namespace {

// ---------------------------------------------------------------------------
// Recording launchers.
// ---------------------------------------------------------------------------
struct LaunchLog {
  std::string last;  // "portable_fused", "sm100_warmup", ...
  std::vector<std::string> all;
  m3qkv::DeviceInfo dev;
  const float* acc_tap = nullptr;
  cudaStream_t stream = nullptr;
  m3qkv_status result = M3QKV_SUCCESS;  // what the launchers return
  std::vector<int> cta_groups;          // of every fused launch
  std::vector<const void*> x_bf16s;     // x_bf16 of every fused launch (bf16 activations reach the launcher)
  // When set, every fused launcher also runs this on its arguments (the
  // self-test tests: a "kernel" that writes the golden bytes into the fake
  // device memory); its status is the launcher's.
  m3qkv_status (*emulate)(const char* what, const m3qkv_fused_args&) = nullptr;
  void reset() { *this = LaunchLog{}; }
};
LaunchLog& launch_log() {
  static LaunchLog l;
  return l;
}
m3qkv_status record(const char* what, const m3qkv::DeviceInfo& d, const float* tap, cudaStream_t s) {
  auto& l = launch_log();
  l.last = what;
  l.all.push_back(what);
  l.dev = d;
  l.acc_tap = tap;
  l.stream = s;
  if (l.result != M3QKV_SUCCESS) return m3qkv::fail(l.result, "%s: scripted failure", what);
  return M3QKV_SUCCESS;
}

m3qkv_status record_fused(const char* what, const m3qkv_fused_args& a, const m3qkv::DeviceInfo& d, const float* tap,
                          cudaStream_t s) {
  launch_log().cta_groups.push_back(a.cta_group);
  launch_log().x_bf16s.push_back(a.x_bf16);
  const m3qkv_status st = record(what, d, tap, s);
  if (st != M3QKV_SUCCESS || launch_log().emulate == nullptr) return st;
  return launch_log().emulate(what, a);
}

}  // namespace

namespace m3qkv {
namespace {
[[maybe_unused]] m3qkv_status fake_portable_fused(const m3qkv_fused_args& a, const DeviceInfo& d, float* t,
                                                  cudaStream_t s) {
  return record_fused("portable_fused", a, d, t, s);
}
[[maybe_unused]] m3qkv_status fake_portable_gemm(const m3qkv_gemm_args&, const DeviceInfo& d, cudaStream_t s) {
  return record("portable_gemm", d, nullptr, s);
}
[[maybe_unused]] m3qkv_status fake_portable_insert(const m3qkv_insert_args&, const DeviceInfo& d, cudaStream_t s,
                                                   int) {
  return record("portable_insert", d, nullptr, s);
}
[[maybe_unused]] m3qkv_status fake_portable_quantize(const m3qkv_quantize_args&, const DeviceInfo& d,
                                                     cudaStream_t s) {
  return record("portable_quantize", d, nullptr, s);
}
[[maybe_unused]] m3qkv_status fake_portable_prepare(const m3qkv_prepare_args&, const DeviceInfo& d, cudaStream_t s) {
  return record("portable_prepare", d, nullptr, s);
}
[[maybe_unused]] m3qkv_status fake_sm90_fused(const m3qkv_fused_args& a, const DeviceInfo& d, float* t,
                                              cudaStream_t s) {
  return record_fused("sm90_fused", a, d, t, s);
}
[[maybe_unused]] m3qkv_status fake_sm90_fused_variant(const m3qkv_fused_args& a, const DeviceInfo& d, float* t,
                                                      cudaStream_t s, int, int, int) {
  return record_fused("sm90_fused_variant", a, d, t, s);
}
[[maybe_unused]] m3qkv_status fake_sm90_fused_decode(const m3qkv_fused_args& a, const DeviceInfo& d, float* t,
                                                     cudaStream_t s, int, int) {
  return record_fused("sm90_fused_decode", a, d, t, s);
}
[[maybe_unused]] m3qkv_status fake_sm100_fused(const m3qkv_fused_args& a, const DeviceInfo& d, float* t,
                                               cudaStream_t s) {
  return record_fused("sm100_fused", a, d, t, s);
}
[[maybe_unused]] m3qkv_status fake_portable_warmup(const DeviceInfo& d) { return record("portable_warmup", d, nullptr, nullptr); }
[[maybe_unused]] m3qkv_status fake_sm90_warmup(const DeviceInfo& d) { return record("sm90_warmup", d, nullptr, nullptr); }
[[maybe_unused]] m3qkv_status fake_sm100_warmup(const DeviceInfo& d) { return record("sm100_warmup", d, nullptr, nullptr); }
}  // namespace
}  // namespace m3qkv

// ---------------------------------------------------------------------------
// The copy of api.cpp under test.
// ---------------------------------------------------------------------------
#define DISPATCH_CAT2(a, b) a##b
#define DISPATCH_CAT(a, b) DISPATCH_CAT2(a, b)

#define portable_fused fake_portable_fused
#define portable_gemm fake_portable_gemm
#define portable_insert fake_portable_insert
#define portable_quantize fake_portable_quantize
#define portable_prepare fake_portable_prepare
#define sm90_fused fake_sm90_fused
#define sm90_fused_variant fake_sm90_fused_variant
#define sm90_fused_decode fake_sm90_fused_decode
#define sm100_fused fake_sm100_fused
#define portable_warmup fake_portable_warmup
#define sm90_warmup fake_sm90_warmup
#define sm100_warmup fake_sm100_warmup

#define m3qkv_fused_qkv DISPATCH_CAT(DISPATCH_PREFIX, fused_qkv)
#define m3qkv_testing_fused_qkv DISPATCH_CAT(DISPATCH_PREFIX, testing_fused_qkv)
#define m3qkv_qknorm_rope_kv_insert DISPATCH_CAT(DISPATCH_PREFIX, qknorm_rope_kv_insert)
#define m3qkv_mxfp8_gemm DISPATCH_CAT(DISPATCH_PREFIX, mxfp8_gemm)
#define m3qkv_mxfp8_quantize DISPATCH_CAT(DISPATCH_PREFIX, mxfp8_quantize)
#define m3qkv_prepare_weights_fp8 DISPATCH_CAT(DISPATCH_PREFIX, prepare_weights_fp8)
#define m3qkv_prepare_weights_fp8_sizes DISPATCH_CAT(DISPATCH_PREFIX, prepare_weights_fp8_sizes)
#define m3qkv_backend DISPATCH_CAT(DISPATCH_PREFIX, backend)
#define m3qkv_warmup DISPATCH_CAT(DISPATCH_PREFIX, warmup)
#define m3qkv_selftest DISPATCH_CAT(DISPATCH_PREFIX, selftest)
#define m3qkv_set_backend DISPATCH_CAT(DISPATCH_PREFIX, set_backend)
#define m3qkv_release_stream DISPATCH_CAT(DISPATCH_PREFIX, release_stream)

#include "api/api.cpp"

#undef portable_fused
#undef portable_gemm
#undef portable_insert
#undef portable_quantize
#undef portable_prepare
#undef sm90_fused
#undef sm90_fused_variant
#undef sm90_fused_decode
#undef sm100_fused
#undef portable_warmup
#undef sm90_warmup
#undef sm100_warmup
#undef m3qkv_fused_qkv
#undef m3qkv_testing_fused_qkv
#undef m3qkv_qknorm_rope_kv_insert
#undef m3qkv_mxfp8_gemm
#undef m3qkv_mxfp8_quantize
#undef m3qkv_prepare_weights_fp8
#undef m3qkv_prepare_weights_fp8_sizes
#undef m3qkv_backend
#undef m3qkv_warmup
#undef m3qkv_selftest
#undef m3qkv_set_backend
#undef m3qkv_release_stream

// Handles on this configuration's copy of the entry points.
namespace {
struct Under {
  static m3qkv_status fused(const m3qkv_fused_args* a, cudaStream_t s = nullptr) {
    return DISPATCH_CAT(DISPATCH_PREFIX, fused_qkv)(a, s);
  }
  static m3qkv_status testing_fused(const m3qkv_fused_args* a, float* tap, m3qkv_backend_kind force,
                                    cudaStream_t s = nullptr) {
    return DISPATCH_CAT(DISPATCH_PREFIX, testing_fused_qkv)(a, tap, force, s);
  }
  static m3qkv_status insert(const m3qkv_insert_args* a) { return DISPATCH_CAT(DISPATCH_PREFIX, qknorm_rope_kv_insert)(a, nullptr); }
  static m3qkv_status gemm(const m3qkv_gemm_args* a) { return DISPATCH_CAT(DISPATCH_PREFIX, mxfp8_gemm)(a, nullptr); }
  static m3qkv_status quantize(const m3qkv_quantize_args* a) { return DISPATCH_CAT(DISPATCH_PREFIX, mxfp8_quantize)(a, nullptr); }
  static m3qkv_status backend(int d, m3qkv_backend_kind* k) { return DISPATCH_CAT(DISPATCH_PREFIX, backend)(d, k); }
  static m3qkv_status warmup(int d) { return DISPATCH_CAT(DISPATCH_PREFIX, warmup)(d); }
  static m3qkv_status selftest(int d, m3qkv_selftest_report* r) { return DISPATCH_CAT(DISPATCH_PREFIX, selftest)(d, r); }
  static m3qkv_status set_backend(int d, m3qkv_backend_kind k) { return DISPATCH_CAT(DISPATCH_PREFIX, set_backend)(d, k); }
  static m3qkv_status query(int d, m3qkv::DeviceInfo* out) { return m3qkv::query_device(d, out); }
};

// Fake but aligned pointers (never dereferenced: the launchers are recorders)
// and valid TP4 argument structs: tests/cpu/valid_args.h. The dispatch tests
// use them without PDL and without an error_flags word.
template <class T = void>
T* dptr(int slot) {
  return m3qkv_valid_args::fake<T>(slot);
}
template <class A>
A without_pdl(A a) {
  a.use_pdl = 0;
  return a;
}
template <class A>
A without_pdl_and_flags(A a) {
  a.use_pdl = 0;
  a.error_flags = nullptr;
  return a;
}
inline m3qkv_fused_args good_fused() { return without_pdl_and_flags(m3qkv_valid_args::valid_fused()); }
inline m3qkv_insert_args good_insert() { return without_pdl_and_flags(m3qkv_valid_args::valid_insert()); }
inline m3qkv_gemm_args good_gemm() { return without_pdl(m3qkv_valid_args::valid_gemm()); }
inline m3qkv_quantize_args good_quantize() { return without_pdl(m3qkv_valid_args::valid_quantize()); }

// Fake device ordinals (see FakeCuda::cc).
enum FakeDevice { kCC75 = 0, kCC80 = 1, kCC86 = 2, kCC90 = 3, kCC100 = 4, kCC103 = 5, kCC120 = 6, kNumFake = 7 };

// Adds a fake device that nothing has queried yet (so it is not cached).
inline int fresh_device(int major, int minor) {
  auto& f = fake_cuda();
  std::lock_guard<std::mutex> lock(f.mu);
  f.cc.emplace_back(major, minor);
  return static_cast<int>(f.cc.size()) - 1;
}

inline bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }
}  // namespace
