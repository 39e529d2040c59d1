// Standalone epilogue (m3qkv_qknorm_rope_kv_insert): RMSNorm + RoPE + q
// outputs + NVFP4 cache insert on a bf16 projection, float(bf16) in. One
// thread per (token row, head): the row's 128 values sit in registers and go
// through the same epilogue code as the fused kernels.
#include "portable/kernels.cuh"
#include "ptx/griddepcontrol.cuh"

using namespace m3qkv;
using namespace m3qkv::portable;

__global__ void __launch_bounds__(kInsertThreads) m3qkv_portable_insert_kernel(const InsertParams p) {
  griddepcontrol_wait();  // qkv is typically the previous grid's output (the GEMM)
  griddepcontrol_launch_dependents();

  const int heads = total_heads(p.e.nq, p.e.nkv, p.e.niq, p.e.nik);
  const int64_t items = p.m * heads;
  const int64_t n = static_cast<int64_t>(heads) * kHeadDim;
  for (int64_t it = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; it < items;
       it += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = it / heads;
    const int head = static_cast<int>(it - m * heads);
    const uint4* src = reinterpret_cast<const uint4*>(p.qkv + m * n + static_cast<int64_t>(head) * kHeadDim);
    float x[kHeadDim];
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) {
      const uint4 v = src[j];
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        x[8 * j + 2 * i] = bf16_to_f32(static_cast<uint16_t>(w[i] & 0xffffu));
        x[8 * j + 2 * i + 1] = bf16_to_f32(static_cast<uint16_t>(w[i] >> 16));
      }
    }
    epi::epilogue_head_row(p.e, m, head, x);
  }
}
