// CPU checks of the split-K decode plan (src/common/splitk_plan.h) for its two
// targets, the SM90 decode kernel (src/sm90/decode_plan.h) and the SM100
// decode variant (src/sm100/plan.h), of the SM90 swap-AB kernel's A-fragment K order and 128-B swizzle
// (src/sm90/decode_config.h) and of the SM100 token block's scale-factor
// column (src/sm100/decode_config.h), with expectations
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

#include "sm100/decode_config.h"
#include "sm100/plan.h"
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
    for (int64_t m : {1, 2, 7, 16, 17, 33, 64, 65, 128, 129, 200, 256, 300, 1024, 4097})
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
        EXPECT_EQ(p.partial_bytes, p.units * p.nt * 128 * 4);
        if (p.split > 1) EXPECT_LE(p.partial_bytes, m3qkv::sm90::kDecodeMaxPartialBytes);
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
  // Token blocks: 16 / 32 / 64 / 128, blocks of 128 above 128 tokens.
  EXPECT_EQ(plan_decode(16, 20, 48, 132).nt, 16);
  EXPECT_EQ(plan_decode(17, 20, 48, 132).nt, 32);
  EXPECT_EQ(plan_decode(64, 20, 48, 132).nt, 64);
  EXPECT_EQ(plan_decode(65, 20, 48, 132).nt, 128);
  EXPECT_EQ(plan_decode(129, 20, 48, 132).token_blocks, 2);
  EXPECT_EQ(plan_decode(4096, 20, 48, 132).token_blocks, 32);
  EXPECT_EQ(plan_decode(kDecodeMaxM, 20, 48, 132).token_blocks, (kDecodeMaxM + 127) / 128);
  // Outside the range: no plan.
  EXPECT_EQ(plan_decode(kDecodeMaxM + 1, 20, 48, 132).nt, 0);
  EXPECT_EQ(plan_decode(0, 20, 48, 132).nt, 0);
  EXPECT_EQ(plan_decode(1, 20, 48, 0).nt, 0);
}


// The cluster form (sm90::cluster_plan): the S units of a (head, token block)
// on the S consecutive CTAs of one cluster, so rank = blockIdx.x % S is the
// unit's split for every unit a CTA walks, and every (pair, split) is walked
// once. Cluster counts: those the H200 sweep's plans imply (the launcher asks
// the device), and an empty one.
using m3qkv::sm90::cluster_plan;
using m3qkv::sm90::DecodeReduce;
constexpr int kClusters[m3qkv::sm90::kDecodeMaxCluster + 1] = {0, 0, 66, 39, 30, 24, 20, 16, 15};
constexpr int kNoClusters[m3qkv::sm90::kDecodeMaxCluster + 1] = {};

Plan with_cluster(int64_t m, int heads, int ks, int split, int grid, DecodeReduce mode,
                  const int (&clusters)[m3qkv::sm90::kDecodeMaxCluster + 1] = kClusters) {
  return cluster_plan(plan_decode(m, heads, ks, 132, split, grid), m, heads, ks, 132, split, grid, clusters, mode);
}

TEST(DecodePlan, ClusterPlansKeepEachPairOnOneClusterAndFitTheDevice) {
  int clustered = 0;
  for (const Layout& l : kLayouts)
    for (int64_t m : {1, 7, 16, 33, 64, 129, 256, 300, 1024})
      for (int ks : {2, 4, 16, 48}) {
        SCOPED_TRACE(std::string(l.name) + " M " + std::to_string(m) + " ks " + std::to_string(ks));
        const Plan p = with_cluster(m, l.heads, ks, 0, 0, DecodeReduce::kAuto);
        const Plan l2 = plan_decode(m, l.heads, ks, 132);
        ASSERT_EQ(p.nt, l2.nt);
        ASSERT_EQ(p.token_blocks, l2.token_blocks);
        if (p.cluster == 0) {
          EXPECT_EQ(p.split, l2.split);
          EXPECT_EQ(p.grid, l2.grid);
          continue;
        }
        ++clustered;
        EXPECT_EQ(p.cluster, p.split);
        EXPECT_GE(p.split, 2);
        EXPECT_LE(p.split, std::min(ks, 8));
        EXPECT_EQ(p.grid % p.split, 0);
        EXPECT_LE(p.grid / p.split, kClusters[p.split]);
        EXPECT_LE(p.grid, 132);
        EXPECT_EQ(p.units, int64_t(l.heads) * p.token_blocks * p.split);
        EXPECT_EQ(p.max_unit_stages, (ks + p.split - 1) / p.split);
        EXPECT_EQ(p.counter_bytes, 0);
        EXPECT_EQ(p.partial_bytes, 0);
        EXPECT_FALSE(m3qkv::splitk::reduces_through_l2(p));
        // Several units per cluster only when each is long enough (decode_plan.h kClusterMinUnitStages).
        const int64_t rounds = (p.units / p.split + p.grid / p.split - 1) / (p.grid / p.split);
        if (rounds > 1) EXPECT_GE(p.max_unit_stages, m3qkv::sm90::kClusterMinUnitStages);
        std::vector<int> seen(static_cast<size_t>(p.units), 0);
        for (int b = 0; b < p.grid; ++b) {
          int walked = 0;
          for (int64_t u = b; u < p.units; u += p.grid) {
            EXPECT_EQ(u % p.split, b % p.split) << "unit " << u << " on CTA " << b;
            ++seen[static_cast<size_t>(u)];
            ++walked;
          }
          // The ranks of a cluster walk the same number of units (they meet at every one).
          int first = 0;
          for (int64_t u = b - b % p.split; u < p.units; u += p.grid) ++first;
          EXPECT_EQ(walked, first) << "CTA " << b;
        }
        EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), p.units);
      }
  EXPECT_GT(clustered, 0);
  // Worked, TP4 (20 heads), K = 6144. M = 1: the L2 plan (split 6 over 120
  // CTAs), whose tail at one token is cheaper than a cluster launch. M = 128:
  // 20 clusters of 6 (the same 8 stages each, 22 rows per rank) against one
  // CTA's 128 rows; asked for, spread over the L2 plan's 120 CTAs.
  const Plan tp4 = with_cluster(1, 20, 48, 0, 0, DecodeReduce::kAuto);
  EXPECT_EQ(tp4.cluster, 0);
  EXPECT_FALSE(tp4.spread);
  EXPECT_EQ(tp4.split, 6);
  const Plan tp4_128 = with_cluster(128, 20, 48, 0, 0, DecodeReduce::kAuto);
  EXPECT_EQ(tp4_128.cluster, 6);
  EXPECT_FALSE(tp4_128.spread);
  EXPECT_EQ(tp4_128.grid, 120);
  const Plan tp4_128s = with_cluster(128, 20, 48, 0, 0, DecodeReduce::kSpread);
  EXPECT_EQ(tp4_128s.cluster, 0);
  EXPECT_TRUE(tp4_128s.spread);
  EXPECT_EQ(tp4_128s.grid, 120);
  // M = 256: 40 pairs; clusters of 8 would walk 3 units of 6 stages each:
  // the L2 plan instead (split 3 over 120 CTAs).
  const Plan tp4_256 = with_cluster(256, 20, 48, 0, 0, DecodeReduce::kAuto);
  EXPECT_EQ(tp4_256.cluster, 0);
  EXPECT_EQ(tp4_256.split, 3);
  EXPECT_TRUE(tp4_256.spread);
  // TP1 (77 heads) at M = 1024: 616 pairs, no split at all.
  EXPECT_EQ(with_cluster(1024, 77, 48, 0, 0, DecodeReduce::kAuto).split, 1);
}

TEST(DecodePlan, ClusterPlanModesAndLimits) {
  // No co-resident cluster of any size, or the L2 mode: the L2 plan unchanged.
  const Plan l2 = plan_decode(1, 20, 48, 132);
  for (const Plan& p : {with_cluster(1, 20, 48, 0, 0, DecodeReduce::kAuto, kNoClusters),
                        with_cluster(1, 20, 48, 0, 0, DecodeReduce::kCluster, kNoClusters),
                        with_cluster(1, 20, 48, 0, 0, DecodeReduce::kL2)}) {
    EXPECT_EQ(p.cluster, 0);
    EXPECT_EQ(p.split, l2.split);
    EXPECT_EQ(p.grid, l2.grid);
    EXPECT_EQ(p.partial_bytes, l2.partial_bytes);
  }
  // A forced split keeps its size: 2 -> clusters of 2; above 8 or unsplit -> none.
  EXPECT_EQ(with_cluster(1, 20, 48, 2, 0, DecodeReduce::kCluster).cluster, 2);
  EXPECT_EQ(with_cluster(1, 20, 48, 2, 0, DecodeReduce::kCluster).grid, 40);
  EXPECT_EQ(with_cluster(1, 20, 48, 16, 0, DecodeReduce::kCluster).cluster, 0);
  EXPECT_EQ(with_cluster(1, 20, 48, 1, 0, DecodeReduce::kCluster).cluster, 0);
  // The unit-length floor is the model's preference, not a limit: forced, clusters walk
  // short units too (TP1 M = 7, K = 2048: 77 pairs on 30 clusters of 4, 4 stages each;
  // TP4 K = 2048 on 3 clusters of 2), where the automatic plan goes through L2.
  EXPECT_EQ(with_cluster(7, 77, 16, 4, 0, DecodeReduce::kCluster).cluster, 4);
  EXPECT_EQ(with_cluster(7, 77, 16, 4, 0, DecodeReduce::kAuto).cluster, 0);
  EXPECT_EQ(with_cluster(1, 20, 16, 2, 7, DecodeReduce::kCluster).cluster, 2);
  // The grid cap counts CTAs: 7 -> 3 clusters of 2 that walk every pair; 1 -> none.
  const Plan capped = with_cluster(64, 20, 48, 2, 7, DecodeReduce::kCluster);
  EXPECT_EQ(capped.cluster, 2);
  EXPECT_EQ(capped.grid, 6);
  EXPECT_EQ(with_cluster(64, 20, 48, 2, 1, DecodeReduce::kCluster).cluster, 0);
  // The device's count caps the clusters: 4 clusters of 3 at most.
  int few[m3qkv::sm90::kDecodeMaxCluster + 1] = {};
  few[3] = 4;
  const Plan f = with_cluster(1, 20, 48, 0, 0, DecodeReduce::kCluster, few);
  EXPECT_EQ(f.cluster, 3);
  EXPECT_EQ(f.grid, 12);
}

// The spread form (sm90::spread_fits): only over an L2 plan whose units all
// fit the grid at once (its units wait for each other), by default from
// blocks of 16 tokens unless a cluster form takes more splits, forced
// wherever it fits; the L2 plan's split, grid and workspace unchanged.
TEST(DecodePlan, SpreadPlansRunEveryUnitAtOnce) {
  int spread = 0;
  for (const Layout& l : kLayouts)
    for (int64_t m : {1, 7, 16, 33, 64, 129, 256, 300, 1024})
      for (int ks : {2, 4, 16, 48})
        for (DecodeReduce mode : {DecodeReduce::kAuto, DecodeReduce::kSpread}) {
          SCOPED_TRACE(std::string(l.name) + " M " + std::to_string(m) + " ks " + std::to_string(ks));
          const Plan p = with_cluster(m, l.heads, ks, 0, 0, mode);
          const Plan l2 = plan_decode(m, l.heads, ks, 132);
          const bool fits = l2.split > 1 && l2.units <= l2.grid;
          const bool wide = std::min<int64_t>(m, l2.nt) >= m3qkv::sm90::kSpreadMinTokens;
          if (mode == DecodeReduce::kSpread)
            EXPECT_EQ(p.spread, fits);
          else if (!fits || !wide)
            EXPECT_FALSE(p.spread);
          else  // automatic: spread wherever the cluster form is not taken
            EXPECT_EQ(p.spread, p.cluster == 0);
          if (!p.spread) continue;
          ++spread;
          EXPECT_EQ(p.cluster, 0);
          EXPECT_EQ(p.split, l2.split);
          EXPECT_EQ(p.grid, l2.grid);
          EXPECT_EQ(p.units, l2.units);
          EXPECT_EQ(p.partial_bytes, l2.partial_bytes);
          EXPECT_EQ(p.counter_bytes, l2.counter_bytes);
          EXPECT_TRUE(m3qkv::splitk::reduces_through_l2(p));
        }
  EXPECT_GT(spread, 0);
  // Forced: TP4 M = 1 (120 units on 120 CTAs) spreads; a grid cap below the
  // units, split 1 or the other modes do not.
  EXPECT_TRUE(with_cluster(1, 20, 48, 0, 0, DecodeReduce::kSpread).spread);
  EXPECT_FALSE(with_cluster(1, 20, 48, 0, 7, DecodeReduce::kSpread).spread);
  EXPECT_FALSE(with_cluster(64, 20, 48, 1, 0, DecodeReduce::kSpread).spread);
  EXPECT_FALSE(with_cluster(64, 20, 48, 0, 0, DecodeReduce::kL2).spread);
  EXPECT_FALSE(with_cluster(64, 20, 48, 2, 0, DecodeReduce::kCluster).spread);
  // TP1 (77 heads) at M = 64, split 2: 154 units > 132 CTAs, through L2 as before.
  EXPECT_FALSE(with_cluster(64, 77, 48, 2, 0, DecodeReduce::kAuto).spread);
  // Automatic: TP4 M = 4 through L2 (one CTA's few rows), M = 16 spread;
  // TP8 (12 pairs) M = 128 over 12 clusters of 8, as the cluster model picks.
  EXPECT_FALSE(with_cluster(4, 20, 48, 0, 0, DecodeReduce::kAuto).spread);
  EXPECT_TRUE(with_cluster(16, 20, 48, 0, 0, DecodeReduce::kAuto).spread);
  const Plan tp8_128 = with_cluster(128, 12, 48, 0, 0, DecodeReduce::kAuto);
  EXPECT_FALSE(tp8_128.spread);
  EXPECT_EQ(tp8_128.cluster, 8);
}

// The launchers' memo returns plan()'s result for any call sequence: repeats,
// alternations, one argument changed at a time, both targets interleaved.
TEST(DecodePlan, MemoReturnsThePlanOfItsArguments) {
  auto same = [](const m3qkv::splitk::Plan& a, const m3qkv::splitk::Plan& b) {
    return a.nt == b.nt && a.token_blocks == b.token_blocks && a.split == b.split && a.units == b.units &&
           a.grid == b.grid && a.max_unit_stages == b.max_unit_stages && a.counter_bytes == b.counter_bytes &&
           a.slot_floats == b.slot_floats && a.partial_bytes == b.partial_bytes;
  };
  struct Call {
    int64_t m;
    int heads, ks, sms, split, grid;
  };
  const Call calls[] = {{1, 20, 48, 132, 0, 0},  {1, 20, 48, 132, 0, 0},  {2, 20, 48, 132, 0, 0},
                        {1, 20, 48, 132, 0, 0},  {1, 77, 48, 132, 0, 0},  {1, 77, 48, 132, 4, 0},
                        {1, 77, 48, 132, 4, 50}, {1, 77, 48, 114, 4, 50}, {1, 77, 16, 114, 4, 50},
                        {256, 12, 48, 132, 0, 0}, {256, 12, 48, 132, 0, 0}, {1, 20, 48, 132, 0, 0}};
  for (int rep = 0; rep < 2; ++rep)
    for (const Call& c : calls) {
      SCOPED_TRACE("m " + std::to_string(c.m) + " heads " + std::to_string(c.heads) + " ks " + std::to_string(c.ks));
      EXPECT_TRUE(same(m3qkv::sm90::plan_decode_memo(c.m, c.heads, c.ks, c.sms, c.split, c.grid),
                       m3qkv::sm90::plan_decode(c.m, c.heads, c.ks, c.sms, c.split, c.grid)));
      EXPECT_TRUE(same(m3qkv::sm100::plan_decode_memo(c.m, c.heads, c.ks, c.sms, c.split, c.grid),
                       m3qkv::sm100::plan_decode(c.m, c.heads, c.ks, c.sms, c.split, c.grid)));
    }
  // The two targets plan differently for some call (else the interleaving above proves nothing).
  bool differ = false;
  for (const Call& c : calls)
    differ = differ || !same(m3qkv::sm90::plan_decode(c.m, c.heads, c.ks, c.sms, c.split, c.grid),
                             m3qkv::sm100::plan_decode(c.m, c.heads, c.ks, c.sms, c.split, c.grid));
  EXPECT_TRUE(differ);
}

TEST(DecodeLayout, AFragmentBytesAreThePtxLayoutAndTheSwizzleIsABijection) {
  // The A fragment element e of lane q in k16 slice s is K column
  // 16s + 8·(e/4) + 2q + e%2 (PTX layout, written here independently); the
  // kernel loads it as byte a_fragment_byte of the row's 64-K step, in pairs
  // (e, e+1) that are adjacent bytes.
  std::set<int> bytes;
  for (int q = 0; q < 4; ++q)
    for (int s = 0; s < 4; ++s)
      for (int e = 0; e < 8; ++e) {
        const int ptx_col = 16 * s + 8 * (e / 4) + 2 * q + e % 2;
        EXPECT_EQ(dec::a_fragment_byte(q, s, e), ptx_col) << "q " << q << " s " << s << " e " << e;
        if (e % 2 == 1) EXPECT_EQ(dec::a_fragment_byte(q, s, e), dec::a_fragment_byte(q, s, e - 1) + 1);
        if ((e / 2) % 2 == 0) bytes.insert(dec::a_fragment_byte(q, s, e));  // row r (rows r + 8 repeat them)
      }
  EXPECT_EQ(bytes.size(), 64u) << "a row's four lanes cover the step once";
  // The 128-byte swizzle: within each 8-row atom a bijection of the 1024
  // bytes, row n's bytes stay in its own 128-B line, and the 8 rows' copies of
  // one 16-B unit land in 8 different bank groups (what makes the A loads and
  // the transform's stores conflict-free).
  for (int atom = 0; atom < 3; ++atom) {
    std::set<int> seen;
    for (int n = 8 * atom; n < 8 * atom + 8; ++n) {
      std::set<int> groups;
      for (int byte = 0; byte < 128; ++byte) {
        const int o = dec::sw128_offset(n, byte);
        EXPECT_EQ(o / 128, n);
        EXPECT_EQ(o % 16, byte % 16);
        seen.insert(o);
      }
    }
    EXPECT_EQ(seen.size(), 1024u);
    for (int unit = 0; unit < 8; ++unit) {
      std::set<int> groups;
      for (int n = 8 * atom; n < 8 * atom + 8; ++n) groups.insert((dec::sw128_offset(n, 16 * unit) % 128) / 16);
      EXPECT_EQ(groups.size(), 8u) << "unit " << unit;
    }
  }
  // Worked: row 5, byte 0x23 (unit 2) -> unit 2 ^ 5 = 7.
  EXPECT_EQ(dec::sw128_offset(5, 0x23), 5 * 128 + 7 * 16 + 3);
}

// ----------------------------------------------------------- SM100 target
namespace sm100 = m3qkv::sm100;

// Every (head, token block) gets S units whose stage ranges tile [0, ks), as
// unit_of numbers them; no unit is empty.
void expect_units_cover(const Plan& p, int heads, int ks) {
  std::vector<int> seen(size_t(heads) * p.token_blocks * ks, 0);
  for (int u = 0; u < p.units; ++u) {
    const m3qkv::splitk::Unit w = m3qkv::splitk::unit_of(u, p.token_blocks, p.split, ks);
    ASSERT_LT(w.k0, w.k1) << "empty unit " << u;
    for (int k = w.k0; k < w.k1; ++k) ++seen[(size_t(w.head) * p.token_blocks + w.tb) * ks + k];
  }
  for (int v : seen) ASSERT_EQ(v, 1);
}

// Issue 15: at every TP at least 90 % of the SMs stream weights, on a B200
// (148 SMs) and a B300-class part (160), at the decode batch sizes; the
// busiest SM stays near its share of the weight stages.
TEST(Sm100DecodePlan, NinetyPercentOfTheSmsStreamWeights) {
  const Layout tps[] = {{"TP1", 77}, {"TP2", 39}, {"TP4", 20}, {"TP8", 12}};
  for (int sms : {148, 160})
    for (const Layout& l : tps)
      for (int64_t m : {1, 16, 64, 128}) {
        const int ks = 48;  // K = 6144
        SCOPED_TRACE(std::string(l.name) + " M " + std::to_string(m) + " on " + std::to_string(sms) + " SMs");
        const Plan p = sm100::plan_decode(m, l.heads, ks, sms);
        ASSERT_GT(p.nt, 0);
        EXPECT_EQ(p.token_blocks, 1) << "M <= 128: one token block";
        EXPECT_EQ(p.nt, m <= 32 ? 32 : m <= 64 ? 64 : 128) << "the narrowest block holding M";
        EXPECT_LE(p.grid, sms);
        EXPECT_LE(p.grid, p.units) << "a CTA without a unit streams nothing";
        EXPECT_GE(10 * p.grid, 9 * sms) << "split " << p.split << ": " << p.grid << " CTAs";
        ASSERT_NO_FATAL_FAILURE(expect_units_cover(p, l.heads, ks));
        const double share = double(l.heads) * ks / sms;
        const int span = makespan(p, ks);
        std::printf("[ plan ] %3d SMs %s M %3lld: nt %3d split %2d units %3lld grid %3d (%3.0f %%), busiest %2d stages, share %.1f\n",
                    sms, l.name, static_cast<long long>(m), p.nt, p.split, static_cast<long long>(p.units), p.grid,
                    100.0 * p.grid / sms, span, share);
        // M = 128: the last arriver reads S partials of 64 KiB, so the cost
        // model trades some balance for fewer splits (TP1: 32 stages, share 25).
        EXPECT_LE(span, 1.3 * share + 1.0) << "split " << p.split << ", grid " << p.grid;
      }
  // Worked (B200, K = 6144): TP4 splits 7 -> 140 CTAs of 6-7 stages;
  // TP8 splits 12 -> 144 CTAs of 4 stages.
  const Plan tp4 = sm100::plan_decode(1, 20, 48, 148);
  EXPECT_EQ(tp4.split, 7);
  EXPECT_EQ(tp4.grid, 140);
  EXPECT_EQ(makespan(tp4, 48), 7);
  const Plan tp8 = sm100::plan_decode(1, 12, 48, 148);
  EXPECT_EQ(tp8.split, 12);
  EXPECT_EQ(tp8.grid, 144);
  EXPECT_EQ(makespan(tp8, 48), 4);
}

// The busy rule overrides the cost model where the partial reads make fewer
// splits cheaper: TP8 at M = 128 would take 6 splits (72 CTAs, 49 %) by
// cost alone (the SM90 target, which has no rule, on the same numbers).
TEST(Sm100DecodePlan, BusyRuleOverridesTheCostModel) {
  const Plan by_cost = m3qkv::splitk::plan(
      m3qkv::splitk::Target{{32, 64, 128}, 3, sm100::decode::kMaxM, sm100::decode::kMaxSplit, 0}, 128, 12, 48, 148);
  EXPECT_EQ(by_cost.split, 6);
  EXPECT_EQ(by_cost.grid, 72);
  const Plan ruled = sm100::plan_decode(128, 12, 48, 148);
  EXPECT_EQ(ruled.split, 12);
  EXPECT_EQ(ruled.grid, 144);
  // Unreachable (K = 256: at most 12 × 2 units): the cheapest split of all.
  const Plan small_k = sm100::plan_decode(1, 12, 2, 148);
  EXPECT_EQ(small_k.split, 2);
  EXPECT_EQ(small_k.grid, 24);
}

TEST(Sm100DecodePlan, CoversEveryTokenAndEveryKStageOncePerHead) {
  for (const Layout& l : kLayouts)
    for (int64_t m : {1, 2, 7, 31, 32, 33, 64, 65, 100, 128})
      for (int ks : {1, 2, 3, 4, 16, 48}) {
        SCOPED_TRACE(std::string(l.name) + " M " + std::to_string(m) + " ks " + std::to_string(ks));
        const Plan p = sm100::plan_decode(m, l.heads, ks, 148);
        ASSERT_GT(p.nt, 0);
        EXPECT_TRUE(p.nt == 32 || p.nt == 64 || p.nt == 128);
        EXPECT_GE(p.nt, m);
        EXPECT_TRUE(p.nt == 32 || p.nt / 2 < m) << "a narrower block would hold M";
        ASSERT_GE(p.split, 1);
        ASSERT_LE(p.split, ks);
        EXPECT_EQ(p.units, int64_t(l.heads) * p.split);
        EXPECT_EQ(p.grid, std::min<int64_t>(p.units, 148));
        ASSERT_NO_FATAL_FAILURE(expect_units_cover(p, l.heads, ks));
        EXPECT_EQ(p.partial_bytes, p.units * p.nt * 128 * 4);
      }
}

// Large M: the partial workspace stays within its bound (a split that would
// exceed it is never chosen, and a forced one is lowered until it fits), and
// where (head, token block) pairs already fill the SMs several times over no
// split is taken.
TEST(DecodePlan, LargeMBoundsThePartialsAndDropsTheSplit) {
  const int64_t cap = m3qkv::sm90::kDecodeMaxPartialBytes;
  for (const Layout& l : kLayouts)
    for (int64_t m : {int64_t{512}, int64_t{1024}, int64_t{2048}, int64_t{4096}, int64_t{16384}, int64_t{1} << 20}) {
      const Plan p = plan_decode(m, l.heads, 48, 132);
      ASSERT_EQ(p.nt, 128) << l.name << " M " << m;
      EXPECT_EQ(p.token_blocks, (m + 127) / 128);
      if (p.split > 1) EXPECT_LE(p.partial_bytes, cap) << l.name << " M " << m;
      const Plan forced = plan_decode(m, l.heads, 48, 132, 8);
      EXPECT_GE(forced.split, 1);
      if (forced.split > 1) EXPECT_LE(forced.units * 128 * 128 * 4, cap) << l.name << " M " << m;
      if (int64_t(l.heads) * p.token_blocks >= 4 * 132) EXPECT_EQ(p.split, 1) << l.name << " M " << m;
    }
  // Worked: TP4 (20 heads) M = 1024: 160 pairs on 132 SMs; split 2 (320 units,
  // 20 MiB) or 3 (480 units, 30 MiB) fit 32 MiB, 4 (40 MiB) does not.
  const Plan tp4 = plan_decode(1024, 20, 48, 132);
  EXPECT_GE(tp4.split, 2);
  EXPECT_LE(tp4.split, 3);
  EXPECT_EQ(plan_decode(1024, 20, 48, 132, 8).split, 3);
}

TEST(Sm100DecodePlan, OverridesAndLimits) {
  // Forced splits bypass the busy rule and are clamped to [1, min(ks, 64)].
  EXPECT_EQ(sm100::plan_decode(1, 20, 48, 148, 2).split, 2);
  EXPECT_EQ(sm100::plan_decode(1, 20, 48, 148, 2).grid, 40);
  EXPECT_EQ(sm100::plan_decode(1, 20, 4, 148, 9).split, 4);
  EXPECT_EQ(sm100::plan_decode(1, 20, 200, 148, 1000).split, sm100::decode::kMaxSplit);
  // A grid cap: the busy rule counts against the cap (7 CTAs: any split >= 1 fills them).
  const Plan capped = sm100::plan_decode(7, 20, 48, 148, 0, 7);
  EXPECT_EQ(capped.grid, 7);
  EXPECT_EQ(makespan(capped, 48), (capped.units + 6) / 7 * ((48 + capped.split - 1) / capped.split));
  // The M range: one token block of at most 128 tokens.
  EXPECT_EQ(sm100::plan_decode(sm100::decode::kMaxM + 1, 20, 48, 148).nt, 0);
  EXPECT_EQ(sm100::plan_decode(0, 20, 48, 148).nt, 0);
  EXPECT_EQ(sm100::plan_decode(1, 20, 48, 0).nt, 0);
}

TEST(Sm100DecodePlan, KernelChoice) {
  for (int cg : {0, 1}) {
    EXPECT_TRUE(sm100::uses_decode(1, cg));
    EXPECT_TRUE(sm100::uses_decode(sm100::decode::kMaxM, cg));
    EXPECT_FALSE(sm100::uses_decode(sm100::decode::kMaxM + 1, cg));
    EXPECT_FALSE(sm100::uses_decode(0, cg));
  }
  EXPECT_FALSE(sm100::uses_decode(1, 2)) << "cta_group 2 asks for the tile kernel's CTA pairs";
}

// The scale factors of token block tb: tcgen05.cp.32x128b.warpx4 puts row r of
// the 512-B chunk at lane r % 32, column r / 32 (F8_128x4 byte (r % 32)·16 +
// (r / 32)·4 + k); the MMA reads B column n at lane n % 32, column
// sfx_col_offset + n / 32. Every token of every block must meet its own row.
TEST(Sm100DecodeLayout, TokenBlockScaleColumns) {
  for (int nt : {32, 64, 128})
    for (int tb = 0; tb < 4 * (128 / nt); ++tb)
      for (int n = 0; n < nt; ++n) {
        const int row = (tb * nt) % 128 + n;  // the token's row in its chunk
        const int cp_lane = row % 32, cp_col = row / 32;
        const int mma_lane = n % 32, mma_col = static_cast<int>(sm100::decode::sfx_col_offset(tb, nt)) + n / 32;
        ASSERT_EQ(mma_lane, cp_lane) << "nt " << nt << " tb " << tb << " n " << n;
        ASSERT_EQ(mma_col, cp_col) << "nt " << nt << " tb " << tb << " n " << n;
        ASSERT_LT(mma_col, 4) << "inside the slot's 4 SFX columns";
      }
}

// Budgets of the three instances (decode_config.h static-asserts them; the
// numbers here are worked by hand for docs/sm100.md).
TEST(Sm100DecodeLayout, ConfigBudgets) {
  using C32 = sm100::decode::DecodeConfig<32>;
  using C64 = sm100::decode::DecodeConfig<64>;
  using C128 = sm100::decode::DecodeConfig<128>;
  // stage = W 16384 + X 128·NT + 2 × 512 scale chunks
  EXPECT_EQ(C32::kStageBytes, 21504u);
  EXPECT_EQ(C64::kStageBytes, 25600u);
  EXPECT_EQ(C128::kStageBytes, 33792u);
  // stages = (232448 − 1024 − 176 − T) / stage, at most 8; T = 512·NT
  EXPECT_EQ(C32::kStages, 8u);
  EXPECT_EQ(C64::kStages, 7u);
  EXPECT_EQ(C128::kStages, 4u);
  // TMEM: 2·NT accumulator columns + 8 per SF slot, rounded up to a power of 2
  EXPECT_EQ(C32::kTmemAllocCols, 128u);
  EXPECT_EQ(C64::kTmemAllocCols, 256u);
  EXPECT_EQ(C128::kTmemAllocCols, 512u);
  EXPECT_EQ(C32::kSfSlots, 8u);
  EXPECT_EQ(C64::kSfSlots, 7u);
  EXPECT_EQ(C128::kSfSlots, 4u);
  EXPECT_EQ(C32::kNumThreads, 320u);
}

}  // namespace

// The routing rule (decode_plan.h): bf16 activations up to 2047 tokens (the
// prefill kernel from 2048), MXFP8 up to 511 tokens, 767 with at most 12 heads
// (converted once per call above 32, by the transform warps below).
TEST(DecodePlan, RoutingBf16BelowM2048Mxfp8SmallM) {
  using m3qkv::sm90::decode_preferred;
  for (int64_t m : {1, 4, 16, 32}) EXPECT_FALSE(m3qkv::sm90::decode_converts_x(m)) << m;
  for (int64_t m : {33, 256, 511}) EXPECT_TRUE(m3qkv::sm90::decode_converts_x(m)) << m;
  for (int heads : {12, 20, 39, 77}) {
    for (int64_t m : {1, 16, 32, 33, 64, 128, 256, 512, 1024, 2047})
      EXPECT_TRUE(decode_preferred(m, heads, true)) << m;
    for (int64_t m : {2048, 4096, 16384}) EXPECT_FALSE(decode_preferred(m, heads, true)) << m;
    for (int64_t m : {1, 2, 16, 32, 33, 64, 256, 511}) EXPECT_TRUE(decode_preferred(m, heads, false)) << m;
    for (int64_t m : {512, 767}) EXPECT_EQ(decode_preferred(m, heads, false), heads <= 12) << m << " " << heads;
    for (int64_t m : {768, 1024, 4096}) EXPECT_FALSE(decode_preferred(m, heads, false)) << m;
    for (bool b : {false, true}) {
      EXPECT_FALSE(decode_preferred(0, heads, b));
      EXPECT_FALSE(decode_preferred(kDecodeMaxM + 1, heads, b));
    }
  }
}
