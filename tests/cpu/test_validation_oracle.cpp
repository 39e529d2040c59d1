// The overlap rule (docs/contract.md §5.2) and the cache stride rules
// (§4.2, §4.3; m3qkv.h at kv_token_stride) against brute force on small
// shapes: for thousands of random configurations (cache formats, head
// counts, page sizes, strides around the packed sizes, pointers packed back
// to back with small gaps, scattered in a small arena, or interleaved on
// purpose), every byte each buffer touches is marked in a byte map of the
// arena, and the validator's verdict must follow from the map:
//   - the stride rules, written here from the contract's text, decide
//     INVALID_SHAPE; where they pass, the K elements of a flat cache are
//     pairwise disjoint in the map (the rule is sufficient);
//   - otherwise the call is accepted iff no byte of a written buffer is
//     touched by another buffer (K and V of one flat cache included);
//   - a refusal names a pair of buffers that share a byte, except in the
//     two places where the validator is knowingly conservative, counted
//     and printed: a buffer inside the hull of one page's elements of an
//     FP8 / BF16 KV cache (the cache is taken page by page, as the contract
//     says caches interleave; between its pages nothing is refused), and two
//     paged caches of different page strides whose address ranges meet
//     (api/extents.cpp: "not proven disjoint").
// The fuzzer's oracle (tests/fuzz/oracle.h) is checked against the same
// byte maps, pair by pair.
#include <gtest/gtest.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fuzz/oracle.h"
#include "host/status.h"
#include "api/validate.h"
#include "m3qkv/m3qkv.h"

namespace {

constexpr uintptr_t kArena = uintptr_t{1} << 40;  // fake device address of arena byte 0

// One buffer: its rows (arena offsets [lo, hi)) as the contract describes them.
struct Buf {
  std::string name;
  bool written = false;
  bool paged = false;  // a paged cache (NVFP4 KV, any index cache): its page stride
  int64_t page_stride = 0;
  bool flat_kv = false;  // K or V of an FP8 / BF16 KV cache
  std::vector<std::pair<int64_t, int64_t>> rows;
};

int64_t off(const void* p) { return static_cast<int64_t>(reinterpret_cast<uintptr_t>(p) - kArena); }

void row(Buf& b, int64_t lo, int64_t bytes) { b.rows.emplace_back(lo, lo + bytes); }

template <class A>
std::vector<Buf> contract_buffers(const A& a) {
  std::vector<Buf> v;
  const auto contiguous = [&](const char* name, const void* p, int64_t bytes, bool w) {
    if (p == nullptr) return;
    Buf b;
    b.name = name;
    b.written = w;
    row(b, off(p), bytes);
    v.push_back(b);
  };
  const int64_t m = a.m;
  contiguous("positions", a.positions, m * 8, false);
  contiguous("cos_sin_cache", a.cos_sin_cache, a.max_position * 128, false);
  contiguous("q_norm_weight", a.q_norm_weight, 256, false);
  contiguous("k_norm_weight", a.k_norm_weight, 256, false);
  contiguous("slot_mapping", a.slot_mapping, m * 8, false);
  if (a.kv_cache_dtype == M3QKV_CACHE_NVFP4) {
    Buf b;
    b.name = "kv_cache";
    b.written = true;
    b.paged = true;
    b.page_stride = a.kv_page_stride;
    for (int64_t p = 0; p < a.num_blocks; ++p) row(b, off(a.kv_cache) + p * a.kv_page_stride, 2 * a.nkv * a.block_size * 72);
    v.push_back(b);
  } else {
    const int64_t e = a.kv_cache_dtype == M3QKV_CACHE_BF16 ? 2 : 1;
    for (int kv = 0; kv < 2; ++kv) {
      Buf b;
      b.name = kv == 0 ? "kv_cache" : "v_cache";
      b.written = true;
      b.flat_kv = true;
      const int64_t base = off(kv == 0 ? a.kv_cache : a.v_cache);
      for (int64_t p = 0; p < a.num_blocks; ++p)
        for (int64_t t = 0; t < a.block_size; ++t)
          for (int64_t h = 0; h < a.nkv; ++h)
            row(b, base + p * a.kv_page_stride + t * a.kv_token_stride + h * a.kv_head_stride, 128 * e);
      v.push_back(b);
    }
  }
  contiguous("q_out", a.q_out, m * a.nq * 256, true);
  contiguous("q_fp8_out", a.q_fp8_out, m * a.nq * 128, true);
  if (a.niq > 0) {
    contiguous("index_q_norm_weight", a.index_q_norm_weight, 256, false);
    contiguous("index_q_out", a.index_q_out, m * a.niq * 128, true);
  }
  if (a.nik > 0) {
    contiguous("index_k_norm_weight", a.index_k_norm_weight, 256, false);
    contiguous("index_slot_mapping", a.index_slot_mapping, m * 8, false);
    Buf b;
    b.name = "index_cache";
    b.written = true;
    b.paged = true;
    b.page_stride = a.index_page_stride;
    const int64_t page = a.index_cache_dtype == M3QKV_CACHE_NVFP4 ? a.block_size * 72
                                                                  : a.block_size * 128 * (a.index_cache_dtype == 2 ? 2 : 1);
    for (int64_t p = 0; p < a.num_index_blocks; ++p) row(b, off(a.index_cache) + p * a.index_page_stride, page);
    v.push_back(b);
  }
  contiguous("error_flags", a.error_flags, 4, true);
  return v;
}

std::vector<Buf> buffers_of(const m3qkv_insert_args& a) {
  const int64_t n = (int64_t{a.nq} + 2 * a.nkv + a.niq + a.nik) * 128;
  std::vector<Buf> v;
  Buf q;
  q.name = "qkv";
  row(q, off(a.qkv), a.m * n * 2);
  v.push_back(q);
  for (Buf& b : contract_buffers(a)) v.push_back(b);
  return v;
}
std::vector<Buf> buffers_of(const m3qkv_fused_args& a) {
  const int64_t n = (int64_t{a.nq} + 2 * a.nkv + a.niq + a.nik) * 128;
  const auto pad = [](int64_t r) { return (r + 127) / 128 * 128; };
  const int64_t cols = (a.k / 32 + 3) / 4 * 4;
  std::vector<Buf> v;
  const auto add = [&](const char* name, const void* p, int64_t bytes) {
    if (p == nullptr) return;
    Buf b;
    b.name = name;
    row(b, off(p), bytes);
    v.push_back(b);
  };
  add("xq", a.xq, a.m * a.k);
  add("xsf", a.xsf, pad(a.m) * cols);
  add("x_bf16", a.x_bf16, a.m * a.k * 2);
  add("wq", a.wq, n * a.k);
  add("wsf", a.wsf, pad(n) * cols);
  for (Buf& b : contract_buffers(a)) v.push_back(b);
  return v;
}

// The byte map: which buffers touch each byte (bit i = buffer i), and
// whether a flat cache's elements meet each other.
struct ByteMap {
  std::vector<std::vector<bool>> meets;  // meets[i][j]: buffers i and j share a byte
  bool self_overlap = false;             // two rows of one flat KV buffer share a byte
};
ByteMap byte_map(const std::vector<Buf>& bufs) {
  int64_t hi = 0;
  for (const Buf& b : bufs)
    for (const auto& r : b.rows) hi = std::max(hi, r.second);
  std::vector<uint32_t> mask(static_cast<size_t>(hi), 0);
  ByteMap out;
  out.meets.assign(bufs.size(), std::vector<bool>(bufs.size(), false));
  for (size_t i = 0; i < bufs.size(); ++i) {
    const uint32_t bit = 1u << i;
    for (const auto& r : bufs[i].rows) {
      for (int64_t x = r.first; x < r.second; ++x) {
        uint32_t& m = mask[static_cast<size_t>(x)];
        if (m & bit) out.self_overlap = out.self_overlap || bufs[i].flat_kv;
        m |= bit;
      }
    }
  }
  for (uint32_t m : mask) {
    if ((m & (m - 1)) == 0) continue;  // 0 or 1 buffer
    for (size_t i = 0; i < bufs.size(); ++i)
      for (size_t j = i + 1; j < bufs.size(); ++j)
        if ((m >> i & 1u) && (m >> j & 1u)) out.meets[i][j] = out.meets[j][i] = true;
  }
  return out;
}

// The stride rules of the contract (m3qkv.h, docs/contract.md §4.2 / §4.3),
// for the shapes of this test (everything else valid).
template <class A>
bool strides_ok(const A& a) {
  if (a.kv_cache_dtype == M3QKV_CACHE_NVFP4) {
    if (a.kv_page_stride % 32 != 0 || a.kv_page_stride < 2 * a.nkv * a.block_size * 72) return false;
  } else {
    const int64_t e = a.kv_cache_dtype == M3QKV_CACHE_BF16 ? 2 : 1;
    struct D {
      int64_t stride, extent;
    } d[3] = {{a.kv_head_stride, a.nkv}, {a.kv_token_stride, a.block_size}, {a.kv_page_stride, a.num_blocks}};
    for (const D& x : d)
      if (x.stride <= 0 || x.stride % 16 != 0) return false;
    // "with the four dimensions sorted by stride, each stride of a dimension of
    // extent > 1 is at least the byte span of the smaller ones"
    std::vector<D> s;
    for (const D& x : d)
      if (x.extent > 1) s.push_back(x);
    std::sort(s.begin(), s.end(), [](const D& p, const D& q) { return p.stride < q.stride; });
    int64_t span = 128 * e;
    for (const D& x : s) {
      if (x.stride < span) return false;
      span += (x.extent - 1) * x.stride;
    }
  }
  if (a.nik > 0) {
    if (a.index_cache_dtype == M3QKV_CACHE_NVFP4) {
      if (a.index_page_stride % 32 != 0 || a.index_page_stride < a.block_size * 72) return false;
    } else {
      const int64_t e = a.index_cache_dtype == M3QKV_CACHE_BF16 ? 2 : 1;
      if (a.index_page_stride % 16 != 0 || a.index_page_stride < a.block_size * 128 * e) return false;
    }
  }
  return true;
}

// ---------------------------------------------------------------------------
// Random configurations.
// ---------------------------------------------------------------------------
using Rng = std::mt19937_64;
int64_t pick(Rng& r, std::initializer_list<int64_t> v) {
  return *(v.begin() + static_cast<std::ptrdiff_t>(std::uniform_int_distribution<size_t>(0, v.size() - 1)(r)));
}
int64_t uni(Rng& r, int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(r); }

template <class A>
void random_shape(Rng& r, A& a) {
  a.nkv = static_cast<int32_t>(uni(r, 1, 3));
  a.nq = a.nkv * static_cast<int32_t>(uni(r, 1, 2));
  a.niq = uni(r, 0, 1) ? a.nkv : 0;
  a.nik = static_cast<int32_t>(uni(r, 0, 1));
  a.m = uni(r, 1, 3);
  a.max_position = uni(r, 1, 4);
  a.eps = 1e-6f;
  a.block_size = static_cast<int32_t>(pick(r, {4, 8}));
  a.num_blocks = uni(r, 1, 3);
  a.num_index_blocks = uni(r, 1, 2);
  a.q_fp8_scale = a.k_scale = a.v_scale = 1.0f;
  a.kv_cache_dtype = static_cast<int32_t>(uni(r, 0, 2));
  a.index_cache_dtype = static_cast<int32_t>(uni(r, 0, 2));
  const int64_t bs = a.block_size, nkv = a.nkv;
  if (a.kv_cache_dtype == M3QKV_CACHE_NVFP4) {
    const int64_t packed = 2 * nkv * bs * 72;
    a.kv_page_stride = packed + pick(r, {-32, 0, 0, 0, 32, 64, 16, 1152});
    a.kv_token_stride = a.kv_head_stride = 0;
  } else {
    // A nesting order of (head, token, page), padded, then maybe perturbed.
    const int64_t e = a.kv_cache_dtype == M3QKV_CACHE_BF16 ? 2 : 1;
    int order[3] = {0, 1, 2};
    std::shuffle(order, order + 3, r);
    int64_t stride[3], ext[3] = {nkv, bs, a.num_blocks};
    int64_t span = 128 * e;
    for (int i : order) {
      stride[i] = span + 16 * pick(r, {0, 0, 0, 1, 2, 8});
      span = stride[i] * ext[i];
    }
    if (uni(r, 0, 2) == 0) {
      const int i = static_cast<int>(uni(r, 0, 2));
      stride[i] = std::max<int64_t>(16, stride[i] + 16 * pick(r, {-8, -2, -1, 1, 2})) ;
      if (uni(r, 0, 5) == 0) stride[i] += pick(r, {-16, 8, 1});  // non-multiples, zero
    }
    a.kv_head_stride = stride[0], a.kv_token_stride = stride[1], a.kv_page_stride = stride[2];
  }
  if (a.nik > 0) {
    const int64_t page = a.index_cache_dtype == M3QKV_CACHE_NVFP4 ? bs * 72 : bs * 128 * (a.index_cache_dtype == 2 ? 2 : 1);
    a.index_page_stride = page + pick(r, {-32, -16, 0, 0, 0, 16, 32, 64, 288});
  } else {
    a.index_page_stride = 0;
    a.num_index_blocks = 0;
  }
}

// The hull (bytes from its first to one past its last) of each pointer's
// buffer, from the brute-force rows.
int64_t hull_of(const std::vector<Buf>& bufs, const char* name) {
  for (const Buf& b : bufs) {
    if (b.name != name) continue;
    int64_t lo = INT64_MAX, hi = 0;
    for (const auto& r : b.rows) lo = std::min(lo, r.first), hi = std::max(hi, r.second);
    return hi - lo;
  }
  return 256;
}

// The pointer fields of a struct, by name and offset (set through memcpy:
// they have different pointer types).
struct PtrField {
  const char* name;
  size_t off;
};
#define M3QKV_PF(S, f) PtrField{#f, offsetof(S, f)}
#define M3QKV_EPILOGUE_PTRS(S)                                                                                \
  M3QKV_PF(S, positions), M3QKV_PF(S, cos_sin_cache), M3QKV_PF(S, q_norm_weight), M3QKV_PF(S, k_norm_weight), \
      M3QKV_PF(S, index_q_norm_weight), M3QKV_PF(S, index_k_norm_weight), M3QKV_PF(S, slot_mapping),         \
      M3QKV_PF(S, index_slot_mapping), M3QKV_PF(S, kv_cache), M3QKV_PF(S, index_cache), M3QKV_PF(S, q_out),  \
      M3QKV_PF(S, q_fp8_out), M3QKV_PF(S, index_q_out), M3QKV_PF(S, error_flags), M3QKV_PF(S, v_cache)
std::vector<PtrField> pointers(const m3qkv_insert_args&) {
  return {M3QKV_PF(m3qkv_insert_args, qkv), M3QKV_EPILOGUE_PTRS(m3qkv_insert_args)};
}
std::vector<PtrField> pointers(const m3qkv_fused_args& a) {
  if (a.x_bf16 != nullptr)
    return {M3QKV_PF(m3qkv_fused_args, wq), M3QKV_PF(m3qkv_fused_args, wsf), M3QKV_PF(m3qkv_fused_args, x_bf16),
            M3QKV_EPILOGUE_PTRS(m3qkv_fused_args)};
  return {M3QKV_PF(m3qkv_fused_args, wq), M3QKV_PF(m3qkv_fused_args, wsf), M3QKV_PF(m3qkv_fused_args, xq),
          M3QKV_PF(m3qkv_fused_args, xsf), M3QKV_EPILOGUE_PTRS(m3qkv_fused_args)};
}
#undef M3QKV_PF
#undef M3QKV_EPILOGUE_PTRS
template <class A>
uintptr_t get_ptr(const A& a, const PtrField& f) {
  uintptr_t v;
  std::memcpy(&v, reinterpret_cast<const char*>(&a) + f.off, sizeof(v));
  return v;
}
template <class A>
void set_ptr(A& a, const PtrField& f, uintptr_t v) {
  std::memcpy(reinterpret_cast<char*>(&a) + f.off, &v, sizeof(v));
}

const void* at(int64_t o) { return reinterpret_cast<const void*>(kArena + static_cast<uintptr_t>(o)); }
void* at_w(int64_t o) { return reinterpret_cast<void*>(kArena + static_cast<uintptr_t>(o)); }

// Places the pointers: packed back to back with small gaps (0), scattered
// over a small arena (1), or with the caches interleaved on purpose (2).
template <class A>
void place(Rng& r, A& a, int strategy) {
  std::vector<PtrField> ptrs = pointers(a);
  // Required / optional presence: q_fp8_out or q_out sometimes NULL, error_flags sometimes NULL.
  for (const PtrField& p : ptrs) set_ptr(a, p, kArena);
  if (uni(r, 0, 3) == 0) a.q_fp8_out = nullptr;
  else if (uni(r, 0, 3) == 0) a.q_out = nullptr;
  if (uni(r, 0, 3) == 0) a.error_flags = nullptr;
  if (a.kv_cache_dtype == M3QKV_CACHE_NVFP4) a.v_cache = nullptr;
  if (a.niq == 0) a.index_q_norm_weight = nullptr, a.index_q_out = nullptr;
  if (a.nik == 0) a.index_k_norm_weight = nullptr, a.index_slot_mapping = nullptr, a.index_cache = nullptr;
  const std::vector<Buf> sizes = buffers_of(a);
  std::shuffle(ptrs.begin(), ptrs.end(), r);
  int64_t total = 0;
  for (const PtrField& p : ptrs)
    if (get_ptr(a, p) != 0) total += (hull_of(sizes, p.name) + 15) / 16 * 16;
  int64_t cursor = 4096;
  const bool tight = uni(r, 0, 1) == 0;  // gaps that may be negative
  for (const PtrField& p : ptrs) {
    if (get_ptr(a, p) == 0) continue;
    const int64_t bytes = (hull_of(sizes, p.name) + 15) / 16 * 16;
    int64_t o;
    if (strategy == 1) {
      o = 4096 + 16 * uni(r, 0, std::max<int64_t>(1, total / 16 / 2));
    } else {
      o = cursor;
      cursor += bytes + 16 * (tight ? pick(r, {-2, -1, 0, 0, 0, 0, 1, 4}) : pick(r, {0, 0, 0, 1, 4}));
    }
    set_ptr(a, p, kArena + static_cast<uintptr_t>(o));
  }
  if (strategy == 2) {
    // Interleavings: V inside K's allocation; the index pages in the KV pages'
    // padding (one page stride) or at a page offset.
    if (a.v_cache != nullptr) {
      const int64_t k = off(a.kv_cache);
      const int64_t shift = 16 * uni(r, -(a.kv_page_stride / 16), a.kv_page_stride / 16);
      if (k + shift >= 0) a.v_cache = at_w(k + shift);
    }
    if (a.index_cache != nullptr && uni(r, 0, 1)) {
      const int64_t kv_page = a.kv_cache_dtype == M3QKV_CACHE_NVFP4
                                  ? 2 * a.nkv * a.block_size * 72
                                  : hull_of(buffers_of(a), "kv_cache") / std::max<int64_t>(1, a.num_blocks);
      if (uni(r, 0, 1)) a.index_page_stride = a.kv_page_stride;
      a.index_cache = at_w(off(a.kv_cache) + (kv_page + 15) / 16 * 16 + 16 * pick(r, {-1, 0, 0, 1}));
    }
  }
}

// "fn: X [0x.., 0x..) overlaps Y [...": the two names; or the K/V message.
bool named_pair(const std::string& msg, std::string* x, std::string* y) {
  const size_t colon = msg.find(": ");
  const size_t ov = msg.find(") overlaps ");
  if (colon != std::string::npos && ov != std::string::npos) {
    *x = msg.substr(colon + 2, msg.find(' ', colon + 2) - colon - 2);
    const size_t s = ov + std::strlen(") overlaps ");
    *y = msg.substr(s, msg.find(' ', s) - s);
    return true;
  }
  if (msg.find("some V element would share bytes with a K element") != std::string::npos) {
    *x = "kv_cache", *y = "v_cache";
    return true;
  }
  return false;
}

struct Tally {
  int accepted = 0, refused_exact = 0, refused_strides = 0, page_hull = 0, between_pages = 0, different_strides = 0;
  int k_disjoint_but_not_nested = 0;
};

template <class A>
void check_one(Rng& r, Tally* t, m3qkv_status (*validate)(const A*, A*, bool*), int iter) {
  A a;
  std::memset(&a, 0, sizeof(a));
  a.struct_size = sizeof(a);
  random_shape(r, a);
  if constexpr (std::is_same_v<A, m3qkv_fused_args>) {
    a.k = 128;
    if (uni(r, 0, 1)) a.x_bf16 = at(0);  // else xq / xsf
  }
  place(r, a, static_cast<int>(uni(r, 0, 2)));
  const std::vector<Buf> bufs = buffers_of(a);
  const ByteMap map = byte_map(bufs);
  A out;
  bool noop = false;
  m3qkv::clear_error();
  const m3qkv_status st = validate(&a, &out, &noop);
  const std::string msg = m3qkv::last_error_message();
  const std::string where = "config " + std::to_string(iter) + ": " + msg;

  // The fuzzer's oracle agrees with the byte map on every pair.
  m3qkv_oracle::Buffers ob;
  m3qkv_oracle::buffers(a, &ob);
  ASSERT_EQ(static_cast<size_t>(ob.n), bufs.size()) << where;
  for (size_t i = 0; i < bufs.size(); ++i) {
    ASSERT_EQ(ob.b[i].name, bufs[i].name) << where;
    for (size_t j = i + 1; j < bufs.size(); ++j) {
      bool undecided = false;
      const bool meet = m3qkv_oracle::patterns_meet(ob.b[i], ob.b[j], &undecided);
      ASSERT_FALSE(undecided) << where;
      ASSERT_EQ(meet, static_cast<bool>(map.meets[i][j])) << where << " (" << bufs[i].name << ", " << bufs[j].name << ")";
    }
    if (bufs[i].flat_kv) {
      bool undecided = false;
      ASSERT_EQ(m3qkv_oracle::pattern_meets_itself(ob.b[i], &undecided), map.self_overlap) << where;
    }
  }

  if (!strides_ok(a)) {
    ++t->refused_strides;
    EXPECT_EQ(st, M3QKV_ERROR_INVALID_SHAPE) << where;
    if (!map.self_overlap && a.kv_cache_dtype != M3QKV_CACHE_NVFP4) ++t->k_disjoint_but_not_nested;
    return;
  }
  // The nesting rule is sufficient: the K (and V) elements are disjoint.
  ASSERT_FALSE(map.self_overlap) << where << ": the stride rules pass but two K elements share a byte";
  bool conflict = false;
  for (size_t i = 0; i < bufs.size(); ++i)
    for (size_t j = i + 1; j < bufs.size(); ++j)
      conflict = conflict || (map.meets[i][j] && (bufs[i].written || bufs[j].written));
  if (st == M3QKV_SUCCESS) {
    ++t->accepted;
    EXPECT_FALSE(conflict) << where << ": accepted, but a written buffer shares a byte with another";
    return;
  }
  ASSERT_EQ(st, M3QKV_ERROR_INVALID_ARGUMENT) << where;
  std::string x, y;
  ASSERT_TRUE(named_pair(msg, &x, &y)) << where;
  size_t i = bufs.size(), j = bufs.size();
  for (size_t k = 0; k < bufs.size(); ++k) {
    if (bufs[k].name == x) i = k;
    if (bufs[k].name == y) j = k;
  }
  ASSERT_LT(i, bufs.size()) << where;
  ASSERT_LT(j, bufs.size()) << where;
  if (map.meets[i][j]) {
    ++t->refused_exact;
    return;
  }
  // Refused without a shared byte between the named pair: only the two
  // conservative cases of the header comment.
  if (bufs[i].flat_kv || bufs[j].flat_kv) {
    // Inside the hull of one page's elements, or only between pages?
    const Buf& k = bufs[bufs[i].flat_kv ? i : j];
    const Buf& o = bufs[bufs[i].flat_kv ? j : i];
    const int64_t base = k.rows.front().first;  // page 0, token 0, head 0
    const int64_t page_hull = (a.kv_cache_dtype == M3QKV_CACHE_BF16 ? 256 : 128) + (a.nkv - 1) * a.kv_head_stride +
                              (a.block_size - 1) * a.kv_token_stride;
    bool in_page = a.num_blocks > 1 && a.kv_page_stride < page_hull;  // pages interleave: one hull
    for (int64_t p = 0; p < a.num_blocks && !in_page; ++p)
      for (const auto& rw : o.rows)
        in_page = in_page || (rw.first < base + p * a.kv_page_stride + page_hull && base + p * a.kv_page_stride < rw.second);
    if (in_page) {
      ++t->page_hull;
    } else {
      ++t->between_pages;
      ADD_FAILURE() << where << ": refused, but " << o.name << " lies between the pages of " << k.name
                    << " (strides: head " << a.kv_head_stride << ", token " << a.kv_token_stride << ", page "
                    << a.kv_page_stride << "; nkv " << a.nkv << ", block_size " << a.block_size << ", num_blocks "
                    << a.num_blocks << ")";
    }
    return;
  }
  if (bufs[i].paged && bufs[j].paged && bufs[i].page_stride != bufs[j].page_stride) {
    ++t->different_strides;
    return;
  }
  ADD_FAILURE() << where << ": refused, but " << x << " and " << y << " share no byte";
}

TEST(ValidationOracle, OverlapAndStrideRulesAgreeWithBruteForce) {
  Rng r(30);
  Tally insert, fused;
  for (int i = 0; i < 6000 && !HasFatalFailure(); ++i) check_one<m3qkv_insert_args>(r, &insert, &m3qkv::validate_insert, i);
  for (int i = 0; i < 600 && !HasFatalFailure(); ++i) check_one<m3qkv_fused_args>(r, &fused, &m3qkv::validate_fused, i);
  for (const auto& [name, t] : {std::pair<const char*, const Tally&>{"insert", insert}, {"fused", fused}}) {
    std::printf("%s: accepted %d, refused for a shared byte %d, for a stride rule %d (of which %d with disjoint K "
                "elements), conservatively: inside a flat KV page's hull %d, between its pages %d, paged caches of "
                "different strides %d\n",
                name, t.accepted, t.refused_exact, t.refused_strides, t.k_disjoint_but_not_nested, t.page_hull,
                t.between_pages, t.different_strides);
  }
  // Caches interleave page by page in every format: an index page in the
  // padding between two pages of a flat KV cache is never refused.
  EXPECT_EQ(insert.between_pages + fused.between_pages, 0);
  // Both verdicts occur often enough to mean something.
  EXPECT_GT(insert.accepted, 500);
  EXPECT_GT(insert.refused_exact, 500);
  EXPECT_GT(insert.refused_strides, 200);
  EXPECT_GT(fused.accepted, 50);
  EXPECT_GT(fused.refused_exact, 50);
}

// The contract's interleavings written out: index pages in the padding of
// the pages of an FP8 KV cache ([num_blocks, block_size, nkv, 128] pages
// padded by one index page) and of a BF16 one ([num_blocks, 2, block_size,
// nkv, 128], V in the same allocation); one byte less of padding is refused.
TEST(ValidationOracle, IndexPagesInThePaddingOfFlatKvPages) {
  for (const int32_t dtype : {M3QKV_CACHE_FP8, M3QKV_CACHE_BF16}) {
    const int64_t e = dtype == M3QKV_CACHE_BF16 ? 2 : 1;
    m3qkv_insert_args a;
    std::memset(&a, 0, sizeof(a));
    a.struct_size = sizeof(a);
    a.m = 3, a.nq = 4, a.nkv = 2, a.niq = 0, a.nik = 1;
    a.max_position = 8, a.eps = 1e-6f, a.block_size = 8, a.num_blocks = 3, a.num_index_blocks = 3;
    a.q_fp8_scale = a.k_scale = a.v_scale = 1.0f;
    a.kv_cache_dtype = a.index_cache_dtype = dtype;
    const int64_t kv_page = a.block_size * a.nkv * 128 * e, index_page = a.block_size * 128 * e;
    a.kv_head_stride = 128 * e, a.kv_token_stride = a.nkv * 128 * e;
    const bool one_allocation = dtype == M3QKV_CACHE_BF16;  // K page, V page, index page
    a.kv_page_stride = (one_allocation ? 2 * kv_page : kv_page) + index_page;
    a.index_page_stride = a.kv_page_stride;
    int64_t o = 0;
    const auto next = [&](int64_t bytes) {
      const int64_t at_ = o;
      o += (bytes + 15) / 16 * 16;
      return reinterpret_cast<void*>(kArena + static_cast<uintptr_t>(at_));
    };
    a.kv_cache = next(a.num_blocks * a.kv_page_stride);
    a.v_cache = one_allocation ? static_cast<char*>(a.kv_cache) + kv_page : next(a.num_blocks * a.kv_page_stride);
    a.index_cache = static_cast<char*>(a.kv_cache) + (one_allocation ? 2 * kv_page : kv_page);
    a.qkv = next(a.m * (a.nq + 2 * a.nkv + a.nik) * 128 * 2);
    a.positions = static_cast<const int64_t*>(next(a.m * 8));
    a.slot_mapping = static_cast<const int64_t*>(next(a.m * 8));
    a.index_slot_mapping = static_cast<const int64_t*>(next(a.m * 8));
    a.cos_sin_cache = next(a.max_position * 128);
    a.q_norm_weight = next(256), a.k_norm_weight = next(256), a.index_k_norm_weight = next(256);
    a.q_out = next(a.m * a.nq * 256);
    m3qkv_insert_args out;
    bool noop = false;
    EXPECT_EQ(m3qkv::validate_insert(&a, &out, &noop), M3QKV_SUCCESS) << dtype << ": " << m3qkv::last_error_message();
    const ByteMap map = byte_map(buffers_of(a));
    for (const auto& row_ : map.meets)
      for (bool m : row_) EXPECT_FALSE(m);
    a.index_cache = static_cast<char*>(a.index_cache) - 16;  // its first row now meets K's (or V's) last row
    EXPECT_EQ(m3qkv::validate_insert(&a, &out, &noop), M3QKV_ERROR_INVALID_ARGUMENT) << dtype;
    EXPECT_NE(std::string(m3qkv::last_error_message()).find("index_cache"), std::string::npos)
        << m3qkv::last_error_message();
  }
}

}  // namespace
