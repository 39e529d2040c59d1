// SM100 (tcgen05) descriptor builders: constexpr, host + device, so the CPU
// tests check them field by field and the kernel folds them to immediates.
//
// Sources (PTX ISA 9.x, §9.7.16 "TensorCore 5th Generation Family Instructions"):
//  * Table 43 "Instruction descriptor format for .kind::mxf8f6f4" (§9.7.16.4.2).
//    NOTE: it differs from the f16/f8f6f4 table (Table 42): bits 4-5 are the
//    B scale-factor id (not the D type), bit 23 is the scale type (UE8M0 = 1),
//    M is bits 27-28 as M >> 7 (not 24-28 as M >> 4), bits 29-30 are the A
//    scale-factor id.
//  * Table 40 "Shared memory descriptor layout" (§9.7.16.4.1): start address
//    0-13, LBO 16-29, SBO 32-45 (each (x & 0x3FFFF) >> 4), bits 46-48 fixed
//    0b001, base offset 49-51, LBO mode 52, bits 53-60 fixed 0, swizzle 61-63
//    (0 none, 1 128B with 32B atom, 2 128B, 4 64B, 6 32B; 3/5/7 invalid).
//    Start address, LBO and SBO must be 16-byte aligned; the 128B swizzle
//    pattern repeats every 1024 bytes (Table 41): base offset 0 needs the
//    tile at a 1024-byte boundary.
//  * Tensor Memory address: lane in bits 31-16, column in bits 15-0 (§9.7.16.1.1).
#pragma once

#include <stdint.h>

#if defined(__CUDACC__)
#define M3_SM100_HDC __host__ __device__ constexpr
#else
#define M3_SM100_HDC constexpr
#endif

namespace m3qkv::sm100 {

// ------------------------------------------------------ instruction descriptor
// Table 43 element formats (atype/btype) for kind::mxf8f6f4.
enum class MxFormat : uint32_t { E4M3 = 0, E5M2 = 1, E2M3 = 3, E3M2 = 4, E2M1 = 5 };

namespace idesc_bits {
constexpr uint32_t kSfbIdShift = 4;  // bits 4-5
constexpr uint32_t kAFmtShift = 7;   // bits 7-9
constexpr uint32_t kBFmtShift = 10;  // bits 10-12
constexpr uint32_t kNegAShift = 13;
constexpr uint32_t kNegBShift = 14;
constexpr uint32_t kTransAShift = 15;     // 0 = K-major
constexpr uint32_t kTransBShift = 16;     // 0 = K-major
constexpr uint32_t kNShift = 17;          // bits 17-22, N >> 3
constexpr uint32_t kScaleTypeShift = 23;  // 1 = UE8M0
constexpr uint32_t kMShift = 27;          // bits 27-28, M >> 7
constexpr uint32_t kSfaIdShift = 29;      // bits 29-30
}  // namespace idesc_bits

// Shape rules of tcgen05.mma for kind::mxf8f6f4 (§9.7.16.2.1 matrix shapes,
// dense): cta_group::1 M = 128 (M = 64 also exists; unused here),
// N in [8, 256] step 8; cta_group::2 M = 128 or 256, N in [16, 256] step 16.
M3_SM100_HDC bool mma_shape_valid(int cta_group, int m, int n) {
  return cta_group == 1   ? (m == 128 && n >= 8 && n <= 256 && n % 8 == 0)
         : cta_group == 2 ? ((m == 128 || m == 256) && n >= 16 && n <= 256 && n % 16 == 0)
                          : false;
}

// Block-scaled MXFP8 instruction descriptor; A and B K-major, no negation,
// dense, UE8M0 scales; sfa_id / sfb_id select the byte of the 32-bit TMEM
// scale word (= the 32-wide K block inside a 128-wide stage).
M3_SM100_HDC uint32_t make_idesc_mxf8f6f4(int m, int n, uint32_t sfa_id = 0, uint32_t sfb_id = 0,
                                          MxFormat a = MxFormat::E4M3, MxFormat b = MxFormat::E4M3) {
  using namespace idesc_bits;
  return ((sfb_id & 3u) << kSfbIdShift) | (static_cast<uint32_t>(a) << kAFmtShift) |
         (static_cast<uint32_t>(b) << kBFmtShift) | (0u << kNegAShift) | (0u << kNegBShift) | (0u << kTransAShift) |
         (0u << kTransBShift) | ((static_cast<uint32_t>(n) >> 3) << kNShift) | (1u << kScaleTypeShift) |
         ((static_cast<uint32_t>(m) >> 7) << kMShift) | ((sfa_id & 3u) << kSfaIdShift);
}
// Replaces both scale-factor ids (sub-block k of a BK = 128 stage uses byte k
// of the SFA and SFB words).
M3_SM100_HDC uint32_t idesc_with_sf_ids(uint32_t idesc, uint32_t sfa_id, uint32_t sfb_id) {
  using namespace idesc_bits;
  return (idesc & ~((3u << kSfbIdShift) | (3u << kSfaIdShift))) | ((sfb_id & 3u) << kSfbIdShift) |
         ((sfa_id & 3u) << kSfaIdShift);
}

// ----------------------------------------------------- shared memory descriptor
enum class Swizzle : uint32_t { None = 0, B128_Atom32 = 1, B128 = 2, B64 = 4, B32 = 6 };

namespace sdesc_bits {
constexpr uint32_t kStartShift = 0;     // bits 0-13
constexpr uint32_t kLboShift = 16;      // bits 16-29
constexpr uint32_t kSboShift = 32;      // bits 32-45
constexpr uint32_t kFixedShift = 46;    // bits 46-48 = 0b001
constexpr uint32_t kBaseOffShift = 49;  // bits 49-51
constexpr uint32_t kLboModeShift = 52;  // 0 = relative byte offset
constexpr uint32_t kSwizzleShift = 61;  // bits 61-63
}  // namespace sdesc_bits

// matrix-descriptor-encode(x) = (x & 0x3FFFF) >> 4
M3_SM100_HDC uint64_t sdesc_encode(uint32_t bytes) { return static_cast<uint64_t>((bytes & 0x3FFFFu) >> 4); }

M3_SM100_HDC uint64_t make_smem_desc(uint32_t start_addr, uint32_t lbo_bytes, uint32_t sbo_bytes, Swizzle swz,
                                     uint32_t base_offset = 0) {
  using namespace sdesc_bits;
  return (sdesc_encode(start_addr) << kStartShift) | (sdesc_encode(lbo_bytes) << kLboShift) |
         (sdesc_encode(sbo_bytes) << kSboShift) | (uint64_t{1} << kFixedShift) |
         (static_cast<uint64_t>(base_offset & 7u) << kBaseOffShift) | (uint64_t{0} << kLboModeShift) |
         (static_cast<uint64_t>(swz) << kSwizzleShift);
}

// Operand tile of A or B: rows of 128 K-bytes (e4m3, BK = 128), 128B swizzle
// as TMA writes it (CU_TENSOR_MAP_SWIZZLE_128B), tile at a 1024-B boundary.
// One 128-B swizzle atom spans the whole K extent, so LBO (stride between
// atoms along K) is never used (0); SBO = 8 rows × 128 B = 1024 B between
// 8-row core-matrix groups.
constexpr uint32_t kOperandRowBytes = 128;
constexpr uint32_t kOperandSbo = 8 * kOperandRowBytes;
M3_SM100_HDC uint64_t make_operand_desc(uint32_t tile_smem_addr) {
  return make_smem_desc(tile_smem_addr, 0, kOperandSbo, Swizzle::B128);
}
// Advancing to the k-th 32-byte K slice inside the swizzle atom: the hardware
// applies the swizzle to the computed address (the XOR pattern depends on
// address bits 4-6 vs 7-9), so the slice starts `32·k` bytes after the tile
// start; only the start-address field changes (no carry: the tile start is
// 1024-B aligned, so its encoded low 6 bits are zero and +6 fits).
M3_SM100_HDC uint64_t operand_desc_advance(uint64_t desc, uint32_t bytes) {
  return desc + static_cast<uint64_t>(bytes >> 4);
}

// tcgen05.cp.32x128b source: a [32][16]-byte matrix, no swizzle, K-major.
// Core matrices are 8 rows × 16 B (128 contiguous bytes); SBO = 128 B between
// the 4 row groups; only one core matrix along the 16-byte row, so LBO = 0.
// One 512-B F8_128x4 chunk is exactly this matrix (layouts.h).
constexpr uint32_t kSfChunkBytes = 512;
constexpr uint32_t kSfSbo = 8 * 16;
M3_SM100_HDC uint64_t make_sf_desc(uint32_t chunk_smem_addr) {
  return make_smem_desc(chunk_smem_addr, 0, kSfSbo, Swizzle::None);
}

// -------------------------------------------------------------- TMEM address
M3_SM100_HDC uint32_t tmem_addr(uint32_t lane, uint32_t col) { return (lane << 16) | (col & 0xFFFFu); }

}  // namespace m3qkv::sm100
