// Driver entry points (see driver.h).
#include "host/driver.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <mutex>

#include "host/status.h"

namespace m3qkv::host {
namespace {

std::atomic<const Driver*> g_driver{nullptr};

// One entry point of ABI version `version` (e.g. 12000 = CUDA 12.0).
m3qkv_status resolve(const char* fn, const char* symbol, int version, void** out) {
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t e = cudaGetDriverEntryPointByVersion(symbol, out, static_cast<unsigned>(version),
                                                         cudaEnableDefault, &q);
  if (e != cudaSuccess) return cuda_fail(fn, "cudaGetDriverEntryPointByVersion", e);
  if (q != cudaDriverEntryPointSuccess || *out == nullptr) {
    return fail(M3QKV_ERROR_CUDA_ERROR, "%s: the CUDA driver has no %s (ABI %d.%d; query result %d): the driver is "
                "older than this library needs", fn, symbol, version / 1000, version % 1000 / 10, static_cast<int>(q));
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

}  // namespace

m3qkv_status driver(const char* fn, const Driver** out) {
  const Driver* d = g_driver.load(std::memory_order_acquire);
  if (d == nullptr) {
    static std::mutex mu;
    static Driver table;
    std::lock_guard<std::mutex> lock(mu);
    d = g_driver.load(std::memory_order_acquire);
    if (d == nullptr) {
      Driver t{};
      M3QKV_TRY(resolve(fn, "cuGetErrorName", 6000, &t.get_error_name));
      M3QKV_TRY(resolve(fn, "cuTensorMapEncodeTiled", 12000, &t.tensor_map_encode_tiled));
      table = t;
      d = &table;
      g_driver.store(d, std::memory_order_release);
    }
  }
  *out = d;
  return M3QKV_SUCCESS;
}

const Driver* driver_if_resolved() { return g_driver.load(std::memory_order_acquire); }

}  // namespace m3qkv::host
