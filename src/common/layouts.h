// The layouts of docs/contract.md §4, written once: the F8_128x4 scale-factor
// swizzle, the NVFP4 paged-cache addressing and the FP8 / BF16 ("flat") cache
// addressing. Used by every kernel, the golden model and the tests (host + device).
#pragma once

#include <stdint.h>

#include "common/numerics.h"

namespace m3qkv {

// ------------------------------------------------------------ F8_128x4
// Scale matrix of R rows and C = K/32 columns, padded to Rp = ceil(R/128)·128,
// Cp = ceil(C/4)·4. Byte (r, c) lives at
//   ((r/128)·Kt + c/4)·512 + (r%32)·16 + ((r%128)/32)·4 + (c%4),  Kt = Cp/4.
// One 512-byte chunk holds 128 rows × 4 scale columns (= one BK = 128 stage),
// exactly the [32][16] source tcgen05.cp.32x128b.warpx4 wants.
M3_HD int64_t f8_128x4_padded_rows(int64_t rows) { return (rows + 127) / 128 * 128; }
M3_HD int64_t f8_128x4_padded_cols(int64_t cols) { return (cols + 3) / 4 * 4; }
M3_HD int64_t f8_128x4_bytes(int64_t rows, int64_t cols) {
  return f8_128x4_padded_rows(rows) * f8_128x4_padded_cols(cols);
}
M3_HD int64_t f8_128x4_offset(int64_t r, int64_t c, int64_t cols) {
  const int64_t kt = f8_128x4_padded_cols(cols) / 4;
  return ((r / 128) * kt + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + (c % 4);
}
// Inside one 512-B chunk (128 rows × 4 scale columns, what a kernel stage
// holds): the byte of row r's 4 scales, one 32-bit word (f8_128x4_offset of
// (r, 0) modulo the chunk, r in [0, 128)).
M3_HD int f8_128x4_chunk_word(int r) { return (r % 32) * 16 + (r / 32) * 4; }

// Alignment of every output and cache row start, which the kernels' 16-byte
// vector stores of whole rows rely on (epilogue_head_row's uint4 stores, the
// quad epilogue's transposed stores). api/validate.cpp provides it: base
// pointers 16-B aligned, every stride a multiple of it (static asserts there).
constexpr int kRowStoreAlign = 16;

// --------------------------------------------------------- NVFP4 cache
// A slot holds block_size tokens: 64 data bytes per token (two e2m1 per byte,
// element 2i in the low nibble of byte i), then 8 scale bytes per token.
constexpr int kNvfp4DataBytes = 64;
constexpr int kNvfp4ScaleBytes = 8;
constexpr int kNvfp4TokenBytes = kNvfp4DataBytes + kNvfp4ScaleBytes;  // 72

M3_HD int64_t nvfp4_slot_bytes(int block_size) { return static_cast<int64_t>(block_size) * kNvfp4TokenBytes; }
// Bytes one KV page needs (2·nkv slots: K of head h in slot 2h, V in 2h+1).
M3_HD int64_t kv_page_min_bytes(int nkv, int block_size) { return 2ll * nkv * nvfp4_slot_bytes(block_size); }

// Byte offset of slot `s` of page `p` from the cache base.
M3_HD int64_t nvfp4_slot_base(int64_t page, int slot, int64_t page_stride, int block_size) {
  return page * page_stride + static_cast<int64_t>(slot) * nvfp4_slot_bytes(block_size);
}
// Data byte holding columns (c, c+1) of token t (c even), relative to the slot base.
M3_HD int64_t nvfp4_data_offset(int t, int c) { return static_cast<int64_t>(t) * kNvfp4DataBytes + c / 2; }
// Scale byte of group g (= c/16) of token t: K and index_k are linear.
M3_HD int64_t nvfp4_scale_offset_linear(int t, int g, int block_size) {
  return static_cast<int64_t>(block_size) * kNvfp4DataBytes + static_cast<int64_t>(t) * kNvfp4ScaleBytes + g;
}
// V uses a 4-token swizzle: ((t/4)·4 + g/2)·8 + (g%2)·4 + t%4.
M3_HD int64_t nvfp4_scale_offset_v(int t, int g, int block_size) {
  return static_cast<int64_t>(block_size) * kNvfp4DataBytes +
         ((static_cast<int64_t>(t / 4) * 4 + g / 2) * 8 + (g % 2) * 4 + t % 4);
}
// Group g + d lies this many bytes after group g, whatever t and g: in the
// linear layout d; in the V swizzle 4d, since (g / 2)·8 + (g % 2)·4 = 4g (CPU
// test Nvfp4Cache.ScaleGroupDelta checks both). The lane-row epilogues' lanes
// store groups g0, g0 + d, ... of a token from one address.
M3_HD constexpr int nvfp4_scale_group_delta(bool v_swizzle, int d) { return v_swizzle ? 4 * d : d; }

// ------------------------------------------------- FP8 / BF16 caches (§4b)
// Cache formats (m3qkv_cache_dtype of the public header).
constexpr int32_t kCacheNvfp4 = 0;
constexpr int32_t kCacheFp8 = 1;
constexpr int32_t kCacheBf16 = 2;
// Bytes per element of a flat (FP8 / BF16) cache.
M3_HD int flat_elem_bytes(int32_t dtype) { return dtype == kCacheBf16 ? 2 : 1; }
// Byte offset of K (or V) element (page, token, kv head, col) from kv_cache
// (or v_cache): p·page_stride + t·token_stride + h·head_stride + c·e.
M3_HD int64_t kv_flat_offset(int64_t page, int token, int head, int col, int64_t page_stride, int64_t token_stride,
                             int64_t head_stride, int elem_bytes) {
  return page * page_stride + static_cast<int64_t>(token) * token_stride + static_cast<int64_t>(head) * head_stride +
         static_cast<int64_t>(col) * elem_bytes;
}
// Byte offset of index_k element (page, token, col) from index_cache: tokens
// of a page are packed rows of 128 elements.
M3_HD int64_t index_flat_offset(int64_t page, int token, int col, int64_t page_stride, int elem_bytes) {
  return page * page_stride + (static_cast<int64_t>(token) * kHeadDim + col) * elem_bytes;
}
// Bytes of one flat index page (block_size tokens of 128 elements).
M3_HD int64_t index_flat_page_bytes(int block_size, int elem_bytes) {
  return static_cast<int64_t>(block_size) * kHeadDim * elem_bytes;
}

// Head layout of the projection: [q × nq | k × nkv | v × nkv | index_q × niq | index_k × nik].
enum class HeadKind : int { Q = 0, K = 1, V = 2, IndexQ = 3, IndexK = 4 };
struct HeadInfo {
  HeadKind kind;
  int index;  // head index within its kind
};
M3_HD HeadInfo head_info(int head, int nq, int nkv, int niq) {
  if (head < nq) return {HeadKind::Q, head};
  head -= nq;
  if (head < nkv) return {HeadKind::K, head};
  head -= nkv;
  if (head < nkv) return {HeadKind::V, head};
  head -= nkv;
  if (head < niq) return {HeadKind::IndexQ, head};
  return {HeadKind::IndexK, head - niq};
}
M3_HD int total_heads(int nq, int nkv, int niq, int nik) { return nq + 2 * nkv + niq + nik; }
// The heads with a cache row (k, v, index_k: 2·nkv + nik of them) and the
// others (q, index_q: nq + niq), each numbered in head order.
M3_HD int cache_heads(int nkv, int nik) { return 2 * nkv + nik; }
M3_HD int query_heads(int nq, int niq) { return nq + niq; }
M3_HD int cache_head(int c, int nq, int nkv, int niq) { return c < 2 * nkv ? nq + c : nq + niq + c; }
M3_HD int query_head(int t, int nq, int nkv) { return t < nq ? t : t + 2 * nkv; }

}  // namespace m3qkv
