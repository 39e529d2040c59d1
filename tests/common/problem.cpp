// Test-problem builder of the tests (see problem.h).
#include "common/problem.h"

#include <algorithm>
#include <functional>
#include <sstream>

#include "common/numerics.h"
#include "common/test_util.h"

namespace m3qkv_test {

using m3qkv::f32_to_bf16_rn_soft;

Problem make_problem(const ProblemConfig& cfg_in) {
  ProblemConfig cfg = cfg_in;
  if (cfg.seed == 0) cfg.seed = test_seed();
  return m3qkv::golden::build_problem(cfg);
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = f32_to_bf16_rn_soft(v[i]);
  return o;
}

namespace {
std::string where_q(int64_t i, int heads) {
  std::ostringstream os;
  os << "token " << i / (int64_t(heads) * 128) << " head " << (i / 128) % heads << " col " << i % 128;
  return os.str();
}
// Flat (FP8 / BF16) KV cache byte b: page, then the K or V element it belongs to
// (interleaved V inside the page), or "not an element".
std::string where_flat_kv(const Problem& p, int64_t b, bool v_buffer) {
  std::ostringstream os;
  const int64_t page = b / p.kv_page_stride, w = b % p.kv_page_stride, e = p.kv_elem();
  os << "page " << page;
  for (int part = 0; part < 2; ++part) {
    const bool is_v = v_buffer || part == 1;
    const int64_t base = (!v_buffer && part == 1) ? p.v_in_kv : 0;
    if (!v_buffer && part == 1 && base < 0) break;
    for (int t = 0; t < p.block_size; ++t)
      for (int h = 0; h < p.nkv; ++h) {
        const int64_t r = w - base - t * p.kv_token_stride - h * p.kv_head_stride;
        if (r >= 0 && r < 128 * e) {
          os << (is_v ? " V" : " K") << " head " << h << " token " << t << " (slot id " << page * p.block_size + t
             << ") col " << r / e << " byte " << r % e;
          return os.str();
        }
      }
    if (v_buffer) break;
  }
  os << " byte +" << w << " (no element: padding)";
  return os.str();
}
std::string where_flat_index(const Problem& p, int64_t b) {
  std::ostringstream os;
  const int64_t page = b / p.index_page_stride, w = b % p.index_page_stride, e = p.index_elem();
  os << "page " << page;
  if (w >= int64_t(p.block_size) * 128 * e) {
    os << " page padding +" << w - int64_t(p.block_size) * 128 * e;
  } else {
    os << " token " << w / (128 * e) << " (slot id " << page * p.block_size + w / (128 * e) << ") col "
       << (w % (128 * e)) / e;
  }
  return os.str();
}
std::string where_cache(int64_t b, int64_t stride, int slots, int bs, bool kv) {
  std::ostringstream os;
  const int64_t page = b / stride, off = b % stride;
  os << "page " << page;
  if (off >= int64_t(slots) * bs * 72) {
    os << " page padding +" << off - int64_t(slots) * bs * 72;
    return os.str();
  }
  const int slot = int(off / (bs * 72));
  const int64_t w = off % (bs * 72);
  if (kv) os << (slot % 2 ? " V" : " K") << " head " << slot / 2;
  if (w < int64_t(bs) * 64) {
    os << " token " << w / 64 << " (slot id " << page * bs + w / 64 << ") data byte " << w % 64 << " (cols "
       << 2 * (w % 64) << "," << 2 * (w % 64) + 1 << ")";
  } else {
    const int64_t sb = w - int64_t(bs) * 64;
    int64_t t, g;
    if (kv && slot % 2) {  // V: ((t/4)·4 + g/2)·8 + (g%2)·4 + t%4
      const int64_t q = sb / 8, r = sb % 8;
      t = (q / 4) * 4 + r % 4;
      g = (q % 4) * 2 + r / 4;
    } else {
      t = sb / 8;
      g = sb % 8;
    }
    os << " token " << t << " (slot id " << page * bs + t << ") scale of group " << g;
  }
  return os.str();
}
template <class T>
void diff_buffer(const char* name, const std::vector<T>& a, const std::vector<T>& b, int max_report,
                 const std::function<std::string(int64_t)>& where, std::ostringstream& os) {
  if (a.size() != b.size()) {
    os << name << ": size " << a.size() << " vs " << b.size() << "\n";
    return;
  }
  int64_t count = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;
    if (count < max_report)
      os << name << "[" << i << "] " << where(int64_t(i)) << ": want 0x" << std::hex << uint64_t(a[i]) << " got 0x"
         << uint64_t(b[i]) << std::dec << "\n";
    ++count;
  }
  if (count) os << name << ": " << count << " of " << a.size() << " differ\n";
}
}  // namespace

std::string compare_outputs(const Problem& p, const HostOutputs& want, const HostOutputs& got, int max_report) {
  std::ostringstream os;
  diff_buffer("q_out", want.q_out, got.q_out, max_report, [&](int64_t i) { return where_q(i, p.nq); }, os);
  diff_buffer("q_fp8_out", want.q_fp8_out, got.q_fp8_out, max_report, [&](int64_t i) { return where_q(i, p.nq); }, os);
  diff_buffer("index_q_out", want.index_q_out, got.index_q_out, max_report,
              [&](int64_t i) { return where_q(i, std::max(1, p.niq)); }, os);
  diff_buffer("kv_cache", want.kv_cache, got.kv_cache, max_report,
              [&](int64_t i) {
                return p.kv_flat() ? where_flat_kv(p, i, false)
                                   : where_cache(i, p.kv_page_stride, 2 * p.nkv, p.block_size, true);
              },
              os);
  diff_buffer("v_cache", want.v_cache, got.v_cache, max_report, [&](int64_t i) { return where_flat_kv(p, i, true); },
              os);
  diff_buffer("index_cache", want.index_cache, got.index_cache, max_report,
              [&](int64_t i) {
                return p.index_flat() ? where_flat_index(p, i)
                                      : where_cache(i, p.index_page_stride, 1, p.block_size, false);
              },
              os);
  if (want.flags != got.flags) os << "error flags: want 0x" << std::hex << want.flags << " got 0x" << got.flags << "\n";
  return os.str();
}

}  // namespace m3qkv_test
