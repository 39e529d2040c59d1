// The one-launch SM90 prefill paths: the persistent grid converts the MX
// operands to bf16 itself, then meets at a grid barrier, and only then does
// any TMA read the copies (one launch per call: a separate conversion kernel
// costs a second launch's host time, docs/host.md).
//
// Conversion: e4m3 · 2^(s-127) exactly in bf16 (dequant_sm90.cuh), 16
// elements (one 16-B load, two 16-B stores) per group; thread t of the grid
// takes groups t, t + T, ... (T = the grid's threads) of job x, then of job
// w, kConvertUnroll groups per round with their loads issued together: one
// CTA of 512 / 640 threads per SM must keep as many bytes in flight as the
// separate kernel's 2048 threads with 8-B loads did.
//
// Grid barrier (every CTA resident: the launch is cooperative, host/launch.h):
// count and generation in the workspace's zeroed head (host::kGridSyncOffset).
// Thread 0 of each CTA reads the generation, arrives on the count with
// acq_rel; the last arriver resets the count to 0 (for the next launch,
// stream-ordered after this one) and releases generation + 1; the others
// spin until the generation moves (acquire). The generation is read before
// arriving, and it can only move once every CTA has arrived, so no CTA can
// miss its barrier's change. Ordering: bar.sync before the arrival (every
// thread's stores precede thread 0's release, PTX fences and barriers are
// cumulative), acquire then bar.sync after; fence.proxy.async.global in every
// thread on both sides, because the readers are TMA loads (async proxy) of
// other CTAs reading generic-proxy stores.
#pragma once

#include <stdint.h>

#include "ptx/atomic.cuh"
#include "ptx/fence.cuh"
#include "sm90/dequant_sm90.cuh"
#include "sm90/kernel_sm90.cuh"

namespace m3qkv::sm90 {

constexpr int kConvertGroup = 16;  // e4m3 per group: one 16-B load
constexpr int kConvertUnroll = 4;  // groups per thread per round (64 B of loads in flight)
static_assert(kBK % kConvertGroup == 0 && kMxBlock % kConvertGroup == 0, "a group lies in one stage and MX block");

// 16 e4m3 `v` times 2^(s-127) as 16 bf16 at `out` (32 B, 16-B aligned).
__device__ __forceinline__ void convert_group_store(const uint4 v, uint32_t s, uint8_t* out) {
  uint4 lo, hi;
  dequant16_e4m3_to_bf16(v, s, &lo, &hi);
  reinterpret_cast<uint4*>(out)[0] = lo;
  reinterpret_cast<uint4*>(out)[1] = hi;
}

// The grid's share of x then w (all threads of every CTA call it).
__device__ __forceinline__ void convert_operands(const KernelParams& p) {
  const int64_t k = static_cast<int64_t>(p.k_stages) * kBK;
  const int64_t per_row = k / kConvertGroup;
  const int64_t nx = p.conv_x.rows * per_row;
  const int64_t n = nx + p.conv_w.rows * per_row;
  const int64_t T = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i0 < n; i0 += kConvertUnroll * T) {
    uint4 v[kConvertUnroll];
    uint32_t s[kConvertUnroll];
    uint8_t* out[kConvertUnroll];
#pragma unroll
    for (int u = 0; u < kConvertUnroll; ++u) {
      const int64_t i = i0 + u * T;
      out[u] = nullptr;
      if (i >= n) continue;
      const bool in_x = i < nx;  // field by field: a reference to either job would copy both to the stack
      const uint8_t* q = in_x ? p.conv_x.q : p.conv_w.q;
      const uint8_t* sf = in_x ? p.conv_x.sf : p.conv_w.sf;
      const int64_t g = in_x ? i : i - nx;
      const int64_t row = g / per_row;
      const int64_t c = g - row * per_row;  // K 16c .. 16c + 15: stage c / 8, MX block c / 2
      v[u] = *reinterpret_cast<const uint4*>(q + row * k + kConvertGroup * c);
      const uint8_t* chunk = sf + ((row / 128) * p.k_stages + c / (kBK / kConvertGroup)) * kSfChunk;
      s[u] = chunk[f8_128x4_chunk_word(static_cast<int>(row % 128)) + (c / (kMxBlock / kConvertGroup)) % 4];
      out[u] = (in_x ? p.conv_x.out : p.conv_w.out) + (row * k + kConvertGroup * c) * 2;
    }
#pragma unroll
    for (int u = 0; u < kConvertUnroll; ++u)
      if (out[u] != nullptr) convert_group_store(v[u], s[u], out[u]);
  }
}

// Every CTA of the grid waits here until all have arrived (see above).
__device__ __forceinline__ void grid_barrier(uint32_t* sync) {
  ptx::fence_proxy_async_global();  // this thread's generic stores, for the async-proxy readers
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t* count = sync;
    uint32_t* gen = sync + 1;
    const uint32_t g0 = ptx::ld_acquire_gpu_u32(gen);
    const uint32_t arrived = ptx::atom_add_acq_rel_gpu_u32(count, 1u);
    if (arrived == gridDim.x - 1) {
      ptx::st_relaxed_gpu_u32(count, 0u);
      ptx::st_release_gpu_u32(gen, g0 + 1u);
    } else {
      while (ptx::ld_acquire_gpu_u32(gen) == g0) __nanosleep(32);
    }
  }
  __syncthreads();
  ptx::fence_proxy_async_global();  // the other CTAs' stores, for this CTA's TMA loads
}

// The conversion phase of a one-launch kernel, after griddepcontrol.wait
// (the operands may be the previous grid's output).
__device__ __forceinline__ void convert_phase(const KernelParams& p) {
  if (p.conv_sync == nullptr) return;
  convert_operands(p);
  grid_barrier(p.conv_sync);
}

}  // namespace m3qkv::sm90
