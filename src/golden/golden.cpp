// CPU golden model (see golden.h). Every rounding goes through numerics.h,
// every address through layouts.h.
#include "golden/golden.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>
#include <unordered_set>
#include <vector>

#include "common/fold_fp8.h"
#include "common/layouts.h"
#include "common/numerics.h"

namespace m3qkv {
namespace golden {

namespace {

// Runs body(begin, end) over [0, n) on up to hardware_concurrency threads.
template <class F>
void parallel_for(int64_t n, int64_t min_per_thread, F&& body) {
  if (n <= 0) return;
  unsigned hw = std::thread::hardware_concurrency();
  if (hw == 0) hw = 1;
  int64_t nt = std::min<int64_t>(hw, (n + min_per_thread - 1) / std::max<int64_t>(1, min_per_thread));
  if (nt <= 1) {
    body(int64_t(0), n);
    return;
  }
  std::vector<std::thread> th;
  th.reserve(size_t(nt));
  const int64_t chunk = (n + nt - 1) / nt;
  for (int64_t t = 0; t < nt; ++t) {
    const int64_t b = t * chunk, e = std::min(n, b + chunk);
    if (b >= e) break;
    th.emplace_back([&body, b, e] { body(b, e); });
  }
  for (auto& x : th) x.join();
}

// The fields the epilogue needs, common to m3qkv_fused_args and m3qkv_insert_args.
struct Epi {
  int64_t m;
  int nq, nkv, niq, nik;
  const int64_t* positions;
  int64_t max_position;
  const uint16_t* cos_sin_cache;
  const uint16_t *q_w, *k_w, *iq_w, *ik_w;
  float eps;
  const int64_t* slot_mapping;
  const int64_t* index_slot_mapping;
  uint8_t* kv_cache;
  int64_t kv_page_stride, num_blocks;
  uint8_t* index_cache;
  int64_t index_page_stride, num_index_blocks;
  int block_size;
  uint16_t* q_out;
  uint8_t* q_fp8_out;
  uint8_t* index_q_out;
  float q_fp8_scale, k_scale, v_scale;
  int32_t kv_dtype, index_dtype;  // m3qkv_cache_dtype
  uint8_t* v_cache;               // FP8 / BF16 KV only
  int64_t kv_token_stride, kv_head_stride;
};

template <class A>
Epi make_epi(const A& a) {
  Epi e;
  e.m = a.m;
  e.nq = a.nq;
  e.nkv = a.nkv;
  e.niq = a.niq;
  e.nik = a.nik;
  e.positions = a.positions;
  e.max_position = a.max_position;
  e.cos_sin_cache = static_cast<const uint16_t*>(a.cos_sin_cache);
  e.q_w = static_cast<const uint16_t*>(a.q_norm_weight);
  e.k_w = static_cast<const uint16_t*>(a.k_norm_weight);
  e.iq_w = static_cast<const uint16_t*>(a.index_q_norm_weight);
  e.ik_w = static_cast<const uint16_t*>(a.index_k_norm_weight);
  e.eps = a.eps;
  e.slot_mapping = a.slot_mapping;
  e.index_slot_mapping = a.index_slot_mapping;
  e.kv_cache = static_cast<uint8_t*>(a.kv_cache);
  e.kv_page_stride = a.kv_page_stride;
  e.num_blocks = a.num_blocks;
  e.index_cache = static_cast<uint8_t*>(a.index_cache);
  e.index_page_stride = a.index_page_stride;
  e.num_index_blocks = a.num_index_blocks;
  e.block_size = a.block_size;
  e.q_out = static_cast<uint16_t*>(a.q_out);
  e.q_fp8_out = static_cast<uint8_t*>(a.q_fp8_out);
  e.index_q_out = static_cast<uint8_t*>(a.index_q_out);
  e.q_fp8_scale = a.q_fp8_scale;
  e.k_scale = a.k_scale;
  e.v_scale = a.v_scale;
  e.kv_dtype = a.kv_cache_dtype;
  e.index_dtype = a.index_cache_dtype;
  e.v_cache = static_cast<uint8_t*>(a.v_cache);
  e.kv_token_stride = a.kv_token_stride;
  e.kv_head_stride = a.kv_head_stride;
  return e;
}

// One FP8 / BF16 row (128 elements) at dst, element c at dst + c·e; values
// as fp8_head / bf16_head. Bytes little-endian, as the GPU stores them.
void store_flat(uint8_t* dst, int32_t dtype, const float v[128], bool has_sf, float sf) {
  if (dtype == kCacheFp8) {
    fp8_head(v, has_sf, sf, dst);
    return;
  }
  uint16_t h[kHeadDim];
  bf16_head(v, h);
  for (int c = 0; c < kHeadDim; ++c) {
    dst[2 * c] = static_cast<uint8_t>(h[c] & 0xffu);
    dst[2 * c + 1] = static_cast<uint8_t>(h[c] >> 8);
  }
}

// K (is_k) or V row of KV head `head` for cache slot `slot`, in the format of e.kv_dtype.
void store_kv(const Epi& e, bool is_k, int head, int64_t slot, const float v[128], float sf) {
  if (e.kv_dtype == kCacheNvfp4) {
    uint8_t data[64], scales[8];
    nvfp4_quant_head(v, true, sf, data, scales);
    const int64_t page = slot / e.block_size;
    const int t = int(slot % e.block_size);
    uint8_t* base = e.kv_cache + nvfp4_slot_base(page, 2 * head + (is_k ? 0 : 1), e.kv_page_stride, e.block_size);
    for (int c = 0; c < kHeadDim; c += 2) base[nvfp4_data_offset(t, c)] = data[c / 2];
    for (int g = 0; g < kHeadDim / kNvfp4Group; ++g)
      base[is_k ? nvfp4_scale_offset_linear(t, g, e.block_size) : nvfp4_scale_offset_v(t, g, e.block_size)] =
          scales[g];
    return;
  }
  const int64_t page = slot / e.block_size;
  const int t = int(slot % e.block_size);
  uint8_t* dst = (is_k ? e.kv_cache : e.v_cache) +
                 kv_flat_offset(page, t, head, 0, e.kv_page_stride, e.kv_token_stride, e.kv_head_stride,
                                flat_elem_bytes(e.kv_dtype));
  store_flat(dst, e.kv_dtype, v, true, sf);
}

// index_k row for index slot `slot`, in the format of e.index_dtype.
void store_index(const Epi& e, int64_t slot, const float y[128]) {
  const int64_t page = slot / e.block_size;
  const int t = int(slot % e.block_size);
  if (e.index_dtype == kCacheNvfp4) {
    uint8_t data[64], scales[8];
    nvfp4_quant_head(y, false, 1.0f, data, scales);
    uint8_t* base = e.index_cache + nvfp4_slot_base(page, 0, e.index_page_stride, e.block_size);
    for (int c = 0; c < kHeadDim; c += 2) base[nvfp4_data_offset(t, c)] = data[c / 2];
    for (int g = 0; g < kHeadDim / kNvfp4Group; ++g) base[nvfp4_scale_offset_linear(t, g, e.block_size)] = scales[g];
    return;
  }
  uint8_t* dst =
      e.index_cache + index_flat_offset(page, t, 0, e.index_page_stride, flat_elem_bytes(e.index_dtype));
  store_flat(dst, e.index_dtype, y, false, 1.0f);
}

// Epilogue over token rows [r0, r1). `row(r)` returns the f32 row of N values.
// Slot ownership (docs/contract.md §4.4): owner[r] = 1 where no later row of
// the call names slot[r] (negative slots own nothing and are never asked).
std::vector<uint8_t> slot_owners(const int64_t* slots, int64_t m) {
  std::vector<uint8_t> owner(static_cast<size_t>(m), 1);
  std::unordered_set<int64_t> later;
  for (int64_t r = m - 1; r >= 0; --r) {
    if (slots[r] < 0) continue;
    owner[static_cast<size_t>(r)] = later.insert(slots[r]).second ? 1 : 0;
  }
  return owner;
}

// A row that does not own its slot is one with a negative slot.
struct Owners {
  std::vector<uint8_t> kv, ix;
};

template <class RowFn>
void epilogue_rows(const Epi& e, const Owners& own, RowFn&& row, int64_t r0, int64_t r1, uint32_t* flags) {
  const int heads = total_heads(e.nq, e.nkv, e.niq, e.nik);
  const float qinv = rcp_rn(e.q_fp8_scale);
  const float ksf = rcp_rn(e.k_scale);
  const float vsf = rcp_rn(e.v_scale);
  const int64_t kv_cap = e.num_blocks * e.block_size;
  const int64_t ix_cap = e.num_index_blocks * e.block_size;
  uint32_t fl = 0;
  float x[kHeadDim], y[kHeadDim];
  for (int64_t r = r0; r < r1; ++r) {
    const float* acc = row(r);
    int64_t pos = e.positions[r];
    if (pos < 0 || pos >= e.max_position) fl |= M3QKV_FLAG_POSITION_OUT_OF_RANGE;
    pos = clamp_position(pos, e.max_position);
    const uint16_t* cs = e.cos_sin_cache + pos * kRopeDim;
    const int64_t slot = own.kv[static_cast<size_t>(r)] ? e.slot_mapping[r] : -1;
    const bool kv_write = slot >= 0 && slot < kv_cap;
    if (slot >= kv_cap) fl |= M3QKV_FLAG_SLOT_OUT_OF_RANGE;
    int64_t islot = -1;
    bool ix_write = false;
    if (e.nik > 0) {
      islot = own.ix[static_cast<size_t>(r)] ? e.index_slot_mapping[r] : -1;
      ix_write = islot >= 0 && islot < ix_cap;
      if (islot >= ix_cap) fl |= M3QKV_FLAG_INDEX_SLOT_OUT_OF_RANGE;
    }
    for (int h = 0; h < heads; ++h) {
      std::memcpy(x, acc + int64_t(h) * kHeadDim, sizeof(x));
      const HeadInfo hi = head_info(h, e.nq, e.nkv, e.niq);
      switch (hi.kind) {
        case HeadKind::Q: {
          head_rms_rope(x, e.q_w, e.eps, cs, y);
          const int64_t o = (r * e.nq + hi.index) * kHeadDim;
          for (int c = 0; c < kHeadDim; ++c) {
            if (e.q_out) e.q_out[o + c] = f32_to_bf16_rn_soft(y[c]);
            if (e.q_fp8_out) e.q_fp8_out[o + c] = f32_to_e4m3_satfinite_rn_soft(mul_rn(y[c], qinv));
          }
          break;
        }
        case HeadKind::K:
          if (!kv_write) break;
          head_rms_rope(x, e.k_w, e.eps, cs, y);
          store_kv(e, true, hi.index, slot, y, ksf);
          break;
        case HeadKind::V:
          if (!kv_write) break;
          store_kv(e, false, hi.index, slot, x, vsf);
          break;
        case HeadKind::IndexQ: {
          head_rms_rope(x, e.iq_w, e.eps, cs, y);
          const int64_t o = (r * e.niq + hi.index) * kHeadDim;
          for (int c = 0; c < kHeadDim; ++c) e.index_q_out[o + c] = f32_to_e4m3_satfinite_rn_soft(y[c]);
          break;
        }
        case HeadKind::IndexK:
          if (!ix_write) break;
          head_rms_rope(x, e.ik_w, e.eps, cs, y);
          store_index(e, islot, y);
          break;
      }
    }
  }
  if (flags) *flags |= fl;
}

// Rows split over threads; tokens write disjoint bytes (one owner per slot).
template <class RowFn>
void epilogue_all(const Epi& e, RowFn&& row, uint32_t* flags) {
  Owners own;
  own.kv = slot_owners(e.slot_mapping, e.m);
  if (e.nik > 0) own.ix = slot_owners(e.index_slot_mapping, e.m);
  std::atomic<uint32_t> fl{0};
  parallel_for(e.m, 64, [&](int64_t b, int64_t en) {
    uint32_t f = 0;
    epilogue_rows(e, own, row, b, en, &f);
    fl.fetch_or(f);
  });
  if (flags) *flags |= fl.load();
}

}  // namespace

// ---------------------------------------------------------------- MXFP8
void mxfp8_quantize(const uint16_t* x_bf16, int64_t m, int64_t k, uint8_t* xq, uint8_t* xsf) {
  const int64_t cols = k / kMxBlock;
  const int64_t rows_p = f8_128x4_padded_rows(m);
  // Padding rows first (every byte of the buffer is defined).
  for (int64_t r = m; r < rows_p; ++r)
    for (int64_t c = 0; c < f8_128x4_padded_cols(cols); ++c) xsf[f8_128x4_offset(r, c, cols)] = 0x7f;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint16_t* src = x_bf16 + r * k + c * kMxBlock;
      float amax = 0.0f;
      for (int i = 0; i < kMxBlock; ++i) amax = max_num(amax, abs_f32(bf16_to_f32(src[i])));
      const int e = mx_shared_exponent(amax);
      xsf[f8_128x4_offset(r, c, cols)] = static_cast<uint8_t>(e + 127);
      for (int i = 0; i < kMxBlock; ++i) xq[r * k + c * kMxBlock + i] = mx_quantize_value(bf16_to_f32(src[i]), e);
    }
  }
}

std::vector<double> mxfp8_decode(const uint8_t* q, const uint8_t* sf, int64_t rows, int64_t k) {
  std::vector<double> out(size_t(rows * k));
  const int64_t cols = k / kMxBlock;
  double lut[256];
  for (int i = 0; i < 256; ++i) lut[i] = e4m3_to_f32(uint8_t(i));
  parallel_for(rows, 256, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const uint8_t s = sf[f8_128x4_offset(r, c, cols)];
        // 2^(s-127) in f64 (exact for every byte; 0xFF is NaN).
        const double sc = s == 0xff ? std::nan("") : std::ldexp(1.0, int(s) - 127);
        for (int i = 0; i < kMxBlock; ++i) {
          const int64_t j = r * k + c * kMxBlock + i;
          out[size_t(j)] = lut[q[j]] * sc;
        }
      }
  });
  return out;
}

namespace {
// acc64[i][j] = Σ_k a[i][k]·b[j][k] in f64, in one fixed order whatever the
// tiling or thread count: lane l (= k % 4) sums its products in k order, then
// (l0 + l1) + (l2 + l3). Every product is exact (two 4-bit significands
// times powers of two), so only the additions round.
typedef double v4d __attribute__((vector_size(32)));

// One 4×4 tile of dot products. Explicit 4-lane vectors (no fast-math, no
// contraction: the same IEEE mul and add as scalar code); the AVX2 clone is
// picked at load time where the CPU has it (the GPU test hosts do).
__attribute__((target_clones("avx2", "default"))) void dot_tile_4x4(const double* const* ap,
                                                                    const double* const* bp, int64_t k,
                                                                    double* out) {
  v4d s[4][4];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) s[i][j] = v4d{0.0, 0.0, 0.0, 0.0};
  for (int64_t kk = 0; kk < k; kk += 4) {
    v4d va[4], vb[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) std::memcpy(&va[i], ap[i] + kk, sizeof(v4d));
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) std::memcpy(&vb[j], bp[j] + kk, sizeof(v4d));
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) s[i][j] += va[i] * vb[j];
  }
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) out[i * 4 + j] = (s[i][j][0] + s[i][j][1]) + (s[i][j][2] + s[i][j][3]);
}

template <class Store>
void gemm_f64(const std::vector<double>& a, const std::vector<double>& b, int64_t m, int64_t n, int64_t k,
              Store&& store) {
  constexpr int T = 4;
  const int64_t ni = (m + T - 1) / T;
  // Columns (rows of b) in blocks of ~1 MiB so a block stays in cache while
  // the thread's row tiles sweep it.
  const int64_t jb = std::max<int64_t>(T, (int64_t(1) << 20) / (k * 8) / T * T);
  parallel_for(ni, 1, [&](int64_t b0, int64_t b1) {
    double out[T * T];
    for (int64_t jb0 = 0; jb0 < n; jb0 += jb) {
      const int64_t jb1 = std::min(n, jb0 + jb);
      for (int64_t bi = b0; bi < b1; ++bi) {
        const int64_t i0 = bi * T;
        const int ti = int(std::min<int64_t>(T, m - i0));
        const double* ap[T];
        for (int i = 0; i < T; ++i) ap[i] = a.data() + (i0 + std::min(i, ti - 1)) * k;
        for (int64_t j0 = jb0; j0 < jb1; j0 += T) {
          const int tj = int(std::min<int64_t>(T, n - j0));
          const double* bp[T];
          for (int j = 0; j < T; ++j) bp[j] = b.data() + (j0 + std::min(j, tj - 1)) * k;
          dot_tile_4x4(ap, bp, k, out);
          for (int i = 0; i < ti; ++i)
            for (int j = 0; j < tj; ++j) store(i0 + i, j0 + j, out[i * T + j]);
        }
      }
    }
  });
}
}  // namespace

std::vector<double> mxfp8_acc_f64(const uint8_t* xq, const uint8_t* xsf, const uint8_t* wq, const uint8_t* wsf,
                                  int64_t m, int64_t n, int64_t k) {
  std::vector<double> out(size_t(m * n));
  const auto a = mxfp8_decode(xq, xsf, m, k);
  const auto b = mxfp8_decode(wq, wsf, n, k);
  gemm_f64(a, b, m, n, k, [&](int64_t i, int64_t j, double v) { out[size_t(i * n + j)] = v; });
  return out;
}

void mxfp8_acc(const uint8_t* xq, const uint8_t* xsf, const uint8_t* wq, const uint8_t* wsf, int64_t m, int64_t n,
               int64_t k, float* acc) {
  const auto a = mxfp8_decode(xq, xsf, m, k);
  const auto b = mxfp8_decode(wq, wsf, n, k);
  gemm_f64(a, b, m, n, k, [&](int64_t i, int64_t j, double v) { acc[i * n + j] = static_cast<float>(v); });
}

std::vector<float> mxfp8_acc(const uint8_t* xq, const uint8_t* xsf, const uint8_t* wq, const uint8_t* wsf, int64_t m,
                             int64_t n, int64_t k) {
  std::vector<float> out(size_t(m * n));
  mxfp8_acc(xq, xsf, wq, wsf, m, n, k, out.data());
  return out;
}

std::vector<double> bf16_decode(const uint16_t* x, int64_t rows, int64_t k) {
  std::vector<double> out(size_t(rows * k));
  for (int64_t i = 0; i < rows * k; ++i) out[size_t(i)] = bf16_to_f32(x[i]);  // exact (NaN, inf kept)
  return out;
}

std::vector<double> w8a16_acc_f64(const uint16_t* x_bf16, const uint8_t* wq, const uint8_t* wsf, int64_t m,
                                  int64_t n, int64_t k) {
  std::vector<double> out(size_t(m * n));
  const auto a = bf16_decode(x_bf16, m, k);
  const auto b = mxfp8_decode(wq, wsf, n, k);
  gemm_f64(a, b, m, n, k, [&](int64_t i, int64_t j, double v) { out[size_t(i * n + j)] = v; });
  return out;
}

void fold_mxfp8(const uint8_t* wq, const uint8_t* wsf, int64_t n, int64_t k, uint8_t* wq_out, uint8_t* scale_out,
                FoldStats* stats) {
  const int64_t kb = k / 32, groups = k / fold::kGroupK;
  FoldStats st;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      uint8_t e[fold::kBlocksPerGroup];
      for (int b = 0; b < fold::kBlocksPerGroup; ++b) e[b] = wsf[f8_128x4_offset(r, fold::kBlocksPerGroup * g + b, kb)];
      const uint8_t big = fold::group_exponent(e[0], e[1], e[2], e[3]);
      scale_out[r * groups + g] = big;
      double d2 = 0.0, w2 = 0.0;
      for (int64_t c = g * fold::kGroupK; c < (g + 1) * fold::kGroupK; ++c) {
        const uint8_t eb = e[(c % fold::kGroupK) / 32];
        const uint8_t before = wq[r * k + c];
        const uint8_t after = big == 0xffu ? before : fold::shift_e4m3(before, big - eb);
        wq_out[r * k + c] = after;
        if (big == 0xffu) continue;  // a NaN scale: the group is NaN either way
        const double w = double(e4m3_to_f32(before)) * std::ldexp(1.0, int(eb) - 127);
        const double w1 = double(e4m3_to_f32(after)) * std::ldexp(1.0, int(big) - 127);
        if (std::isnan(w) || std::isnan(w1)) continue;
        if (w1 != w) ++st.changed;
        d2 += (w1 - w) * (w1 - w);
        w2 += w * w;
      }
      if (w2 > 0.0) st.max_rel_change = std::max(st.max_rel_change, std::sqrt(d2 / w2));
    }
  }
  *stats = st;
}

void prepare_fp8(const uint8_t* wq, const uint8_t* wsf, int64_t n, int64_t k, std::vector<uint8_t>* wq_out,
                 std::vector<uint8_t>* wsf_out, FoldStats* stats) {
  const int64_t kb = k / 32, groups = k / fold::kGroupK;
  std::vector<uint8_t> scale(size_t(n * groups));
  wq_out->assign(size_t(n * k), 0);
  fold_mxfp8(wq, wsf, n, k, wq_out->data(), scale.data(), stats);
  wsf_out->assign(wsf, wsf + f8_128x4_bytes(n, kb));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < kb; ++c) (*wsf_out)[size_t(f8_128x4_offset(r, c, kb))] = scale[size_t(r * groups + c / 4)];
}

std::vector<double> folded_acc_f64(const uint8_t* xq, const uint8_t* xs, const uint8_t* wq, const uint8_t* ws, int64_t m,
                                   int64_t n, int64_t k) {
  const int64_t groups = k / fold::kGroupK;
  // Each operand as values times its group's scale, so the f64 GEMM applies both.
  const auto decode = [&](const uint8_t* q, const uint8_t* s, int64_t rows) {
    std::vector<double> v(size_t(rows * k));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < k; ++c)
        v[size_t(r * k + c)] =
            double(e4m3_to_f32(q[r * k + c])) * double(e8m0_to_f32(s[r * groups + c / fold::kGroupK]));
    return v;
  };
  std::vector<double> out(size_t(m * n));
  gemm_f64(decode(xq, xs, m), decode(wq, ws, n), m, n, k,
           [&](int64_t i, int64_t j, double v) { out[size_t(i * n + j)] = v; });
  return out;
}

void w8a16_acc(const uint16_t* x_bf16, const uint8_t* wq, const uint8_t* wsf, int64_t m, int64_t n, int64_t k,
               float* acc) {
  const auto a = bf16_decode(x_bf16, m, k);
  const auto b = mxfp8_decode(wq, wsf, n, k);
  gemm_f64(a, b, m, n, k, [&](int64_t i, int64_t j, double v) { acc[i * n + j] = static_cast<float>(v); });
}

std::vector<float> w8a16_acc(const uint16_t* x_bf16, const uint8_t* wq, const uint8_t* wsf, int64_t m, int64_t n,
                             int64_t k) {
  std::vector<float> out(size_t(m * n));
  w8a16_acc(x_bf16, wq, wsf, m, n, k, out.data());
  return out;
}

std::vector<float> fused_acc(const m3qkv_fused_args& a) {
  const int64_t n = int64_t(total_heads(a.nq, a.nkv, a.niq, a.nik)) * kHeadDim;
  const auto* wq = static_cast<const uint8_t*>(a.wq);
  const auto* wsf = static_cast<const uint8_t*>(a.wsf);
  if (a.x_bf16 != nullptr) return w8a16_acc(static_cast<const uint16_t*>(a.x_bf16), wq, wsf, a.m, n, a.k);
  return mxfp8_acc(static_cast<const uint8_t*>(a.xq), static_cast<const uint8_t*>(a.xsf), wq, wsf, a.m, n, a.k);
}

// ------------------------------------------------------------- per head
void head_rms(const float x[128], const uint16_t w_bf16[128], float eps, float y[128]) {
  float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int c = 0; c < kHeadDim; ++c) s[rms_class(c)] = fma_rn(x[c], x[c], s[rms_class(c)]);
  const float r = rms_inv(s[0], s[1], s[2], s[3], eps);
  for (int c = 0; c < kHeadDim; ++c) y[c] = rms_apply(x[c], r, bf16_to_f32(w_bf16[c]));
}

void head_rope(float y[128], const uint16_t* cs_row) {
  if (!cs_row) return;
  for (int i = 0; i < kRopeHalf; ++i) {
    float a, b;
    rope_pair(y[i], y[i + kRopeHalf], bf16_to_f32(cs_row[i]), bf16_to_f32(cs_row[kRopeHalf + i]), &a, &b);
    y[i] = a;
    y[i + kRopeHalf] = b;
  }
}

void head_rms_rope(const float x[128], const uint16_t w_bf16[128], float eps, const uint16_t* cs_row, float y[128]) {
  head_rms(x, w_bf16, eps, y);
  head_rope(y, cs_row);
}

void nvfp4_quant_head(const float y[128], bool has_sf, float sf, uint8_t data[64], uint8_t scales[8]) {
  for (int g = 0; g < kHeadDim / kNvfp4Group; ++g) {
    float amax = 0.0f;
    for (int i = 0; i < kNvfp4Group; ++i) amax = max_num(amax, abs_f32(y[g * kNvfp4Group + i]));
    float rc;
    scales[g] = nvfp4_group_scale(amax, has_sf, sf, &rc);
    for (int i = 0; i < kNvfp4Group; i += 2) {
      const int c = g * kNvfp4Group + i;
      data[c / 2] = static_cast<uint8_t>(nvfp4_encode(y[c], rc) | (nvfp4_encode(y[c + 1], rc) << 4));
    }
  }
}

void fp8_head(const float v[128], bool has_sf, float sf, uint8_t out[128]) {
  for (int c = 0; c < kHeadDim; ++c) out[c] = f32_to_e4m3_satfinite_rn_soft(has_sf ? mul_rn(v[c], sf) : v[c]);
}

void bf16_head(const float v[128], uint16_t out[128]) {
  for (int c = 0; c < kHeadDim; ++c) out[c] = f32_to_bf16_rn_soft(v[c]);
}

int64_t clamp_position(int64_t pos, int64_t max_position) {
  return pos < 0 ? 0 : (pos >= max_position ? max_position - 1 : pos);
}

// ------------------------------------------------------------- epilogue
void epilogue(const m3qkv_fused_args& a, const float* acc, uint32_t* flags) {
  const Epi e = make_epi(a);
  const int64_t n = int64_t(total_heads(e.nq, e.nkv, e.niq, e.nik)) * kHeadDim;
  epilogue_all(e, [&](int64_t r) { return acc + r * n; }, flags);
}

void fused_qkv(const m3qkv_fused_args& a, uint32_t* flags) {
  const auto acc = fused_acc(a);
  epilogue(a, acc.data(), flags);
}

void insert(const m3qkv_insert_args& a, uint32_t* flags) {
  const Epi e = make_epi(a);
  const int64_t n = int64_t(total_heads(e.nq, e.nkv, e.niq, e.nik)) * kHeadDim;
  const uint16_t* qkv = static_cast<const uint16_t*>(a.qkv);
  std::vector<float> acc(size_t(e.m * n));
  for (int64_t i = 0; i < e.m * n; ++i) acc[size_t(i)] = bf16_to_f32(qkv[i]);
  epilogue_all(e, [&](int64_t r) { return acc.data() + r * n; }, flags);
}

void gemm_bf16(const m3qkv_gemm_args& a) {
  const auto* wq = static_cast<const uint8_t*>(a.wq);
  const auto* wsf = static_cast<const uint8_t*>(a.wsf);
  const auto acc = a.x_bf16 != nullptr
                       ? w8a16_acc(static_cast<const uint16_t*>(a.x_bf16), wq, wsf, a.m, a.n, a.k)
                       : mxfp8_acc(static_cast<const uint8_t*>(a.xq), static_cast<const uint8_t*>(a.xsf), wq, wsf,
                                   a.m, a.n, a.k);
  uint16_t* out = static_cast<uint16_t*>(a.out);
  for (int64_t i = 0; i < a.m * a.n; ++i) out[i] = f32_to_bf16_rn_soft(acc[size_t(i)]);
}

// -------------------------------------------------------------- decoders
void read_nvfp4_token(const uint8_t* cache, int64_t page_stride, int block_size, int slot_in_page, int64_t slot,
                      bool v_swizzle, uint8_t codes[128], uint8_t scales[8]) {
  const int64_t page = slot / block_size;
  const int t = int(slot % block_size);
  const uint8_t* base = cache + nvfp4_slot_base(page, slot_in_page, page_stride, block_size);
  for (int c = 0; c < kHeadDim; c += 2) {
    const uint8_t b = base[nvfp4_data_offset(t, c)];
    codes[c] = b & 0xf;
    codes[c + 1] = b >> 4;
  }
  for (int g = 0; g < kHeadDim / kNvfp4Group; ++g)
    scales[g] = base[v_swizzle ? nvfp4_scale_offset_v(t, g, block_size) : nvfp4_scale_offset_linear(t, g, block_size)];
}

void decode_nvfp4_token(const uint8_t* cache, int64_t page_stride, int block_size, int slot_in_page, int64_t slot,
                        bool v_swizzle, float sf, float out[128]) {
  uint8_t codes[128], scales[8];
  read_nvfp4_token(cache, page_stride, block_size, slot_in_page, slot, v_swizzle, codes, scales);
  for (int c = 0; c < kHeadDim; ++c) {
    const float v = mul_rn(e2m1_to_f32(codes[c]), e4m3_to_f32(scales[c / kNvfp4Group]));  // exact
    out[c] = v / sf;
  }
}

namespace {
void decode_flat_row(const uint8_t* row, int32_t dtype, float out[128]) {
  for (int c = 0; c < kHeadDim; ++c)
    out[c] = dtype == kCacheFp8 ? e4m3_to_f32(row[c])
                                : bf16_to_f32(static_cast<uint16_t>(row[2 * c] | (row[2 * c + 1] << 8)));
}
}  // namespace

void decode_flat_kv_token(const uint8_t* base, int32_t dtype, int64_t page_stride, int64_t token_stride,
                          int64_t head_stride, int block_size, int head, int64_t slot, float out[128]) {
  decode_flat_row(base + kv_flat_offset(slot / block_size, int(slot % block_size), head, 0, page_stride, token_stride,
                                        head_stride, flat_elem_bytes(dtype)),
                  dtype, out);
}

void decode_flat_index_token(const uint8_t* base, int32_t dtype, int64_t page_stride, int block_size, int64_t slot,
                             float out[128]) {
  decode_flat_row(
      base + index_flat_offset(slot / block_size, int(slot % block_size), 0, page_stride, flat_elem_bytes(dtype)),
      dtype, out);
}

void decode_e4m3(const uint8_t* in, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = e4m3_to_f32(in[i]);
}

}  // namespace golden
}  // namespace m3qkv
