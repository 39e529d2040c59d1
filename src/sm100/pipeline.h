// Phase arithmetic of the SM100 kernel's pipelines, written once (host +
// device) so that the kernel and the CPU protocol test
// (tests/cpu/test_sm100_protocol.cpp) use the same formulas.
//
// mbarrier parity waits (PTX ISA §9.7.13.15.16 mbarrier.try_wait.parity):
// waiting for parity p returns once the phase with parity p has completed; on
// a fresh barrier (phase 0 in progress) waiting for parity 1 returns at once.
#pragma once

#include <stdint.h>

#include "common/ring.h"
#include "sm100/desc.h"  // M3_SM100_HDC

namespace m3qkv::sm100::pipe {

// ---------------------------------------------------------------- operand ring
// Producer and MMA walk the same sequence of k-blocks g = 0, 1, ... over all
// tiles of the CTA; k-block g uses stage g % S in ring pass g / S.
M3_SM100_HDC uint32_t stage_of(uint32_t g, uint32_t S) { return g % S; }
// MMA: wait until the TMA bytes of k-block g arrived (phase g / S of full[s]).
M3_SM100_HDC uint32_t full_parity(uint32_t g, uint32_t S) { return (g / S) & 1u; }
// Producer: before refilling stage s with k-block g, the MMAs of k-block
// g - S must have completed (phase g / S - 1 of empty[s]); first pass free.
M3_SM100_HDC uint32_t empty_parity(uint32_t g, uint32_t S) { return ((g / S) & 1u) ^ 1u; }
// The commit of the MMAs of k-block g completes phase g / S of empty[g % S].
M3_SM100_HDC uint32_t commit_parity(uint32_t g, uint32_t S) { return (g / S) & 1u; }

// Incremental form of (stage_of, full_parity) used in the hot loops: the
// library's one stage ring (src/common/ring.h).
using m3qkv::Ring;

// ------------------------------------------------------- scale-factor slots
// k-block g's scale factors live in TMEM slot g % R. tcgen05.mma -> tcgen05.cp
// is not an ordered pair, so before the cp of k-block g (g >= R) the MMA
// thread waits for the commit of k-block g - R (R <= S).
M3_SM100_HDC uint32_t sf_slot(uint32_t g, uint32_t R) { return g % R; }
M3_SM100_HDC bool sf_reuse_wait(uint32_t g, uint32_t R) { return g >= R; }
M3_SM100_HDC uint32_t sf_reuse_stage(uint32_t g, uint32_t R, uint32_t S) { return stage_of(g - R, S); }
M3_SM100_HDC uint32_t sf_reuse_parity(uint32_t g, uint32_t R, uint32_t S) { return commit_parity(g - R, S); }

// ------------------------------------------------------ accumulator buffers
// Tile i of the CTA (local counter) uses buffer i & 1 for the (i >> 1)-th time.
M3_SM100_HDC uint32_t acc_buf(uint32_t i) { return i & 1u; }
// Epilogue: wait for the MMA commit of tile i (phase i >> 1 of tmem_full[b]).
M3_SM100_HDC uint32_t acc_full_parity(uint32_t i) { return (i >> 1) & 1u; }
// MMA: before tile i, tile i - 2's epilogue has read buffer b (phase
// (i >> 1) - 1 of tmem_empty[b]); first use free.
M3_SM100_HDC uint32_t acc_empty_parity(uint32_t i) { return ((i >> 1) & 1u) ^ 1u; }
// cta_group 2 (overlapping buffers): before tile i > 0, tile i - 1 has read
// the shared columns of its buffer (phase (i - 1) >> 1 of tmem_ovl[(i-1) & 1]).
M3_SM100_HDC bool ovl_wait(uint32_t i, bool overlapping) { return overlapping && i > 0; }
M3_SM100_HDC uint32_t ovl_wait_buf(uint32_t i) { return (i - 1) & 1u; }
M3_SM100_HDC uint32_t ovl_wait_parity(uint32_t i) { return ((i - 1) >> 1) & 1u; }
// Which epilogue warpgroup owns the shared columns of buffer b, and which of
// its four 32-column chunks they are: buffer 0 = [0, 256) -> head 1 columns
// 96..127 (chunk 3); buffer 1 = [224, 480) -> head 0 columns 0..31 (chunk 0).
M3_SM100_HDC uint32_t overlap_owner_wg(uint32_t b) { return b == 0 ? 1u : 0u; }
M3_SM100_HDC uint32_t overlap_chunk(uint32_t b) { return b == 0 ? 3u : 0u; }

}  // namespace m3qkv::sm100::pipe
