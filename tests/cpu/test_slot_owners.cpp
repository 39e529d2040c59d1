// Slot ownership (docs/contract.md §4.4: where tokens of one call share a
// slot, the last of them writes it):
//  - SlotOwners.TableMatchesBruteForce: common/slot_owners.cuh's table (its
//    host form) against an O(M²) scan, for random blocks of random slot
//    arrays full of shared, skipped and huge slots, both slot words.
//  - SlotOwners.WholeCallPassesMatchBruteForce: the whole-call form (the
//    insert's owner passes at large M) against the same scan.
//  - SlotOwners.GoldenWritesTheLastTokensRow: the golden model on a call
//    with shared slots writes exactly what it writes on the same call with
//    every non-last sharer's slot set to -1 (found by brute force here), in
//    every cache format; the expected bytes are not the golden's own rule.
//  - SlotOwners.HostEpilogueMatchesGolden: epilogue_head_row with the table
//    (what the kernels run) equals the golden model on such calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/epilogue.cuh"
#include "common/problem.h"
#include "golden/golden.h"

namespace {

using m3qkv::epi::SlotOwnerTable;
using m3qkv_test::Problem;
using m3qkv_test::ProblemConfig;

// Row r owns slot s[r] when no later row names it (brute force).
bool owns_brute(const std::vector<int64_t>& s, int64_t r) {
  for (size_t j = size_t(r) + 1; j < s.size(); ++j)
    if (s[j] == s[size_t(r)]) return false;
  return true;
}

TEST(SlotOwners, TableMatchesBruteForce) {
  std::mt19937_64 rng(0x5107u);
  static SlotOwnerTable<256> t;  // 128 rows, both slot words
  int asked = 0, not_owner = 0;
  for (int iter = 0; iter < 400; ++iter) {
    const int64_t m = 1 + int64_t(rng() % 700);
    const int64_t range = 1 + int64_t(rng() % (iter % 3 == 0 ? 8 : 2000));  // few distinct slots: many collisions
    std::vector<int64_t> kv(static_cast<size_t>(m)), ix(static_cast<size_t>(m));
    for (int64_t r = 0; r < m; ++r) {
      const uint64_t u = rng() % 20;
      kv[size_t(r)] = u == 0 ? -1 : u == 1 ? INT64_MAX : u == 2 ? (int64_t(1) << 40) + int64_t(rng() % 3)
                                                                : int64_t(rng() % uint64_t(range));
      // Index slots: often the KV slot's value (the table keeps them apart), INT64_MAX (the empty key) sometimes.
      ix[size_t(r)] = rng() % 2 ? kv[size_t(r)] : rng() % 10 == 0 ? INT64_MAX : int64_t(rng() % uint64_t(range));
    }
    const int64_t row0 = int64_t(rng() % uint64_t(m));
    const int rows = 1 + int(rng() % 128);
    const uint32_t maps = 1u + uint32_t(rng() % 3);
    m3qkv::epi::build_slot_owners(t, kv.data(), ix.data(), maps, m, row0, rows, 0, 1, [] {});
    const m3qkv::epi::SlotOwners own = t.view();
    for (int64_t r = row0; r < std::min<int64_t>(m, row0 + rows); ++r) {
      for (int w = 0; w < 2; ++w) {
        if (!(maps & (1u << w))) continue;
        const std::vector<int64_t>& s = w ? ix : kv;
        if (s[size_t(r)] < 0) continue;
        // The one key the table cannot hold (the index slot INT64_MAX) is owned unasked.
        const bool want = (w == 1 && s[size_t(r)] == INT64_MAX) || owns_brute(s, r);
        ASSERT_EQ(own.owns(s[size_t(r)], w == 1, r), want)
            << "iter " << iter << " m " << m << " row " << r << " map " << w << " slot " << s[size_t(r)];
        ++asked;
        not_owner += !want;
      }
    }
  }
  EXPECT_GT(asked, 20000);
  EXPECT_GT(not_owner, asked / 5);  // the collisions were frequent
}

// The whole-call form (the insert's owner passes at large M): clear, insert
// every row's words, resolve; each row's resolved word is its own where it
// owns the slot, -1 where a later row names it (brute force), its own for
// negative slots and the index slot INT64_MAX.
TEST(SlotOwners, WholeCallPassesMatchBruteForce) {
  std::mt19937_64 rng(0x0A11u);
  int shared = 0, rows_checked = 0;
  for (int iter = 0; iter < 40; ++iter) {
    const int64_t m = 1 + int64_t(rng() % 3000);
    const int64_t range = 1 + int64_t(rng() % (iter % 2 ? 16 : 5000));
    std::vector<int64_t> kv(static_cast<size_t>(m)), ix(static_cast<size_t>(m));
    for (int64_t r = 0; r < m; ++r) {
      const uint64_t u = rng() % 20;
      kv[size_t(r)] = u == 0 ? -1 : u == 1 ? INT64_MAX : int64_t(rng() % uint64_t(range));
      ix[size_t(r)] = rng() % 2 ? kv[size_t(r)] : rng() % 10 == 0 ? INT64_MAX : int64_t(rng() % uint64_t(range));
    }
    const int64_t entries = m3qkv::epi::owner_entries_for(2 * m);
    ASSERT_GE(entries, 4 * m);
    std::vector<unsigned long long> key(static_cast<size_t>(entries), 123u);  // garbage: pass 0 clears it
    std::vector<int32_t> last(static_cast<size_t>(entries), 7);
    const uint32_t mask = uint32_t(entries - 1);
    for (int64_t i = 0; i < entries; ++i) m3qkv::epi::owner_table_clear(key.data(), last.data(), i);
    for (int64_t r = 0; r < m; ++r) {
      m3qkv::epi::owner_table_insert(key.data(), last.data(), mask, kv[size_t(r)], false, r);
      m3qkv::epi::owner_table_insert(key.data(), last.data(), mask, ix[size_t(r)], true, r);
    }
    for (int w = 0; w < 2; ++w) {
      const std::vector<int64_t>& sl = w ? ix : kv;
      for (int64_t r = 0; r < m; ++r) {
        const int64_t got = m3qkv::epi::owner_table_resolve(key.data(), last.data(), mask, sl[size_t(r)], w == 1, r);
        const int64_t v = sl[size_t(r)];
        const bool own = v < 0 || (w == 1 && v == INT64_MAX) || owns_brute(sl, r);
        ASSERT_EQ(got, own ? v : -1) << "iter " << iter << " row " << r << " map " << w;
        shared += !own;
        ++rows_checked;
      }
    }
  }
  EXPECT_GT(shared, rows_checked / 5);
}

ProblemConfig shared_config(int kv, int ix, int64_t m, uint64_t seed) {
  ProblemConfig cfg;
  cfg.m = m;
  cfg.k = 128;
  cfg.nq = 4;
  cfg.nkv = 2;
  cfg.niq = 2;
  cfg.nik = 1;
  cfg.block_size = 8;
  cfg.kv_dtype = kv;
  cfg.index_dtype = ix;
  cfg.k_scale = 7.0f;
  cfg.v_scale = 0.375f;
  cfg.shared_slot_fraction = 0.6;
  cfg.out_of_range_slots = seed % 2 == 1;
  cfg.seed = seed;
  return cfg;
}

// -1 for every row a later row shares its slot with.
std::vector<int64_t> last_sharers_only(const std::vector<int64_t>& s) {
  std::vector<int64_t> d = s;
  for (int64_t r = 0; r < int64_t(s.size()); ++r)
    if (s[size_t(r)] >= 0 && !owns_brute(s, r)) d[size_t(r)] = -1;
  return d;
}

TEST(SlotOwners, GoldenWritesTheLastTokensRow) {
  int shared = 0;
  for (int kv : {0, 1, 2})
    for (int ix : {0, 1, 2}) {
      const Problem p = m3qkv_test::make_problem(shared_config(kv, ix, 97, 31u * kv + ix + 1));
      Problem dedup = p;
      dedup.slot_mapping = last_sharers_only(p.slot_mapping);
      dedup.index_slot_mapping = last_sharers_only(p.index_slot_mapping);
      for (size_t r = 0; r < p.slot_mapping.size(); ++r) shared += dedup.slot_mapping[r] != p.slot_mapping[r];
      const std::vector<float> acc =
          m3qkv::golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
      const m3qkv_test::HostOutputs got = m3qkv_test::golden_outputs(p, 0x3c, acc.data());
      const m3qkv_test::HostOutputs want = m3qkv_test::golden_outputs(dedup, 0x3c, acc.data());
      EXPECT_EQ(m3qkv_test::compare_outputs(p, want, got), "") << p.cfg.describe();
    }
  EXPECT_GT(shared, 9 * 20);  // every case had shared slots
}

TEST(SlotOwners, HostEpilogueMatchesGolden) {
  for (int kv : {0, 1, 2})
    for (int ix : {0, 2}) {
      const Problem p = m3qkv_test::make_problem(shared_config(kv, ix, 150, 77u * kv + ix));
      const std::vector<float> acc =
          m3qkv::golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
      const m3qkv_test::HostOutputs want = m3qkv_test::golden_outputs(p, 0x5a, acc.data());
      m3qkv_test::HostOutputs got = p.make_outputs(0x5a);
      const m3qkv_fused_args a = p.host_args(got.ptrs());
      const m3qkv::epi::EpilogueParams e = m3qkv::epi::make_epilogue_params(a);
      const int heads = m3qkv::total_heads(p.nq, p.nkv, p.niq, p.nik);
      // Blocks of 64 rows, one table each (a kernel's tile), blocks and rows
      // in reverse: every non-owner runs after its slot's owner, so a write
      // it should not make would stay.
      static SlotOwnerTable<128> t;
      float x[128];
      for (int64_t m0 = (p.m - 1) / 64 * 64; m0 >= 0; m0 -= 64) {
        m3qkv::epi::build_slot_owners(t, e.slot_mapping, e.index_slot_mapping, m3qkv::epi::kSlotMapBoth, p.m, m0, 64,
                                      0, 1, [] {});
        for (int64_t m = std::min<int64_t>(p.m, m0 + 64) - 1; m >= m0; --m)
          for (int h = 0; h < heads; ++h) {
            std::memcpy(x, &acc[size_t(m * p.n() + h * 128)], sizeof x);
            m3qkv::epi::epilogue_head_row(e, t.view(), m, h, x);
          }
      }
      EXPECT_EQ(m3qkv_test::compare_outputs(p, want, got), "") << p.cfg.describe();
    }
}

}  // namespace
