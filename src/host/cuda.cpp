// The CUDA table (see cuda.h).
#include "host/cuda.h"

#include <atomic>
#include <mutex>

#include "host/context.h"
#include "host/status.h"

namespace m3qkv::host {
namespace {

// Plain functions for the runtime members whose runtime declarations carry
// default arguments or C++ overloads.
cudaError_t rt_malloc(void** p, size_t bytes) { return cudaMalloc(p, bytes); }
cudaError_t rt_memset_async(void* p, int v, size_t bytes, cudaStream_t s) { return cudaMemsetAsync(p, v, bytes, s); }
cudaError_t rt_memcpy_async(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  return cudaMemcpyAsync(dst, src, bytes, kind, s);
}
cudaError_t rt_capture_info(cudaStream_t s, cudaStreamCaptureStatus* st, unsigned long long* id, cudaGraph_t* g) {
  return cudaStreamGetCaptureInfo(s, st, id, g);
}
cudaError_t rt_malloc_async(void** p, size_t bytes, cudaStream_t s) { return cudaMallocAsync(p, bytes, s); }
cudaError_t rt_event_record(cudaEvent_t e, cudaStream_t s) { return cudaEventRecord(e, s); }
cudaError_t rt_stream_wait_event(cudaStream_t s, cudaEvent_t e, unsigned flags) {
  return cudaStreamWaitEvent(s, e, flags);
}
cudaError_t rt_user_object_release(cudaUserObject_t o, unsigned n) { return cudaUserObjectRelease(o, n); }
cudaError_t rt_graph_retain_user_object(cudaGraph_t g, cudaUserObject_t o, unsigned n, unsigned flags) {
  return cudaGraphRetainUserObject(g, o, n, flags);
}
cudaError_t rt_occupancy(int* blocks, const void* kernel, int threads, size_t smem) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, threads, smem);
}

// The real table before the driver part is resolved, and after: built
// completely, then published through g_table, so no reader sees it change.
const Cuda g_runtime_only = {
    &cudaGetLastError, &cudaGetDeviceCount, &cudaGetDevice, &cudaSetDevice, &cudaDeviceGetAttribute,
    &cudaDriverGetVersion, &cudaStreamGetId, &rt_capture_info, &rt_malloc, &cudaFree, &rt_malloc_async,
    &cudaFreeAsync, &cudaEventCreateWithFlags, &rt_event_record, &cudaEventDestroy, &rt_stream_wait_event,
    &cudaUserObjectCreate, &rt_user_object_release, &rt_graph_retain_user_object, &rt_memset_async,
    &rt_memcpy_async, &cudaStreamCreateWithFlags, &cudaStreamSynchronize, &cudaStreamDestroy,
    &cudaThreadExchangeStreamCaptureMode, &rt_occupancy,
    false, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
    nullptr,
};
Cuda g_real;
std::atomic<const Cuda*> g_real_current{&g_runtime_only};  // &g_real once resolved
std::atomic<const Cuda*> g_table{&g_runtime_only};

// One entry point of ABI version `version` (e.g. 12000 = CUDA 12.0).
m3qkv_status resolve(const char* fn, const char* symbol, int version, void** out) {
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t e = cudaGetDriverEntryPointByVersion(symbol, out, static_cast<unsigned>(version),
                                                         cudaEnableDefault, &q);
  if (e != cudaSuccess) return cuda_fail(fn, "cudaGetDriverEntryPointByVersion", e);
  if (q != cudaDriverEntryPointSuccess || *out == nullptr) {
    return fail(M3QKV_ERROR_CUDA_ERROR,
                "%s: the CUDA driver has no %s (ABI %d.%d; query result %d): the driver is older than this library "
                "needs",
                fn, symbol, version / 1000, version % 1000 / 10, static_cast<int>(q));
  }
  return M3QKV_SUCCESS;
}

template <class Pfn>
m3qkv_status resolve(const char* fn, const char* symbol, int version, Pfn* out) {
  void* p = nullptr;
  M3QKV_TRY(resolve(fn, symbol, version, &p));
  *out = reinterpret_cast<Pfn>(p);
  return M3QKV_SUCCESS;
}

m3qkv_status resolve_real(const char* fn) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (g_real_current.load(std::memory_order_acquire) == &g_real) return M3QKV_SUCCESS;
  Cuda t = g_runtime_only;
  M3QKV_TRY(resolve(fn, "cuGetErrorName", 6000, &t.get_error_name));
  M3QKV_TRY(resolve(fn, "cuCtxGetCurrent", 4000, &t.ctx_get_current));
  M3QKV_TRY(resolve(fn, "cuCtxPushCurrent", 4000, &t.ctx_push_current));
  M3QKV_TRY(resolve(fn, "cuCtxPopCurrent", 4000, &t.ctx_pop_current));
  M3QKV_TRY(resolve(fn, "cuCtxGetId", 12000, &t.ctx_get_id));
  M3QKV_TRY(resolve(fn, "cuCtxGetDevice", 2000, &t.ctx_get_device));
  M3QKV_TRY(resolve(fn, "cuStreamGetCtx", 9020, &t.stream_get_ctx));
  M3QKV_TRY(resolve(fn, "cuDevicePrimaryCtxRetain", 7000, &t.primary_ctx_retain));
  M3QKV_TRY(resolve(fn, "cuDevicePrimaryCtxRelease", 11000, &t.primary_ctx_release));
  M3QKV_TRY(resolve(fn, "cuDevicePrimaryCtxGetState", 7000, &t.primary_ctx_get_state));
  M3QKV_TRY(resolve(fn, "cuPointerGetAttributes", 7000, &t.pointer_get_attributes));
  M3QKV_TRY(resolve(fn, "cuTensorMapEncodeTiled", 12000, &t.tensor_map_encode_tiled));
  t.driver_resolved = true;
  g_real = t;
  g_real_current.store(&g_real, std::memory_order_release);
  // A fake installed meanwhile stays installed.
  const Cuda* expected = &g_runtime_only;
  g_table.compare_exchange_strong(expected, &g_real, std::memory_order_acq_rel);
  return M3QKV_SUCCESS;
}

}  // namespace

m3qkv_status cuda(const char* fn, const Cuda** out) {
  const Cuda* t = g_table.load(std::memory_order_acquire);
  if (!t->driver_resolved) {
    M3QKV_TRY(resolve_real(fn));
    t = g_table.load(std::memory_order_acquire);
  }
  *out = t;
  return M3QKV_SUCCESS;
}

RelaxedCaptureMode::RelaxedCaptureMode(const Cuda& c) : c_(c), err_(c.exchange_capture_mode(&saved_)) {}
RelaxedCaptureMode::~RelaxedCaptureMode() {
  if (err_ == cudaSuccess) (void)c_.exchange_capture_mode(&saved_);
}

const Cuda& cuda_unresolved() { return *g_table.load(std::memory_order_acquire); }

void testing_install_cuda(const Cuda* fake) {
  g_table.store(fake != nullptr ? fake : g_real_current.load(std::memory_order_acquire), std::memory_order_release);
  testing_forget_contexts();
}

}  // namespace m3qkv::host
