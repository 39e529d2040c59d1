// CPU checks of the SM90 pieces that need no GPU: the wgmma shared-memory
// descriptor encoding (ptx/wgmma.cuh) against values worked by hand from the
// PTX ISA table, and the property the SM90 epilogue relies on: in the wgmma
// accumulator fragment every column a lane holds has RMSNorm class lane % 4.
#include <gtest/gtest.h>

#include <cstdint>

#include "common/numerics.h"
#include "ptx/wgmma.cuh"

namespace {

using m3qkv::wgmma::desc_advance;
using m3qkv::wgmma::make_desc_kmajor_sw128;
using m3qkv::wgmma::make_smem_desc;

// PTX ISA "Matrix Descriptor Format" (wgmma): start >> 4 in bits 0-13, LBO >> 4
// in 16-29, SBO >> 4 in 32-45, swizzle in 62-63 (1 = 128 B).
TEST(Sm90Desc, KMajorSwizzle128WorkedExample) {
  // 0x12400 >> 4 = 0x1240; LBO 16 -> 1 << 16; SBO 1024 -> 0x40 << 32; 1 << 62.
  EXPECT_EQ(make_desc_kmajor_sw128(0x12400u), 0x4000004000011240ull);
  // The highest 16-B aligned shared address that fits 14 bits after >> 4.
  EXPECT_EQ(make_desc_kmajor_sw128(0x3FFF0u) & 0x3FFFull, 0x3FFFull);
}

TEST(Sm90Desc, FieldsDoNotOverlap) {
  EXPECT_EQ(make_smem_desc(0, 0, 0, 0), 0ull);
  EXPECT_EQ(make_smem_desc(0x3FFF0u, 0, 0, 0), 0x3FFFull);
  EXPECT_EQ(make_smem_desc(0, 0x3FFF0u, 0, 0), 0x3FFFull << 16);
  EXPECT_EQ(make_smem_desc(0, 0, 0x3FFF0u, 0), 0x3FFFull << 32);
  EXPECT_EQ(make_smem_desc(0, 0, 0, 3), 3ull << 62);
}

TEST(Sm90Desc, KStepAdvancesStartAddressOnly) {
  const uint64_t d = make_desc_kmajor_sw128(0x8000u);
  // 32 bytes (one k32 e4m3 / one k16 bf16 slice) = 2 units of 16 B.
  EXPECT_EQ(desc_advance(d, 32), make_desc_kmajor_sw128(0x8000u + 32));
  EXPECT_EQ(desc_advance(d, 96), make_desc_kmajor_sw128(0x8000u + 96));
}

// Fragment: lane l holds columns 8j + 2(l%4) + b (ptx/wgmma.cuh). docs/contract.md §3.1's
// class is (c >> 1) & 3, so each lane's columns form exactly one class, in
// ascending order as j, b ascend.
TEST(Sm90Fragment, EveryColumnOfALaneHasClassLaneMod4) {
  for (int lane = 0; lane < 32; ++lane) {
    int prev = -1;
    for (int j = 0; j < 16; ++j)
      for (int b = 0; b < 2; ++b) {
        const int c = 8 * j + 2 * (lane % 4) + b;
        EXPECT_EQ(m3qkv::rms_class(c), lane % 4) << "lane " << lane << " column " << c;
        EXPECT_GT(c, prev);
        prev = c;
      }
  }
}

}  // namespace
