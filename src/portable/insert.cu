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
//  * L-lane rows (epi::lane_row_epilogue<L>): a warp takes one head of 32 / L
//    consecutive rows, L lanes per row with 128 / L values each. A lane's
//    serial chain (norm, RoPE, encode) covers 16 / 8 / 4 values for L = 8 /
//    16 / 32 instead of quad rows' 32, which is what bounds the call when
//    there are too few rows to hide it, at more instructions per row (the
//    norm sums run in L / 4 lanes per class). Warp rows (L = 32) and 8-lane
//    rows for every head; the split layouts give the k / v / index_k heads
//    (the NVFP4 encode's group scales make theirs the longest chains) more
//    lanes than the q / index_q heads and run them first: 32 and 8 lanes,
//    16 and 8 lanes.
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

// One (32/L-row group, head) item of L-lane rows, the head of class H.
template <int L, epi::RowHeads H>
__device__ __forceinline__ void lane_rows_item(const InsertParams& p, int64_t n, int head, int64_t group) {
  constexpr int kRows = epi::LaneRow<L>::kRowsPerWarp;
  const int64_t row = group * kRows + static_cast<int>(threadIdx.x % 32) / L;
  const bool valid = kRows == 1 || row < p.m;
  const epi::Bf16Row src{p.qkv + (valid ? row : 0) * n + static_cast<int64_t>(head) * kHeadDim};
  epi::lane_row_epilogue<L, H>(p.e, head, row, valid, src);
}

// L-lane rows, a warp-uniform loop over the items. Lc == Lq: (row group,
// head) items, head fastest, so the warps of a block read adjacent heads of
// the same rows. Lc != Lq (split): the (Lc-lane row group, cache head) items
// first, then the (Lq-lane row group, q / index_q head) items.
template <int Lc, int Lq>
__device__ __forceinline__ void insert_lane_rows(const InsertParams& p) {
  griddepcontrol_wait();  // qkv is typically the previous grid's output (the GEMM)
  griddepcontrol_launch_dependents();

  constexpr int kRowsC = epi::LaneRow<Lc>::kRowsPerWarp, kRowsQ = epi::LaneRow<Lq>::kRowsPerWarp;
  const int heads = total_heads(p.e.nq, p.e.nkv, p.e.niq, p.e.nik);
  const int64_t n = static_cast<int64_t>(heads) * kHeadDim;
  constexpr int kWarps = kInsertThreads / 32;
  const int cache = Lc == Lq ? 0 : cache_heads(p.e.nkv, p.e.nik);
  const int query = heads - cache;
  const int64_t cache_items = (p.m + kRowsC - 1) / kRowsC * cache;
  const int64_t items = cache_items + (p.m + kRowsQ - 1) / kRowsQ * query;
  for (int64_t it = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; it < items;
       it += static_cast<int64_t>(gridDim.x) * kWarps) {
    if constexpr (Lc == Lq) {
      lane_rows_item<Lq, epi::RowHeads::kAny>(p, n, static_cast<int>(it % heads), it / heads);
    } else if (it < cache_items) {  // warp-uniform
      const int head = cache_head(static_cast<int>(it % cache), p.e.nq, p.e.nkv, p.e.niq);
      lane_rows_item<Lc, epi::RowHeads::kCache>(p, n, head, it / cache);
    } else {
      const int64_t jt = it - cache_items;
      lane_rows_item<Lq, epi::RowHeads::kQuery>(p, n, query_head(static_cast<int>(jt % query), p.e.nq, p.e.nkv),
                                                jt / query);
    }
  }
}

__global__ void __launch_bounds__(kInsertThreads) m3qkv_portable_insert_warp_kernel(const InsertParams p) {
  insert_lane_rows<32, 32>(p);
}
__global__ void __launch_bounds__(kInsertThreads) m3qkv_portable_insert_lanes8_kernel(const InsertParams p) {
  insert_lane_rows<8, 8>(p);
}
__global__ void __launch_bounds__(kInsertThreads) m3qkv_portable_insert_split_c32q8_kernel(const InsertParams p) {
  insert_lane_rows<32, 8>(p);
}
__global__ void __launch_bounds__(kInsertThreads) m3qkv_portable_insert_split_c16q8_kernel(const InsertParams p) {
  insert_lane_rows<16, 8>(p);
}

// Quad rows: a warp-uniform loop over (8-row group, head), head fastest, so
// the warps of a block read adjacent heads of the same rows.
__global__ void __launch_bounds__(kInsertThreads) m3qkv_portable_insert_kernel(const InsertParams p) {
  griddepcontrol_wait();
  griddepcontrol_launch_dependents();

  const int heads = total_heads(p.e.nq, p.e.nkv, p.e.niq, p.e.nik);
  const int64_t n = static_cast<int64_t>(heads) * kHeadDim;
  constexpr int kWarps = kInsertThreads / 32;
  const int64_t items = (p.m + kInsertRowsPerWarp - 1) / kInsertRowsPerWarp * heads;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int q = lane % 4;
  for (int64_t it = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; it < items;
       it += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int head = static_cast<int>(it % heads);
    const int64_t row = it / heads * kInsertRowsPerWarp + lane / 4;
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
