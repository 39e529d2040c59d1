// Context resolution and the per-context state records (see context.h).
#include "host/context.h"

#include <memory>

#include "host/cuda.h"
#include "host/status.h"

namespace m3qkv::host {
namespace {

// Bumped by testing_forget_contexts; thread-local caches compare it.
std::atomic<unsigned long long> g_generation{1};
// The generation in which cudaGetDeviceCount last succeeded (runtime and
// driver initialized, at least one device).
std::atomic<unsigned long long> g_runtime_ready{0};

std::mutex g_mu;
std::unordered_map<unsigned long long, std::unique_ptr<ContextState>>& states() {
  static auto* m = new std::unordered_map<unsigned long long, std::unique_ptr<ContextState>>();
  return *m;
}

// The last state this thread used: most threads call in one context, so the
// registry's mutex and map are only reached when the context changes.
struct LastState {
  unsigned long long generation = 0, id = 0;
  ContextState* state = nullptr;
};
thread_local LastState t_last;

bool is_default_stream(cudaStream_t s) { return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread; }

// The driver calls below need an initialized runtime (which runs cuInit) and
// a device; cudaGetDeviceCount gives both, and the no-device message.
m3qkv_status ensure_runtime(const char* fn, const Cuda& c) {
  const unsigned long long gen = g_generation.load(std::memory_order_acquire);
  if (g_runtime_ready.load(std::memory_order_acquire) == gen) return M3QKV_SUCCESS;
  int count = 0;
  M3QKV_CUDA_TRY(fn, c.get_device_count(&count));
  if (count <= 0) return cuda_fail(fn, "cudaGetDeviceCount", cudaErrorNoDevice);
  g_runtime_ready.store(gen, std::memory_order_release);
  return M3QKV_SUCCESS;
}

// The state of context `id` (current on this thread), made on first use.
m3qkv_status state_of(const char* fn, const Cuda& c, unsigned long long id, ContextState** out) {
  const unsigned long long gen = g_generation.load(std::memory_order_acquire);
  if (t_last.generation == gen && t_last.id == id) {
    *out = t_last.state;
    return M3QKV_SUCCESS;
  }
  ContextState* st = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    const auto it = states().find(id);
    if (it != states().end()) st = it->second.get();
  }
  if (st == nullptr) {
    // A context seen for the first time: its device (the current context's
    // ordinal; driver and runtime number devices alike) and that device's facts.
    CUdevice device = 0;
    M3QKV_CUDA_TRY(fn, c.ctx_get_device(&device));
    auto fresh = std::make_unique<ContextState>();
    M3QKV_TRY(query_device(static_cast<int>(device), &fresh->facts, fn));
    fresh->id = id;
    fresh->facts.context = fresh.get();
    std::lock_guard<std::mutex> lock(g_mu);
    auto& slot = states()[id];  // another thread may have made it meanwhile: keep the first
    if (!slot) slot = std::move(fresh);
    st = slot.get();
  }
  t_last = LastState{gen, id, st};
  *out = st;
  return M3QKV_SUCCESS;
}

// Makes `ctx` current (when it is not: `cur`) for the scope, then its state.
m3qkv_status enter(const char* fn, const Cuda& c, CUcontext ctx, CUcontext cur, ContextScope* scope,
                   DeviceInfo* dev) {
  if (ctx != cur) {
    M3QKV_CUDA_TRY(fn, c.ctx_push_current(ctx));
    scope->set_pushed();
  }
  unsigned long long id = 0;
  M3QKV_CUDA_TRY(fn, c.ctx_get_id(ctx, &id));
  ContextState* st = nullptr;
  M3QKV_TRY(state_of(fn, c, id, &st));
  *dev = st->facts;
  return M3QKV_SUCCESS;
}

}  // namespace

ContextScope::~ContextScope() {
  if (!pushed_) return;
  // Nothing to report from here: a failing pop means the thread's context
  // stack was changed under us, which no status could repair.
  CUcontext popped = nullptr;
  (void)cuda_unresolved().ctx_pop_current(&popped);
}

m3qkv_status enter_stream(const char* fn, cudaStream_t stream, ContextScope* scope, DeviceInfo* dev) {
  const Cuda* c = nullptr;
  M3QKV_TRY(cuda(fn, &c));
  M3QKV_TRY(ensure_runtime(fn, *c));
  CUcontext cur = nullptr;
  M3QKV_CUDA_TRY(fn, c->ctx_get_current(&cur));
  CUcontext ctx = cur;
  if (!is_default_stream(stream)) {
    M3QKV_CUDA_TRY(fn, c->stream_get_ctx(reinterpret_cast<CUstream>(stream), &ctx));
  } else if (cur == nullptr) {
    // No context on this thread yet: the current device's primary context,
    // made current as the runtime would make it on the launch.
    int device = 0;
    M3QKV_CUDA_TRY(fn, c->get_device(&device));
    M3QKV_CUDA_TRY(fn, c->set_device(device));
    M3QKV_CUDA_TRY(fn, c->ctx_get_current(&cur));
    if (cur == nullptr) {
      return fail(M3QKV_ERROR_INTERNAL, "%s: cudaSetDevice(%d) left no context current on this thread", fn, device);
    }
    ctx = cur;
  }
  return enter(fn, *c, ctx, cur, scope, dev);
}

m3qkv_status enter_primary(const char* fn, int device, ContextScope* scope, DeviceInfo* dev) {
  const Cuda* c = nullptr;
  M3QKV_TRY(cuda(fn, &c));
  M3QKV_TRY(ensure_runtime(fn, *c));
  DeviceInfo facts;
  M3QKV_TRY(query_device(device, &facts, fn));  // checks the ordinal
  // The first retain per device is kept for the process (a primary context
  // nobody else holds yet would be destroyed by the release, and the warmup
  // with it); later calls give theirs back once the context is current.
  CUcontext primary = nullptr;
  M3QKV_CUDA_TRY(fn, c->primary_ctx_retain(&primary, device));
  CUcontext cur = nullptr;
  M3QKV_CUDA_TRY(fn, c->ctx_get_current(&cur));
  M3QKV_TRY(enter(fn, *c, primary, cur, scope, dev));
  static std::mutex mu;
  static std::unordered_map<int, unsigned long long> kept;  // device -> the primary context's id holding our retain
  std::lock_guard<std::mutex> lock(mu);
  unsigned long long& id = kept[device];
  if (id == dev->context->id) M3QKV_CUDA_TRY(fn, c->primary_ctx_release(device));
  else id = dev->context->id;  // first, or the primary context was re-created (cudaDeviceReset)
  return M3QKV_SUCCESS;
}

ContextState* find_context(unsigned long long id) {
  std::lock_guard<std::mutex> lock(g_mu);
  const auto it = states().find(id);
  return it != states().end() ? it->second.get() : nullptr;
}

void testing_forget_contexts() {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    states().clear();
  }
  testing_forget_devices();
  g_generation.fetch_add(1, std::memory_order_acq_rel);
}

unsigned long long context_generation() { return g_generation.load(std::memory_order_acquire); }

}  // namespace m3qkv::host

namespace m3qkv {
m3qkv_status current_device_info(DeviceInfo* out, const char* fn) {
  host::ContextScope scope;  // the NULL stream never pushes a context
  return host::enter_stream(fn, nullptr, &scope, out);
}
}  // namespace m3qkv
