// Extents of each call and the overlap rule (see extents.h).
#include "api/extents.h"

#include "common/layouts.h"
#include "host/status.h"

namespace m3qkv::api {
namespace {

using u64 = uint64_t;
using i128 = __int128;

class Builder {
 public:
  Builder(const char* fn, Extents* out) : fn_(fn), out_(out) { out_->count = 0; }

  void pieces(const char* name, const void* p, u64 span, u64 period, u64 count, bool written, int group = 0) {
    if (st_ != M3QKV_SUCCESS || p == nullptr || span == 0 || count == 0) return;
    const u64 lo = reinterpret_cast<uintptr_t>(p);
    u64 last = 0, hi = 0;
    if (__builtin_mul_overflow(count - 1, period, &last) || __builtin_add_overflow(last, span, &last) ||
        __builtin_add_overflow(lo, last, &hi)) {
      st_ = fail(M3QKV_ERROR_TOO_LARGE, "%s: %s = 0x%llx: its %llu pieces of %llu bytes, %llu apart, run past the end "
                 "of the address space", fn_, name, static_cast<unsigned long long>(lo),
                 static_cast<unsigned long long>(count), static_cast<unsigned long long>(span),
                 static_cast<unsigned long long>(period));
      return;
    }
    if (out_->count == kMaxExtents) {
      st_ = fail(M3QKV_ERROR_INTERNAL, "%s: more than %d buffers", fn_, kMaxExtents);
      return;
    }
    out_->items[out_->count++] = Extent{name, lo, span, period, count, written, group};
  }
  void buffer(const char* name, const void* p, int64_t bytes, bool written, int group = 0) {
    pieces(name, p, static_cast<u64>(bytes), static_cast<u64>(bytes), 1, written, group);
  }
  m3qkv_status status() const { return st_; }

 private:
  const char* fn_;
  Extents* out_;
  m3qkv_status st_ = M3QKV_SUCCESS;
};

constexpr bool kIn = false, kOut = true;

// The epilogue buffers, shared by m3qkv_fused_args and m3qkv_insert_args.
template <class A>
void epilogue(Builder& b, const A& a) {
  const int64_t m = a.m;
  b.buffer("positions", a.positions, m * 8, kIn);
  b.buffer("cos_sin_cache", a.cos_sin_cache, a.max_position * 64 * 2, kIn);
  b.buffer("q_norm_weight", a.q_norm_weight, kHeadDim * 2, kIn);
  b.buffer("k_norm_weight", a.k_norm_weight, kHeadDim * 2, kIn);
  b.buffer("slot_mapping", a.slot_mapping, m * 8, kIn);
  if (a.kv_cache_dtype == kCacheNvfp4) {
    // The kernels write only pages of slots < num_blocks·block_size, each
    // page's packed part; the page padding is never touched.
    b.pieces("kv_cache", a.kv_cache, static_cast<u64>(kv_page_min_bytes(a.nkv, a.block_size)),
             static_cast<u64>(a.kv_page_stride), static_cast<u64>(a.num_blocks), kOut);
  } else {
    // FP8 / BF16: page by page, each page the hull of its K (V) elements
    // (one 128-element row plus (extent - 1)·stride for head and token), when
    // the pages do not interleave with each other (page stride >= that span:
    // the page is the outermost dimension), so that another cache may live in
    // the padding between pages as with NVFP4 pages; else the hull of all the
    // elements, pages included. Validation bounded both.
    const int64_t page = kHeadDim * flat_elem_bytes(a.kv_cache_dtype) + (a.nkv - 1) * a.kv_head_stride +
                         (int64_t{a.block_size} - 1) * a.kv_token_stride;
    const bool by_page = a.num_blocks > 1 && a.kv_page_stride >= page;
    const u64 span = static_cast<u64>(by_page ? page : page + (a.num_blocks - 1) * a.kv_page_stride);
    const u64 period = by_page ? static_cast<u64>(a.kv_page_stride) : span;
    const u64 count = by_page ? static_cast<u64>(a.num_blocks) : 1;
    b.pieces("kv_cache", a.kv_cache, span, period, count, kOut, kGroupFlatKv);
    b.pieces("v_cache", a.v_cache, span, period, count, kOut, kGroupFlatKv);
  }
  b.buffer("q_out", a.q_out, m * a.nq * kHeadDim * 2, kOut);
  b.buffer("q_fp8_out", a.q_fp8_out, m * a.nq * kHeadDim, kOut);
  if (a.niq > 0) {
    b.buffer("index_q_norm_weight", a.index_q_norm_weight, kHeadDim * 2, kIn);
    b.buffer("index_q_out", a.index_q_out, m * a.niq * kHeadDim, kOut);
  }
  if (a.nik > 0) {
    b.buffer("index_k_norm_weight", a.index_k_norm_weight, kHeadDim * 2, kIn);
    b.buffer("index_slot_mapping", a.index_slot_mapping, m * 8, kIn);
    const int64_t page = a.index_cache_dtype == kCacheNvfp4
                             ? nvfp4_slot_bytes(a.block_size)
                             : index_flat_page_bytes(a.block_size, flat_elem_bytes(a.index_cache_dtype));
    b.pieces("index_cache", a.index_cache, static_cast<u64>(page), static_cast<u64>(a.index_page_stride),
             static_cast<u64>(a.num_index_blocks), kOut);
  }
  b.buffer("error_flags", a.error_flags, 4, kOut);
}

// Operands of an [m, k] x [n, k]^T GEMM: MXFP8 (the scales as the F8_128x4
// buffers the header documents, rows padded to 128: TMA reads them whole) or
// bf16 activations x_bf16 [m, k] (validation lets one of the two through; the
// NULL ones add nothing).
void gemm_operands(Builder& b, int64_t m, int64_t n, int64_t k, const void* xq, const void* xsf, const void* wq,
                   const void* wsf, const void* x_bf16) {
  b.buffer("xq", xq, m * k, kIn);
  b.buffer("xsf", xsf, f8_128x4_bytes(m, k / kMxBlock), kIn);
  b.buffer("x_bf16", x_bf16, m * k * 2, kIn);
  b.buffer("wq", wq, n * k, kIn);
  b.buffer("wsf", wsf, f8_128x4_bytes(n, k / kMxBlock), kIn);
}

int64_t heads_n(int nq, int nkv, int niq, int nik) { return static_cast<int64_t>(total_heads(nq, nkv, niq, nik)) * kHeadDim; }

// Does a piece of periodic `s` meet the contiguous range [lo, hi)?
bool pieces_meet_range(const Extent& s, u64 lo, u64 hi) {
  const u64 first = lo < s.lo + s.span ? 0 : (lo - s.lo - s.span) / s.period + 1;
  return first < s.count && s.lo + first * s.period < hi;
}

// Two periodic extents with the same period P, a starting no later than b:
// pieces a_i and b_j meet iff d - a.span < (i - j)·P < d + b.span with
// d = b.lo - a.lo. The open interval is at most 2P long (span <= period), so
// only the two largest multiples of P below d + b.span can lie in it.
bool same_period_pieces_meet(const Extent& a, const Extent& b) {
  const i128 p = a.period;
  const i128 d = static_cast<i128>(b.lo) - static_cast<i128>(a.lo);
  const i128 t1 = (d + static_cast<i128>(b.span) - 1) / p;  // d + span - 1 >= 0
  for (i128 t = t1; t >= t1 - 1; --t) {
    const bool in_range = t <= static_cast<i128>(a.count) - 1 && t >= -(static_cast<i128>(b.count) - 1);
    if (in_range && t * p > d - static_cast<i128>(a.span)) return true;
  }
  return false;
}

}  // namespace

bool extents_overlap(const Extent& x, const Extent& y) {
  if (x.lo >= y.hi() || y.lo >= x.hi()) return false;
  const Extent& a = x.lo <= y.lo ? x : y;
  const Extent& b = x.lo <= y.lo ? y : x;
  if (a.count == 1 && b.count == 1) return true;
  if (a.count == 1) return pieces_meet_range(b, a.lo, a.hi());
  if (b.count == 1) return pieces_meet_range(a, b.lo, b.hi());
  if (a.period == b.period) return same_period_pieces_meet(a, b);
  return true;  // interleaved with different periods: not proven disjoint
}

m3qkv_status check_overlaps(const char* fn, Extents* e) {
  Extent* v = e->items;
  const int n = e->count;
  for (int i = 1; i < n; ++i) {  // insertion sort by start: n <= kMaxExtents
    const Extent x = v[i];
    int j = i - 1;
    for (; j >= 0 && v[j].lo > x.lo; --j) v[j + 1] = v[j];
    v[j + 1] = x;
  }
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n && v[j].lo < v[i].hi(); ++j) {
      if (!(v[i].written || v[j].written) || (v[i].group != 0 && v[i].group == v[j].group) ||
          !extents_overlap(v[i], v[j]))
        continue;
      const Extent& w = v[i].written ? v[i] : v[j];
      const Extent& o = v[i].written ? v[j] : v[i];
      return fail(M3QKV_ERROR_INVALID_ARGUMENT,
                  "%s: %s [0x%llx, 0x%llx) overlaps %s [0x%llx, 0x%llx): a written buffer must not overlap another "
                  "buffer of the call",
                  fn, w.name, static_cast<unsigned long long>(w.lo), static_cast<unsigned long long>(w.hi()), o.name,
                  static_cast<unsigned long long>(o.lo), static_cast<unsigned long long>(o.hi()));
    }
  }
  return M3QKV_SUCCESS;
}

m3qkv_status fused_extents(const char* fn, const m3qkv_fused_args& a, Extents* out) {
  Builder b(fn, out);
  gemm_operands(b, a.m, heads_n(a.nq, a.nkv, a.niq, a.nik), a.k, a.xq, a.xsf, a.wq, a.wsf, a.x_bf16);
  epilogue(b, a);
  return b.status();
}

m3qkv_status insert_extents(const char* fn, const m3qkv_insert_args& a, Extents* out) {
  Builder b(fn, out);
  b.buffer("qkv", a.qkv, a.m * heads_n(a.nq, a.nkv, a.niq, a.nik) * 2, kIn);
  epilogue(b, a);
  return b.status();
}

m3qkv_status gemm_extents(const char* fn, const m3qkv_gemm_args& a, Extents* out) {
  Builder b(fn, out);
  gemm_operands(b, a.m, a.n, a.k, a.xq, a.xsf, a.wq, a.wsf, a.x_bf16);
  b.buffer("out", a.out, a.m * a.n * 2, kOut);
  return b.status();
}

m3qkv_status quantize_extents(const char* fn, const m3qkv_quantize_args& a, Extents* out) {
  Builder b(fn, out);
  b.buffer("x", a.x, a.m * a.k * 2, kIn);
  b.buffer("xq", a.xq, a.m * a.k, kOut);
  b.buffer("xsf", a.xsf, f8_128x4_bytes(a.m, a.k / kMxBlock), kOut);  // padding rows written too
  return b.status();
}

m3qkv_status prepare_extents(const char* fn, const m3qkv_prepare_args& a, Extents* out) {
  Builder b(fn, out);
  const int64_t sf_bytes = f8_128x4_bytes(a.n, a.k / kMxBlock);
  b.buffer("wq", a.wq, a.n * a.k, kIn);
  b.buffer("wsf", a.wsf, sf_bytes, kIn);
  b.buffer("wq_out", a.wq_out, a.n * a.k, kOut);
  b.buffer("wsf_out", a.wsf_out, sf_bytes, kOut);
  return b.status();
}

}  // namespace m3qkv::api
