// Budgets of the SM90 prefill kernel (src/sm90/prefill_sm90.cu, docs/sm90.md
// "Prefill step 2"): both operands arrive in bf16 (x̂ and ŵ, converted once
// per call by the grid itself into the stream workspace before its mainloop,
// convert_sm90.cuh), so no warpgroup converts anything in the mainloop, and
// the warps that variant A spends on the transform run the epilogue instead,
// overlapped with the next tile.
// Every shared-memory byte and register budget derived here, once.
#pragma once

#include "sm90/epilogue_regs_sm90.cuh"  // BlockOwners
#include "sm90/kernel_sm90.cuh"

namespace m3qkv::sm90::prefill {

// Tile: 128 rows (two consumer warpgroups of wgmma M = 64) x one head.
constexpr int kCons = 2;
constexpr int kBM = kRowsPerWg * kCons;
// K per stage: one 128-byte swizzle row of bf16 per tile row (the layout
// wgmma's K-major descriptor with the 128-B swizzle reads, as TMA writes it).
constexpr int kBK = kSwizzleBytes / 2;
constexpr int kABytes = kBM * kBK * 2;  // x̂ tile
constexpr int kBBytes = kBN * kBK * 2;  // ŵ tile
constexpr int kStageBytes = kABytes + kBBytes;
// The consumers' hand-off to the epilogue warpgroup: [kCons][64 registers][128 threads] f32.
constexpr int kHandoffBytes = kCons * 64 * kWarpgroup * 4;
// Warpgroups: 0 producer (one elected thread issues both TMA loads of a
// stage), 1..kCons consumers, then the epilogue.
constexpr int kThreads = kWarpgroup * (1 + kCons + 1);
// Barriers: full/empty per stage, hand-off full/empty per consumer warpgroup.
constexpr int kStages = 5;
constexpr int kBarriers = 2 * kStages + 2 * kCons;

// Shared memory, from a 1024-B aligned base (the 128-B swizzle atom).
constexpr int kAOff = 0;
constexpr int kBOff = kAOff + kStages * kABytes;
constexpr int kHandoffOff = kBOff + kStages * kBBytes;
constexpr int kBarOff = kHandoffOff + kHandoffBytes;
// The epilogue warpgroup's slot-owner table of the block it finishes next
// (epilogue_regs_sm90.cuh block_owners), built while the consumers run, at
// named barrier kOwnersBarrier (0 is __syncthreads).
constexpr int kOwnersOff = kBarOff + 8 * kBarriers;
constexpr uint32_t kOwnersBarrier = 1;
constexpr int kSmemBytes = kOwnersOff + static_cast<int>(sizeof(BlockOwners)) + kSwizzleAtom;  // + the alignment slack
static_assert(kSmemBytes <= kSmemLimit,
              "shared memory budget: 5 stages of 32 KiB + the 64 KiB hand-off + the 1.5 KiB owner table");
static_assert(kOwnersOff % 8 == 0, "owner table: 8-B words");
static_assert(kABytes % kSwizzleAtom == 0 && kBBytes % kSwizzleAtom == 0, "tiles 1024-B aligned");
static_assert(kBK * 2 == kSwizzleBytes, "one swizzle row of bf16 per tile row and stage");
static_assert(kABytes == kBM * kSwizzleBytes && kBBytes == kBN * kSwizzleBytes, "produce_bf16's stage strides");
static_assert(kBM * kBK * 2 / kCons % kSwizzleAtom == 0, "each consumer's 64 rows start on a swizzle atom");

// Registers: 512 threads get 128 each at launch (65536 / 512); wgmma
// m64n128k16 with its 64 accumulators needs >= 90 where it is compiled, so
// the launch count must stay >= 96 (a sixth warpgroup would leave 80: why
// variant A's transform and this epilogue warpgroup cannot coexist).
constexpr int kLaunchRegs = (65536 / kThreads) & ~7;
constexpr int kProducerRegs = 40;   // one TMA thread
constexpr int kConsumerRegs = 152;  // the accumulator and the mainloop, no epilogue
constexpr int kEpilogueRegs = 168;  // the register epilogue of two rows at a time (as variant A's consumers)
static_assert(kLaunchRegs >= 96, "wgmma m64n128 needs >= 90 registers at the launch count");
static_assert(kProducerRegs + kCons * kConsumerRegs + kEpilogueRegs <= kLaunchRegs * (2 + kCons),
              "setmaxnreg: the pool allocated at launch covers the increased warpgroups");
static_assert(kProducerRegs % 8 == 0 && kConsumerRegs % 8 == 0 && kEpilogueRegs % 8 == 0, "setmaxnreg granule");

}  // namespace m3qkv::sm90::prefill
