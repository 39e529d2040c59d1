// The end of a split-K decode unit, shared by the SM90 and SM100 decode
// kernels (src/sm90/decode_sm90.cu, src/sm100/decode_sm100.cu): the unit's
// f32 partial [nt][128] (already in a shared-memory tile T) goes to its
// workspace slot, the unit counts itself on its (head, token block) counter,
// and the unit that arrives last sums the S partials in the fixed order
// s = 0, 1, ..., S-1 and runs the docs/contract.md §3 epilogue (epi::lane_row_epilogue<32>
// for blocks of at most one row per warp, else epi::quad_row_epilogue).
// Spread plans (SM90, every unit resident at once): all S units wait for the
// last arrival and each finishes its share of the rows (finish_unit's
// `spread`). Plan and unit numbering: src/common/splitk_plan.h. The cluster form
// (finish_unit_cluster, SM90 cluster plans): the S partials meet in
// distributed shared memory and every rank finishes a share of the rows.
//
// Why the bytes are the same run to run: the sum of a (head, token block) is
// always partial 0 + partial 1 + ... in f32 RN, whichever CTA finishes last;
// only the last arriver's own partial is read from T instead of its slot,
// which holds the same bits.
#pragma once

#include <stdint.h>

#include "common/epilogue_warp.cuh"
#include "common/numerics.h"
#include "common/slot_owners.cuh"
#include "common/splitk_plan.h"
#include "ptx/atomic.cuh"
#include "ptx/barrier.cuh"
#include "ptx/cluster.cuh"
#include "ptx/mbarrier.cuh"

namespace m3qkv::splitk {

constexpr int kHeadCols = 128;  // columns of a head row (= weight rows of a unit)

// The tile T[nt][128] f32: column groups of 8 are XOR-swizzled by token
// (row) bits 0-1, so the epilogue's quad reads (8 tokens × the same columns
// per warp) and the float4 row accesses are free of bank conflicts.
M3_HD int tile_index(int n, int c) { return n * kHeadCols + (c ^ ((n & 3) << 3)); }

// Row n of T as epi::lane_row_epilogue's source (column pairs stay adjacent
// and 8-B aligned under the swizzle).
struct TileRow {
  using Word = float2;
  const float* T;
  int n;
  __device__ __forceinline__ Word load(int c) const { return *reinterpret_cast<const float2*>(T + tile_index(n, c)); }
  __device__ __forceinline__ static float2 unpack(Word w) { return w; }
  // The norm sums' words loaded again from the tile (shared memory) rather
  // than shuffled from the row's lanes: the decode kernels' form, whose
  // registers were fitted to it.
  static constexpr bool kSumsFromLanes = false;
};

// The steps of a unit's end that `mark(step)` reports (every thread of the
// group calls it; the SM90 kernel's timeline stamps them, others pass a no-op).
enum Mark : int {
  kMarkArrived = 0,  // the unit is counted (L2 plans) or its cluster's tiles are ready
  kMarkSummed = 1,   // the last arriver: the S partials summed into T
  kMarkOwners = 2,   // the last arriver: the slot-owner table built (epilogue inputs next)
};

// The epilogue of the block's token rows n = n0 + stride·i, i < rows, summed
// in T (the last arriver: the whole block, n0 = 0, stride 1, rows = its
// tokens; a cluster rank: its share). Called by the group's kThreads threads;
// builds the block's slot-owner table first (bar.sync kBarrier inside).
template <int NT, int kThreads, uint32_t kBarrier, bool kSpread, class P, class MarkFn>
__device__ __forceinline__ void epilogue_rows(const P& p, const Unit& w, int t, float* T,
                                              epi::SlotOwnerTable<NT>* owners, int n0, int stride, int rows,
                                              MarkFn&& mark) {
  const int q = t % 4;
  if constexpr (!kSpread) stride = 1;  // contiguous rows: the last arriver's block, a spread rank's share
  {
    const uint32_t maps = epi::slot_maps_of(head_info(w.head, p.epi.nq, p.epi.nkv, p.epi.niq).kind);
    if (maps != 0u) {  // uniform over the group: one head per unit
      // One word per thread at a time: the decode kernels sit at their register cap (168 at 384 / 320
      // threads), and their M is small.
      epi::build_slot_owners<1>(*owners, p.epi.slot_mapping, p.epi.index_slot_mapping, maps, p.m,
                             static_cast<int64_t>(w.tb) * NT, NT, t, kThreads, [] { ptx::bar_sync(kBarrier, kThreads); });
    }
  }
  mark(kMarkOwners);
  const epi::SlotOwners own = owners->view();
  if (rows <= kThreads / 32) {
    // Epilogue of a block with at most one token row per warp (decode at
    // small M): warp t/32 takes row t/32 (epi::lane_row_epilogue<32>, 4 values
    // per lane). The quad form below would give one quad the row's whole
    // 32-value chains while the other lanes idle: the last arriver's tail,
    // which is the kernel's.
    const int n = n0 + stride * (t / 32);
    if (t / 32 < rows) {  // warp-uniform
      const int64_t row = static_cast<int64_t>(w.tb) * NT + n;
      const TileRow src{T, n};
      if (p.acc_tap != nullptr) {
        const int lane = t % 32;
        float* dst = p.acc_tap + row * p.n + static_cast<int64_t>(w.head) * kHeadCols;
        *reinterpret_cast<float2*>(dst + 2 * lane) = src.load(2 * lane);
        *reinterpret_cast<float2*>(dst + kHeadCols / 2 + 2 * lane) = src.load(kHeadCols / 2 + 2 * lane);
      }
      epi::lane_row_epilogue<32>(p.epi, own, w.head, row, true, src);
    }
  } else if (rows <= 2 * (kThreads / 32)) {
    // Two rows per warp (epi::lane_row_epilogue<16>, 8 values per lane): the
    // block of up to 16 tokens in one round, chains 4x shorter than the quad
    // form's.
    const int i = 2 * (t / 32) + (t % 32) / 16;  // the warp's rows 2w, 2w + 1: lanes 0-15, 16-31
    if (2 * (t / 32) < rows) {                   // warp-uniform
      const bool valid = i < rows;
      const int n = n0 + stride * (valid ? i : 0);
      const int64_t row = static_cast<int64_t>(w.tb) * NT + n;
      const TileRow src{T, n};
      if (p.acc_tap != nullptr && valid) {
        const int l16 = t % 16;
        float* dst = p.acc_tap + row * p.n + static_cast<int64_t>(w.head) * kHeadCols;
#pragma unroll
        for (int c = 0; c < kHeadCols; c += 32) *reinterpret_cast<float2*>(dst + c + 2 * l16) = src.load(c + 2 * l16);
      }
      epi::lane_row_epilogue<16>(p.epi, own, w.head, row, valid, src);
    }
  } else {
    // Epilogue: quad t/4 takes token rows t/4, t/4 + kThreads/4, ...; lane q
    // holds columns 8j + 2q + b in y[2j + b] (epi::quad_row_epilogue's layout).
    const epi::QuadHead head = epi::quad_head(p.epi, w.head, q);
    // Trip counts warp-uniform: the bound is a multiple of 8 quads (NT % 8 == 0).
    const int bound = kSpread ? (rows + 7) / 8 * 8 : NT;
    for (int i = t / 4; i < bound; i += kThreads / 4) {
      if (i - i % 8 >= rows) break;  // warp-uniform: no row of this warp's 8 quads (a spread share)
      const bool valid = i < rows;
      const int n = n0 + stride * (valid ? i : 0);  // padding quads stay in T
      const int64_t row = static_cast<int64_t>(w.tb) * NT + n;
      float y[epi::kQuadValues];
#pragma unroll
      for (int j = 0; j < kHeadCols / 8; ++j) {
        const float2 v = *reinterpret_cast<const float2*>(T + tile_index(n, 8 * j + 2 * q));
        y[2 * j] = v.x;
        y[2 * j + 1] = v.y;
      }
      if (p.acc_tap != nullptr && valid) {
        float* dst = p.acc_tap + row * p.n + static_cast<int64_t>(w.head) * kHeadCols + 2 * q;
#pragma unroll
        for (int j = 0; j < kHeadCols / 8; ++j)
          *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(y[2 * j], y[2 * j + 1]);
      }
      epi::quad_row_epilogue</*kDecodeCvt=*/false>(p.epi, own, head, row, valid, y, q);  // 168-register kernels
    }
  }
}

// A (head, token block) counter word: arrivals of this launch in the low 16
// bits (S <= 64), and in the high 16 the generation finish_unit_spread's
// waiters watch (its last arriver moves it on and clears the count).
constexpr uint32_t kArrivalMask = 0xffffu;
constexpr uint32_t kGeneration = 0x10000u;

// The unit's partial rows n < mt from T into its workspace slot (T's
// unswizzled [nt][128] f32 form, which sum_partials reads).
template <int NT, int kThreads, class P>
__device__ __forceinline__ void store_partial(const P& p, int u, int t, const float* T, int mt) {
  float* slot = p.partials + static_cast<int64_t>(u) * NT * kHeadCols;
  for (int i = t; i < mt * (kHeadCols / 4); i += kThreads) {
    const int n = i / (kHeadCols / 4), c = 4 * (i % (kHeadCols / 4));
    *reinterpret_cast<float4*>(slot + n * kHeadCols + c) = *reinterpret_cast<const float4*>(T + tile_index(n, c));
  }
}

// Token rows n = n0 + stride·i (i < rows) of the block, each float4 item
// summed over the S partials in the fixed order s = 0, 1, ..., S-1 into T
// (this unit's own read back from T: the same bits as its slot; skip_split:
// finish_unit's). The last arriver passes the whole block (0, 1, its
// tokens), a spread rank its share (finish_unit_spread). Called by the
// group's kThreads threads; no barrier inside.
template <int NT, int kThreads, int kItems, int kBatch, class P>
__device__ __forceinline__ void sum_partials(const P& p, const Unit& w, int u, int t, float* T, int n0, int stride,
                                             int rows, int skip_split) {
  const float* base = p.partials + static_cast<int64_t>(u - w.s) * NT * kHeadCols;
  // Every float4 item's S partials, summed in the fixed order s = 0, 1,
  // ... (this unit's own read back from T: the same bits as its slot),
  // kItems items × kBatch splits per thread loaded together: one item at
  // a time, the last arriver waits one L2 round trip per item (16 at
  // NT = 128), on the critical path of its tile.
  if constexpr (kItems == 1) {
    // The form the SM100 decode kernel's 168 registers were fitted to
    // (the multi-item loop below spills there even with one item).
    for (int i = t; i < rows * (kHeadCols / 4); i += kThreads) {
      const int n = n0 + stride * (i / (kHeadCols / 4)), c = 4 * (i % (kHeadCols / 4));
      float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
      bool have = false;
      for (int s0 = 0; s0 < p.split; s0 += kBatch) {
        float4 v[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          const int s = s0 + j < p.split ? s0 + j : w.s;
          v[j] = s == w.s ? *reinterpret_cast<const float4*>(T + tile_index(n, c))
                          : __ldcg(reinterpret_cast<const float4*>(base + static_cast<int64_t>(s) * NT * kHeadCols +
                                                                   n * kHeadCols + c));
        }
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          if (s0 + j >= p.split) break;
          if (s0 + j == skip_split) continue;
          if (!have) {
            sum = v[j];
            have = true;
          } else {
            sum.x = add_rn(sum.x, v[j].x);
            sum.y = add_rn(sum.y, v[j].y);
            sum.z = add_rn(sum.z, v[j].z);
            sum.w = add_rn(sum.w, v[j].w);
          }
        }
      }
      *reinterpret_cast<float4*>(T + tile_index(n, c)) = sum;
    }
  } else {
    const int total = rows * (kHeadCols / 4);
    for (int i0 = t; i0 < total; i0 += kThreads * kItems) {
      float4 sum[kItems];
      bool have = false;
      for (int s0 = 0; s0 < p.split; s0 += kBatch) {
        float4 v[kItems][kBatch];
#pragma unroll
        for (int it = 0; it < kItems; ++it) {
          const int i = i0 + it * kThreads;
          const int n = n0 + stride * (i / (kHeadCols / 4)), c = 4 * (i % (kHeadCols / 4));
#pragma unroll
          for (int j = 0; j < kBatch; ++j) {
            const int s = s0 + j < p.split ? s0 + j : w.s;
            v[it][j] = i >= total ? make_float4(0.f, 0.f, 0.f, 0.f)
                       : s == w.s   ? *reinterpret_cast<const float4*>(T + tile_index(n, c))
                                    : __ldcg(reinterpret_cast<const float4*>(
                                        base + static_cast<int64_t>(s) * NT * kHeadCols + n * kHeadCols + c));
          }
        }
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          if (s0 + j >= p.split) break;
          if (s0 + j == skip_split) continue;
#pragma unroll
          for (int it = 0; it < kItems; ++it) {
            if (!have) {
              sum[it] = v[it][j];
            } else {
              sum[it].x = add_rn(sum[it].x, v[it][j].x);
              sum[it].y = add_rn(sum[it].y, v[it][j].y);
              sum[it].z = add_rn(sum[it].z, v[it][j].z);
              sum[it].w = add_rn(sum[it].w, v[it][j].w);
            }
          }
          have = true;
        }
      }
#pragma unroll
      for (int it = 0; it < kItems; ++it) {
        const int i = i0 + it * kThreads;
        if (i < total)
          *reinterpret_cast<float4*>(T + tile_index(n0 + stride * (i / (kHeadCols / 4)), 4 * (i % (kHeadCols / 4)))) =
              sum[it];
      }
    }
  }
}

// Called by the kThreads threads of the group (t = 0 .. kThreads-1; whole
// warps, t % 32 = lane) after T holds the unit's partial and the group met at
// bar.sync kBarrier. `P` provides the launch's fields m, split, token_blocks,
// counters (zero between launches; the last arriver resets its own), partials
// ([units][NT][128] f32 slots), acc_tap (test only: f32 [M, n] or null), n
// and epi. `skip_split` (test only, -1 = none): the last arriver leaves that
// split's partial out of the sum (the negative test of the bookkeeping).
// `mark(step)` runs in every thread at each Mark step (timeline hook).
// Returns whether this unit was the last arriver; ends with a barrier after
// which T may be overwritten.
// `owners`: the group's slot-owner table (shared memory), filled by the last
// arriver for its token block before the epilogue. kItems × kBatch: the
// partial loads each thread of the last arriver keeps in flight (float4s;
// as many as the kernel's registers allow without spilling).
template <int NT, int kThreads, uint32_t kBarrier, int kItems = 1, int kBatch = 4, class P, class MarkFn>
__device__ __forceinline__ bool finish_unit(const P& p, const Unit& w, int u, int t, float* T,
                                            epi::SlotOwnerTable<NT>* owners, volatile uint32_t* flag, int skip_split,
                                            bool spread, MarkFn&& mark) {
  static_assert(kThreads % 32 == 0 && NT % 8 == 0, "whole warps; quads cover 8-token groups");
  const int mt = block_tokens(p.m, w.tb, NT);
  bool last = true;
  int n0 = 0, rows = mt;  // the block's rows this unit finishes (if it does)
  if (p.split > 1) {
    store_partial<NT, kThreads>(p, u, t, T, mt);
    ptx::bar_sync(kBarrier, kThreads);
    if (t == 0) {
      uint32_t* counter = p.counters + w.head * p.token_blocks + w.tb;
      // One acq_rel arrival: its release covers the whole group's partial
      // stores (the barrier above orders them before it; PTX memory model:
      // release is cumulative), its acquire the reads of the other units'
      // partials after the barrier below: one fence (MEMBAR.ALL.GPU), not the
      // two sequentially consistent ones of __threadfence around an add.
      const uint32_t old = ptx::atom_add_acq_rel_gpu_u32(counter, 1u);
      const bool is_last = (old & kArrivalMask) == static_cast<uint32_t>(p.split - 1);
      if (spread) {
        // Every unit waits for the block's last arrival: the old value
        // carries the generation g of this launch's meeting (it moves only
        // once all S have arrived, this unit included); the last arriver
        // starts g + 1 with a zero count (st.release: causality order is
        // transitive, so a waiter's acquire of it also orders the other
        // units' partials before its reads).
        if (is_last)
          ptx::st_release_gpu_u32(counter, (old & ~kArrivalMask) + kGeneration);
        else
          while (((ptx::ld_acquire_gpu_u32(counter) ^ old) & ~kArrivalMask) == 0u) __nanosleep(32);
      } else if (is_last) {
        *counter = 0u;  // ready for the next launch (stream-ordered after this one)
      }
      *flag = is_last || spread ? 1u : 0u;
    }
    ptx::bar_sync(kBarrier, kThreads);
    last = *flag != 0u;
    mark(kMarkArrived);
    if (spread) {  // split s finishes rows [s·R, (s + 1)·R) of the block, R = ceil(mt / S)
      const int share = (mt + p.split - 1) / p.split;
      n0 = w.s * share < mt ? w.s * share : mt;
      rows = mt - n0 < share ? mt - n0 : share;
    }
    if (last) {
      sum_partials<NT, kThreads, kItems, kBatch>(p, w, u, t, T, n0, 1, rows, skip_split);
      ptx::bar_sync(kBarrier, kThreads);
      mark(kMarkSummed);
    }
  }
  if (last && rows > 0) epilogue_rows<NT, kThreads, kBarrier, /*kSpread=*/false>(p, w, t, T, owners, n0, 1, rows, mark);
  // T is reused by the next unit.
  ptx::bar_sync(kBarrier, kThreads);
  return spread ? w.s == 0 : last;
}

// The end of a unit whose S units run as one 1-D cluster (rank = the unit's
// split s; sm90::cluster_plan), for the kThreads threads of the group after
// T holds the unit's partial and the group met at bar.sync kBarrier. Every
// rank holds its partial in its own T; rank r sums token rows r, r + S, ...
// of all S tiles in the fixed order rank 0, 1, ..., S-1 (the same additions
// as finish_unit's, so the same bits) through distributed shared memory into
// its own T and runs their epilogue.
// Protocol, per unit (both barriers count S - 1 arrivals, one per peer, and
// complete once per unit; `parity` = units this CTA walked, mod 2): one
// thread arrives on every peer's red_full (release.cluster, after the
// bar.sync that orders the group's T writes), the group waits its own
// red_full (acquire.cluster), pulls, meets, one thread arrives on every
// peer's red_empty; the epilogue; the group waits its red_empty before T may
// be overwritten. A peer's next red_full arrival comes after that wait, so no
// phase is overtaken.
template <int NT, int kThreads, uint32_t kBarrier, class P, class MarkFn>
__device__ __forceinline__ void finish_unit_cluster(const P& p, const Unit& w, int t, float* T, uint32_t t_smem,
                                                    epi::SlotOwnerTable<NT>* owners, uint32_t red_full,
                                                    uint32_t red_empty, uint32_t parity, MarkFn&& mark) {
  constexpr int kBatch = 4;
  const int S = p.split;
  const uint32_t rank = static_cast<uint32_t>(w.s);
  if (t == 0)
    for (int r = 0; r < S; ++r)
      if (static_cast<uint32_t>(r) != rank) ptx::mbarrier_arrive_remote(ptx::mapa_shared_cluster(red_full, r));
  ptx::mbarrier_wait_cluster(red_full, parity);
  mark(kMarkArrived);
  const int mt = block_tokens(p.m, w.tb, NT);
  const int rows = mt > w.s ? (mt - w.s + S - 1) / S : 0;  // this rank's token rows
  for (int i = t; i < rows * (kHeadCols / 4); i += kThreads) {
    const int n = w.s + S * (i / (kHeadCols / 4)), c = 4 * (i % (kHeadCols / 4));
    const uint32_t at = t_smem + 4u * static_cast<uint32_t>(tile_index(n, c));
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int r0 = 0; r0 < S; r0 += kBatch) {  // kBatch peers' loads in flight
      float4 v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (r0 + j < S) v[j] = ptx::ld_shared_cluster_v4_f32(ptx::mapa_shared_cluster(at, r0 + j));
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (r0 + j == 0) {
          sum = v[0];
        } else if (r0 + j < S) {
          sum.x = add_rn(sum.x, v[j].x);
          sum.y = add_rn(sum.y, v[j].y);
          sum.z = add_rn(sum.z, v[j].z);
          sum.w = add_rn(sum.w, v[j].w);
        }
    }
    *reinterpret_cast<float4*>(T + tile_index(n, c)) = sum;
  }
  ptx::bar_sync(kBarrier, kThreads);
  if (t == 0)
    for (int r = 0; r < S; ++r)
      if (static_cast<uint32_t>(r) != rank) ptx::mbarrier_arrive_remote(ptx::mapa_shared_cluster(red_empty, r));
  mark(kMarkSummed);
  if (rows > 0) epilogue_rows<NT, kThreads, kBarrier, /*kSpread=*/true>(p, w, t, T, owners, w.s, S, rows, mark);
  ptx::mbarrier_wait_cluster(red_empty, parity);
  // T is reused by the next unit.
  ptx::bar_sync(kBarrier, kThreads);
}

}  // namespace m3qkv::splitk
