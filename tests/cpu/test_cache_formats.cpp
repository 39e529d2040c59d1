// The FP8 / BF16 cache formats of docs/contract.md §4.3 in the golden model:
//  - hand-worked bytes of the per-row encoders (fp8_head, bf16_head): scale
//    multiply by RN(1/scale), saturation, rounding ties, subnormals, -0, NaN,
//    and the unit-scale index path that multiplies by nothing;
//  - golden::epilogue / insert with every KV × index format and KV layout
//    (token-major, head-major, padded rows, interleaved K/V, padded pages),
//    every cache byte checked against values encoded from first principles
//    (tests/common/ref_e4m3.h, a nearest-candidate bf16 below) at offsets typed
//    from the contract's formula here, and every other byte still the poison.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/problem.h"
#include "common/ref_e4m3.h"
#include "golden/golden.h"

namespace {

namespace g = m3qkv::golden;
using m3qkv_test::Problem;
using m3qkv_test::ProblemConfig;
using m3qkv_test::ref_e4m3_encode;

float fbits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// bf16 RN-even from first principles: the two bf16 neighbours of f (truncated
// magnitude and one code up; the code above the largest finite one stands for
// 2^128, so overflow goes to inf exactly when IEEE says), the nearer wins, a
// tie goes to the even code. NaN -> 0x7FFF (the canonical NaN of cvt.rn.bf16.f32).
uint16_t ref_bf16(float f) {
  const uint32_t u = bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t mag = u & 0x7fffffffu;
  const uint16_t lo = uint16_t(mag >> 16);
  if ((mag & 0xffffu) == 0) return uint16_t(sign | lo);
  const uint16_t hi = uint16_t(lo + 1);
  auto value = [](uint16_t c) {  // magnitude of a bf16 code, inf code as 2^128
    const int e = c >> 7, m = c & 127;
    return e == 0 ? std::ldexp(double(m), -133) : std::ldexp(1.0 + m / 128.0, e - 127);
  };
  const double a = double(fbits(mag));
  const double dl = a - value(lo), dh = value(hi) - a;
  const uint16_t pick = dl < dh ? lo : (dh < dl ? hi : ((lo & 1) ? hi : lo));
  return uint16_t(sign | pick);
}

// ------------------------------------------------------------- encoders
// K with k_scale = 0.5: sf = RN(1/0.5) = 2 exactly, value·2 then e4m3 RN-even.
TEST(FlatEncoders, Fp8ScaledHandWorkedBytes) {
  float v[128];
  for (int c = 0; c < 128; ++c) v[c] = 0.0f;
  struct Case {
    float value;
    uint8_t want;  // e4m3_satfinite_rn(value · 2)
    const char* why;
  } cases[] = {
      {1.0f, 0x40, "2.0 = 1.0·2^1: e = 8, m = 0"},
      {-0.5f, 0xb8, "-1.0: sign | e = 7"},
      {0.53125f, 0x38, "1.0625: tie of 1.0 (m 0) and 1.125 (m 1) -> even 1.0"},
      {0.59375f, 0x3a, "1.1875: tie of 1.125 (m 1) and 1.25 (m 2) -> even 1.25"},
      {224.0f, 0x7e, "448 = the largest finite e4m3"},
      {232.0f, 0x7e, "464 > 448: satfinite -> 448"},
      {300.0f, 0x7e, "600 -> 448"},
      {-1e30f, 0xfe, "-2e30 -> -448"},
      {fbits(0x7f800000u), 0x7e, "+inf -> 448"},
      {fbits(0xff800000u), 0xfe, "-inf -> -448"},
      {-0.0f, 0x80, "-0 keeps its sign"},
      {0.0f, 0x00, "+0"},
      {fbits(0x7fc00000u), 0x7f, "NaN -> 0x7F"},
      {fbits(0xffc00001u), 0x7f, "negative NaN -> 0x7F (sign dropped)"},
      {0x1p-10f, 0x01, "2^-9: the smallest subnormal"},
      {0x1p-11f, 0x00, "2^-10: tie of 0 and 2^-9 -> even 0"},
      {0x3p-11f, 0x02, "3·2^-10 = 1.5·2^-9: tie of 1 and 2 (·2^-9) -> even 2"},
      {-0x7p-10f, 0x87, "-7·2^-9: the largest subnormal, negative"},
      {0x1p-7f, 0x08, "2^-6: the smallest normal (e = 1, m = 0)"},
  };
  const int n = int(sizeof cases / sizeof cases[0]);
  for (int i = 0; i < n; ++i) v[i] = cases[i].value;
  uint8_t out[128];
  std::memset(out, 0xcc, sizeof out);
  g::fp8_head(v, true, 2.0f, out);
  for (int i = 0; i < n; ++i) EXPECT_EQ(out[i], cases[i].want) << cases[i].why;
  for (int c = n; c < 128; ++c) EXPECT_EQ(out[c], 0x00) << c;
}

// The scale is applied as value · RN(1/scale), not value / scale (docs/contract.md §4.3,
// the rule of q_fp8_out). k_scale = 7: RN(1/7) = 0x3E124925 = 0.142857149...;
// 10.9375 / 7 = 1.5625 exactly, a tie of 1.5 (m 4, even) and 1.625 (m 5), so a
// division would store 0x3C; 10.9375 · RN(1/7) = 1.56250007 rounds to the f32
// 1.5625001192 (0x3FC80001), above the tie: 1.625 = 0x3D.
TEST(FlatEncoders, Fp8ScaleIsMultiplyByRoundedReciprocal) {
  const float sf = 1.0f / 7.0f;  // IEEE f32 division: RN
  ASSERT_EQ(bits(sf), 0x3e124925u);
  ASSERT_EQ(bits(10.9375f * sf), 0x3fc80001u);
  float v[128] = {};
  v[0] = 10.9375f;
  v[1] = -10.9375f;
  uint8_t out[128];
  g::fp8_head(v, true, sf, out);
  EXPECT_EQ(out[0], 0x3d);
  EXPECT_EQ(out[1], 0xbd);
}

// index_k (unit scale): no multiply at all, whatever sf says.
TEST(FlatEncoders, Fp8UnitScaleHandWorkedBytes) {
  float v[128] = {};
  v[0] = 3.0f;                  // 1.5·2^1: e = 8, m = 4 -> 0x44 (a multiply by sf = 2 would give 0x4C)
  v[1] = 1.0625f;               // tie -> 1.0 = 0x38
  v[2] = -0.0f;                 // 0x80
  v[3] = fbits(0xffc00000u);    // NaN -> 0x7F
  v[4] = 500.0f;                // -> 448 = 0x7E
  v[5] = -0.001953125f;         // -2^-9 -> 0x81
  uint8_t out[128];
  std::memset(out, 0xcc, sizeof out);
  g::fp8_head(v, false, 2.0f, out);
  const uint8_t want[6] = {0x44, 0x38, 0x80, 0x7f, 0x7e, 0x81};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(out[i], want[i]) << i;
}

TEST(FlatEncoders, Bf16HandWorkedBits) {
  float v[128] = {};
  struct Case {
    uint32_t in;
    uint16_t want;
    const char* why;
  } cases[] = {
      {0x3f800000u, 0x3f80, "1.0"},
      {0x3f808000u, 0x3f80, "1 + 2^-8: tie of 0x3F80 and 0x3F81 -> even 0x3F80"},
      {0x3f818000u, 0x3f82, "1 + 3·2^-8: tie of 0x3F81 and 0x3F82 -> even 0x3F82"},
      {0x3f808001u, 0x3f81, "just above the tie -> up"},
      {0xbf80ffffu, 0xbf81, "negative, below the next code by 1 f32 ulp -> -0x3F81"},
      {0x80000000u, 0x8000, "-0"},
      {0x7fc00000u, 0x7fff, "NaN -> canonical 0x7FFF"},
      {0xff800001u, 0x7fff, "negative sNaN -> 0x7FFF"},
      {0x7f7fffffu, 0x7f80, "FLT_MAX rounds to +inf"},
      {0x7f7f7fffu, 0x7f7f, "just below the overflow midpoint: the largest finite bf16"},
      {0xff800000u, 0xff80, "-inf"},
      {0x00018000u, 0x0002, "subnormal tie (0x0001 | 0x8000) -> even 0x0002"},
      {0x00008000u, 0x0000, "smallest tie -> +0"},
  };
  const int n = int(sizeof cases / sizeof cases[0]);
  for (int i = 0; i < n; ++i) v[i] = fbits(cases[i].in);
  uint16_t out[128];
  for (auto& o : out) o = 0xcccc;
  g::bf16_head(v, out);
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(out[i], cases[i].want) << cases[i].why;
    EXPECT_EQ(ref_bf16(v[i]), cases[i].want) << "test reference disagrees: " << cases[i].why;
  }
}

// ------------------------------------------------------------ end to end
struct Layout {
  const char* name;
  bool head_major;
  int64_t row_pad;
  bool interleaved;
  int64_t page_extra;  // added to the natural page stride
};

// The K/V element offset of docs/contract.md §4.3, typed here again.
int64_t spec_kv_offset(const Problem& p, int64_t slot, int h, int c) {
  const int64_t page = slot / p.block_size, t = slot % p.block_size;
  return page * p.kv_page_stride + t * p.kv_token_stride + h * p.kv_head_stride + c * p.kv_elem();
}
int64_t spec_index_offset(const Problem& p, int64_t slot, int c) {
  const int64_t page = slot / p.block_size, t = slot % p.block_size;
  return page * p.index_page_stride + t * 128 * p.index_elem() + c * p.index_elem();
}

// Writes the expected encoding of value v at buf[off..] (little-endian bf16).
void put_expected(std::vector<uint8_t>& buf, std::vector<uint8_t>& mark, int64_t off, int dtype, float v) {
  if (dtype == 1) {
    buf[size_t(off)] = ref_e4m3_encode(double(v));
    mark[size_t(off)] = 1;
  } else {
    const uint16_t h = ref_bf16(v);
    buf[size_t(off)] = uint8_t(h & 0xff);
    buf[size_t(off + 1)] = uint8_t(h >> 8);
    mark[size_t(off)] = mark[size_t(off + 1)] = 1;
  }
}

// Runs the golden model (fused epilogue on the golden accumulator, or insert
// on its bf16 rounding) and checks every byte of the flat caches.
void check_flat_problem(const ProblemConfig& cfg, bool via_insert) {
  const Problem p = m3qkv_test::make_problem(cfg);
  SCOPED_TRACE(p.cfg.describe() + (via_insert ? " [insert]" : " [epilogue]"));
  const int64_t n = p.n();
  std::vector<float> acc = g::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, n, p.k);
  std::vector<uint16_t> qkv;
  if (via_insert) {
    qkv = m3qkv_test::to_bf16(acc);
    for (size_t i = 0; i < acc.size(); ++i) acc[i] = fbits(uint32_t(qkv[i]) << 16);  // what insert reads
  }
  for (uint8_t poison : {uint8_t(0xa5), uint8_t(0x5a)}) {
    m3qkv_test::HostOutputs o = p.make_outputs(poison);
    if (via_insert)
      g::insert(p.host_insert_args(qkv.data(), o.ptrs()), &o.flags);
    else
      g::epilogue(p.host_args(o.ptrs()), acc.data(), &o.flags);
    EXPECT_EQ(o.flags, 0u);
    // Expected caches: poison, then the encoded tokens.
    std::vector<uint8_t> kv(o.kv_cache.size(), poison), vv(o.v_cache.size(), poison), ix(o.index_cache.size(), poison);
    std::vector<uint8_t> kvm(kv.size(), 0), vm(vv.size(), 0), ixm(ix.size(), 0);
    const float ksf = 1.0f / p.cfg.k_scale, vsf = 1.0f / p.cfg.v_scale;  // f32 division: RN
    float y[128];
    for (int64_t t = 0; t < p.m; ++t) {
      const uint16_t* cs = p.cos_sin_cache.data() + p.positions[size_t(t)] * 64;
      const int64_t slot = p.slot_mapping[size_t(t)];
      if (slot >= 0 && p.kv_flat()) {
        for (int h = 0; h < p.nkv; ++h) {
          g::head_rms_rope(&acc[size_t(t * n + (p.nq + h) * 128)], p.k_norm_weight.data(), p.cfg.eps, cs, y);
          const float* x = &acc[size_t(t * n + (p.nq + p.nkv + h) * 128)];
          for (int c = 0; c < 128; ++c) {
            const float kval = p.kv_dtype == 1 ? y[c] * ksf : y[c];
            const float vval = p.kv_dtype == 1 ? x[c] * vsf : x[c];
            const int64_t off = spec_kv_offset(p, slot, h, c);
            put_expected(kv, kvm, off, p.kv_dtype, kval);
            if (p.v_in_kv >= 0)
              put_expected(kv, kvm, p.v_in_kv + off, p.kv_dtype, vval);
            else
              put_expected(vv, vm, off, p.kv_dtype, vval);
          }
        }
      }
      const int64_t islot = p.nik ? p.index_slot_mapping[size_t(t)] : -1;
      if (islot >= 0 && p.index_flat()) {
        g::head_rms_rope(&acc[size_t(t * n + (p.nq + 2 * p.nkv + p.niq) * 128)], p.index_k_norm_weight.data(),
                         p.cfg.eps, cs, y);
        for (int c = 0; c < 128; ++c) put_expected(ix, ixm, spec_index_offset(p, islot, c), p.index_dtype, y[c]);
      }
    }
    auto check = [&](const char* name, const std::vector<uint8_t>& want, const std::vector<uint8_t>& mark,
                     const std::vector<uint8_t>& got) {
      ASSERT_EQ(want.size(), got.size()) << name;
      int64_t bad = 0, first = -1, written = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        written += mark[i];
        if (want[i] != got[i] && bad++ == 0) first = int64_t(i);
      }
      EXPECT_EQ(bad, 0) << name << ": " << bad << " bytes differ, first " << first << " (expected "
                        << (first >= 0 ? int(want[size_t(first)]) : 0) << ", got "
                        << (first >= 0 ? int(got[size_t(first)]) : 0) << ", "
                        << (first >= 0 && mark[size_t(first)] ? "an element byte" : "must stay poison") << ")";
      EXPECT_GT(written, 0) << name << ": the test wrote no expected element";
    };
    if (p.kv_flat()) {
      check("kv_cache", kv, kvm, o.kv_cache);
      if (p.v_in_kv < 0) check("v_cache", vv, vm, o.v_cache);
    }
    if (p.nik && p.index_flat()) check("index_cache", ix, ixm, o.index_cache);
  }
}

ProblemConfig flat_config(int kv_dtype, int index_dtype, const Layout& l) {
  ProblemConfig cfg;
  cfg.m = 37;
  cfg.k = 256;
  cfg.nq = 4;
  cfg.nkv = 2;
  cfg.niq = 2;
  cfg.nik = 1;
  cfg.block_size = 8;
  cfg.k_scale = 7.0f;  // RN(1/7) is inexact: value · RN(1/scale) is what is checked
  cfg.v_scale = 0.375f;
  cfg.slot_skip_fraction = 0.2;
  cfg.kv_dtype = kv_dtype;
  cfg.index_dtype = index_dtype;
  cfg.kv_head_major = l.head_major;
  cfg.kv_row_pad = l.row_pad;
  cfg.kv_interleaved = l.interleaved;
  if (kv_dtype != 0 && l.page_extra) {
    const int64_t e = kv_dtype == 2 ? 2 : 1;
    const int64_t half = (128 * e + l.row_pad) * cfg.nkv * cfg.block_size;
    cfg.kv_page_stride = (l.interleaved ? 2 : 1) * half + l.page_extra;
  }
  return cfg;
}

const Layout kLayouts[] = {
    {"token_major_separate", false, 0, false, 0},
    {"token_major_interleaved_rowpad32", false, 32, true, 0},
    {"head_major_separate_rowpad16_page4096", true, 16, false, 4096},
    {"token_major_interleaved_tight_pages", false, 0, true, 0},
};

TEST(GoldenFlatCaches, EveryFormatAndLayoutByteExact) {
  for (int kv : {1, 2})
    for (int ix : {1, 2})
      for (const Layout& l : kLayouts) {
        SCOPED_TRACE(l.name);
        ProblemConfig cfg = flat_config(kv, ix, l);
        if (std::string(l.name) == "token_major_interleaved_tight_pages")
          cfg.kv_page_stride = 2 * (128 * (kv == 2 ? 2 : 1)) * cfg.nkv * cfg.block_size;  // no padding at all
        check_flat_problem(cfg, false);
      }
}

TEST(GoldenFlatCaches, InsertEveryFormat) {
  for (int kv : {1, 2})
    for (int ix : {1, 2}) check_flat_problem(flat_config(kv, ix, kLayouts[1]), true);
}

// Mixed formats: an NVFP4 KV cache next to a flat index cache (and the other
// way round) writes the same NVFP4 bytes as the all-NVFP4 run.
TEST(GoldenFlatCaches, MixedWithNvfp4) {
  for (int ix : {1, 2}) check_flat_problem(flat_config(0, ix, kLayouts[0]), false);
  for (int kv : {1, 2}) {
    ProblemConfig cfg = flat_config(kv, 0, kLayouts[2]);
    check_flat_problem(cfg, false);
    // The NVFP4 index cache equals the one of the all-NVFP4 problem (same seed).
    ProblemConfig base = cfg;
    base.kv_dtype = 0;
    base.kv_page_stride = 0;
    const Problem a = m3qkv_test::make_problem(cfg), b = m3qkv_test::make_problem(base);
    const auto oa = m3qkv_test::golden_outputs(a, 0x11), ob = m3qkv_test::golden_outputs(b, 0x11);
    EXPECT_TRUE(oa.index_cache == ob.index_cache);
    EXPECT_TRUE(oa.q_out == ob.q_out);
  }
  ProblemConfig cfg = flat_config(1, 1, kLayouts[0]);
  ProblemConfig base = cfg;
  base.kv_dtype = base.index_dtype = 0;
  const Problem a = m3qkv_test::make_problem(cfg), b = m3qkv_test::make_problem(base);
  const auto oa = m3qkv_test::golden_outputs(a, 0x11), ob = m3qkv_test::golden_outputs(b, 0x11);
  EXPECT_TRUE(oa.q_fp8_out == ob.q_fp8_out);
  EXPECT_TRUE(oa.index_q_out == ob.index_q_out);
}

// Slot guards with flat caches: slot < 0 and slots past the cache write nothing
// (the past-the-cache ones flag); the decoders read back what was written.
TEST(GoldenFlatCaches, GuardsAndDecoders) {
  ProblemConfig cfg = flat_config(2, 1, kLayouts[1]);
  cfg.out_of_range_slots = true;
  const Problem p = m3qkv_test::make_problem(cfg);
  Problem fixed = p;
  for (auto& s : fixed.slot_mapping)
    if (s >= p.kv_capacity()) s = -1;
  for (auto& s : fixed.index_slot_mapping)
    if (s >= p.index_capacity()) s = -1;
  const auto a = m3qkv_test::golden_outputs(p, 0x3c), b = m3qkv_test::golden_outputs(fixed, 0x3c);
  EXPECT_EQ(a.flags, M3QKV_FLAG_SLOT_OUT_OF_RANGE | M3QKV_FLAG_INDEX_SLOT_OUT_OF_RANGE);
  EXPECT_EQ(b.flags, 0u);
  EXPECT_TRUE(a.kv_cache == b.kv_cache);
  EXPECT_TRUE(a.index_cache == b.index_cache);
  // Decode the first written token back: bf16 K equals bf16_rn(y) (decoded exactly).
  const auto acc = g::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
  for (int64_t t = 0; t < p.m; ++t) {
    const int64_t slot = fixed.slot_mapping[size_t(t)];
    if (slot < 0) continue;
    float y[128], dec[128], vdec[128];
    const uint16_t* cs = p.cos_sin_cache.data() + p.positions[size_t(t)] * 64;
    g::head_rms_rope(&acc[size_t(t * p.n() + p.nq * 128)], p.k_norm_weight.data(), p.cfg.eps, cs, y);
    g::decode_flat_kv_token(a.kv_cache.data(), 2, p.kv_page_stride, p.kv_token_stride, p.kv_head_stride,
                            p.block_size, 0, slot, dec);
    g::decode_flat_kv_token(a.kv_cache.data() + p.v_in_kv, 2, p.kv_page_stride, p.kv_token_stride,
                            p.kv_head_stride, p.block_size, 0, slot, vdec);
    for (int c = 0; c < 128; ++c) {
      EXPECT_EQ(bits(dec[c]), uint32_t(ref_bf16(y[c])) << 16) << c;
      EXPECT_EQ(bits(vdec[c]), uint32_t(ref_bf16(acc[size_t(t * p.n() + (p.nq + p.nkv) * 128 + c)])) << 16) << c;
    }
    break;
  }
}

}  // namespace
