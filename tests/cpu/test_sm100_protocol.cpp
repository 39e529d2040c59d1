// A CPU model of the SM100 kernel's synchronization protocol, run under random
// interleavings: the TMA producers, the MMA issuer and the epilogue warps of
// one cluster (1 or 2 CTAs), the mbarriers (PTX ISA §9.7.13.15: pending
// arrivals, tx-count, phase parity), and the asynchronous engines (TMA
// completions, tcgen05.cp / tcgen05.mma / tcgen05.commit executing later and,
// for cp, possibly ahead of earlier MMAs: PTX §9.7.16.6.2 orders only
// cp -> mma, mma -> mma, and commit after everything it tracks).
//
// The actors wait and arrive exactly where fused_sm100.cu does, with the phase
// formulas of src/sm100/pipeline.h and the byte / slot / column constants of
// src/sm100/config.h. The model checks that
//   * no schedule deadlocks (some actor or engine can always progress),
//   * no shared-memory stage, scale-factor TMEM slot or accumulator column is
//     overwritten before its consumer has used it, and every consumer sees
//     complete data of the right k-block / tile,
//   * every accumulator chunk of every tile is read exactly once.
// Mutated protocols (a wait removed, a byte count off by one chunk, a parity
// flipped) must be caught, so the model is shown to be able to fail.
// This checks the protocol, not the hardware: nothing here runs tcgen05.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "sm100/config.h"
#include "sm100/pipeline.h"

namespace {

namespace pipe = m3qkv::sm100::pipe;

enum class Mutation { None, SkipSfReuseWait, SkipOvlWait, TxOneChunkShort, AccEmptyParityFlipped, SkipAccEmptyWait };

struct Failure {
  std::string what;
};

// ------------------------------------------------------------------ mbarrier
struct Bar {
  int expected = 1, pending = 1;
  int64_t tx = 0;
  uint32_t completed = 0;  // phases completed so far
  void init(int count) { expected = pending = count, tx = 0, completed = 0; }
  void check(const char* who) {
    if (pending < 0) throw Failure{std::string("arrive on a barrier with no pending arrival: ") + who};
    if (tx > (1 << 20) - 1 || tx < -((1 << 20) - 1)) throw Failure{std::string("tx-count out of range: ") + who};
    if (pending == 0 && tx == 0) {
      ++completed;
      pending = expected;
    }
  }
  void arrive(const char* who) { --pending, check(who); }
  void arrive_expect_tx(int64_t bytes, const char* who) { tx += bytes, --pending, check(who); }
  void complete_tx(int64_t bytes, const char* who) { tx -= bytes, check(who); }
  // mbarrier.try_wait.parity: true once the phase with parity p completed,
  // i.e. the current (incomplete) phase has the other parity.
  bool try_wait(uint32_t p) const { return (completed & 1u) != p; }
};

template <int CG>
class Model {
  using C = m3qkv::sm100::Config<CG>;
  static constexpr uint32_t S = C::kStages;
  static constexpr uint32_t R = C::kSfSlots;
  static constexpr bool kOverlap = C::kOverlapCols > 0;

 public:
  Model(uint32_t tiles, uint32_t kblocks, Mutation mut, uint64_t seed) : T(tiles), K(kblocks), mut_(mut), rng_(seed) {
    for (auto& c : cta_) {
      for (auto& b : c.full) b.init(1);
      for (auto& b : c.empty) b.init(1);
      for (auto& b : c.tmem_full) b.init(1);
      for (auto& b : c.tmem_empty) b.init(CG * C::kNumEpiWarps);
      for (auto& b : c.tmem_ovl) b.init(CG * 4);
      c.stage.assign(S, StageTag{});
      c.sf_slot.assign(R, SlotTag{});
      // TMEM chunks of 32 columns × 4 lane quarters.
      c.cells.assign(m3qkv::sm100::kTmemColumns / 32, std::vector<Cell>(4));
      c.reads.assign(T, std::vector<int>(CG * 4 * 4, 0));  // per tile: (head, chunk, quarter) read count
    }
    for (int c = 0; c < CG; ++c) {
      prod_.push_back(Producer{c});
      for (uint32_t w = 0; w < C::kNumEpiWarps; ++w)
        epi_.push_back(Epi{c, static_cast<int>(w / 4), static_cast<int>(w % 4)});
    }
  }

  // Runs to completion; throws Failure on deadlock or hazard.
  void run() {
    for (int steps = 0; steps < 10'000'000; ++steps) {
      std::vector<int> ready;
      const int n_actors = static_cast<int>(prod_.size() + 1 + epi_.size());
      for (int a = 0; a < n_actors; ++a)
        if (!actor_done(a) && actor_can_step(a)) ready.push_back(a);
      for (size_t e = 0; e < tma_.size(); ++e) ready.push_back(1000 + static_cast<int>(e));
      for (size_t e = 0; e < tc_.size(); ++e)
        if (tc_can_execute(e)) ready.push_back(2000 + static_cast<int>(e));
      if (ready.empty()) {
        bool all_done = tma_.empty() && tc_.empty();
        for (int a = 0; a < n_actors; ++a) all_done = all_done && actor_done(a);
        if (all_done) break;
        throw Failure{"deadlock: no actor or engine can progress"};
      }
      const int pick = ready[std::uniform_int_distribution<size_t>(0, ready.size() - 1)(rng_)];
      if (pick >= 2000)
        tc_execute(pick - 2000);
      else if (pick >= 1000)
        tma_complete(pick - 1000);
      else
        actor_step(pick);
    }
    // Every (tile, head, chunk, lane quarter) read exactly once by its epilogue warp.
    for (int c = 0; c < CG; ++c)
      for (uint32_t t = 0; t < T; ++t)
        for (int v : cta_[c].reads[t])
          if (v != 1) throw Failure{"an accumulator chunk was not read exactly once"};
  }

 private:
  struct Field {  // which k-block's bytes a buffer of a smem stage holds
    int64_t g = -1;
    bool landed = false;
    bool consumed = true;  // its reader (MMA for A/B, cp for SFA/SFB) executed
  };
  struct StageTag {
    Field f[5];  // A, B, SFA, SFB slot 0, SFB slot 1
  };
  struct SlotTag {
    int64_t g = -1;
    bool consumed = true;
  };
  struct Cell {
    int64_t tile = -1;
    uint32_t kdone = 0;
    bool read = true;
  };
  struct Cta {
    Bar full[C::kMaxStages], empty[C::kMaxStages], tmem_full[2], tmem_empty[2], tmem_ovl[2];
    std::vector<StageTag> stage;
    std::vector<SlotTag> sf_slot;
    std::vector<std::vector<Cell>> cells;
    std::vector<std::vector<int>> reads;
  };
  struct Producer {
    int cta;
    uint32_t g = 0, drain = 0;
    bool done = false;
  };
  struct Mma {
    uint32_t i = 0, kb = 0, g = 0;
    int pc = 0;  // 0: acc waits, 1: k-block, 2: done
  } mma_;
  struct Epi {
    int cta, wg, quarter;
    uint32_t i = 0;
    int pc = 0;  // 0: wait full, 1: (owner) overlap read, 2: rest read
    bool done = false;
  };
  struct TmaOp {
    int dst_cta;
    uint32_t s;
    int kind;  // 0 A, 1 B, 2 SFA, 3 SFB slot 0, 4 SFB slot 1
    int64_t g;
    uint32_t bytes;
  };
  struct TcOp {
    int kind;  // 0 cp, 1 mma (4 K slices), 2 commit
    uint64_t seq;
    int64_t g;
    uint32_t s, slot, buf, tile, kb;
    int bar_kind;  // commit: 0 empty[s], 1 tmem_full[buf]
  };

  uint32_t T, K;
  Mutation mut_;
  std::mt19937_64 rng_;
  Cta cta_[CG];
  std::vector<Producer> prod_;
  std::vector<Epi> epi_;
  std::deque<TmaOp> tma_;
  std::deque<TcOp> tc_;
  uint64_t seq_ = 0;

  // ------------------------------------------------------------- actors
  bool actor_done(int a) const {
    if (a < static_cast<int>(prod_.size())) return prod_[a].done;
    if (a == static_cast<int>(prod_.size())) return mma_.pc == 2;
    return epi_[a - prod_.size() - 1].done;
  }
  bool actor_can_step(int a) {
    if (a < static_cast<int>(prod_.size())) return producer(prod_[a], false);
    if (a == static_cast<int>(prod_.size())) return mma(false);
    return epilogue(epi_[a - prod_.size() - 1], false);
  }
  void actor_step(int a) {
    if (a < static_cast<int>(prod_.size()))
      producer(prod_[a], true);
    else if (a == static_cast<int>(prod_.size()))
      mma(true);
    else
      epilogue(epi_[a - prod_.size() - 1], true);
  }

  // TMA producer of CTA `c` (fused_sm100.cu, warp 0).
  bool producer(Producer& p, bool go) {
    Cta& me = cta_[p.cta];
    if (p.g < T * K) {
      const uint32_t s = pipe::stage_of(p.g, S);
      if (!me.empty[s].try_wait(pipe::empty_parity(p.g, S))) return false;
      if (!go) return true;
      uint32_t tx = C::kTxBytesPerStage;
      if (mut_ == Mutation::TxOneChunkShort) tx -= m3qkv::sm100::kSfChunkBytes;
      if (p.cta == 0) cta_[0].full[s].arrive_expect_tx(tx, "full (expect_tx)");
      tma_.push_back({p.cta, s, 0, p.g, C::kABytes});
      tma_.push_back({p.cta, s, 1, p.g, C::kBBytes});
      tma_.push_back({p.cta, s, 2, p.g, C::kSfaBytes});
      for (int d = 0; d < CG; ++d)  // SFB: own slot, multicast to every CTA of the pair
        tma_.push_back({d, s, 3 + p.cta, p.g, m3qkv::sm100::kSfChunkBytes});
      ++p.g;
      return true;
    }
    // Drain: the commits of the last min(S, issued) k-blocks.
    const uint32_t first = T * K > S ? T * K - S : 0u;
    const uint32_t g = first + p.drain;
    if (g < T * K) {
      if (!me.empty[pipe::stage_of(g, S)].try_wait(pipe::commit_parity(g, S))) return false;
      if (go) ++p.drain;
      return true;
    }
    if (go) p.done = true;
    return true;
  }

  // MMA issuer (leader CTA, warp 1).
  bool mma(bool go) {
    Cta& L = cta_[0];
    if (mma_.pc == 2) return false;
    if (mma_.pc == 0) {
      if (mma_.i == T) {
        if (go) mma_.pc = 2;
        return true;
      }
      const uint32_t b = pipe::acc_buf(mma_.i);
      uint32_t ep = pipe::acc_empty_parity(mma_.i);
      if (mut_ == Mutation::AccEmptyParityFlipped) ep ^= 1u;
      if (mut_ != Mutation::SkipAccEmptyWait && !L.tmem_empty[b].try_wait(ep)) return false;
      if (mut_ != Mutation::SkipOvlWait && pipe::ovl_wait(mma_.i, kOverlap) &&
          !L.tmem_ovl[pipe::ovl_wait_buf(mma_.i)].try_wait(pipe::ovl_wait_parity(mma_.i)))
        return false;
      if (go) mma_.pc = 1, mma_.kb = 0;
      return true;
    }
    // one k-block
    const uint32_t g = mma_.g, s = pipe::stage_of(g, S);
    if (!L.full[s].try_wait(pipe::full_parity(g, S))) return false;
    if (mut_ != Mutation::SkipSfReuseWait && pipe::sf_reuse_wait(g, R) &&
        !L.empty[pipe::sf_reuse_stage(g, R, S)].try_wait(pipe::sf_reuse_parity(g, R, S)))
      return false;
    if (!go) return true;
    const uint32_t b = pipe::acc_buf(mma_.i), slot = pipe::sf_slot(g, R);
    tc_.push_back({0, seq_++, g, s, slot, b, mma_.i, mma_.kb, 0});
    tc_.push_back({1, seq_++, g, s, slot, b, mma_.i, mma_.kb, 0});
    tc_.push_back({2, seq_++, g, s, slot, b, mma_.i, mma_.kb, 0});
    if (mma_.kb + 1 == K) tc_.push_back({2, seq_++, g, s, slot, b, mma_.i, mma_.kb, 1});
    ++mma_.g;
    if (++mma_.kb == K) mma_.pc = 0, ++mma_.i;
    return true;
  }

  // Epilogue warp (quarter q of warpgroup wg) of CTA c.
  bool epilogue(Epi& e, bool go) {
    Cta& me = cta_[e.cta];
    if (e.i == T) {
      if (go) e.done = true;
      return true;
    }
    const uint32_t b = pipe::acc_buf(e.i);
    const bool owner = kOverlap && static_cast<uint32_t>(e.wg) == pipe::overlap_owner_wg(b);
    if (e.pc == 0) {
      if (!me.tmem_full[b].try_wait(pipe::acc_full_parity(e.i))) return false;
      if (go) e.pc = owner ? 1 : 2;
      return true;
    }
    if (!go) return true;
    const uint32_t base = (b == 0 ? C::kAccBase0 : C::kAccBase1) / 32 + 4 * e.wg;
    if (e.pc == 1) {
      read_chunk(e, base + pipe::overlap_chunk(b), pipe::overlap_chunk(b));
      cta_[0].tmem_ovl[b].arrive("tmem_ovl");
      e.pc = 3;
      return true;
    }
    for (uint32_t c = 0; c < 4; ++c)
      if (!(e.pc == 3 && c == pipe::overlap_chunk(b))) read_chunk(e, base + c, c);
    cta_[0].tmem_empty[b].arrive("tmem_empty");
    e.pc = 0;
    ++e.i;
    return true;
  }
  void read_chunk(const Epi& e, uint32_t col_chunk, uint32_t c) {
    Cell& cell = cta_[e.cta].cells[col_chunk][e.quarter];
    if (cell.tile != static_cast<int64_t>(e.i) || cell.kdone != K || cell.read)
      throw Failure{"epilogue read an accumulator chunk that does not hold its complete tile"};
    cell.read = true;
    ++cta_[e.cta].reads[e.i][(e.wg * 4 + c) * 4 + e.quarter];
  }

  // ------------------------------------------------------------ engines
  void tma_complete(size_t idx) {
    const TmaOp op = tma_[idx];
    tma_.erase(tma_.begin() + static_cast<long>(idx));
    Field& f = cta_[op.dst_cta].stage[op.s].f[op.kind];
    if (!f.consumed) throw Failure{"TMA overwrote a shared-memory buffer before its reader executed"};
    f = Field{op.g, true, false};
    // Every TMA of the pair completes on the even CTA's full barrier.
    cta_[0].full[op.s].complete_tx(op.bytes, "full (complete_tx)");
  }
  bool tc_can_execute(size_t idx) const {
    const TcOp& op = tc_[idx];
    for (size_t j = 0; j < idx; ++j) {
      const TcOp& prev = tc_[j];
      if (op.kind == 2) return false;                    // commit: after everything before it
      if (op.kind == 1 && prev.kind != 2) return false;  // mma: after earlier mma and cp
      // cp: may overtake earlier MMAs and commits (mma -> cp is not ordered)
    }
    return true;
  }
  void tc_execute(size_t idx) {
    const TcOp op = tc_[idx];
    tc_.erase(tc_.begin() + static_cast<long>(idx));
    if (op.kind == 0) {  // tcgen05.cp: each CTA's slot from its own smem
      for (int c = 0; c < CG; ++c) {
        StageTag& st = cta_[c].stage[op.s];
        for (int k = 2; k < 3 + CG; ++k) {
          if (st.f[k].g != op.g || !st.f[k].landed) throw Failure{"cp read scale factors that had not landed"};
          st.f[k].consumed = true;
        }
        SlotTag& sl = cta_[c].sf_slot[op.slot];
        if (!sl.consumed) throw Failure{"cp overwrote scale factors an MMA had not read yet"};
        sl.g = op.g;
        sl.consumed = false;
      }
    } else if (op.kind == 1) {  // 4 × tcgen05.mma of k-block g
      for (int c = 0; c < CG; ++c) {
        StageTag& st = cta_[c].stage[op.s];
        for (int k = 0; k < 2; ++k) {
          if (st.f[k].g != op.g || !st.f[k].landed) throw Failure{"MMA read an operand that had not landed"};
          st.f[k].consumed = true;
        }
        SlotTag& sl = cta_[c].sf_slot[op.slot];
        if (sl.g != op.g || sl.consumed) throw Failure{"MMA read scale factors of another k-block"};
        sl.consumed = true;
        const uint32_t base = (op.buf == 0 ? C::kAccBase0 : C::kAccBase1) / 32;
        for (uint32_t ch = 0; ch < C::BN / 32; ++ch)
          for (Cell& cell : cta_[c].cells[base + ch]) {
            if (op.kb == 0) {
              if (!cell.read) throw Failure{"MMA overwrote accumulator columns the epilogue had not read"};
              cell = Cell{op.tile, 1, false};
            } else {
              if (cell.tile != op.tile || cell.kdone != op.kb) throw Failure{"MMA accumulated into a foreign tile"};
              ++cell.kdone;
            }
          }
      }
    } else {  // commit: arrive (multicast to the pair at cta_group 2)
      for (int c = 0; c < CG; ++c) {
        if (op.bar_kind == 0)
          cta_[c].empty[op.s].arrive("empty (commit)");
        else
          cta_[c].tmem_full[op.buf].arrive("tmem_full (commit)");
      }
    }
  }
};

template <int CG>
std::string run_model(uint32_t tiles, uint32_t kblocks, Mutation mut, uint64_t seed) {
  try {
    Model<CG> m(tiles, kblocks, mut, seed);
    m.run();
  } catch (const Failure& f) {
    return f.what;
  }
  return "";
}

template <int CG>
void run_clean(int runs) {
  std::mt19937_64 rng(m3qkv_test::test_seed() + CG);
  for (int r = 0; r < runs; ++r) {
    const uint32_t tiles = 1 + static_cast<uint32_t>(rng() % 7);
    const uint32_t kb = 1 + static_cast<uint32_t>(rng() % 9);
    const uint64_t seed = rng();
    const std::string err = run_model<CG>(tiles, kb, Mutation::None, seed);
    ASSERT_EQ(err, "") << "cta_group " << CG << ", tiles " << tiles << ", k-blocks " << kb << ", schedule seed "
                       << seed;
  }
}

// A mutation must be caught in at least one of `runs` random schedules.
template <int CG>
void expect_caught(Mutation mut, uint32_t tiles, uint32_t kb, int runs) {
  std::mt19937_64 rng(m3qkv_test::test_seed() ^ 0x5eedull);
  int caught = 0;
  for (int r = 0; r < runs; ++r) caught += run_model<CG>(tiles, kb, mut, rng()) != "";
  EXPECT_GT(caught, 0) << "mutation " << static_cast<int>(mut) << " was never detected at cta_group " << CG;
}

TEST(Sm100Protocol, CtaGroup1RandomSchedules) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(m3qkv_test::test_seed()));
  run_clean<1>(300);
}
TEST(Sm100Protocol, CtaGroup2RandomSchedules) { run_clean<2>(300); }

TEST(Sm100Protocol, MutationsAreDetected) {
  // Scale-factor slot reuse without waiting for the MMAs of g - R (only
  // matters when R < S: cta_group 2).
  expect_caught<2>(Mutation::SkipSfReuseWait, 2, 8, 400);
  // MMA into a buffer while the previous tile still reads the shared columns.
  expect_caught<2>(Mutation::SkipOvlWait, 4, 1, 400);
  // One SFB delivery not counted: the stage completes before all bytes landed
  // (or never, on the next pass).
  expect_caught<2>(Mutation::TxOneChunkShort, 3, 4, 200);
  expect_caught<1>(Mutation::TxOneChunkShort, 3, 4, 200);
  // Accumulator-empty waits wrong or missing.
  expect_caught<1>(Mutation::AccEmptyParityFlipped, 3, 2, 200);
  expect_caught<2>(Mutation::AccEmptyParityFlipped, 3, 2, 200);
  expect_caught<1>(Mutation::SkipAccEmptyWait, 4, 1, 400);
  // (At cta_group 2 a missing accumulator-empty wait is nearly masked by the
  // overlap wait: the hazard needs the overlap owner of tile i-2 to stall
  // through tile i-1's whole MMA and overlap release; random schedules hit
  // it about once in 2000 runs of 6 tiles, too rarely for a unit test.)
}

TEST(Sm100Protocol, RingMatchesFormulas) {
  pipe::Ring<6> r;
  for (uint32_t g = 0; g < 100; ++g, r.advance()) {
    EXPECT_EQ(r.idx, pipe::stage_of(g, 6));
    EXPECT_EQ(r.phase, pipe::full_parity(g, 6));
  }
}

}  // namespace
