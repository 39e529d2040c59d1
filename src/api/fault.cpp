// Test-only fault injection (see fault.h).
#include "api/fault.h"

#include <atomic>
#include <mutex>

#include "host/cuda.h"
#include "host/status.h"

namespace m3qkv::api {
namespace {

struct Fault {
  m3qkv_backend_kind backend = M3QKV_BACKEND_NONE;
  FaultOutput output = FaultOutput::kNone;
  int64_t offset = 0;
  uint8_t mask = 0;
};
std::mutex g_mu;
Fault g_fault;                                                    // under g_mu
std::atomic<int> g_armed_backend{static_cast<int>(M3QKV_BACKEND_NONE)};  // the fast check

}  // namespace

void set_fault(m3qkv_backend_kind backend, FaultOutput output, int64_t offset, uint8_t mask) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_fault = Fault{backend, output, offset, mask};
  g_armed_backend.store(static_cast<int>(backend), std::memory_order_relaxed);
}

m3qkv_status apply_fault(const char* fn, m3qkv_backend_kind backend, const m3qkv_fused_args& a, cudaStream_t stream) {
  if (g_armed_backend.load(std::memory_order_relaxed) != static_cast<int>(backend) || backend == M3QKV_BACKEND_NONE)
    return M3QKV_SUCCESS;
  Fault f;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    f = g_fault;
  }
  if (f.backend != backend) return M3QKV_SUCCESS;
  const int64_t q_elems = a.m * a.nq * M3QKV_HEAD_DIM;
  uint8_t* base = nullptr;
  int64_t bytes = 0;
  switch (f.output) {
    case FaultOutput::kQOut: base = static_cast<uint8_t*>(a.q_out), bytes = 2 * q_elems; break;
    case FaultOutput::kQFp8Out: base = static_cast<uint8_t*>(a.q_fp8_out), bytes = q_elems; break;
    case FaultOutput::kIndexQOut: base = static_cast<uint8_t*>(a.index_q_out), bytes = a.m * a.niq * M3QKV_HEAD_DIM; break;
    case FaultOutput::kNone: break;
  }
  if (base == nullptr || f.offset < 0 || f.offset >= bytes) return M3QKV_SUCCESS;
  const host::Cuda& c = host::cuda_unresolved();  // the call resolved it
  uint8_t byte = 0;
  M3QKV_CUDA_TRY(fn, c.memcpy_async(&byte, base + f.offset, 1, cudaMemcpyDeviceToHost, stream));
  M3QKV_CUDA_TRY(fn, c.stream_synchronize(stream));
  byte = static_cast<uint8_t>(byte ^ f.mask);
  M3QKV_CUDA_TRY(fn, c.memcpy_async(base + f.offset, &byte, 1, cudaMemcpyHostToDevice, stream));
  M3QKV_CUDA_TRY(fn, c.stream_synchronize(stream));  // `byte` lives on this stack
  return M3QKV_SUCCESS;
}

}  // namespace m3qkv::api
