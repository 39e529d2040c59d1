// The work plan of the split-K decode kernels (src/sm90/decode_sm90.cu and
// src/sm100/decode_sm100.cu): a pure host function of the shapes, the SM count
// and the kernel's limits (a Target), unit-tested on the CPU
// (tests/cpu/test_decode_plan.cpp). docs/sm90.md and docs/sm100.md
// ("Decode variant") explain the design.
//
// Both kernels compute D = W·Xᵀ with the weights as the MMA's M side (one
// head of 128 rows) and the tokens as N (a token block of nt tokens). A work
// unit is (head, token block, split s): K stages [ks·s/S, ks·(s+1)/S) of one
// head for one token block. A persistent grid of `grid` CTAs takes units
// blockIdx.x, blockIdx.x + grid, ...; every unit writes its f32 partial
// [nt][128] to a workspace slot and counts itself on the (head, token block)
// counter; the unit that arrives last sums the S partials in the fixed order
// s = 0, 1, ..., S-1 (so the bytes do not depend on which CTA finishes last)
// and runs the epilogue (src/common/splitk_reduce.cuh).
#pragma once

#include <stdint.h>

#include "common/numerics.h"  // M3_HD

namespace m3qkv::splitk {

// What a decode kernel can run, and the plan's policy for it.
struct Target {
  int token_blocks[4];   // token block widths the kernel is instantiated for (MMA N), ascending
  int num_token_blocks;  // entries used in token_blocks
  int64_t max_m;         // largest M the kernel takes (multiple token blocks above the widest)
  int max_split;         // most splits considered (a unit is at least one 128-K stage)
  // At least this percentage of the SMs (of the grid cap) get a unit whenever
  // some split allows it: among such splits the cheapest is taken, otherwise
  // the cheapest of all. 0: the cost model alone decides.
  int min_busy_percent;
  // Largest partial-slot workspace a plan may take (bytes); 0 = unbounded.
  // Splits that need more are not considered (S = 1 needs none).
  int64_t max_partial_bytes = 0;
};

struct Plan {
  int nt = 0;                 // tokens per block (MMA N); 0 = no plan
  int token_blocks = 0;       // ceil(M / nt)
  int split = 0;              // S: units per (head, token block)
  int64_t units = 0;          // heads · token_blocks · split
  int grid = 0;               // persistent CTAs
  int max_unit_stages = 0;    // ceil(ks / S)
  int64_t counter_bytes = 0;  // arrival counters, one uint32 per (head, token block), rounded to 256 B
  int64_t slot_floats = 0;    // one partial slot: nt × 128 f32
  int64_t partial_bytes = 0;  // the partial slots: units × slot_floats f32
  // > 1 (SM90 only, sm90::cluster_plan): the S units of a (head, token block)
  // run as one cluster of S CTAs and meet through distributed shared memory:
  // no counters, no partial slots (both 0).
  int cluster = 0;
  // (SM90 only, sm90::cluster_plan) an L2 plan whose units all run at once
  // (units <= grid, a cooperative launch): the S units of a (head, token
  // block) wait for each other and each finishes a share of its rows
  // (splitk::finish_unit_ranks) instead of the last arriver finishing all.
  bool spread = false;
};
// Whether the plan's partials meet through the workspace in L2.
constexpr bool reduces_through_l2(const Plan& p) { return p.split > 1 && p.cluster <= 1; }

// Stage range [k0, k1) of split s of S over ks stages (balanced: sizes differ by at most one).
constexpr int k0(int ks, int s, int S) { return static_cast<int>(static_cast<int64_t>(ks) * s / S); }
// Tokens of token block tb (nt wide) in a call of m tokens (the decode kernels' 32-bit m).
constexpr int block_tokens(int m, int tb, int nt) { return m - tb * nt < nt ? m - tb * nt : nt; }

// Unit u = (head · token_blocks + token block) · split + s.
struct Unit {
  int head, tb, s;
  int k0, k1;  // K stages [k0, k1)
};
M3_HD Unit unit_of(int u, int token_blocks, int split, int ks) {
  Unit w;
  w.s = u % split;
  const int ht = u / split;
  w.tb = ht % token_blocks;
  w.head = ht / token_blocks;
  w.k0 = k0(ks, w.s, split);
  w.k1 = k0(ks, w.s + 1, split);
  return w;
}

// Modelled time of a plan, in 1/64 of one 128-K stage of one CTA (16 KiB of
// weights at the SM's share of the HBM bandwidth: ~0.5 µs on the H200, ~0.3
// µs on a B200): the busiest CTA's stages (bounded by units per CTA × the
// longest unit, exact when S divides ks), plus half a stage per unit it walks
// (partial store, arrival, pipeline hand-off), plus the last arriver's read
// of the S partials of its token block from L2 (S · tokens · 512 B, assumed
// at ~3× the per-SM HBM stream rate). The constants are estimates (H200
// timeline, docs/sm90.md), not a fit.
constexpr int64_t cost_x64(int64_t units_per_cta, int unit_stages, int S, int64_t tokens_in_block) {
  return units_per_cta * unit_stages * 64 + units_per_cta * 32 + static_cast<int64_t>(S) * tokens_in_block * 2 / 3;
}

// The plan of target `t` for M tokens (1 <= m <= t.max_m), `heads` heads of
// 128 rows, K = 128·ks, on `num_sms` SMs. split_override > 0 forces S (clamped
// to [1, min(ks, t.max_split)]; the busy rule does not apply); grid_override
// > 0 caps the grid (and the busy rule then counts against that cap).
inline Plan plan(const Target& t, int64_t m, int heads, int ks, int num_sms, int split_override = 0,
                 int grid_override = 0) {
  Plan p;
  if (t.num_token_blocks < 1 || m < 1 || m > t.max_m || heads < 1 || ks < 1 || num_sms < 1) return p;
  // The narrowest block that holds M (the widest above it: several blocks).
  const int widest = t.token_blocks[t.num_token_blocks - 1];
  const int64_t need = m < widest ? m : widest;
  p.nt = widest;
  for (int i = 0; i < t.num_token_blocks; ++i)
    if (t.token_blocks[i] >= need) {
      p.nt = t.token_blocks[i];
      break;
    }
  p.token_blocks = static_cast<int>((m + p.nt - 1) / p.nt);
  const int64_t tokens = m < p.nt ? m : p.nt;  // tokens of the fullest block
  const int max_split = ks < t.max_split ? ks : t.max_split;
  const int64_t cap = grid_override > 0 ? grid_override : num_sms;
  const int64_t busy = (cap * t.min_busy_percent + 99) / 100;
  const int s_lo = split_override > 0 ? (split_override < max_split ? split_override : max_split) : 1;
  const int s_hi = split_override > 0 ? s_lo : max_split;
  int best_s = 0, best_any = 0;
  int64_t best_cost = -1, best_any_cost = -1;
  for (int S = s_lo; S <= s_hi; ++S) {
    const int64_t units = static_cast<int64_t>(heads) * p.token_blocks * S;
    if (S > 1 && t.max_partial_bytes > 0 && units * p.nt * 128 * 4 > t.max_partial_bytes) {
      if (S == s_lo) {  // a forced split that does not fit: the largest that does
        int fit = S;
        while (fit > 1 && static_cast<int64_t>(heads) * p.token_blocks * fit * p.nt * 512 > t.max_partial_bytes) --fit;
        p.split = fit;
        break;
      }
      continue;
    }
    const int64_t grid = units < cap ? units : cap;
    const int64_t units_per_cta = (units + grid - 1) / grid;
    const int unit_stages = (ks + S - 1) / S;
    const int64_t cost = cost_x64(units_per_cta, unit_stages, S, tokens);
    if (best_any_cost < 0 || cost < best_any_cost) {
      best_any_cost = cost;
      best_any = S;
    }
    if ((split_override > 0 || grid >= busy) && (best_cost < 0 || cost < best_cost)) {
      best_cost = cost;
      best_s = S;
    }
  }
  if (p.split == 0) p.split = best_s > 0 ? best_s : best_any;
  p.units = static_cast<int64_t>(heads) * p.token_blocks * p.split;
  p.grid = static_cast<int>(p.units < cap ? p.units : cap);
  p.max_unit_stages = (ks + p.split - 1) / p.split;
  const int64_t counters = static_cast<int64_t>(heads) * p.token_blocks;
  p.counter_bytes = (counters * 4 + 255) / 256 * 256;
  p.slot_floats = static_cast<int64_t>(p.nt) * 128;
  p.partial_bytes = p.units * p.slot_floats * 4;
  return p;
}

// plan() behind a one-entry memo per thread, for the launchers: serving
// repeats the previous call's shape, and plan()'s search over up to 64 splits
// cost ~0.3 µs of the decode call's host time on the H200 host (docs/host.md).
// Keyed by every argument (the target by address: the launchers pass their
// constexpr target), so the result is plan()'s whatever the call sequence
// (tests/cpu/test_decode_plan.cpp).
inline Plan plan_memo(const Target& t, int64_t m, int heads, int ks, int num_sms, int split_override = 0,
                      int grid_override = 0) {
  struct Entry {
    const Target* t = nullptr;
    int64_t m = 0;
    int heads = 0, ks = 0, num_sms = 0, split_override = 0, grid_override = 0;
    Plan plan;
  };
  thread_local Entry e;
  if (e.t != &t || e.m != m || e.heads != heads || e.ks != ks || e.num_sms != num_sms ||
      e.split_override != split_override || e.grid_override != grid_override) {
    e.t = nullptr;  // a throwing plan() cannot leave a half-written key (plan() does not throw)
    e.plan = plan(t, m, heads, ks, num_sms, split_override, grid_override);
    e.m = m, e.heads = heads, e.ks = ks, e.num_sms = num_sms;
    e.split_override = split_override, e.grid_override = grid_override;
    e.t = &t;
  }
  return e.plan;
}

}  // namespace m3qkv::splitk
