// The docs/contract.md §3 epilogue of one (token row, head) held by L = 8, 16 or 32
// lanes (lane_row_epilogue<L>): the forms between the quad form
// (epilogue_quad.cuh, 4 lanes of 32 values) and one row per warp.
//  * L = 32, warp rows: the form for few rows (the standalone insert at small
//    M, the split-K decode kernels' last arriver when its token block has at
//    most one row per warp). With few rows the quad form's serial chain of
//    32 values per lane (norm, RoPE, encode; for NVFP4 eight group scales) is
//    the kernel's critical path with nothing to hide it; here a lane holds
//    4 values, a row's chain is ~8x shorter.
//  * L = 8 / 16 (the standalone insert at mid M): 32 / L rows per warp, 16 /
//    8 values per lane: the chain of a row 2-4x shorter than the quad form's,
//    and the norm sums (below) repeated in 2 / 4 lane groups instead of 8.
// Device only. The row comes from the caller's source `src`: src.load(c)
// reads columns c, c + 1 (c even) as a Word, and Src::unpack(word) gives them
// as f32 (Bf16Row: a bf16 row in global memory, kept packed until used; the
// decode kernels: their f32 tile in shared memory, splitk::TileRow).
//
// Lane layout: the row's lanes are r = 0 .. L-1 (r = lane % L), r = 4k + q
// (q = r % 4, k = r / 4 < K = L / 4). Lane r holds the quad layout's units
// j = k + K·i (i = 0 .. 16/K - 1) of lane q: columns 8j + 2q + b in
// y[2i + b] (b = 0, 1). Why the result equals epi::epilogue_head_row bit for
// bit:
//  * RMSNorm: every lane also sees its row in the quad layout of its q (unit
//    j of class q is lane 4(j % K) + q's unit j / K: a shuffle within the
//    row; the decode kernels' shared-memory source loads it again instead,
//    Src::kSumsFromLanes) and runs the serial fma chain s_q of docs/contract.md §3.1
//    exactly as quad_row_epilogue does; rms_inv of the quad's four sums, the
//    same in every quad.
//  * RoPE: pair (i, i + 32), i < 32, is column 8j + 2q + b (j < 4) with
//    8(j + 4) + 2q + b. For K <= 4, unit j + 4 = k + K(i + 4/K) is the same
//    lane's; for K = 8 it is y[b] of lane r ^ 16, and both lanes evaluate
//    rope_pair on the same (u, v, cos, sin) and keep their own output.
//    Columns >= 64 have no RoPE.
//  * NVFP4 group g = units 2g, 2g + 1 = lanes k, k ^ 1 of each quad lane q:
//    lane r's unit i is in group k / 2 + (K / 2)·i; amax by max-reduction
//    over lanes r ^ 1, ^ 2, ^ 4 (max ignoring NaN, from +0: order-free), then
//    the same group-scale and encoder primitives in every lane of the group.
//  * FP8 / BF16 caches, q outputs: element-wise, the same pack_* primitives.
//  * Stores: unit j of lane q belongs at row byte (4j + q)·U (U = 1 NVFP4
//    byte, 2 e4m3 pair, 4 bf16 pair): unit i of lane r at (r + L·i)·U, so
//    each store instruction writes L·U contiguous bytes of each of its rows.
//  * Destination, guards, flags: row_inputs() / row_dest(), shared with the
//    quad form. Rows that are not `valid` compute but store nothing (the
//    shuffles need every lane of the warp).
//
// Alignment: the q / cache row starts of epilogue_quad.cuh (kRowStoreAlign);
// every store here is U-byte aligned within them; the NVFP4 scales are byte
// stores (L = 8, linear: one aligned 8-byte store of the token's scales).
#pragma once

#include "common/epilogue_quad.cuh"

namespace m3qkv {
namespace epi {

// A head row of 128 bf16 in global memory (4-B aligned) as warp_row_epilogue's source.
struct Bf16Row {
  using Word = uint32_t;  // two bf16: 16 registers for the quad-layout view, not 32
  const uint16_t* row;
  // As a word index (c / 2): simpler addresses than row + c (the insert kernels: 88 / 56 registers, not 102 / 63).
  __device__ __forceinline__ Word load(int c) const { return reinterpret_cast<const uint32_t*>(row)[c / 2]; }
  __device__ __forceinline__ static float2 unpack(Word w) {
    return make_float2(bf16_to_f32(static_cast<uint16_t>(w & 0xffffu)), bf16_to_f32(static_cast<uint16_t>(w >> 16)));
  }
  // The norm sums' words by shuffles from the row's lanes (lane_row_epilogue),
  // not a second load of the row: a loaded copy would hold 16 more words per
  // lane through round 1, and the shuffles keep every lane-row insert kernel
  // at <= 64 registers, i.e. 8 CTAs per SM (ptxas sm_90a).
  static constexpr bool kSumsFromLanes = true;
};

// Units and values per lane of the L-lane form.
template <int L>
struct LaneRow {
  static_assert(L == 8 || L == 16 || L == 32, "8, 16 or 32 lanes per row");
  static constexpr int kK = L / 4;          // lane r = 4k + q holds units j = k + kK·i
  static constexpr int kUnits = 16 / kK;    // units (value pairs) per lane
  static constexpr int kRowsPerWarp = 32 / L;
};

// Which heads a caller passes: any, only cache heads (k, v, index_k) or only
// q / index_q heads. A caller that runs both classes in separate loops (the
// insert's split layouts) instantiates one form per class without the other
// class's branches: half the code of two kAny forms (with two kAny forms
// the split kernel stalls on instruction fetch).
enum class RowHeads { kAny, kCache, kQuery };

// The epilogue of token `row` for head `head`, its 128 values from `src`.
// Called by every lane of the warp; the L lanes of a row pass the same
// (row, valid), every lane of the warp the same head, of the class H says.
// guess: row_guess's guess for this (row, head), made before
// griddepcontrol.wait (the standalone insert), or null (every input read
// here, in two rounds).
template <int L, RowHeads H = RowHeads::kAny, class Src>
__device__ __forceinline__ void lane_row_epilogue(const EpilogueParams& e, const SlotOwners& own, int head, int64_t row,
                                                  bool valid, const Src& src, const RowGuess* guess = nullptr) {
  constexpr bool kMayQuery = H != RowHeads::kCache, kMayCache = H != RowHeads::kQuery;
  constexpr int K = LaneRow<L>::kK, NU = LaneRow<L>::kUnits;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int r = lane % L, k = r / 4, q = r % 4;
  const HeadInfo hi = head_info(head, e.nq, e.nkv, e.niq);
  const HeadKind kind = hi.kind;
  const bool norm = !kMayCache || kind != HeadKind::V;

  // Round 1: the lane's units, the quad-layout words of the sums, the norm
  // weights, and (row_inputs) the slot and position.
  using Word = typename Src::Word;
  Word w[NU];
#pragma unroll
  for (int i = 0; i < NU; ++i) w[i] = src.load(2 * r + 2 * L * i);  // column 8(k + K·i) + 2q
  // The quad-layout words of the norm sums (unit j of class q for j = 0 ..
  // 15): with Src::kSumsFromLanes from the row's own lanes after round 1
  // (sum_word), else loaded here (the decode kernels' shared-memory tile).
  constexpr bool kShuffleSums = Src::kSumsFromLanes;
  Word qw[kShuffleSums ? 1 : kHeadDim / 8];
  if constexpr (!kShuffleSums) {
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) qw[j] = norm ? src.load(8 * j + 2 * q) : Word{};
  }
  const uint32_t* wt = reinterpret_cast<const uint32_t*>(norm_weight(e, kind));
  uint32_t nw[NU];
#pragma unroll
  for (int i = 0; i < NU; ++i) nw[i] = norm ? wt[r + L * i] : 0u;  // word 4(k + K·i) + q
  const RowInputs in = row_inputs(e, hi, row, valid);
  // Round 2 (with a guess: round 1, at the guessed position): the cos and
  // sin words of this lane's RoPE pairs (units j < 4: pair 8j + 2q + b at
  // word 4j + q). K = 8: lane r and r ^ 16 share a pair.
  constexpr int kRopeUnits = K <= 4 ? 4 / K : 1;
  uint32_t cw[kRopeUnits], sw[kRopeUnits];
  auto load_cos_sin = [&](int64_t pos) {
    const uint32_t* cs_w = reinterpret_cast<const uint32_t*>(e.cos_sin_cache + pos * kRopeDim);
#pragma unroll
    for (int i = 0; i < kRopeUnits; ++i) {
      const int word = K <= 4 ? r + L * i : r % 16;  // 4j + q
      cw[i] = norm ? cs_w[word] : 0u;
      sw[i] = norm ? cs_w[kRopeHalf / 2 + word] : 0u;
    }
  };
  load_cos_sin(guess != nullptr ? guess->in.pos : in.pos);
  const bool owner = row_owns(own, hi, in, row);
  RowDest d;
  if (guess != nullptr) {
    // The guess stands where the slot and position words read now match it
    // (nothing else of the row's inputs enters row_dest); otherwise the
    // row is resolved again and its cos / sin read again (a per-row branch
    // without shuffles).
    if (in.pos != guess->in.pos) load_cos_sin(in.pos);
    if constexpr (kRowGuessDest<L>) {
      uint32_t bits = guess->bits;
      d = guess->d;
      if (!owner || in.slot_raw != guess->in.slot_raw || in.pos_raw != guess->in.pos_raw) {
        bits = 0;
        d = row_dest_quiet(e, hi, in, valid, owner, &bits);
      }
      if (bits != 0) set_flag(e.error_flags, bits);
    } else {
      d = row_dest(e, hi, in, valid, owner);
    }
  } else {
    d = row_dest(e, hi, in, valid, owner);
  }

  float y[2 * NU];
#pragma unroll
  for (int i = 0; i < NU; ++i) {
    const float2 v = Src::unpack(w[i]);
    y[2 * i] = v.x;
    y[2 * i + 1] = v.y;
  }
  if (norm) {
    float s = 0.0f;  // s_q: class q's columns 8j + 2q + b in ascending order
    // Unit j is lane 4(j % K) + q's w[j / K] in the same row (the layout
    // above), the same word the load would read.
    const int row_q = lane - r + q;
    auto sum_word = [&](int j) -> Word {
      if constexpr (kShuffleSums) {
        return __shfl_sync(0xffffffffu, w[j / K], row_q + 4 * (j % K));
      } else {
        return qw[j];
      }
    };
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) {
      const float2 v = Src::unpack(sum_word(j));
      s = fma_rn(v.x, v.x, s);
      s = fma_rn(v.y, v.y, s);
    }
    const float rs = rms_inv(quad_lane(s, 0), quad_lane(s, 1), quad_lane(s, 2), quad_lane(s, 3), e.eps);
#pragma unroll
    for (int i = 0; i < NU; ++i) {
      y[2 * i] = rms_apply(y[2 * i], rs, bf16_to_f32(static_cast<uint16_t>(nw[i] & 0xffffu)));
      y[2 * i + 1] = rms_apply(y[2 * i + 1], rs, bf16_to_f32(static_cast<uint16_t>(nw[i] >> 16)));
    }
#pragma unroll
    for (int i = 0; i < kRopeUnits; ++i) {
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const float co = bf16_to_f32(static_cast<uint16_t>(cw[i] >> (16 * b)));
        const float si = bf16_to_f32(static_cast<uint16_t>(sw[i] >> (16 * b)));
        if constexpr (K <= 4) {  // u = unit i, v = unit i + 4/K of this lane
          rope_pair(y[2 * i + b], y[2 * (i + 4 / K) + b], co, si, &y[2 * i + b], &y[2 * (i + 4 / K) + b]);
        } else {  // lanes r < 16 hold u = column i < 32, the partner r ^ 16 holds v = column i + 32
          const bool lo = r < 16;
          const float other = __shfl_xor_sync(0xffffffffu, y[b], 16);
          float u, v;
          rope_pair(lo ? y[b] : other, lo ? other : y[b], co, si, &u, &v);
          y[b] = lo ? u : v;
        }
      }
    }
  }

  // Stores: unit i at row byte (r + L·i)·U.
  if (kMayQuery && kind == HeadKind::Q) {
    if (!valid) return;  // no shuffles below
    const int64_t off = (row * e.nq + hi.index) * kHeadDim;  // the row's element 0
    if (e.q_out != nullptr) {
      uint32_t* o = reinterpret_cast<uint32_t*>(e.q_out + off);
#pragma unroll
      for (int i = 0; i < NU; ++i) o[r + L * i] = pack_bf16x2(y[2 * i], y[2 * i + 1]);
    }
    if (e.q_fp8_out != nullptr) {
      uint16_t* o = reinterpret_cast<uint16_t*>(e.q_fp8_out + off);
#pragma unroll
      for (int i = 0; i < NU; ++i)
        o[r + L * i] = static_cast<uint16_t>(pack_e4m3x2(mul_rn(y[2 * i], e.qinv), mul_rn(y[2 * i + 1], e.qinv)));
    }
  } else if (kMayQuery && kind == HeadKind::IndexQ) {
    if (!valid) return;
    uint16_t* o = reinterpret_cast<uint16_t*>(e.index_q_out + (row * e.niq + hi.index) * kHeadDim);
#pragma unroll
    for (int i = 0; i < NU; ++i) o[r + L * i] = static_cast<uint16_t>(pack_e4m3x2(y[2 * i], y[2 * i + 1]));
  } else if constexpr (kMayCache) {
    if (d.cache_dtype != kCacheNvfp4) {
      if (!d.to_cache) return;  // false unless valid; no shuffles below
      // index_k: unit scale as a multiply by 1, identical bytes (epi::flat_store_head says why).
      const float sf = kind == HeadKind::K ? e.k_sf : kind == HeadKind::V ? e.v_sf : 1.0f;
      if (d.cache_dtype == kCacheFp8) {
        uint16_t* o = reinterpret_cast<uint16_t*>(d.slot_base);
#pragma unroll
        for (int i = 0; i < NU; ++i)
          o[r + L * i] = static_cast<uint16_t>(pack_e4m3x2(mul_rn(y[2 * i], sf), mul_rn(y[2 * i + 1], sf)));
      } else {
        uint32_t* o = reinterpret_cast<uint32_t*>(d.slot_base);
#pragma unroll
        for (int i = 0; i < NU; ++i) o[r + L * i] = pack_bf16x2(y[2 * i], y[2 * i + 1]);
      }
    } else {
      // Warp rows: the warp holds one row, so the guard is warp-uniform and
      // may skip the shuffles; with several rows per warp every lane takes them.
      if (K == 8 && !d.to_cache) return;
      const bool has_sf = kind != HeadKind::IndexK;
      const float sf = kind == HeadKind::K ? e.k_sf : e.v_sf;
      float a[NU];  // unit i's group k / 2 + (K / 2)·i
#pragma unroll
      for (int i = 0; i < NU; ++i) a[i] = max_num(max_num(0.0f, abs_f32(y[2 * i])), abs_f32(y[2 * i + 1]));
#pragma unroll
      for (int m = 1; m <= 4; m *= 2)
#pragma unroll
        for (int i = 0; i < NU; ++i) a[i] = max_num(a[i], __shfl_xor_sync(0xffffffffu, a[i], m));
      float rc[NU];
      uint32_t s2[NU / 2];  // the scale bytes of units 2i' (low) and 2i' + 1
#pragma unroll
      for (int i = 0; i < NU; i += 2)
        s2[i / 2] = nvfp4_group_scale2_dev(a[i], a[i + 1], has_sf, sf, &rc[i], &rc[i + 1]);
      if (!d.to_cache) return;  // no shuffles below
      uint8_t* data = d.slot_base + nvfp4_data_offset(d.sa.token, 0);
#pragma unroll
      for (int i = 0; i < NU; ++i) data[r + L * i] = static_cast<uint8_t>(nvfp4_encode2(y[2 * i], y[2 * i + 1], rc[i]));
      // Lanes q = 0 with k even hold groups k / 2 + (K / 2)·i and store them
      // (byte stores from one address: no gather of the eight bytes into one
      // lane, whose shuffles were on the row's critical path). L = 8: lane 0
      // holds all eight, in the linear layout one 8-byte store.
      if (q == 0 && k % 2 == 0) {
        const bool v = kind == HeadKind::V;
        bool stored = false;
        if constexpr (K == 2) {
          if (!v) {
            *reinterpret_cast<uint2*>(d.slot_base + nvfp4_scale_offset_linear(d.sa.token, 0, e.block_size)) =
                make_uint2(s2[0] | s2[1] << 16, s2[2] | s2[3] << 16);
            stored = true;
          }
        }
        if (!stored) {
          const int g0 = k / 2;
          uint8_t* s = d.slot_base + (v ? nvfp4_scale_offset_v(d.sa.token, g0, e.block_size)
                                        : nvfp4_scale_offset_linear(d.sa.token, g0, e.block_size));
#pragma unroll
          for (int i = 0; i < NU; ++i)
            s[nvfp4_scale_group_delta(v, K / 2 * i)] = static_cast<uint8_t>(s2[i / 2] >> (8 * (i % 2)));
        }
      }
    }
  }
}

}  // namespace epi
}  // namespace m3qkv
