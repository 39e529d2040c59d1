// An independent model of the bytes each m3qkv call touches, for the fuzzer
// (tests/fuzz/fuzz_validate.cpp) and checked against brute force by the CPU
// test tests/cpu/test_validation_oracle.cpp.
//
// Written from the public contract (include/m3qkv/m3qkv.h field comments,
// docs/contract.md §4 and §5.2), not from src/api/extents.cpp: every buffer
// is a "pattern", the rows
//     base + Σ_d x_d·stride_d + [0, width),   0 <= x_d < extent_d,
// (a contiguous buffer: no dimension; a paged cache: one, the pages; an FP8 /
// BF16 KV cache: three, head, token and page, of 128-element rows). Whether
// two patterns share a byte is decided exactly by a bounded search over the
// index vectors (patterns_meet), in 128-bit arithmetic, so sizes of any
// accepted call (up to 2^64) are modelled without overflow.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "m3qkv/m3qkv.h"

namespace m3qkv_oracle {

using i128 = __int128;

struct Dim {
  i128 stride = 0;
  i128 extent = 0;
};

struct Pattern {
  const char* name = "";
  bool written = false;
  i128 base = 0;
  i128 width = 0;  // bytes of one row
  int ndims = 0;
  Dim dims[3];
  // Lowest byte and one past the highest byte.
  i128 lo() const { return base; }
  i128 hi() const {
    i128 h = base + width;
    for (int d = 0; d < ndims; ++d) h += (dims[d].extent - 1) * dims[d].stride;
    return h;
  }
};

// The search below gives up after this many nodes (Search::undecided); none
// of the patterns of an accepted call needs more than a handful (the hull
// test settles most pairs, and the nested strides of the caches leave at
// most two candidates per level).
constexpr long kSearchBudget = 1L << 22;

// Is there an integer vector x, 0 <= x_d < n_d, with lo < c + Σ a_d·x_d < hi
// (all a_d > 0)? With `nonzero`, x must differ from the vector `zero`.
struct Search {
  struct Term {
    i128 a, n, zero;
  };
  Term t[8];
  int nt = 0;
  i128 rest[9];  // rest[d] = max of Σ_{e >= d} a_e·(n_e - 1)
  i128 lo = 0, hi = 0;
  bool nonzero = false;
  long nodes = 0;
  bool undecided = false;

  static i128 floor_div(i128 a, i128 b) {  // b > 0
    i128 q = a / b;
    if ((a % b != 0) && (a < 0)) --q;
    return q;
  }
  static i128 ceil_div(i128 a, i128 b) { return -floor_div(-a, b); }

  void add(i128 a, i128 n, i128 zero) {
    if (a == 0 || n <= 1) return;  // contributes nothing (a self-test handles stride 0 before)
    // a·x with a < 0: a·x = |a|·(n - 1 - x) - |a|·(n - 1), x' = n - 1 - x.
    if (a < 0) {
      c_shift += a * (n - 1);
      t[nt++] = Term{-a, n, n - 1 - zero};
    } else {
      t[nt++] = Term{a, n, zero};
    }
  }
  i128 c_shift = 0;

  bool rec(int d, i128 c, bool all_zero) {
    if (++nodes > kSearchBudget) {
      undecided = true;
      return false;
    }
    if (d == nt) return c > lo && c < hi && !(nonzero && all_zero);
    const Term& x = t[d];
    // c + a·x + r in (lo, hi) for some r in [0, rest[d + 1]].
    i128 xmin = floor_div(lo - c - rest[d + 1], x.a) + 1;
    i128 xmax = ceil_div(hi - c, x.a) - 1;
    if (xmin < 0) xmin = 0;
    if (xmax > x.n - 1) xmax = x.n - 1;
    if (xmin > xmax) return false;
    if (d == nt - 1) {  // the last term: the range itself is the answer
      if (!(nonzero && all_zero)) return true;
      return xmin < xmax || xmin != x.zero;
    }
    for (i128 v = xmin; v <= xmax; ++v) {
      if (rec(d + 1, c + x.a * v, all_zero && v == x.zero)) return true;
      if (undecided) return false;
    }
    return false;
  }

  // Decides; *undecided_out when the budget ran out.
  bool run(i128 c, bool* undecided_out) {
    // Largest coefficient first: with nested strides each level leaves at
    // most two candidates.
    std::sort(t, t + nt, [](const Term& p, const Term& q) { return p.a > q.a; });
    // a·x + a·y (x < n1, y < n2) takes exactly the values a·z, z < n1 + n2 - 1:
    // merged, the page dimensions of two caches with one page stride (K and V
    // of a flat cache, two paged caches) nest again. Not for `nonzero` (the
    // zero vector of the sum is not only the sum of the zero vectors).
    if (!nonzero) {
      int w = 0;
      for (int r = 0; r < nt; ++r) {
        if (w > 0 && t[w - 1].a == t[r].a) {
          t[w - 1].n += t[r].n - 1;
          t[w - 1].zero += t[r].zero;
        } else {
          t[w++] = t[r];
        }
      }
      nt = w;
    }
    rest[nt] = 0;
    for (int d = nt - 1; d >= 0; --d) rest[d] = rest[d + 1] + t[d].a * (t[d].n - 1);
    const bool r = rec(0, c + c_shift, true);
    *undecided_out = undecided;
    return r;
  }
};

// Whether p and q share a byte. Rows [x, x + wp) and [y, y + wq) meet iff
// y - x in (-wq, wp).
inline bool patterns_meet(const Pattern& p, const Pattern& q, bool* undecided) {
  *undecided = false;
  if (p.hi() <= q.lo() || q.hi() <= p.lo()) return false;
  Search s;
  s.lo = -q.width;
  s.hi = p.width;
  for (int d = 0; d < q.ndims; ++d)
    if (q.dims[d].extent > 1) s.add(q.dims[d].stride, q.dims[d].extent, 0);
  for (int d = 0; d < p.ndims; ++d)
    if (p.dims[d].extent > 1) s.add(-p.dims[d].stride, p.dims[d].extent, 0);
  return s.run(q.base - p.base, undecided);
}

// Whether two different rows of p share a byte: Σ δ_d·stride_d in
// (-width, width) for some δ != 0, |δ_d| < extent_d.
inline bool pattern_meets_itself(const Pattern& p, bool* undecided) {
  *undecided = false;
  // Two dimensions of extent > 1 with one stride: δ = (1, -1) meets; a
  // stride of 0: δ = 1 meets.
  for (int d = 0; d < p.ndims; ++d) {
    if (p.dims[d].extent > 1 && p.dims[d].stride == 0) return true;
  }
  for (int d = 0; d < p.ndims; ++d)
    for (int e = d + 1; e < p.ndims; ++e)
      if (p.dims[d].extent > 1 && p.dims[e].extent > 1 && p.dims[d].stride == p.dims[e].stride) return true;
  Search s;
  s.lo = -p.width;
  s.hi = p.width;
  s.nonzero = true;
  for (int d = 0; d < p.ndims; ++d) {
    const Dim& x = p.dims[d];
    if (x.extent > 1) s.add(x.stride, 2 * x.extent - 1, x.extent - 1);  // δ + extent - 1 in [0, 2·extent - 1)
  }
  // δ = x - (extent - 1): the constant is -Σ stride·(extent - 1).
  i128 c = 0;
  for (int d = 0; d < p.ndims; ++d)
    if (p.dims[d].extent > 1) c -= p.dims[d].stride * (p.dims[d].extent - 1);
  return s.run(c, undecided);
}

// ---------------------------------------------------------------------------
// The buffers of each call, from the contract's sizes. Only for arguments
// the validator accepted with m > 0 (shapes in range); NULL optional
// pointers and unused fields (index_* when niq / nik are 0) are left out.
// ---------------------------------------------------------------------------
struct Buffers {
  Pattern b[24];
  int n = 0;
  int flat_k = -1, flat_v = -1;  // the K and V patterns of an FP8 / BF16 KV cache
  void add(const Pattern& p) { b[n++] = p; }
};

inline i128 addr(const void* p) { return static_cast<i128>(reinterpret_cast<uintptr_t>(p)); }
inline i128 round_up(i128 v, i128 m) { return (v + m - 1) / m * m; }

inline void contiguous(Buffers* out, const char* name, const void* p, i128 bytes, bool written) {
  if (p == nullptr || bytes <= 0) return;
  Pattern x;
  x.name = name;
  x.written = written;
  x.base = addr(p);
  x.width = bytes;
  out->add(x);
}
inline void paged(Buffers* out, const char* name, const void* p, i128 page_bytes, i128 stride, i128 pages,
                  bool written) {
  if (p == nullptr || page_bytes <= 0) return;
  Pattern x;
  x.name = name;
  x.written = written;
  x.base = addr(p);
  x.width = page_bytes;
  x.ndims = 1;
  x.dims[0] = Dim{stride, pages};
  out->add(x);
}
// F8_128x4 (docs/contract.md §4.1): ⌈R/128⌉·128 rows · ⌈(K/32)/4⌉·4 columns of bytes.
inline i128 f8_128x4(i128 rows, i128 k) { return round_up(rows, 128) * round_up(k / 32, 4); }

constexpr i128 kD = M3QKV_HEAD_DIM;
constexpr i128 kTok = M3QKV_NVFP4_SLOT_BYTES_PER_TOKEN;

template <class A>
void epilogue_buffers(const A& a, Buffers* out) {
  const i128 m = a.m;
  contiguous(out, "positions", a.positions, m * 8, false);
  contiguous(out, "cos_sin_cache", a.cos_sin_cache, i128{a.max_position} * 64 * 2, false);
  contiguous(out, "q_norm_weight", a.q_norm_weight, kD * 2, false);
  contiguous(out, "k_norm_weight", a.k_norm_weight, kD * 2, false);
  contiguous(out, "slot_mapping", a.slot_mapping, m * 8, false);
  if (a.kv_cache_dtype == M3QKV_CACHE_NVFP4) {
    // [num_blocks][2·nkv][block_size][72] at kv_page_stride: the packed part of each page.
    paged(out, "kv_cache", a.kv_cache, 2 * i128{a.nkv} * a.block_size * kTok, a.kv_page_stride, a.num_blocks, true);
  } else {
    const i128 e = a.kv_cache_dtype == M3QKV_CACHE_BF16 ? 2 : 1;
    for (int kv = 0; kv < 2; ++kv) {
      const void* p = kv == 0 ? a.kv_cache : a.v_cache;
      if (p == nullptr) continue;
      Pattern x;
      x.name = kv == 0 ? "kv_cache" : "v_cache";
      x.written = true;
      x.base = addr(p);
      x.width = kD * e;
      x.ndims = 3;
      x.dims[0] = Dim{a.kv_head_stride, a.nkv};
      x.dims[1] = Dim{a.kv_token_stride, a.block_size};
      x.dims[2] = Dim{a.kv_page_stride, a.num_blocks};
      (kv == 0 ? out->flat_k : out->flat_v) = out->n;
      out->add(x);
    }
  }
  contiguous(out, "q_out", a.q_out, m * a.nq * kD * 2, true);
  contiguous(out, "q_fp8_out", a.q_fp8_out, m * a.nq * kD, true);
  if (a.niq > 0) {
    contiguous(out, "index_q_norm_weight", a.index_q_norm_weight, kD * 2, false);
    contiguous(out, "index_q_out", a.index_q_out, m * a.niq * kD, true);
  }
  if (a.nik > 0) {
    contiguous(out, "index_k_norm_weight", a.index_k_norm_weight, kD * 2, false);
    contiguous(out, "index_slot_mapping", a.index_slot_mapping, m * 8, false);
    const i128 page = a.index_cache_dtype == M3QKV_CACHE_NVFP4
                          ? i128{a.block_size} * kTok
                          : i128{a.block_size} * kD * (a.index_cache_dtype == M3QKV_CACHE_BF16 ? 2 : 1);
    paged(out, "index_cache", a.index_cache, page, a.index_page_stride, a.num_index_blocks, true);
  }
  contiguous(out, "error_flags", a.error_flags, 4, true);
}

template <class A>
i128 heads_n(const A& a) {
  return (i128{a.nq} + 2 * i128{a.nkv} + a.niq + a.nik) * kD;
}

inline void gemm_buffers(i128 m, i128 n, i128 k, const void* xq, const void* xsf, const void* wq, const void* wsf,
                         const void* x_bf16, Buffers* out) {
  contiguous(out, "xq", xq, m * k, false);
  contiguous(out, "xsf", xsf, f8_128x4(m, k), false);
  contiguous(out, "x_bf16", x_bf16, m * k * 2, false);
  contiguous(out, "wq", wq, n * k, false);
  contiguous(out, "wsf", wsf, f8_128x4(n, k), false);
}

inline void buffers(const m3qkv_fused_args& a, Buffers* out) {
  out->n = 0;
  gemm_buffers(a.m, heads_n(a), a.k, a.xq, a.xsf, a.wq, a.wsf, a.x_bf16, out);
  epilogue_buffers(a, out);
}
inline void buffers(const m3qkv_insert_args& a, Buffers* out) {
  out->n = 0;
  contiguous(out, "qkv", a.qkv, i128{a.m} * heads_n(a) * 2, false);
  epilogue_buffers(a, out);
}
inline void buffers(const m3qkv_gemm_args& a, Buffers* out) {
  out->n = 0;
  gemm_buffers(a.m, a.n, a.k, a.xq, a.xsf, a.wq, a.wsf, a.x_bf16, out);
  contiguous(out, "out", a.out, i128{a.m} * a.n * 2, true);
}
inline void buffers(const m3qkv_quantize_args& a, Buffers* out) {
  out->n = 0;
  contiguous(out, "x", a.x, i128{a.m} * a.k * 2, false);
  contiguous(out, "xq", a.xq, i128{a.m} * a.k, true);
  // "ceil(M/128)·128 · K/32 bytes" (K % 128 == 0), padding rows written too.
  contiguous(out, "xsf", a.xsf, round_up(a.m, 128) * (i128{a.k} / 32), true);
}

// The first violation of the overlap rule among `b`, or nullptr: a written
// buffer sharing a byte with another buffer (K and V of one flat cache: any
// shared byte; K or V with itself: two elements sharing a byte), or a
// buffer past the end of the 64-bit address space. *undecided when the
// search gave up.
struct Violation {
  const Pattern* a = nullptr;
  const Pattern* b = nullptr;  // == a: a buffer meets itself, or runs past 2^64
};
inline Violation first_violation(const Buffers& x, bool* undecided) {
  *undecided = false;
  const i128 top = static_cast<i128>(1) << 64;
  for (int i = 0; i < x.n; ++i) {
    if (x.b[i].hi() > top) return Violation{&x.b[i], &x.b[i]};
    bool u = false;
    if ((i == x.flat_k || i == x.flat_v) && pattern_meets_itself(x.b[i], &u)) return Violation{&x.b[i], &x.b[i]};
    *undecided = *undecided || u;
  }
  for (int i = 0; i < x.n; ++i) {
    for (int j = i + 1; j < x.n; ++j) {
      if (!x.b[i].written && !x.b[j].written) continue;
      bool u = false;
      if (patterns_meet(x.b[i], x.b[j], &u)) return Violation{&x.b[i], &x.b[j]};
      *undecided = *undecided || u;
    }
  }
  return Violation{};
}

}  // namespace m3qkv_oracle
