// Standalone epilogue (m3qkv_qknorm_rope_kv_insert): RMSNorm + RoPE + q
// outputs + cache insert (any format of docs/contract.md §4.2 / §4.3) on a bf16 projection,
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
// Bytes one call must move (the bound of the insert_<fmt> bench entries,
// bench/README.md): M·N·2 (qkv) + M·24 (position, slot, index slot) + M·128
// (the cos/sin row) + the outputs M·nq·128·(2 [q_out] + 1 [q_fp8_out]) +
// M·niq·128 + the cache tokens:
// NVFP4 M·(2·nkv + nik)·72, FP8 M·(2·nkv + nik)·128, BF16 M·(2·nkv + nik)·256.
#include "common/epilogue_warp.cuh"
#include "portable/kernels.cuh"
#include "ptx/griddepcontrol.cuh"

using namespace m3qkv;
using namespace m3qkv::portable;

static_assert(kInsertThreads % 32 == 0, "whole warps");
static_assert(kInsertRowsPerWarp * 4 == 32, "one quad per row");

// The row of lane `lane` in a (32/L-row group) of L-lane rows, and whether
// it exists (the last group may run past m).
struct LaneRowOf {
  int64_t row;
  bool valid;
};
template <int L>
__device__ __forceinline__ LaneRowOf lane_rows_row(const InsertParams& p, int64_t group, int lane) {
  constexpr int kRows = epi::LaneRow<L>::kRowsPerWarp;
  const int64_t row = group * kRows + lane / L;
  return {row, kRows == 1 || row < p.m};
}

// One (32/L-row group, head) item of L-lane rows, the head of class H; guess:
// the lane's row_guess for it, or null.
template <int L, epi::RowHeads H>
__device__ __forceinline__ void lane_rows_item(const InsertParams& p, const epi::SlotOwners& own, int64_t n, int head,
                                               int64_t group, const epi::RowGuess* guess) {
  const LaneRowOf lr = lane_rows_row<L>(p, group, static_cast<int>(threadIdx.x % 32));
  const epi::Bf16Row src{p.qkv + (lr.valid ? lr.row : 0) * n + static_cast<int64_t>(head) * kHeadDim};
  epi::lane_row_epilogue<L, H>(p.e, own, head, lr.row, lr.valid, src, guess);
}

// Slot ownership (common/slot_owners.cuh) per CTA round: the kWarps items a
// round gives the CTA's warps cover at most kWarps + 1 row groups of kRows
// rows (consecutive items, one or more heads per group), with both slot
// words where the items mix heads.
constexpr int kInsertWarps = kInsertThreads / 32;
template <int kRows>
using InsertOwners = epi::SlotOwnerTable<2 * (kInsertWarps + 1) * kRows>;

// Fills `t` for row groups [g0, g1] (every thread of the CTA calls it).
template <int kRows>
__device__ __forceinline__ void insert_owners(InsertOwners<kRows>& t, const InsertParams& p, int64_t g0, int64_t g1) {
  const uint32_t maps = epi::kSlotMapKv | (p.e.nik > 0 ? epi::kSlotMapIndex : 0u);
  epi::build_slot_owners<1>(t, p.e.slot_mapping, p.e.index_slot_mapping, maps, p.m, g0 * kRows,
                         static_cast<int>(g1 - g0 + 1) * kRows, static_cast<int>(threadIdx.x), kInsertThreads,
                         [] { __syncthreads(); });
}

// L-lane rows, a warp-uniform loop over the items. Lc == Lq: (row group,
// head) items, head fastest, so the warps of a block read adjacent heads of
// the same rows. Lc != Lq (split): the (Lc-lane row group, cache head) items
// first, then the (Lq-lane row group, q / index_q head) items.
// kGuess: before griddepcontrol.wait each warp decodes its first item and
// guesses that row's slot, position (and, for warp rows, destination):
// epi::row_guess, reads of words the predecessor grid may still write,
// checked after the wait. Without it every input is read after the wait.
template <int Lc, int Lq, bool kGuess>
__device__ __forceinline__ void insert_lane_rows(const InsertParams& p) {
  constexpr int kRowsC = epi::LaneRow<Lc>::kRowsPerWarp, kRowsQ = epi::LaneRow<Lq>::kRowsPerWarp;
  const int heads = total_heads(p.e.nq, p.e.nkv, p.e.niq, p.e.nik);
  const int64_t n = static_cast<int64_t>(heads) * kHeadDim;
  constexpr int kWarps = kInsertThreads / 32;
  const int cache = Lc == Lq ? 0 : cache_heads(p.e.nkv, p.e.nik);
  const int query = heads - cache;
  const int64_t cache_items = (p.m + kRowsC - 1) / kRowsC * cache;
  const int64_t items = cache_items + (p.m + kRowsQ - 1) / kRowsQ * query;
  const int lane = static_cast<int>(threadIdx.x % 32);

  // Item `it` as (head, row group, class): warp-uniform.
  struct Item {
    int head;
    int64_t group;
    bool cache;  // split layouts: a cache head in Lc-lane rows
  };
  auto decode = [&](int64_t it) -> Item {
    if constexpr (Lc == Lq) {
      return {static_cast<int>(it % heads), it / heads, false};
    } else if (it < cache_items) {
      return {cache_head(static_cast<int>(it % cache), p.e.nq, p.e.nkv, p.e.niq), it / cache, true};
    } else {
      const int64_t jt = it - cache_items;
      return {query_head(static_cast<int>(jt % query), p.e.nq, p.e.nkv), jt / query, false};
    }
  };
  auto guess_of = [&](const Item& t) {
    const HeadInfo hi = head_info(t.head, p.e.nq, p.e.nkv, p.e.niq);
    if (t.cache) {
      const LaneRowOf lr = lane_rows_row<Lc>(p, t.group, lane);
      return epi::row_guess<epi::kRowGuessDest<Lc>>(p.e, hi, lr.row, lr.valid);
    }
    const LaneRowOf lr = lane_rows_row<Lq>(p, t.group, lane);
    return epi::row_guess<epi::kRowGuessDest<Lq>>(p.e, hi, lr.row, lr.valid);
  };

  __shared__ InsertOwners<kRowsC> owners;
  if (p.owners_resolved != 0)
    epi::clear_slot_owners(owners, static_cast<int>(threadIdx.x), kInsertThreads, [] { __syncthreads(); });
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  Item t{};
  epi::RowGuess guess{};
  if (kGuess && first < items) {
    t = decode(first);
    guess = guess_of(t);
  }
  griddepcontrol_wait();  // qkv is typically the previous grid's output (the GEMM)
  griddepcontrol_launch_dependents();

  // CTA rounds of kWarps items (uniform over the CTA: the owner table's
  // barriers): the table of the round's cache rows, then one item per warp;
  // with resolved slot words one empty table for every round (cleared above).
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kWarps; base < items; base += step) {
    const int64_t end = base + kWarps < items ? base + kWarps : items;  // the round's items [base, end)
    // Its cache items [base, cache_end) (Lc == Lq: any item may be one).
    const int64_t cache_end = Lc == Lq || end < cache_items ? end : cache_items;
    const bool table = base < cache_end;
    if (table && p.owners_resolved == 0)
      insert_owners<kRowsC>(owners, p, decode(base).group, decode(cache_end - 1).group);
    const int64_t it = base + warp;
    if (it < items) {
      if (!kGuess || it != first) {  // a capped grid (m3qkv_insert_args.grid): later items guess after the wait
        t = decode(it);
        if (kGuess) guess = guess_of(t);
      }
      const epi::RowGuess* sp = kGuess ? &guess : nullptr;
      const epi::SlotOwners own = owners.view();
      if constexpr (Lc == Lq) {
        lane_rows_item<Lq, epi::RowHeads::kAny>(p, own, n, t.head, t.group, sp);
      } else if (t.cache) {  // warp-uniform
        lane_rows_item<Lc, epi::RowHeads::kCache>(p, own, n, t.head, t.group, sp);
      } else {
        lane_rows_item<Lq, epi::RowHeads::kQuery>(p, own, n, t.head, t.group, sp);
      }
    }
    if (table) __syncthreads();  // the table is the next round's
  }
}

// The guess (kGuess, epi::row_guess) reads each row's slot and position
// before the PDL wait, so the cos / sin words load in the first round after
// it: at small M the dependent load rounds after the wait are the call's
// latency; the 8-lane kernel's FP8 / BF16 mid-M calls gain too. The split c16q8 kernel has both instances at the same registers:
// the guess is faster with few rows, slower with many, and the plan picks
// (portable/plan.h: insert_nvfp4_c16q8 against insert_nvfp4_c16q8g).
__global__ void __launch_bounds__(kInsertThreads) m3qkv_portable_insert_warp_kernel(const InsertParams p) {
  insert_lane_rows<32, 32, true>(p);
}
__global__ void __launch_bounds__(kInsertThreads) m3qkv_portable_insert_lanes8_kernel(const InsertParams p) {
  insert_lane_rows<8, 8, true>(p);
}
__global__ void __launch_bounds__(kInsertThreads) m3qkv_portable_insert_split_c32q8_kernel(const InsertParams p) {
  insert_lane_rows<32, 8, true>(p);
}
__global__ void __launch_bounds__(kInsertThreads) m3qkv_portable_insert_split_c16q8_kernel(const InsertParams p) {
  insert_lane_rows<16, 8, false>(p);
}
__global__ void __launch_bounds__(kInsertThreads) m3qkv_portable_insert_split_c16q8_guess_kernel(const InsertParams p) {
  insert_lane_rows<16, 8, true>(p);
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
  // CTA rounds of kWarps items, each with the owner table of its rows
  // (insert_lane_rows says why).
  __shared__ InsertOwners<kInsertRowsPerWarp> owners;
  if (p.owners_resolved != 0)
    epi::clear_slot_owners(owners, static_cast<int>(threadIdx.x), kInsertThreads, [] { __syncthreads(); });
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kWarps; base < items; base += step) {
    const int64_t end = base + kWarps < items ? base + kWarps : items;
    if (p.owners_resolved == 0) insert_owners<kInsertRowsPerWarp>(owners, p, base / heads, (end - 1) / heads);
    const int64_t it = base + threadIdx.x / 32;
    if (it >= items) {
      __syncthreads();
      continue;
    }
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
    epi::quad_row_epilogue(p.e, owners.view(), qh, row, valid, y, q);
    __syncthreads();  // the table is the next round's
  }
}

// The whole-call owner passes (kernels.cuh OwnerPassParams). Each waits for
// its predecessor: the clear for the grid before (which may still read the
// resolved words of the previous call), insert for clear, resolve for
// insert, the insert kernel for resolve.
__global__ void __launch_bounds__(kInsertThreads) m3qkv_portable_slot_owners_clear_kernel(const OwnerPassParams p) {
  griddepcontrol_wait();
  griddepcontrol_launch_dependents();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.entries; i += stride)
    epi::owner_table_clear(p.key, p.last, i);
}
__global__ void __launch_bounds__(kInsertThreads) m3qkv_portable_slot_owners_insert_kernel(const OwnerPassParams p) {
  griddepcontrol_wait();
  griddepcontrol_launch_dependents();
  const uint32_t mask = static_cast<uint32_t>(p.entries - 1);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < 2 * p.m; i += stride) {
    const bool index = i >= p.m;
    const int64_t row = index ? i - p.m : i;
    const int64_t* s = index ? p.index_slots : p.slots;
    if (s != nullptr) epi::owner_table_insert(p.key, p.last, mask, s[row], index, row);
  }
}
__global__ void __launch_bounds__(kInsertThreads) m3qkv_portable_slot_owners_resolve_kernel(const OwnerPassParams p) {
  griddepcontrol_wait();
  griddepcontrol_launch_dependents();
  const uint32_t mask = static_cast<uint32_t>(p.entries - 1);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; row < p.m; row += stride) {
    if (p.slots != nullptr) p.out_slots[row] = epi::owner_table_resolve(p.key, p.last, mask, p.slots[row], false, row);
    if (p.index_slots != nullptr)
      p.out_index[row] = epi::owner_table_resolve(p.key, p.last, mask, p.index_slots[row], true, row);
  }
}
