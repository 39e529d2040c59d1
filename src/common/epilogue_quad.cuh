// The docs/contract.md §3 epilogue of one (token row, head) held by a QUAD of lanes — the
// register-resident form every fragment-shaped kernel shares (the SM90 fused
// kernel's wgmma fragment, the SM90 decode kernel's reduced tile). Device only:
// the quad meets through warp shuffles.
//
// Quad layout: lane q = lane % 4 of the quad holds the 32 columns
// c = 8j + 2q + b (j = 0..15, b = 0, 1) of the row in y[2j + b]. Why the
// result equals epi::epilogue_head_row bit for bit:
//  * RMSNorm: cls(c) = (c >> 1) & 3 = q, so lane q holds exactly class q of its
//    row and visits it in ascending column order (j, then b): its serial fma
//    chain IS s_q of docs/contract.md §3.1. The four sums meet through quad shuffles and
//    every lane evaluates rms_inv(s0, s1, s2, s3) in the contract order.
//  * RoPE: pair (i, i + 32), i < 32, is (j, b) and (j + 4, b) of the same lane.
//  * NVFP4 group g = columns 16g..16g+15 = j in {2g, 2g+1} of the four quad
//    lanes: amax by quad max-reduction (max ignoring NaN, from +0, does not
//    depend on the order), then the same group-scale and encoder primitives.
//  * FP8 / BF16 caches (docs/contract.md §4.3) are element-wise: each lane encodes its own
//    columns with the same pack_* primitives.
//  * Stores: every value goes where common/layouts.h puts it, but not from
//    the lane that computed it: each output row is stored as 16-byte chunks
//    after a quad transpose (quad_store_row, common/quad_store.h), the same
//    bytes as one store per j and value, in fewer and wider stores.
//  * Side effects (flags, stores) happen under the same conditions as in
//    epi::epilogue_head_row; rows that are not `valid` compute but store
//    nothing (the shuffles need every lane of the warp).
//
// Alignment of the 16-byte chunk stores (kRowStoreAlign; api/validate.cpp
// rejects anything else as M3QKV_ERROR_MISALIGNED / INVALID_SHAPE, and its
// static asserts tie its constants to kRowStoreAlign). A chunk sits at
// row start + 16k, so each row start must be 16-B aligned:
//  * q_out, q_fp8_out, index_q_out: bases 16-B aligned (kWideAlign); rows of
//    128 elements, i.e. 256 / 128 / 128 bytes apart.
//  * FP8 / BF16 KV rows: kv_cache, v_cache 16-B aligned; page, token and head
//    strides multiples of 16 (kFlatStrideMultiple); the row starts at column 0.
//  * FP8 / BF16 index rows: index_cache 16-B aligned, index_page_stride % 16,
//    tokens 128·e bytes apart.
//  * NVFP4 data rows: kv_cache / index_cache 16-B aligned, page stride % 32
//    (kPageStrideMultiple), slots block_size·72 bytes apart with
//    block_size % 4 == 0 (a multiple of 288 = 16·18), tokens 64 bytes apart.
//  * NVFP4 linear scales (K, index_k; one 8-byte store): slot base 16-B
//    aligned + block_size·64 + t·8. V's 4-token swizzled scales are single
//    bytes 4 apart (one byte per group per token), stored as before.
#pragma once

#include "common/epilogue.cuh"
#include "common/slot_owners.cuh"
#include "common/quad_store.h"

namespace m3qkv {
namespace epi {

constexpr int kQuadValues = kHeadDim / 4;  // columns per lane of a quad

// The row stores below: 16 units per lane, rows of 64·U bytes (e4m3 128 B,
// bf16 256 B, NVFP4 data 64 B), each row start 16-B aligned (see above).
static_assert(kHeadDim / 8 == 16 && kNvfp4DataBytes == 64, "16 units of U bytes per lane: rows of 64·U bytes");
static_assert(kHeadDim % kRowStoreAlign == 0 && kNvfp4DataBytes % kRowStoreAlign == 0,
              "e4m3 / bf16 rows and NVFP4 data rows are 16 B apart");
static_assert(kNvfp4ScaleBytes == 8 && kNvfp4DataBytes % 8 == 0, "a token's linear scales: one aligned 8-byte store");

// One output row from the quad: lane q's 16 units of U bytes (unit j belongs
// at row byte (4j + q)·U) packed in w by quad_put_unit, stored as 16-byte
// chunks at `row` (16-B aligned, see above). Every lane of the warp calls it
// (the shuffles); `store`, the same over the quad, guards only the stores.
template <int U>
__device__ __forceinline__ void quad_store_row(uint8_t* row, const uint32_t (&w)[4 * U], int q, bool store) {
#pragma unroll
  for (int g = 0; g < U; ++g) {
    uint32_t t[4] = {w[4 * g], w[4 * g + 1], w[4 * g + 2], w[4 * g + 3]};
#pragma unroll
    for (int m = 1; m <= 2; m *= 2) {
#pragma unroll
      for (int p = 0; p < 2; ++p)
        quad_xpose_recv(t, q, m, p, __shfl_xor_sync(0xffffffffu, quad_xpose_send(t, q, m, p), m));
    }
    uint32_t c[4];
    quad_chunk_bytes<U>(t, c);
    if (store) *reinterpret_cast<uint4*>(row + quad_chunk_offset(q, g)) = make_uint4(c[0], c[1], c[2], c[3]);
  }
}

// Lane q of this lane's quad.
__device__ __forceinline__ float quad_lane(float v, int q) {
  return __shfl_sync(0xffffffffu, v, static_cast<int>((threadIdx.x & 28u) | static_cast<unsigned>(q)));
}

// The bf16 norm weights of a head kind (v has none: null).
__device__ __forceinline__ const uint16_t* norm_weight(const EpilogueParams& e, HeadKind kind) {
  return kind == HeadKind::Q        ? e.q_norm_weight
         : kind == HeadKind::K      ? e.k_norm_weight
         : kind == HeadKind::IndexQ ? e.index_q_norm_weight
         : kind == HeadKind::IndexK ? e.index_k_norm_weight
                                    : nullptr;
}

// Per-head constants of the quad epilogue: the head's kind and the bf16 norm
// weights of this lane's columns (8j + 2q, 8j + 2q + 1) as packed words.
struct QuadHead {
  HeadInfo hi;
  bool norm;  // RMSNorm + RoPE (every head but v)
  uint32_t wv[kHeadDim / 8];
};

__device__ __forceinline__ QuadHead quad_head(const EpilogueParams& e, int head, int q) {
  QuadHead h;
  h.hi = head_info(head, e.nq, e.nkv, e.niq);
  h.norm = h.hi.kind != HeadKind::V;
  const uint16_t* w = norm_weight(e, h.hi.kind);
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; ++j) h.wv[j] = h.norm ? *reinterpret_cast<const uint32_t*>(w + 8 * j + 2 * q) : 0u;
  return h;
}

// Where one (token row, head) goes, with the guards of epi::epilogue_head_row,
// for every lane layout (this quad form, the warp form of epilogue_warp.cuh),
// in the order of the two dependent load rounds:
//  1. row_inputs: the slot and position words (independent loads); the
//     position clamped without a flag, for the caller's RoPE cos/sin loads
//     (round 2), which it issues right away;
//  2. row_dest: the slot resolved (in the warp form its division overlaps
//     round 2) and the flags. The cos/sin row is read at the clamped
//     position even where the contract reads none (a skipped slot): a row
//     of the table, never stored.
// The standalone insert guesses both rounds before griddepcontrol.wait
// (row_guess, below) and only checks the guess after it.
struct RowInputs {
  int64_t slot_raw;  // -1 where the head has no cache row or the row is not valid
  int64_t pos_raw;   // 0 where the contract reads no position
  int64_t pos;       // pos_raw clamped to [0, max_position)
};

// kL2Only: ld.global.cg (__ldcg; PTX ISA "ld", cache operator .cg: cached
// in L2 and below, not in L1), which leaves no copy in L1: row_guess reads
// before griddepcontrol.wait, and a later plain load must not hit a line
// read then. kSlot = false: no slot read (slot_raw = -1), for row_guess
// without a destination, which would not use it (the .cg loads are volatile
// asm, which the compiler keeps even when unused).
template <bool kL2Only = false, bool kSlot = true>
__device__ __forceinline__ RowInputs row_inputs(const EpilogueParams& e, const HeadInfo& hi, int64_t row, bool valid) {
  const HeadKind kind = hi.kind;
  const bool kv = kind == HeadKind::K || kind == HeadKind::V;
  auto ld = [](const int64_t* a) -> int64_t {
    if constexpr (kL2Only) {
      return __ldcg(reinterpret_cast<const long long*>(a));
    } else {
      return *a;
    }
  };
  RowInputs in;
  in.slot_raw = !kSlot || !valid           ? -1
                : kv                       ? ld(e.slot_mapping + row)
                : kind == HeadKind::IndexK ? ld(e.index_slot_mapping + row)
                                           : -1;
  in.pos_raw = valid && kind != HeadKind::V ? ld(e.positions + row) : 0;
  in.pos = clamp_position_quiet(in.pos_raw, e.max_position);
  return in;
}

struct RowDest {
  bool to_cache;        // k / v / index_k with a slot in range
  SlotAddr sa;          // {0, 0} unless to_cache
  uint8_t* slot_base;   // NVFP4: the slot base; FP8 / BF16: the row (column 0); null unless to_cache
  int32_t cache_dtype;  // k, v: kv_dtype; index_k: ix_dtype
};

// The destination, and the M3QKV_FLAG_* bits the row raises. kQuiet: the
// bits are OR-ed into *bits (row_guess keeps them for after
// griddepcontrol.wait); else stored into e.error_flags as they arise (the
// form every other caller has, whose code the decode kernels' registers
// were fitted to: SM90 decode, 8 B of spills with one combined store).
// owner: whether the row owns its slot (row_owns); a row that does not is
// treated as one with a negative slot (docs/contract.md §4.4).
template <bool kQuiet>
__device__ __forceinline__ RowDest row_dest_flags(const EpilogueParams& e, const HeadInfo& hi, const RowInputs& in,
                                                  bool valid, bool owner, uint32_t* bits) {
  auto raise = [&](uint32_t bit) {
    if constexpr (kQuiet) {
      *bits |= bit;
    } else {
      set_flag(e.error_flags, bit);
    }
  };
  // A slot past the cache: resolve_slot flags it itself, or (kQuiet) the caller.
  auto resolve = [&](int64_t pages, uint32_t oob_bit, SlotAddr* sa) {
    if constexpr (kQuiet) {
      const bool ok = resolve_slot(in.slot_raw, pages, e.block_size, nullptr, 0, sa);
      if (!ok && in.slot_raw >= 0) *bits |= oob_bit;
      return ok;
    } else {
      return resolve_slot(in.slot_raw, pages, e.block_size, e.error_flags, oob_bit, sa);
    }
  };
  const HeadKind kind = hi.kind;
  const bool kv = kind == HeadKind::K || kind == HeadKind::V;
  RowDest d;
  d.to_cache = false;
  d.sa = {0, 0};
  d.slot_base = nullptr;
  // Uniform over the warp wherever the warp's lanes share a head (every caller).
  d.cache_dtype = kind == HeadKind::IndexK ? e.ix_dtype : e.kv_dtype;
  // Cache destination (k, v, index_k): resolved first, as epilogue_head_row does.
  if (valid && owner && kv) {
    d.to_cache = resolve(e.num_blocks, M3QKV_FLAG_SLOT_OUT_OF_RANGE, &d.sa);
    if (d.to_cache) {
      if (d.cache_dtype == kCacheNvfp4)
        d.slot_base = e.kv_cache + nvfp4_slot_base(d.sa.page, 2 * hi.index + (kind == HeadKind::K ? 0 : 1),
                                                   e.kv_page_stride, e.block_size);
      else
        d.slot_base = (kind == HeadKind::K ? e.kv_cache : e.v_cache) +
                      kv_flat_offset(d.sa.page, d.sa.token, hi.index, 0, e.kv_page_stride, e.kv_token_stride,
                                     e.kv_head_stride, flat_elem_bytes(d.cache_dtype));
    }
  } else if (valid && owner && kind == HeadKind::IndexK) {
    d.to_cache = resolve(e.num_index_blocks, M3QKV_FLAG_INDEX_SLOT_OUT_OF_RANGE, &d.sa);
    if (d.to_cache)
      d.slot_base = d.cache_dtype == kCacheNvfp4
                        ? e.index_cache + nvfp4_slot_base(d.sa.page, 0, e.index_page_stride, e.block_size)
                        : e.index_cache + index_flat_offset(d.sa.page, d.sa.token, 0, e.index_page_stride,
                                                            flat_elem_bytes(d.cache_dtype));
  }
  // The position flag only where epilogue_head_row reads the position.
  const bool reads_pos =
      kind != HeadKind::V && valid && (kind == HeadKind::Q || kind == HeadKind::IndexQ || d.to_cache);
  if (reads_pos && !position_in_range(in.pos_raw, e.max_position)) raise(M3QKV_FLAG_POSITION_OUT_OF_RANGE);
  return d;
}
__device__ __forceinline__ RowDest row_dest_quiet(const EpilogueParams& e, const HeadInfo& hi, const RowInputs& in,
                                                  bool valid, bool owner, uint32_t* bits) {
  return row_dest_flags<true>(e, hi, in, valid, owner, bits);
}
__device__ __forceinline__ RowDest row_dest(const EpilogueParams& e, const HeadInfo& hi, const RowInputs& in,
                                            bool valid, bool owner) {
  return row_dest_flags<false>(e, hi, in, valid, owner, nullptr);
}

// Whether `row` owns the cache slot `in` names (slot_owners.cuh); true for
// heads without a cache row and rows without a slot.
__device__ __forceinline__ bool row_owns(const SlotOwners& own, const HeadInfo& hi, const RowInputs& in,
                                         int64_t row) {
  return hi.kind == HeadKind::Q || hi.kind == HeadKind::IndexQ || own.owns(in.slot_raw, hi.kind == HeadKind::IndexK, row);
}

// The standalone insert's guess of a row's inputs and destination, made
// before griddepcontrol.wait from L2-only reads (row_inputs<true>): the
// slot and position may still be the predecessor grid's to write, so the
// epilogue loads them again after the wait and uses the guess only where
// both words match (lane_row_epilogue). What the guess buys: the cos/sin
// words load in the first round after the wait, at the guessed position,
// and the slot division and address are off the post-wait path (each
// dependent load round after the wait is ~1,000 cycles at small M on the
// H200).
// kDest: the destination guessed too (warp rows, kRowGuessDest<L>), else
// only the position (d / bits stay unset and unread). Guessing it for every
// L would take the 8-lane kernel to 80 registers (6 CTAs per SM instead of
// 8; ptxas sm_90a).
template <int L>
constexpr bool kRowGuessDest = L == 32;
struct RowGuess {
  RowInputs in;
  RowDest d;
  uint32_t bits;  // flags row_dest would raise for `in`
};
template <bool kDest>
__device__ __forceinline__ RowGuess row_guess(const EpilogueParams& e, const HeadInfo& hi, int64_t row, bool valid) {
  RowGuess s{};
  s.in = row_inputs<true, kDest>(e, hi, row, valid);
  s.bits = 0;
  // Ownership is not known before the wait: the guess assumes it, and
  // lane_row_epilogue resolves again where the row turns out not to own it.
  if constexpr (kDest) s.d = row_dest_quiet(e, hi, s.in, valid, /*owner=*/true, &s.bits);
  return s;
}

// The whole epilogue of token `row` for head `h` on this lane's 32 values
// (modified in place). Called by every lane of the warp; `valid` (the same
// for the four lanes of a quad) says whether the row exists and is this
// caller's to store. kDecodeCvt: the NVFP4 scales' form
// (nvfp4_group_scale2_dev; false where registers are tight: the decode kernels).
template <bool kDecodeCvt = true>
__device__ __forceinline__ void quad_row_epilogue(const EpilogueParams& e, const SlotOwners& own, const QuadHead& h,
                                                  int64_t row, bool valid, float (&y)[kQuadValues], int q) {
  const HeadKind kind = h.hi.kind;
  const int c0 = 2 * q;

  // The slot resolved before the cos/sin loads (not between the rounds, as
  // the warp form does): the quad form's eight cos/sin words live across the
  // division would push the SM90 decode kernel (168 registers) into spills.
  const RowInputs in = row_inputs(e, h.hi, row, valid);
  const RowDest d = row_dest(e, h.hi, in, valid, row_owns(own, h.hi, in, row));
  const bool to_cache = d.to_cache;
  const SlotAddr sa = d.sa;
  uint8_t* const slot_base = d.slot_base;
  const int32_t cache_dtype = d.cache_dtype;
  constexpr int kCsWords = kRopeHalf / 8;  // cos (and sin) words per lane
  uint32_t cs_w[kCsWords], sn_w[kCsWords];
  const uint16_t* cs = e.cos_sin_cache + in.pos * kRopeDim;
#pragma unroll
  for (int j = 0; j < kCsWords; ++j) {
    cs_w[j] = h.norm ? *reinterpret_cast<const uint32_t*>(cs + 8 * j + c0) : 0u;
    sn_w[j] = h.norm ? *reinterpret_cast<const uint32_t*>(cs + kRopeHalf + 8 * j + c0) : 0u;
  }

  if (h.norm) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kQuadValues; ++i) s = fma_rn(y[i], y[i], s);
    const float r = rms_inv(quad_lane(s, 0), quad_lane(s, 1), quad_lane(s, 2), quad_lane(s, 3), e.eps);
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) {
      y[2 * j] = rms_apply(y[2 * j], r, bf16_to_f32(static_cast<uint16_t>(h.wv[j] & 0xffffu)));
      y[2 * j + 1] = rms_apply(y[2 * j + 1], r, bf16_to_f32(static_cast<uint16_t>(h.wv[j] >> 16)));
    }
#pragma unroll
    for (int j = 0; j < kCsWords; ++j) {
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const float co = bf16_to_f32(static_cast<uint16_t>(cs_w[j] >> (16 * b)));
        const float si = bf16_to_f32(static_cast<uint16_t>(sn_w[j] >> (16 * b)));
        const float u = y[2 * j + b];
        const float v = y[2 * (j + kRopeHalf / 8) + b];
        rope_pair(u, v, co, si, &y[2 * j + b], &y[2 * (j + kRopeHalf / 8) + b]);
      }
    }
  }

  // Stores: lane q's unit j (an e4m3 pair: U = 2, a bf16 pair: U = 4, one
  // NVFP4 byte: U = 1) belongs at byte (4j + q)·U of its row.
  if (kind == HeadKind::Q) {
    const int64_t off = (row * e.nq + h.hi.index) * kHeadDim;  // the row's element 0
    if (e.q_out != nullptr) {
      uint32_t w[4 * 4] = {};
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j) quad_put_unit<4>(w, j, pack_bf16x2(y[2 * j], y[2 * j + 1]));
      quad_store_row<4>(reinterpret_cast<uint8_t*>(e.q_out + off), w, q, valid);
    }
    if (e.q_fp8_out != nullptr) {
      uint32_t w[4 * 2] = {};
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j)
        quad_put_unit<2>(w, j, pack_e4m3x2(mul_rn(y[2 * j], e.qinv), mul_rn(y[2 * j + 1], e.qinv)));
      quad_store_row<2>(e.q_fp8_out + off, w, q, valid);
    }
  } else if (kind == HeadKind::IndexQ) {
    uint32_t w[4 * 2] = {};
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) quad_put_unit<2>(w, j, pack_e4m3x2(y[2 * j], y[2 * j + 1]));
    quad_store_row<2>(e.index_q_out + (row * e.niq + h.hi.index) * kHeadDim, w, q, valid);
  } else if (cache_dtype != kCacheNvfp4) {
    // FP8 / BF16 row at slot_base (null unless to_cache).
    // index_k: unit scale as a multiply by 1, identical bytes (epi::flat_store_head says why).
    const float sf = kind == HeadKind::K ? e.k_sf : kind == HeadKind::V ? e.v_sf : 1.0f;
    if (cache_dtype == kCacheFp8) {
      uint32_t w[4 * 2] = {};
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j)
        quad_put_unit<2>(w, j, pack_e4m3x2(mul_rn(y[2 * j], sf), mul_rn(y[2 * j + 1], sf)));
      quad_store_row<2>(slot_base, w, q, to_cache);
    } else {
      uint32_t w[4 * 4] = {};
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j) quad_put_unit<4>(w, j, pack_bf16x2(y[2 * j], y[2 * j + 1]));
      quad_store_row<4>(slot_base, w, q, to_cache);
    }
  } else {
    const bool has_sf = kind != HeadKind::IndexK;
    const float sf = kind == HeadKind::K ? e.k_sf : e.v_sf;
    const bool v_swizzle = kind == HeadKind::V;
    uint32_t dw[4 * 1] = {};    // data bytes: unit j = columns 8j + c0, 8j + c0 + 1
    uint32_t sw[2] = {0u, 0u};  // the 8 scale bytes (the same in the four lanes)
    // Groups in pairs (g, g + 1): their amax shuffles interleave and one
    // nvfp4_group_scale2_dev converts both scales.
#pragma unroll
    for (int g = 0; g < kHeadDim / kNvfp4Group; g += 2) {
      float amax[2] = {0.0f, 0.0f};  // max ignores NaN, starts at +0
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < 4; ++i) amax[h] = max_num(amax[h], abs_f32(y[4 * (g + h) + i]));
#pragma unroll
      for (int m = 1; m <= 2; m *= 2)
#pragma unroll
        for (int h = 0; h < 2; ++h) amax[h] = max_num(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], m));
      float rc[2];
      const uint32_t s2 = nvfp4_group_scale2_dev<kDecodeCvt>(amax[0], amax[1], has_sf, sf, &rc[0], &rc[1]);
#pragma unroll
      for (int jj = 2 * g; jj < 2 * g + 4; ++jj)
        quad_put_unit<1>(dw, jj, nvfp4_encode2(y[2 * jj], y[2 * jj + 1], rc[(jj - 2 * g) / 2]));
      sw[g / 4] |= s2 << (8 * (g % 4));
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (to_cache && v_swizzle && (g + h) % 4 == q)
          slot_base[nvfp4_scale_offset_v(sa.token, g + h, e.block_size)] = static_cast<uint8_t>(s2 >> (8 * h));
    }
    // sa.token = 0 and slot_base = null unless to_cache.
    quad_store_row<1>(slot_base + nvfp4_data_offset(sa.token, 0), dw, q, to_cache);
    if (to_cache && !v_swizzle && q == 0)
      *reinterpret_cast<uint2*>(slot_base + nvfp4_scale_offset_linear(sa.token, 0, e.block_size)) =
          make_uint2(sw[0], sw[1]);
  }
}

}  // namespace epi
}  // namespace m3qkv
