// CPU checks of the split-K decode plan (src/common/splitk_plan.h) with the
// SM90 decode kernel's target (src/sm90/decode_plan.h) and of its K
// permutation (src/sm90/decode_config.h), with expectations
// computed here independently: the round-robin deal of units is enumerated,
// the A-fragment layout is the PTX ISA's ("Register fragments: wgmma
// .m64nNk16", matrix A: element e of lane l at row l/4 + 8·((e/2)%2), column
// 8·(e/4) + 2·(l%4) + e%2 of each k16 slice).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "sm90/decode_config.h"
#include "sm90/decode_plan.h"

namespace {

using m3qkv::splitk::Plan;
using m3qkv::sm90::kDecodeMaxM;
using m3qkv::sm90::plan_decode;
namespace dec = m3qkv::sm90::decode;

struct Layout {
  const char* name;
  int heads;
};
// nq + 2nkv + niq + nik of the serving layouts: TP1 77, TP2 39, TP4 20, TP8 12, dense (16, 2, 0, 0) 20.
const Layout kLayouts[] = {{"TP1", 77}, {"TP2", 39}, {"TP4", 20}, {"TP8", 12}, {"Dense", 20}};

// The K stages the busiest CTA walks, by enumerating the deal: CTA b takes
// units b, b + grid, ...; unit u has split s = u % S, stages [ks·s/S, ks·(s+1)/S).
int makespan(const Plan& p, int ks) {
  int worst = 0;
  for (int b = 0; b < p.grid; ++b) {
    int total = 0;
    for (int64_t u = b; u < p.units; u += p.grid) {
      const int s = static_cast<int>(u % p.split);
      total += static_cast<int>(int64_t(ks) * (s + 1) / p.split - int64_t(ks) * s / p.split);
    }
    worst = std::max(worst, total);
  }
  return worst;
}

TEST(DecodePlan, CoversEveryTokenAndEveryKStageOncePerHead) {
  for (const Layout& l : kLayouts)
    for (int64_t m : {1, 2, 7, 16, 17, 33, 64, 65, 128, 129, 200, 256})
      for (int ks : {1, 2, 4, 16, 48}) {
        SCOPED_TRACE(std::string(l.name) + " M " + std::to_string(m) + " ks " + std::to_string(ks));
        const Plan p = plan_decode(m, l.heads, ks, 132);
        ASSERT_GT(p.nt, 0);
        EXPECT_TRUE(p.nt == 16 || p.nt == 32 || p.nt == 64 || p.nt == 128);
        EXPECT_GE(int64_t(p.nt) * p.token_blocks, m);
        EXPECT_LT(int64_t(p.nt) * (p.token_blocks - 1), m) << "an empty token block";
        if (m > 16) EXPECT_LT(p.nt / 2, m > 128 ? 129 : m) << "a smaller block would hold M";
        ASSERT_GE(p.split, 1);
        ASSERT_LE(p.split, ks);
        EXPECT_EQ(p.units, int64_t(l.heads) * p.token_blocks * p.split);
        EXPECT_EQ(p.grid, std::min<int64_t>(p.units, 132));
        // Every (head, token block) gets S units whose stage ranges tile [0, ks).
        dec::Params kp{};
        kp.heads = l.heads;
        kp.k_stages = ks;
        kp.token_blocks = p.token_blocks;
        kp.split = p.split;
        std::vector<int> seen(size_t(l.heads) * p.token_blocks * ks, 0);
        for (int u = 0; u < p.units; ++u) {
          const m3qkv::splitk::Unit w = dec::unit_of(kp, u);
          ASSERT_LT(w.k0, w.k1) << "empty unit " << u;
          ASSERT_EQ(u - w.s, ((w.head * p.token_blocks) + w.tb) * p.split) << "units of a head are consecutive";
          for (int k = w.k0; k < w.k1; ++k) ++seen[(size_t(w.head) * p.token_blocks + w.tb) * ks + k];
        }
        for (int v : seen) ASSERT_EQ(v, 1);
        EXPECT_EQ(p.counter_bytes % 256, 0);
        EXPECT_GE(p.counter_bytes, int64_t(l.heads) * p.token_blocks * 4);
        EXPECT_EQ(p.workspace_bytes, p.counter_bytes + p.units * p.nt * 128 * 4);
      }
}

// The point of the kernel: at decode sizes the busiest SM walks not much more
// than its share of the weight stages (1 unit of work = 128 rows x 128 K).
TEST(DecodePlan, BusiestSmNearItsShareOfTheWeights) {
  for (const Layout& l : kLayouts)
    for (int64_t m : {1, 16, 64}) {
      const int ks = 48;  // K = 6144
      const Plan p = plan_decode(m, l.heads, ks, 132);
      const double share = double(l.heads) * ks / 132.0;
      const int span = makespan(p, ks);
      RecordProperty(std::string(l.name) + "_M" + std::to_string(m) + "_split", p.split);
      // M = 64: the last arriver reads S partials of 32 KiB: the plan may trade a little balance for fewer splits.
      EXPECT_LE(span, (m == 64 ? 1.4 : 1.16) * share + 1.0) << l.name << " M " << m << ": split " << p.split << ", grid " << p.grid
                                          << ", busiest CTA " << span << " stages, share " << share;
    }
  // Worked: TP4 (20 heads), K = 6144: split 6 -> 120 CTAs of 8 stages.
  const Plan tp4 = plan_decode(1, 20, 48, 132);
  EXPECT_EQ(tp4.split, 6);
  EXPECT_EQ(tp4.grid, 120);
  EXPECT_EQ(makespan(tp4, 48), 8);
  // TP8 (12 heads): split 10 or 11 -> 120 or 132 CTAs of at most 5 stages.
  const Plan tp8 = plan_decode(1, 12, 48, 132);
  EXPECT_GE(tp8.grid, 120);
  EXPECT_EQ(makespan(tp8, 48), 5);
}

TEST(DecodePlan, OverridesAndLimits) {
  // Forced split, clamped to [1, min(ks, kDecodeMaxSplit)].
  EXPECT_EQ(plan_decode(1, 20, 48, 132, 2).split, 2);
  EXPECT_EQ(plan_decode(1, 20, 48, 132, 1).split, 1);
  EXPECT_EQ(plan_decode(1, 20, 4, 132, 9).split, 4);
  EXPECT_EQ(plan_decode(1, 20, 200, 132, 1000).split, m3qkv::sm90::kDecodeMaxSplit);
  // Grid cap: a persistent grid of 1 CTA walks every unit.
  const Plan one = plan_decode(64, 20, 48, 132, 3, 1);
  EXPECT_EQ(one.grid, 1);
  EXPECT_EQ(one.units, 60);
  EXPECT_EQ(makespan(one, 48), 20 * 48);
  // Token blocks: 16 / 32 / 64 / 128, two blocks of 128 above 128 tokens.
  EXPECT_EQ(plan_decode(16, 20, 48, 132).nt, 16);
  EXPECT_EQ(plan_decode(17, 20, 48, 132).nt, 32);
  EXPECT_EQ(plan_decode(64, 20, 48, 132).nt, 64);
  EXPECT_EQ(plan_decode(65, 20, 48, 132).nt, 128);
  EXPECT_EQ(plan_decode(129, 20, 48, 132).token_blocks, 2);
  EXPECT_EQ(plan_decode(kDecodeMaxM, 20, 48, 132).token_blocks, 2);
  // Outside the decode range: no plan.
  EXPECT_EQ(plan_decode(kDecodeMaxM + 1, 20, 48, 132).nt, 0);
  EXPECT_EQ(plan_decode(0, 20, 48, 132).nt, 0);
  EXPECT_EQ(plan_decode(1, 20, 48, 0).nt, 0);
}

// The K permutation: the A fragment element e of lane q in k16 slice s sits
// at logical column 16s + 8·(e/4) + 2q + e%2 (PTX layout); the byte the kernel
// feeds there must be the byte whose B column is the same (decode_logical_col),
// and the mapping is a bijection of the 64 bytes of a step.
TEST(DecodePermutation, AFragmentAndBTileAgreeAndCoverTheStep) {
  std::set<int> cols;
  for (int p = 0; p < 64; ++p) cols.insert(dec::decode_logical_col(p));
  ASSERT_EQ(cols.size(), 64u);
  EXPECT_EQ(*cols.begin(), 0);
  EXPECT_EQ(*cols.rbegin(), 63);
  for (int q = 0; q < 4; ++q)
    for (int s = 0; s < 4; ++s)
      for (int e = 0; e < 8; ++e) {
        const int ptx_col = 16 * s + 8 * (e / 4) + 2 * q + e % 2;
        const int byte = dec::decode_a_byte(q, s, e);
        EXPECT_GE(byte, 16 * q);
        EXPECT_LT(byte, 16 * q + 16) << "lane q only loads bytes [16q, 16q + 16)";
        EXPECT_EQ(dec::decode_logical_col(byte), ptx_col) << "q " << q << " s " << s << " e " << e;
      }
  // Worked: byte 16q + 4s + {0,1} -> the pair (2q, 2q+1) of slice s, 16q + 4s + {2,3} -> (2q+8, 2q+9).
  EXPECT_EQ(dec::decode_logical_col(16 * 3 + 4 * 2 + 0), 16 * 2 + 6);
  EXPECT_EQ(dec::decode_logical_col(16 * 3 + 4 * 2 + 3), 16 * 2 + 8 + 6 + 1);
}

}  // namespace
