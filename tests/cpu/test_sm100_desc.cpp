// Field-by-field tests of the SM100 descriptor builders (src/sm100/desc.h)
// against the PTX ISA tables, with worked values derived by hand below.
// The bit positions used by the decoders here are written from the tables
// (PTX ISA 9.x Table 43 for kind::mxf8f6f4, Table 40 for the shared-memory
// descriptor), not taken from desc.h, so a wrong shift in desc.h fails.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "common/test_util.h"
#include "sm100/desc.h"

namespace {

using m3qkv::sm100::make_idesc_mxf8f6f4;
using m3qkv::sm100::MxFormat;

uint64_t field(uint64_t v, int lo, int hi) {  // inclusive bit range [lo, hi]
  return (v >> lo) & ((uint64_t{1} << (hi - lo + 1)) - 1);
}

// ---------------------------------------------------------------- idesc
TEST(Sm100Desc, IdescM128N128WorkedValue) {
  // Table 43: N>>3 = 128>>3 = 16 in bits 17-22  -> 16 << 17 = 0x0020'0000
  //           scale type UE8M0 = 1 in bit 23      ->  1 << 23 = 0x0080'0000
  //           M>>7 = 1 in bits 27-28              ->  1 << 27 = 0x0800'0000
  //           formats E4M3 = 0, K-major (transpose 0), ids 0, dense: 0
  // sum = 0x08A0'0000
  EXPECT_EQ(make_idesc_mxf8f6f4(128, 128), 0x08A00000u);
}

TEST(Sm100Desc, IdescM256N256WorkedValue) {
  // N>>3 = 32 -> 32 << 17 = 0x0040'0000; UE8M0 -> 0x0080'0000;
  // M>>7 = 2 -> 2 << 27 = 0x1000'0000.  sum = 0x10C0'0000
  EXPECT_EQ(make_idesc_mxf8f6f4(256, 256), 0x10C00000u);
}

TEST(Sm100Desc, IdescDecodeShapesWorkedValues) {
  // The decode variant's m128nNT (weights = A, tokens = B, NT = 32 / 64 / 128):
  // N>>3 = 4 -> 4 << 17 = 0x0008'0000; UE8M0 0x0080'0000; M>>7 = 1 -> 0x0800'0000
  EXPECT_EQ(make_idesc_mxf8f6f4(128, 32), 0x08880000u);
  // N>>3 = 8 -> 0x0010'0000
  EXPECT_EQ(make_idesc_mxf8f6f4(128, 64), 0x08900000u);
  // K slice 2 of a stage at N = 32: + 2 << 4 + 2 << 29 = 0x4000'0020
  EXPECT_EQ(m3qkv::sm100::idesc_with_sf_ids(make_idesc_mxf8f6f4(128, 32), 2, 2), 0x48880020u);
  // PTX ISA §9.7.16.2.1 Table 39, kind::mxf8f6f4 dense cta_group::1: 128xNxK,
  // N = 8 .. 256 in steps of 8 (the decode variant uses 32, 64, 128).
  for (int n : {32, 64, 128}) EXPECT_TRUE(m3qkv::sm100::mma_shape_valid(1, 128, n));
}

TEST(Sm100Desc, IdescScaleFactorIdsWorkedValues) {
  // sub-block k = 3 of a stage: SFB id 3 in bits 4-5 -> 0x30, SFA id 3 in
  // bits 29-30 -> 3 << 29 = 0x6000'0000.  0x08A0'0000 + 0x30 + 0x6000'0000:
  EXPECT_EQ(make_idesc_mxf8f6f4(128, 128, 3, 3), 0x68A00030u);
  // k = 2 on m256n256: 2 << 4 = 0x20, 2 << 29 = 0x4000'0000 -> 0x50C0'0020
  EXPECT_EQ(make_idesc_mxf8f6f4(256, 256, 2, 2), 0x50C00020u);
  // A and B ids are independent fields: sfa 1, sfb 2 on m128n256:
  // N>>3 = 32 -> 0x0040'0000; UE8M0 0x0080'0000; M>>7 = 1 -> 0x0800'0000;
  // sfb 2 -> 0x20; sfa 1 -> 0x2000'0000.  sum = 0x28C0'0020
  EXPECT_EQ(make_idesc_mxf8f6f4(128, 256, 1, 2), 0x28C00020u);
  // idesc_with_sf_ids replaces both ids and nothing else.
  for (uint32_t a = 0; a < 4; ++a)
    for (uint32_t b = 0; b < 4; ++b)
      EXPECT_EQ(m3qkv::sm100::idesc_with_sf_ids(make_idesc_mxf8f6f4(256, 256, 3 - a, 3 - b), a, b),
                make_idesc_mxf8f6f4(256, 256, a, b));
}

TEST(Sm100Desc, IdescFieldsForAllValidShapes) {
  for (int cg = 1; cg <= 2; ++cg) {
    for (int m : {128, 256}) {
      for (int n = 8; n <= 256; n += 8) {
        if (!m3qkv::sm100::mma_shape_valid(cg, m, n)) continue;
        for (uint32_t k = 0; k < 4; ++k) {
          const uint64_t d = make_idesc_mxf8f6f4(m, n, k, (k + 1) & 3);
          EXPECT_EQ(field(d, 0, 1), 0u);                  // reserved
          EXPECT_EQ(field(d, 2, 2), 0u);                  // dense
          EXPECT_EQ(field(d, 3, 3), 0u);                  // reserved
          EXPECT_EQ(field(d, 4, 5), (k + 1) & 3);         // B scale factor id
          EXPECT_EQ(field(d, 6, 6), 0u);                  // reserved
          EXPECT_EQ(field(d, 7, 9), 0u);                  // atype E4M3
          EXPECT_EQ(field(d, 10, 12), 0u);                // btype E4M3
          EXPECT_EQ(field(d, 13, 14), 0u);                // no negation
          EXPECT_EQ(field(d, 15, 16), 0u);                // both K-major
          EXPECT_EQ(field(d, 17, 22), uint64_t(n) >> 3);  // N >> 3
          EXPECT_EQ(field(d, 23, 23), 1u);                // UE8M0
          EXPECT_EQ(field(d, 24, 26), 0u);                // reserved
          EXPECT_EQ(field(d, 27, 28), uint64_t(m) >> 7);  // M >> 7
          EXPECT_EQ(field(d, 29, 30), k);                 // A scale factor id
          EXPECT_EQ(field(d, 31, 31), 0u);                // reserved
        }
      }
    }
  }
}

TEST(Sm100Desc, IdescFormatsField) {
  // E5M2 = 1 (A) and E2M1 = 5 (B): 1 << 7 = 0x80, 5 << 10 = 0x1400.
  EXPECT_EQ(make_idesc_mxf8f6f4(128, 128, 0, 0, MxFormat::E5M2, MxFormat::E2M1), 0x08A00000u | 0x80u | 0x1400u);
}

TEST(Sm100Desc, MmaShapeRules) {
  EXPECT_TRUE(m3qkv::sm100::mma_shape_valid(1, 128, 128));
  EXPECT_TRUE(m3qkv::sm100::mma_shape_valid(1, 128, 8));
  EXPECT_FALSE(m3qkv::sm100::mma_shape_valid(1, 256, 256));  // M = 256 needs the CTA pair
  EXPECT_TRUE(m3qkv::sm100::mma_shape_valid(2, 256, 256));
  EXPECT_FALSE(m3qkv::sm100::mma_shape_valid(2, 256, 248));  // cta_group::2: N step 16
  EXPECT_FALSE(m3qkv::sm100::mma_shape_valid(1, 128, 264));
  EXPECT_FALSE(m3qkv::sm100::mma_shape_valid(3, 128, 128));
}

// ---------------------------------------------------------------- sdesc
TEST(Sm100Desc, OperandDescWorkedValue) {
  // A tile at shared address 0x400 (1024, 1024-B aligned):
  //   start  = 0x400 >> 4 = 0x40            -> bits 0-13:  0x0000'0000'0000'0040
  //   LBO    = 0 (one swizzle atom along K) -> bits 16-29: 0
  //   SBO    = 1024 >> 4 = 0x40             -> 0x40 << 32: 0x0000'0040'0000'0000
  //   fixed  = 0b001 at bit 46              ->             0x0000'4000'0000'0000
  //   base offset 0, LBO mode 0
  //   swizzle 128B = 2 at bit 61            -> 2 << 61:    0x4000'0000'0000'0000
  // sum = 0x4000'4040'0000'0040
  EXPECT_EQ(m3qkv::sm100::make_operand_desc(0x400), 0x4000404000000040ull);
  // K slice 1 of the stage starts 32 bytes later: start field + 32/16 = +2.
  EXPECT_EQ(m3qkv::sm100::operand_desc_advance(0x4000404000000040ull, 32), 0x4000404000000042ull);
  // K slice 3: +96 bytes = +6.
  EXPECT_EQ(m3qkv::sm100::operand_desc_advance(0x4000404000000040ull, 96), 0x4000404000000046ull);
}

TEST(Sm100Desc, SfDescWorkedValue) {
  // SF chunk at shared address 0x1A200 (= 107008):
  //   start = 0x1A200 >> 4 = 0x1A20
  //   SBO   = 128 >> 4 = 8 -> 8 << 32 = 0x0000'0008'0000'0000
  //   fixed bit 46          ->          0x0000'4000'0000'0000
  //   no swizzle (0), LBO 0
  // sum = 0x0000'4008'0000'1A20
  EXPECT_EQ(m3qkv::sm100::make_sf_desc(0x1A200), 0x0000400800001A20ull);
}

TEST(Sm100Desc, SmemDescFieldsRandomized) {
  std::mt19937_64 rng(m3qkv_test::test_seed());
  std::printf("seed %llu\n", static_cast<unsigned long long>(m3qkv_test::test_seed()));
  using m3qkv::sm100::Swizzle;
  const Swizzle modes[] = {Swizzle::None, Swizzle::B128_Atom32, Swizzle::B128, Swizzle::B64, Swizzle::B32};
  const uint64_t codes[] = {0, 1, 2, 4, 6};  // Table 40 swizzle codes
  for (int it = 0; it < 2000; ++it) {
    const uint32_t start = static_cast<uint32_t>(rng() % (228 * 1024)) & ~15u;
    const uint32_t lbo = static_cast<uint32_t>(rng() % (1 << 18)) & ~15u;
    const uint32_t sbo = static_cast<uint32_t>(rng() % (1 << 18)) & ~15u;
    const uint32_t base = static_cast<uint32_t>(rng() % 8);
    const int mi = static_cast<int>(rng() % 5);
    const uint64_t d = m3qkv::sm100::make_smem_desc(start, lbo, sbo, modes[mi], base);
    EXPECT_EQ(field(d, 0, 13), (start & 0x3FFFFu) >> 4);
    EXPECT_EQ(field(d, 14, 15), 0u);
    EXPECT_EQ(field(d, 16, 29), (lbo & 0x3FFFFu) >> 4);
    EXPECT_EQ(field(d, 30, 31), 0u);
    EXPECT_EQ(field(d, 32, 45), (sbo & 0x3FFFFu) >> 4);
    EXPECT_EQ(field(d, 46, 48), 1u);  // fixed 0b001
    EXPECT_EQ(field(d, 49, 51), base);
    EXPECT_EQ(field(d, 52, 52), 0u);  // LBO relative
    EXPECT_EQ(field(d, 53, 60), 0u);  // fixed 0
    EXPECT_EQ(field(d, 61, 63), codes[mi]);
  }
}

TEST(Sm100Desc, TmemAddress) {
  // lane in bits 31-16, column in 15-0: lane 96, column 224 -> 0x0060'00E0
  EXPECT_EQ(m3qkv::sm100::tmem_addr(96, 224), 0x006000E0u);
  EXPECT_EQ(m3qkv::sm100::tmem_addr(0, 511), 0x000001FFu);
}

// The builders are usable in constant expressions (the kernel folds them).
static_assert(make_idesc_mxf8f6f4(128, 128) == 0x08A00000u, "constexpr idesc");
static_assert(m3qkv::sm100::make_operand_desc(0) == 0x4000404000000000ull, "constexpr sdesc");

}  // namespace
