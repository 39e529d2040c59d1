// Every CUDA runtime and driver call the host layer makes besides the kernel
// launches and the per-backend setup (cudaFuncSetAttribute, the cluster
// occupancy query), in one table. The real table calls the runtime directly and the driver through
// entry points resolved once per process with cudaGetDriverEntryPointByVersion
// (docs/contract.md §7.4: no link-time dependency on libcuda), each with the ABI of the
// version in its type name so that a newer driver cannot hand us a different
// signature. The CPU tests install a scripted table (testing_install_cuda) to
// exercise the context, device and workspace logic without a GPU.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "m3qkv/m3qkv.h"

namespace m3qkv::host {

struct Cuda {
  // ---- runtime
  cudaError_t (*get_last_error)();
  cudaError_t (*get_device_count)(int*);
  cudaError_t (*get_device)(int*);
  cudaError_t (*set_device)(int);
  cudaError_t (*device_get_attribute)(int*, cudaDeviceAttr, int);
  cudaError_t (*driver_get_version)(int*);
  cudaError_t (*stream_get_id)(cudaStream_t, unsigned long long*);
  // cudaStreamGetCaptureInfo: the capture's status, its id (unique in the
  // process) and the graph being built.
  cudaError_t (*stream_get_capture_info)(cudaStream_t, cudaStreamCaptureStatus*, unsigned long long*, cudaGraph_t*);
  cudaError_t (*malloc)(void**, size_t);
  cudaError_t (*free)(void*);
  cudaError_t (*malloc_async)(void**, size_t, cudaStream_t);  // the device's current mempool, stream-ordered
  cudaError_t (*free_async)(void*, cudaStream_t);
  // A stream workspace's fence: recorded after each launch that uses it.
  cudaError_t (*event_create)(cudaEvent_t*, unsigned);
  cudaError_t (*event_record)(cudaEvent_t, cudaStream_t);
  cudaError_t (*event_destroy)(cudaEvent_t);
  cudaError_t (*stream_wait_event)(cudaStream_t, cudaEvent_t, unsigned);
  // A capture workspace's lifetime is its graph's (workspace.cpp): a user
  // object the graph owns, whose destructor (no CUDA calls) queues the free.
  cudaError_t (*user_object_create)(cudaUserObject_t*, void*, cudaHostFn_t, unsigned, unsigned);
  cudaError_t (*user_object_release)(cudaUserObject_t, unsigned);
  cudaError_t (*graph_retain_user_object)(cudaGraph_t, cudaUserObject_t, unsigned, unsigned);
  cudaError_t (*memset_async)(void*, int, size_t, cudaStream_t);
  cudaError_t (*memcpy_async)(void*, const void*, size_t, cudaMemcpyKind, cudaStream_t);
  cudaError_t (*stream_create_with_flags)(cudaStream_t*, unsigned);
  cudaError_t (*stream_synchronize)(cudaStream_t);
  cudaError_t (*stream_destroy)(cudaStream_t);
  cudaError_t (*exchange_capture_mode)(cudaStreamCaptureMode*);
  // cudaOccupancyMaxActiveBlocksPerMultiprocessor (host/launch.h co_resident_ctas)
  cudaError_t (*occupancy_max_active_blocks)(int*, const void*, int, size_t);
  // ---- driver (NULL until resolved)
  bool driver_resolved;
  PFN_cuGetErrorName_v6000 get_error_name;
  PFN_cuCtxGetCurrent_v4000 ctx_get_current;
  PFN_cuCtxPushCurrent_v4000 ctx_push_current;
  PFN_cuCtxPopCurrent_v4000 ctx_pop_current;
  PFN_cuCtxGetId_v12000 ctx_get_id;
  PFN_cuCtxGetDevice_v2000 ctx_get_device;  // of the current context
  PFN_cuStreamGetCtx_v9020 stream_get_ctx;
  PFN_cuDevicePrimaryCtxRetain_v7000 primary_ctx_retain;
  PFN_cuDevicePrimaryCtxRelease_v11000 primary_ctx_release;
  PFN_cuDevicePrimaryCtxGetState_v7000 primary_ctx_get_state;
  PFN_cuPointerGetAttributes_v7000 pointer_get_attributes;
  PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encode_tiled;
};

// The thread's stream-capture mode exchanged to relaxed while it lives (the
// CUDA-documented way for a library to call cudaMalloc / cudaFree while some
// stream, of this thread or another, captures in global mode), then restored.
class RelaxedCaptureMode {
 public:
  explicit RelaxedCaptureMode(const Cuda& c);
  ~RelaxedCaptureMode();
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;
  cudaError_t error() const { return err_; }  // of the exchange

 private:
  const Cuda& c_;
  cudaStreamCaptureMode saved_ = cudaStreamCaptureModeRelaxed;
  cudaError_t err_;
};

// The table in use, with its driver part resolved (a status naming the
// missing entry point otherwise; a failed resolution is retried next time).
m3qkv_status cuda(const char* fn, const Cuda** out);
// The table in use without resolving anything (the error paths use it; its
// driver members may be NULL).
const Cuda& cuda_unresolved();

// Test only: use `fake` (every member set, driver_resolved true) instead of
// the real table; NULL restores the real one. Forgets every cached device,
// context and workspace record, so the next call starts from scratch. Not
// thread-safe: call it while no other thread is inside m3qkv.
void testing_install_cuda(const Cuda* fake);

}  // namespace m3qkv::host
