// Compile-time configuration of the SM90 decode kernel (decode_sm90.cu) and
// the parameters the launcher passes to it. Every shared-memory byte is placed
// here once, with static asserts; docs/sm90_decode.md explains the choices.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "common/epilogue.cuh"
#include "sm90/decode_plan.h"

namespace m3qkv::sm90::decode {

constexpr int kWarpgroup = 128;
constexpr int kConsumerWarpgroups = 2;  // two m64 halves of the 128-row head (the wgmma M side)
constexpr int kConsumerThreads = kConsumerWarpgroups * kWarpgroup;
constexpr int kConsumerWarps = kConsumerThreads / 32;
// Warpgroups 0-1 are the consumers (wgmma needs warpgroups at warp indices
// that are multiples of 4), warpgroup 2 the producer: one elected lane of its
// first warp issues the copies, and the whole warpgroup gives registers to the
// consumers (setmaxnreg works per warpgroup). At launch 384 threads get 168
// registers each (65536 / 384, rounded down to the granule of 8).
constexpr int kProducerWarp = kConsumerWarps;
constexpr int kThreads = kConsumerThreads + kWarpgroup;
constexpr int kLaunchRegs = (65536 / kThreads) & ~7;
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 240;
static_assert(kProducerRegs * kWarpgroup + kConsumerRegs * kConsumerThreads <= kLaunchRegs * kThreads,
              "setmaxnreg: the registers allocated at launch cover the increased consumers");
constexpr int kHeadRows = 128;   // weight rows per unit (one head)
constexpr int kBK = 128;         // K per TMA stage: 128 B of e4m3 per row, one 512-B scale chunk
constexpr int kStepK = 64;       // K per wgmma step: one 128-B swizzle row of bf16 per token
constexpr int kStepsPerStage = kBK / kStepK;
constexpr int kMmaK = 16;        // bf16 wgmma K
constexpr int kMmasPerStep = kStepK / kMmaK;
constexpr int kSfChunk = 512;    // F8_128x4: 128 rows × 4 scale columns (one stage) contiguous
constexpr int kSwizzleAtom = 1024;
constexpr int kSmemLimit = 232448;  // sm_90 opt-in dynamic shared memory per block (227 KiB)
constexpr int kBarrierNamed = 1;    // bar.sync id of the consumer warpgroups (0 is __syncthreads)
static_assert(kBK == 4 * kMxBlock, "one F8_128x4 chunk (4 scale columns) per stage");
static_assert(kStepK * 2 == 128, "a step's bf16 token row is one 128-byte swizzle row");

// The K permutation inside a 64-K step (decode_sm90.cu, "K permutation"),
// written as formulas the CPU test (tests/cpu/test_decode_plan.cpp) checks
// against the PTX A-fragment layout. Quad lane q holds physical weight bytes
// [16q, 16q + 16) of its rows; element e (0..7) of its A fragment for k16
// step s is physical byte decode_a_byte(q, s, e) of row r + 8·((e / 2) % 2).
constexpr int decode_a_byte(int q, int s, int e) { return 16 * q + 4 * s + 2 * (e / 4) + (e % 2); }
// The logical column (0..63 within the step: k16 step = column / 16) that
// physical byte p feeds, in A as in B: the converter writes activation byte p
// of a token to this column of its bf16 row.
constexpr int decode_logical_col(int p) { return 16 * ((p % 16) / 4) + 8 * ((p % 4) / 2) + 2 * (p / 16) + p % 2; }

// The bf16 B ring: one buffer per 64-K step (NT token rows × 64 bf16), two
// per stage, for three stages. The consumers convert a whole stage, meet at
// one barrier, then issue its 8 wgmmas; stage i writes the buffers of stage
// i - 3, whose group both warpgroups retired (wait_group 1 at the end of
// stage i - 2) before the barrier of stage i - 1 (decode_sm90.cu, "Ordering").
constexpr int kBStageSlots = 3;
constexpr int kBBuffers = kBStageSlots * 2;

// Test-only timeline (decode_set_trace): one %globaltimer stamp per event and
// CTA; "last" events are taken on the CTA's last unit.
enum TraceEvent : int {
  kTrEntry = 0,      // kernel entry (thread 0)
  kTrSetup,          // producer: barriers initialized, registers moved (before the tensor-map prefetch)
  kTrPdlDone,        // producer: after griddepcontrol.wait
  kTrFirstFull,      // consumer thread 0: first stage landed
  kTrMainDone,       // consumer thread 0: last unit's mainloop (wgmma) done
  kTrArrived,        // consumer thread 0: last unit's partial stored and counted
  kTrEpiDone,        // consumer thread 0: last unit finished (reduction + epilogue if last arriver)
  kTrUnits,          // value: units this CTA walked
  kTrLastArrivals,   // value: units for which this CTA was the last arriver
  kTraceEvents = 10
};

template <int NT>
struct Config {
  static_assert(NT == 16 || NT == 32 || NT == 64 || NT == 128, "token block = wgmma N");
  static constexpr int kNt = NT;
  static constexpr int kAccRegs = NT / 2;  // f32 accumulators per thread (m64 × NT per warpgroup)

  // ---- shared memory --------------------------------------------------------
  // [B ring: kBBuffers × NT × 128 B, its first NT × 512 B aliased by the reduction tile T: NT × 128 f32]
  // [stages × (W: 128 × 128 e4m3 | X: NT × 128 e4m3 | wsf chunk | xsf chunk)]
  // [full[kStages] | empty[kStages] | unit flag word]
  static constexpr int kBBufBytes = NT * kStepK * 2;
  static constexpr int kRingBytes = kBBuffers * kBBufBytes;
  static constexpr int kTileBytes = NT * kHeadRows * 4;  // reduction tile T
  static_assert(kRingBytes >= kTileBytes, "T fits in the B ring it aliases");
  static constexpr int kWBytes = kHeadRows * kBK;
  static constexpr int kXBytes = NT * kBK;
  static constexpr int kStageBytes = kWBytes + kXBytes + 2 * kSfChunk;
  static constexpr int kTxBytes = kStageBytes;  // every byte of a stage arrives by TMA / bulk copy
  static constexpr int kMaxStages = 8;
  static constexpr int kBarrierBytes = 2 * kMaxStages * 8 + 16;
  static constexpr int kAlignSlack = kSwizzleAtom;  // dynamic smem base rounded up to 1024 B
  static constexpr int kStagesFit = (kSmemLimit - kAlignSlack - kBarrierBytes - kRingBytes) / kStageBytes;
  static constexpr int kStages = kStagesFit > kMaxStages ? kMaxStages : kStagesFit;
  static constexpr int kRingOff = 0;
  static constexpr int kStageOff = kRingOff + kRingBytes;
  static constexpr int kBarOff = kStageOff + kStages * kStageBytes;
  static constexpr int kSmemBytes = kAlignSlack + kBarOff + kBarrierBytes;
  // in-stage offsets
  static constexpr int kWOff = 0;
  static constexpr int kXOff = kWBytes;
  static constexpr int kWsfOff = kWBytes + kXBytes;
  static constexpr int kXsfOff = kWsfOff + kSfChunk;

  static_assert(kStages >= 3, "at least 3 stages (48 KiB of weights) in flight per SM");
  static_assert(kSmemBytes <= kSmemLimit, "shared memory budget");
  static_assert(kBBufBytes % kSwizzleAtom == 0, "B buffers: 1024-B aligned 128B-swizzle atoms");
  static_assert(kStageOff % kSwizzleAtom == 0 && kStageBytes % kSwizzleAtom == 0 && kXOff % kSwizzleAtom == 0,
                "TMA destinations: the 128B-swizzled X tile needs 1024-B alignment");
  static_assert(kWsfOff % 16 == 0 && kXsfOff % 16 == 0, "bulk-copy destinations 16-B aligned");
  // > half of the SM's shared memory: one CTA per SM, whose register file the
  // setmaxnreg split above divides.
  static_assert(2 * kSmemBytes > kSmemLimit, "one CTA per SM");
};

// Everything the kernel needs besides the two tensor maps.
struct Params {
  int32_t m;             // tokens
  int32_t heads;         // N / 128
  int32_t k_stages;      // K / 128 (= Kt of the F8_128x4 layouts)
  int32_t token_blocks;  // ceil(M / NT)
  int32_t split;         // S
  int32_t units;         // heads · token_blocks · split
  const uint8_t* xsf;    // F8_128x4 [ceil(M/128)·128, K/32]
  const uint8_t* wsf;    // F8_128x4 [N, K/32]
  uint32_t* counters;    // workspace: [heads · token_blocks] arrival counters, zero between launches
  float* partials;       // workspace: [units][NT][128] f32 partial slots
  float* acc_tap;        // test only: f32 accumulator [M, N], or null
  int64_t n;             // N (tap row stride)
  epi::EpilogueParams epi;
  uint64_t* trace;       // test only: [trace_ctas][kTraceEvents] stamps (ns), or null
  int32_t trace_ctas;
};

// Unit u of this launch (splitk::unit_of: (head · token_blocks + token block) · split + s).
__host__ __device__ inline splitk::Unit unit_of(const Params& p, int u) {
  return splitk::unit_of(u, p.token_blocks, p.split, p.k_stages);
}

// Host entry points of decode_sm90.cu.
cudaError_t prepare_decode();  // cudaFuncSetAttribute (max dynamic smem) of every instance
// nt = 16, 32, 64 or 128 (the plan's token block); tmap_w: wq [N, K] box
// 128 x 128 without swizzle, tmap_x: xq [M, K] box 128 x nt with the 128-B swizzle.
// Test-only timeline: while set, every decode launch writes kTraceEvents
// stamps per CTA for CTAs 0..ctas-1 into buffer[cta * kTraceEvents + event].
void decode_set_trace(uint64_t* device_buffer, int ctas);
m3qkv_status launch_decode(int nt, const CUtensorMap& tmap_w, const CUtensorMap& tmap_x, const Params& p, int grid,
                           bool pdl, cudaStream_t s);

}  // namespace m3qkv::sm90::decode
