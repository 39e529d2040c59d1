// SM90 (Hopper, sm_90a) backend: the dispatcher's entry points (same
// contract as src/portable/portable.h) and, for the benchmark and the GPU
// tests, the variant-level launcher and its occupancy numbers.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "common/splitk_plan.h"
#include "host/device.h"

namespace m3qkv {

namespace sm90 {
// An MXFP8 operand converted to bf16 once per call (dequant_sm90.cuh
// convert_jobs): e4m3 `q` [rows][K], its F8_128x4 scales `sf`, the bf16
// result `out` [rows][K] (16-B aligned); rows = 0: nothing.
struct DequantJob {
  const uint8_t* q = nullptr;
  const uint8_t* sf = nullptr;
  uint8_t* out = nullptr;
  int64_t rows = 0;
};
}  // namespace sm90

m3qkv_status sm90_fused(const m3qkv_fused_args& a, const DeviceInfo& dev, float* acc_tap, cudaStream_t s);
m3qkv_status sm90_warmup(const DeviceInfo& dev);

// The SM90 tile-kernel instances (docs/sm90.md). Value 1 stays unused (a
// dropped variant's number, CHANGELOG.md).
enum Sm90Variant : int {
  // A: e4m3·2^e -> bf16 in shared memory by a transform warpgroup, bf16 wgmma
  // m64n128k16 with f32 accumulators, the register epilogue on the fragment.
  kSm90Bf16Dequant = 0,
  // A with the activations converted to bf16 once per call (x̂ in the stream
  // workspace, TMA'd into the bf16 stages; the transform converts the weights
  // only): 128-row tiles without split-K. Same bytes as A (docs/sm90.md
  // "Prefill step 1").
  kSm90Bf16DequantPreA = 2,
  // Both operands converted to bf16 once per call (x̂ and ŵ in the stream
  // workspace), a TMA-fed bf16 mainloop with no transform, and an epilogue
  // warpgroup overlapped with the next tile (prefill_sm90.cu): the same
  // tiles, plan and bytes as kSm90Bf16DequantPreA (docs/sm90.md "Prefill step 2").
  kSm90Bf16Prefill = 3,
  // sm90_fused's choice (plan_sm90.h): 128-row tiles from M = 512; there
  // kSm90Bf16Prefill from M = 1024 (sm90::prefer_prefill), else
  // kSm90Bf16DequantPreA where it applies (sm90::pre_a_applies), else
  // kSm90Bf16Dequant.
  kSm90AutoVariant = -1,
};

// Split-K over a thread-block cluster (docs/sm90.md "Split-K"): 0 = automatic
// (with 64-row tiles, when the modelled time drops), 1 = off, 2..kSm90MaxSplit
// = that many CTAs per tile (needs 64-row tiles: block_m 64, or 0 where the
// automatic tile height is 64; clamped to K / 128).
constexpr int kSm90MaxSplit = 8;  // portable cluster size limit

// sm90_fused with an explicit instance (bench and tests), tile height
// (block_m = 64: one consumer warpgroup, 128: two, 0: the plan's choice) and
// split-K. With split > 1, args.grid > 0 asks for max(1, grid / split) clusters.
// Arguments already validated, m > 0 (as every backend launcher of internal.h).
m3qkv_status sm90_fused_variant(const m3qkv_fused_args& a, const DeviceInfo& dev, float* acc_tap, cudaStream_t s,
                                int variant, int block_m = 0, int split = 0);

// How the swap-AB path takes MXFP8 activations (bf16 ones need neither):
// converted to bf16 in the kernel by its transform warps, once per head, or
// once per call by a conversion kernel into the launch workspace, for the
// bf16 instance. The same bf16 tile either way, so the same accumulator bits.
enum Sm90DecodeX : int {
  kSm90DecodeXAuto = 0,       // sm90::decode_converts_x (decode_plan.h)
  kSm90DecodeXTransform = 1,
  kSm90DecodeXConverted = 2,
};
// Where the swap-AB path's split-K partials meet: through a per-stream
// workspace in L2 (the last arriving unit sums them, or, spread, the S units
// wait for each other and share the sum and the epilogue), or in distributed
// shared memory when the S units of a (head, token block) run as one cluster
// (sm90::cluster_plan). The same additions in the same order: the same bits.
enum Sm90DecodeReduce : int {
  kSm90DecodeReduceAuto = 0,     // sm90::cluster_plan's cost model
  kSm90DecodeReduceL2 = 1,
  kSm90DecodeReduceCluster = 2,  // an error where no cluster plan fits (split > 8, grid < split)
  kSm90DecodeReduceSpread = 3,   // through L2, each unit finishing a share of the rows: an error where
                                 // not every unit is resident at once (split 1, units > grid)
};
// The swap-AB path (src/sm90/decode_sm90.cu, docs/sm90.md) for
// 1 <= M <= kDecodeMaxM: weights as the wgmma M side, K split over a
// persistent grid (split 0 = the plan's choice, else forced, clamped to
// [1, K / 128]), partials summed in a fixed order (reduce: one of
// Sm90DecodeReduce); x_path one of Sm90DecodeX. args.grid > 0 caps the grid.
// Arguments validated, m > 0.
m3qkv_status sm90_fused_decode(const m3qkv_fused_args& a, const DeviceInfo& dev, float* acc_tap, cudaStream_t s,
                               int split = 0, int x_path = kSm90DecodeXAuto, int reduce = kSm90DecodeReduceAuto);
// The plan sm90_fused_decode runs for these arguments (bench and tests), and
// the device's co-resident clusters per size, clusters[0 .. 8].
m3qkv_status sm90_decode_plan(const m3qkv_fused_args& a, const DeviceInfo& dev, int split, int reduce,
                              splitk::Plan* plan, int* clusters);
// The fp8 fast mode's kernel (fast_sm90.cu) at any M (bench and tests;
// sm90_fused takes it for precision 1 where sm90::fast_preferred). Weights prepared
// (m3qkv_prepare_weights_fp8), MXFP8 activations. Arguments validated, m > 0.
// cluster: 0 = automatic (= 2), 1 = none, 2 = 2 row blocks (or the 2 heads
// of a lone row block), 4 = 2 x 2; reduced where the shape or the occupancy
// does not allow it.
m3qkv_status sm90_fused_fast(const m3qkv_fused_args& a, const DeviceInfo& dev, float* acc_tap, cudaStream_t s,
                             int cluster = 0);

// Whether sm90_fused routes M tokens over `heads` heads (bf16 activations or
// MXFP8) to the swap-AB kernel (sm90::decode_preferred: the measured crossover).
bool sm90_uses_decode(int64_t m, int heads, bool x_bf16);

// cudaOccupancyMaxActiveClusters of variant A's split-K instance with
// clusters of `split` CTAs on `dev`, as the automatic choice sees it (0:
// unknown or not schedulable). For the timing test's report.
int sm90_max_active_clusters(const DeviceInfo& dev, int split);

// Test-only timeline (sm90_set_trace, Sm90Timing.DISABLED_Timeline_TP4): one
// %globaltimer stamp per event and CTA, written by the thread that reaches the
// event first in its role; first tile only for the "first" events, last tile
// for the others. One predictable branch per event when tracing is off.
enum TraceEvent : int {
  kTrEntry = 0,         // kernel entry (thread 0)
  kTrPdlWaitDone,       // after griddepcontrol.wait (thread 0)
  kTrProducerStart,     // producer: about to issue its first loads
  kTrXfFirstRaw,        // transform (its first thread): first raw stage landed
  kTrXfDone,            // transform: last raw stage converted
  kTrConsFirstBf,       // consumer (its first thread): first bf16 stage ready
  kTrConsMainDone,      // consumer: last tile's wgmma chain complete
  kTrConsReduced,       // consumer: split-K reduction done (leader: pulled; rank: released)
  kTrConsEpiDone,       // consumer: last tile's epilogue done
  kTrExit,              // thread 0 at the end (after the split-K exit barrier)
  kTrRank,              // value, not a time: cluster rank
  kTraceEvents = 16
};
// While set, every launch of a variant-A kernel writes one %globaltimer stamp
// (ns) per TraceEvent for CTAs 0..ctas-1 into device_buffer[cta * kTraceEvents
// + event]. Not thread-safe; null / 0 turns it off.
void sm90_set_trace(uint64_t* device_buffer, int ctas);

}  // namespace m3qkv
