// The quad transpose of the register epilogue's row stores (common/quad_store.h,
// epi::quad_store_row) on a CPU model of the four lanes: the same packing,
// butterfly, byte permutation and chunk offsets as the device code, with the
// xor shuffle played by reading the partner lane's sent word. Every row byte
// must receive exactly the byte the old per-j store put at that address (the
// old address taken from the layout formulas the old stores used), and no
// byte outside the row may be written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "common/layouts.h"
#include "common/quad_store.h"

namespace {

using namespace m3qkv;

constexpr int kUnits = 16;  // units per lane (j = 0..15)

// The old per-j store of unit j of lane q: its byte offset in the row, from
// the formulas of the old quad_row_epilogue (c0 = 2q).
//  U = 1: NVFP4 data, slot_base[nvfp4_data_offset(t, 8j + c0)], row = token t's data;
//  U = 2: e4m3 (q_fp8_out / index_q_out element off + 8j, off = row·128 + c0; the
//         FP8 caches' slot_base + 8j, slot_base = element c0 of the row);
//  U = 4: bf16 (q_out element off + 8j, 2 bytes each; the BF16 caches'
//         slot_base + 16j, slot_base = element c0 of the row).
int64_t old_unit_offset(int u, int q, int j) {
  const int c0 = 2 * q;
  switch (u) {
    case 1: {
      const int t = 5;
      return nvfp4_data_offset(t, 8 * j + c0) - nvfp4_data_offset(t, 0);
    }
    case 2: {
      // The FP8 KV row and q_fp8_out agree: check both, return one.
      const int64_t kv =
          kv_flat_offset(3, 7, 1, c0, 4096, 512, 128, 1) + 8 * j - kv_flat_offset(3, 7, 1, 0, 4096, 512, 128, 1);
      const int64_t ix = index_flat_offset(2, 9, c0, 8192, 1) + 8 * j - index_flat_offset(2, 9, 0, 8192, 1);
      const int64_t qo = (8 * j + c0) * 1;  // e4m3 element off + 8j - row start
      EXPECT_EQ(kv, qo);
      EXPECT_EQ(ix, qo);
      return qo;
    }
    default: {
      const int64_t kv =
          kv_flat_offset(3, 7, 1, c0, 8192, 1024, 256, 2) + 16 * j - kv_flat_offset(3, 7, 1, 0, 8192, 1024, 256, 2);
      const int64_t ix = index_flat_offset(2, 9, c0, 8192, 2) + 16 * j - index_flat_offset(2, 9, 0, 8192, 2);
      const int64_t qo = (8 * j + c0) * 2;  // bf16 element off + 8j - row start, in bytes
      EXPECT_EQ(kv, qo);
      EXPECT_EQ(ix, qo);
      return qo;
    }
  }
}

// CPU model of quad_store_row<U> for the four lanes: w[L] = lane L's packed
// words; returns the bytes each lane stores as (offset, 16 bytes) records.
struct Chunk {
  int lane, offset;
  uint8_t bytes[16];
};
template <int U>
std::vector<Chunk> quad_store_row_model(const uint32_t (&w)[4][4 * U]) {
  std::vector<Chunk> out;
  for (int g = 0; g < U; ++g) {
    uint32_t t[4][4];
    for (int l = 0; l < 4; ++l)
      for (int r = 0; r < 4; ++r) t[l][r] = w[l][4 * g + r];
    for (int m = 1; m <= 2; m *= 2) {
      for (int p = 0; p < 2; ++p) {
        uint32_t sent[4];
        for (int l = 0; l < 4; ++l) sent[l] = quad_xpose_send(t[l], l, m, p);
        for (int l = 0; l < 4; ++l) quad_xpose_recv(t[l], l, m, p, sent[l ^ m]);  // __shfl_xor_sync(v, m)
      }
    }
    for (int l = 0; l < 4; ++l) {
      uint32_t c[4];
      quad_chunk_bytes<U>(t[l], c);
      Chunk ch;
      ch.lane = l;
      ch.offset = quad_chunk_offset(l, g);
      std::memcpy(ch.bytes, c, 16);  // little-endian, as the uint4 store
      out.push_back(ch);
    }
  }
  return out;
}

template <int U>
void check_unit_size(uint32_t seed) {
  constexpr int kRowBytes = 4 * kUnits * U;
  // Distinct byte values over the row: any misplaced byte shows.
  std::vector<uint8_t> value(256);
  std::iota(value.begin(), value.end(), 0);
  std::shuffle(value.begin(), value.end(), std::mt19937(seed));

  std::vector<int> expected(kRowBytes, -1);
  uint32_t w[4][4 * U] = {};
  for (int q = 0; q < 4; ++q) {
    for (int j = 0; j < kUnits; ++j) {
      const int64_t o = old_unit_offset(U, q, j);
      ASSERT_EQ(o, (4 * j + q) * U) << "U=" << U << " q=" << q << " j=" << j;
      uint32_t unit = 0;
      for (int b = 0; b < U; ++b) {
        ASSERT_EQ(expected[o + b], -1) << "two old stores meet at byte " << o + b;
        expected[o + b] = value[o + b];
        unit |= static_cast<uint32_t>(value[o + b]) << (8 * b);
      }
      // Bits above the unit (the old stores' casts dropped them) must not leak.
      if (U < 4) unit |= 0xdeadbeefu << (8 * U);
      quad_put_unit<U>(w[q], j, unit);
    }
  }
  for (int b = 0; b < kRowBytes; ++b) ASSERT_NE(expected[b], -1) << "old stores leave byte " << b << " unwritten";

  std::vector<int> got(kRowBytes, -1), writes(kRowBytes, 0);
  const std::vector<Chunk> chunks = quad_store_row_model<U>(w);
  ASSERT_EQ(static_cast<int>(chunks.size()), 4 * U);
  for (const Chunk& c : chunks) {
    ASSERT_EQ(c.offset % kRowStoreAlign, 0) << "lane " << c.lane;
    ASSERT_GE(c.offset, 0);
    ASSERT_LE(c.offset + 16, kRowBytes) << "lane " << c.lane << " writes past the row";
    for (int b = 0; b < 16; ++b) {
      ++writes[c.offset + b];
      got[c.offset + b] = c.bytes[b];
    }
  }
  for (int b = 0; b < kRowBytes; ++b) {
    EXPECT_EQ(writes[b], 1) << "U=" << U << " byte " << b;
    EXPECT_EQ(got[b], expected[b]) << "U=" << U << " byte " << b << " (old store: lane " << (b / U) % 4 << ", unit "
                                   << b / U / 4 << ", byte " << b % U << ")";
  }
}

TEST(QuadStore, Nvfp4DataBytesU1MatchOldStores) {
  for (uint32_t seed : {1u, 2u, 3u}) check_unit_size<1>(seed);
}
TEST(QuadStore, E4m3PairsU2MatchOldStores) {
  for (uint32_t seed : {1u, 2u, 3u}) check_unit_size<2>(seed);
}
TEST(QuadStore, Bf16PairsU4MatchOldStores) {
  for (uint32_t seed : {1u, 2u, 3u}) check_unit_size<4>(seed);
}

// Each store instruction (round g) of the quad covers 64 contiguous bytes.
TEST(QuadStore, EachRoundIsContiguous) {
  for (int g = 0; g < 4; ++g)
    for (int q = 0; q < 4; ++q) EXPECT_EQ(quad_chunk_offset(q, g), 64 * g + 16 * q);
}

// The host model of prmt / __byte_perm (PTX ISA "prmt", default mode).
TEST(QuadStore, BytePermHandComputed) {
  const uint32_t a = 0x33221100u, b = 0x77665544u;
  EXPECT_EQ(byte_perm(a, b, 0x3210u), a);
  EXPECT_EQ(byte_perm(a, b, 0x7654u), b);
  EXPECT_EQ(byte_perm(a, b, 0x5140u), 0x55114400u);
  EXPECT_EQ(byte_perm(a, b, 0x7362u), 0x77336622u);
  EXPECT_EQ(byte_perm(a, b, 0x5410u), 0x55441100u);
  EXPECT_EQ(byte_perm(a, b, 0x7632u), 0x77663322u);
}

// The row starts quad_store_row gets are 16-B aligned for every shape
// validation accepts (base 16-B aligned, NVFP4 page stride % 32, block_size %
// 4; flat strides % 16), and the NVFP4 linear scale row is 8-B aligned.
TEST(QuadStore, RowStartsAligned) {
  for (int bs : {4, 8, 16, 64, 128}) {
    for (int nkv : {1, 2, 4}) {
      const int64_t page = kv_page_min_bytes(nkv, bs);
      for (int64_t stride : {page, page + 32, page + 96}) {
        for (int64_t p : {0, 1, 3}) {
          for (int s = 0; s < 2 * nkv; ++s) {
            const int64_t base = nvfp4_slot_base(p, s, stride, bs);
            for (int t = 0; t < bs; ++t) {
              ASSERT_EQ((base + nvfp4_data_offset(t, 0)) % kRowStoreAlign, 0) << bs << " " << s << " " << t;
              ASSERT_EQ((base + nvfp4_scale_offset_linear(t, 0, bs)) % 8, 0) << bs << " " << s << " " << t;
              for (int g = 0; g < 8; ++g)
                ASSERT_EQ(nvfp4_scale_offset_linear(t, g, bs), nvfp4_scale_offset_linear(t, 0, bs) + g);
            }
          }
        }
      }
    }
  }
  for (int e : {1, 2})
    for (int64_t ps : {16, 4096, 4112})
      for (int64_t ts : {16, 128 * e, 128 * e + 16})
        for (int64_t hs : {16, 256, 272})
          for (int t : {0, 1, 5})
            for (int h : {0, 3}) {
              ASSERT_EQ(kv_flat_offset(2, t, h, 0, ps, ts, hs, e) % kRowStoreAlign, 0);
              ASSERT_EQ(index_flat_offset(2, t, 0, ps, e) % kRowStoreAlign, 0);
            }
}

}  // namespace
