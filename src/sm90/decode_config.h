// Compile-time configuration of the SM90 swap-AB kernel (decode_sm90.cu), the
// one SM90 mainloop for every M, and the parameters the launcher passes to
// it. Every shared-memory byte, barrier and register budget is placed here
// once, with static asserts; docs/sm90.md explains the choices.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "common/epilogue.cuh"
#include "sm90/decode_plan.h"
#include "sm90/sm90.h"

namespace m3qkv::sm90::decode {

// ---- roles ------------------------------------------------------------------
// Warpgroups 0-1: consumers, rows 0-63 / 64-127 of the head (the wgmma M
// side; wgmma needs warpgroups at warp indices that are multiples of 4). They
// dequantize the weights straight into A-fragment registers and issue wgmma.
// Warpgroup 2: warp 8 is the TMA producer (one elected lane), warps 9-11 the
// activation transform of e4m3 activations: raw x (e4m3 + scales) of a stage
// -> the bf16 B tile of a B slot. bf16 activations are TMA-written straight
// into the B layout: no transform.
constexpr int kWarpgroup = 128;
constexpr int kConsumerWarpgroups = 2;
constexpr int kConsumerThreads = kConsumerWarpgroups * kWarpgroup;
constexpr int kConsumerWarps = kConsumerThreads / 32;
constexpr int kProducerWarp = kConsumerWarps;
constexpr int kTransformWarp0 = kProducerWarp + 1;
constexpr int kTransformWarps = 3;
constexpr int kTransformThreads = kTransformWarps * 32;
constexpr int kThreads = kConsumerThreads + kWarpgroup;
static_assert(kTransformWarp0 + kTransformWarps == kThreads / 32, "warpgroup 2 = producer warp + transform warps");
// setmaxnreg works per warpgroup: at launch 384 threads get 168 registers
// (65536 / 384, granule 8). Config splits them between the consumers
// (accumulators NT/2 + two A sets of 16 + the epilogue) and warpgroup 2 (the
// transform's loads and stores); both sides fitted by ptxas without spills.
constexpr int kLaunchRegs = (65536 / kThreads) & ~7;

// ---- shapes -----------------------------------------------------------------
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

// Operand tiles in shared memory are TMA-written with the 128-byte swizzle:
// 16-B unit u of a 128-B row n sits at unit u ^ (n % 8). The B operand (the
// activations, K-major) is what the wgmma descriptor reads in that layout; the
// weight tile uses it so that the 8 rows of a warp's A-fragment loads hit 8
// different bank groups. The pattern is CU_TENSOR_MAP_SWIZZLE_128B's (CUDA
// driver API, cuTensorMapEncodeTiled; PTX ISA "Tensor swizzling modes", which
// wgmma's 128B-swizzle descriptor mode reads alike). Its properties are
// CPU-checked in tests/cpu/test_decode_plan.cpp; a wrong pattern fails the
// bit-exact GPU tests (Sm90DecodeExact, GpuXBf16.Sm90ForcedBitExact).
constexpr int sw128_offset(int row, int byte) { return row * 128 + ((((byte >> 4) ^ (row & 7)) & 7) << 4) + (byte & 15); }
// The A fragment of wgmma m64nNk16 (PTX ISA, register fragments of wgmma):
// element e (0..7) of lane l is row l/4 + 8·((e/2) % 2), K column
// 8·(e/4) + 2·(l % 4) + e % 2 of the k16 slice. In K order, so lane q = l % 4
// of a row loads the byte pairs at 16s + 2q and 16s + 2q + 8 of slice s.
constexpr int a_fragment_byte(int q, int s, int e) { return 16 * s + 8 * (e / 4) + 2 * q + (e % 2); }

// Activation formats of the raw stage (template parameter XB = bytes per element).
constexpr int kXE4m3 = 1;  // xq (e4m3) + xsf: one TMA box of 128 K, the scale chunk by bulk copy
constexpr int kXBf16 = 2;  // x_bf16: two TMA boxes of 64 K (128 B each), no scales

// Test-only timeline (decode_set_trace): one %globaltimer stamp per event and
// CTA; "last" events are taken on the CTA's last unit (kTrArrived + a
// splitk::Mark step: the split-K end's steps, in order).
enum TraceEvent : int {
  kTrEntry = 0,      // kernel entry (thread 0)
  kTrSetup,          // producer: barriers initialized, registers moved (before the tensor-map prefetch)
  kTrPdlDone,        // producer: after griddepcontrol.wait
  kTrFirstFull,      // consumer thread 0: first stage landed
  kTrMainDone,       // consumer thread 0: last unit's mainloop (wgmma) done
  kTrArrived,        // consumer thread 0: last unit's partial stored and counted (splitk::kMarkArrived)
  kTrSummed,         // the same, last arriver: partials summed (splitk::kMarkSummed)
  kTrOwners,         // the same, last arriver: slot-owner table built (splitk::kMarkOwners)
  kTrEpiDone,        // consumer thread 0: last unit finished (reduction + epilogue if last arriver)
  kTrUnits,          // value: units this CTA walked
  kTrLastArrivals,   // value: units for which this CTA was the last arriver
  kTraceEvents = 12
};

template <int NT, int XB>
struct Config {
  static_assert(NT == 16 || NT == 32 || NT == 64 || NT == 128, "token block = wgmma N");
  static_assert(XB == kXE4m3 || XB == kXBf16, "activation format");
  static constexpr int kNt = NT;
  static constexpr int kAccRegs = NT / 2;  // f32 accumulators per thread (m64 × NT per warpgroup)
  // The CTA's pool is what the launch allocated (kLaunchRegs per thread):
  // setmaxnreg.inc waits until the other warpgroup's dec leaves enough.
  static constexpr int kConsumerRegs = 216;
  static constexpr int kWg2Regs = (kLaunchRegs * kThreads - kConsumerRegs * kConsumerThreads) / kWarpgroup / 8 * 8;
  static_assert(kConsumerRegs * kConsumerThreads + kWg2Regs * kWarpgroup <= kLaunchRegs * kThreads,
                "setmaxnreg: the increased consumers fit the registers allocated at launch");
  static_assert(kWg2Regs >= 24 && kConsumerRegs % 8 == 0 && kWg2Regs % 8 == 0, "setmaxnreg operand rules");

  // ---- shared memory --------------------------------------------------------
  // [e4m3: B ring, kBSlots × 2 steps × NT × 128 B, its first NT × 512 B aliased by the reduction
  //  tile T; bf16: T alone (the B operand is the raw stage's X)]
  // [stages × (W: 128 × 128 e4m3 | X: NT × 128 × XB | wsf chunk | xsf chunk (e4m3 only))]
  // [full | empty | bfull | bempty | tfree | unit flag word]
  static constexpr bool kTransform = XB == kXE4m3;
  static constexpr int kBBufBytes = NT * kStepK * 2;                 // one 64-K step of the bf16 B tile
  static constexpr int kBSlotBytes = kStepsPerStage * kBBufBytes;    // one stage
  static constexpr int kBSlots = !kTransform ? 0 : NT >= 128 ? 2 : 3;  // 2 keep 4 e4m3 stages at NT = 128
  static constexpr int kTileBytes = NT * kHeadRows * 4;  // reduction tile T
  static constexpr int kRingBytes = kTransform ? kBSlots * kBSlotBytes : kTileBytes;
  static_assert(kRingBytes >= kTileBytes, "T fits in the B ring it aliases");
  static constexpr int kWBytes = kHeadRows * kBK;
  static constexpr int kXHalfBytes = NT * kStepK * XB;  // bf16: one TMA box of 64 K; e4m3: half the box
  static constexpr int kXBytes = NT * kBK * XB;
  static constexpr int kSfBytes = XB == kXE4m3 ? 2 * kSfChunk : kSfChunk;
  static constexpr int kTxBytes = kWBytes + kXBytes + kSfBytes;  // every byte of a stage arrives by TMA / bulk copy
  static constexpr int kStageBytes = (kTxBytes + kSwizzleAtom - 1) / kSwizzleAtom * kSwizzleAtom;
  static constexpr int kMaxStages = 8;
  // full, empty, bfull, bempty (<= 3 slots), tfree, red_full / red_empty (cluster plans)
  static constexpr int kBarrierWords = 2 * kMaxStages + 2 * 3 + 1 + 2;
  static constexpr int kBarrierBytes = kBarrierWords * 8 + 16;      // + the unit flag word
  static constexpr int kAlignSlack = kSwizzleAtom;  // dynamic smem base rounded up to 1024 B
  // The last arriver's slot-owner table of its token block (splitk::finish_unit;
  // common/slot_owners.cuh), after the barriers: it fits beside every
  // instance's stages without costing one (2-4 KiB).
  using OwnerTable = epi::SlotOwnerTable<NT>;
  static constexpr int kOwnersBytes = static_cast<int>(sizeof(OwnerTable));
  static constexpr int kStagesFit = (kSmemLimit - kAlignSlack - kBarrierBytes - kOwnersBytes - kRingBytes) / kStageBytes;
  static constexpr int kStages = kStagesFit > kMaxStages ? kMaxStages : kStagesFit;
  static constexpr int kRingOff = 0;
  static constexpr int kStageOff = kRingOff + kRingBytes;
  static constexpr int kBarOff = kStageOff + kStages * kStageBytes;
  static constexpr int kOwnersOff = kBarOff + kBarrierBytes;
  static constexpr int kSmemBytes = kAlignSlack + kOwnersOff + kOwnersBytes;
  // in-stage offsets
  static constexpr int kWOff = 0;
  static constexpr int kXOff = kWBytes;
  static constexpr int kWsfOff = kWBytes + kXBytes;
  static constexpr int kXsfOff = kWsfOff + kSfChunk;  // e4m3 only
  // barrier offsets (from kBarOff)
  static constexpr int kFullOff = 0;
  static constexpr int kEmptyOff = 8 * kMaxStages;
  static constexpr int kBFullOff = 16 * kMaxStages;
  static constexpr int kBEmptyOff = kBFullOff + 8 * 3;
  static constexpr int kTFreeOff = kBEmptyOff + 8 * 3;
  static constexpr int kRedFullOff = kTFreeOff + 8;
  static constexpr int kRedEmptyOff = kRedFullOff + 8;
  static constexpr int kFlagOff = kRedEmptyOff + 8;
  static_assert(kFlagOff + 16 <= kBarrierBytes, "barrier block");
  static_assert(kOwnersOff % 8 == 0, "owner table: 8-B words");
  // Arrivals: a raw stage is read by every consumer (W, wsf; with bf16
  // activations also X, through wgmma: released once that group retired) and
  // every transform thread (X, xsf); a B slot is written by every transform
  // thread and released by every consumer once its wgmma group retired. Each
  // thread arrives for its own accesses (compute-sanitizer racecheck does not
  // model __syncwarp-ordered single arrivals).
  static constexpr int kEmptyArrivals = kConsumerThreads + (kTransform ? kTransformThreads : 0);
  static constexpr int kBFullArrivals = kTransformThreads;
  static constexpr int kBEmptyArrivals = kConsumerThreads;
  static constexpr int kTFreeArrivals = kConsumerThreads;  // every thread's T accesses of the unit are done

  static_assert(kStages >= 3, "at least 3 stages (48 KiB of weights) in flight per SM");
  static_assert(!kTransform || (kBSlots >= 2 && kBSlots <= 3), "B slots (barrier block holds 3)");
  static_assert(kSmemBytes <= kSmemLimit, "shared memory budget");
  static_assert(kBBufBytes % kSwizzleAtom == 0, "B buffers: 1024-B aligned 128B-swizzle atoms");
  static_assert(kStageOff % kSwizzleAtom == 0 && kStageBytes % kSwizzleAtom == 0 && kXOff % kSwizzleAtom == 0 &&
                    kXHalfBytes % kSwizzleAtom == 0,
                "TMA destinations: the 128B-swizzled X boxes need 1024-B alignment");
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
  int32_t cluster;       // S when the S units of a (head, token block) are one cluster (grid % S == 0), else 0
  int32_t units;         // heads · token_blocks · split
  int32_t spread;        // 1: a spread plan (splitk::Plan::spread; units <= grid, cooperative launch), else 0
  const uint8_t* xsf;    // F8_128x4 [ceil(M/128)·128, K/32] (e4m3 activations; null for x_bf16)
  const uint8_t* wsf;    // F8_128x4 [N, K/32]
  uint32_t* counters;    // workspace: [heads · token_blocks] arrival counters, zero between launches (L2 plans)
  float* partials;       // workspace: [units][NT][128] f32 partial slots (L2 plans)
  float* acc_tap;        // test only: f32 accumulator [M, N], or null
  int64_t n;             // N (tap row stride)
  epi::EpilogueParams epi;
  uint64_t* trace;       // test only: [trace_ctas][kTraceEvents] stamps (ns), or null (common/trace.cuh)
  int32_t trace_ctas;
  static constexpr int kTraceEvents = decode::kTraceEvents;
};

// Unit u of this launch (splitk::unit_of: (head · token_blocks + token block) · split + s).
__host__ __device__ inline splitk::Unit unit_of(const Params& p, int u) {
  return splitk::unit_of(u, p.token_blocks, p.split, p.k_stages);
}

// The activation conversion kernel (converted activations: MXFP8 x into bf16
// x̂ in the launch workspace, then the bf16 instance): a grid-stride loop of
// 16-element groups (dequant_sm90.cuh convert_jobs), 4 loads of 16 B in
// flight per thread; kConvertCtasPerSm · 256 threads per SM cover the
// latency of HBM (64 KiB in flight per SM).
constexpr int kConvertThreads = 256;
constexpr int kConvertCtasPerSm = 4;

// Host entry points of decode_sm90.cu.
cudaError_t prepare_decode();  // cudaFuncSetAttribute (max dynamic smem) of every instance
// cudaOccupancyMaxActiveClusters of the kernel with clusters of `ctas` CTAs
// (every instance: one CTA per SM); -1 when the query fails.
int max_clusters(int ctas);
// Test-only timeline: while set, every launch writes kTraceEvents stamps per
// CTA for CTAs 0..ctas-1 into buffer[cta * kTraceEvents + event].
void decode_set_trace(uint64_t* device_buffer, int ctas);
// nt = 16, 32, 64 or 128 (the plan's token block); xb = kXE4m3 or kXBf16.
// tmap_w: wq [N, K] box 128 x 128; tmap_x: e4m3 xq [M, K] box 128 x nt, or
// bf16 x_bf16 [M, 2K bytes] box 128 B x nt; all 128-B swizzled. With
// conv.rows > 0 (xb = kXBf16) a conversion kernel first writes conv.out (what
// tmap_x reads) from MXFP8 activations; `pdl` applies to the first launch.
m3qkv_status launch_decode(int nt, int xb, const CUtensorMap& tmap_w, const CUtensorMap& tmap_x, const Params& p,
                           int grid, bool pdl, const DequantJob& conv, int num_sms, cudaStream_t s);

}  // namespace m3qkv::sm90::decode
