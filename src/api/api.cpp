// The public entry points: validate, skip empty batches, find the call's
// context, dispatch to a backend (rule at the end of api/internal.h).
//
// Every entry point follows the same sequence:
//   clear_error -> validate_* (launches nothing) -> m == 0: SUCCESS ->
//   the stream's context and its device facts (host/context.h; cached per
//   context) -> checked mode's pointer checks when on (api/checked.h) ->
//   backend choice -> launcher, with the stream's context current. Test-only
//   phase marks (host/timing.h) time each step.
// No exception crosses the C boundary: each body runs inside guarded().
//
// The backend choice of m3qkv_fused_qkv (fused_choice: m3qkv_set_backend or
// the warmup's fallback, M3QKV_BACKEND, automatic) and the self-test
// (m3qkv_selftest, m3qkv_warmup with M3QKV_SELFTEST_ON_WARMUP=1) live here
// too: which kernels this build and device have is this file's knowledge; the
// self-test engine (api/selftest.h) gets them as a request and a launcher.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "api/internal.h"
#include "api/overrides.h"
#include "api/selftest.h"
#include "api/backend_choice.h"
#include "host/cuda.h"
#include "api/checked.h"
#include "host/context.h"
#include "host/device.h"
#include "api/extents.h"
#include "api/fault.h"
#include "host/status.h"
#include "host/timing.h"
#include "api/validate.h"
#include "host/workspace.h"
#include "portable/portable.h"
#include "sm100/sm100.h"
#include "sm90/sm90.h"

// Build switches (set by CMake for the library target). Defaults keep this
// file compilable on its own: a backend counts as present only when enabled.
#ifndef M3QKV_WITH_PORTABLE
#define M3QKV_WITH_PORTABLE 0
#endif
#ifndef M3QKV_WITH_SM90
#define M3QKV_WITH_SM90 0
#endif
#ifndef M3QKV_WITH_SM100
#define M3QKV_WITH_SM100 0
#endif
// The Hopper kernel is a separate source that defines M3QKV_HAVE_SM90_KERNEL
// in CMake when it exists; building for 90a alone does not give an SM90 backend.
#if M3QKV_WITH_SM90 && defined(M3QKV_HAVE_SM90_KERNEL)
#define M3QKV_SM90_BACKEND 1
#else
#define M3QKV_SM90_BACKEND 0
#endif
// Test build: the SM100 kernel compiled for sm_90a with tcgen05 emulated, so
// it can be forced (m3qkv_testing_fused_qkv) on a CC 9.0 device.
#if defined(M3QKV_TCGEN05_EMULATION) && M3QKV_TCGEN05_EMULATION
#define M3QKV_SM100_ON_SM90 1
#else
#define M3QKV_SM100_ON_SM90 0
#endif

namespace m3qkv {
namespace {

constexpr bool kHavePortable = M3QKV_WITH_PORTABLE;
constexpr bool kHaveSm90 = M3QKV_SM90_BACKEND;
constexpr bool kHaveSm100 = M3QKV_WITH_SM100;

// Runs an entry point body; anything thrown (std::bad_alloc from the device
// cache, a bug) becomes M3QKV_ERROR_INTERNAL instead of crossing the C boundary.
template <class F>
m3qkv_status guarded(const char* fn, F&& body) noexcept {
  try {
    clear_error();
    return body();
  } catch (const std::exception& e) {
    return fail(M3QKV_ERROR_INTERNAL, "%s: internal error: %s", fn, e.what());
  } catch (...) {
    return fail(M3QKV_ERROR_INTERNAL, "%s: internal error: unknown exception", fn);
  }
}

// ---------------------------------------------------------------------------
// Backend choice
// ---------------------------------------------------------------------------

bool portable_runs_on(const DeviceInfo& d) { return d.cc_major >= 8; }
bool sm90_runs_on(const DeviceInfo& d) { return d.cc_major == 9 && d.cc_minor == 0; }
bool sm100_runs_on(const DeviceInfo& d) { return d.cc_major == 10 || (M3QKV_SM100_ON_SM90 && sm90_runs_on(d)); }

// The fused backend for `d` (dispatch rule in api/internal.h); NONE when there is none.
m3qkv_backend_kind fused_backend_for(const DeviceInfo& d) {
  if (kHaveSm100 && d.cc_major == 10) return M3QKV_BACKEND_SM100;
  if (kHaveSm90 && sm90_runs_on(d)) return M3QKV_BACKEND_SM90;
  if (kHavePortable && portable_runs_on(d)) return M3QKV_BACKEND_PORTABLE;
  return M3QKV_BACKEND_NONE;
}

// UNSUPPORTED_DEVICE for a device with no usable portable kernels: says
// whether the hardware is too old or the library lacks the target.
m3qkv_status no_portable(const char* fn, const DeviceInfo& d) {
  if (!portable_runs_on(d)) {
    return fail(M3QKV_ERROR_UNSUPPORTED_DEVICE,
                "%s: device %d has compute capability %d.%d; m3qkv needs 8.0 or newer", fn, d.device, d.cc_major,
                d.cc_minor);
  }
  return fail(M3QKV_ERROR_UNSUPPORTED_DEVICE,
              "%s: device %d (compute capability %d.%d) needs the portable backend, but this library was built "
              "without the sm_80 target (M3QKV_CUDA_ARCHS does not contain 80)",
              fn, d.device, d.cc_major, d.cc_minor);
}

// Explains an explicit backend choice (`what`: force_backend, M3QKV_BACKEND,
// m3qkv_set_backend's kind, ...) that cannot run here.
m3qkv_status cannot_run(const char* fn, const char* what, m3qkv_backend_kind b, const DeviceInfo& d, bool built,
                        const char* target) {
  if (!built) {
    return fail(M3QKV_ERROR_UNSUPPORTED_DEVICE, "%s: %s = %s, but this library was built without the %s target%s", fn,
                what, m3qkv_backend_name(b), target,
                b == M3QKV_BACKEND_SM90 ? " (or without the Hopper kernel source)" : "");
  }
  return fail(M3QKV_ERROR_UNSUPPORTED_DEVICE, "%s: %s = %s cannot run on device %d (compute capability %d.%d)", fn, what,
              m3qkv_backend_name(b), d.device, d.cc_major, d.cc_minor);
}

// SUCCESS when backend b is compiled in and runs on d.
m3qkv_status check_can_run(const char* fn, const char* what, m3qkv_backend_kind b, const DeviceInfo& d) {
  switch (b) {
    case M3QKV_BACKEND_PORTABLE:
      if (!kHavePortable || !portable_runs_on(d)) return cannot_run(fn, what, b, d, kHavePortable, "sm_80");
      return M3QKV_SUCCESS;
    case M3QKV_BACKEND_SM90:
      if (!kHaveSm90 || !sm90_runs_on(d)) return cannot_run(fn, what, b, d, kHaveSm90, "sm_90a");
      return M3QKV_SUCCESS;
    case M3QKV_BACKEND_SM100:
      if (!kHaveSm100 || !sm100_runs_on(d)) return cannot_run(fn, what, b, d, kHaveSm100, "sm_100f");
      return M3QKV_SUCCESS;
    case M3QKV_BACKEND_NONE:
      break;
  }
  return fail(M3QKV_ERROR_INTERNAL, "%s: %s = %d is not a backend", fn, what, static_cast<int>(b));
}

// The backend m3qkv_fused_qkv uses on d without a forced one (m3qkv.h,
// "Backend choice"): the device's explicit choice, else M3QKV_BACKEND, else
// automatic. *out is NONE only for the automatic choice of a device that has
// no backend; an explicit choice that cannot run is an error, never replaced.
m3qkv_status fused_choice(const char* fn, const DeviceInfo& d, m3qkv_backend_kind* out) {
  *out = M3QKV_BACKEND_NONE;
  const api::BackendEnv& env = api::backend_env();
  if (!env.valid) {
    return fail(M3QKV_ERROR_INVALID_ARGUMENT,
                "%s: M3QKV_BACKEND = \"%s\" is not one of auto, portable, sm90, sm100 (the environment variable is "
                "read once, at the first call)",
                fn, env.text);
  }
  const api::DeviceChoice c = api::device_choice(d.device);
  if (c.origin != api::ChoiceOrigin::kNone) {
    M3QKV_TRY(check_can_run(
        fn, c.origin == api::ChoiceOrigin::kApi ? "m3qkv_set_backend" : "the self-test fallback of m3qkv_warmup",
        c.kind, d));
    *out = c.kind;
    return M3QKV_SUCCESS;
  }
  if (env.kind != M3QKV_BACKEND_NONE) {
    M3QKV_TRY(check_can_run(fn, "M3QKV_BACKEND", env.kind, d));
    *out = env.kind;
    return M3QKV_SUCCESS;
  }
  *out = fused_backend_for(d);
  return M3QKV_SUCCESS;
}

// Resolves `force` (NONE = the backend choice) to a backend that can run on `d`.
m3qkv_status choose_fused(const char* fn, const DeviceInfo& d, m3qkv_backend_kind force, m3qkv_backend_kind* out) {
  if (force == M3QKV_BACKEND_NONE) {
    M3QKV_TRY(fused_choice(fn, d, out));
    if (*out == M3QKV_BACKEND_NONE) return no_portable(fn, d);
    return M3QKV_SUCCESS;
  }
  M3QKV_TRY(check_can_run(fn, "force_backend", force, d));
  *out = force;
  return M3QKV_SUCCESS;
}

// bf16 activations (x_bf16, appended in 0.3): the portable backend runs
// them; SM90 receives them with the rest of the args (its kernels read
// x_bf16); the SM100 kernel has no bf16-activation mainloop and refuses them
// by name, before anything is launched.
// batch_invariant likewise: the SM100 decode kernel splits K by M.
m3qkv_status check_sm100_refusals(m3qkv_backend_kind b, const m3qkv_fused_args& a) {
  if (b != M3QKV_BACKEND_SM100) return M3QKV_SUCCESS;
  if (a.x_bf16 != nullptr)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT,
                "m3qkv_fused_qkv: x_bf16 (bf16 activations) is not supported by the sm100 backend; pass xq/xsf or use "
                "M3QKV_BACKEND=sm90/portable");
  if (a.batch_invariant != 0)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT,
                "m3qkv_fused_qkv: batch_invariant = 1 is not supported by the sm100 backend; use "
                "M3QKV_BACKEND=sm90/portable or batch_invariant = 0");
  return M3QKV_SUCCESS;
}

// The fp8 fast mode (precision 1) is a Hopper mainloop: the other backends
// refuse it by name rather than run exact mode on weights the caller folded.
m3qkv_status check_precision_backend(m3qkv_backend_kind b, const m3qkv_fused_args& a) {
  if (a.precision == 0 || b == M3QKV_BACKEND_SM90) return M3QKV_SUCCESS;
  return fail(M3QKV_ERROR_INVALID_ARGUMENT,
              "m3qkv_fused_qkv: precision = 1 (fp8 fast mode) runs on the sm90 backend only, not %s; use precision = 0",
              m3qkv_backend_name(b));
}

m3qkv_status launch_fused(m3qkv_backend_kind b, const m3qkv_fused_args& a, const DeviceInfo& d, float* acc_tap,
                          cudaStream_t s) {
  (void)a, (void)d, (void)acc_tap, (void)s;  // unused when no backend is compiled in
  M3QKV_TRY(check_sm100_refusals(b, a));
  M3QKV_TRY(check_precision_backend(b, a));
  m3qkv_status st = M3QKV_ERROR_INTERNAL;
  bool compiled = false;  // choose_fused only returns backends that are compiled in
  switch (b) {
    case M3QKV_BACKEND_PORTABLE:
#if M3QKV_WITH_PORTABLE
      st = portable_fused(a, d, acc_tap, s), compiled = true;
#endif
      break;
    case M3QKV_BACKEND_SM90:
#if M3QKV_SM90_BACKEND
      st = sm90_fused(a, d, acc_tap, s), compiled = true;
#endif
      break;
    case M3QKV_BACKEND_SM100:
#if M3QKV_WITH_SM100
      st = sm100_fused(a, d, acc_tap, s), compiled = true;
#endif
      break;
    case M3QKV_BACKEND_NONE:
      break;
  }
  if (!compiled) return fail(M3QKV_ERROR_INTERNAL, "m3qkv_fused_qkv: backend %s is not compiled in", m3qkv_backend_name(b));
  if (st == M3QKV_SUCCESS) st = api::apply_fault("m3qkv_fused_qkv", b, a, s);  // test-only; one load when off
  return st;
}

// ---------------------------------------------------------------------------
// Self-test (api/selftest.h runs it; this file knows the kernels)
// ---------------------------------------------------------------------------

// The self-test's launcher of each kernel: the auto dispatch of each backend,
// with the variant forced (the SM90 tile kernel on every M, SM100's cta_group).
m3qkv_status selftest_launch(int path, const m3qkv_fused_args& a, const DeviceInfo& d, cudaStream_t s) {
  m3qkv_fused_args x = a;
  (void)d, (void)s;  // unused when no backend is compiled in
  m3qkv_status st = M3QKV_ERROR_INTERNAL;
  bool compiled = false;
  switch (path) {
    case selftest::kPortable:
#if M3QKV_WITH_PORTABLE
      st = portable_fused(x, d, nullptr, s), compiled = true;
#endif
      break;
    case selftest::kSm90Tile:
#if M3QKV_SM90_BACKEND
      st = sm90_fused_variant(x, d, nullptr, s, kSm90Bf16Dequant, 0, 0), compiled = true;
#endif
      break;
    case selftest::kSm90Decode:
#if M3QKV_SM90_BACKEND
      // The activations as sm90_fused's routes convert them (in the kernel: docs/sm90.md).
      st = sm90_fused_decode(x, d, nullptr, s, 0, kSm90DecodeXTransform), compiled = true;
#endif
      break;
    case selftest::kSm100Cta1:
    case selftest::kSm100Cta2:
      x.cta_group = path == selftest::kSm100Cta1 ? 1 : 2;
#if M3QKV_WITH_SM100
      st = sm100_fused(x, d, nullptr, s), compiled = true;
#endif
      break;
  }
  if (!compiled) return fail(M3QKV_ERROR_INTERNAL, "m3qkv_selftest: kernel %d is not compiled in", path);
  if (st == M3QKV_SUCCESS) st = api::apply_fault("m3qkv_selftest", selftest::path_info(path).backend, x, s);
  return st;
}

// The kernels a self-test of `d` runs: every one compiled in that runs there
// (only = NONE), or those of backend `only`; the others say why not.
selftest::Request selftest_request(const DeviceInfo& d, m3qkv_backend_kind only) {
  selftest::Request r;
  for (int p = 0; p < selftest::kPaths; ++p) {
    const m3qkv_backend_kind b = selftest::path_info(p).backend;
    bool built = false, runs = false;
    const char* target = "";
    const char* needs = "";
    switch (b) {
      case M3QKV_BACKEND_PORTABLE:
        built = kHavePortable, runs = portable_runs_on(d), target = "sm_80", needs = "8.0 or newer";
        break;
      case M3QKV_BACKEND_SM90:
        built = kHaveSm90, runs = sm90_runs_on(d), target = "sm_90a", needs = "9.0";
        break;
      case M3QKV_BACKEND_SM100:
        built = kHaveSm100, runs = sm100_runs_on(d), target = "sm_100f", needs = "10.x";
        break;
      case M3QKV_BACKEND_NONE:
        break;
    }
    char* why = r.note[p];
    const size_t cap = sizeof(r.note[p]);
    if (!built) {
      std::snprintf(why, cap, "not available: this library was built without the %s target", target);
    } else if (!runs) {
      std::snprintf(why, cap, "not available: needs compute capability %s; device %d is %d.%d", needs, d.device,
                    d.cc_major, d.cc_minor);
    } else if (only != M3QKV_BACKEND_NONE && b != only) {
      std::snprintf(why, cap, "not requested (m3qkv_warmup tests the backend it would use)");
    } else {
      r.run[p] = true;
      // Kept as the message when it passes.
      if (b == M3QKV_BACKEND_SM100 && d.cc_major != 10)
        std::snprintf(why, cap, "the tcgen05 emulation of the kernel (M3QKV_TCGEN05_EMULATION build), not the hardware");
    }
  }
  return r;
}

// "<kernel>: <message>" of the first kernel of the report that did not pass.
std::string first_failure(const m3qkv_selftest_report& r) {
  for (int i = 0; i < r.num_entries; ++i) {
    const m3qkv_selftest_entry& e = r.entries[i];
    if (e.result == M3QKV_SELFTEST_FAIL || e.result == M3QKV_SELFTEST_ERROR) return std::string(e.name) + ": " + e.message;
  }
  return r.message;
}

// The backends automatic dispatch would consider on d, in its order (the
// first is fused_backend_for(d)); the emulated sm100 kernel is never one.
int automatic_order(const DeviceInfo& d, m3qkv_backend_kind out[3]) {
  int n = 0;
  if (kHaveSm100 && d.cc_major == 10) out[n++] = M3QKV_BACKEND_SM100;
  if (kHaveSm90 && sm90_runs_on(d)) out[n++] = M3QKV_BACKEND_SM90;
  if (kHavePortable && portable_runs_on(d)) out[n++] = M3QKV_BACKEND_PORTABLE;
  return n;
}

// m3qkv_warmup's self-test mode (m3qkv.h), with d's context current.
m3qkv_status warmup_selftest(const char* fn, const DeviceInfo& d, m3qkv_backend_kind chosen) {
  const api::DeviceChoice c = api::device_choice(d.device);
  const bool explicit_choice =
      c.origin == api::ChoiceOrigin::kApi ||
      (c.origin == api::ChoiceOrigin::kNone && api::backend_env().kind != M3QKV_BACKEND_NONE);
  m3qkv_selftest_report r;
  if (explicit_choice) {
    const m3qkv_status st = selftest::run(fn, d, selftest_request(d, chosen), &selftest_launch, &r);
    if (st != M3QKV_ERROR_SELFTEST_FAILED) return st;
    return fail(st,
                "%s: device %d (CC %d.%d): the self-test of %s (chosen by %s) FAILED: %s. It stays chosen: m3qkv never "
                "replaces an explicit choice (choose another, or the automatic one, to fall back)",
                fn, d.device, d.cc_major, d.cc_minor, m3qkv_backend_name(chosen),
                c.origin == api::ChoiceOrigin::kApi ? "m3qkv_set_backend" : "M3QKV_BACKEND", first_failure(r).c_str());
  }
  m3qkv_backend_kind order[3];
  const int n = automatic_order(d, order);
  if (n == 0) return no_portable(fn, d);
  // The automatic backend is tested again after an earlier fallback too.
  m3qkv_status st = selftest::run(fn, d, selftest_request(d, order[0]), &selftest_launch, &r);
  if (st == M3QKV_SUCCESS) {
    if (c.origin == api::ChoiceOrigin::kFallback) api::set_device_choice(d.device, api::DeviceChoice{});
    return M3QKV_SUCCESS;
  }
  if (st != M3QKV_ERROR_SELFTEST_FAILED) return st;
  const std::string why = first_failure(r);
  for (int i = 1; i < n; ++i) {
    m3qkv_selftest_report r2;
    st = selftest::run(fn, d, selftest_request(d, order[i]), &selftest_launch, &r2);
    if (st == M3QKV_SUCCESS) {
      api::set_device_choice(d.device, api::DeviceChoice{order[i], api::ChoiceOrigin::kFallback});
      return fail(M3QKV_WARNING_BACKEND_FALLBACK,
                  "%s: device %d (CC %d.%d): the self-test of %s, the automatic backend, FAILED (%s); m3qkv_fused_qkv "
                  "on this device now uses %s, which passed (M3QKV_SELFTEST_ON_WARMUP=1)",
                  fn, d.device, d.cc_major, d.cc_minor, m3qkv_backend_name(order[0]), why.c_str(),
                  m3qkv_backend_name(order[i]));
    }
    if (st != M3QKV_ERROR_SELFTEST_FAILED) return st;
  }
  return fail(M3QKV_ERROR_SELFTEST_FAILED,
              "%s: device %d (CC %d.%d): the self-test of %s, the automatic backend, FAILED (%s), and %s: do not use "
              "m3qkv on this device",
              fn, d.device, d.cc_major, d.cc_minor, m3qkv_backend_name(order[0]), why.c_str(),
              n > 1 ? "no other backend passed" : "there is no other backend to fall back to");
}

// Checked mode (api/checked.h): the call's buffers, as it touches them.
template <class A>
m3qkv_status check_buffers(const char* fn, const A& a, const DeviceInfo& d,
                           m3qkv_status (*extents)(const char*, const A&, api::Extents*)) {
  if (api::checked_mode()) {
    api::Extents x;
    M3QKV_TRY(extents(fn, a, &x));
    M3QKV_TRY(api::check_pointers(fn, d, x));
  }
  host::timing_mark(host::Phase::kChecked);
  return M3QKV_SUCCESS;
}

// The unfused ops always use the portable kernels.
template <class A, class Launch>
m3qkv_status run_portable(const char* fn, const A* args, cudaStream_t stream,
                          m3qkv_status (*validate)(const A*, A*, bool*),
                          m3qkv_status (*extents)(const char*, const A&, api::Extents*), Launch&& launch) {
  return guarded(fn, [&]() -> m3qkv_status {
    host::timing_begin();
    A a;
    bool noop = false;
    M3QKV_TRY(validate(args, &a, &noop));
    host::timing_mark(host::Phase::kValidate);
    if (noop) return M3QKV_SUCCESS;
    host::ContextScope scope;
    DeviceInfo d;
    M3QKV_TRY(host::enter_stream(fn, stream, &scope, &d));
    host::timing_mark(host::Phase::kContext);
    if (!kHavePortable || !portable_runs_on(d)) return no_portable(fn, d);
    M3QKV_TRY(check_buffers(fn, a, d, extents));
    return launch(a, d, stream);
  });
}

}  // namespace

}  // namespace m3qkv

using namespace m3qkv;

extern "C" {

m3qkv_status m3qkv_testing_fused_qkv(const m3qkv_fused_args* args, float* acc_tap, m3qkv_backend_kind force_backend,
                                     cudaStream_t stream) {
  const char* fn = "m3qkv_fused_qkv";
  return guarded(fn, [&]() -> m3qkv_status {
    host::timing_begin();
    m3qkv_fused_args a;
    bool noop = false;
    M3QKV_TRY(validate_fused(args, &a, &noop));
    host::timing_mark(host::Phase::kValidate);
    // Compared as int: C callers may pass any int through the enum.
    const int force = static_cast<int>(force_backend);
    if (force < M3QKV_BACKEND_NONE || force > M3QKV_BACKEND_SM100) {
      return fail(M3QKV_ERROR_INVALID_ARGUMENT, "%s: force_backend = %d is not an m3qkv_backend_kind", fn, force);
    }
    if (reinterpret_cast<uintptr_t>(acc_tap) % 16 != 0) {
      return fail(M3QKV_ERROR_MISALIGNED, "%s: acc_tap = 0x%llx is not 16-byte aligned", fn,
                  static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(acc_tap)));
    }
    if (noop) return M3QKV_SUCCESS;
    host::ContextScope scope;
    DeviceInfo d;
    M3QKV_TRY(host::enter_stream(fn, stream, &scope, &d));
    host::timing_mark(host::Phase::kContext);
    m3qkv_backend_kind b = M3QKV_BACKEND_NONE;
    M3QKV_TRY(choose_fused(fn, d, force_backend, &b));
    M3QKV_TRY(check_buffers(fn, a, d, &api::fused_extents));
    return launch_fused(b, a, d, acc_tap, stream);
  });
}

m3qkv_status m3qkv_fused_qkv(const m3qkv_fused_args* args, cudaStream_t stream) {
  return m3qkv_testing_fused_qkv(args, nullptr, M3QKV_BACKEND_NONE, stream);
}

m3qkv_status m3qkv_qknorm_rope_kv_insert(const m3qkv_insert_args* args, cudaStream_t stream) {
  return run_portable("m3qkv_qknorm_rope_kv_insert", args, stream, &validate_insert, &api::insert_extents,
                      [](const m3qkv_insert_args& a, const DeviceInfo& d, cudaStream_t s) -> m3qkv_status {
#if M3QKV_WITH_PORTABLE
                        return portable_insert(a, d, s, api::g_insert_layout.load(std::memory_order_relaxed));
#else
                        (void)a, (void)d, (void)s;  // unreachable: run_portable checked kHavePortable
                        return fail(M3QKV_ERROR_INTERNAL, "portable_insert is not compiled in");
#endif
                      });
}

m3qkv_status m3qkv_mxfp8_gemm(const m3qkv_gemm_args* args, cudaStream_t stream) {
  return run_portable("m3qkv_mxfp8_gemm", args, stream, &validate_gemm, &api::gemm_extents,
                      [](const m3qkv_gemm_args& a, const DeviceInfo& d, cudaStream_t s) -> m3qkv_status {
#if M3QKV_WITH_PORTABLE
                        return portable_gemm(a, d, s);
#else
                        (void)a, (void)d, (void)s;  // unreachable: run_portable checked kHavePortable
                        return fail(M3QKV_ERROR_INTERNAL, "portable_gemm is not compiled in");
#endif
                      });
}

m3qkv_status m3qkv_mxfp8_quantize(const m3qkv_quantize_args* args, cudaStream_t stream) {
  return run_portable("m3qkv_mxfp8_quantize", args, stream, &validate_quantize, &api::quantize_extents,
                      [](const m3qkv_quantize_args& a, const DeviceInfo& d, cudaStream_t s) -> m3qkv_status {
#if M3QKV_WITH_PORTABLE
                        return portable_quantize(a, d, s);
#else
                        (void)a, (void)d, (void)s;  // unreachable: run_portable checked kHavePortable
                        return fail(M3QKV_ERROR_INTERNAL, "portable_quantize is not compiled in");
#endif
                      });
}

m3qkv_status m3qkv_prepare_weights_fp8(const m3qkv_prepare_args* args, cudaStream_t stream) {
  // No no-op: n > 0 is required.
  const auto validate = [](const m3qkv_prepare_args* in, m3qkv_prepare_args* out, bool* noop) {
    *noop = false;
    return validate_prepare(in, out);
  };
  return run_portable("m3qkv_prepare_weights_fp8", args, stream, +validate, &api::prepare_extents,
                      [](const m3qkv_prepare_args& a, const DeviceInfo& d, cudaStream_t s) -> m3qkv_status {
#if M3QKV_WITH_PORTABLE
                        return portable_prepare(a, d, s);
#else
                        (void)a, (void)d, (void)s;  // unreachable: run_portable checked kHavePortable
                        return fail(M3QKV_ERROR_INTERNAL, "portable_prepare is not compiled in");
#endif
                      });
}

m3qkv_status m3qkv_prepare_weights_fp8_sizes(int64_t n, int64_t k, size_t* wq_bytes, size_t* wsf_bytes) {
  return guarded("m3qkv_prepare_weights_fp8_sizes",
                 [&]() -> m3qkv_status { return prepare_sizes(n, k, wq_bytes, wsf_bytes); });
}

// Reports the backend m3qkv_fused_qkv would use on `device` (its choice:
// m3qkv.h "Backend choice"). A device that exists but has no backend (CC <
// 8.0, or its target compiled out) is a successful query answering
// M3QKV_BACKEND_NONE; a process without any CUDA device gets
// M3QKV_ERROR_UNSUPPORTED_DEVICE, an explicit choice that cannot run the error
// m3qkv_fused_qkv would give (*out = NONE then).
m3qkv_status m3qkv_backend(int device, m3qkv_backend_kind* out) {
  const char* fn = "m3qkv_backend";
  return guarded(fn, [&]() -> m3qkv_status {
    if (out == nullptr) return fail(M3QKV_ERROR_NULL_POINTER, "%s: out = NULL, but it is required", fn);
    *out = M3QKV_BACKEND_NONE;
    DeviceInfo d;
    M3QKV_TRY(query_device(device, &d, fn));
    m3qkv_backend_kind b = M3QKV_BACKEND_NONE;
    M3QKV_TRY(fused_choice(fn, d, &b));
    *out = b;
    return M3QKV_SUCCESS;
  });
}

m3qkv_status m3qkv_set_backend(int device, m3qkv_backend_kind kind) {
  const char* fn = "m3qkv_set_backend";
  return guarded(fn, [&]() -> m3qkv_status {
    // Compared as int: C callers may pass any int through the enum.
    const int k = static_cast<int>(kind);
    if (k < M3QKV_BACKEND_NONE || k > M3QKV_BACKEND_SM100) {
      return fail(M3QKV_ERROR_INVALID_ARGUMENT,
                  "%s: kind = %d is not an m3qkv_backend_kind (M3QKV_BACKEND_NONE = automatic, _PORTABLE, _SM90, "
                  "_SM100)",
                  fn, k);
    }
    DeviceInfo d;
    M3QKV_TRY(query_device(device, &d, fn));
    if (device >= api::kChoiceDevices) {
      return fail(M3QKV_ERROR_INVALID_ARGUMENT, "%s: device = %d: m3qkv keeps a backend choice for devices 0 to %d only",
                  fn, device, api::kChoiceDevices - 1);
    }
    if (kind == M3QKV_BACKEND_NONE) {
      api::set_device_choice(device, api::DeviceChoice{});
      return M3QKV_SUCCESS;
    }
    M3QKV_TRY(check_can_run(fn, "kind", kind, d));
    api::set_device_choice(device, api::DeviceChoice{kind, api::ChoiceOrigin::kApi});
    return M3QKV_SUCCESS;
  });
}

// Runs the warmup of every backend `device` can use (the portable one serves
// the unfused ops everywhere; the fused one as chosen) in the device's primary
// context (host/context.h enter_primary: created if needed, current only for
// the call; the caller's current context and device are left as they were,
// and no other device is touched), then the self-test when
// M3QKV_SELFTEST_ON_WARMUP=1 (warmup_selftest above).
m3qkv_status m3qkv_release_stream(cudaStream_t stream) {
  const char* fn = "m3qkv_release_stream";
  return guarded(fn, [&]() -> m3qkv_status {
    host::ContextScope scope;
    DeviceInfo d;
    M3QKV_TRY(host::enter_stream(fn, stream, &scope, &d));
    return host::release_stream_workspace(fn, d, stream, /*refuse_capture=*/true);
  });
}

m3qkv_status m3qkv_warmup(int device) {
  const char* fn = "m3qkv_warmup";
  return guarded(fn, [&]() -> m3qkv_status {
    DeviceInfo facts;
    M3QKV_TRY(query_device(device, &facts, fn));
    const api::FlagEnv& mode = api::selftest_on_warmup_env();
    if (!mode.valid) {
      return fail(M3QKV_ERROR_INVALID_ARGUMENT,
                  "%s: M3QKV_SELFTEST_ON_WARMUP = \"%s\" is not 0 or 1 (the environment variable is read once, at "
                  "the first call)",
                  fn, mode.text);
    }
    m3qkv_backend_kind fused = M3QKV_BACKEND_NONE;
    M3QKV_TRY(fused_choice(fn, facts, &fused));
    if (fused == M3QKV_BACKEND_NONE) return no_portable(fn, facts);
    host::ContextScope scope;
    DeviceInfo d;
    M3QKV_TRY(host::enter_primary(fn, device, &scope, &d));
    // Relaxed for this thread, so that its allocations never break a capture
    // another thread has open in global mode (docs/contract.md §6). After the
    // context is entered: a runtime call on a thread without one would make
    // the primary context current and leave it so.
    host::RelaxedCaptureMode relaxed(host::cuda_unresolved());
    M3QKV_CUDA_TRY(fn, relaxed.error());
#if M3QKV_WITH_PORTABLE
    if (portable_runs_on(d)) M3QKV_TRY(portable_warmup(d));
#endif
#if M3QKV_SM90_BACKEND
    if (fused == M3QKV_BACKEND_SM90) M3QKV_TRY(sm90_warmup(d));
#endif
#if M3QKV_WITH_SM100
    if (fused == M3QKV_BACKEND_SM100 || (M3QKV_SM100_ON_SM90 && sm90_runs_on(d))) M3QKV_TRY(sm100_warmup(d));
#endif
    if (!mode.on) return M3QKV_SUCCESS;
    return warmup_selftest(fn, d, fused);
  });
}

// The report is built in a struct of this version and copied out (the
// caller's struct_size bytes: only this version's size exists so far).
m3qkv_status m3qkv_selftest(int device, m3qkv_selftest_report* report) {
  const char* fn = "m3qkv_selftest";
  return guarded(fn, [&]() -> m3qkv_status {
    if (report == nullptr) return fail(M3QKV_ERROR_NULL_POINTER, "%s: report = NULL, but it is required", fn);
    if (report->struct_size != sizeof(m3qkv_selftest_report)) {
      return fail(M3QKV_ERROR_STRUCT_SIZE, "%s: report->struct_size = %zu is not sizeof(m3qkv_selftest_report) = %zu",
                  fn, report->struct_size, sizeof(m3qkv_selftest_report));
    }
    const auto give = [&](m3qkv_status st, const m3qkv_selftest_report& r) {
      const size_t size = report->struct_size;
      std::memcpy(report, &r, size);
      report->struct_size = size;
      return st;
    };
    m3qkv_selftest_report r;
    // Until it is done the caller's report says "internal error" (an
    // exception thrown on the way leaves it so).
    selftest::fill_failed(M3QKV_ERROR_INTERNAL, device, &r);
    give(M3QKV_ERROR_INTERNAL, r);
    const auto stopped = [&](m3qkv_status st) {
      selftest::fill_failed(st, device, &r);
      return give(st, r);
    };
    DeviceInfo facts;
    m3qkv_status st = query_device(device, &facts, fn);
    if (st != M3QKV_SUCCESS) return stopped(st);
    if (fused_backend_for(facts) == M3QKV_BACKEND_NONE) return stopped(no_portable(fn, facts));
    host::ContextScope scope;
    DeviceInfo d;
    st = host::enter_primary(fn, device, &scope, &d);
    if (st != M3QKV_SUCCESS) return stopped(st);
    // As the warmup: this thread's cudaMalloc / cudaFree must not break a
    // capture another thread has open in global mode.
    host::RelaxedCaptureMode relaxed(host::cuda_unresolved());
    if (relaxed.error() != cudaSuccess)
      return stopped(cuda_fail(fn, "cudaThreadExchangeStreamCaptureMode", relaxed.error()));
    st = selftest::run(fn, d, selftest_request(d, M3QKV_BACKEND_NONE), &selftest_launch, &r);
    return give(st, r);
  });
}

}  // extern "C"
