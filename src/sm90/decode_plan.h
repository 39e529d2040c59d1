// The work plan of the SM90 decode kernel (src/sm90/decode_sm90.cu), a pure
// host function of the shapes and the SM count, unit-tested on the CPU
// (tests/cpu/test_decode_plan.cpp). docs/sm90_decode.md explains the design.
//
// The decode kernel computes D = W·Xᵀ with the weights as the wgmma M side
// (one 128-row head = two m64 warpgroups) and the tokens as N (a token block
// of nt = 16, 32, 64 or 128 tokens). Its work unit is (head, token block,
// split s): K stages [ks·s/S, ks·(s+1)/S) of one head for one token block. A
// persistent grid of `grid` CTAs takes units blockIdx.x, blockIdx.x + grid, ...;
// every unit writes its f32 partial [tokens][128] to a workspace slot and
// counts itself on the (head, token block) counter; the unit that arrives
// last sums the S partials in the fixed order s = 0, 1, ..., S-1 (so the bytes
// do not depend on which CTA finishes last) and runs the epilogue.
#pragma once

#include <stdint.h>

namespace m3qkv::sm90 {

// Token block widths the kernel is instantiated for (wgmma N).
constexpr int kDecodeTokenBlocks[] = {16, 32, 64, 128};
constexpr int kDecodeMaxTokenBlock = 128;
// Largest M the decode plan covers: two token blocks of 128. Above, the
// weights would be converted once per token block (re-read from L2) four or
// more times, where the tile kernel converts them once per 64 rows anyway.
constexpr int64_t kDecodeMaxM = 2 * kDecodeMaxTokenBlock;
// Whether the decode kernel beats the tile kernel (split-K over a cluster)
// for M tokens and `heads` heads of 128 rows at K = 6144, read off the
// crossover bench on the H200 (bench/RESULTS.md v6, sm90_decode/sm90_tile,
// cold L2, graph replay, µs decode / tile):
//   heads  M=32        M=64        M=128       M=256
//   12     16.9/20.2   21.8/20.0   38.1/23.1   40.9/34.8   (TP8)
//   20     18.1/22.0   24.0/21.9   38.5/34.8   47.5/60.4   (TP4)
//   39     24.0/28.8   30.2/28.6   47.2/49.7   87.4/94.6   (TP2)
//   77     50.4/50.8   68.4/50.2   87.0/95.6   278/146     (TP1)
// M <= 32 always (token blocks of 16 or 32: the tile kernel pads to 64 rows);
// 33..64 never (the 64-token block's dequantization is not amortized enough);
// 65..128 from 32 heads up, 129..256 for 16..48 heads. The table is the rule
// until a model of both kernels replaces it; the margins under 10 % (TP1 M=32,
// TP2 M=64/128) are within run-to-run spread.
constexpr bool decode_preferred(int64_t m, int heads) {
  if (m < 1 || m > kDecodeMaxM) return false;
  if (m <= 32) return true;
  if (m <= 64) return false;
  if (m <= 128) return heads >= 32;
  return heads >= 16 && heads <= 48;
}
// Most splits the plan considers (a unit is at least one 128-K stage).
constexpr int kDecodeMaxSplit = 64;

struct DecodePlan {
  int nt = 0;            // tokens per block (wgmma N): 16, 32, 64, 128
  int token_blocks = 0;  // ceil(M / nt)
  int split = 0;         // S: units per (head, token block)
  int64_t units = 0;     // heads · token_blocks · split
  int grid = 0;          // persistent CTAs (one per SM at most)
  int max_unit_stages = 0;   // ceil(ks / S)
  int64_t counter_bytes = 0; // arrival counters, one uint32 per (head, token block), rounded to 256 B
  int64_t slot_floats = 0;   // one partial slot: nt × 128 f32
  int64_t workspace_bytes = 0;
};

// Stage range [k0, k1) of split s of S over ks stages (balanced: sizes differ by at most one).
constexpr int decode_k0(int ks, int s, int S) { return static_cast<int>(static_cast<int64_t>(ks) * s / S); }

// Modelled time of a plan, in 1/64 of one 128-K stage of one CTA (~0.5 µs on
// the H200: 16 KiB of weights at ~32 GB/s per SM): the busiest CTA's stages
// (bounded by units per CTA × the longest unit, exact when S divides ks),
// plus half a stage per unit it walks (partial store, arrival, pipeline
// hand-off), plus the last arriver's read of the S partials of its token
// block from L2 (S · tokens · 512 B, assumed at ~3× the per-SM HBM stream
// rate: ~100 GB/s per SM). The constants are estimates, to be refitted from
// the H200 timeline (docs/sm90_decode.md).
constexpr int64_t decode_plan_cost_x64(int64_t units_per_cta, int unit_stages, int S, int64_t tokens_in_block) {
  return units_per_cta * unit_stages * 64 + units_per_cta * 32 + static_cast<int64_t>(S) * tokens_in_block * 2 / 3;
}

// The plan for M tokens (1 <= m <= kDecodeMaxM), `heads` heads of 128 rows,
// K = 128·ks, on `num_sms` SMs. split_override > 0 forces S (clamped to
// [1, min(ks, kDecodeMaxSplit)]); grid_override > 0 caps the grid.
inline DecodePlan plan_decode(int64_t m, int heads, int ks, int num_sms, int split_override = 0,
                              int grid_override = 0) {
  DecodePlan p;
  if (m < 1 || m > kDecodeMaxM || heads < 1 || ks < 1 || num_sms < 1) return p;  // nt = 0: no plan
  p.nt = m <= 16 ? 16 : m <= 32 ? 32 : m <= 64 ? 64 : 128;
  p.token_blocks = static_cast<int>((m + p.nt - 1) / p.nt);
  const int64_t tokens = m < p.nt ? m : p.nt;  // tokens of the fullest block
  const int max_split = ks < kDecodeMaxSplit ? ks : kDecodeMaxSplit;
  const int64_t cap = grid_override > 0 ? grid_override : num_sms;
  int best_s = 1;
  int64_t best_cost = -1;
  const int s_lo = split_override > 0 ? (split_override < max_split ? split_override : max_split) : 1;
  const int s_hi = split_override > 0 ? s_lo : max_split;
  for (int S = s_lo; S <= s_hi; ++S) {
    const int64_t units = static_cast<int64_t>(heads) * p.token_blocks * S;
    const int64_t grid = units < cap ? units : cap;
    const int64_t units_per_cta = (units + grid - 1) / grid;
    const int unit_stages = (ks + S - 1) / S;
    const int64_t cost = decode_plan_cost_x64(units_per_cta, unit_stages, S, tokens);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best_s = S;
    }
  }
  p.split = best_s;
  p.units = static_cast<int64_t>(heads) * p.token_blocks * p.split;
  p.grid = static_cast<int>(p.units < cap ? p.units : cap);
  p.max_unit_stages = (ks + p.split - 1) / p.split;
  const int64_t counters = static_cast<int64_t>(heads) * p.token_blocks;
  p.counter_bytes = (counters * 4 + 255) / 256 * 256;
  p.slot_floats = static_cast<int64_t>(p.nt) * 128;
  p.workspace_bytes = p.counter_bytes + p.units * p.slot_floats * 4;
  return p;
}

}  // namespace m3qkv::sm90
