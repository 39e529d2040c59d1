// Stream and capture workspaces (see workspace.h).
#include "host/workspace.h"

#include "host/context.h"
#include "host/cuda.h"
#include "host/status.h"

namespace m3qkv::host {

// What the lookups set in a lease.
struct LeaseAccess {
  static std::shared_lock<std::shared_mutex>& lock(WorkspaceLease* l) { return l->lock_; }
  static void hand_out(WorkspaceLease* l, cudaStream_t s, cudaEvent_t fence) { l->stream_ = s, l->fence_ = fence; }
  static void give_back_after(WorkspaceLease* l, void* body) { l->body_ = body; }
};

namespace {

constexpr const char* kFn = "m3qkv: stream workspace";
constexpr size_t kAlign = 256;

// The last workspace this thread got: valid while the context records and
// the context's free epoch are unchanged (checked under the shared lock).
struct LastWorkspace {
  unsigned long long generation = 0, context = 0, key = 0, epoch = 0;
  Workspace* entry = nullptr;
  void* ptr = nullptr;
  size_t bytes = 0;
};
thread_local LastWorkspace t_last;

// Frees the workspaces at exit; made with the first allocation, so that it
// is destroyed before the CUDA runtime's own exit handler runs.
struct ReleaseAtExit {
  ~ReleaseAtExit() { release_workspaces(); }
};

// A key names a stream (its id, bit 0 clear) or a capture (its id, bit 0 set).
bool is_capture_key(unsigned long long key) { return (key & 1u) != 0; }

struct StreamKey {
  unsigned long long key = 0;
  cudaGraph_t graph = nullptr;  // the graph being captured (capture keys)
};
m3qkv_status stream_key(const Cuda& c, cudaStream_t stream, StreamKey* out) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  cudaGraph_t graph = nullptr;
  M3QKV_CUDA_TRY(kFn, c.stream_get_capture_info(stream, &capture, &id, &graph));
  if (capture == cudaStreamCaptureStatusInvalidated)
    return fail(M3QKV_ERROR_CUDA_ERROR, "%s: stream %p's capture was invalidated (an earlier error during capture)",
                kFn, static_cast<void*>(stream));
  if (capture == cudaStreamCaptureStatusActive) {
    *out = StreamKey{(id << 1) | 1u, graph};
    return M3QKV_SUCCESS;
  }
  M3QKV_CUDA_TRY(kFn, c.stream_get_id(stream, &id));
  *out = StreamKey{id << 1, nullptr};
  return M3QKV_SUCCESS;
}

// The user object's destructor (a CUDA thread; no CUDA calls allowed): run
// when the graph no longer uses the object, i.e. the graph and its
// executable graphs are destroyed and their launches done (CUDA runtime API,
// cudaUserObjectCreate; CUDA C++ Programming Guide, "CUDA User Objects"), so
// its workspace can be freed by the next call.
struct DeadCapture {
  unsigned long long context = 0, key = 0;
};
void CUDART_CB capture_graph_destroyed(void* p) {
  const DeadCapture* d = static_cast<const DeadCapture*>(p);
  if (ContextState* st = find_context(d->context)) {
    std::lock_guard<std::mutex> lock(st->dead_mu);
    st->dead_captures.push_back(d->key);
  }
  delete d;
}

// The graph being captured owns a reference to the capture workspace `key`.
m3qkv_status tie_to_graph(const Cuda& c, ContextState& st, unsigned long long key, cudaGraph_t graph) {
  auto* cookie = new DeadCapture{st.id, key};
  cudaUserObject_t obj = nullptr;
  cudaError_t e = c.user_object_create(&obj, cookie, &capture_graph_destroyed, 1, cudaUserObjectNoDestructorSync);
  if (e != cudaSuccess) {
    delete cookie;
    return cuda_fail(kFn, "cudaUserObjectCreate (the capture workspace's lifetime)", e);
  }
  e = c.graph_retain_user_object(graph, obj, 1, cudaGraphUserObjectMove);
  if (e != cudaSuccess) {
    (void)c.user_object_release(obj, 1);  // runs the destructor: the workspace is queued, not leaked
    return cuda_fail(kFn, "cudaGraphRetainUserObject (the capture workspace's lifetime)", e);
  }
  return M3QKV_SUCCESS;
}

// The zero stream of the context (m3qkv's own, non-blocking), made on first use.
cudaError_t zero_stream(const Cuda& c, ContextState& st, cudaStream_t* out) {
  cudaError_t e = cudaSuccess;
  if (st.zero_stream == nullptr) e = c.stream_create_with_flags(&st.zero_stream, cudaStreamNonBlocking);
  *out = st.zero_stream;
  return e;
}

// `bytes` from the device's memory pool, then the zeroing of its head
// (workspace.h says where and why): a stream's on that stream, a capture's on
// the zero stream, waited for. Capture mode relaxed by the caller.
m3qkv_status allocate(const Cuda& c, ContextState& st, cudaStream_t stream, bool capture, size_t bytes, void** out) {
  static ReleaseAtExit release;
  cudaStream_t on = stream;
  cudaError_t e = capture ? zero_stream(c, st, &on) : cudaSuccess;
  void* p = nullptr;
  if (e == cudaSuccess) e = c.malloc_async(&p, bytes, on);
  const size_t zero = bytes < kWorkspaceZeroBytes ? bytes : kWorkspaceZeroBytes;
  if (e == cudaSuccess) e = c.memset_async(p, 0, zero, on);  // stream-ordered: no host wait
  if (e == cudaSuccess && capture) e = c.stream_synchronize(on);
  if (e != cudaSuccess) {
    if (p != nullptr) (void)c.free_async(p, on);
    return cuda_fail(kFn, "cudaMallocAsync / cudaMemsetAsync of the workspace", e);
  }
  *out = p;
  return M3QKV_SUCCESS;
}

// Frees one workspace's buffers on stream `on` and forgets it (lock held
// exclusively). A stream's waits for its fence first: `on` may be another
// stream than the one that used it.
cudaError_t drop(const Cuda& c, ContextState& st, unsigned long long key, cudaStream_t on) {
  const auto it = st.workspaces.find(key);
  if (it == st.workspaces.end()) return cudaSuccess;
  Workspace& ws = it->second;
  cudaError_t first = ws.fence != nullptr ? c.stream_wait_event(on, ws.fence, 0) : cudaSuccess;
  const auto note = [&](cudaError_t e) {
    if (first == cudaSuccess) first = e;
  };
  if (ws.ptr != nullptr) note(c.free_async(ws.ptr, on));
  for (void* p : ws.outgrown) note(c.free_async(p, on));
  if (ws.fence != nullptr) note(c.event_destroy(ws.fence));  // released once it completes
  if (!is_capture_key(key)) st.stream_bytes -= ws.bytes;
  st.workspaces.erase(it);
  st.workspace_epoch.fetch_add(1, std::memory_order_release);
  return first;
}

// The capture workspaces whose graphs are gone (lock held exclusively), on
// the zero stream: no launch of theirs is left.
cudaError_t drop_dead_captures(const Cuda& c, ContextState& st) {
  std::vector<unsigned long long> dead;
  {
    std::lock_guard<std::mutex> lock(st.dead_mu);
    dead.swap(st.dead_captures);
  }
  if (dead.empty()) return cudaSuccess;
  cudaStream_t on = nullptr;
  cudaError_t first = zero_stream(c, st, &on);
  for (unsigned long long key : dead) {
    const cudaError_t e = first == cudaSuccess ? drop(c, st, key, on) : cudaSuccess;
    if (first == cudaSuccess) first = e;
  }
  return first;
}

// The least recently used stream workspaces other than `keep`, freed on the
// calling stream `on` while the context holds more than the bounds (lock
// held exclusively).
cudaError_t trim_streams(const Cuda& c, ContextState& st, unsigned long long keep, cudaStream_t on) {
  cudaError_t first = cudaSuccess;
  for (;;) {
    int streams = 0;
    unsigned long long lru = 0, lru_use = ~0ull;
    for (const auto& kv : st.workspaces) {
      if (is_capture_key(kv.first)) continue;
      ++streams;
      const unsigned long long use = kv.second.last_use.load(std::memory_order_relaxed);
      if (kv.first != keep && use < lru_use) lru = kv.first, lru_use = use;
    }
    if ((streams <= kMaxStreamWorkspaces && st.stream_bytes <= kStreamWorkspaceBudget) || lru_use == ~0ull)
      return first;
    const cudaError_t e = drop(c, st, lru, on);
    if (first == cudaSuccess) first = e;
  }
}

// The slow path: makes the workspace of `k` at least `bytes` large (lock held
// exclusively), frees what the rules say, and caches the result for the
// thread.
m3qkv_status prepare(const Cuda& c, ContextState& st, cudaStream_t stream, const StreamKey& k, size_t bytes) {
  const bool capture = is_capture_key(k.key);
  RelaxedCaptureMode relaxed(c);
  M3QKV_CUDA_TRY(kFn, relaxed.error());
  if (!capture) M3QKV_CUDA_TRY(kFn, drop_dead_captures(c, st));
  const bool fresh = st.workspaces.find(k.key) == st.workspaces.end();
  Workspace& ws = st.workspaces[k.key];
  if (fresh && capture) {
    const m3qkv_status s = tie_to_graph(c, st, k.key, k.graph);
    if (s != M3QKV_SUCCESS) {
      st.workspaces.erase(k.key);  // the user object, if made, queued the key: dropping it then is a no-op
      return s;
    }
  }
  if (ws.bytes < bytes) {
    size_t want = bytes > 2 * ws.bytes ? bytes : 2 * ws.bytes;
    want = (want + kAlign - 1) / kAlign * kAlign;
    if (ws.ptr != nullptr) {
      if (capture) {
        ws.outgrown.push_back(ws.ptr);  // nodes captured earlier use it
      } else {
        const cudaError_t e = c.free_async(ws.ptr, stream);  // after the launches on it that used it
        st.stream_bytes -= ws.bytes;
        st.workspace_epoch.fetch_add(1, std::memory_order_release);
        if (e != cudaSuccess) {
          ws.ptr = nullptr, ws.bytes = 0;
          return cuda_fail(kFn, "cudaFreeAsync of an outgrown workspace", e);
        }
      }
      ws.ptr = nullptr, ws.bytes = 0;
    }
    void* p = nullptr;
    M3QKV_TRY(allocate(c, st, stream, capture, want, &p));
    ws.ptr = p;
    ws.bytes = want;
    if (!capture) st.stream_bytes += want;
  }
  if (!capture && ws.fence == nullptr)
    M3QKV_CUDA_TRY(kFn, c.event_create(&ws.fence, cudaEventDisableTiming));
  ws.last_use.store(st.workspace_tick.fetch_add(1, std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  if (!capture) M3QKV_CUDA_TRY(kFn, trim_streams(c, st, k.key, stream));
  return M3QKV_SUCCESS;
}

}  // namespace

WorkspaceLease::~WorkspaceLease() {
  // Both stream-ordered after the launch, before the lock is let go. An
  // error here has no call left to report to; the next call on the stream
  // meets a broken stream anyway.
  const Cuda& c = cuda_unresolved();
  bool failed = fence_ != nullptr && c.event_record(fence_, stream_) != cudaSuccess;
  failed = (body_ != nullptr && c.free_async(body_, stream_) != cudaSuccess) || failed;
  if (failed) (void)c.get_last_error();
}

namespace {

// stream_workspace for the stream's key `k` (already queried).
m3qkv_status workspace_of(const DeviceInfo& dev, cudaStream_t stream, const StreamKey& k, size_t bytes, void** out,
                          WorkspaceLease* lease) {
  if (dev.context == nullptr) return fail(M3QKV_ERROR_INTERNAL, "%s: DeviceInfo without a context", kFn);
  ContextState& st = *dev.context;
  const Cuda& c = cuda_unresolved();  // enter_* resolved it
  const unsigned long long gen = context_generation();
  // At most a few rounds: another thread can free this workspace only
  // between the slow path and the shared lock, and only when it is the
  // least recently used of more than the bounds allow.
  for (int round = 0; round < 8; ++round) {
    LeaseAccess::lock(lease) = std::shared_lock<std::shared_mutex>(st.workspace_mu);
    const LastWorkspace& t = t_last;
    if (t.generation == gen && t.context == st.id && t.key == k.key && t.bytes >= bytes &&
        t.epoch == st.workspace_epoch.load(std::memory_order_acquire)) {
      t.entry->last_use.store(st.workspace_tick.fetch_add(1, std::memory_order_relaxed) + 1,
                              std::memory_order_relaxed);
      LeaseAccess::hand_out(lease, stream, t.entry->fence);  // the fence is null for a capture's
      *out = t.ptr;
      return M3QKV_SUCCESS;
    }
    LeaseAccess::lock(lease).unlock();
    std::unique_lock<std::shared_mutex> excl(st.workspace_mu);
    M3QKV_TRY(prepare(c, st, stream, k, bytes));
    Workspace& ws = st.workspaces[k.key];
    t_last = LastWorkspace{gen, st.id, k.key, st.workspace_epoch.load(std::memory_order_acquire), &ws, ws.ptr,
                           ws.bytes};
  }
  return fail(M3QKV_ERROR_INTERNAL, "%s: the workspace was freed by other threads 8 times in a row", kFn);
}

}  // namespace

m3qkv_status stream_workspace(const DeviceInfo& dev, cudaStream_t stream, size_t bytes, void** out,
                              WorkspaceLease* lease) {
  StreamKey k;
  M3QKV_TRY(stream_key(cuda_unresolved(), stream, &k));
  return workspace_of(dev, stream, k, bytes, out, lease);
}

m3qkv_status launch_workspace(const DeviceInfo& dev, cudaStream_t stream, size_t body_bytes, void** head,
                              void** body, WorkspaceLease* lease) {
  const Cuda& c = cuda_unresolved();
  StreamKey k;
  M3QKV_TRY(stream_key(c, stream, &k));
  if (is_capture_key(k.key)) {
    M3QKV_TRY(workspace_of(dev, stream, k, kWorkspaceZeroBytes + body_bytes, head, lease));
    *body = static_cast<uint8_t*>(*head) + kWorkspaceZeroBytes;
    return M3QKV_SUCCESS;
  }
  M3QKV_TRY(workspace_of(dev, stream, k, kWorkspaceZeroBytes, head, lease));
  void* p = nullptr;
  M3QKV_CUDA_TRY(kFn, c.malloc_async(&p, body_bytes, stream));
  LeaseAccess::give_back_after(lease, p);
  *body = p;
  return M3QKV_SUCCESS;
}

m3qkv_status release_stream_workspace(const char* fn, const DeviceInfo& dev, cudaStream_t stream,
                                      bool refuse_capture) {
  if (dev.context == nullptr) return fail(M3QKV_ERROR_INTERNAL, "%s: DeviceInfo without a context", fn);
  ContextState& st = *dev.context;
  const Cuda& c = cuda_unresolved();
  StreamKey k;
  M3QKV_TRY(stream_key(c, stream, &k));
  if (refuse_capture && is_capture_key(k.key))
    return fail(M3QKV_ERROR_INVALID_ARGUMENT,
                "%s: stream %p is capturing a graph: its workspace cannot be freed during the capture (release it "
                "after cudaStreamEndCapture)",
                fn, static_cast<void*>(stream));
  RelaxedCaptureMode relaxed(c);
  M3QKV_CUDA_TRY(fn, relaxed.error());
  std::unique_lock<std::shared_mutex> excl(st.workspace_mu);
  cudaStream_t on = stream;  // a stream's own work is done (the caller says so)
  cudaError_t e = is_capture_key(k.key) ? zero_stream(c, st, &on) : cudaSuccess;
  if (e == cudaSuccess) e = drop(c, st, k.key, on);
  const cudaError_t e2 = is_capture_key(k.key) ? cudaSuccess : drop_dead_captures(c, st);
  if (e == cudaSuccess) e = e2;
  if (e != cudaSuccess) return cuda_fail(kFn, "cudaFreeAsync of a stream workspace", e);
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
      std::unique_lock<std::shared_mutex> excl(st->workspace_mu);
      for (auto& kv : st->workspaces) {  // cudaFree: waits for what may still run
        if (kv.second.ptr != nullptr) (void)c->free(kv.second.ptr);
        for (void* p : kv.second.outgrown) (void)c->free(p);
        if (kv.second.fence != nullptr) (void)c->event_destroy(kv.second.fence);
      }
      if (st->zero_stream != nullptr) (void)c->stream_destroy(st->zero_stream);
      st->workspaces.clear();
      st->stream_bytes = 0;
      st->workspace_epoch.fetch_add(1, std::memory_order_release);
      st->zero_stream = nullptr;
      {
        std::lock_guard<std::mutex> lock(st->dead_mu);
        st->dead_captures.clear();
      }
      CUcontext popped = nullptr;
      (void)c->ctx_pop_current(&popped);
    }
    (void)c->primary_ctx_release(d);
  }
  (void)c->get_last_error();  // nothing here is anyone's business after exit
}

namespace {
m3qkv_status check_counters(const char* fn, const splitk::Plan& plan) {
  if (plan.counter_bytes > static_cast<int64_t>(kSplitkCounterBytesMax))
    return fail(M3QKV_ERROR_INTERNAL, "%s: %lld counter bytes exceed the zeroed workspace head's %zu counter bytes", fn,
                static_cast<long long>(plan.counter_bytes), kSplitkCounterBytesMax);
  return M3QKV_SUCCESS;
}
}  // namespace

m3qkv_status splitk_workspace(const char* fn, const DeviceInfo& dev, cudaStream_t stream, const splitk::Plan& plan,
                              size_t extra_bytes, SplitkBuffers* out, void** extra, WorkspaceLease* lease) {
  *out = SplitkBuffers{};
  *extra = nullptr;
  const bool split = splitk::reduces_through_l2(plan);
  if (split) M3QKV_TRY(check_counters(fn, plan));
  const size_t partials = split ? (static_cast<size_t>(plan.partial_bytes) + kAlign - 1) / kAlign * kAlign : 0;
  void* head = nullptr;
  void* body = nullptr;
  M3QKV_TRY(launch_workspace(dev, stream, partials + extra_bytes, &head, &body, lease));
  if (split) {
    out->counters = static_cast<uint32_t*>(head);
    out->partials = static_cast<float*>(body);
  }
  *extra = static_cast<uint8_t*>(body) + partials;
  return M3QKV_SUCCESS;
}

m3qkv_status splitk_workspace(const char* fn, const DeviceInfo& dev, cudaStream_t stream, const splitk::Plan& plan,
                              SplitkBuffers* out, WorkspaceLease* lease) {
  *out = SplitkBuffers{};
  if (!splitk::reduces_through_l2(plan)) return M3QKV_SUCCESS;
  M3QKV_TRY(check_counters(fn, plan));
  void* ws = nullptr;
  M3QKV_TRY(stream_workspace(dev, stream, splitk_workspace_bytes(plan), &ws, lease));
  out->counters = static_cast<uint32_t*>(ws);
  out->partials = reinterpret_cast<float*>(static_cast<uint8_t*>(ws) + kSplitkPartialsOffset);
  return M3QKV_SUCCESS;
}

}  // namespace m3qkv::host
