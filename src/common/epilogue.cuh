// The epilogue of docs/contract.md §3 (numerics), §4 (cache layouts) and §5.3 (device-side
// guards) as small device functions, written once for every GPU backend.
//
// Data model: a head row is 128 f32 values reached through a `float*`. The
// functions are force-inlined and fully unrolled over constant indices, so
// when the caller passes a local array (the SM100 layout: tcgen05.ld 32x32b
// gives one thread one accumulator row) the row lives in registers; when it
// passes a shared-memory row pointer (a tile staged in smem, as the portable
// and SM90 kernels may do) the same code reads/writes shared memory. Every
// rounding step is a primitive of common/numerics.h and every address one of
// common/layouts.h, so these functions and the CPU golden model share one
// definition of the contract.
//
// The functions are __host__ __device__ under nvcc and plain inline functions
// under a host compiler (host side: the software encoders), so a CPU test
// (g++, -ffp-contract=off) can run them against the golden model.
//
// Hardware conversions: the ptx/cvt.cuh instructions where the target has them
// and the GPU suite proved them identical to the software encoders of
// numerics.h on the whole input domain (tests/gpu/test_conversions.cu):
// bf16x2 (sm_80+) and e4m3x2 (sm_89+); the host (golden model, CPU tests) and
// sm_80 use the software ones. e2m1x2 (sm_100f) stays software (below).
#pragma once

#include <stdint.h>
#include <vector_functions.h>  // make_uint2 / make_uint4 (host compilers too)
#include <vector_types.h>

#include "common/layouts.h"
#include "common/numerics.h"
#include "common/slot_owners.cuh"
#include "m3qkv/m3qkv.h"
#include "ptx/cvt.cuh"

// bf16x2 and e4m3x2: on by default. GpuConversions.{Bf16Rn,E4m3Satfinite}AllF32Patterns
// compare both instructions with the software encoders over all 2^32 f32 bit
// patterns (H200: 0 mismatches, every suite run since issue 4); the software
// form cost the epilogue most of its instructions (~30 per e4m3 value; the
// SM90 decode timeline showed its last arriver's epilogue as long as the
// mainloop). e2m1x2 (sm_100f only) stays software until a Blackwell run proves
// it: M3QKV_EPILOGUE_HW_E2M1=1.
#ifndef M3QKV_EPILOGUE_HW_CVT
#define M3QKV_EPILOGUE_HW_CVT 1
#endif
#ifndef M3QKV_EPILOGUE_HW_E2M1
#define M3QKV_EPILOGUE_HW_E2M1 0
#endif

namespace m3qkv {
namespace epi {

// Everything the epilogue of one (token row, head) needs. Plain data: built on
// the host by make_epilogue_params() and passed by value in kernel parameters.
struct EpilogueParams {
  int32_t nq, nkv, niq, nik;
  const int64_t* positions;
  int64_t max_position;
  const uint16_t* cos_sin_cache;  // bf16 [max_position, 64]
  const uint16_t* q_norm_weight;  // bf16 [128] each (16-B aligned)
  const uint16_t* k_norm_weight;
  const uint16_t* index_q_norm_weight;
  const uint16_t* index_k_norm_weight;
  float eps;
  const int64_t* slot_mapping;
  const int64_t* index_slot_mapping;
  uint8_t* kv_cache;
  int64_t kv_page_stride;
  int64_t num_blocks;
  uint8_t* index_cache;
  int64_t index_page_stride;
  int64_t num_index_blocks;
  int32_t block_size;
  uint16_t* q_out;     // bf16 [M, nq·128] or null
  uint8_t* q_fp8_out;  // e4m3 [M, nq·128] or null
  uint8_t* index_q_out;
  float qinv;  // RN(1 / q_fp8_scale)
  float k_sf;  // RN(1 / k_scale)
  float v_sf;  // RN(1 / v_scale)
  uint32_t* error_flags;
  // Cache formats (docs/contract.md §4.3): kCacheNvfp4 / kCacheFp8 / kCacheBf16 of common/layouts.h.
  int32_t kv_dtype;
  int32_t ix_dtype;
  uint8_t* v_cache;         // FP8 / BF16 KV: V elements (K in kv_cache)
  int64_t kv_token_stride;  // FP8 / BF16 KV, bytes
  int64_t kv_head_stride;
};

// Host side: m3qkv_fused_args and m3qkv_insert_args name these fields alike.
// The three reciprocals are computed once, in f32 RN (rcp_rn on the host is
// IEEE 1.0f / x), exactly as docs/contract.md §3.3 / §3.5 and the golden model do.
template <class Args>
inline EpilogueParams make_epilogue_params(const Args& a) {
  EpilogueParams p;
  p.nq = a.nq;
  p.nkv = a.nkv;
  p.niq = a.niq;
  p.nik = a.nik;
  p.positions = a.positions;
  p.max_position = a.max_position;
  p.cos_sin_cache = static_cast<const uint16_t*>(a.cos_sin_cache);
  p.q_norm_weight = static_cast<const uint16_t*>(a.q_norm_weight);
  p.k_norm_weight = static_cast<const uint16_t*>(a.k_norm_weight);
  p.index_q_norm_weight = static_cast<const uint16_t*>(a.index_q_norm_weight);
  p.index_k_norm_weight = static_cast<const uint16_t*>(a.index_k_norm_weight);
  p.eps = a.eps;
  p.slot_mapping = a.slot_mapping;
  p.index_slot_mapping = a.index_slot_mapping;
  p.kv_cache = static_cast<uint8_t*>(a.kv_cache);
  p.kv_page_stride = a.kv_page_stride;
  p.num_blocks = a.num_blocks;
  p.index_cache = static_cast<uint8_t*>(a.index_cache);
  p.index_page_stride = a.index_page_stride;
  p.num_index_blocks = a.num_index_blocks;
  p.block_size = a.block_size;
  p.q_out = static_cast<uint16_t*>(a.q_out);
  p.q_fp8_out = static_cast<uint8_t*>(a.q_fp8_out);
  p.index_q_out = static_cast<uint8_t*>(a.index_q_out);
  // Unused (and possibly 0) when q_fp8_out is null: the value is then never read.
  p.qinv = rcp_rn(a.q_fp8_scale);
  p.k_sf = rcp_rn(a.k_scale);
  p.v_sf = rcp_rn(a.v_scale);
  p.error_flags = a.error_flags;
  p.kv_dtype = a.kv_cache_dtype;
  p.ix_dtype = a.index_cache_dtype;
  p.v_cache = static_cast<uint8_t*>(a.v_cache);
  p.kv_token_stride = a.kv_token_stride;
  p.kv_head_stride = a.kv_head_stride;
  return p;
}

// ------------------------------------------------------------ conversions
// bf16_rn(lo) | bf16_rn(hi) << 16 (docs/contract.md §3.6).
M3_HD uint32_t pack_bf16x2(float lo, float hi) {
#if M3QKV_EPILOGUE_HW_CVT && M3QKV_HAS_CVT_RN_BF16X2_F32
  return cvt_rn_bf16x2_f32(lo, hi);
#else
  return static_cast<uint32_t>(f32_to_bf16_rn_soft(lo)) | (static_cast<uint32_t>(f32_to_bf16_rn_soft(hi)) << 16);
#endif
}
// e4m3_satfinite_rn of two values, v0 in the low byte (docs/contract.md §3.6).
M3_HD uint32_t pack_e4m3x2(float v0, float v1) {
#if M3QKV_EPILOGUE_HW_CVT && M3QKV_HAS_CVT_RN_SATFINITE_E4M3X2_F32
  return cvt_rn_satfinite_e4m3x2_f32(v0, v1);
#else
  return static_cast<uint32_t>(f32_to_e4m3_satfinite_rn_soft(v0)) |
         (static_cast<uint32_t>(f32_to_e4m3_satfinite_rn_soft(v1)) << 8);
#endif
}
// Two NVFP4 codes (docs/contract.md §3.5): e2m1(RZ(v·rc)), magnitude-0 codes as +0;
// v0 in the low nibble.
M3_HD uint32_t nvfp4_encode2(float v0, float v1, float rc) {
#if M3QKV_EPILOGUE_HW_E2M1 && M3QKV_HAS_CVT_RN_SATFINITE_E2M1X2_F32
  const uint32_t b = cvt_rn_satfinite_e2m1x2_f32(mul_rz(v0, rc), mul_rz(v1, rc));
  const uint32_t lo = (b & 7u) ? (b & 0xfu) : 0u;  // -0 -> +0
  const uint32_t hi = (b & 0x70u) ? (b & 0xf0u) : 0u;
  return lo | hi;
#else
  return static_cast<uint32_t>(nvfp4_encode(v0, rc)) | (static_cast<uint32_t>(nvfp4_encode(v1, rc)) << 4);
#endif
}

// An e4m3 byte pair (lo byte = element 0) as two f32, by cvt.rn.f16x2.e4m3x2
// and two exact widenings where the device has it: equal to e4m3_to_f32 on
// every byte but the NaN codes 0x7F / 0xFF (GpuConversions.
// E4m3x2ToF32x2EqualsSoftwareOnAllPairs); callers pass no NaN code. The
// software form branches on subnormals, which serializes the NVFP4 group
// scales of a lane.
M3_HD float2 e4m3x2_to_f32x2_dev(uint32_t pair) {
#if M3QKV_EPILOGUE_HW_CVT && M3QKV_HAS_CVT_RN_F16X2_E4M3X2
  const uint32_t h = cvt_rn_f16x2_e4m3x2(static_cast<uint16_t>(pair));
  return make_float2(cvt_f32_f16(static_cast<uint16_t>(h & 0xffffu)), cvt_f32_f16(static_cast<uint16_t>(h >> 16)));
#else
  return make_float2(e4m3_to_f32(static_cast<uint8_t>(pair & 0xffu)), e4m3_to_f32(static_cast<uint8_t>(pair >> 8)));
#endif
}

// The NVFP4 group scales of docs/contract.md §3.5 (numerics.h nvfp4_group_scale) of two
// groups with the same has_sf / sf, with the device's conversion
// instructions where they are proven identical: the scale bytes by one
// cvt.rn.satfinite.e4m3x2 (all 2^32 inputs), and RN(1/s) by rcp.approx.ftz,
// exact on the 126 positive finite e4m3 values a scale byte can take (a >=
// 2^-9 > 0: GpuConversions.RcpApproxEqualsRcpRnOnE4m3Values). Returns
// s0 | s1 << 8. kDecodeCvt: the scale values back by e4m3x2_to_f32x2_dev
// (one conversion, no branch), else by e4m3_to_f32, whose subnormal branch
// serializes the two groups but keeps fewer values live: the SM100 decode
// kernel (168 registers) spills 8 B with the branch-free form in its quad
// epilogue (ptxas, sm_100f), where the insert kernels have room.
// The software form costs ~50 instructions per group on these steps, on the
// critical path of the NVFP4 heads' epilogue (the split-K decode kernels'
// tail: compare fused_sm90/TP:4/M:1 with fused_sm90_fp8/TP:4/M:1).
template <bool kDecodeCvt = true>
M3_HD uint32_t nvfp4_group_scale2_dev(float amax0, float amax1, bool has_sf, float sf, float* rc0, float* rc1) {
#if M3QKV_EPILOGUE_HW_CVT && M3QKV_HAS_CVT_RN_SATFINITE_E4M3X2_F32
  float a0 = mul_rn(amax0, 0.16666667163372040f /* RN(1/6) */);
  float a1 = mul_rn(amax1, 0.16666667163372040f);
  if (has_sf) {
    a0 = mul_rn(a0, sf);
    a1 = mul_rn(a1, sf);
  }
  a0 = max_num(a0, 0.001953125f /* 2^-9 */);
  a1 = max_num(a1, 0.001953125f);
  const uint32_t s = cvt_rn_satfinite_e4m3x2_f32(a0, a1);
  float2 v;
  if constexpr (kDecodeCvt) {
    v = e4m3x2_to_f32x2_dev(s);
  } else {
    v = make_float2(e4m3_to_f32(static_cast<uint8_t>(s & 0xffu)), e4m3_to_f32(static_cast<uint8_t>(s >> 8)));
  }
  float r0 = rcp_approx_ftz_f32(v.x), r1 = rcp_approx_ftz_f32(v.y);
  if (has_sf) {
    r0 = mul_rn(r0, sf);
    r1 = mul_rn(r1, sf);
  }
  *rc0 = r0;
  *rc1 = r1;
  return s;
#else
  const uint32_t s0 = nvfp4_group_scale(amax0, has_sf, sf, rc0);
  return s0 | static_cast<uint32_t>(nvfp4_group_scale(amax1, has_sf, sf, rc1)) << 8;
#endif
}
// One group's scale (the fused kernels' per-thread epilogue): the pair form
// with a second group of amax 0, unused.
M3_HD uint8_t nvfp4_group_scale_dev(float amax, bool has_sf, float sf, float* rc) {
  float unused;
  return static_cast<uint8_t>(nvfp4_group_scale2_dev(amax, 0.0f, has_sf, sf, rc, &unused) & 0xffu);
}

// ---------------------------------------------------------------- guards
M3_HD void set_flag(uint32_t* flags, uint32_t bit) {
  if (flags == nullptr) return;
#if defined(__CUDA_ARCH__)
  atomicOr(flags, bit);
#else
  *flags |= bit;  // host builds of these functions (CPU emulation in tests): single-threaded
#endif
}
// docs/contract.md §5.3: a position outside [0, max_position) is clamped for the read and flagged.
M3_HD bool position_in_range(int64_t pos, int64_t max_position) { return pos >= 0 && pos < max_position; }
M3_HD int64_t clamp_position_quiet(int64_t pos, int64_t max_position) {
  return position_in_range(pos, max_position) ? pos : pos < 0 ? 0 : max_position - 1;
}
M3_HD int64_t clamp_position(int64_t pos, int64_t max_position, uint32_t* flags) {
  if (!position_in_range(pos, max_position)) set_flag(flags, M3QKV_FLAG_POSITION_OUT_OF_RANGE);
  return clamp_position_quiet(pos, max_position);
}
// Slot id -> (page, token) (docs/contract.md §4.4). Returns false when nothing is to be
// written: slot < 0 silently, page >= num_pages with `oob_bit` set in flags.
// The page compare avoids forming num_pages·block_size.
struct SlotAddr {
  int64_t page;
  int token;
};
// block_size > 0 (validated). A slot below 2^31 divides in 32 bits: the same
// quotient, a few instructions instead of the 64-bit division routine (which
// sat on the small-M insert's critical path, between its two load rounds).
M3_HD bool resolve_slot(int64_t slot, int64_t num_pages, int block_size, uint32_t* flags, uint32_t oob_bit,
                         SlotAddr* out) {
  if (slot < 0) return false;
  int64_t page;
  if (slot <= INT32_MAX) {
    page = static_cast<int64_t>(static_cast<uint32_t>(slot) / static_cast<uint32_t>(block_size));
  } else {
    page = slot / block_size;
  }
  if (page >= num_pages) {
    set_flag(flags, oob_bit);
    return false;
  }
  out->page = page;
  out->token = static_cast<int>(slot - page * block_size);
  return true;
}

// ---------------------------------------------------- RMSNorm and RoPE
// Class-ordered sums of squares (docs/contract.md §3.1): s[cls(c)] accumulates x[c]²
// with fma for c ascending, which is ascending within each class.
M3_HD void rms_class_sums(const float* x, float (&s)[4]) {
  s[0] = s[1] = s[2] = s[3] = 0.0f;
#pragma unroll
  for (int c = 0; c < kHeadDim; ++c) s[rms_class(c)] = fma_rn(x[c], x[c], s[rms_class(c)]);
}
// In-place Gemma RMSNorm of one head row; w = 128 bf16 (16-B aligned, any space).
M3_HD void rms_norm_head(float* x, const uint16_t* w, float eps) {
  float s[4];
  rms_class_sums(x, s);
  const float r = rms_inv(s[0], s[1], s[2], s[3], eps);
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; ++j) {
    const uint4 w8 = reinterpret_cast<const uint4*>(w)[j];
    const uint32_t wv[4] = {w8.x, w8.y, w8.z, w8.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = 8 * j + 2 * i;
      x[c] = rms_apply(x[c], r, bf16_to_f32(static_cast<uint16_t>(wv[i] & 0xffffu)));
      x[c + 1] = rms_apply(x[c + 1], r, bf16_to_f32(static_cast<uint16_t>(wv[i] >> 16)));
    }
  }
}
// In-place NeoX RoPE on columns 0..63 (docs/contract.md §3.2); cs = the 64 bf16 of
// cos_sin_cache[pos] = [cos 0..31 | sin 0..31] (16-B aligned).
M3_HD void rope64_head(float* y, const uint16_t* cs) {
  uint32_t w[kRopeDim / 2];
#pragma unroll
  for (int j = 0; j < kRopeDim / 8; ++j) {
    const uint4 v = reinterpret_cast<const uint4*>(cs)[j];
    w[4 * j + 0] = v.x;
    w[4 * j + 1] = v.y;
    w[4 * j + 2] = v.z;
    w[4 * j + 3] = v.w;
  }
#pragma unroll
  for (int i = 0; i < kRopeHalf; ++i) {
    const float co = bf16_to_f32(static_cast<uint16_t>(w[i / 2] >> (16 * (i % 2))));
    const float si = bf16_to_f32(static_cast<uint16_t>(w[(kRopeHalf + i) / 2] >> (16 * (i % 2))));
    const float u = y[i];
    const float v = y[i + kRopeHalf];
    rope_pair(u, v, co, si, &y[i], &y[i + kRopeHalf]);
  }
}

// ------------------------------------------------------------- q stores
// bf16_rn(y) -> dst[0..127] (16-B aligned).
M3_HD void store_bf16_head(const float* y, uint16_t* dst) {
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; ++j) {
    uint4 v;
    v.x = pack_bf16x2(y[8 * j + 0], y[8 * j + 1]);
    v.y = pack_bf16x2(y[8 * j + 2], y[8 * j + 3]);
    v.z = pack_bf16x2(y[8 * j + 4], y[8 * j + 5]);
    v.w = pack_bf16x2(y[8 * j + 6], y[8 * j + 7]);
    reinterpret_cast<uint4*>(dst)[j] = v;
  }
}
// e4m3_satfinite_rn(y · qinv) (q_fp8_out, kScaled) or e4m3_satfinite_rn(y)
// (index_q: unit scale, no multiply at all so a NaN keeps its sign exactly as
// the golden model's) -> dst[0..127] (16-B aligned).
template <bool kScaled>
M3_HD void store_e4m3_head(const float* y, float qinv, uint8_t* dst) {
#pragma unroll
  for (int j = 0; j < kHeadDim / 16; ++j) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = 16 * j + 4 * i;
      float v[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] = kScaled ? mul_rn(y[c + e], qinv) : y[c + e];
      w[i] = pack_e4m3x2(v[0], v[1]) | (pack_e4m3x2(v[2], v[3]) << 16);
    }
    reinterpret_cast<uint4*>(dst)[j] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// ----------------------------------------------------------------- NVFP4
// One 16-value group (docs/contract.md §3.5): returns the e4m3 scale byte; data = the 8
// packed bytes (element 2i in the low nibble of byte i) as two little-endian
// words. has_sf = false for index_k.
M3_HD uint8_t nvfp4_quant16(const float* v, bool has_sf, float sf, uint2* data) {
  float amax = 0.0f;  // max ignores NaN, starts at +0
#pragma unroll
  for (int i = 0; i < kNvfp4Group; ++i) amax = max_num(amax, abs_f32(v[i]));
  float rc;
  const uint8_t s8 = nvfp4_group_scale_dev(amax, has_sf, sf, &rc);
  uint32_t w[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < kNvfp4Group / 2; ++i) w[i / 4] |= nvfp4_encode2(v[2 * i], v[2 * i + 1], rc) << (8 * (i % 4));
  *data = make_uint2(w[0], w[1]);
  return s8;
}
// Quantizes one head row into token `t` of the slot at `slot_base` (docs/contract.md §4.2):
// data bytes at t·64 + c/2, scale bytes linear (K, index_k) or 4-token
// swizzled (V). slot_base is 32-B aligned (base 16-B aligned, page strides
// % 32, slot size block_size·72 with block_size % 4 == 0), so the 8-byte stores
// are aligned.
M3_HD void nvfp4_store_head(const float* y, bool has_sf, float sf, bool v_swizzle, uint8_t* slot_base, int t,
                             int block_size) {
  uint32_t sw[2] = {0u, 0u};
#pragma unroll
  for (int g = 0; g < kHeadDim / kNvfp4Group; ++g) {
    uint2 d;
    const uint8_t s8 = nvfp4_quant16(y + kNvfp4Group * g, has_sf, sf, &d);
    *reinterpret_cast<uint2*>(slot_base + nvfp4_data_offset(t, kNvfp4Group * g)) = d;
    if (v_swizzle)
      slot_base[nvfp4_scale_offset_v(t, g, block_size)] = s8;
    else
      sw[g / 4] |= static_cast<uint32_t>(s8) << (8 * (g % 4));
  }
  if (!v_swizzle) *reinterpret_cast<uint2*>(slot_base + nvfp4_scale_offset_linear(t, 0, block_size)) = make_uint2(sw[0], sw[1]);
}

// ------------------------------------------------- FP8 / BF16 cache rows
// One head row into a flat cache row at dst (docs/contract.md §4.3): FP8 = the q_fp8_out
// rule e4m3_satfinite_rn(y · sf), BF16 = bf16_rn(y). index_k passes sf = 1:
// the contract has no multiply there, and y · 1 = y exactly for every non-NaN
// f32 (IEEE; ±0, ±inf and subnormals included) while any NaN encodes to 0x7F
// either way, so one code path serves K, V and index_k. dst is 16-B aligned
// (cache bases 16-B aligned, strides % 16, rows start at column 0).
M3_HD void flat_store_head(const float* y, int32_t dtype, float sf, uint8_t* dst) {
  if (dtype == kCacheFp8)
    store_e4m3_head<true>(y, sf, dst);
  else
    store_bf16_head(y, reinterpret_cast<uint16_t*>(dst));
}

// ------------------------------------------------------ one (row, head)
// RMSNorm + RoPE of a q / k / index_q / index_k row, position guarded.
M3_HD void norm_rope_head(const EpilogueParams& p, int64_t m, const uint16_t* w, float* x) {
  const int64_t pos = clamp_position(p.positions[m], p.max_position, p.error_flags);
  rms_norm_head(x, w, p.eps);
  rope64_head(x, p.cos_sin_cache + pos * kRopeDim);
}

// The complete epilogue of token row `m` and projection head `head`
// (0 <= head < nq + 2nkv + niq + nik) on its 128 accumulator values x
// (modified in place). Writes that row's outputs / cache token, with the
// guards of docs/contract.md §5.3; `own` says which cache rows are this
// row's to write (slot_owners.cuh).
M3_HD void epilogue_head_row(const EpilogueParams& p, const SlotOwners& own, int64_t m, int head, float* x) {
  const HeadInfo h = head_info(head, p.nq, p.nkv, p.niq);
  // FP8 / BF16 cache row of a k / v / index_k head: one store site after the
  // switch (one copy of each encoder in the kernel, not one per head kind).
  uint8_t* flat_dst = nullptr;
  int32_t flat_dtype = kCacheNvfp4;
  float flat_sf = 1.0f;
  switch (h.kind) {
    case HeadKind::Q: {
      norm_rope_head(p, m, p.q_norm_weight, x);
      const int64_t off = (m * p.nq + h.index) * kHeadDim;
      if (p.q_out != nullptr) store_bf16_head(x, p.q_out + off);
      if (p.q_fp8_out != nullptr) store_e4m3_head<true>(x, p.qinv, p.q_fp8_out + off);
      break;
    }
    case HeadKind::IndexQ: {
      norm_rope_head(p, m, p.index_q_norm_weight, x);
      store_e4m3_head<false>(x, 1.0f, p.index_q_out + (m * p.niq + h.index) * kHeadDim);
      break;
    }
    case HeadKind::K:
    case HeadKind::V: {
      SlotAddr sa;
      const int64_t s = p.slot_mapping[m];
      if (!own.owns(s, false, m) ||
          !resolve_slot(s, p.num_blocks, p.block_size, p.error_flags, M3QKV_FLAG_SLOT_OUT_OF_RANGE, &sa))
        break;
      const bool is_k = h.kind == HeadKind::K;
      if (is_k) norm_rope_head(p, m, p.k_norm_weight, x);
      if (p.kv_dtype == kCacheNvfp4) {
        uint8_t* slot = p.kv_cache + nvfp4_slot_base(sa.page, 2 * h.index + (is_k ? 0 : 1), p.kv_page_stride,
                                                     p.block_size);
        nvfp4_store_head(x, true, is_k ? p.k_sf : p.v_sf, !is_k, slot, sa.token, p.block_size);
      } else {
        flat_dst = (is_k ? p.kv_cache : p.v_cache) + kv_flat_offset(sa.page, sa.token, h.index, 0, p.kv_page_stride,
                                                                    p.kv_token_stride, p.kv_head_stride,
                                                                    flat_elem_bytes(p.kv_dtype));
        flat_dtype = p.kv_dtype;
        flat_sf = is_k ? p.k_sf : p.v_sf;
      }
      break;
    }
    case HeadKind::IndexK: {
      SlotAddr sa;
      const int64_t s = p.index_slot_mapping[m];
      if (!own.owns(s, true, m) || !resolve_slot(s, p.num_index_blocks, p.block_size, p.error_flags,
                                                 M3QKV_FLAG_INDEX_SLOT_OUT_OF_RANGE, &sa))
        break;
      norm_rope_head(p, m, p.index_k_norm_weight, x);
      if (p.ix_dtype == kCacheNvfp4) {
        uint8_t* slot = p.index_cache + nvfp4_slot_base(sa.page, 0, p.index_page_stride, p.block_size);
        nvfp4_store_head(x, false, 1.0f, false, slot, sa.token, p.block_size);
      } else {
        flat_dst = p.index_cache +
                   index_flat_offset(sa.page, sa.token, 0, p.index_page_stride, flat_elem_bytes(p.ix_dtype));
        flat_dtype = p.ix_dtype;
        flat_sf = 1.0f;  // unit scale (see flat_store_head)
      }
      break;
    }
  }
  if (flat_dst != nullptr) flat_store_head(x, flat_dtype, flat_sf, flat_dst);
}

}  // namespace epi
}  // namespace m3qkv
