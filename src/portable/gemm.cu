// Portable MXFP8 GEMM with bf16 output (m3qkv_mxfp8_gemm): the mainloop of
// mainloop.cuh, out = bf16_rn(acc) straight from the MMA fragments.
#include "portable/kernels.cuh"
#include "portable/mainloop.cuh"
#include "ptx/griddepcontrol.cuh"

using namespace m3qkv;
using namespace m3qkv::portable;

__global__ void __launch_bounds__(kThreads, 1) m3qkv_portable_gemm_kernel(const GemmParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  griddepcontrol_wait();
  griddepcontrol_launch_dependents();

  const int64_t ntn = p.g.n / kBN;
  const int64_t mtiles = (p.g.m + kBM - 1) / kBM;
  const int64_t ntiles = ntn * mtiles;
  const WarpCoord wc = warp_coord();
  const int lane = static_cast<int>(threadIdx.x) % 32;

  for (int64_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
    const int64_t m0 = (tile / ntn) * kBM;
    const int64_t n0 = (tile % ntn) * kBN;
    float acc[kNTiles][4];
    gemm_tile(acc, smem, p.g.xq, p.g.xsf, p.g.xb, p.g.wq, p.g.wsf, p.g.m, p.g.k, m0, n0);
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const int64_t col = n0 + wc.col0 + nt * 8 + 2 * (lane % 4);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = m0 + wc.row0 + lane / 4 + 8 * h;
        if (row < p.g.m)
          *reinterpret_cast<uint32_t*>(p.out + row * p.g.n + col) = epi::pack_bf16x2(acc[nt][2 * h], acc[nt][2 * h + 1]);
      }
    }
  }
}
