// Portable fused kernel (sm_80+): the MXFP8 (or bf16-activation) GEMM mainloop of mainloop.cuh on a
// 64-row x one-head tile, the f32 accumulator staged in shared memory, then
// one thread per token row runs the shared epilogue (common/epilogue.cuh) on
// its 128 values. Nothing but the outputs and the caches is written (no
// workspace); the optional acc_tap receives the f32 accumulator (tests).
#include "portable/kernels.cuh"
#include "portable/mainloop.cuh"
#include "ptx/griddepcontrol.cuh"

using namespace m3qkv;
using namespace m3qkv::portable;

static_assert(kThreads >= kBM, "one epilogue thread per tile row");

__global__ void __launch_bounds__(kThreads, 1) m3qkv_portable_fused_kernel(const FusedParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  // PDL: inputs may be produced by the previous grid (e.g. the quantizer).
  griddepcontrol_wait();
  griddepcontrol_launch_dependents();

  const int64_t heads = p.g.n / kBN;
  const int64_t mtiles = (p.g.m + kBM - 1) / kBM;
  const int64_t ntiles = heads * mtiles;
  const WarpCoord wc = warp_coord();
  const int lane = static_cast<int>(threadIdx.x) % 32;
  float* smC = reinterpret_cast<float*>(smem);

  for (int64_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
    const int head = static_cast<int>(tile % heads);
    const int64_t m0 = (tile / heads) * kBM;
    const int64_t n0 = static_cast<int64_t>(head) * kBN;

    float acc[kNTiles][4];
    gemm_tile(acc, smem, p.g.xq, p.g.xsf, p.g.xb, p.g.wq, p.g.wsf, p.g.m, p.g.k, m0, n0);

    // Fragments -> smem tile [64][kLdC] (and the test tap).
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const int col = wc.col0 + nt * 8 + 2 * (lane % 4);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = wc.row0 + lane / 4 + 8 * h;
        smC[row * kLdC + col] = acc[nt][2 * h];
        smC[row * kLdC + col + 1] = acc[nt][2 * h + 1];
        if (p.acc_tap != nullptr && m0 + row < p.g.m)
          *reinterpret_cast<float2*>(p.acc_tap + (m0 + row) * p.g.n + n0 + col) =
              make_float2(acc[nt][2 * h], acc[nt][2 * h + 1]);
      }
    }
    __syncthreads();
    // Which of the tile's cache rows are theirs to write (q heads: none).
    OwnerTable& owners = *reinterpret_cast<OwnerTable*>(smem + kSmemOwnersOff);
    const uint32_t maps = epi::slot_maps_of(head_info(head, p.e.nq, p.e.nkv, p.e.niq).kind);
    if (maps != 0u) {
      epi::build_slot_owners(owners, p.e.slot_mapping, p.e.index_slot_mapping, maps, p.g.m, m0, kBM,
                             static_cast<int>(threadIdx.x), kThreads, [] { __syncthreads(); });
    }

    // The epilogue runs on the smem row in place (a register copy of 128
    // values next to the epilogue's loads would exceed 255 registers).
    if (threadIdx.x < kBM && m0 + threadIdx.x < p.g.m) {
      const int r = static_cast<int>(threadIdx.x);
      epi::epilogue_head_row(p.e, owners.view(), m0 + r, head, smC + r * kLdC);
    }
    __syncthreads();  // smC is the next tile's A/B staging area
  }
}
