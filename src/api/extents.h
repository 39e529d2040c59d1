// The device bytes one call touches, buffer by buffer, as named extents:
// the overlap rule of validation (docs/contract.md §5.2: written buffers must not overlap
// each other or any input) and checked mode's allocation bounds use the same
// list, so "the buffer as the call touches it" is written once.
//
// An extent is `count` pieces of `span` bytes, `period` bytes apart, from
// `lo` (a contiguous buffer: count 1). Paged caches are one piece per page
// (span = the packed page, period = the page stride), so two buffers that
// interleave page by page (one allocation holding K pages and V pages, the
// index cache in the padding of KV pages) are disjoint exactly when their
// pieces are. A layout that interleaves at a finer grain (per token or per
// head) is described with that grain's period and span, or, when validation
// proves two buffers disjoint with a rule of their own, with one `group`:
// the K and V elements of an FP8 / BF16 KV cache (check_kv_pair_disjoint,
// exact for every nesting of page, token and head) may interleave at any
// grain inside one allocation, so their extents are, page by page, the hulls
// of each page's elements (the hull of all of them when pages interleave with
// each other) and the pair is left to that rule.
#pragma once

#include <cstdint>

#include "m3qkv/m3qkv.h"

namespace m3qkv::api {

struct Extent {
  const char* name = nullptr;
  uint64_t lo = 0;
  uint64_t span = 0;    // bytes per piece
  uint64_t period = 0;  // bytes from one piece to the next (>= span)
  uint64_t count = 0;   // pieces
  bool written = false;
  int group = 0;  // nonzero: disjoint from the other extents of its group by a layout rule (not compared)
  uint64_t hi() const { return lo + (count - 1) * period + span; }  // one past the last byte
};

// Room for the largest call (the fused op: 18 buffers).

// The group of the K and V elements of an FP8 / BF16 KV cache.
constexpr int kGroupFlatKv = 1;
constexpr int kMaxExtents = 20;

struct Extents {
  Extent items[kMaxExtents];
  int count = 0;
};

// The extents of a validated call with m > 0; NULL optional pointers and
// fields the call does not use (index_* when niq / nik are 0) are left out.
// `fn` opens the message when a buffer would wrap around the address space
// (M3QKV_ERROR_TOO_LARGE).
m3qkv_status fused_extents(const char* fn, const m3qkv_fused_args& a, Extents* out);
m3qkv_status insert_extents(const char* fn, const m3qkv_insert_args& a, Extents* out);
m3qkv_status gemm_extents(const char* fn, const m3qkv_gemm_args& a, Extents* out);
m3qkv_status quantize_extents(const char* fn, const m3qkv_quantize_args& a, Extents* out);
m3qkv_status prepare_extents(const char* fn, const m3qkv_prepare_args& a, Extents* out);

// Whether two extents share a byte.
bool extents_overlap(const Extent& a, const Extent& b);

// M3QKV_ERROR_INVALID_ARGUMENT naming both buffers when a written extent
// shares a byte with any other (pairs of one nonzero group excepted). Sorts `e` by start (O(n log n) plus the
// pairs whose hulls meet; no allocation).
m3qkv_status check_overlaps(const char* fn, Extents* e);

}  // namespace m3qkv::api
