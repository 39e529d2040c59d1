// Layout formulas of common/layouts.h against offsets computed by hand from
// docs/contract.md §4 (each expected number is worked out in the comment next to it).
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "common/layouts.h"

namespace {

using namespace m3qkv;

// F8_128x4: ((r/128)·Kt + c/4)·512 + (r%32)·16 + ((r%128)/32)·4 + (c%4), Kt = Cp/4.
TEST(F8_128x4, HandComputedOffsets) {
  // R = 300 rows, K = 512 -> C = 16 scale columns, Cp = 16, Kt = 4, Rp = 384.
  const int64_t C = 16;
  EXPECT_EQ(f8_128x4_padded_rows(300), 384);
  EXPECT_EQ(f8_128x4_bytes(300, C), 6144);                // 384 · 16
  EXPECT_EQ(f8_128x4_offset(0, 0, C), 0);
  EXPECT_EQ(f8_128x4_offset(1, 0, C), 16);                // (1%32)·16
  EXPECT_EQ(f8_128x4_offset(32, 0, C), 4);                // ((32%128)/32)·4
  EXPECT_EQ(f8_128x4_offset(0, 1, C), 1);                 // c%4
  EXPECT_EQ(f8_128x4_offset(0, 4, C), 512);               // (c/4)·512
  EXPECT_EQ(f8_128x4_offset(127, 3, C), 511);             // 31·16 + 3·4 + 3
  EXPECT_EQ(f8_128x4_offset(128, 0, C), 2048);            // (1·4 + 0)·512
  EXPECT_EQ(f8_128x4_offset(5, 6, C), 594);               // (0+1)·512 + 5·16 + 0 + 2
  EXPECT_EQ(f8_128x4_offset(200, 13, C), 3721);           // (1·4+3)·512 + 8·16 + 2·4 + 1 = 3584+128+8+1
  EXPECT_EQ(f8_128x4_offset(299, 15, C), 5815);           // (2·4+3)·512 + 11·16 + 1·4 + 3 = 5632 + 176 + 4 + 3
}

TEST(F8_128x4, HandComputedOffsetsPaddedColumns) {
  // K = 96 -> C = 3, Cp = 4, Kt = 1 (a scale matrix whose width is not a multiple of 4).
  EXPECT_EQ(f8_128x4_padded_cols(3), 4);
  EXPECT_EQ(f8_128x4_bytes(130, 3), 1024);                // Rp = 256, Cp = 4
  EXPECT_EQ(f8_128x4_offset(130, 2, 3), 546);             // (1·1 + 0)·512 + 2·16 + 0·4 + 2
  EXPECT_EQ(f8_128x4_offset(97, 1, 3), 29);               // 0·512 + (97%32 = 1)·16 + (97/32 = 3)·4 + 1
}

// Every (r, c) of the padded matrix maps to a distinct byte inside the buffer.
TEST(F8_128x4, Bijection) {
  for (int64_t rows : {1, 128, 129, 300}) {
    for (int64_t cols : {4, 8, 12, 48, 192}) {
      std::set<int64_t> seen;
      const int64_t rp = f8_128x4_padded_rows(rows), cp = f8_128x4_padded_cols(cols);
      for (int64_t r = 0; r < rp; ++r)
        for (int64_t c = 0; c < cp; ++c) {
          const int64_t o = f8_128x4_offset(r, c, cols);
          ASSERT_GE(o, 0);
          ASSERT_LT(o, f8_128x4_bytes(rows, cols));
          ASSERT_TRUE(seen.insert(o).second) << r << "," << c;
        }
      EXPECT_EQ(int64_t(seen.size()), f8_128x4_bytes(rows, cols));
    }
  }
}

// NVFP4 cache: slot s of page p at p·stride + s·bs·72; data t·64 + c/2;
// K / index_k scales bs·64 + t·8 + g; V scales bs·64 + ((t/4)·4 + g/2)·8 + (g%2)·4 + t%4.
TEST(Nvfp4Cache, HandComputedOffsets) {
  const int bs = 16, nkv = 2;
  EXPECT_EQ(nvfp4_slot_bytes(bs), 1152);                  // 16·72
  EXPECT_EQ(kv_page_min_bytes(nkv, bs), 4608);            // 2·2·1152
  const int64_t stride = 4608 + 64;
  EXPECT_EQ(nvfp4_slot_base(3, 2, stride, bs), 16320);    // 3·4672 + 2·1152 = 14016 + 2304
  EXPECT_EQ(nvfp4_slot_base(0, 3, stride, bs), 3456);     // V of head 1: 3·1152
  EXPECT_EQ(nvfp4_data_offset(5, 10), 325);               // 5·64 + 5
  EXPECT_EQ(nvfp4_data_offset(15, 126), 1023);            // 15·64 + 63: last data byte
  EXPECT_EQ(nvfp4_scale_offset_linear(0, 0, bs), 1024);   // 16·64
  EXPECT_EQ(nvfp4_scale_offset_linear(5, 3, bs), 1067);   // 1024 + 5·8 + 3
  EXPECT_EQ(nvfp4_scale_offset_linear(15, 7, bs), 1151);  // 1024 + 120 + 7: last byte of the slot
  EXPECT_EQ(nvfp4_scale_offset_v(5, 3, bs), 1069);        // 1024 + (1·4 + 1)·8 + 1·4 + 1 = 1024 + 45
  EXPECT_EQ(nvfp4_scale_offset_v(6, 0, bs), 1058);        // 1024 + (4 + 0)·8 + 0 + 2 = 1024 + 34
  EXPECT_EQ(nvfp4_scale_offset_v(3, 7, bs), 1055);        // 1024 + (0 + 3)·8 + 4 + 3 = 1024 + 31
  EXPECT_EQ(nvfp4_scale_offset_v(15, 7, bs), 1151);       // 1024 + (12 + 3)·8 + 4 + 3 = 1024 + 127
  EXPECT_EQ(nvfp4_scale_offset_v(0, 1, bs), 1028);        // 1024 + 0 + 4 + 0
  // block_size 128 (M3 serving): scales start at 8192.
  EXPECT_EQ(nvfp4_scale_offset_v(127, 6, 128), 9211);     // 8192 + (124 + 3)·8 + 0·4 + 3 = 8192 + 1019
  EXPECT_EQ(nvfp4_scale_offset_linear(127, 6, 128), 9214);  // 8192 + 1016 + 6
}

// The lane-row epilogues store group g + d's scale at a fixed delta from
// group g's (layouts.h nvfp4_scale_group_delta): true for every token and
// every pair of groups of a token.
TEST(Nvfp4Cache, ScaleGroupDelta) {
  using namespace m3qkv;
  for (int bs : {16, 64, 128})
    for (int t = 0; t < bs; ++t)
      for (int g = 0; g < 8; ++g)
        for (int d = 1; g + d < 8; ++d) {
          EXPECT_EQ(nvfp4_scale_offset_linear(t, g + d, bs) - nvfp4_scale_offset_linear(t, g, bs),
                    nvfp4_scale_group_delta(false, d));
          EXPECT_EQ(nvfp4_scale_offset_v(t, g + d, bs) - nvfp4_scale_offset_v(t, g, bs),
                    nvfp4_scale_group_delta(true, d));
        }
}

// Within a slot, data + scales of all tokens tile the 72·bs bytes exactly once.
TEST(Nvfp4Cache, SlotBytesTiledOnce) {
  for (int bs : {4, 16, 64, 128}) {
    for (bool v : {false, true}) {
      std::vector<int> hits(size_t(nvfp4_slot_bytes(bs)), 0);
      for (int t = 0; t < bs; ++t) {
        for (int c = 0; c < 128; c += 2) hits[size_t(nvfp4_data_offset(t, c))]++;
        for (int g = 0; g < 8; ++g)
          hits[size_t(v ? nvfp4_scale_offset_v(t, g, bs) : nvfp4_scale_offset_linear(t, g, bs))]++;
      }
      for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i], 1) << "bs " << bs << " v " << v << " byte " << i;
    }
  }
}

// FP8 / BF16 caches (docs/contract.md §4.3): K/V element at p·page + t·token + h·head + c·e;
// index_k at p·page + t·128·e + c·e.
TEST(FlatCache, HandComputedOffsets) {
  EXPECT_EQ(flat_elem_bytes(kCacheFp8), 1);
  EXPECT_EQ(flat_elem_bytes(kCacheBf16), 2);
  // vLLM flash layout, bf16, block 16, nkv 4: head 256 B, token 1024 B, page 16384 B.
  EXPECT_EQ(kv_flat_offset(0, 0, 0, 0, 16384, 1024, 256, 2), 0);
  EXPECT_EQ(kv_flat_offset(0, 0, 0, 127, 16384, 1024, 256, 2), 254);         // 127·2
  EXPECT_EQ(kv_flat_offset(0, 0, 3, 1, 16384, 1024, 256, 2), 770);           // 3·256 + 2
  EXPECT_EQ(kv_flat_offset(2, 5, 1, 10, 16384, 1024, 256, 2), 38164);        // 32768 + 5120 + 256 + 20
  EXPECT_EQ(kv_flat_offset(2, 15, 3, 127, 16384, 1024, 256, 2), 49150);      // 32768 + 15360 + 768 + 254: last byte - 1
  // fp8, head-major page [nkv][bs][128] with 16-B padded rows: token 144, head 144·128 = 18432.
  EXPECT_EQ(kv_flat_offset(1, 3, 2, 7, 4 * 18432, 144, 18432, 1), 111031);   // 73728 + 432 + 36864 + 7
  // index cache: fp8 block 128 -> rows of 128 B; bf16 rows of 256 B.
  EXPECT_EQ(index_flat_page_bytes(128, 1), 16384);
  EXPECT_EQ(index_flat_page_bytes(16, 2), 4096);
  EXPECT_EQ(index_flat_offset(3, 100, 5, 16384 + 64, 1), 62149);             // 3·16448 + 12800 + 5 = 49344 + 12805
  EXPECT_EQ(index_flat_offset(0, 15, 127, 4096, 2), 4094);                   // 15·256 + 254
  EXPECT_EQ(index_flat_offset(5, 0, 1, 4096, 2), 20482);                     // 5·4096 + 2
}

TEST(HeadLayout, HandComputed) {
  // nq 16, nkv 2, niq 2, nik 1: [q0..q15 | k0 k1 | v0 v1 | iq0 iq1 | ik0] = 23 heads
  EXPECT_EQ(total_heads(16, 2, 2, 1), 23);
  auto is = [](HeadInfo h, HeadKind k, int i) { return h.kind == k && h.index == i; };
  EXPECT_TRUE(is(head_info(0, 16, 2, 2), HeadKind::Q, 0));
  EXPECT_TRUE(is(head_info(15, 16, 2, 2), HeadKind::Q, 15));
  EXPECT_TRUE(is(head_info(16, 16, 2, 2), HeadKind::K, 0));
  EXPECT_TRUE(is(head_info(17, 16, 2, 2), HeadKind::K, 1));
  EXPECT_TRUE(is(head_info(18, 16, 2, 2), HeadKind::V, 0));
  EXPECT_TRUE(is(head_info(19, 16, 2, 2), HeadKind::V, 1));
  EXPECT_TRUE(is(head_info(20, 16, 2, 2), HeadKind::IndexQ, 0));
  EXPECT_TRUE(is(head_info(21, 16, 2, 2), HeadKind::IndexQ, 1));
  EXPECT_TRUE(is(head_info(22, 16, 2, 2), HeadKind::IndexK, 0));
  // dense layer (niq = nik = 0): nq 8, nkv 1 -> [q0..q7 | k0 | v0]
  EXPECT_TRUE(is(head_info(8, 8, 1, 0), HeadKind::K, 0));
  EXPECT_TRUE(is(head_info(9, 8, 1, 0), HeadKind::V, 0));
  EXPECT_EQ(total_heads(8, 1, 0, 0), 10);
}

}  // namespace

// cache_head / query_head number the k, v, index_k heads and the q, index_q
// heads in head order; together they cover every head exactly once.
TEST(HeadLayout, CacheAndQueryHeadsPartitionTheHeads) {
  struct S { int nq, nkv, niq, nik; };
  for (const S s : {S{16, 1, 1, 1}, S{32, 2, 2, 1}, S{64, 4, 4, 1}, S{8, 1, 1, 1}, S{16, 2, 0, 0}}) {
    const int heads = m3qkv::total_heads(s.nq, s.nkv, s.niq, s.nik);
    ASSERT_EQ(m3qkv::cache_heads(s.nkv, s.nik) + m3qkv::query_heads(s.nq, s.niq), heads);
    std::vector<int> seen(size_t(heads), 0);
    int prev = -1;
    for (int c = 0; c < m3qkv::cache_heads(s.nkv, s.nik); ++c) {
      const int h = m3qkv::cache_head(c, s.nq, s.nkv, s.niq);
      ASSERT_GE(h, 0);
      ASSERT_LT(h, heads);
      EXPECT_GT(h, prev) << "head order";
      prev = h;
      const m3qkv::HeadKind k = m3qkv::head_info(h, s.nq, s.nkv, s.niq).kind;
      EXPECT_TRUE(k == m3qkv::HeadKind::K || k == m3qkv::HeadKind::V || k == m3qkv::HeadKind::IndexK) << h;
      ++seen[size_t(h)];
    }
    prev = -1;
    for (int t = 0; t < m3qkv::query_heads(s.nq, s.niq); ++t) {
      const int h = m3qkv::query_head(t, s.nq, s.nkv);
      ASSERT_GE(h, 0);
      ASSERT_LT(h, heads);
      EXPECT_GT(h, prev) << "head order";
      prev = h;
      const m3qkv::HeadKind k = m3qkv::head_info(h, s.nq, s.nkv, s.niq).kind;
      EXPECT_TRUE(k == m3qkv::HeadKind::Q || k == m3qkv::HeadKind::IndexQ) << h;
      ++seen[size_t(h)];
    }
    for (int h = 0; h < heads; ++h) EXPECT_EQ(seen[size_t(h)], 1) << "head " << h;
  }
  // TP4 by hand: heads [q0..q15 | k 16 | v 17 | iq 18 | ik 19].
  EXPECT_EQ(m3qkv::cache_head(0, 16, 1, 1), 16);
  EXPECT_EQ(m3qkv::cache_head(1, 16, 1, 1), 17);
  EXPECT_EQ(m3qkv::cache_head(2, 16, 1, 1), 19);
  EXPECT_EQ(m3qkv::query_head(15, 16, 1), 15);
  EXPECT_EQ(m3qkv::query_head(16, 16, 1), 18);
}

// The kernels' in-chunk form of the F8_128x4 layout: row r's 4 scale bytes of
// one 512-B chunk are the 32-bit word at f8_128x4_chunk_word(r), the full
// offset of (r, 0..3) modulo the chunk.
TEST(Layouts, F8ChunkWordIsTheOffsetWithinTheChunk) {
  for (int64_t r = 0; r < 384; ++r)
    for (int c = 0; c < 4; ++c)
      EXPECT_EQ(m3qkv::f8_128x4_offset(r, c, 4) % 512, m3qkv::f8_128x4_chunk_word(static_cast<int>(r % 128)) + c)
          << "row " << r << " col " << c;
  EXPECT_EQ(m3qkv::f8_128x4_chunk_word(33), 16 + 4);
}
