// Host launchers of the portable backend (CC >= 8.0). Arguments arrive
// validated with m > 0 (api.cpp). Every launch goes through
// cudaLaunchKernelEx; with use_pdl the programmatic-stream-serialization
// attribute is set on CC >= 9.0 (the kernels call griddepcontrol.wait before
// reading any input). `grid` (fused, gemm, insert): the kernels loop over
// their work items with a grid stride, so any grid >= 1 is correct; 0 = one
// CTA per tile (fused, gemm) or enough CTAs for one (8-row group, head) item
// per warp (insert).
#include <atomic>
#include <climits>
#include <cstdio>

#include "api/internal.h"
#include "portable/kernels.cuh"
#include "portable/mainloop.cuh"

namespace m3qkv {
namespace {

using portable::kSmemBytes;

// cudaFuncSetAttribute is per device: done once per device (warmup or first use).
constexpr int kMaxDevices = 64;
std::atomic<bool> g_smem_attr_set[kMaxDevices];

m3qkv_status cuda_fail(const char* what, cudaError_t e) {
  return fail(M3QKV_ERROR_CUDA_ERROR, "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

m3qkv_status ensure_smem_attributes(const DeviceInfo& dev) {
  if (dev.max_smem_optin < kSmemBytes)
    return fail(M3QKV_ERROR_UNSUPPORTED_DEVICE,
                "portable kernels need %d bytes of shared memory per block, device %d allows %d", kSmemBytes,
                dev.device, dev.max_smem_optin);
  const bool cacheable = dev.device >= 0 && dev.device < kMaxDevices;
  if (cacheable && g_smem_attr_set[dev.device].load(std::memory_order_acquire)) return M3QKV_SUCCESS;
  cudaError_t e = cudaFuncSetAttribute(m3qkv_portable_fused_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       kSmemBytes);
  if (e != cudaSuccess) return cuda_fail("cudaFuncSetAttribute(m3qkv_portable_fused_kernel)", e);
  e = cudaFuncSetAttribute(m3qkv_portable_gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (e != cudaSuccess) return cuda_fail("cudaFuncSetAttribute(m3qkv_portable_gemm_kernel)", e);
  if (cacheable) g_smem_attr_set[dev.device].store(true, std::memory_order_release);
  return M3QKV_SUCCESS;
}

// Grid for `items` work items of `per_block` each, or the caller's override.
unsigned grid_for(int64_t items, int64_t per_block, int32_t override_grid) {
  if (override_grid > 0) return static_cast<unsigned>(override_grid);
  const int64_t g = (items + per_block - 1) / per_block;
  return static_cast<unsigned>(g < 1 ? 1 : (g > INT_MAX ? INT_MAX : g));
}

template <class Params>
m3qkv_status launch(const char* name, void (*kernel)(Params), unsigned grid, int block, int smem, bool pdl,
                    const DeviceInfo& dev, cudaStream_t s, const Params& p) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid, 1, 1);
  cfg.blockDim = dim3(static_cast<unsigned>(block), 1, 1);
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  if (pdl && dev.cc_major >= 9) {  // PDL exists from CC 9.0
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  // The launch's own status only: cudaGetLastError() here could report (and
  // clear) an earlier, unrelated error of the caller's thread.
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, p);
  if (e != cudaSuccess) {
    char what[128];
    snprintf(what, sizeof what, "cudaLaunchKernelEx(%s, grid %u)", name, grid);
    return cuda_fail(what, e);
  }
  return M3QKV_SUCCESS;
}

portable::GemmOperands operands(const void* xq, const void* xsf, const void* wq, const void* wsf, int64_t m,
                                int64_t n, int64_t k) {
  portable::GemmOperands g;
  g.xq = static_cast<const uint8_t*>(xq);
  g.xsf = static_cast<const uint8_t*>(xsf);
  g.wq = static_cast<const uint8_t*>(wq);
  g.wsf = static_cast<const uint8_t*>(wsf);
  g.m = m;
  g.n = n;
  g.k = k;
  return g;
}

}  // namespace

m3qkv_status portable_fused(const m3qkv_fused_args& a, const DeviceInfo& dev, float* acc_tap, cudaStream_t s) {
  m3qkv_status st = ensure_smem_attributes(dev);
  if (st != M3QKV_SUCCESS) return st;
  const int64_t n = static_cast<int64_t>(total_heads(a.nq, a.nkv, a.niq, a.nik)) * kHeadDim;
  portable::FusedParams p;
  p.g = operands(a.xq, a.xsf, a.wq, a.wsf, a.m, n, a.k);
  p.e = epi::make_epilogue_params(a);
  p.acc_tap = acc_tap;
  const int64_t tiles = (n / portable::kBN) * ((a.m + portable::kBM - 1) / portable::kBM);
  return launch("m3qkv_portable_fused_kernel", m3qkv_portable_fused_kernel, grid_for(tiles, 1, a.grid),
                portable::kThreads, kSmemBytes, a.use_pdl != 0, dev, s, p);
}

m3qkv_status portable_gemm(const m3qkv_gemm_args& a, const DeviceInfo& dev, cudaStream_t s) {
  m3qkv_status st = ensure_smem_attributes(dev);
  if (st != M3QKV_SUCCESS) return st;
  portable::GemmParams p;
  p.g = operands(a.xq, a.xsf, a.wq, a.wsf, a.m, a.n, a.k);
  p.out = static_cast<uint16_t*>(a.out);
  const int64_t tiles = (a.n / portable::kBN) * ((a.m + portable::kBM - 1) / portable::kBM);
  return launch("m3qkv_portable_gemm_kernel", m3qkv_portable_gemm_kernel, grid_for(tiles, 1, a.grid),
                portable::kThreads, kSmemBytes, a.use_pdl != 0, dev, s, p);
}

m3qkv_status portable_insert(const m3qkv_insert_args& a, const DeviceInfo& dev, cudaStream_t s) {
  portable::InsertParams p;
  p.qkv = static_cast<const uint16_t*>(a.qkv);
  p.m = a.m;
  p.e = epi::make_epilogue_params(a);
  const int64_t items = (a.m + portable::kInsertRowsPerWarp - 1) / portable::kInsertRowsPerWarp *
                        total_heads(a.nq, a.nkv, a.niq, a.nik);
  return launch("m3qkv_portable_insert_kernel", m3qkv_portable_insert_kernel,
                grid_for(items, portable::kInsertThreads / 32, a.grid), portable::kInsertThreads, 0, a.use_pdl != 0,
                dev, s, p);
}

m3qkv_status portable_quantize(const m3qkv_quantize_args& a, const DeviceInfo& dev, cudaStream_t s) {
  portable::QuantizeParams p;
  p.x = static_cast<const uint16_t*>(a.x);
  p.xq = static_cast<uint8_t*>(a.xq);
  p.xsf = static_cast<uint8_t*>(a.xsf);
  p.m = a.m;
  p.k = a.k;
  const int64_t items = f8_128x4_padded_rows(a.m) * (a.k / kMxBlock);
  return launch("m3qkv_portable_quantize_kernel", m3qkv_portable_quantize_kernel,
                grid_for(items, portable::kQuantizeThreads, 0), portable::kQuantizeThreads, 0, a.use_pdl != 0, dev,
                s, p);
}

m3qkv_status portable_warmup(const DeviceInfo& dev) {
  m3qkv_status st = ensure_smem_attributes(dev);
  if (st != M3QKV_SUCCESS) return st;
  // Loads the module (lazy loading would otherwise do it on the first launch).
  cudaFuncAttributes attr;
  const void* kernels[] = {reinterpret_cast<const void*>(m3qkv_portable_fused_kernel),
                           reinterpret_cast<const void*>(m3qkv_portable_gemm_kernel),
                           reinterpret_cast<const void*>(m3qkv_portable_insert_kernel),
                           reinterpret_cast<const void*>(m3qkv_portable_quantize_kernel)};
  for (const void* k : kernels) {
    const cudaError_t e = cudaFuncGetAttributes(&attr, k);
    if (e != cudaSuccess) return cuda_fail("cudaFuncGetAttributes(portable kernel)", e);
  }
  return M3QKV_SUCCESS;
}

}  // namespace m3qkv
