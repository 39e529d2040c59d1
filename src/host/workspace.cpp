// Stream workspaces (see workspace.h).
#include "host/workspace.h"

#include "host/context.h"
#include "host/cuda.h"
#include "host/status.h"

namespace m3qkv::host {
namespace {

constexpr const char* kFn = "m3qkv: stream workspace";
constexpr size_t kAlign = 256;

// The last workspace this thread got: the steady state of one stream per
// thread takes no lock.
struct LastWorkspace {
  unsigned long long generation = 0, context = 0, stream = 0;
  Workspace ws;
};
thread_local LastWorkspace t_last;

// Frees the workspaces at exit; made with the first allocation, so that it
// is destroyed before the CUDA runtime's own exit handler runs.
struct ReleaseAtExit {
  ~ReleaseAtExit() { release_workspaces(); }
};

// The stream's key: its id, or (while it captures) its handle; bit 0 says which.
m3qkv_status stream_key(const Cuda& c, cudaStream_t stream, unsigned long long* key) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  M3QKV_CUDA_TRY(kFn, c.stream_is_capturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    *key = (static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(stream)) << 1) | 1u;
    return M3QKV_SUCCESS;
  }
  unsigned long long id = 0;
  M3QKV_CUDA_TRY(kFn, c.stream_get_id(stream, &id));
  *key = id << 1;
  return M3QKV_SUCCESS;
}

bool is_capture_key(unsigned long long key) { return (key & 1u) != 0; }

// cudaMalloc of `bytes` with the capture mode relaxed, then the zeroing
// (workspace.h says where and why).
m3qkv_status allocate(const Cuda& c, ContextState& st, cudaStream_t stream, bool capturing, size_t bytes, void** out) {
  static ReleaseAtExit release;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  M3QKV_CUDA_TRY(kFn, c.exchange_capture_mode(&mode));
  void* p = nullptr;
  cudaError_t e = c.malloc(&p, bytes);
  const size_t zero = bytes < kWorkspaceZeroBytes ? bytes : kWorkspaceZeroBytes;
  if (e == cudaSuccess && !capturing) {
    e = c.memset_async(p, 0, zero, stream);  // stream-ordered: no host wait
  } else if (e == cudaSuccess) {
    if (st.zero_stream == nullptr) e = c.stream_create_with_flags(&st.zero_stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = c.memset_async(p, 0, zero, st.zero_stream);
    if (e == cudaSuccess) e = c.stream_synchronize(st.zero_stream);
  }
  if (e != cudaSuccess && p != nullptr) (void)c.free(p);
  cudaStreamCaptureMode restore = mode;
  const cudaError_t e2 = c.exchange_capture_mode(&restore);
  if (e != cudaSuccess) return cuda_fail(kFn, "cudaMalloc / cudaMemsetAsync of the workspace", e);
  M3QKV_CUDA_TRY(kFn, e2);
  *out = p;
  return M3QKV_SUCCESS;
}

}  // namespace

m3qkv_status stream_workspace(const DeviceInfo& dev, cudaStream_t stream, size_t bytes, void** out) {
  if (dev.context == nullptr) return fail(M3QKV_ERROR_INTERNAL, "%s: DeviceInfo without a context", kFn);
  ContextState& st = *dev.context;
  const Cuda& c = cuda_unresolved();  // enter_* resolved it
  unsigned long long key = 0;
  M3QKV_TRY(stream_key(c, stream, &key));
  const unsigned long long gen = context_generation();
  if (t_last.generation == gen && t_last.context == st.id && t_last.stream == key && t_last.ws.bytes >= bytes) {
    *out = t_last.ws.ptr;
    return M3QKV_SUCCESS;
  }
  std::lock_guard<std::mutex> lock(st.workspace_mu);
  Workspace& ws = st.workspaces[key];
  if (ws.bytes < bytes) {
    size_t want = bytes > 2 * ws.bytes ? bytes : 2 * ws.bytes;
    want = (want + kAlign - 1) / kAlign * kAlign;
    void* p = nullptr;
    M3QKV_TRY(allocate(c, st, stream, is_capture_key(key), want, &p));
    if (ws.ptr != nullptr) st.retired.push_back(RetiredWorkspace{key, ws.ptr});
    ws = Workspace{p, want};
  }
  t_last = LastWorkspace{gen, st.id, key, ws};
  *out = ws.ptr;
  return M3QKV_SUCCESS;
}

m3qkv_status release_stream_workspace(const char* fn, const DeviceInfo& dev, cudaStream_t stream,
                                      bool refuse_capture) {
  if (dev.context == nullptr) return fail(M3QKV_ERROR_INTERNAL, "%s: DeviceInfo without a context", fn);
  ContextState& st = *dev.context;
  const Cuda& c = cuda_unresolved();
  unsigned long long key = 0;
  M3QKV_TRY(stream_key(c, stream, &key));
  if (refuse_capture && is_capture_key(key))
    return fail(M3QKV_ERROR_INVALID_ARGUMENT,
                "%s: stream %p is capturing a graph: its workspace cannot be freed during the capture (release it "
                "after cudaStreamEndCapture)",
                fn, static_cast<void*>(stream));
  std::lock_guard<std::mutex> lock(st.workspace_mu);
  // This thread's cache may name the buffer; other threads' caches cannot
  // (the caller owns the stream and made every call on it from this thread).
  if (t_last.context == st.id && t_last.stream == key) t_last = LastWorkspace{};
  cudaError_t first = cudaSuccess;
  const auto drop = [&](void* p) {
    const cudaError_t e = c.free(p);
    if (first == cudaSuccess) first = e;
  };
  const auto it = st.workspaces.find(key);
  if (it != st.workspaces.end()) {
    drop(it->second.ptr);
    st.workspaces.erase(it);
  }
  for (size_t i = 0; i < st.retired.size();) {
    if (st.retired[i].stream_key == key) {
      drop(st.retired[i].ptr);
      st.retired.erase(st.retired.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  if (first != cudaSuccess) return cuda_fail(kFn, "cudaFree of a stream workspace", first);
  return M3QKV_SUCCESS;
}

void release_workspaces() {
  const Cuda* c = nullptr;
  int count = 0;
  if (cuda("m3qkv: exit", &c) != M3QKV_SUCCESS || c->get_device_count(&count) != cudaSuccess) {
    (void)cuda_unresolved().get_last_error();
    return;
  }
  for (int d = 0; d < count; ++d) {
    unsigned flags = 0;
    int active = 0;
    if (c->primary_ctx_get_state(d, &flags, &active) != CUDA_SUCCESS || !active) continue;
    CUcontext ctx = nullptr;
    unsigned long long id = 0;
    if (c->primary_ctx_retain(&ctx, d) != CUDA_SUCCESS) continue;
    ContextState* st = c->ctx_get_id(ctx, &id) == CUDA_SUCCESS ? find_context(id) : nullptr;
    if (st != nullptr && c->ctx_push_current(ctx) == CUDA_SUCCESS) {
      std::lock_guard<std::mutex> lock(st->workspace_mu);
      for (auto& kv : st->workspaces) (void)c->free(kv.second.ptr);
      for (const RetiredWorkspace& r : st->retired) (void)c->free(r.ptr);
      if (st->zero_stream != nullptr) (void)c->stream_destroy(st->zero_stream);
      st->workspaces.clear();
      st->retired.clear();
      st->zero_stream = nullptr;
      CUcontext popped = nullptr;
      (void)c->ctx_pop_current(&popped);
    }
    (void)c->primary_ctx_release(d);
  }
  (void)c->get_last_error();  // nothing here is anyone's business after exit
}

m3qkv_status splitk_workspace(const char* fn, const DeviceInfo& dev, cudaStream_t stream, const splitk::Plan& plan,
                              SplitkBuffers* out) {
  *out = SplitkBuffers{};
  if (plan.split <= 1) return M3QKV_SUCCESS;
  if (plan.counter_bytes > static_cast<int64_t>(kSplitkCounterBytesMax))
    return fail(M3QKV_ERROR_INTERNAL, "%s: %lld counter bytes exceed the zeroed workspace head's %zu counter bytes", fn,
                static_cast<long long>(plan.counter_bytes), kSplitkCounterBytesMax);
  void* ws = nullptr;
  M3QKV_TRY(stream_workspace(dev, stream, splitk_workspace_bytes(plan), &ws));
  out->counters = static_cast<uint32_t*>(ws);
  out->partials = reinterpret_cast<float*>(static_cast<uint8_t*>(ws) + kSplitkPartialsOffset);
  return M3QKV_SUCCESS;
}

}  // namespace m3qkv::host
