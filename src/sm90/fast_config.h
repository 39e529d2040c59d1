// Budgets of the SM90 fp8 fast-mode kernel (src/sm90/fast_sm90.cu,
// docs/sm90.md "fp8 fast mode"): both operands folded to one e8m0 scale per
// 128-K group (the weights once, by m3qkv_prepare_weights_fp8; the
// activations per call, by fold_x into the stream workspace), so one TMA
// stage of 128 B per row is exactly one group: four fp8 wgmma m64n128k32 into
// a group accumulator, then one multiply-add per element into the f32
// accumulator with the two scales (the promotion). The tile, the hand-off to
// an epilogue warpgroup and the register budget are the prefill kernel's
// (prefill_config.h); every byte is derived here once.
#pragma once

#include "sm90/epilogue_regs_sm90.cuh"  // BlockOwners
#include "sm90/kernel_sm90.cuh"

namespace m3qkv::sm90::fast {

// Tile: 128 rows (two consumer warpgroups of wgmma M = 64) x one head.
constexpr int kCons = 2;
constexpr int kBM = kRowsPerWg * kCons;
constexpr int kGroupK = kBK;           // K per stage = K per folded scale
constexpr int kMmaK = 32;              // wgmma K of e4m3 (32 bytes: one descriptor step)
constexpr int kMmasPerStage = kGroupK / kMmaK;
constexpr int kABytes = kBM * kBK;     // x' tile, e4m3
constexpr int kBBytes = kBN * kBK;     // w' tile, e4m3
// Per stage also the group scales as f32, written per call by fold_x into
// the workspace so that a stage brings them in two bulk copies: one per
// tile row (sx, row order) and one per head column (sw, in the consumers'
// order: thread quad q reads columns 8j + 2q + b at q·kSwQuadStride + 2j + b,
// eight 16-B loads; the stride's 4-float pad puts the four quads' loads in
// different banks).
constexpr int kSxBytes = kBM * 4;
constexpr int kSwQuadStride = kBN / 4 + 4;
constexpr int kSwBytes = 4 * kSwQuadStride * 4;
// The consumers' hand-off to the epilogue warpgroup: [kCons][64 registers][128 threads] f32.
constexpr int kHandoffBytes = kCons * 64 * kWarpgroup * 4;
// Warpgroups: 0 producer (one elected thread issues the stage's TMA loads
// and bulk copies), 1..kCons consumers, then the epilogue.
constexpr int kThreads = kWarpgroup * (1 + kCons + 1);
// Barriers: full / empty per stage, hand-off full / empty per consumer.
constexpr int kStages = 4;
constexpr int kBarriers = 2 * kStages + 2 * kCons;

// Shared memory, from a 1024-B aligned base (the 128-B swizzle atom).
constexpr int kAOff = 0;
constexpr int kBOff = kAOff + kStages * kABytes;
constexpr int kSxOff = kBOff + kStages * kBBytes;
constexpr int kSwOff = kSxOff + kStages * kSxBytes;
constexpr int kHandoffOff = kSwOff + kStages * kSwBytes;
constexpr int kBarOff = kHandoffOff + kHandoffBytes;
constexpr int kOwnersOff = kBarOff + 8 * kBarriers;
constexpr uint32_t kOwnersBarrier = 1;  // named barrier of the epilogue warpgroup's owner table
// The consumers' mma turns (named barriers 2, 3; both warpgroups, 256
// threads): warpgroup c issues a stage's wgmma only after the other issued
// its previous one, so one's wgmma runs while the other promotes.
constexpr uint32_t kTurnBarrier0 = 2;
constexpr uint32_t kTurnBarrier1 = 3;
constexpr uint32_t kTurnThreads = kCons * kWarpgroup;
static_assert(kCons == 2, "the turn handshake alternates two consumer warpgroups");
constexpr int kSmemBytes = kOwnersOff + static_cast<int>(sizeof(BlockOwners)) + kSwizzleAtom;  // + alignment slack
static_assert(kSmemBytes <= kSmemLimit,
              "shared memory: 4 stages of 33 KiB + the 64 KiB hand-off + the owner table");
static_assert(kABytes % kSwizzleAtom == 0 && kBBytes % kSwizzleAtom == 0, "tiles 1024-B aligned");
static_assert(kSxOff % 16 == 0 && kSwOff % 16 == 0 && kSxBytes % 16 == 0 && kSwBytes % 16 == 0,
              "bulk copies: 16-B aligned, 16-B multiples");
static_assert(kSwQuadStride % 4 == 0 && (kSwQuadStride / 4) % 2 == 1, "16-B loads; quads 16 B apart in banks");
static_assert(kHandoffOff % 16 == 0 && kOwnersOff % 8 == 0, "vector and 8-B word alignment");
static_assert(kGroupK == 128 && kMmasPerStage == 4, "one folded group per stage: fold::kGroupK");
static_assert(kBM * kSwizzleBytes / kCons % kSwizzleAtom == 0, "each consumer's 64 rows start on a swizzle atom");

// Registers, as in the prefill kernel: 512 threads get 128 each at launch;
// the consumers hold the f32 accumulator and the group accumulator (64 + 64).
constexpr int kLaunchRegs = (65536 / kThreads) & ~7;
constexpr int kProducerRegs = 40;   // the TMA thread
constexpr int kConsumerRegs = 152;  // two 64-register accumulators and the promotion
constexpr int kEpilogueRegs = 168;  // the register epilogue (prefill_config.h)
static_assert(kProducerRegs + kCons * kConsumerRegs + kEpilogueRegs <= kLaunchRegs * (2 + kCons),
              "setmaxnreg: the pool allocated at launch covers the increased warpgroups");
static_assert(kProducerRegs % 8 == 0 && kConsumerRegs % 8 == 0 && kEpilogueRegs % 8 == 0, "setmaxnreg granule");

// The call's workspace body: x' [M][K] e4m3, then sx [m_blocks][K/128][kBM]
// and sw [heads][K/128][kSwBytes / 4] f32 (16-B aligned: K % 128 == 0).
struct Workspace {
  size_t sx_off, sw_off, bytes;
};
constexpr Workspace workspace(int64_t m, int64_t heads, int64_t k) {
  const int64_t m_blocks = (m + kBM - 1) / kBM, ks = k / kBK;
  const size_t sx_off = static_cast<size_t>(m * k);
  const size_t sw_off = sx_off + static_cast<size_t>(m_blocks * ks * kSxBytes);
  return Workspace{sx_off, sw_off, sw_off + static_cast<size_t>(heads * ks * kSwBytes)};
}

// fold_x: one thread per (row, 128-K group) of x (padding rows: scale 1.0),
// then per (weight row, group) of the scales; grid-stride over at most
// kFoldCtasPerSm CTAs per SM.
constexpr int kFoldThreads = 256;
constexpr int kFoldCtasPerSm = 8;

}  // namespace m3qkv::sm90::fast
