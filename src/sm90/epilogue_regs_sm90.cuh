// Register-resident epilogue of one consumer warpgroup's 64 x 128 accumulator
// block: the docs/contract.md §3 epilogue computed directly on the wgmma fragment by the
// shared quad epilogue of src/common/epilogue_quad.cuh.
//
// Fragment (ptx/wgmma.cuh): thread (warp w, lane l) holds rows 16w + l/4 + 8h
// (h = 0, 1) and columns c = 8j + 2q + b (q = l % 4, j = 0..15, b = 0, 1):
// for each half h, the quad of lanes 4(l/4)..+3 holds one whole row in exactly
// the quad layout of epi::quad_row_epilogue (which says why the result is
// bit-exact with epi::epilogue_head_row). Rows >= M compute but store nothing.
#pragma once

#include "common/epilogue_quad.cuh"
#include "common/slot_owners.cuh"
#include "sm90/kernel_sm90.cuh"

namespace m3qkv::sm90 {

// The slot owners of one warpgroup's 64-row block (common/slot_owners.cuh;
// a Config region per warpgroup), built by its 128 threads at named barrier
// `bar`; the first barrier orders the previous block's queries before the
// table is refilled. q / index_q heads: nothing to build.
using BlockOwners = epi::SlotOwnerTable<kRowsPerWg>;
__device__ __forceinline__ void block_owners(BlockOwners& t, const KernelParams& p, const Tile& tl, int64_t row_base,
                                             uint32_t bar) {
  const uint32_t maps = epi::slot_maps_of(head_info(tl.head, p.epi.nq, p.epi.nkv, p.epi.niq).kind);
  if (maps == 0u) return;  // uniform: one head per tile
  auto sync = [bar] { ptx::bar_sync(bar, kWarpgroup); };
  sync();
  epi::build_slot_owners(t, p.epi.slot_mapping, p.epi.index_slot_mapping, maps, p.m, row_base, kRowsPerWg,
                         static_cast<int>(threadIdx.x % kWarpgroup), kWarpgroup, sync);
}

// The register epilogue of one 64 x 128 block in the fragment layout, its
// values delivered by `value(i)` = fragment register i of this thread
// (i = 4j + 2h + b): from the accumulator itself (epilogue_block_regs) or from
// the prefill kernel's hand-off buffer (epilogue_block_handoff). `hmask`: the
// fragment halves h (bit h) of this warp whose rows this call finalizes
// (split-K spread over the cluster: splitk_reduce_spread); the others are
// neither computed nor stored. Warp-uniform.
template <class Value>
__device__ __forceinline__ void epilogue_block_frag(const KernelParams& p, const epi::SlotOwners& own,
                                                    const Value& value, const Tile& tl, int64_t row_base,
                                                    uint32_t hmask) {
  const int t = threadIdx.x % kWarpgroup;
  const int l = t % 32;
  const int q = l % 4;
  const int c0 = 2 * q;
  const int r0 = 16 * (t / 32) + l / 4;
  const epi::QuadHead head = epi::quad_head(p.epi, tl.head, q);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (!((hmask >> h) & 1u)) continue;  // warp-uniform: the quad shuffles stay whole-warp
    const int64_t row = row_base + r0 + 8 * h;
    float y[epi::kQuadValues];  // y[2j + b] = column 8j + c0 + b
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j) {
      y[2 * j] = value(4 * j + 2 * h);
      y[2 * j + 1] = value(4 * j + 2 * h + 1);
    }
    if (p.acc_tap != nullptr && row < p.m) {
      float* dst = p.acc_tap + row * p.n + static_cast<int64_t>(tl.head) * kBN + c0;
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(y[2 * j], y[2 * j + 1]);
    }
    epi::quad_row_epilogue(p.epi, own, head, row, row < p.m, y, q);
  }
}

__device__ __forceinline__ void epilogue_block_regs(const KernelParams& p, const epi::SlotOwners& own,
                                                    float (&acc)[64], const Tile& tl, int64_t row_base,
                                                    uint32_t hmask = 3u) {
  epilogue_block_frag(p, own, [&](int i) { return acc[i]; }, tl, row_base, hmask);
}

// The prefill kernel's hand-off (prefill_sm90.cu): consumer thread t of a
// warpgroup stores its register i at buf[i·128 + t] (consecutive threads,
// consecutive words: conflict-free); epilogue thread t (same t) reads them
// back, so it holds that consumer thread's fragment.
__device__ __forceinline__ void handoff_store(float* buf, const float (&acc)[64]) {
  const int t = threadIdx.x % kWarpgroup;
#pragma unroll
  for (int i = 0; i < 64; ++i) buf[i * kWarpgroup + t] = acc[i];
}
__device__ __forceinline__ void epilogue_block_handoff(const KernelParams& p, const epi::SlotOwners& own,
                                                       const float* buf, const Tile& tl, int64_t row_base) {
  const int t = threadIdx.x % kWarpgroup;
  epilogue_block_frag(p, own, [&](int i) { return buf[i * kWarpgroup + t]; }, tl, row_base, 3u);
}

// The end of one tile in variant A's consumer warpgroup: the split-K
// reduction spread over the cluster (splitk_reduce_spread, kSplit), then the
// register epilogue of the rows this CTA finalizes. `part` / `part_s`: this
// CTA's partial buffer (generic / shared::cta address); `red_phase` toggles
// per tile.
// `owners` / `owners_bar`: this warpgroup's table and named barrier (block_owners).
template <bool kSplit>
__device__ __forceinline__ void finish_tile(const KernelParams& p, float (&acc)[64], const Tile& tl, int64_t row_base,
                                            uint32_t rank, float* part, uint32_t part_s, uint32_t red_full,
                                            uint32_t red_empty, uint32_t* red_phase, bool first_tile,
                                            BlockOwners& owners, uint32_t owners_bar) {
  uint32_t hmask = 3u;
  if constexpr (kSplit) {
    hmask = splitk_reduce_spread(p, acc, rank, part, part_s, red_full, red_empty, *red_phase, first_tile);
    *red_phase ^= 1u;
    if (threadIdx.x % kWarpgroup == 0) trace_event(p, kTrConsReduced);  // split: one consumer warpgroup
  }
  block_owners(owners, p, tl, row_base, owners_bar);
  epilogue_block_regs(p, owners.view(), acc, tl, row_base, hmask);
}

}  // namespace m3qkv::sm90
