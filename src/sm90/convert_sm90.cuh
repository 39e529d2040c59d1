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

static_assert(kBK % kConvertGroup == 0, "a conversion group lies in one stage");

// The grid's share of x then w (all threads of every CTA call it).
__device__ __forceinline__ void convert_operands(const KernelParams& p) {
  convert_jobs(p.conv_x, p.conv_w, static_cast<int64_t>(p.k_stages) * kBK,
               static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, static_cast<int64_t>(gridDim.x) * blockDim.x);
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
