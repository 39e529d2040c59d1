// Register-resident epilogue of one consumer warpgroup's 64 x 128 accumulator
// block: the SPEC §3 epilogue computed directly on the wgmma fragment, with
// every rounding step a primitive of common/numerics.h and every store
// encoder / guard / address a function of common/epilogue.cuh and
// common/layouts.h (the same ones epi::epilogue_head_row calls).
//
// Fragment (ptx/wgmma.cuh): thread (warp w, lane l) holds rows 16w + l/4 + 8h
// (h = 0, 1) and columns c = 8j + 2q + b (q = l % 4, j = 0..15, b = 0, 1).
// Why the result equals epi::epilogue_head_row bit for bit:
//  * RMSNorm: cls(c) = (c >> 1) & 3 = q, so lane q holds exactly class q of its
//    row, and visits it in ascending column order (j, then b): its serial fma
//    chain IS s_q of SPEC §3.1. The four sums meet through quad shuffles and
//    every lane evaluates rms_inv(s0, s1, s2, s3) in the contract order.
//  * RoPE: pair (i, i + 32), i < 32, is (j, b) and (j + 4, b) of the same lane.
//  * NVFP4 group g = columns 16g..16g+15 = j in {2g, 2g+1} of the four quad
//    lanes: amax by quad max-reduction (max ignoring NaN, from +0, is
//    independent of order), then the same group-scale and encoder primitives.
//  * Side effects (flags, stores) happen under the same conditions as in
//    epi::epilogue_head_row; rows >= M compute but store nothing (shuffles
//    need every lane).
#pragma once

#include "sm90/kernel_sm90.cuh"

namespace m3qkv::sm90 {

__device__ __forceinline__ float quad_lane(float v, int q) {
  return __shfl_sync(0xffffffffu, v, static_cast<int>((threadIdx.x & 28u) | static_cast<unsigned>(q)));
}

// `hmask`: the fragment halves h (bit h) of this warp whose rows this call
// finalizes (split-K spread over the cluster: splitk_reduce_spread); the
// others are neither computed nor stored. Warp-uniform.
__device__ __forceinline__ void epilogue_block_regs(const KernelParams& p, float (&acc)[64], const Tile& tl,
                                                    int64_t row_base, uint32_t hmask = 3u) {
  const epi::EpilogueParams& e = p.epi;
  const int t = threadIdx.x % kWarpgroup;
  const int l = t % 32;
  const int q = l % 4;
  const int c0 = 2 * q;
  const int r0 = 16 * (t / 32) + l / 4;

  if (p.acc_tap != nullptr) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row_base + r0 + 8 * h;
      if (((hmask >> h) & 1u) && row < p.m) {
        float* dst = p.acc_tap + row * p.n + static_cast<int64_t>(tl.head) * kBN + c0;
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j)
          *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
      }
    }
  }

  const HeadInfo hi = head_info(tl.head, e.nq, e.nkv, e.niq);
  const bool norm = hi.kind != HeadKind::V;
  const uint16_t* w = hi.kind == HeadKind::Q        ? e.q_norm_weight
                      : hi.kind == HeadKind::K      ? e.k_norm_weight
                      : hi.kind == HeadKind::IndexQ ? e.index_q_norm_weight
                                                    : e.index_k_norm_weight;
  uint32_t wv[kBN / 8];  // bf16 weights of columns (8j + c0, 8j + c0 + 1)
#pragma unroll
  for (int j = 0; j < kBN / 8; ++j) wv[j] = norm ? *reinterpret_cast<const uint32_t*>(w + 8 * j + c0) : 0u;

  // Per-row inputs of both rows first, in two dependent rounds of global
  // loads instead of three per row (slot -> position -> cos/sin, row after
  // row: the H200 timeline showed ~6 µs for one tile's epilogue at M = 1 with
  // cold caches, nearly all of it these round trips). Round 1: the slot and
  // position words of both rows (plain loads of in-range entries; the flag
  // side effects of resolve_slot / clamp_position stay under the conditions
  // of epilogue_head_row). Round 2: the RoPE cos/sin words of both rows.
  constexpr int kCsWords = kRopeHalf / 8;  // cos (and sin) words per lane and row
  bool valid[2], to_cache[2] = {false, false};
  epi::SlotAddr sa[2] = {{0, 0}, {0, 0}};
  uint8_t* slot_base[2] = {nullptr, nullptr};
  int64_t slot_raw[2], pos_raw[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = row_base + r0 + 8 * h;
    valid[h] = ((hmask >> h) & 1u) && row < p.m;  // the same for the 4 lanes of a quad
    const bool kv = hi.kind == HeadKind::K || hi.kind == HeadKind::V;
    slot_raw[h] = !valid[h] ? -1 : kv ? e.slot_mapping[row] : hi.kind == HeadKind::IndexK ? e.index_slot_mapping[row] : -1;
    pos_raw[h] = valid[h] && norm ? e.positions[row] : 0;
  }
  uint32_t cs_w[2][kCsWords], sn_w[2][kCsWords];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    // Cache destination (k, v, index_k): resolved first, as epilogue_head_row does.
    if (valid[h] && (hi.kind == HeadKind::K || hi.kind == HeadKind::V)) {
      to_cache[h] = epi::resolve_slot(slot_raw[h], e.num_blocks, e.block_size, e.error_flags,
                                      M3QKV_FLAG_SLOT_OUT_OF_RANGE, &sa[h]);
      if (to_cache[h])
        slot_base[h] = e.kv_cache + nvfp4_slot_base(sa[h].page, 2 * hi.index + (hi.kind == HeadKind::K ? 0 : 1),
                                                    e.kv_page_stride, e.block_size);
    } else if (valid[h] && hi.kind == HeadKind::IndexK) {
      to_cache[h] = epi::resolve_slot(slot_raw[h], e.num_index_blocks, e.block_size, e.error_flags,
                                      M3QKV_FLAG_INDEX_SLOT_OUT_OF_RANGE, &sa[h]);
      if (to_cache[h]) slot_base[h] = e.index_cache + nvfp4_slot_base(sa[h].page, 0, e.index_page_stride, e.block_size);
    }
    // Position guard only where epilogue_head_row reads the position.
    const bool reads_pos =
        norm && valid[h] && (hi.kind == HeadKind::Q || hi.kind == HeadKind::IndexQ || to_cache[h]);
    const int64_t pos = reads_pos ? epi::clamp_position(pos_raw[h], e.max_position, e.error_flags) : 0;
    const uint16_t* cs = e.cos_sin_cache + pos * kRopeDim;
#pragma unroll
    for (int j = 0; j < kCsWords; ++j) {
      cs_w[h][j] = norm ? *reinterpret_cast<const uint32_t*>(cs + 8 * j + c0) : 0u;
      sn_w[h][j] = norm ? *reinterpret_cast<const uint32_t*>(cs + kRopeHalf + 8 * j + c0) : 0u;
    }
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (!((hmask >> h) & 1u)) continue;  // warp-uniform: the quad shuffles stay whole-warp
    const int64_t row = row_base + r0 + 8 * h;
    float y[kBN / 4];  // y[2j + b] = column 8j + c0 + b
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j) {
      y[2 * j] = acc[4 * j + 2 * h];
      y[2 * j + 1] = acc[4 * j + 2 * h + 1];
    }

    if (norm) {
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < kBN / 4; ++i) s = fma_rn(y[i], y[i], s);
      const float r = rms_inv(quad_lane(s, 0), quad_lane(s, 1), quad_lane(s, 2), quad_lane(s, 3), e.eps);
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) {
        y[2 * j] = rms_apply(y[2 * j], r, bf16_to_f32(static_cast<uint16_t>(wv[j] & 0xffffu)));
        y[2 * j + 1] = rms_apply(y[2 * j + 1], r, bf16_to_f32(static_cast<uint16_t>(wv[j] >> 16)));
      }
#pragma unroll
      for (int j = 0; j < kCsWords; ++j) {
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          const float co = bf16_to_f32(static_cast<uint16_t>(cs_w[h][j] >> (16 * b)));
          const float si = bf16_to_f32(static_cast<uint16_t>(sn_w[h][j] >> (16 * b)));
          const float u = y[2 * j + b];
          const float v = y[2 * (j + kRopeHalf / 8) + b];
          rope_pair(u, v, co, si, &y[2 * j + b], &y[2 * (j + kRopeHalf / 8) + b]);
        }
      }
    }

    if (hi.kind == HeadKind::Q) {
      if (valid[h]) {
        const int64_t off = (row * e.nq + hi.index) * kHeadDim + c0;
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j) {
          if (e.q_out != nullptr)
            *reinterpret_cast<uint32_t*>(e.q_out + off + 8 * j) = epi::pack_bf16x2(y[2 * j], y[2 * j + 1]);
          if (e.q_fp8_out != nullptr)
            *reinterpret_cast<uint16_t*>(e.q_fp8_out + off + 8 * j) =
                static_cast<uint16_t>(epi::pack_e4m3x2(mul_rn(y[2 * j], e.qinv), mul_rn(y[2 * j + 1], e.qinv)));
        }
      }
    } else if (hi.kind == HeadKind::IndexQ) {
      if (valid[h]) {
        const int64_t off = (row * e.niq + hi.index) * kHeadDim + c0;
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j)
          *reinterpret_cast<uint16_t*>(e.index_q_out + off + 8 * j) =
              static_cast<uint16_t>(epi::pack_e4m3x2(y[2 * j], y[2 * j + 1]));
      }
    } else {
      const bool has_sf = hi.kind != HeadKind::IndexK;
      const float sf = hi.kind == HeadKind::K ? e.k_sf : e.v_sf;
      const bool v_swizzle = hi.kind == HeadKind::V;
#pragma unroll
      for (int g = 0; g < kHeadDim / kNvfp4Group; ++g) {
        float amax = 0.0f;  // max ignores NaN, starts at +0
#pragma unroll
        for (int i = 0; i < 4; ++i) amax = max_num(amax, abs_f32(y[4 * g + i]));
        amax = max_num(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
        amax = max_num(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
        float rc;
        const uint8_t s8 = nvfp4_group_scale(amax, has_sf, sf, &rc);
        if (to_cache[h]) {
#pragma unroll
          for (int jj = 2 * g; jj < 2 * g + 2; ++jj)
            slot_base[h][nvfp4_data_offset(sa[h].token, 8 * jj + c0)] =
                static_cast<uint8_t>(epi::nvfp4_encode2(y[2 * jj], y[2 * jj + 1], rc));
          if (g % 4 == q)
            slot_base[h][v_swizzle ? nvfp4_scale_offset_v(sa[h].token, g, e.block_size)
                                   : nvfp4_scale_offset_linear(sa[h].token, g, e.block_size)] = s8;
        }
      }
    }
  }
}

// The end of one tile in a consumer warpgroup, for both kernels: split-K
// reduction (spread over the cluster with the register epilogue, to the
// leader with the staged one, whose staging buffer is the partial buffer),
// then the epilogue of the rows this CTA finalizes. `part` / `part_s`: this
// CTA's partial buffer (generic / shared::cta address); `red_phase` toggles per
// tile. Returns whether this CTA ran an epilogue for the tile.
template <bool kSplit, bool kRegEpi>
__device__ __forceinline__ bool finish_tile(const KernelParams& p, float (&acc)[64], const Tile& tl, int64_t row_base,
                                            float* stg, uint32_t named_bar, uint32_t rank, float* part,
                                            uint32_t part_s, uint32_t red_full, uint32_t red_empty,
                                            uint32_t* red_phase, bool first_tile) {
  uint32_t hmask = 3u;
  if constexpr (kSplit) {
    bool leader = true;
    if constexpr (kRegEpi)
      hmask = splitk_reduce_spread(p, acc, rank, part, part_s, red_full, red_empty, *red_phase, first_tile);
    else
      leader = splitk_reduce(p, acc, rank, part, part_s, red_full, red_empty, *red_phase);
    *red_phase ^= 1u;
    if (threadIdx.x % kWarpgroup == 0) trace_event(p, kTrConsReduced);  // split: one consumer warpgroup
    if (!leader) return false;
  }
  if constexpr (kRegEpi)
    epilogue_block_regs(p, acc, tl, row_base, hmask);
  else
    epilogue_block(p, acc, tl, row_base, stg, named_bar);
  return true;
}

}  // namespace m3qkv::sm90
