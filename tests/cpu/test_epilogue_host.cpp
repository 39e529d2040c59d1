// The GPU epilogue code of src/common/epilogue.cuh (epi::epilogue_head_row,
// the function the portable fused kernel, the SM90 staged epilogue and the
// SM100 kernel run) compiled for the host (its software encoders, g++,
// -ffp-contract=off) and run over every (row, head) of a problem: it must write
// the same bytes as the golden model in every cache format and layout. A CPU
// check of the kernels' addressing and format dispatch before any GPU run; the
// GPU suite checks the device builds (tests/gpu/test_cache_formats.cu).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "common/epilogue.cuh"
#include "common/problem.h"
#include "golden/golden.h"

namespace {

using m3qkv_test::Problem;
using m3qkv_test::ProblemConfig;

void run_host_epilogue(const Problem& p, const std::vector<float>& acc, m3qkv_test::HostOutputs* o) {
  const m3qkv_fused_args a = p.host_args(o->ptrs());
  const m3qkv::epi::EpilogueParams e = m3qkv::epi::make_epilogue_params(a);
  const int heads = m3qkv::total_heads(p.nq, p.nkv, p.niq, p.nik);
  float x[128];
  // Blocks of 64 rows with their slot-owner table (both slot words), as a
  // kernel's tile has (the table's host form: one thread, no barrier).
  constexpr int kBlock = 64;
  static m3qkv::epi::SlotOwnerTable<2 * kBlock> owners;
  const uint32_t maps = m3qkv::epi::kSlotMapKv | (p.nik > 0 ? m3qkv::epi::kSlotMapIndex : 0u);
  for (int64_t m0 = 0; m0 < p.m; m0 += kBlock) {
    m3qkv::epi::build_slot_owners(owners, e.slot_mapping, e.index_slot_mapping, maps, p.m, m0, kBlock, 0, 1, [] {});
    for (int64_t m = m0; m < std::min<int64_t>(m0 + kBlock, p.m); ++m)
      for (int h = 0; h < heads; ++h) {
        std::memcpy(x, &acc[size_t(m * p.n() + h * 128)], sizeof x);
        m3qkv::epi::epilogue_head_row(e, owners.view(), m, h, x);
      }
  }
}

struct HostCase {
  const char* name;
  int kv, ix;
  bool head_major, interleaved;
  int64_t row_pad;
  int nkv;
};

TEST(HostEpilogue, MatchesGoldenInEveryCacheFormat) {
  const HostCase cases[] = {
      {"nvfp4_nvfp4", 0, 0, false, false, 0, 2},         {"fp8_fp8_separate", 1, 1, false, false, 0, 2},
      {"bf16_bf16_interleaved", 2, 2, false, true, 0, 2}, {"fp8_bf16_headmajor_pad16", 1, 2, true, false, 16, 2},
      {"bf16_fp8_interleaved_pad32", 2, 1, false, true, 32, 1}, {"nvfp4_fp8", 0, 1, false, false, 0, 1},
      {"fp8_nvfp4", 1, 0, true, true, 48, 4},
  };
  for (const HostCase& c : cases) {
    SCOPED_TRACE(c.name);
    ProblemConfig cfg;
    cfg.m = 21;
    cfg.k = 128;
    cfg.nq = 2 * c.nkv;
    cfg.nkv = c.nkv;
    cfg.niq = c.nkv;
    cfg.nik = 1;
    cfg.block_size = 8;
    cfg.k_scale = 7.0f;
    cfg.v_scale = 0.375f;
    cfg.kv_dtype = c.kv;
    cfg.index_dtype = c.ix;
    cfg.kv_head_major = c.head_major;
    cfg.kv_interleaved = c.interleaved;
    cfg.kv_row_pad = c.row_pad;
    cfg.out_of_range_slots = true;
    cfg.out_of_range_positions = true;
    const Problem p = m3qkv_test::make_problem(cfg);
    const std::vector<float> acc =
        m3qkv::golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
    const m3qkv_test::HostOutputs want = m3qkv_test::golden_outputs(p, 0x6b, acc.data());
    m3qkv_test::HostOutputs got = p.make_outputs(0x6b);
    run_host_epilogue(p, acc, &got);
    EXPECT_EQ(m3qkv_test::compare_outputs(p, want, got), "") << p.cfg.describe();
    EXPECT_NE(want.flags, 0u);  // the guards fired (and compare_outputs compared the flags)
  }
}

}  // namespace
