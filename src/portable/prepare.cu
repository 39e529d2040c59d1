// m3qkv_prepare_weights_fp8: the fp8 fast mode's one-time weight fold
// (common/fold_fp8.h fold_group), one thread per (row, 128-K group): 128
// bytes in and out as 16-byte vectors, the group's scale word written as the
// scale in all four blocks. With statistics, each thread also sums its
// group's change in f64 exactly as golden::fold_mxfp8 does (same order, same
// operations), so both report the same numbers.
#include <cuda_runtime.h>

#include <cstring>

#include "common/fold_fp8.h"
#include "common/layouts.h"
#include "host/launch.h"
#include "host/status.h"
#include "portable/plan.h"
#include "portable/portable.h"
#include "ptx/griddepcontrol.cuh"

namespace m3qkv {
namespace {

constexpr int kPrepareThreads = 128;

// Device statistics: the changed count and the bits of the largest relative
// change (a non-negative double: its bits order as the values do).
struct DeviceFoldStats {
  unsigned long long changed;
  unsigned long long max_rel_bits;
};

struct PrepareParams {
  const uint8_t* wq;
  const uint8_t* wsf;
  uint8_t* wq_out;
  uint8_t* wsf_out;
  int64_t n, k;
  DeviceFoldStats* stats;  // null: no statistics
};

__device__ void group_stats(const uint32_t (&before)[fold::kGroupK / 4], uint32_t sf,
                            const uint32_t (&after)[fold::kGroupK / 4], uint8_t big, DeviceFoldStats* st) {
  if (big == 0xffu) return;  // a NaN scale: the group is NaN either way
  unsigned long long changed = 0;
  double d2 = 0.0, w2 = 0.0;
#pragma unroll  // static indices: q and out stay in registers
  for (int c = 0; c < fold::kGroupK; ++c) {
    const int eb = static_cast<int>((sf >> (8 * (c / 32))) & 0xffu);
    const uint8_t b0 = static_cast<uint8_t>(before[c / 4] >> (8 * (c % 4)));
    const uint8_t b1 = static_cast<uint8_t>(after[c / 4] >> (8 * (c % 4)));
    const double w = static_cast<double>(e4m3_to_f32(b0)) * scalbn(1.0, eb - 127);
    const double w1 = static_cast<double>(e4m3_to_f32(b1)) * scalbn(1.0, static_cast<int>(big) - 127);
    if (isnan(w) || isnan(w1)) continue;
    if (w1 != w) ++changed;
    d2 += (w1 - w) * (w1 - w);
    w2 += w * w;
  }
  if (changed != 0) atomicAdd(&st->changed, changed);
  if (w2 > 0.0) atomicMax(&st->max_rel_bits, static_cast<unsigned long long>(__double_as_longlong(sqrt(d2 / w2))));
}

__global__ void __launch_bounds__(kPrepareThreads) m3qkv_prepare_fp8_kernel(const PrepareParams p) {
  griddepcontrol_wait();
  griddepcontrol_launch_dependents();
  const int64_t groups = p.k / fold::kGroupK;
  const int64_t items = p.n * groups;
  for (int64_t it = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; it < items;
       it += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = it / groups;
    const int64_t g = it - r * groups;
    const int64_t sf_off = f8_128x4_offset(r, fold::kBlocksPerGroup * g, p.k / kMxBlock);  // the group's word
    const uint32_t sf = *reinterpret_cast<const uint32_t*>(p.wsf + sf_off);
    const uint4* src = reinterpret_cast<const uint4*>(p.wq + r * p.k + g * fold::kGroupK);
    uint32_t q[fold::kGroupK / 4], out[fold::kGroupK / 4];
#pragma unroll
    for (int v = 0; v < fold::kGroupK / 16; ++v) {
      const uint4 u = src[v];
      q[4 * v] = u.x, q[4 * v + 1] = u.y, q[4 * v + 2] = u.z, q[4 * v + 3] = u.w;
    }
    const uint8_t big = fold::fold_group(q, sf, out);
    uint4* dst = reinterpret_cast<uint4*>(p.wq_out + r * p.k + g * fold::kGroupK);
#pragma unroll
    for (int v = 0; v < fold::kGroupK / 16; ++v)
      dst[v] = make_uint4(out[4 * v], out[4 * v + 1], out[4 * v + 2], out[4 * v + 3]);
    *reinterpret_cast<uint32_t*>(p.wsf_out + sf_off) = fold::group_scale_word(big);
    if (p.stats != nullptr) group_stats(q, sf, out, big, p.stats);
  }
}

}  // namespace

m3qkv_status portable_prepare(const m3qkv_prepare_args& a, const DeviceInfo& dev, cudaStream_t s) {
  const char* fn = "m3qkv_prepare_weights_fp8";
  (void)dev;
  PrepareParams p;
  p.wq = static_cast<const uint8_t*>(a.wq);
  p.wsf = static_cast<const uint8_t*>(a.wsf);
  p.wq_out = static_cast<uint8_t*>(a.wq_out);
  p.wsf_out = static_cast<uint8_t*>(a.wsf_out);
  p.n = a.n;
  p.k = a.k;
  p.stats = nullptr;
  // F8_128x4 padding rows (n is a multiple of 128: none) need no copy.
  host::LaunchShape sh;
  sh.grid = portable::plan_grid(a.n * (a.k / fold::kGroupK), kPrepareThreads, 0);
  sh.threads = kPrepareThreads;
  if (a.stats == nullptr) return host::launch(fn, "m3qkv_prepare_fp8_kernel", m3qkv_prepare_fp8_kernel, sh, s, p);

  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  M3QKV_CUDA_TRY(fn, cudaStreamIsCapturing(s, &cap));
  if (cap != cudaStreamCaptureStatusNone)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT,
                "%s: stats waits for the stream, which is capturing; prepare outside the capture or pass stats = NULL",
                fn);
  void* dstats = nullptr;
  M3QKV_CUDA_TRY(fn, cudaMallocAsync(&dstats, sizeof(DeviceFoldStats), s));
  p.stats = static_cast<DeviceFoldStats*>(dstats);
  DeviceFoldStats h{};
  cudaError_t e = cudaMemsetAsync(dstats, 0, sizeof(DeviceFoldStats), s);
  m3qkv_status st = e == cudaSuccess ? host::launch(fn, "m3qkv_prepare_fp8_kernel", m3qkv_prepare_fp8_kernel, sh, s, p)
                                     : cuda_fail(fn, "cudaMemsetAsync(stats)", e);
  if (st == M3QKV_SUCCESS) {
    e = cudaMemcpyAsync(&h, dstats, sizeof(h), cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) st = cuda_fail(fn, "reading the statistics back (cudaMemcpyAsync + cudaStreamSynchronize)", e);
  }
  const cudaError_t ef = cudaFreeAsync(dstats, s);  // freed on every path
  if (st == M3QKV_SUCCESS && ef != cudaSuccess) st = cuda_fail(fn, "cudaFreeAsync(stats)", ef);
  if (st != M3QKV_SUCCESS) return st;
  a.stats->changed = static_cast<int64_t>(h.changed);
  std::memcpy(&a.stats->max_rel_change, &h.max_rel_bits, sizeof(double));
  return M3QKV_SUCCESS;
}

}  // namespace m3qkv
