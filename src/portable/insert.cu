// Standalone epilogue (m3qkv_qknorm_rope_kv_insert): RMSNorm + RoPE + q
// outputs + cache insert (any format of SPEC §4 / §4b) on a bf16 projection,
// float(bf16) in.
//
// One pass, every lane busy, in one of the lane layouts the plan picks
// (portable/plan.h insert_plan), one kernel each (registers differ: one
// kernel would give every form the largest count and the small forms fewer
// CTAs per SM):
//  * quad rows (large M): a warp takes one head of 8 consecutive token rows,
//    a QUAD of lanes one (row, head) in the quad layout of
//    epi::quad_row_epilogue (lane q holds columns 8j + 2q + {0, 1}), which
//    runs the shared epilogue on registers with quad shuffles. All quads of a
//    warp share the head, so the epilogue's branches and shuffles are
//    warp-uniform. Each lane reads its 16 bf16 pairs as 4-byte words: per j a
//    quad reads 16 contiguous bytes of its row, the 16 loads of a lane are
//    independent (all in flight together) and the 32-byte sectors a load
//    leaves half-used are completed by the next j from L1, so DRAM sees each
//    byte of qkv once.
//  * L-lane rows, L = 8 / 16 / 32 (m3qkv_portable_insert_lanes{8,16}_kernel,
//    m3qkv_portable_insert_warp_kernel): a warp takes one head of 32 / L
//    consecutive rows, L lanes per row with 128 / L values each
//    (epi::lane_row_epilogue<L>): a lane's serial chain (norm, RoPE, encode)
//    covers 16 / 8 / 4 values instead of quad rows' 32, which is what bounds
//    the call when there are too few rows to fill the GPU, at more
//    instructions per row (the norm sums run in L / 4 lanes per class).
//  * mixed (NVFP4 KV; the quad kernel): the k / v / index_k heads in warp
//    rows, the q / index_q heads in quad rows.
//
// Bytes one call must move (bench/RESULTS.md, "insert"): M·N·2 (qkv) + M·24
// (position, slot, index slot) + M·128 (the cos/sin row) + the outputs
// M·nq·128·(2 [q_out] + 1 [q_fp8_out]) + M·niq·128 + the cache tokens:
// NVFP4 M·(2·nkv + nik)·72, FP8 M·(2·nkv + nik)·128, BF16 M·(2·nkv + nik)·256.
#include "common/epilogue_warp.cuh"
#include "portable/kernels.cuh"
#include "ptx/griddepcontrol.cuh"

using namespace m3qkv;
using namespace m3qkv::portable;

static_assert(kInsertThreads % 32 == 0, "whole warps");
static_assert(kInsertRowsPerWarp * 4 == 32, "one quad per row");

// L-lane rows: a warp-uniform loop over (32/L-row group, head), head
// fastest (warp rows: (row, head)).
template <int L>
__device__ __forceinline__ void insert_lane_rows(const InsertParams& p) {
  griddepcontrol_wait();  // qkv is typically the previous grid's output (the GEMM)
  griddepcontrol_launch_dependents();

  constexpr int kRows = epi::LaneRow<L>::kRowsPerWarp;
  const int heads = total_heads(p.e.nq, p.e.nkv, p.e.niq, p.e.nik);
  const int64_t n = static_cast<int64_t>(heads) * kHeadDim;
  constexpr int kWarps = kInsertThreads / 32;
  const int64_t groups = (p.m + kRows - 1) / kRows;
  const int64_t items = groups * heads;
  const int sub = static_cast<int>(threadIdx.x % 32) / L;  // this lane's row in the group
  for (int64_t it = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; it < items;
       it += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int head = static_cast<int>(it % heads);
    const int64_t row = it / heads * kRows + sub;
    const bool valid = kRows == 1 || row < p.m;
    const epi::Bf16Row src{p.qkv + (valid ? row : 0) * n + static_cast<int64_t>(head) * kHeadDim};
    epi::lane_row_epilogue<L>(p.e, head, row, valid, src);
  }
}

__global__ void __launch_bounds__(kInsertThreads) m3qkv_portable_insert_warp_kernel(const InsertParams p) {
  insert_lane_rows<32>(p);
}
__global__ void __launch_bounds__(kInsertThreads) m3qkv_portable_insert_lanes16_kernel(const InsertParams p) {
  insert_lane_rows<16>(p);
}
__global__ void __launch_bounds__(kInsertThreads) m3qkv_portable_insert_lanes8_kernel(const InsertParams p) {
  insert_lane_rows<8>(p);
}

// Quad rows: a warp-uniform loop over (8-row group, head), head fastest, so
// the warps of a block read adjacent heads of the same rows. Mixed (p.mixed):
// the (row, cache head) items first, in warp rows, then the (8-row group,
// q / index_q head) items; the heavy items start first.
__global__ void __launch_bounds__(kInsertThreads) m3qkv_portable_insert_kernel(const InsertParams p) {
  griddepcontrol_wait();
  griddepcontrol_launch_dependents();

  const int heads = total_heads(p.e.nq, p.e.nkv, p.e.niq, p.e.nik);
  const int64_t n = static_cast<int64_t>(heads) * kHeadDim;
  constexpr int kWarps = kInsertThreads / 32;
  const int cache = cache_heads(p.e.nkv, p.e.nik);
  const int64_t cache_items = p.mixed ? p.m * cache : 0;
  const int quad_heads = p.mixed ? query_heads(p.e.nq, p.e.niq) : heads;
  const int64_t items = cache_items + (p.m + kInsertRowsPerWarp - 1) / kInsertRowsPerWarp * quad_heads;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int q = lane % 4;
  for (int64_t it = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; it < items;
       it += static_cast<int64_t>(gridDim.x) * kWarps) {
    if (it < cache_items) {  // warp-uniform
      const int head = cache_head(static_cast<int>(it % cache), p.e.nq, p.e.nkv, p.e.niq);
      const int64_t row = it / cache;
      const epi::Bf16Row src{p.qkv + row * n + static_cast<int64_t>(head) * kHeadDim};
      epi::lane_row_epilogue<32>(p.e, head, row, true, src);
      continue;
    }
    const int64_t jt = it - cache_items;
    const int hq = static_cast<int>(jt % quad_heads);
    const int head = p.mixed ? query_head(hq, p.e.nq, p.e.nkv) : hq;
    const int64_t row = jt / quad_heads * kInsertRowsPerWarp + lane / 4;
    const bool valid = row < p.m;
    const epi::QuadHead qh = epi::quad_head(p.e, head, q);
    const uint32_t* src = reinterpret_cast<const uint32_t*>(p.qkv + (valid ? row : 0) * n +
                                                            static_cast<int64_t>(head) * kHeadDim + 2 * q);
    float y[epi::kQuadValues];  // y[2j + b] = column 8j + 2q + b
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) {
      const uint32_t w = valid ? src[4 * j] : 0u;
      y[2 * j] = bf16_to_f32(static_cast<uint16_t>(w & 0xffffu));
      y[2 * j + 1] = bf16_to_f32(static_cast<uint16_t>(w >> 16));
    }
    epi::quad_row_epilogue(p.e, qh, row, valid, y, q);
  }
}
