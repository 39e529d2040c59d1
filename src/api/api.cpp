// The public entry points: validate, skip empty batches, find the call's
// context, dispatch to a backend (rule at the end of api/internal.h).
//
// Every entry point follows the same sequence:
//   clear_error -> validate_* (launches nothing) -> m == 0: SUCCESS ->
//   the stream's context and its device facts (host/context.h; cached per
//   context) -> checked mode's pointer checks when on (host/checked.h) ->
//   backend choice -> launcher, with the stream's context current. Test-only
//   phase marks (host/timing.h) time each step.
// No exception crosses the C boundary: each body runs inside guarded().
#include <cuda_runtime_api.h>

#include <exception>

#include "api/internal.h"
#include "host/checked.h"
#include "host/context.h"
#include "host/device.h"
#include "host/extents.h"
#include "host/status.h"
#include "host/timing.h"
#include "host/validate.h"
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

// Explains a forced backend that cannot run here.
m3qkv_status cannot_force(const char* fn, m3qkv_backend_kind b, const DeviceInfo& d, bool built, const char* target) {
  if (!built) {
    return fail(M3QKV_ERROR_UNSUPPORTED_DEVICE,
                "%s: force_backend = %s, but this library was built without the %s target%s", fn,
                m3qkv_backend_name(b), target,
                b == M3QKV_BACKEND_SM90 ? " (or without the Hopper kernel source)" : "");
  }
  return fail(M3QKV_ERROR_UNSUPPORTED_DEVICE, "%s: force_backend = %s cannot run on device %d (compute capability %d.%d)",
              fn, m3qkv_backend_name(b), d.device, d.cc_major, d.cc_minor);
}

// Resolves `force` (NONE = automatic) to a backend that can run on `d`.
m3qkv_status choose_fused(const char* fn, const DeviceInfo& d, m3qkv_backend_kind force, m3qkv_backend_kind* out) {
  switch (force) {
    case M3QKV_BACKEND_NONE:
      *out = fused_backend_for(d);
      if (*out == M3QKV_BACKEND_NONE) return no_portable(fn, d);
      return M3QKV_SUCCESS;
    case M3QKV_BACKEND_PORTABLE:
      if (!kHavePortable || !portable_runs_on(d)) return cannot_force(fn, force, d, kHavePortable, "sm_80");
      break;
    case M3QKV_BACKEND_SM90:
      if (!kHaveSm90 || !sm90_runs_on(d)) return cannot_force(fn, force, d, kHaveSm90, "sm_90a");
      break;
    case M3QKV_BACKEND_SM100:
      if (!kHaveSm100 || !sm100_runs_on(d)) return cannot_force(fn, force, d, kHaveSm100, "sm_100f");
      break;
  }
  *out = force;
  return M3QKV_SUCCESS;
}

m3qkv_status launch_fused(m3qkv_backend_kind b, const m3qkv_fused_args& a, const DeviceInfo& d, float* acc_tap,
                          cudaStream_t s) {
  (void)a, (void)d, (void)acc_tap, (void)s;  // unused when no backend is compiled in
  switch (b) {
    case M3QKV_BACKEND_PORTABLE:
#if M3QKV_WITH_PORTABLE
      return portable_fused(a, d, acc_tap, s);
#else
      break;
#endif
    case M3QKV_BACKEND_SM90:
#if M3QKV_SM90_BACKEND
      return sm90_fused(a, d, acc_tap, s);
#else
      break;
#endif
    case M3QKV_BACKEND_SM100:
#if M3QKV_WITH_SM100
      return sm100_fused(a, d, acc_tap, s);
#else
      break;
#endif
    case M3QKV_BACKEND_NONE:
      break;
  }
  // choose_fused only returns backends that are compiled in.
  return fail(M3QKV_ERROR_INTERNAL, "m3qkv_fused_qkv: backend %s is not compiled in", m3qkv_backend_name(b));
}

// Checked mode (host/checked.h): the call's buffers, as it touches them.
template <class A>
m3qkv_status check_buffers(const char* fn, const A& a, const DeviceInfo& d,
                           m3qkv_status (*extents)(const char*, const A&, host::Extents*)) {
  if (host::checked_mode()) {
    host::Extents x;
    M3QKV_TRY(extents(fn, a, &x));
    M3QKV_TRY(host::check_pointers(fn, d, x));
  }
  host::timing_mark(host::Phase::kChecked);
  return M3QKV_SUCCESS;
}

// The unfused ops always use the portable kernels.
template <class A, class Launch>
m3qkv_status run_portable(const char* fn, const A* args, cudaStream_t stream,
                          m3qkv_status (*validate)(const A*, A*, bool*),
                          m3qkv_status (*extents)(const char*, const A&, host::Extents*), Launch&& launch) {
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
    M3QKV_TRY(check_buffers(fn, a, d, &host::fused_extents));
    return launch_fused(b, a, d, acc_tap, stream);
  });
}

m3qkv_status m3qkv_fused_qkv(const m3qkv_fused_args* args, cudaStream_t stream) {
  return m3qkv_testing_fused_qkv(args, nullptr, M3QKV_BACKEND_NONE, stream);
}

m3qkv_status m3qkv_qknorm_rope_kv_insert(const m3qkv_insert_args* args, cudaStream_t stream) {
  return run_portable("m3qkv_qknorm_rope_kv_insert", args, stream, &validate_insert, &host::insert_extents,
                      [](const m3qkv_insert_args& a, const DeviceInfo& d, cudaStream_t s) -> m3qkv_status {
#if M3QKV_WITH_PORTABLE
                        return portable_insert(a, d, s);
#else
                        (void)a, (void)d, (void)s;  // unreachable: run_portable checked kHavePortable
                        return fail(M3QKV_ERROR_INTERNAL, "portable_insert is not compiled in");
#endif
                      });
}

m3qkv_status m3qkv_mxfp8_gemm(const m3qkv_gemm_args* args, cudaStream_t stream) {
  return run_portable("m3qkv_mxfp8_gemm", args, stream, &validate_gemm, &host::gemm_extents,
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
  return run_portable("m3qkv_mxfp8_quantize", args, stream, &validate_quantize, &host::quantize_extents,
                      [](const m3qkv_quantize_args& a, const DeviceInfo& d, cudaStream_t s) -> m3qkv_status {
#if M3QKV_WITH_PORTABLE
                        return portable_quantize(a, d, s);
#else
                        (void)a, (void)d, (void)s;  // unreachable: run_portable checked kHavePortable
                        return fail(M3QKV_ERROR_INTERNAL, "portable_quantize is not compiled in");
#endif
                      });
}

// Reports the backend m3qkv_fused_qkv would use on `device`. A device that
// exists but has no backend (CC < 8.0, or its target compiled out) is a
// successful query answering M3QKV_BACKEND_NONE; a process without any CUDA
// device gets M3QKV_ERROR_UNSUPPORTED_DEVICE (and *out = NONE).
m3qkv_status m3qkv_backend(int device, m3qkv_backend_kind* out) {
  const char* fn = "m3qkv_backend";
  return guarded(fn, [&]() -> m3qkv_status {
    if (out == nullptr) return fail(M3QKV_ERROR_NULL_POINTER, "%s: out = NULL, but it is required", fn);
    *out = M3QKV_BACKEND_NONE;
    DeviceInfo d;
    M3QKV_TRY(query_device(device, &d, fn));
    *out = fused_backend_for(d);
    return M3QKV_SUCCESS;
  });
}

// Runs the warmup of every backend `device` can use (the portable one serves
// the unfused ops everywhere) in the device's primary context (host/context.h
// enter_primary: created if needed, current only for the call; the caller's
// current context and device are left as they were, and no other device is
// touched).
m3qkv_status m3qkv_warmup(int device) {
  const char* fn = "m3qkv_warmup";
  return guarded(fn, [&]() -> m3qkv_status {
    DeviceInfo facts;
    M3QKV_TRY(query_device(device, &facts, fn));
    const m3qkv_backend_kind fused = fused_backend_for(facts);
    if (fused == M3QKV_BACKEND_NONE) return no_portable(fn, facts);
    host::ContextScope scope;
    DeviceInfo d;
    M3QKV_TRY(host::enter_primary(fn, device, &scope, &d));
#if M3QKV_WITH_PORTABLE
    if (portable_runs_on(d)) M3QKV_TRY(portable_warmup(d));
#endif
#if M3QKV_SM90_BACKEND
    if (fused == M3QKV_BACKEND_SM90) M3QKV_TRY(sm90_warmup(d));
#endif
#if M3QKV_WITH_SM100
    if (fused == M3QKV_BACKEND_SM100 || (M3QKV_SM100_ON_SM90 && sm90_runs_on(d))) M3QKV_TRY(sm100_warmup(d));
#endif
    return M3QKV_SUCCESS;
  });
}

}  // extern "C"
