// The SPEC §3 epilogue of one (token row, head) held by a whole WARP: the
// form for few rows (the standalone insert at small M, the split-K decode
// kernels' last arriver when its token block has at most one row per warp).
// The quad form (epilogue_quad.cuh) gives each lane 32 values; with few rows
// each lane's serial chain of 32 values (norm, RoPE, encode; for NVFP4 eight
// group scales) is the kernel's critical path with nothing to hide it
// (bench/RESULTS.md, issue 13). Here each lane holds 4 values, and a row's
// chain is ~8x shorter. Device only. The row comes from the caller's source
// `src`: src.load(c) reads columns c, c + 1 (c even) as a Word, and
// Src::unpack(word) gives them as f32 (Bf16Row: a bf16 row in global memory,
// kept packed until used; the decode kernels: their f32 tile in shared
// memory, splitk::TileRow).
//
// Warp layout: lane l = 4k + q (k = l / 4, q = l % 4) holds the quad layout's
// units j = k and j = k + 8 of lane q: columns 8k + 2q + b in y[b] and
// 64 + 8k + 2q + b in y[2 + b] (b = 0, 1). Why the result equals
// epi::epilogue_head_row bit for bit:
//  * RMSNorm: every lane also reads its row in the quad layout of its q (the
//    8 quads read the same words: one broadcast request per load) and runs
//    the serial fma chain s_q of SPEC §3.1 exactly as quad_row_epilogue does;
//    rms_inv of the quad's four sums, the same in every quad.
//  * RoPE: pair (i, i + 32), i < 32, is column 8k + 2q + b, k < 4, with
//    8(k + 4) + 2q + b: y[b] of lanes l and l ^ 16. Both lanes evaluate
//    rope_pair on the same (u, v, cos, sin) and keep their own output.
//    Columns >= 64 (y[2], y[3]) have no RoPE.
//  * NVFP4 group g = units 2g, 2g + 1 = quads k, k ^ 1: unit k is in group
//    k / 2, unit k + 8 in group 4 + k / 2; amax by max-reduction over lanes
//    l ^ 1, ^ 2, ^ 4 (max ignoring NaN, from +0: order-free), then the same
//    group-scale and encoder primitives in every lane of the group.
//  * FP8 / BF16 caches, q outputs: element-wise, the same pack_* primitives.
//  * Stores: unit j of lane q belongs at row byte (4j + q)·U (U = 1 NVFP4
//    byte, 2 e4m3 pair, 4 bf16 pair): unit k at l·U and unit k + 8 at
//    (32 + l)·U, so each store instruction writes 32·U contiguous bytes.
//  * Destination, guards, flags: row_inputs() / row_dest(), shared with the quad form.
//
// Alignment: the q / cache row starts of epilogue_quad.cuh (kRowStoreAlign);
// every store here is U-byte aligned within them; the NVFP4 scales are byte
// stores.
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
};

// The epilogue of token `row` for head `head`, its 128 values from `src`.
// Called by every lane of the warp for the same (row, head).
template <class Src>
__device__ __forceinline__ void warp_row_epilogue(const EpilogueParams& e, int head, int64_t row, const Src& src) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int q = lane % 4;
  const HeadInfo hi = head_info(head, e.nq, e.nkv, e.niq);
  const HeadKind kind = hi.kind;
  const bool norm = kind != HeadKind::V;

  // Round 1: the lane's two pairs, the quad-layout pairs of the sums, the
  // norm weights, and (row_inputs) the slot and position.
  using Word = typename Src::Word;
  const Word w0 = src.load(2 * lane), w1 = src.load(kHeadDim / 2 + 2 * lane);
  Word qw[kHeadDim / 8];
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; ++j) qw[j] = norm ? src.load(8 * j + 2 * q) : Word{};
  const uint32_t* wt = reinterpret_cast<const uint32_t*>(norm_weight(e, kind));
  const uint32_t nw0 = norm ? wt[lane] : 0u, nw1 = norm ? wt[32 + lane] : 0u;
  const RowInputs in = row_inputs(e, hi, row, true);
  // Round 2: this lane's RoPE pair i = 2(l % 16) + b: cos word and sin word.
  const uint32_t* cs_w = reinterpret_cast<const uint32_t*>(e.cos_sin_cache + in.pos * kRopeDim);
  const uint32_t cw = norm ? cs_w[lane % 16] : 0u, sw = norm ? cs_w[kRopeHalf / 2 + lane % 16] : 0u;
  const RowDest d = row_dest(e, hi, in, true);

  const float2 v0 = Src::unpack(w0), v1 = Src::unpack(w1);
  float y[4] = {v0.x, v0.y, v1.x, v1.y};
  if (norm) {
    float s = 0.0f;  // s_q: class q's columns 8j + 2q + b in ascending order
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) {
      const float2 v = Src::unpack(qw[j]);
      s = fma_rn(v.x, v.x, s);
      s = fma_rn(v.y, v.y, s);
    }
    const float r = rms_inv(quad_lane(s, 0), quad_lane(s, 1), quad_lane(s, 2), quad_lane(s, 3), e.eps);
    y[0] = rms_apply(y[0], r, bf16_to_f32(static_cast<uint16_t>(nw0 & 0xffffu)));
    y[1] = rms_apply(y[1], r, bf16_to_f32(static_cast<uint16_t>(nw0 >> 16)));
    y[2] = rms_apply(y[2], r, bf16_to_f32(static_cast<uint16_t>(nw1 & 0xffffu)));
    y[3] = rms_apply(y[3], r, bf16_to_f32(static_cast<uint16_t>(nw1 >> 16)));
    const bool lo = lane < 16;  // holds u = column i < 32; the partner l ^ 16 holds v = column i + 32
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const float other = __shfl_xor_sync(0xffffffffu, y[b], 16);
      const float co = bf16_to_f32(static_cast<uint16_t>(cw >> (16 * b)));
      const float si = bf16_to_f32(static_cast<uint16_t>(sw >> (16 * b)));
      float u, v;
      rope_pair(lo ? y[b] : other, lo ? other : y[b], co, si, &u, &v);
      y[b] = lo ? u : v;
    }
  }

  // Stores: unit k at row byte l·U, unit k + 8 at (32 + l)·U.
  if (kind == HeadKind::Q) {
    const int64_t off = (row * e.nq + hi.index) * kHeadDim;  // the row's element 0
    if (e.q_out != nullptr) {
      uint32_t* o = reinterpret_cast<uint32_t*>(e.q_out + off);
      o[lane] = pack_bf16x2(y[0], y[1]);
      o[32 + lane] = pack_bf16x2(y[2], y[3]);
    }
    if (e.q_fp8_out != nullptr) {
      uint16_t* o = reinterpret_cast<uint16_t*>(e.q_fp8_out + off);
      o[lane] = static_cast<uint16_t>(pack_e4m3x2(mul_rn(y[0], e.qinv), mul_rn(y[1], e.qinv)));
      o[32 + lane] = static_cast<uint16_t>(pack_e4m3x2(mul_rn(y[2], e.qinv), mul_rn(y[3], e.qinv)));
    }
  } else if (kind == HeadKind::IndexQ) {
    uint16_t* o = reinterpret_cast<uint16_t*>(e.index_q_out + (row * e.niq + hi.index) * kHeadDim);
    o[lane] = static_cast<uint16_t>(pack_e4m3x2(y[0], y[1]));
    o[32 + lane] = static_cast<uint16_t>(pack_e4m3x2(y[2], y[3]));
  } else if (d.cache_dtype != kCacheNvfp4) {
    if (!d.to_cache) return;  // warp-uniform: every lane holds the same row and head
    // index_k: unit scale as a multiply by 1, identical bytes (epi::flat_store_head says why).
    const float sf = kind == HeadKind::K ? e.k_sf : kind == HeadKind::V ? e.v_sf : 1.0f;
    if (d.cache_dtype == kCacheFp8) {
      uint16_t* o = reinterpret_cast<uint16_t*>(d.slot_base);
      o[lane] = static_cast<uint16_t>(pack_e4m3x2(mul_rn(y[0], sf), mul_rn(y[1], sf)));
      o[32 + lane] = static_cast<uint16_t>(pack_e4m3x2(mul_rn(y[2], sf), mul_rn(y[3], sf)));
    } else {
      uint32_t* o = reinterpret_cast<uint32_t*>(d.slot_base);
      o[lane] = pack_bf16x2(y[0], y[1]);
      o[32 + lane] = pack_bf16x2(y[2], y[3]);
    }
  } else {
    if (!d.to_cache) return;  // warp-uniform, as above
    const bool has_sf = kind != HeadKind::IndexK;
    const float sf = kind == HeadKind::K ? e.k_sf : e.v_sf;
    float a0 = max_num(max_num(0.0f, abs_f32(y[0])), abs_f32(y[1]));  // group k / 2
    float a1 = max_num(max_num(0.0f, abs_f32(y[2])), abs_f32(y[3]));  // group 4 + k / 2
#pragma unroll
    for (int m = 1; m <= 4; m *= 2) {
      a0 = max_num(a0, __shfl_xor_sync(0xffffffffu, a0, m));
      a1 = max_num(a1, __shfl_xor_sync(0xffffffffu, a1, m));
    }
    float rc0, rc1;
    const uint32_t s2 = nvfp4_group_scale2_dev(a0, a1, has_sf, sf, &rc0, &rc1);
    uint8_t* data = d.slot_base + nvfp4_data_offset(d.sa.token, 0);
    data[lane] = static_cast<uint8_t>(nvfp4_encode2(y[0], y[1], rc0));
    data[32 + lane] = static_cast<uint8_t>(nvfp4_encode2(y[2], y[3], rc1));
    // Groups g < 4 and 4 + g: lane 8g holds both scales and stores them, in
    // either scale layout (byte stores: no gather of the eight bytes into one
    // lane, whose shuffles were on the row's critical path).
    const int g = lane / 8;
    if (lane % 8 == 0) {
      const bool v = kind == HeadKind::V;
      uint8_t* s = d.slot_base + (v ? nvfp4_scale_offset_v(d.sa.token, g, e.block_size)
                                    : nvfp4_scale_offset_linear(d.sa.token, g, e.block_size));
      s[0] = static_cast<uint8_t>(s2 & 0xffu);
      s[v ? kNvfp4ScaleUpperDeltaV : kNvfp4ScaleUpperDeltaLinear] = static_cast<uint8_t>(s2 >> 8);
    }
  }
}

}  // namespace epi
}  // namespace m3qkv
