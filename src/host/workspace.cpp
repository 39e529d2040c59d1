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

// cudaMalloc of `bytes` with the capture mode relaxed, then the zeroing.
m3qkv_status allocate(const Cuda& c, ContextState& st, size_t bytes, void** out) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  M3QKV_CUDA_TRY(kFn, c.exchange_capture_mode(&mode));
  void* p = nullptr;
  cudaError_t e = c.malloc(&p, bytes);
  if (e == cudaSuccess && st.zero_stream == nullptr) {
    e = c.stream_create_with_flags(&st.zero_stream, cudaStreamNonBlocking);
  }
  const size_t zero = bytes < kWorkspaceZeroBytes ? bytes : kWorkspaceZeroBytes;
  if (e == cudaSuccess) e = c.memset_async(p, 0, zero, st.zero_stream);
  if (e == cudaSuccess) e = c.stream_synchronize(st.zero_stream);
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
  unsigned long long sid = 0;
  M3QKV_CUDA_TRY(kFn, c.stream_get_id(stream, &sid));
  const unsigned long long gen = context_generation();
  if (t_last.generation == gen && t_last.context == st.id && t_last.stream == sid && t_last.ws.bytes >= bytes) {
    *out = t_last.ws.ptr;
    return M3QKV_SUCCESS;
  }
  std::lock_guard<std::mutex> lock(st.workspace_mu);
  Workspace& ws = st.workspaces[sid];
  if (ws.bytes < bytes) {
    size_t want = bytes > 2 * ws.bytes ? bytes : 2 * ws.bytes;
    want = (want + kAlign - 1) / kAlign * kAlign;
    void* p = nullptr;
    M3QKV_TRY(allocate(c, st, want, &p));
    if (ws.ptr != nullptr) st.retired.push_back(ws.ptr);
    ws = Workspace{p, want};
  }
  t_last = LastWorkspace{gen, st.id, sid, ws};
  *out = ws.ptr;
  return M3QKV_SUCCESS;
}

}  // namespace m3qkv::host
