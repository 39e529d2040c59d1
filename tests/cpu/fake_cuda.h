#pragma once
// A scripted CUDA runtime + driver for the CPU tests, installed into the host
// layer with m3qkv::host::testing_install_cuda (src/host/cuda.h). It models
// what the host layer relies on: device ordinals with compute capabilities,
// one primary context per device (a new id after reset_primary, as after
// cudaDeviceReset), created contexts, a per-thread context stack, streams
// that belong to a context, device allocations, and injected errors. Nothing
// here touches a real GPU. One instance per translation unit (anonymous
// namespace); FakeCudaInstall puts it in and takes it out again.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "host/cuda.h"

namespace {

struct FakeContext {
  int device;
  unsigned long long id;
};

// A buffer cuPointerGetAttributes knows (checked mode).
struct FakeAllocation {
  uintptr_t lo;
  size_t bytes;           // the allocation's range (a VMM reservation: the whole reserved range)
  size_t mapped_bytes;    // mapped prefix of the range (== bytes unless VMM)
  unsigned type;          // CU_MEMORYTYPE_DEVICE or CU_MEMORYTYPE_HOST
  int device;
  bool managed;
};

struct FakeCuda {
  std::mutex mu;
  std::vector<FakeAllocation> allocations;
  // Compute capability of each fake device ordinal.
  std::vector<std::pair<int, int>> cc = {{7, 5}, {8, 0}, {8, 6}, {9, 0}, {10, 0}, {10, 3}, {12, 0}};
  // Context handles are indices + 1 into `contexts` (0 = no context).
  std::vector<FakeContext> contexts;
  std::map<int, size_t> primary;           // device -> its primary context handle
  std::map<cudaStream_t, size_t> streams;  // stream -> context handle
  unsigned long long next_id = 100;
  uintptr_t next_alloc = uintptr_t{1} << 40;
  int default_device = 0;  // the runtime's device of a thread that never set one

  // Injected errors.
  cudaError_t get_device_err = cudaSuccess;
  cudaError_t get_count_err = cudaSuccess;
  cudaError_t set_device_err = cudaSuccess;
  cudaError_t malloc_err = cudaSuccess;
  CUresult ctx_get_current_err = CUDA_SUCCESS;
  int attr_fail_device = -1;  // cudaDeviceGetAttribute fails for this ordinal
  int driver_version = 13000;

  // Counters and logs.
  std::atomic<int> calls{0};  // every call into the table
  std::atomic<int> attr_calls{0};
  std::atomic<int> get_last_error_calls{0};
  std::atomic<int> encodes{0};
  std::vector<int> set_device_log;
  std::vector<int> retain_log;
  std::vector<int> release_log;  // cuDevicePrimaryCtxRelease's devices
  std::vector<std::pair<void*, size_t>> mallocs;
  std::vector<std::pair<void*, size_t>> memsets;
  std::vector<cudaStream_t> memset_streams;  // the stream of each memsets entry
  std::vector<cudaStream_t> synchronized;    // each cudaStreamSynchronize's stream
  std::vector<void*> frees;
  // Host memory behind each live allocation of f_malloc (allocated on first
  // touch by memcpy / memset), so the host layer's copies have somewhere to
  // go; host_ptr() translates a fake device address for a test.
  std::map<uintptr_t, std::vector<uint8_t>> backing;
  int memcpys = 0;
  cudaError_t memcpy_err = cudaSuccess;
  // A fake device address inside a live allocation of f_malloc -> host memory
  // (nullptr when it is none or [p, p + bytes) leaves it). Lock held by the caller.
  uint8_t* host_ptr_locked(const void* p, size_t bytes) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    for (const auto& m : mallocs) {
      const uintptr_t lo = reinterpret_cast<uintptr_t>(m.first);
      if (a < lo || a + bytes > lo + m.second) continue;
      if (std::find(frees.begin(), frees.end(), m.first) != frees.end()) continue;  // freed
      std::vector<uint8_t>& b = backing[lo];
      if (b.size() != m.second) b.assign(m.second, 0xEE);  // not zero: cudaMalloc memory is not zeroed
      return b.data() + (a - lo);
    }
    return nullptr;
  }
  uint8_t* host_ptr(const void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu);
    return host_ptr_locked(p, bytes);
  }
  // The occupancy model (f_occupancy_max_active_blocks).
  size_t occupancy_smem_per_sm = 228 << 10;
  int occupancy_blocks = -1;
  cudaError_t occupancy_err = cudaSuccess;
  std::atomic<int> occupancy_calls{0};
  // Streams cudaStreamGetCaptureInfo reports as capturing, and the id of
  // each one's capture (fake_begin_capture: a new id per capture).
  std::map<cudaStream_t, unsigned long long> capturing;
  unsigned long long next_capture_id = 7000;
  // User objects retained by captured graphs (the workspace's lifetime): the
  // destructor and its argument; fake_destroy_graphs runs and clears them.
  std::vector<std::pair<cudaHostFn_t, void*>> user_objects;
  std::vector<std::pair<void*, cudaStream_t>> async_mallocs, async_frees;
  int events_created = 0, events_destroyed = 0;
  std::vector<std::pair<cudaEvent_t, cudaStream_t>> event_records;
  std::vector<std::pair<cudaStream_t, cudaEvent_t>> event_waits;
  std::vector<cudaStreamCaptureMode> capture_modes;  // modes passed to exchange_capture_mode
  int streams_created = 0;
  int streams_destroyed = 0;

  size_t new_context(int device) {
    contexts.push_back(FakeContext{device, next_id++});
    return contexts.size();
  }
  size_t primary_of(int device) {
    auto it = primary.find(device);
    if (it == primary.end()) it = primary.emplace(device, new_context(device)).first;
    return it->second;
  }
  // As cudaDeviceReset: the primary context is re-created with a new id.
  void reset_primary(int device) {
    std::lock_guard<std::mutex> lock(mu);
    contexts[primary_of(device) - 1].id = next_id++;
  }
  cudaStream_t new_stream(size_t ctx) {
    std::lock_guard<std::mutex> lock(mu);
    const auto s = reinterpret_cast<cudaStream_t>(uintptr_t{0x5000} + 16 * streams.size());
    streams[s] = ctx;
    return s;
  }
};

FakeCuda& fake_cuda() {
  static FakeCuda f;
  return f;
}

// The calling thread's context stack (the top is current).
thread_local std::vector<size_t> t_ctx_stack;
thread_local int t_runtime_device = -1;  // set by set_device

CUcontext handle(size_t c) { return reinterpret_cast<CUcontext>(c); }
size_t index_of(CUcontext c) { return reinterpret_cast<size_t>(c); }
size_t current_ctx() { return t_ctx_stack.empty() ? 0 : t_ctx_stack.back(); }

// Makes device d's primary context the calling thread's only context.
void fake_set_current_device(int d) {
  std::lock_guard<std::mutex> lock(fake_cuda().mu);
  t_ctx_stack.assign(1, fake_cuda().primary_of(d));
  t_runtime_device = d;
}

cudaError_t f_get_last_error() {
  fake_cuda().calls++;
  fake_cuda().get_last_error_calls++;
  return cudaSuccess;
}
cudaError_t f_get_device_count(int* n) {
  auto& f = fake_cuda();
  f.calls++;
  if (f.get_count_err != cudaSuccess) return f.get_count_err;
  *n = static_cast<int>(f.cc.size());
  return cudaSuccess;
}
cudaError_t f_get_device(int* d) {
  auto& f = fake_cuda();
  f.calls++;
  if (f.get_device_err != cudaSuccess) return f.get_device_err;
  std::lock_guard<std::mutex> lock(f.mu);
  const size_t c = current_ctx();
  *d = c ? f.contexts[c - 1].device : (t_runtime_device >= 0 ? t_runtime_device : f.default_device);
  return cudaSuccess;
}
cudaError_t f_set_device(int d) {
  auto& f = fake_cuda();
  f.calls++;
  if (f.set_device_err != cudaSuccess) return f.set_device_err;
  std::lock_guard<std::mutex> lock(f.mu);
  f.set_device_log.push_back(d);
  t_runtime_device = d;
  const size_t p = f.primary_of(d);
  if (t_ctx_stack.empty()) t_ctx_stack.push_back(p);
  else t_ctx_stack.back() = p;
  return cudaSuccess;
}
cudaError_t f_device_get_attribute(int* v, cudaDeviceAttr attr, int d) {
  auto& f = fake_cuda();
  f.calls++;
  f.attr_calls++;
  if (d == f.attr_fail_device) return cudaErrorInvalidValue;
  if (d < 0 || d >= static_cast<int>(f.cc.size())) return cudaErrorInvalidDevice;
  switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *v = f.cc[static_cast<size_t>(d)].first; break;
    case cudaDevAttrComputeCapabilityMinor: *v = f.cc[static_cast<size_t>(d)].second; break;
    case cudaDevAttrMultiProcessorCount: *v = 100 + d; break;
    case cudaDevAttrL2CacheSize: *v = (1 << 20) * (d + 1); break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = 1000 * (d + 1); break;
    default: *v = 0; break;
  }
  return cudaSuccess;
}
cudaError_t f_driver_get_version(int* v) {
  fake_cuda().calls++;
  *v = fake_cuda().driver_version;
  return cudaSuccess;
}
cudaError_t f_stream_get_id(cudaStream_t s, unsigned long long* id) {
  fake_cuda().calls++;
  // Default streams: one per context (NULL and legacy alike), per thread for per-thread.
  if (s == nullptr || s == cudaStreamLegacy) *id = 1000000 + current_ctx();
  else if (s == cudaStreamPerThread) *id = 2000000 + reinterpret_cast<uintptr_t>(&t_ctx_stack) % 1000000;
  else *id = reinterpret_cast<uintptr_t>(s);
  return cudaSuccess;
}
cudaError_t f_malloc(void** p, size_t bytes) {
  auto& f = fake_cuda();
  f.calls++;
  if (f.malloc_err != cudaSuccess) return f.malloc_err;
  std::lock_guard<std::mutex> lock(f.mu);
  *p = reinterpret_cast<void*>(f.next_alloc);
  f.next_alloc += (bytes + 0xFFFF) / 0x10000 * 0x10000;
  f.mallocs.emplace_back(*p, bytes);
  return cudaSuccess;
}
cudaError_t f_memset_async(void* p, int v, size_t bytes, cudaStream_t s) {
  auto& f = fake_cuda();
  f.calls++;
  std::lock_guard<std::mutex> lock(f.mu);
  f.memsets.emplace_back(p, bytes);
  f.memset_streams.push_back(s);
  if (uint8_t* h = f.host_ptr_locked(p, bytes)) std::memset(h, v, bytes);
  return cudaSuccess;
}
// Copies between host memory and fake allocations (an address outside a
// live allocation is cudaErrorInvalidValue, as a stray pointer would be).
cudaError_t f_memcpy_async(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  auto& f = fake_cuda();
  f.calls++;
  std::lock_guard<std::mutex> lock(f.mu);
  f.memcpys++;
  if (f.memcpy_err != cudaSuccess) return f.memcpy_err;
  if (bytes == 0) return cudaSuccess;
  uint8_t* d = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice ? f.host_ptr_locked(dst, bytes)
                                                                                    : static_cast<uint8_t*>(dst);
  const uint8_t* sp = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice
                          ? f.host_ptr_locked(src, bytes)
                          : static_cast<const uint8_t*>(src);
  if (kind == cudaMemcpyHostToHost || kind == cudaMemcpyDefault || d == nullptr || sp == nullptr)
    return cudaErrorInvalidValue;
  std::memmove(d, sp, bytes);
  return cudaSuccess;
}
cudaError_t f_stream_create_with_flags(cudaStream_t* s, unsigned) {
  fake_cuda().calls++;
  *s = fake_cuda().new_stream(current_ctx());
  std::lock_guard<std::mutex> lock(fake_cuda().mu);
  fake_cuda().streams_created++;
  return cudaSuccess;
}
cudaError_t f_stream_synchronize(cudaStream_t s) {
  fake_cuda().calls++;
  std::lock_guard<std::mutex> lock(fake_cuda().mu);
  fake_cuda().synchronized.push_back(s);
  return cudaSuccess;
}
thread_local cudaStreamCaptureMode t_capture_mode = cudaStreamCaptureModeGlobal;
cudaError_t f_exchange_capture_mode(cudaStreamCaptureMode* mode) {
  fake_cuda().calls++;
  {
    std::lock_guard<std::mutex> lock(fake_cuda().mu);
    fake_cuda().capture_modes.push_back(*mode);
  }
  std::swap(*mode, t_capture_mode);
  return cudaSuccess;
}

CUresult f_get_error_name(CUresult, const char** s) {
  *s = "CUDA_ERROR_FAKE";
  return CUDA_SUCCESS;
}
CUresult f_ctx_get_current(CUcontext* c) {
  auto& f = fake_cuda();
  f.calls++;
  if (f.ctx_get_current_err != CUDA_SUCCESS) return f.ctx_get_current_err;
  *c = handle(current_ctx());
  return CUDA_SUCCESS;
}
CUresult f_ctx_push_current(CUcontext c) {
  fake_cuda().calls++;
  t_ctx_stack.push_back(index_of(c));
  return CUDA_SUCCESS;
}
CUresult f_ctx_pop_current(CUcontext* c) {
  fake_cuda().calls++;
  if (t_ctx_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  *c = handle(t_ctx_stack.back());
  t_ctx_stack.pop_back();
  return CUDA_SUCCESS;
}
CUresult f_ctx_get_id(CUcontext c, unsigned long long* id) {
  auto& f = fake_cuda();
  f.calls++;
  std::lock_guard<std::mutex> lock(f.mu);
  const size_t i = index_of(c);
  if (i == 0 || i > f.contexts.size()) return CUDA_ERROR_INVALID_CONTEXT;
  *id = f.contexts[i - 1].id;
  return CUDA_SUCCESS;
}
CUresult f_ctx_get_device(CUdevice* d) {
  auto& f = fake_cuda();
  f.calls++;
  std::lock_guard<std::mutex> lock(f.mu);
  const size_t c = current_ctx();
  if (c == 0) return CUDA_ERROR_INVALID_CONTEXT;
  *d = f.contexts[c - 1].device;
  return CUDA_SUCCESS;
}
CUresult f_stream_get_ctx(CUstream s, CUcontext* c) {
  auto& f = fake_cuda();
  f.calls++;
  std::lock_guard<std::mutex> lock(f.mu);
  const auto it = f.streams.find(reinterpret_cast<cudaStream_t>(s));
  // A stream the test did not make belongs to the current context.
  *c = handle(it != f.streams.end() ? it->second : current_ctx());
  return CUDA_SUCCESS;
}
CUresult f_primary_ctx_retain(CUcontext* c, CUdevice d) {
  auto& f = fake_cuda();
  f.calls++;
  std::lock_guard<std::mutex> lock(f.mu);
  f.retain_log.push_back(d);
  *c = handle(f.primary_of(d));
  return CUDA_SUCCESS;
}
CUresult f_pointer_get_attributes(unsigned n, CUpointer_attribute* attrs, void** data, CUdeviceptr ptr) {
  auto& f = fake_cuda();
  f.calls++;
  std::lock_guard<std::mutex> lock(f.mu);
  const FakeAllocation* a = nullptr;
  for (const FakeAllocation& x : f.allocations)
    if (ptr >= x.lo && ptr < x.lo + x.bytes) a = &x;
  for (unsigned i = 0; i < n; ++i) {
    switch (attrs[i]) {  // unknown pointers: every attribute 0, CUDA_SUCCESS (as the driver documents)
      case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *static_cast<unsigned*>(data[i]) = a ? a->type : 0; break;
      case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *static_cast<int*>(data[i]) = a ? a->device : 0; break;
      case CU_POINTER_ATTRIBUTE_IS_MANAGED: *static_cast<int*>(data[i]) = a && a->managed; break;
      case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *static_cast<CUdeviceptr*>(data[i]) = a ? a->lo : 0; break;
      case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *static_cast<size_t*>(data[i]) = a ? a->bytes : 0; break;
      case CU_POINTER_ATTRIBUTE_MAPPED: *static_cast<int*>(data[i]) = a && ptr < a->lo + a->mapped_bytes; break;
      default: return CUDA_ERROR_INVALID_VALUE;
    }
  }
  return CUDA_SUCCESS;
}
// Writes the base address and the dims into the map, so a test can tell maps apart.
CUresult f_tensor_map_encode_tiled(CUtensorMap* m, CUtensorMapDataType, cuuint32_t, void* base, const cuuint64_t* dims,
                                   const cuuint64_t*, const cuuint32_t* box, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  fake_cuda().calls++;
  fake_cuda().encodes++;
  std::memset(m, 0, sizeof(*m));
  const uint64_t words[4] = {reinterpret_cast<uintptr_t>(base), dims[0], dims[1], (uint64_t{box[0]} << 32) | box[1]};
  std::memcpy(m, words, sizeof(words));
  return CUDA_SUCCESS;
}

cudaError_t f_stream_get_capture_info(cudaStream_t s, cudaStreamCaptureStatus* st, unsigned long long* id,
                                      cudaGraph_t* graph) {
  auto& f = fake_cuda();
  f.calls++;
  std::lock_guard<std::mutex> lock(f.mu);
  const auto it = f.capturing.find(s);
  *st = it != f.capturing.end() ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  if (id != nullptr) *id = it != f.capturing.end() ? it->second : 0;
  if (graph != nullptr) *graph = it != f.capturing.end() ? reinterpret_cast<cudaGraph_t>(it->second) : nullptr;
  return cudaSuccess;
}
// Starts a capture on `s` (a new capture id), as cudaStreamBeginCapture.
inline void fake_begin_capture(cudaStream_t s) {
  auto& f = fake_cuda();
  std::lock_guard<std::mutex> lock(f.mu);
  f.capturing[s] = f.next_capture_id++;
}
cudaError_t f_malloc_async(void** p, size_t bytes, cudaStream_t s) {
  const cudaError_t e = f_malloc(p, bytes);
  if (e == cudaSuccess) {
    std::lock_guard<std::mutex> lock(fake_cuda().mu);
    fake_cuda().async_mallocs.emplace_back(*p, s);
  }
  return e;
}
cudaError_t f_free_async(void* p, cudaStream_t s) {
  auto& f = fake_cuda();
  f.calls++;
  std::lock_guard<std::mutex> lock(f.mu);
  f.async_frees.emplace_back(p, s);
  f.frees.push_back(p);
  return cudaSuccess;
}
cudaError_t f_event_create(cudaEvent_t* e, unsigned) {
  auto& f = fake_cuda();
  f.calls++;
  std::lock_guard<std::mutex> lock(f.mu);
  *e = reinterpret_cast<cudaEvent_t>(uintptr_t{0xE0000} + 16 * ++f.events_created);
  return cudaSuccess;
}
cudaError_t f_event_record(cudaEvent_t e, cudaStream_t s) {
  auto& f = fake_cuda();
  f.calls++;
  std::lock_guard<std::mutex> lock(f.mu);
  f.event_records.emplace_back(e, s);
  return cudaSuccess;
}
cudaError_t f_event_destroy(cudaEvent_t) {
  auto& f = fake_cuda();
  f.calls++;
  std::lock_guard<std::mutex> lock(f.mu);
  f.events_destroyed++;
  return cudaSuccess;
}
cudaError_t f_stream_wait_event(cudaStream_t s, cudaEvent_t e, unsigned) {
  auto& f = fake_cuda();
  f.calls++;
  std::lock_guard<std::mutex> lock(f.mu);
  f.event_waits.emplace_back(s, e);
  return cudaSuccess;
}
cudaError_t f_user_object_create(cudaUserObject_t* o, void* ptr, cudaHostFn_t destroy, unsigned refs, unsigned) {
  auto& f = fake_cuda();
  f.calls++;
  if (refs != 1) return cudaErrorInvalidValue;
  std::lock_guard<std::mutex> lock(f.mu);
  f.user_objects.emplace_back(destroy, ptr);
  *o = reinterpret_cast<cudaUserObject_t>(f.user_objects.size());
  return cudaSuccess;
}
cudaError_t f_user_object_release(cudaUserObject_t, unsigned) {
  fake_cuda().calls++;
  return cudaSuccess;
}
cudaError_t f_graph_retain_user_object(cudaGraph_t g, cudaUserObject_t, unsigned, unsigned flags) {
  fake_cuda().calls++;
  return g != nullptr && flags == cudaGraphUserObjectMove ? cudaSuccess : cudaErrorInvalidValue;
}
// Destroys every captured graph: runs the user objects' destructors.
inline void fake_destroy_graphs() {
  std::vector<std::pair<cudaHostFn_t, void*>> objs;
  {
    std::lock_guard<std::mutex> lock(fake_cuda().mu);
    objs.swap(fake_cuda().user_objects);
  }
  for (const auto& o : objs) o.first(o.second);
}
cudaError_t f_free(void* p) {
  auto& f = fake_cuda();
  f.calls++;
  std::lock_guard<std::mutex> lock(f.mu);
  f.frees.push_back(p);
  return cudaSuccess;
}
cudaError_t f_stream_destroy(cudaStream_t) {
  fake_cuda().calls++;
  std::lock_guard<std::mutex> lock(fake_cuda().mu);
  fake_cuda().streams_destroyed++;
  return cudaSuccess;
}
CUresult f_primary_ctx_release(CUdevice d) {
  fake_cuda().calls++;
  {
    std::lock_guard<std::mutex> lock(fake_cuda().mu);
    fake_cuda().release_log.push_back(d);
  }
  return CUDA_SUCCESS;
}
CUresult f_primary_ctx_get_state(CUdevice d, unsigned* flags, int* active) {
  auto& f = fake_cuda();
  f.calls++;
  std::lock_guard<std::mutex> lock(f.mu);
  *flags = 0;
  *active = f.primary.count(d) ? 1 : 0;
  return CUDA_SUCCESS;
}

// cudaOccupancyMaxActiveBlocksPerMultiprocessor, one model for every device
// and kernel: CTAs of `threads` threads and `smem` bytes, resident per SM up
// to 2048 threads, occupancy_smem_per_sm bytes and 32 CTAs (occupancy_blocks
// >= 0 overrides the model, occupancy_err fails the query).
cudaError_t f_occupancy_max_active_blocks(int* blocks, const void* kernel, int threads, size_t smem) {
  auto& f = fake_cuda();
  f.calls++;
  f.occupancy_calls++;
  if (kernel == nullptr || threads <= 0 || threads > 1024) return cudaErrorInvalidValue;
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.occupancy_err != cudaSuccess) return f.occupancy_err;
  if (f.occupancy_blocks >= 0) {
    *blocks = f.occupancy_blocks;
    return cudaSuccess;
  }
  size_t n = std::min<size_t>(32, 2048 / static_cast<size_t>(threads));
  if (smem > 0) n = std::min(n, f.occupancy_smem_per_sm / smem);
  *blocks = static_cast<int>(n);
  return cudaSuccess;
}

m3qkv::host::Cuda make_fake_table() {
  m3qkv::host::Cuda t{};
  t.get_last_error = &f_get_last_error;
  t.get_device_count = &f_get_device_count;
  t.get_device = &f_get_device;
  t.set_device = &f_set_device;
  t.device_get_attribute = &f_device_get_attribute;
  t.driver_get_version = &f_driver_get_version;
  t.stream_get_id = &f_stream_get_id;
  t.stream_get_capture_info = &f_stream_get_capture_info;
  t.malloc = &f_malloc;
  t.free = &f_free;
  t.malloc_async = &f_malloc_async;
  t.free_async = &f_free_async;
  t.event_create = &f_event_create;
  t.event_record = &f_event_record;
  t.event_destroy = &f_event_destroy;
  t.stream_wait_event = &f_stream_wait_event;
  t.user_object_create = &f_user_object_create;
  t.user_object_release = &f_user_object_release;
  t.graph_retain_user_object = &f_graph_retain_user_object;
  t.memset_async = &f_memset_async;
  t.memcpy_async = &f_memcpy_async;
  t.stream_create_with_flags = &f_stream_create_with_flags;
  t.stream_synchronize = &f_stream_synchronize;
  t.stream_destroy = &f_stream_destroy;
  t.exchange_capture_mode = &f_exchange_capture_mode;
  t.occupancy_max_active_blocks = &f_occupancy_max_active_blocks;
  t.driver_resolved = true;
  t.get_error_name = &f_get_error_name;
  t.ctx_get_current = &f_ctx_get_current;
  t.ctx_push_current = &f_ctx_push_current;
  t.ctx_pop_current = &f_ctx_pop_current;
  t.ctx_get_id = &f_ctx_get_id;
  t.ctx_get_device = &f_ctx_get_device;
  t.stream_get_ctx = &f_stream_get_ctx;
  t.primary_ctx_retain = &f_primary_ctx_retain;
  t.primary_ctx_release = &f_primary_ctx_release;
  t.primary_ctx_get_state = &f_primary_ctx_get_state;
  t.pointer_get_attributes = &f_pointer_get_attributes;
  t.tensor_map_encode_tiled = &f_tensor_map_encode_tiled;
  return t;
}
const m3qkv::host::Cuda& fake_table() {
  static const m3qkv::host::Cuda t = make_fake_table();
  return t;
}

// Resets the script to its defaults (the calling thread gets device 1's
// primary context, like a caller that ran cudaSetDevice(1)) and installs it;
// the destructor puts the real CUDA back.
void reset_fake_cuda() {
  auto& f = fake_cuda();
  {
    std::lock_guard<std::mutex> lock(f.mu);
    f.get_device_err = cudaSuccess;
    f.get_count_err = cudaSuccess;
    f.set_device_err = cudaSuccess;
    f.malloc_err = cudaSuccess;
    f.ctx_get_current_err = CUDA_SUCCESS;
    f.attr_fail_device = -1;
    f.driver_version = 13000;
    f.set_device_log.clear();
    f.retain_log.clear();
    f.release_log.clear();
    f.mallocs.clear();
    f.memsets.clear();
    f.memset_streams.clear();
    f.synchronized.clear();
    f.frees.clear();
    f.backing.clear();
    f.memcpys = 0;
    f.memcpy_err = cudaSuccess;
    f.capturing.clear();
    f.user_objects.clear();
    f.async_mallocs.clear();
    f.async_frees.clear();
    f.events_created = f.events_destroyed = 0;
    f.event_records.clear();
    f.event_waits.clear();
    f.allocations.clear();
    f.capture_modes.clear();
    f.occupancy_smem_per_sm = 228 << 10;
    f.occupancy_blocks = -1;
    f.occupancy_err = cudaSuccess;
    f.streams_created = 0;
    f.streams_destroyed = 0;
  }
  t_ctx_stack.clear();
  t_runtime_device = -1;
  fake_set_current_device(1);
}

struct FakeCudaInstall {
  FakeCudaInstall() {
    reset_fake_cuda();
    m3qkv::host::testing_install_cuda(&fake_table());
  }
  ~FakeCudaInstall() {
    m3qkv::host::testing_install_cuda(nullptr);
    t_ctx_stack.clear();
  }
  FakeCudaInstall(const FakeCudaInstall&) = delete;
  FakeCudaInstall& operator=(const FakeCudaInstall&) = delete;
};

}  // namespace
