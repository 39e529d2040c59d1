// FP8 / BF16 KV and index caches (docs/contract.md §4.3) on the GPU, bit-exact
// against the golden model, poisoned outputs with both salts (every byte that
// must be written is, nothing else changes: skipped and past-the-cache slots,
// other pages, page padding, the gaps between padded rows, the other half of an
// interleaved K/V page).
//
//  - GpuCacheFormats.Fused: exact data (acc exact on any hardware), each KV
//    format × each index format × TP1 / TP4 / TP8 / dense, with block size
//    (16, 128) and the KV layout rotating (token-major two tensors with padded
//    pages; one interleaved [nb, 2, bs, nkv, 128] allocation; head-major with
//    16-B padded rows; interleaved with 32-B padded rows and padded pages), for
//    the portable kernel and, on CC 9.0, the SM90 kernel through
//    m3qkv_testing_fused_qkv and through sm90_fused_variant with the staged and
//    the register epilogue (split-K too), and the decode kernel (M <= 256,
//    sm90_fused_decode, split 1 and 2; the automatic SM90 route takes it too at
//    these M). K = 256: the format is under test.
//  - GpuCacheFormats.Insert: the same cases through m3qkv_qknorm_rope_kv_insert,
//    in each of its lane layouts (quad, warp, 8-lane rows, split c32q8, c16q8,
//    c16q8 + guess) forced on a random bf16 projection (zero row, saturating
//    row, all-zero V head).
//  - SharedSlots/GpuCacheFormats.{Fused, Insert}: the same on calls where half
//    the tokens share slots (docs/contract.md §4.4), NVFP4 included.
//  - GpuCacheFormatsServing: the M3 serving shape (TP4, K = 6144, block 128)
//    for FP8 and BF16 caches, fused and insert, through the public entry points.
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "api/internal.h"
#include "api/validate.h"
#include "common/problem.h"
#include "common/test_util.h"
#include "golden/golden.h"
#include "gpu/gpu_util.h"
#include "gpu/backend_support.h"
#include "gpu/harness.h"
#include "sm90/sm90.h"

namespace {

using namespace m3qkv_gpu;
using m3qkv_test::make_problem;

// variant >= 0: the tile kernel (sm90_fused_variant); variant < 0: the decode kernel with `split`.
m3qkv_status sm90_call(const m3qkv_fused_args& a, const m3qkv::DeviceInfo& dev, cudaStream_t s, int variant,
                       int block_m, int split) {
  return variant < 0 ? sm90_decode_call(a, dev, nullptr, s, split)
                     : sm90_variant_call(a, dev, nullptr, s, variant, block_m, split);
}

struct KvLayout {
  const char* name;
  bool head_major;
  int64_t row_pad;
  bool interleaved;
  int64_t page_pad;  // bytes added to the natural page (-1: the builder's +64)
};
const KvLayout kLayouts[] = {
    {"TokMajorSep", false, 0, false, -1},
    {"TokMajorInterleaved", false, 0, true, 0},
    {"HeadMajorRowPad16", true, 16, false, 4096},
    {"InterleavedRowPad32", false, 32, true, 512},
};

struct FmtCase {
  Heads heads;
  int kv, ix;
  int block_size;
  int layout;
  bool oor;
  int64_t m, k;
  double shared = 0.0;  // ProblemConfig::shared_slot_fraction
};
std::string fmt_case_name(const FmtCase& c) {
  std::string s = std::string(c.heads.name) + "_kv" + fmt_name(c.kv) + "_ix" + fmt_name(c.ix) + "_B" +
                  std::to_string(c.block_size) + "_M" + std::to_string(c.m) + "_K" + std::to_string(c.k);
  if (c.kv != 0) s += std::string("_") + kLayouts[c.layout].name;
  if (c.oor) s += "_OutOfRange";
  if (c.shared > 0.0) s += "_SharedSlots";
  return s;
}
void PrintTo(const FmtCase& c, std::ostream* os) { *os << fmt_case_name(c); }

ProblemConfig fmt_config(const FmtCase& c, bool exact) {
  ProblemConfig cfg;
  cfg.m = c.m;
  cfg.k = c.k;
  cfg.nq = c.heads.nq;
  cfg.nkv = c.heads.nkv;
  cfg.niq = c.heads.niq;
  cfg.nik = c.heads.nik;
  cfg.block_size = c.block_size;
  cfg.exact_data = exact;
  cfg.kv_dtype = c.kv;
  cfg.index_dtype = c.ix;
  cfg.k_scale = 7.0f;  // RN(1/7) inexact: value · RN(1/scale) is checked, not value / scale
  cfg.v_scale = 0.375f;
  const KvLayout& l = kLayouts[c.layout];
  cfg.kv_head_major = l.head_major;
  cfg.kv_row_pad = l.row_pad;
  cfg.kv_interleaved = l.interleaved;
  if (c.kv != 0 && l.page_pad >= 0) {
    const int64_t half = (128 * (c.kv == 2 ? 2 : 1) + l.row_pad) * c.heads.nkv * c.block_size;
    cfg.kv_page_stride = (l.interleaved ? 2 : 1) * half + l.page_pad;
  }
  cfg.slot_skip_fraction = c.oor ? 0.25 : 0.125;
  cfg.out_of_range_slots = c.oor;
  cfg.out_of_range_positions = c.oor;
  cfg.shared_slot_fraction = c.shared;
  return cfg;
}

std::vector<FmtCase> fmt_cases() {
  std::vector<FmtCase> v;
  const Heads hs[] = {kTP1, kTP4, kTP8, kDense};
  int i = 0;
  for (int kv : {0, 1, 2})
    for (int ix : {0, 1, 2})
      for (const Heads& h : hs) {
        if (h.nik == 0 && ix != 0) continue;    // dense: no index cache
        if (kv == 0 && ix == 0) continue;       // all-NVFP4: the existing suites
        const int64_t m = h.nkv == 4 ? 37 : 129;  // TP1: 77 heads, a smaller M keeps the golden GEMM short
        v.push_back({h, kv, ix, (i % 2) ? 128 : 16, (i / 2) % 4, i % 5 == 2, m, 256});
        ++i;
      }
  return v;
}

// Every way of running the fused op on this device for the cache tests.
struct FusedWay {
  std::string name;
  m3qkv_backend_kind backend;  // forced through m3qkv_testing_fused_qkv ...
  int sm90_variant = -2;       // ... or, >= 0, sm90_fused_variant with these; -1: sm90_fused_decode
  int sm90_block_m = 0;
  int sm90_split = 0;
};
std::vector<FusedWay> fused_ways() {
  std::vector<FusedWay> w;
  for (m3qkv_backend_kind b : fused_backends()) w.push_back({"forced " + backend_label(b), b});
  if (kBuiltSm90 && device_cc() == 90) {
    w.push_back({"sm90 A", M3QKV_BACKEND_SM90, m3qkv::kSm90Bf16Dequant, 0, 1});
    w.push_back({"sm90 A split-K 2", M3QKV_BACKEND_SM90, m3qkv::kSm90Bf16Dequant, 64, 2});
    w.push_back({"sm90 A pre-A", M3QKV_BACKEND_SM90, m3qkv::kSm90Bf16DequantPreA, 128, 1});
    w.push_back({"sm90 prefill", M3QKV_BACKEND_SM90, m3qkv::kSm90Bf16Prefill, 128, 1});
    w.push_back({"sm90 decode split 1", M3QKV_BACKEND_SM90, -1, 0, 1});
    w.push_back({"sm90 decode split 2", M3QKV_BACKEND_SM90, -1, 0, 2});
  }
  return w;
}

void run_way(const Problem& p, const DeviceInputs& in, const FusedWay& way, int salt, Fetched* out) {
  if (way.sm90_variant < -1) {
    FusedRun run;
    run.backend = way.backend;
    ASSERT_NO_FATAL_FAILURE(run_fused(p, in, run, salt, out));
    return;
  }
  DeviceOutputs d;
  CUDA_OK(d.init(p, salt));
  CUDA_OK(cudaDeviceSynchronize());  // the poison is in place before the non-blocking stream runs
  const m3qkv_fused_args a = p.args_with(in.mapper(), d.ptrs());
  bool noop = true;
  m3qkv_fused_args checked;
  M3QKV_OK(m3qkv::validate_fused(&a, &checked, &noop));
  m3qkv::DeviceInfo dev;
  M3QKV_OK(m3qkv::current_device_info(&dev));
  Stream s;
  CUDA_OK(s.error());
  M3QKV_OK(sm90_call(a, dev, s.get(), way.sm90_variant, way.sm90_block_m, way.sm90_split));
  CUDA_OK(cudaStreamSynchronize(s.get()));
  CUDA_OK(fetch_outputs(d, out));
}

void expect_flags(const Problem& p, bool oor, uint32_t flags) {
  if (oor) {
    EXPECT_NE(flags & M3QKV_FLAG_SLOT_OUT_OF_RANGE, 0u);
    if (p.nik) EXPECT_NE(flags & M3QKV_FLAG_INDEX_SLOT_OUT_OF_RANGE, 0u);
  } else {
    EXPECT_EQ(flags, 0u);
  }
}

class GpuCacheFormats : public ::testing::TestWithParam<FmtCase> {};

TEST_P(GpuCacheFormats, Fused) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  const FmtCase& c = GetParam();
  const Problem p = make_problem(fmt_config(c, /*exact=*/true));
  const std::vector<float> acc =
      m3qkv::golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  for (const FusedWay& way : fused_ways()) {
    for (int salt = 0; salt < 2; ++salt) {
      const std::string what = fmt_case_name(c) + " [" + way.name + "] salt " + std::to_string(salt);
      SCOPED_TRACE(what);
      Fetched got;
      ASSERT_NO_FATAL_FAILURE(run_way(p, in, way, salt, &got));
      HostOutputs want = poisoned_host_outputs(p, salt);
      golden_epilogue(p, acc.data(), &want);
      expect_same_outputs(p, want, got, what);
      expect_flags(p, c.oor, got.flags);
      if (HasFailure()) return;
    }
  }
}

// A random bf16 projection: rows ~N(0, 2^[-3,3]), a zero row, a row that
// saturates the fp8 outputs, an all-zero V head (token 3).
std::vector<uint16_t> random_qkv(const Problem& p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  const int64_t n = p.n();
  std::vector<float> v(size_t(p.m * n));
  for (int64_t r = 0; r < p.m; ++r) {
    double rs = std::exp2(ud(rng) * 6.0 - 3.0);
    if (r == 1) rs = 0.0;
    if (r == 2) rs = 3000.0;
    for (int64_t c = 0; c < n; ++c) v[size_t(r * n + c)] = float(nd(rng) * rs);
  }
  if (p.m > 3)
    for (int c = 0; c < 128; ++c) v[size_t(3 * n + int64_t(p.nq + p.nkv) * 128 + c)] = 0.0f;
  return m3qkv_test::to_bf16(v);
}

TEST_P(GpuCacheFormats, Insert) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  FmtCase c = GetParam();
  c.k = 128;  // the GEMM operands are not used
  const Problem p = make_problem(fmt_config(c, /*exact=*/false));
  const std::vector<uint16_t> qkv = random_qkv(p, p.cfg.seed ^ 0xCAC4EULL);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  M3QKV_ALLOC(dqkv, qkv.size() * 2);
  CUDA_OK(dqkv.upload(qkv));
  for (int run = 0; run < 2 * kInsertLayoutCount; ++run) {
    const int layout = kInsertLayouts[run / 2], salt = run % 2;
    InsertLayoutScope forced(layout);
    const std::string what =
        fmt_case_name(c) + " [insert, " + insert_layout_name(layout) + "] salt " + std::to_string(salt);
    SCOPED_TRACE(what);
    DeviceOutputs d;
    CUDA_OK(d.init(p, salt));
    m3qkv_insert_args a = p.insert_args_with(in.mapper(), dqkv.get(), d.ptrs());
    a.use_pdl = salt;
    a.grid = salt ? 3 : 0;  // a small grid: every warp walks many (row group, head) items
    M3QKV_OK(m3qkv_qknorm_rope_kv_insert(&a, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    Fetched got;
    CUDA_OK(fetch_outputs(d, &got));
    HostOutputs want = poisoned_host_outputs(p, salt);
    golden_insert(p, qkv.data(), &want);
    expect_same_outputs(p, want, got, what);
    expect_flags(p, c.oor, got.flags);
    if (HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, GpuCacheFormats, ::testing::ValuesIn(fmt_cases()),
                         [](const ::testing::TestParamInfo<FmtCase>& i) { return fmt_case_name(i.param); });

// Slot collisions (docs/contract.md §4.4): half the tokens share another
// token's slot and index slot (some a few hot tokens'), so blocks, tiles,
// warps and CTAs race for rows; every format, bit-exact with the golden
// model, which writes the last sharer's row whole. M = 7 (one tile), 300
// (many tiles, decode and split-K paths), 1100 (prefill-sized, many blocks),
// 2100 (the insert's whole-call owner passes).
std::vector<FmtCase> shared_cases() {
  std::vector<FmtCase> v;
  int i = 0;
  for (int kv : {0, 1, 2})
    for (int ix : {0, 1, 2})
      for (int64_t m : {7, 300}) {
        FmtCase c{kTP4, kv, ix, (i % 2) ? 128 : 16, (i / 2) % 4, i % 3 == 1, m, 256};
        c.shared = 0.5;
        v.push_back(c);
        ++i;
      }
  for (int f : {0, 1, 2}) {
    FmtCase c{kTP8, f, f, 16, f, f == 1, 1100, 256};
    c.shared = 0.5;
    v.push_back(c);
  }
  // From portable::kOwnerPassMinM rows the insert resolves ownership in whole-call passes first.
  for (int f : {0, 1, 2}) {
    FmtCase c{kTP8, f, 2 - f, 128, f, f == 2, 2100, 256};
    c.shared = 0.5;
    v.push_back(c);
  }
  return v;
}
INSTANTIATE_TEST_SUITE_P(SharedSlots, GpuCacheFormats, ::testing::ValuesIn(shared_cases()),
                         [](const ::testing::TestParamInfo<FmtCase>& i) { return fmt_case_name(i.param); });

// The serving shape through the public entry points (automatic backend).
TEST(GpuCacheFormatsServing, Tp4K6144Block128FusedAndInsert) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  for (int fmt : {1, 2}) {
    for (int64_t m : {1, 7, 200}) {
      const FmtCase c{kTP4, fmt, fmt, 128, fmt == 1 ? 0 : 1, false, m, 6144};
      const Problem p = make_problem(fmt_config(c, /*exact=*/true));
      const auto acc = m3qkv::golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
      DeviceInputs in;
      CUDA_OK(in.upload(p));
      FusedRun run;
      run.backend = M3QKV_BACKEND_NONE;  // m3qkv_fused_qkv
      run.use_pdl = 1;
      Fetched got;
      ASSERT_NO_FATAL_FAILURE(run_fused(p, in, run, 1, &got));
      HostOutputs want = poisoned_host_outputs(p, 1);
      golden_epilogue(p, acc.data(), &want);
      expect_same_outputs(p, want, got, "m3qkv_fused_qkv " + fmt_case_name(c));
      // insert on bf16(acc)
      const std::vector<uint16_t> qkv = m3qkv_test::to_bf16(acc);
      M3QKV_ALLOC(dqkv, qkv.size() * 2);
      CUDA_OK(dqkv.upload(qkv));
      DeviceOutputs d;
      CUDA_OK(d.init(p, 0));
      m3qkv_insert_args a = p.insert_args_with(in.mapper(), dqkv.get(), d.ptrs());
      M3QKV_OK(m3qkv_qknorm_rope_kv_insert(&a, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      Fetched goti;
      CUDA_OK(fetch_outputs(d, &goti));
      HostOutputs wanti = poisoned_host_outputs(p, 0);
      golden_insert(p, qkv.data(), &wanti);
      expect_same_outputs(p, wanti, goti, "m3qkv_qknorm_rope_kv_insert " + fmt_case_name(c));
      if (HasFailure()) return;
    }
  }
}

}  // namespace
