// ThreadSanitizer stress of the C API on the fake CUDA table (issue 30 item 6).
// Built and run by `tools/fuzz.sh tsan [SECONDS]` (clang -fsanitize=thread);
// .ci/run runs it for 15 s.
//
// A copy of src/api/api.cpp with recording launchers (as
// tests/cpu/api_dispatch_harness.h does, but thread-safe), on the real host
// layer, on tests/cpu/fake_cuda.h's scripted CUDA wrapped so that every call
// is counted per thread. 16 threads, each with contexts of its own (the
// primary contexts of random fake devices, CC 7.5 ... 12.0, and created
// ones), streams of its own in them, the default streams, random capture
// states (its streams and cudaStreamPerThread, modelled per thread) and
// capture modes, call the four entry points with valid and invalid
// arguments, m3qkv_backend, m3qkv_set_backend and m3qkv_warmup. The
// launchers take a stream workspace of a random size (growth, capture
// workspaces), as the split-K and prefill launchers do. Checks, per call:
//   - a call validation rejects returns validation's status and makes no
//     CUDA call at all; an empty batch (m = 0) neither; any other failure
//     launches nothing; a success launches exactly once;
//   - the launcher runs in the stream's context; the caller's context stack,
//     runtime device and capture mode are the same after the call;
//   - a failure leaves a message, a success none;
// and at the end, after every stream's workspaces are released
// (release_stream_workspace, release_workspaces): every device allocation
// was freed exactly once. TSan reports any data race (halt_on_error=1).
//
// What it cannot check: the cooperative grid of the real SM90 launchers (they
// are not built into a CPU binary; host::cooperative_grid, which they should
// call, is exercised from every thread on the fake occupancy model instead);
// kernels, graphs and real capture semantics (a capture here is a flag and an
// id that cudaStreamGetCaptureInfo reports, a graph's destruction a call of
// its user objects' destructors). A capture workspace handed to two threads'
// concurrent captures (on cudaStreamPerThread: one handle, two streams) fails.
#define M3QKV_WITH_PORTABLE 1
#define M3QKV_WITH_SM90 1
#define M3QKV_HAVE_SM90_KERNEL 1
#define M3QKV_WITH_SM100 1

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "api/internal.h"
#include "fake_cuda.h"
#include "api/backend_choice.h"
#include "host/context.h"
#include "host/device.h"
#include "host/launch.h"
#include "host/status.h"
#include "api/validate.h"
#include "host/workspace.h"
#include "m3qkv/m3qkv.h"
#include "portable/portable.h"
#include "sm100/sm100.h"
#include "sm90/sm90.h"
#include "valid_args.h"

namespace {

constexpr int kThreads = 16;

// ---------------------------------------------------------------------------
// Failures: counted, the first few printed.
// ---------------------------------------------------------------------------
std::atomic<long> g_failures{0};
std::mutex g_print_mu;
void failure(const char* what, const std::string& detail) {
  if (g_failures.fetch_add(1) < 10) {
    std::lock_guard<std::mutex> lock(g_print_mu);
    std::fprintf(stderr, "api_stress: FAILED: %s: %s\n", what, detail.c_str());
  }
}

// ---------------------------------------------------------------------------
// The fake CUDA table, each call counted on its thread; cudaStreamIsCapturing
// of cudaStreamPerThread answered per thread.
// ---------------------------------------------------------------------------
thread_local long t_cuda_calls = 0;
thread_local bool t_per_thread_capturing = false;
thread_local int t_index = -1;
thread_local long t_session_counter = 0;

template <auto F>
struct Counted;
template <class R, class... A, R (*F)(A...)>
struct Counted<F> {
  static R call(A... a) {
    ++t_cuda_calls;
    return F(a...);
  }
};
// cudaStreamPerThread is a different stream in every thread: its capture
// (a per-thread flag here) has an id of its own thread's.
cudaError_t stress_stream_get_capture_info(cudaStream_t s, cudaStreamCaptureStatus* st, unsigned long long* id,
                                           cudaGraph_t* graph) {
  ++t_cuda_calls;
  if (s == cudaStreamPerThread) {
    *st = t_per_thread_capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
    const unsigned long long cid =
        t_per_thread_capturing ? (static_cast<unsigned long long>(t_index + 1) << 40) + t_session_counter : 0;
    if (id != nullptr) *id = cid;
    if (graph != nullptr) *graph = reinterpret_cast<cudaGraph_t>(cid);
    return cudaSuccess;
  }
  return f_stream_get_capture_info(s, st, id, graph);
}
m3qkv::host::Cuda make_stress_table() {
  m3qkv::host::Cuda t = make_fake_table();
  t.get_last_error = &Counted<&f_get_last_error>::call;
  t.get_device_count = &Counted<&f_get_device_count>::call;
  t.get_device = &Counted<&f_get_device>::call;
  t.set_device = &Counted<&f_set_device>::call;
  t.device_get_attribute = &Counted<&f_device_get_attribute>::call;
  t.driver_get_version = &Counted<&f_driver_get_version>::call;
  t.stream_get_id = &Counted<&f_stream_get_id>::call;
  t.stream_get_capture_info = &stress_stream_get_capture_info;
  t.malloc = &Counted<&f_malloc>::call;
  t.free = &Counted<&f_free>::call;
  t.malloc_async = &Counted<&f_malloc_async>::call;
  t.free_async = &Counted<&f_free_async>::call;
  t.event_create = &Counted<&f_event_create>::call;
  t.event_record = &Counted<&f_event_record>::call;
  t.event_destroy = &Counted<&f_event_destroy>::call;
  t.stream_wait_event = &Counted<&f_stream_wait_event>::call;
  t.user_object_create = &Counted<&f_user_object_create>::call;
  t.user_object_release = &Counted<&f_user_object_release>::call;
  t.graph_retain_user_object = &Counted<&f_graph_retain_user_object>::call;
  t.memset_async = &Counted<&f_memset_async>::call;
  t.memcpy_async = &Counted<&f_memcpy_async>::call;
  t.stream_create_with_flags = &Counted<&f_stream_create_with_flags>::call;
  t.stream_synchronize = &Counted<&f_stream_synchronize>::call;
  t.stream_destroy = &Counted<&f_stream_destroy>::call;
  t.exchange_capture_mode = &Counted<&f_exchange_capture_mode>::call;
  t.occupancy_max_active_blocks = &Counted<&f_occupancy_max_active_blocks>::call;
  t.ctx_get_current = &Counted<&f_ctx_get_current>::call;
  t.ctx_push_current = &Counted<&f_ctx_push_current>::call;
  t.ctx_pop_current = &Counted<&f_ctx_pop_current>::call;
  t.ctx_get_id = &Counted<&f_ctx_get_id>::call;
  t.ctx_get_device = &Counted<&f_ctx_get_device>::call;
  t.stream_get_ctx = &Counted<&f_stream_get_ctx>::call;
  t.primary_ctx_retain = &Counted<&f_primary_ctx_retain>::call;
  t.primary_ctx_release = &Counted<&f_primary_ctx_release>::call;
  t.primary_ctx_get_state = &Counted<&f_primary_ctx_get_state>::call;
  t.pointer_get_attributes = &Counted<&f_pointer_get_attributes>::call;
  t.tensor_map_encode_tiled = &Counted<&f_tensor_map_encode_tiled>::call;
  return t;
}
const m3qkv::host::Cuda g_table = make_stress_table();

// ---------------------------------------------------------------------------
// Per-thread launch records.
// ---------------------------------------------------------------------------
thread_local long t_launches = 0, t_warmups = 0;
thread_local size_t t_expected_ctx = 0;    // the context the launch must run in
thread_local std::mt19937_64* t_rng = nullptr;
std::atomic<long> g_launches{0}, g_coop_checks{0};

// Capture sessions: a workspace handed to two threads' concurrent captures.
std::mutex g_capture_mu;
std::map<void*, std::pair<int, long>> g_capture_ws;  // workspace -> (thread, its session)
std::atomic<long> g_session[kThreads];               // each thread's current capture session (0 = none)
std::atomic<long> g_shared_capture_ws{0};

bool capturing(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (s == cudaStreamPerThread) return t_per_thread_capturing;
  std::lock_guard<std::mutex> lock(fake_cuda().mu);
  st = fake_cuda().capturing.count(s) ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return st != cudaStreamCaptureStatusNone;
}

void __attribute__((noinline)) coop_kernel(int) {}

m3qkv_status on_launch(const char* what, const m3qkv::DeviceInfo& d, cudaStream_t s) {
  ++t_launches;
  ++g_launches;
  if (current_ctx() != t_expected_ctx)
    failure("a launcher ran outside its stream's context",
            std::string(what) + ": context " + std::to_string(current_ctx()) + ", expected " +
                std::to_string(t_expected_ctx));
  // The split-K / prefill launchers' stream workspace, of a random size.
  static const size_t kSizes[] = {0, 0, 64 << 10, 72 << 10, 256 << 10, 1 << 20};
  const size_t bytes = kSizes[(*t_rng)() % 6];
  if (bytes > 0) {
    void* p = nullptr;
    m3qkv::host::WorkspaceLease lease;
    M3QKV_TRY(m3qkv::host::stream_workspace(d, s, bytes, &p, &lease));
    if (capturing(s)) {
      std::lock_guard<std::mutex> lock(g_capture_mu);
      auto it = g_capture_ws.find(p);
      if (it != g_capture_ws.end() && it->second.first != t_index &&
          g_session[it->second.first].load() == it->second.second)
        ++g_shared_capture_ws;
      g_capture_ws[p] = {t_index, g_session[t_index].load()};
    }
  }
  // A cooperative launch's grid (what the SM90 prefill launchers should use).
  unsigned grid = 0;
  const long long want = static_cast<long long>((*t_rng)() % 2 ? INT32_MAX : (*t_rng)() % 1000);
  M3QKV_TRY(m3qkv::host::cooperative_grid("stress", "coop_kernel", d, &coop_kernel, 384, 200 << 10, want, &grid));
  unsigned cap = 0;
  M3QKV_TRY(m3qkv::host::co_resident_ctas("stress", "coop_kernel", d, &coop_kernel, 384, 200 << 10, &cap));
  if (grid < 1 || grid > cap) failure("cooperative grid above the co-resident CTAs", std::to_string(grid));
  ++g_coop_checks;
  return M3QKV_SUCCESS;
}

}  // namespace

namespace m3qkv {
namespace {
m3qkv_status stress_portable_fused(const m3qkv_fused_args&, const DeviceInfo& d, float*, cudaStream_t s) {
  return on_launch("portable_fused", d, s);
}
m3qkv_status stress_portable_gemm(const m3qkv_gemm_args&, const DeviceInfo& d, cudaStream_t s) {
  return on_launch("portable_gemm", d, s);
}
m3qkv_status stress_portable_insert(const m3qkv_insert_args&, const DeviceInfo& d, cudaStream_t s, int) {
  return on_launch("portable_insert", d, s);
}
m3qkv_status stress_portable_quantize(const m3qkv_quantize_args&, const DeviceInfo& d, cudaStream_t s) {
  return on_launch("portable_quantize", d, s);
}
m3qkv_status stress_portable_prepare(const m3qkv_prepare_args&, const DeviceInfo& d, cudaStream_t s) {
  return on_launch("portable_prepare", d, s);
}
m3qkv_status stress_sm90_fused(const m3qkv_fused_args&, const DeviceInfo& d, float*, cudaStream_t s) {
  return on_launch("sm90_fused", d, s);
}
m3qkv_status stress_sm90_fused_variant(const m3qkv_fused_args&, const DeviceInfo& d, float*, cudaStream_t s, int, int,
                                       int) {
  return on_launch("sm90_fused_variant", d, s);
}
m3qkv_status stress_sm90_fused_decode(const m3qkv_fused_args&, const DeviceInfo& d, float*, cudaStream_t s, int, int, int = 0) {
  return on_launch("sm90_fused_decode", d, s);
}
m3qkv_status stress_sm100_fused(const m3qkv_fused_args&, const DeviceInfo& d, float*, cudaStream_t s) {
  return on_launch("sm100_fused", d, s);
}
m3qkv_status stress_warmup(const DeviceInfo&) {
  ++t_warmups;
  return M3QKV_SUCCESS;
}
}  // namespace
}  // namespace m3qkv

#define portable_fused stress_portable_fused
#define portable_gemm stress_portable_gemm
#define portable_insert stress_portable_insert
#define portable_quantize stress_portable_quantize
#define portable_prepare stress_portable_prepare
#define sm90_fused stress_sm90_fused
#define sm90_fused_variant stress_sm90_fused_variant
#define sm90_fused_decode stress_sm90_fused_decode
#define sm100_fused stress_sm100_fused
#define portable_warmup stress_warmup
#define sm90_warmup stress_warmup
#define sm100_warmup stress_warmup
#define m3qkv_fused_qkv stress_fused_qkv
#define m3qkv_testing_fused_qkv stress_testing_fused_qkv
#define m3qkv_qknorm_rope_kv_insert stress_qknorm_rope_kv_insert
#define m3qkv_mxfp8_gemm stress_mxfp8_gemm
#define m3qkv_mxfp8_quantize stress_mxfp8_quantize
#define m3qkv_prepare_weights_fp8 stress_prepare_weights_fp8
#define m3qkv_prepare_weights_fp8_sizes stress_prepare_weights_fp8_sizes
#define m3qkv_backend stress_backend
#define m3qkv_warmup stress_warmup_api
#define m3qkv_selftest stress_selftest
#define m3qkv_set_backend stress_set_backend
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

namespace {

using m3qkv_valid_args::fake;

// ---------------------------------------------------------------------------
// One thread's world.
// ---------------------------------------------------------------------------
struct Stream {
  cudaStream_t s;
  size_t ctx;
};

struct Stats {
  long calls = 0, rejected_by_validation = 0, rejected_later = 0, launched = 0, noops = 0, queries = 0;
};

// Random invalid variants of a valid struct (or the valid one).
template <class A>
void maybe_break(std::mt19937_64& r, A& a) {
  switch (r() % 10) {
    case 0: a.struct_size = 7; break;
    case 1: a.m = 0; break;  // an empty batch: valid, nothing to do
    case 2: a.use_pdl = 3; break;
    case 3: a.m = -1; break;
    default: break;
  }
}
void break_epilogue(std::mt19937_64& r, m3qkv_fused_args& a) {
  switch (r() % 12) {
    case 0: a.eps = 0.0f; break;
    case 1: a.q_out = static_cast<char*>(a.q_out) + 1; break;
    case 2: a.q_out = a.q_fp8_out; break;  // overlap
    case 3: a.kv_cache = nullptr; break;
    case 4: a.k = 100; break;
    case 5: a.x_bf16 = fake(9); break;     // x_bf16 and xq: refused by validation
    case 6: a.cta_group = 5; break;
    default: break;
  }
}

size_t stream_ctx(cudaStream_t s) {
  std::lock_guard<std::mutex> lock(fake_cuda().mu);
  const auto it = fake_cuda().streams.find(s);
  return it == fake_cuda().streams.end() ? 0 : it->second;
}

void check_call(const char* what, m3qkv_status predicted, bool noop, m3qkv_status st, long cuda_before,
                long launches_before, Stats& stats) {
  const long cuda = t_cuda_calls - cuda_before, launches = t_launches - launches_before;
  const std::string msg = m3qkv_last_error();
  ++stats.calls;
  if (predicted != M3QKV_SUCCESS || noop) {
    if (predicted != M3QKV_SUCCESS) ++stats.rejected_by_validation;
    else ++stats.noops;
    if (st != predicted) failure(what, "status " + std::to_string(st) + " but validation said " + std::to_string(predicted) + ": " + msg);
    if (cuda != 0) failure(what, "a call validation settles made " + std::to_string(cuda) + " CUDA calls: " + msg);
    if (launches != 0) failure(what, "a call validation settles launched");
    return;
  }
  if (st != M3QKV_SUCCESS) {
    ++stats.rejected_later;
    if (launches != 0 && launches != 1) failure(what, "a failed call launched " + std::to_string(launches) + " times");
    // A launcher's own failure (its workspace) comes after its launch record; anything else launched nothing.
    if (launches == 1 && msg.find("stream workspace") == std::string::npos && msg.find("stress") == std::string::npos)
      failure(what, "a refused call launched: " + msg);
    if (msg.empty()) failure(what, "a failure without a message");
    return;
  }
  ++stats.launched;
  if (launches != 1) failure(what, "a successful call launched " + std::to_string(launches) + " times");
  if (!msg.empty()) failure(what, "a success left a message: " + msg);
}

void worker(int index, double seconds, std::atomic<int>* done_calls, std::atomic<int>* phase, Stats* out) {
  std::mt19937_64 r(0x3030 + static_cast<uint64_t>(index));
  t_rng = &r;
  t_index = index;
  const int num_devices = static_cast<int>(fake_cuda().cc.size());
  fake_set_current_device(1 + index % (num_devices - 1));
  // Contexts and streams of this thread.
  std::vector<size_t> contexts;
  for (int i = 0; i < 2; ++i) {
    std::lock_guard<std::mutex> lock(fake_cuda().mu);
    contexts.push_back(fake_cuda().new_context(static_cast<int>(r() % num_devices)));
  }
  std::vector<Stream> streams;
  for (int i = 0; i < 6; ++i) {
    size_t ctx;
    if (i < 2) {
      ctx = contexts[static_cast<size_t>(i)];
    } else {
      const int d = static_cast<int>(r() % num_devices);
      std::lock_guard<std::mutex> lock(fake_cuda().mu);
      ctx = fake_cuda().primary_of(d);
    }
    streams.push_back(Stream{fake_cuda().new_stream(ctx), ctx});
  }
  Stats stats;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  static const cudaStreamCaptureMode kModes[] = {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal,
                                                 cudaStreamCaptureModeRelaxed};
  while (std::chrono::steady_clock::now() < deadline) {
    // The caller's context: a primary one, or a created one pushed for this call.
    bool pushed = false;
    switch (r() % 6) {
      case 0: {
        const int d = static_cast<int>(r() % num_devices);
        fake_set_current_device(d);
        break;
      }
      case 1:
        t_ctx_stack.push_back(contexts[r() % contexts.size()]);
        pushed = true;
        break;
      default: break;
    }
    // The stream and capture states.
    cudaStream_t s = nullptr;
    const int pick = static_cast<int>(r() % 10);
    if (pick == 0) s = cudaStreamLegacy;
    else if (pick == 1) s = cudaStreamPerThread;
    else if (pick >= 4) s = streams[r() % streams.size()].s;
    if (r() % 8 == 0) {
      const Stream& x = streams[r() % streams.size()];
      std::lock_guard<std::mutex> lock(fake_cuda().mu);
      if (!fake_cuda().capturing.erase(x.s)) fake_cuda().capturing[x.s] = fake_cuda().next_capture_id++;
    }
    if (r() % 8 == 0) {
      t_per_thread_capturing = !t_per_thread_capturing;
      g_session[index] = t_per_thread_capturing ? ++t_session_counter : 0;
    }
    t_capture_mode = kModes[r() % 3];
    const size_t own = stream_ctx(s);
    t_expected_ctx = own != 0 ? own : current_ctx();
    const std::vector<size_t> stack_before = t_ctx_stack;
    const int device_before = t_runtime_device;
    const cudaStreamCaptureMode mode_before = t_capture_mode;

    const long cuda0 = t_cuda_calls, launch0 = t_launches;
    m3qkv_status predicted = M3QKV_SUCCESS, st = M3QKV_SUCCESS;
    bool noop = false, args_call = true;
    const char* what = "";
    switch (r() % 10) {
      case 0:
      case 1:
      case 2:
      case 3: {
        what = "m3qkv_fused_qkv";
        m3qkv_fused_args a = m3qkv_valid_args::valid_fused(), out;
        break_epilogue(r, a);
        maybe_break(r, a);
        predicted = m3qkv::validate_fused(&a, &out, &noop);
        if (t_cuda_calls != cuda0) failure(what, "validation made a CUDA call");
        st = stress_fused_qkv(&a, s);
        break;
      }
      case 4:
      case 5: {
        what = "m3qkv_qknorm_rope_kv_insert";
        m3qkv_insert_args a = m3qkv_valid_args::valid_insert(), out;
        if (r() % 5 == 0) a.kv_page_stride = 2300;
        maybe_break(r, a);
        predicted = m3qkv::validate_insert(&a, &out, &noop);
        st = stress_qknorm_rope_kv_insert(&a, s);
        break;
      }
      case 6: {
        what = "m3qkv_mxfp8_gemm";
        m3qkv_gemm_args a = m3qkv_valid_args::valid_gemm(), out;
        if (r() % 5 == 0) a.out = const_cast<void*>(a.xq);
        maybe_break(r, a);
        predicted = m3qkv::validate_gemm(&a, &out, &noop);
        st = stress_mxfp8_gemm(&a, s);
        break;
      }
      case 7: {
        what = "m3qkv_mxfp8_quantize";
        m3qkv_quantize_args a = m3qkv_valid_args::valid_quantize(), out;
        if (r() % 5 == 0) a.xsf = static_cast<char*>(a.xq) + 16;
        maybe_break(r, a);
        predicted = m3qkv::validate_quantize(&a, &out, &noop);
        st = stress_mxfp8_quantize(&a, s);
        break;
      }
      case 8: {
        args_call = false;
        what = "m3qkv_backend";
        m3qkv_backend_kind k = M3QKV_BACKEND_NONE;
        const int d = static_cast<int>(r() % (num_devices + 1)) - (r() % 16 == 0 ? 1 : 0);
        st = stress_backend(d, &k);
        ++stats.queries;
        break;
      }
      default: {
        args_call = false;
        const int d = static_cast<int>(r() % num_devices);
        if (r() % 2) {
          what = "m3qkv_warmup";
          st = stress_warmup_api(d);
        } else {
          what = "m3qkv_set_backend";
          static const m3qkv_backend_kind kKinds[] = {M3QKV_BACKEND_NONE, M3QKV_BACKEND_PORTABLE, M3QKV_BACKEND_SM90,
                                                      M3QKV_BACKEND_SM100};
          st = stress_set_backend(d, r() % 4 == 0 ? kKinds[r() % 4] : M3QKV_BACKEND_NONE);
        }
        ++stats.queries;
        break;
      }
    }
    if (args_call) check_call(what, predicted, noop, st, cuda0, launch0, stats);
    else if (t_launches != launch0) failure(what, "launched");
    if (t_ctx_stack != stack_before) failure(what, "the caller's context stack changed");
    if (t_runtime_device != device_before) failure(what, "the caller's runtime device changed");
    if (t_capture_mode != mode_before) failure(what, "the thread's capture mode was not restored");
    if (pushed) t_ctx_stack.pop_back();
    done_calls->fetch_add(1, std::memory_order_relaxed);
  }
  t_per_thread_capturing = false;
  g_session[index] = 0;

  // Every thread stops calling before any releases (release_stream_workspace:
  // no other thread may be calling on the stream).
  phase->fetch_add(1);
  while (phase->load() < kThreads) std::this_thread::yield();
  // Every captured graph is destroyed (the user objects' destructors queue
  // their workspaces) before any thread releases: the releases free them.
  fake_destroy_graphs();
  phase->fetch_add(1);
  while (phase->load() < 2 * kThreads) std::this_thread::yield();
  std::vector<size_t> all_contexts = contexts;
  for (int d = 0; d < num_devices; ++d) {
    std::lock_guard<std::mutex> lock(fake_cuda().mu);
    all_contexts.push_back(fake_cuda().primary_of(d));
  }
  for (size_t ctx : all_contexts) {
    t_ctx_stack.assign(1, ctx);
    std::vector<cudaStream_t> ss = {nullptr, cudaStreamLegacy, cudaStreamPerThread};
    for (const Stream& x : streams)
      if (x.ctx == ctx) ss.push_back(x.s);
    for (cudaStream_t s : ss) {
      for (int cap = 0; cap < 2; ++cap) {
        if (s == cudaStreamPerThread) t_per_thread_capturing = cap == 1;
        else if (s != nullptr && s != cudaStreamLegacy) {
          std::lock_guard<std::mutex> lock(fake_cuda().mu);
          if (cap) fake_cuda().capturing[s] = fake_cuda().next_capture_id++;
          else fake_cuda().capturing.erase(s);
        } else if (cap) {
          continue;
        }
        m3qkv::host::ContextScope scope;
        m3qkv::DeviceInfo d;
        if (m3qkv::host::enter_stream("release", s, &scope, &d) != M3QKV_SUCCESS ||
            m3qkv::host::release_stream_workspace("api_stress", d, s) != M3QKV_SUCCESS)
          failure("release", m3qkv_last_error());
      }
    }
  }
  t_per_thread_capturing = false;
  *out = stats;
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 15;
  m3qkv::api::testing_set_env(nullptr, nullptr);
  FakeCudaInstall install;
  m3qkv::host::testing_install_cuda(&g_table);
  const auto t0 = std::chrono::steady_clock::now();
  std::atomic<int> calls{0}, phase{0};
  std::vector<Stats> stats(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) threads.emplace_back(worker, i, seconds, &calls, &phase, &stats[static_cast<size_t>(i)]);
  for (auto& t : threads) t.join();
  m3qkv::host::release_workspaces();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Every allocation freed exactly once.
  std::map<void*, int> balance;
  {
    std::lock_guard<std::mutex> lock(fake_cuda().mu);
    for (const auto& m : fake_cuda().mallocs) balance[m.first] += 1;
    for (void* p : fake_cuda().frees) balance[p] -= 1;
  }
  long leaked = 0, extra_frees = 0;
  for (const auto& b : balance) {
    if (b.second > 0) leaked += b.second;
    if (b.second < 0) extra_frees -= b.second;
  }
  if (leaked) failure("workspaces", std::to_string(leaked) + " allocations never freed");
  if (extra_frees) failure("workspaces", std::to_string(extra_frees) + " frees of memory not allocated (or freed twice)");

  Stats total;
  for (const Stats& s : stats) {
    total.calls += s.calls, total.rejected_by_validation += s.rejected_by_validation;
    total.rejected_later += s.rejected_later, total.launched += s.launched, total.noops += s.noops;
    total.queries += s.queries;
  }
  std::printf("api_stress: %d threads, %.1f s: %d calls (%ld with arguments: %ld refused by validation, %ld empty, %ld "
              "refused later, %ld launched; %ld backend / warmup calls), %zu allocations, all freed: %s\n",
              kThreads, secs, calls.load(), total.calls, total.rejected_by_validation, total.noops, total.rejected_later,
              total.launched, total.queries, fake_cuda().mallocs.size(), leaked == 0 && extra_frees == 0 ? "yes" : "no");
  std::printf("api_stress: cooperative grids checked: %ld; capture workspaces shared by concurrent captures of "
              "different threads on cudaStreamPerThread: %ld\n",
              g_coop_checks.load(), g_shared_capture_ws.load());
  if (g_shared_capture_ws.load() > 0) failure("capture workspaces", "shared between threads");
  if (total.launched == 0 || total.rejected_by_validation == 0) failure("coverage", "no launch or no rejection");
  if (g_failures.load() > 0) {
    std::printf("api_stress: FAILED (%ld)\n", g_failures.load());
    return 1;
  }
  std::printf("api_stress: passed\n");
  return 0;
}
