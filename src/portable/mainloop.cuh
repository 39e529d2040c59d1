// The portable MXFP8 GEMM mainloop (sm_80+), shared by the fused kernel and
// the bf16-output GEMM: one CTA tile of BM = 64 rows x BN = 128 columns (one
// head), K stepped by BK = 128, 8 warps as 4 (M) x 2 (N), each warp 16 x 64
// with mma.sync.m16n8k16 bf16 -> f32.
//
// Dequantization: each e4m3 operand value is multiplied by its e8m0 block
// scale in f32 and stored to shared memory as bf16. That bf16 is EXACT (so the
// MMA sees the true MXFP8 values and the accumulator is the f32 sum of exact
// products) whenever v·2^e is representable in bf16: an e4m3 value has at most
// 4 significant bits with its lowest at >= 2^-9 and |v| <= 448 = 1.75·2^8, bf16
// has 8 significant bits, exponents up to 127 and subnormals down to 2^-133;
// so every e4m3 value is exact for scale bytes b in [3, 246] (e = b - 127 in
// [-124, 119]). Data from m3qkv_mxfp8_quantize on bf16 input is exact for every
// byte it can produce: e <= 119 because a bf16 amax is < 2^128, and with
// e = -127 the block is tiny bf16 data whose quotients are multiples of 2^-6.
// Outside that domain (hand-made scales 0..2 or 247..254) the product is
// rounded to bf16 RN (or overflows to inf). The alternative, folding sa·sb per
// 32-K block into the f32 accumulator, would double the accumulator registers
// and add a rounding per block for no gain on realistic data; the scale
// exponent domain above covers every MXFP8 tensor a quantizer produces.
//
// bf16 activations (x_bf16, W8A16): the A tile is loaded as bf16 and stored
// to shared memory unchanged (no scale, no conversion: the MMA sees the exact
// bf16 values); the weight is dequantized as above. Same tiles, same staging,
// same MMA order: the instance is picked per call (gemm_tile, kXBf16).
#pragma once

#include <stdint.h>

#include "common/layouts.h"
#include "common/numerics.h"
#include "common/slot_owners.cuh"
#include "ptx/cvt.cuh"
#include "ptx/ldmatrix.cuh"
#include "ptx/mma_sync.cuh"

namespace m3qkv {
namespace portable {

constexpr int kBM = 64;
constexpr int kBN = 128;  // one head
constexpr int kBK = 128;
constexpr int kThreads = 256;
constexpr int kWarpsM = 4;
constexpr int kWarpsN = 2;
constexpr int kWarpM = kBM / kWarpsM;  // 16: one m16 tile per warp
constexpr int kWarpN = kBN / kWarpsN;  // 64: eight n8 tiles per warp
constexpr int kNTiles = kWarpN / 8;
constexpr int kKSteps = kBK / 16;
static_assert(kWarpsM * kWarpsN * 32 == kThreads, "warp grid");
static_assert(kWarpM == 16 && kNTiles % 2 == 0, "one ldmatrix.x4 per A fragment, one per B fragment pair");
static_assert(kBN == kHeadDim, "a CTA tile is one head");

// Shared memory: bf16 tiles with rows padded by 16 bytes so the 8 row
// addresses of one ldmatrix 8x8 matrix fall in 8 different 16-B bank groups.
constexpr int kLdAB = kBK + 8;  // bf16 elements per smem row
constexpr int kSmemABytes = kBM * kLdAB * 2;
constexpr int kSmemBBytes = kBN * kLdAB * 2;
// The f32 accumulator tile (epilogue) reuses the same bytes. The epilogue
// works on it in place, one thread per row reading column c of its row: an odd
// row pitch puts the 32 rows of a warp in 32 different banks.
constexpr int kLdC = kBN + 1;
constexpr int kSmemCBytes = kBM * kLdC * 4;
constexpr int kSmemTileBytes = (kSmemABytes + kSmemBBytes) > kSmemCBytes ? (kSmemABytes + kSmemBBytes) : kSmemCBytes;
// The fused kernel's slot-owner table of its tile's rows (one head kind per
// tile: kBM keys; common/slot_owners.cuh), after the tiles.
using OwnerTable = epi::SlotOwnerTable<kBM>;
constexpr int kSmemOwnersOff = (kSmemTileBytes + 15) / 16 * 16;
constexpr int kSmemBytes = kSmemOwnersOff + static_cast<int>(sizeof(OwnerTable));
static_assert((kLdAB * 2) % 16 == 0 && (kLdAB * 2) % 128 == 16, "ldmatrix rows: 16-B aligned, conflict-free");
static_assert(kSmemABytes % 16 == 0, "B tile 16-B aligned");
static_assert(kSmemBytes <= 99 * 1024, "fits the sm_80+ opt-in smem with room for 2 CTAs/SM");
// NOTE: the kernels use __launch_bounds__(kThreads, 1): at 2 CTAs/SM (128
// registers) ptxas spills (mainloop: a few words; epilogue: ~2 KB), so they
// run at 1 CTA (8 warps) per SM. Good enough for the portable baseline.

// Global -> register staging: 16-byte chunks, 8 per 128-byte tile row.
constexpr int kChunksPerRow = kBK / 16;
constexpr int kAChunks = kBM * kChunksPerRow / kThreads;  // 2 per thread
constexpr int kBChunks = kBN * kChunksPerRow / kThreads;  // 4 per thread
static_assert(kAChunks * kThreads == kBM * kChunksPerRow && kBChunks * kThreads == kBN * kChunksPerRow, "chunks");

struct StageRegs {
  uint4 a[kAChunks];
  uint4 a_hi[kAChunks];   // bf16 activations: a = the chunk's first 8 bf16, a_hi the next 8
  uint4 b[kBChunks];
  uint32_t sa[kAChunks];  // e8m0 scale byte of each chunk (MXFP8 activations)
  uint32_t sb[kBChunks];
};

// The A operand: MXFP8 (xq, xsf) or bf16 (xb, kXBf16).
struct XOperand {
  const uint8_t* xq;
  const uint8_t* xsf;
  const uint16_t* xb;
};

// Loads stage k0 (a multiple of 128) into registers. Chunk i = tid + kThreads·j
// covers tile row i / 8, K elements (i % 8)·16 .. +15 (16 bytes of e4m3, or
// 32 bytes of bf16 with kXBf16), i.e. scale column k0/32 + (i % 8)/2. A rows
// >= M read as zero (scale 1).
template <bool kXBf16>
__device__ __forceinline__ void load_stage(StageRegs& r, const XOperand& x, const uint8_t* wq, const uint8_t* wsf,
                                           int64_t M, int64_t K, int64_t m0, int64_t n0, int64_t k0) {
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t scols = K / kMxBlock;
  const int cc = tid % kChunksPerRow;
  const int64_t scol = k0 / kMxBlock + cc / 2;
#pragma unroll
  for (int j = 0; j < kAChunks; ++j) {
    const int64_t row = m0 + (tid + kThreads * j) / kChunksPerRow;
    if constexpr (kXBf16) {
      if (row < M) {
        const uint4* src = reinterpret_cast<const uint4*>(x.xb + row * K + k0 + cc * 16);
        r.a[j] = src[0];
        r.a_hi[j] = src[1];
      } else {
        r.a[j] = r.a_hi[j] = make_uint4(0u, 0u, 0u, 0u);
      }
    } else {
      if (row < M) {
        r.a[j] = *reinterpret_cast<const uint4*>(x.xq + row * K + k0 + cc * 16);
        r.sa[j] = x.xsf[f8_128x4_offset(row, scol, scols)];
      } else {
        r.a[j] = make_uint4(0u, 0u, 0u, 0u);
        r.sa[j] = 127u;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kBChunks; ++j) {
    const int64_t row = n0 + (tid + kThreads * j) / kChunksPerRow;
    r.b[j] = *reinterpret_cast<const uint4*>(wq + row * K + k0 + cc * 16);
    r.sb[j] = wsf[f8_128x4_offset(row, scol, scols)];
  }
}

// e4m3 byte · sc (sc = 2^e from the e8m0 byte), branch-free: the 7 magnitude
// bits placed at f32 bits 20..26 read as an f32 equal to |v|·2^-120 for every
// e4m3 code, normal (exponent field e -> 2^(e-127)) and subnormal alike (e = 0
// gives the f32 subnormal m·2^-129 = m·2^-9·2^-120), so one exact multiply by
// 2^120 gives |v| (no FTZ: the kernels are built without -ftz). Same value as
// mul_rn(e4m3_to_f32(b), sc) for every byte and scale (checked on the CPU
// over all 256 x 256 pairs); S.1111.111 is NaN.
M3_HD float e4m3_scaled(uint32_t b, float sc) {
  const float mag = mul_rn(bits_f32((b & 0x7fu) << 20), 0x1p120f);
  const float v = mul_rn(bits_f32(f32_bits(mag) | ((b & 0x80u) << 24)), sc);
  return (b & 0x7fu) == 0x7fu ? bits_f32(0x7fc00000u) : v;
}
// Two f32 -> bf16x2 (lo in the low half), RN. Here the values are exact in
// bf16 (see the domain at the top), so the rounding never acts in that domain.
M3_HD uint32_t bf16x2_rn(float lo, float hi) {
#if M3QKV_HAS_CVT_RN_BF16X2_F32
  return cvt_rn_bf16x2_f32(lo, hi);
#else
  return static_cast<uint32_t>(f32_to_bf16_rn_soft(lo)) | (static_cast<uint32_t>(f32_to_bf16_rn_soft(hi)) << 16);
#endif
}

// 16 e4m3 values of one chunk times their e8m0 scale -> 16 bf16 in smem (see
// the exactness domain at the top of this file).
__device__ __forceinline__ void dequant_chunk(uint4 q, uint32_t sbyte, uint16_t* dst) {
  const float sc = e8m0_to_f32(static_cast<uint8_t>(sbyte));
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t word = w[i / 2];
    const int sh = 16 * (i % 2);
    o[i] = bf16x2_rn(e4m3_scaled((word >> sh) & 0xffu, sc), e4m3_scaled((word >> (sh + 8)) & 0xffu, sc));
  }
  reinterpret_cast<uint4*>(dst)[0] = make_uint4(o[0], o[1], o[2], o[3]);
  reinterpret_cast<uint4*>(dst)[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

template <bool kXBf16>
__device__ __forceinline__ void store_stage(const StageRegs& r, uint16_t* smA, uint16_t* smB) {
  const int tid = static_cast<int>(threadIdx.x);
  const int cc = tid % kChunksPerRow;
#pragma unroll
  for (int j = 0; j < kAChunks; ++j) {
    uint16_t* dst = smA + ((tid + kThreads * j) / kChunksPerRow) * kLdAB + cc * 16;
    if constexpr (kXBf16) {  // the 16 bf16 as they are
      reinterpret_cast<uint4*>(dst)[0] = r.a[j];
      reinterpret_cast<uint4*>(dst)[1] = r.a_hi[j];
    } else {
      dequant_chunk(r.a[j], r.sa[j], dst);
    }
  }
#pragma unroll
  for (int j = 0; j < kBChunks; ++j)
    dequant_chunk(r.b[j], r.sb[j], smB + ((tid + kThreads * j) / kChunksPerRow) * kLdAB + cc * 16);
}

// acc[nt][0..1]: tile row wm·16 + lane/4,     cols wn·64 + nt·8 + 2(lane%4) + {0,1}
// acc[nt][2..3]: tile row wm·16 + lane/4 + 8, same cols.
struct WarpCoord {
  int row0;  // wm·16
  int col0;  // wn·64
};
__device__ __forceinline__ WarpCoord warp_coord() {
  const int warp = static_cast<int>(threadIdx.x) / 32;
  return {(warp % kWarpsM) * kWarpM, (warp / kWarpsM) * kWarpN};
}

__device__ __forceinline__ void mma_stage(float (&acc)[kNTiles][4], const uint16_t* smA, const uint16_t* smB) {
  const WarpCoord wc = warp_coord();
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int mi = lane / 8;  // which 8x8 matrix this lane addresses
  const int r8 = lane % 8;
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    // A 16x16: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
    uint32_t a[4];
    ldmatrix_sync_aligned_m8n8_x4_shared_b16(a, smA + (wc.row0 + r8 + (mi & 1) * 8) * kLdAB + ks * 16 + (mi >> 1) * 8);
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np) {
      // B stored [n][k]: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
      // = b[2np][0], b[2np][1], b[2np+1][0], b[2np+1][1].
      uint32_t b4[4];
      ldmatrix_sync_aligned_m8n8_x4_shared_b16(
          b4, smB + (wc.col0 + np * 16 + r8 + (mi >> 1) * 8) * kLdAB + ks * 16 + (mi & 1) * 8);
      const uint32_t b0[2] = {b4[0], b4[1]};
      const uint32_t b1[2] = {b4[2], b4[3]};
      mma_sync_m16n8k16_row_col_f32_bf16_bf16_f32(acc[2 * np], a, b0);
      mma_sync_m16n8k16_row_col_f32_bf16_bf16_f32(acc[2 * np + 1], a, b1);
    }
  }
}

// The whole K loop of one tile. Stage kt+1 is fetched into registers while
// stage kt is multiplied out of shared memory. `smem` holds kSmemBytes.
// Ends with a __syncthreads, so the caller may reuse smem at once.
template <bool kXBf16>
__device__ __forceinline__ void gemm_tile_x(float (&acc)[kNTiles][4], uint8_t* smem, const XOperand& x,
                                            const uint8_t* wq, const uint8_t* wsf, int64_t M, int64_t K, int64_t m0,
                                            int64_t n0) {
  uint16_t* smA = reinterpret_cast<uint16_t*>(smem);
  uint16_t* smB = reinterpret_cast<uint16_t*>(smem + kSmemABytes);
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
  StageRegs r;
  load_stage<kXBf16>(r, x, wq, wsf, M, K, m0, n0, 0);
  const int64_t kstages = K / kBK;
  for (int64_t kt = 0; kt < kstages; ++kt) {
    store_stage<kXBf16>(r, smA, smB);
    __syncthreads();
    if (kt + 1 < kstages) load_stage<kXBf16>(r, x, wq, wsf, M, K, m0, n0, (kt + 1) * kBK);
    mma_stage(acc, smA, smB);
    __syncthreads();
  }
}

// One tile with the call's activations: bf16 when xb != null (x_bf16), else
// MXFP8 (xq, xsf). The branch is uniform over the grid.
__device__ __forceinline__ void gemm_tile(float (&acc)[kNTiles][4], uint8_t* smem, const uint8_t* xq,
                                          const uint8_t* xsf, const uint16_t* xb, const uint8_t* wq,
                                          const uint8_t* wsf, int64_t M, int64_t K, int64_t m0, int64_t n0) {
  const XOperand x{xq, xsf, xb};
  if (xb != nullptr) {
    gemm_tile_x<true>(acc, smem, x, wq, wsf, M, K, m0, n0);
  } else {
    gemm_tile_x<false>(acc, smem, x, wq, wsf, M, K, m0, n0);
  }
}

}  // namespace portable
}  // namespace m3qkv
