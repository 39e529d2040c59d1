// Test problems of the golden model (see problem.h).
#include "golden/problem.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <stdexcept>

#include "common/layouts.h"
#include "common/numerics.h"
#include "golden/golden.h"

namespace m3qkv {
namespace golden {

std::string ProblemConfig::describe() const {
  std::ostringstream os;
  os << "m=" << m << " k=" << k << " nq=" << nq << " nkv=" << nkv << " niq=" << niq << " nik=" << nik
     << " block_size=" << block_size << " num_blocks=" << num_blocks << " kv_page_stride=" << kv_page_stride
     << " num_index_blocks=" << num_index_blocks << " index_page_stride=" << index_page_stride
     << " max_position=" << max_position << " q_bf16=" << q_bf16 << " q_fp8=" << q_fp8
     << " q_fp8_scale=" << q_fp8_scale << " k_scale=" << k_scale << " v_scale=" << v_scale << " eps=" << eps
     << " exact=" << exact_data << " seed=" << seed << " skip=" << slot_skip_fraction
     << " oor_slots=" << out_of_range_slots << " shared_slots=" << shared_slot_fraction
     << " oor_positions=" << out_of_range_positions
     << " kv_dtype=" << kv_dtype << " index_dtype=" << index_dtype << " kv_head_major=" << kv_head_major
     << " kv_row_pad=" << kv_row_pad << " kv_interleaved=" << kv_interleaved << " x_bf16=" << x_bf16;
  return os.str();
}

float Problem::k_sf() const { return rcp_rn(cfg.k_scale); }
float Problem::v_sf() const { return rcp_rn(cfg.v_scale); }

namespace {

// Random bf16 data [rows, k] ~ N(0, sigma·row_scale).
std::vector<uint16_t> random_bf16(std::mt19937_64& rng, int64_t rows, int64_t k, double sigma, bool row_variation,
                                  bool outliers) {
  std::normal_distribution<double> nd(0.0, 1.0);
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  std::vector<uint16_t> x(size_t(rows * k));
  for (int64_t r = 0; r < rows; ++r) {
    const double rs = row_variation ? std::exp2(ud(rng) * 6.0 - 3.0) : 1.0;  // rows span 2^[-3, 3]
    for (int64_t c = 0; c < k; ++c) {
      double v = nd(rng) * sigma * rs;
      if (outliers && ud(rng) < 1e-3) v *= 40.0;  // activation outliers
      x[size_t(r * k + c)] = f32_to_bf16_rn_soft(float(v));
    }
  }
  return x;
}

// Random data of one MXFP8 operand [rows, k]: random_bf16 quantized by the
// golden quantizer.
void random_mxfp8(std::mt19937_64& rng, int64_t rows, int64_t k, double sigma, bool row_variation, bool outliers,
                  std::vector<uint8_t>& q, std::vector<uint8_t>& sf) {
  const std::vector<uint16_t> x = random_bf16(rng, rows, k, sigma, row_variation, outliers);
  q.assign(size_t(rows * k), 0);
  sf.assign(size_t(f8_128x4_bytes(rows, k / 32)), 0);
  mxfp8_quantize(x.data(), rows, k, q.data(), sf.data());
}

// e4m3 code of ±1 or ±2: 1.0 = 0x38, 2.0 = 0x40 (bias 7: exponent 7 / 8, mantissa 0).
uint8_t exact_code(std::mt19937_64& rng) {
  const uint64_t r = rng();
  const uint8_t mag = (r & 1) ? 0x40 : 0x38;
  return static_cast<uint8_t>(mag | ((r & 2) ? 0x80 : 0));
}

// Exact data. Values: x elements and w elements in {±1, ±2} (x sparse: at most
// kExactMaxNonzero nonzeros per row, zeros elsewhere; w dense). Scales: row r
// of x has a base exponent bx_r in [-2, 1] and each 32-block scale is
// 2^(bx_r + {0 or 1}); row n of w likewise with a base bw per head in [-2, 1].
// So every scale is in 2^[-2, 2] and, in one dot product (x row r, w row n),
// every nonzero product is ±2^(bx_r + bw + j) with j in [0, 4]: all products
// are integer multiples of p_min = 2^(bx_r + bw) and |product| <= 16·p_min
// (kExactLog2Ratio = 4). Any partial sum, in any order, is an integer multiple
// of p_min of magnitude <= 127·16 = 2032 < 2^11, hence an integer < 2^11 times
// a power of two: exactly representable with 11 <= 12 significant bits (and the
// e4m3·2^e operands are exact in bf16, so a bf16-dequantizing path is exact too).
void exact_operands(std::mt19937_64& rng, Problem& p) {
  const int64_t m = p.m, k = p.k, n = p.n(), cols = k / 32;
  std::uniform_int_distribution<int> base(-2, 1);
  p.xq.assign(size_t(m * k), 0);
  p.xsf.assign(size_t(f8_128x4_bytes(m, cols)), 0x7f);
  p.wq.assign(size_t(n * k), 0);
  p.wsf.assign(size_t(f8_128x4_bytes(n, cols)), 0x7f);
  std::vector<int64_t> idx(static_cast<size_t>(k));
  for (int64_t r = 0; r < m; ++r) {
    const int bx = base(rng);
    for (int64_t c = 0; c < cols; ++c) p.xsf[size_t(f8_128x4_offset(r, c, cols))] = uint8_t(127 + bx + int(rng() & 1));
    // Nonzero count varies by row: from a handful up to the bound.
    const int64_t nnz = std::min<int64_t>(k, 1 + int64_t(rng() % kExactMaxNonzero));
    for (int64_t i = 0; i < k; ++i) idx[size_t(i)] = i;
    for (int64_t i = 0; i < nnz; ++i) {
      const int64_t j = i + int64_t(rng() % uint64_t(k - i));
      std::swap(idx[size_t(i)], idx[size_t(j)]);
      p.xq[size_t(r * k + idx[size_t(i)])] = exact_code(rng);
    }
  }
  int bw = 0;
  for (int64_t r = 0; r < n; ++r) {
    if (r % 128 == 0) bw = base(rng);  // one base per head: heads differ in magnitude
    for (int64_t c = 0; c < cols; ++c) p.wsf[size_t(f8_128x4_offset(r, c, cols))] = uint8_t(127 + bw + int(rng() & 1));
    for (int64_t i = 0; i < k; ++i) p.wq[size_t(r * k + i)] = exact_code(rng);
  }
}

// Exact bf16 activations (cfg.x_bf16 with exact data; bound at
// kExactBf16Log2Bound): row r has a base exponent bx in [-2, 1] and between 1
// and kExactMaxNonzero nonzeros ±j·2^(bx − 6), j uniform in [1, 255] (odd and
// even j: up to 8 significant bits, exact in bf16). Replaces xq / xsf.
void exact_bf16_activations(std::mt19937_64& rng, Problem& p) {
  const int64_t m = p.m, k = p.k;
  std::uniform_int_distribution<int> base(-2, 1);
  std::uniform_int_distribution<int> jd(1, kExactBf16MaxJ);
  p.xq.clear();
  p.xsf.clear();
  p.x_bf16.assign(size_t(m * k), 0);
  std::vector<int64_t> idx(static_cast<size_t>(k));
  for (int64_t r = 0; r < m; ++r) {
    const int bx = base(rng);
    const int64_t nnz = std::min<int64_t>(k, 1 + int64_t(rng() % kExactMaxNonzero));
    for (int64_t i = 0; i < k; ++i) idx[size_t(i)] = i;
    for (int64_t i = 0; i < nnz; ++i) {
      const int64_t j = i + int64_t(rng() % uint64_t(k - i));
      std::swap(idx[size_t(i)], idx[size_t(j)]);
      const double v = std::ldexp(double(jd(rng)), bx - 6) * ((rng() & 1) ? -1.0 : 1.0);
      p.x_bf16[size_t(r * k + idx[size_t(i)])] = f32_to_bf16_rn_soft(float(v));  // exact: j < 2^8
    }
  }
}

// Unique slots drawn from [0, capacity) (a random subset, so they spread
// over pages), then some turned into skips / out-of-range values.
std::vector<int64_t> make_slots(std::mt19937_64& rng, int64_t m, int64_t capacity, double skip, bool oor,
                                double shared) {
  std::vector<int64_t> pool(static_cast<size_t>(capacity));
  for (int64_t i = 0; i < capacity; ++i) pool[size_t(i)] = i;
  for (int64_t i = 0; i < m; ++i) std::swap(pool[size_t(i)], pool[size_t(i + int64_t(rng() % uint64_t(capacity - i)))]);
  std::vector<int64_t> s(pool.begin(), pool.begin() + m);
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  const int64_t negs[] = {-1, -2, -1000, INT64_MIN};
  const int64_t bigs[] = {capacity, capacity + 1, capacity + 12345, INT64_MAX};
  for (int64_t i = 0; i < m; ++i) {
    if (ud(rng) < skip) s[size_t(i)] = (rng() % 4 == 0) ? negs[rng() % 4] : -1;
    else if (oor && ud(rng) < 0.15) s[size_t(i)] = bigs[rng() % 4];
  }
  // Shared slots after the skips and out-of-range values, which are shared too.
  if (shared > 0.0 && m > 1) {
    const int64_t hot = std::min<int64_t>(m, 3);
    for (int64_t i = 0; i < m; ++i) {
      if (ud(rng) >= shared) continue;
      const int64_t j = rng() % 3 == 0 ? int64_t(rng() % uint64_t(hot)) : int64_t(rng() % uint64_t(m));
      s[size_t(i)] = s[size_t(j)];
    }
  }
  if (oor && m > 0) s[size_t(rng() % uint64_t(m))] = capacity;  // at least one
  return s;
}

}  // namespace

Problem build_problem(const ProblemConfig& cfg_in) {
  ProblemConfig cfg = cfg_in;
  if (cfg.m < 0 || cfg.k <= 0 || cfg.k % 128 || cfg.nkv < 1 || cfg.nq < 1 || cfg.nq % cfg.nkv ||
      (cfg.niq != 0 && cfg.niq != cfg.nkv) || (cfg.nik != 0 && cfg.nik != 1) || cfg.block_size <= 0 ||
      cfg.block_size % 4 || cfg.max_position < 1 || (!cfg.q_bf16 && !cfg.q_fp8) || cfg.kv_dtype < 0 ||
      cfg.kv_dtype > 2 || cfg.index_dtype < 0 || cfg.index_dtype > 2 || cfg.kv_row_pad < 0 || cfg.kv_row_pad % 16)
    throw std::invalid_argument("build_problem: bad config " + cfg.describe());
  Problem p;
  p.m = cfg.m;
  p.k = cfg.k;
  p.nq = cfg.nq;
  p.nkv = cfg.nkv;
  p.niq = cfg.niq;
  p.nik = cfg.nik;
  p.block_size = cfg.block_size;
  p.max_position = cfg.max_position;
  const int64_t auto_pages = std::max<int64_t>(3, (2 * cfg.m + cfg.block_size - 1) / cfg.block_size);
  p.num_blocks = cfg.num_blocks > 0 ? cfg.num_blocks : auto_pages;
  p.num_index_blocks = cfg.num_index_blocks > 0 ? cfg.num_index_blocks : auto_pages;
  p.kv_dtype = cfg.kv_dtype;
  p.index_dtype = cfg.index_dtype;
  if (p.kv_flat()) {
    const int64_t row = 128 * p.kv_elem() + cfg.kv_row_pad;  // the innermost stride
    if (cfg.kv_head_major) {
      p.kv_token_stride = row;
      p.kv_head_stride = row * p.block_size;
    } else {
      p.kv_head_stride = row;
      p.kv_token_stride = row * p.nkv;
    }
    const int64_t half = row * p.nkv * p.block_size;  // one page of K (or V)
    p.v_in_kv = cfg.kv_interleaved ? half : -1;
    p.kv_page_stride = cfg.kv_page_stride > 0 ? cfg.kv_page_stride : (cfg.kv_interleaved ? 2 : 1) * half + 64;
  } else {
    p.kv_page_stride = cfg.kv_page_stride > 0 ? cfg.kv_page_stride : kv_page_min_bytes(p.nkv, p.block_size) + 64;
  }
  p.index_page_stride =
      cfg.index_page_stride > 0
          ? cfg.index_page_stride
          : (p.index_flat() ? index_flat_page_bytes(p.block_size, p.index_elem())
                            : nvfp4_slot_bytes(p.block_size)) + 64;
  if (p.kv_capacity() < p.m || (p.nik && p.index_capacity() < p.m))
    throw std::invalid_argument("build_problem: cache smaller than m tokens (slots must be unique)");
  cfg.num_blocks = p.num_blocks;
  cfg.num_index_blocks = p.num_index_blocks;
  cfg.kv_page_stride = p.kv_page_stride;
  cfg.index_page_stride = p.index_page_stride;
  p.cfg = cfg;

  std::mt19937_64 rng(cfg.seed);
  if (cfg.exact_data) {
    exact_operands(rng, p);
    if (cfg.x_bf16) exact_bf16_activations(rng, p);
  } else {
    if (cfg.x_bf16) {
      p.x_bf16 = random_bf16(rng, p.m, p.k, 1.0, true, true);
    } else {
      random_mxfp8(rng, p.m, p.k, 1.0, true, true, p.xq, p.xsf);
    }
    random_mxfp8(rng, p.n(), p.k, 0.02, false, false, p.wq, p.wsf);
  }

  // RoPE table, theta 10000 over 64 rotary dims: inv_freq[i] = 10000^(-2i/64).
  p.cos_sin_cache.resize(size_t(p.max_position * 64));
  double inv_freq[32];
  for (int i = 0; i < 32; ++i) inv_freq[i] = std::pow(10000.0, -2.0 * i / 64.0);
  for (int64_t pos = 0; pos < p.max_position; ++pos)
    for (int i = 0; i < 32; ++i) {
      const double ang = double(pos) * inv_freq[i];
      p.cos_sin_cache[size_t(pos * 64 + i)] = f32_to_bf16_rn_soft(float(std::cos(ang)));
      p.cos_sin_cache[size_t(pos * 64 + 32 + i)] = f32_to_bf16_rn_soft(float(std::sin(ang)));
    }
  std::normal_distribution<double> wn(0.0, 0.1);
  auto weights = [&](std::vector<uint16_t>& w) {
    w.resize(128);
    for (auto& v : w) v = f32_to_bf16_rn_soft(float(wn(rng)));
  };
  weights(p.q_norm_weight);
  weights(p.k_norm_weight);
  if (p.niq) weights(p.index_q_norm_weight);
  if (p.nik) weights(p.index_k_norm_weight);

  std::uniform_int_distribution<int64_t> pd(0, p.max_position - 1);
  p.positions.resize(size_t(p.m));
  for (auto& v : p.positions) v = pd(rng);
  if (cfg.out_of_range_positions && p.m > 0) {
    const int64_t bad[] = {-1, -7, p.max_position, p.max_position + 100, INT64_MAX, INT64_MIN};
    std::uniform_real_distribution<double> ud(0.0, 1.0);
    for (auto& v : p.positions)
      if (ud(rng) < 0.2) v = bad[rng() % 6];
    p.positions[size_t(rng() % uint64_t(p.m))] = -1;  // at least one
  }
  p.slot_mapping = make_slots(rng, p.m, p.kv_capacity(), cfg.slot_skip_fraction, cfg.out_of_range_slots,
                              cfg.shared_slot_fraction);
  if (p.nik)
    p.index_slot_mapping = make_slots(rng, p.m, p.index_capacity(), cfg.slot_skip_fraction, cfg.out_of_range_slots,
                                      cfg.shared_slot_fraction);
  return p;
}

std::vector<HostBuffer> Problem::inputs() const {
  auto hb = [](const char* name, const auto& v) {
    const size_t bytes = v.size() * sizeof(v[0]);
    return HostBuffer{name, bytes ? static_cast<const void*>(v.data()) : nullptr, bytes};
  };
  return {hb("xq", xq),
          hb("xsf", xsf),
          hb("wq", wq),
          hb("wsf", wsf),
          hb("positions", positions),
          hb("cos_sin_cache", cos_sin_cache),
          hb("q_norm_weight", q_norm_weight),
          hb("k_norm_weight", k_norm_weight),
          hb("index_q_norm_weight", index_q_norm_weight),
          hb("index_k_norm_weight", index_k_norm_weight),
          hb("slot_mapping", slot_mapping),
          hb("index_slot_mapping", index_slot_mapping),
          hb("x_bf16", x_bf16)};
}

HostOutputs Problem::make_outputs(uint8_t poison) const {
  HostOutputs o;
  if (cfg.q_bf16) o.q_out.assign(size_t(q_elems()), uint16_t(poison | (poison << 8)));
  if (cfg.q_fp8) o.q_fp8_out.assign(size_t(q_elems()), poison);
  o.index_q_out.assign(index_q_out_bytes(), poison);
  o.kv_cache.assign(kv_cache_bytes(), poison);
  o.v_cache.assign(v_cache_bytes(), poison);
  o.v_in_kv = v_in_kv;
  o.index_cache.assign(index_cache_bytes(), poison);
  return o;
}

OutputPtrs HostOutputs::ptrs() {
  OutputPtrs p;
  p.q_out = q_out.empty() ? nullptr : q_out.data();
  p.q_fp8_out = q_fp8_out.empty() ? nullptr : q_fp8_out.data();
  p.index_q_out = index_q_out.empty() ? nullptr : index_q_out.data();
  p.kv_cache = kv_cache.empty() ? nullptr : kv_cache.data();
  p.v_cache = v_in_kv >= 0 ? (kv_cache.empty() ? nullptr : kv_cache.data() + v_in_kv)
                           : (v_cache.empty() ? nullptr : v_cache.data());
  p.index_cache = index_cache.empty() ? nullptr : index_cache.data();
  p.error_flags = &flags;
  return p;
}

namespace {
template <class A>
void fill_common(const Problem& p, A& a, const std::function<const void*(const HostBuffer&)>& map,
                 const OutputPtrs& out) {
  const auto in = p.inputs();
  auto get = [&](const char* name) -> const void* {
    for (const auto& b : in)
      if (std::strcmp(b.name, name) == 0) return b.bytes ? map(b) : nullptr;
    return nullptr;
  };
  a.m = p.m;
  a.nq = p.nq;
  a.nkv = p.nkv;
  a.niq = p.niq;
  a.nik = p.nik;
  a.positions = static_cast<const int64_t*>(get("positions"));
  a.max_position = p.max_position;
  a.cos_sin_cache = get("cos_sin_cache");
  a.q_norm_weight = get("q_norm_weight");
  a.k_norm_weight = get("k_norm_weight");
  a.index_q_norm_weight = get("index_q_norm_weight");
  a.index_k_norm_weight = get("index_k_norm_weight");
  a.eps = p.cfg.eps;
  a.slot_mapping = static_cast<const int64_t*>(get("slot_mapping"));
  a.index_slot_mapping = static_cast<const int64_t*>(get("index_slot_mapping"));
  a.kv_cache = out.kv_cache;
  a.kv_page_stride = p.kv_page_stride;
  a.num_blocks = p.num_blocks;
  a.index_cache = p.nik ? out.index_cache : nullptr;
  a.index_page_stride = p.index_page_stride;
  a.num_index_blocks = p.num_index_blocks;
  a.block_size = p.block_size;
  a.q_out = p.cfg.q_bf16 ? out.q_out : nullptr;
  a.q_fp8_out = p.cfg.q_fp8 ? out.q_fp8_out : nullptr;
  a.index_q_out = p.niq ? out.index_q_out : nullptr;
  a.q_fp8_scale = p.cfg.q_fp8_scale;
  a.k_scale = p.cfg.k_scale;
  a.v_scale = p.cfg.v_scale;
  a.use_pdl = 0;
  a.grid = 0;
  a.error_flags = out.error_flags;
  a.kv_cache_dtype = p.kv_dtype;
  a.index_cache_dtype = p.nik ? p.index_dtype : 0;
  a.v_cache = p.kv_flat() ? out.v_cache : nullptr;
  a.kv_token_stride = p.kv_token_stride;
  a.kv_head_stride = p.kv_head_stride;
}
}  // namespace

m3qkv_fused_args Problem::args_with(const std::function<const void*(const HostBuffer&)>& map,
                                    const OutputPtrs& out) const {
  m3qkv_fused_args a;
  std::memset(&a, 0, sizeof(a));
  a.struct_size = sizeof(a);
  fill_common(*this, a, map, out);
  a.k = k;
  const auto in = inputs();
  a.xq = cfg.x_bf16 ? nullptr : map(in[0]);
  a.xsf = cfg.x_bf16 ? nullptr : map(in[1]);
  a.wq = map(in[2]);
  a.wsf = map(in[3]);
  a.cta_group = 0;
  a.x_bf16 = cfg.x_bf16 ? map(in.back()) : nullptr;
  return a;
}

m3qkv_fused_args Problem::host_args(const OutputPtrs& out) const {
  return args_with([](const HostBuffer& b) { return b.data; }, out);
}

m3qkv_insert_args Problem::insert_args_with(const std::function<const void*(const HostBuffer&)>& map,
                                            const void* qkv, const OutputPtrs& out) const {
  m3qkv_insert_args a;
  std::memset(&a, 0, sizeof(a));
  a.struct_size = sizeof(a);
  fill_common(*this, a, map, out);
  a.qkv = qkv;
  return a;
}

m3qkv_insert_args Problem::host_insert_args(const void* qkv, const OutputPtrs& out) const {
  return insert_args_with([](const HostBuffer& b) { return b.data; }, qkv, out);
}

std::vector<float> problem_acc(const Problem& p) {
  HostOutputs o;  // no outputs: the accumulator needs the operands only
  return fused_acc(p.host_args(o.ptrs()));
}

Problem with_dequantized_x_bf16(const Problem& p) {
  if (p.cfg.x_bf16) throw std::invalid_argument("with_dequantized_x_bf16: the problem has bf16 activations already");
  const auto v = mxfp8_decode(p.xq.data(), p.xsf.data(), p.m, p.k);
  Problem q = p;
  q.cfg.x_bf16 = true;
  q.x_bf16.resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    q.x_bf16[i] = f32_to_bf16_rn_soft(float(v[i]));
    if (!(double(bf16_to_f32(q.x_bf16[i])) == v[i]))
      throw std::invalid_argument("with_dequantized_x_bf16: element " + std::to_string(i) + " = " +
                                  std::to_string(v[i]) + " is not exact in bf16");
  }
  q.xq.clear();
  q.xsf.clear();
  return q;
}

HostOutputs golden_outputs(const Problem& p, uint8_t poison, const float* acc) {
  HostOutputs o = p.make_outputs(poison);
  const m3qkv_fused_args a = p.host_args(o.ptrs());
  if (acc) {
    epilogue(a, acc, &o.flags);
  } else {
    fused_qkv(a, &o.flags);
  }
  return o;
}

}  // namespace golden
}  // namespace m3qkv
