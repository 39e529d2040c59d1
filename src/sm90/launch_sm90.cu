// Host launcher of the SM90 fused kernels: one-time setup, the plan
// (plan_sm90.h: tile shape, split-K, persistent grid), tensor maps, params.
// The kernels are in fused_bf16dq_sm90.cu (variant A and its pre-converted-
// activations instance), prefill_sm90.cu (the prefill kernel) and decode_sm90.cu;
// docs/sm90.md has the design.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>

#include "common/epilogue.cuh"
#include "host/once.h"
#include "host/tensor_map.h"
#include "host/timing.h"
#include "host/workspace.h"
#include "sm90/decode_config.h"
#include "sm90/fast_config.h"
#include "sm90/kernel_sm90.cuh"
#include "sm90/plan_sm90.h"
#include "sm90/sm90.h"

namespace m3qkv {
namespace {

constexpr const char* kFn = "m3qkv_fused_qkv";

// The bf16 activations of a call (x_bf16), or null for MXFP8 activations (xq, xsf).
const void* activations_bf16(const m3qkv_fused_args& a) { return a.x_bf16; }
static_assert(sm90::kPlanBK == sm90::kBK && sm90::kPlanMaxSplit == kSm90MaxSplit, "plan_sm90.h numbers");

// Grouped rasterization: heads per band (kernel_sm90.cuh tile_of). 8 heads of
// K = 6144 e4m3 weights are 6 MiB; with ~132 resident tiles that is ~16 row
// blocks of activations (12 MiB at BM = 128): both stay in the 50 MiB L2.
constexpr int kBandHeads = 8;

// Test-only timeline buffer (sm90_set_trace); null = off.
uint64_t* g_trace = nullptr;
int g_trace_ctas = 0;

// The one-time setup of a context: every instance's shared-memory attribute
// is set, and cudaOccupancyMaxActiveClusters of variant A's split-K instance
// per cluster size. An occupancy query that fails leaves -1 (unknown) in its
// entry: that call runs without split-K of that size, and the next call that
// needs the entry asks again (max_clusters below) instead of running without
// it for the rest of the process. Entries are mutable atomics: two threads
// may fill the same unknown entry (with equal values).
struct Sm90Setup {
  mutable std::atomic<int> max_clusters[kSm90MaxSplit + 1];
  // Co-resident CTAs of the cooperative pre-A and prefill instances: their grid's cap.
  unsigned coop_pre_a = 0, coop_prefill = 0;
  // Resident clusters of the fast kernel with 1, 2 and 4 CTAs (index log2; 0: not schedulable or unknown).
  int fast_clusters[3] = {};
  // Resident clusters of the swap-AB kernel per cluster size (0: not
  // schedulable or unknown: that size is not planned).
  int decode_clusters[sm90::kDecodeMaxCluster + 1] = {};
};

int query_max_clusters(int split) {
  const int n = sm90::max_clusters_bf16dq(split);
  return n < 0 ? -1 : n;
}

m3qkv_status prepare_device(const DeviceInfo& dev, const Sm90Setup** out) {
  return host::once(kFn, dev, host::OnceSlot::kSm90, [&dev](Sm90Setup* s) -> m3qkv_status {
    cudaError_t e = sm90::prepare_bf16dq();
    if (e == cudaSuccess) e = sm90::prepare_prefill();
    if (e == cudaSuccess) e = sm90::decode::prepare_decode();
    if (e == cudaSuccess) e = sm90::prepare_fast();
    if (e != cudaSuccess) return cuda_fail(kFn, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize) of the SM90 kernels", e);
    // A failed query leaves 0 (no cap: the launch itself then says whether the grid fits).
    if (sm90::co_resident_pre_a(dev, &s->coop_pre_a) != M3QKV_SUCCESS) s->coop_pre_a = 0;
    if (sm90::co_resident_prefill(dev, &s->coop_prefill) != M3QKV_SUCCESS) s->coop_prefill = 0;
    for (int i = 0; i < 3; ++i) s->fast_clusters[i] = std::max(0, sm90::max_clusters_fast(1 << i));
    for (int c = 2; c <= sm90::kDecodeMaxCluster; ++c) s->decode_clusters[c] = std::max(0, sm90::decode::max_clusters(c));
    for (int sp = 0; sp <= kSm90MaxSplit; ++sp)
      s->max_clusters[sp].store(sp >= 2 ? query_max_clusters(sp) : 0, std::memory_order_relaxed);
    return M3QKV_SUCCESS;
  }, out);
}

// Resident clusters of `split` CTAs (0: not schedulable or still unknown).
int max_clusters(const Sm90Setup& s, int split) {
  std::atomic<int>& entry = s.max_clusters[split];
  int n = entry.load(std::memory_order_relaxed);
  if (n < 0) {
    n = query_max_clusters(split);
    entry.store(n, std::memory_order_relaxed);
  }
  return n > 0 ? n : 0;
}

}  // namespace

bool sm90_uses_decode(int64_t m, int heads, bool x_bf16) { return sm90::decode_preferred(m, heads, x_bf16); }

namespace {
splitk::Plan decode_plan_of(const m3qkv_fused_args& a, const DeviceInfo& dev, const Sm90Setup& setup, int split,
                            int reduce) {
  const int heads = total_heads(a.nq, a.nkv, a.niq, a.nik);
  const int ks = static_cast<int>(a.k / sm90::kBK);
  return sm90::cluster_plan(sm90::plan_decode_memo(a.m, heads, ks, dev.num_sms, split, a.grid), a.m, heads, ks,
                            dev.num_sms, split, a.grid, setup.decode_clusters, static_cast<sm90::DecodeReduce>(reduce));
}
}  // namespace

m3qkv_status sm90_decode_plan(const m3qkv_fused_args& a, const DeviceInfo& dev, int split, int reduce,
                              splitk::Plan* plan, int* clusters) {
  const Sm90Setup* setup = nullptr;
  M3QKV_TRY(prepare_device(dev, &setup));
  *plan = decode_plan_of(a, dev, *setup, split, reduce);
  for (int c = 0; c <= sm90::kDecodeMaxCluster; ++c) clusters[c] = setup->decode_clusters[c];
  return M3QKV_SUCCESS;
}

m3qkv_status sm90_fused_decode(const m3qkv_fused_args& a, const DeviceInfo& dev, float* acc_tap, cudaStream_t s,
                               int split, int x_path, int reduce) {
  if (a.m < 1 || a.m > sm90::kDecodeMaxM)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT, "sm90_fused_decode: m = %lld is outside [1, %lld]",
                static_cast<long long>(a.m), static_cast<long long>(sm90::kDecodeMaxM));
  if (split < 0)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT, "sm90_fused_decode: split = %d must be >= 0 (0 = automatic)", split);
  if (x_path != kSm90DecodeXAuto && x_path != kSm90DecodeXTransform && x_path != kSm90DecodeXConverted)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT,
                "sm90_fused_decode: x_path = %d is not 0 (automatic), 1 (converted in the kernel) or 2 (converted "
                "once per call)",
                x_path);
  if (reduce < kSm90DecodeReduceAuto || reduce > kSm90DecodeReduceSpread)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT,
                "sm90_fused_decode: reduce = %d is not 0 (automatic), 1 (through L2), 2 (over a cluster) or 3 "
                "(through L2, spread)",
                reduce);
  const Sm90Setup* setup = nullptr;
  M3QKV_TRY(prepare_device(dev, &setup));
  host::timing_mark(host::Phase::kSetup);
  const int heads = total_heads(a.nq, a.nkv, a.niq, a.nik);
  const int ks = static_cast<int>(a.k / sm90::kBK);
  const splitk::Plan plan = decode_plan_of(a, dev, *setup, split, reduce);
  if (plan.nt == 0 || plan.units > INT32_MAX)
    return fail(M3QKV_ERROR_INTERNAL, "sm90_fused_decode: no decode plan for m = %lld, %d heads, k = %lld",
                static_cast<long long>(a.m), heads, static_cast<long long>(a.k));
  if (reduce == kSm90DecodeReduceCluster && plan.cluster < 2)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT,
                "sm90_fused_decode: no cluster plan for split %d (m = %lld, grid %d): it needs 2 <= split <= %d and "
                "a grid of at least split CTAs that the device can co-schedule",
                plan.split, static_cast<long long>(a.m), a.grid, sm90::kDecodeMaxCluster);
  if (reduce == kSm90DecodeReduceSpread && !plan.spread)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT,
                "sm90_fused_decode: no spread plan for split %d (m = %lld, %lld units, grid %d): it needs split >= 2 "
                "and every unit resident at once (units <= grid)",
                plan.split, static_cast<long long>(a.m), static_cast<long long>(plan.units), plan.grid);
  host::timing_mark(host::Phase::kPlan);

  // MXFP8 activations converted once per call (x̂ in the launch workspace,
  // then the bf16 instance) where sm90::decode_converts_x says, or as asked.
  const bool convert = activations_bf16(a) == nullptr &&
                       (x_path == kSm90DecodeXConverted || (x_path == kSm90DecodeXAuto && sm90::decode_converts_x(a.m)));
  host::WorkspaceLease lease;  // through the launch
  host::SplitkBuffers ws;
  void* xhat = nullptr;
  if (convert)
    M3QKV_TRY(host::splitk_workspace("sm90_fused_decode", dev, s, plan,
                                     static_cast<size_t>(a.m) * static_cast<size_t>(a.k) * 2, &ws, &xhat, &lease));
  else
    M3QKV_TRY(host::splitk_workspace("sm90_fused_decode", dev, s, plan, &ws, &lease));
  const void* x_bf16 = convert ? xhat : activations_bf16(a);
  const int xb = x_bf16 != nullptr ? sm90::decode::kXBf16 : sm90::decode::kXE4m3;
  CUtensorMap tmap_w, tmap_x;
  M3QKV_TRY(host::make_tensor_map_2d_u8(kFn, &tmap_w, "wq", a.wq, static_cast<uint64_t>(a.k),
                                        static_cast<uint64_t>(heads) * kHeadDim, static_cast<uint64_t>(a.k),
                                        sm90::decode::kBK, sm90::decode::kHeadRows, CU_TENSOR_MAP_SWIZZLE_128B));
  if (xb == sm90::decode::kXBf16)  // bf16 rows of 2K bytes, boxes of 64 elements (one 128-B swizzle row)
    M3QKV_TRY(host::make_tensor_map_2d_u8(kFn, &tmap_x, convert ? "x_bf16 (workspace)" : "x_bf16", x_bf16,
                                          static_cast<uint64_t>(a.k) * 2,
                                          static_cast<uint64_t>(a.m), static_cast<uint64_t>(a.k) * 2, 128,
                                          static_cast<uint32_t>(plan.nt), CU_TENSOR_MAP_SWIZZLE_128B));
  else
    M3QKV_TRY(host::make_tensor_map_2d_u8(kFn, &tmap_x, "xq", a.xq, static_cast<uint64_t>(a.k),
                                          static_cast<uint64_t>(a.m), static_cast<uint64_t>(a.k), sm90::decode::kBK,
                                          static_cast<uint32_t>(plan.nt), CU_TENSOR_MAP_SWIZZLE_128B));
  host::timing_mark(host::Phase::kTensorMaps);

  sm90::decode::Params p;
  p.m = static_cast<int32_t>(a.m);
  p.heads = heads;
  p.k_stages = ks;
  p.token_blocks = plan.token_blocks;
  p.split = plan.split;
  p.cluster = plan.cluster;
  p.units = static_cast<int32_t>(plan.units);
  p.spread = plan.spread ? 1 : 0;
  p.xsf = static_cast<const uint8_t*>(a.xsf);
  p.wsf = static_cast<const uint8_t*>(a.wsf);
  p.counters = ws.counters;
  p.partials = ws.partials;
  p.acc_tap = acc_tap;
  p.n = static_cast<int64_t>(heads) * kHeadDim;
  p.epi = epi::make_epilogue_params(a);
  sm90::DequantJob conv;
  if (convert) conv = sm90::DequantJob{static_cast<const uint8_t*>(a.xq), p.xsf, static_cast<uint8_t*>(xhat), a.m};
  const m3qkv_status st =
      sm90::decode::launch_decode(plan.nt, xb, tmap_w, tmap_x, p, plan.grid, a.use_pdl != 0, conv, dev.num_sms, s);
  host::timing_mark(host::Phase::kLaunch);
  return st;
}

m3qkv_status sm90_fused_variant(const m3qkv_fused_args& a, const DeviceInfo& dev, float* acc_tap, cudaStream_t s,
                                int variant, int block_m, int split) {
  if (variant != kSm90Bf16Dequant && variant != kSm90Bf16DequantPreA && variant != kSm90Bf16Prefill &&
      variant != kSm90AutoVariant)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT,
                "sm90_fused_variant: variant = %d is not 0 (bf16 dequant), 2 (bf16 dequant, activations "
                "pre-converted), 3 (prefill: both operands pre-converted) or -1 (automatic)",
                variant);
  // bf16 activations are the prefill kernel's x̂ as they are (it converts the
  // weights only); the other tile instances read MXFP8.
  const bool xb = activations_bf16(a) != nullptr;
  if (xb && variant != kSm90Bf16Prefill && variant != kSm90AutoVariant)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT,
                "sm90_fused_variant: variant %d reads MXFP8 activations (xq, xsf); x_bf16 runs on the prefill "
                "kernel (variant 3) or the swap-AB kernel (sm90_fused_decode)",
                variant);
  const Sm90Setup* setup = nullptr;
  M3QKV_TRY(prepare_device(dev, &setup));
  host::timing_mark(host::Phase::kSetup);

  sm90::PlanInput in;
  in.m = a.m;
  in.heads = static_cast<int64_t>(a.nq) + 2 * a.nkv + a.niq + a.nik;
  in.k = a.k;
  in.num_sms = dev.num_sms;
  in.grid = a.grid;
  // The automatic variant picks its tile height from M first (plan_sm90.h auto_block_m).
  in.block_m = variant == kSm90AutoVariant && block_m == 0 ? sm90::auto_block_m(a.m) : block_m;
  in.split = split;
  const int64_t ks = a.k / sm90::kBK;
  for (int c = 2; c <= kSm90MaxSplit && c <= ks; ++c) in.max_clusters[c] = max_clusters(*setup, c);
  sm90::Plan plan;
  M3QKV_TRY(sm90::plan(kFn, in, &plan));
  // The two instances that read bf16 copies from the workspace run on the
  // 128-row unsplit plans; a forced one elsewhere is refused.
  const int64_t n = in.heads * kHeadDim;
  const bool pre_a_ok = sm90::pre_a_applies(plan, a.m, a.k);
  const bool prefill_ok = sm90::prefill_applies(plan, a.m, n, a.k, /*x_in_workspace=*/!xb);
  // bf16 activations where the prefill kernel does not apply: the swap-AB kernel.
  if (xb && variant == kSm90AutoVariant && !prefill_ok) return sm90_fused_decode(a, dev, acc_tap, s, 0);
  if ((variant == kSm90Bf16DequantPreA && !pre_a_ok) || (variant == kSm90Bf16Prefill && !prefill_ok))
    return fail(M3QKV_ERROR_INVALID_ARGUMENT,
                "sm90_fused_variant: variant %d (%s) needs 128-row tiles without split-K and %s <= %lld bytes "
                "(plan: block_m %d, split %d; M %lld)",
                variant, variant == kSm90Bf16Prefill ? "prefill" : "activations pre-converted",
                variant == kSm90Bf16Prefill ? "(M + N)·K·2" : "M·K·2", static_cast<long long>(sm90::kPreAMaxBytes),
                plan.bm, plan.split, static_cast<long long>(a.m));
  const bool prefill = variant == kSm90Bf16Prefill ||
                       (variant == kSm90AutoVariant && prefill_ok && (xb || sm90::prefer_prefill(a.m)));
  const bool pre_a = variant == kSm90Bf16DequantPreA || (variant == kSm90AutoVariant && pre_a_ok && !prefill);
  host::timing_mark(host::Phase::kPlan);

  // The workspace's zeroed head holds (host::kGridSyncOffset) the grid
  // barrier of the conversion; x̂ (pre_a) and ŵ (prefill) are the launch's
  // body (host::launch_workspace).
  host::WorkspaceLease lease;  // through the launch
  void* ws = nullptr;
  void* xbf = nullptr;
  uint8_t* wbf = nullptr;
  if (pre_a || prefill) {
    const size_t xbf_bytes = xb ? 0 : static_cast<size_t>(a.m) * static_cast<size_t>(a.k) * 2;
    const size_t wbf_bytes = prefill ? static_cast<size_t>(n) * static_cast<size_t>(a.k) * 2 : 0;
    M3QKV_TRY(host::launch_workspace(dev, s, xbf_bytes + wbf_bytes, &ws, &xbf, &lease));
    wbf = prefill ? static_cast<uint8_t*>(xbf) + xbf_bytes : nullptr;
  }
  CUtensorMap tmap_x, tmap_w;
  if (pre_a || prefill)
    M3QKV_TRY(host::make_tensor_map_2d_u8(kFn, &tmap_x, xb ? "x_bf16" : "x_bf16 (workspace)",
                                          xb ? activations_bf16(a) : xbf, static_cast<uint64_t>(a.k) * 2,
                                          static_cast<uint64_t>(a.m), static_cast<uint64_t>(a.k) * 2,
                                          sm90::kSwizzleBytes, static_cast<uint32_t>(plan.bm),
                                          CU_TENSOR_MAP_SWIZZLE_128B));
  else
    M3QKV_TRY(host::make_tensor_map_2d_u8(kFn, &tmap_x, "xq", a.xq, static_cast<uint64_t>(a.k),
                                          static_cast<uint64_t>(a.m), static_cast<uint64_t>(a.k), sm90::kBK,
                                          static_cast<uint32_t>(plan.bm), CU_TENSOR_MAP_SWIZZLE_128B));
  if (prefill)
    M3QKV_TRY(host::make_tensor_map_2d_u8(kFn, &tmap_w, "w_bf16 (workspace)", wbf, static_cast<uint64_t>(a.k) * 2,
                                          static_cast<uint64_t>(n), static_cast<uint64_t>(a.k) * 2,
                                          sm90::kSwizzleBytes, sm90::kBN, CU_TENSOR_MAP_SWIZZLE_128B));
  else
    M3QKV_TRY(host::make_tensor_map_2d_u8(kFn, &tmap_w, "wq", a.wq, static_cast<uint64_t>(a.k),
                                          static_cast<uint64_t>(n), static_cast<uint64_t>(a.k), sm90::kBK, sm90::kBN,
                                          CU_TENSOR_MAP_SWIZZLE_128B));
  host::timing_mark(host::Phase::kTensorMaps);

  sm90::KernelParams p;
  p.m = static_cast<int32_t>(a.m);
  p.heads = static_cast<int32_t>(in.heads);
  p.m_blocks = static_cast<int32_t>(plan.m_blocks);
  p.band_heads = kBandHeads;
  p.k_stages = static_cast<int32_t>(ks);
  p.num_tiles = static_cast<int32_t>(plan.tiles);
  p.xsf = static_cast<const uint8_t*>(a.xsf);
  p.wsf = static_cast<const uint8_t*>(a.wsf);
  p.acc_tap = acc_tap;
  p.trace = g_trace;
  p.trace_ctas = g_trace_ctas;
  p.n = in.heads * kHeadDim;
  p.epi = epi::make_epilogue_params(a);
  p.split = plan.split;
  if (pre_a || prefill) {  // the grid converts x (and w) itself, then meets at the barrier
    if (!xb) p.conv_x = sm90::DequantJob{static_cast<const uint8_t*>(a.xq), p.xsf, static_cast<uint8_t*>(xbf), a.m};
    if (prefill) p.conv_w = sm90::DequantJob{static_cast<const uint8_t*>(a.wq), p.wsf, wbf, n};
    p.conv_sync = reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(ws) + host::kGridSyncOffset);
  }
  const bool pdl = a.use_pdl != 0;
  const int conv_grid = sm90::one_launch_grid(plan, dev.num_sms, a.grid);
  const m3qkv_status st = prefill ? sm90::launch_prefill(tmap_x, tmap_w, p, conv_grid, pdl, setup->coop_prefill, s)
                          : pre_a ? sm90::launch_bf16dq_pre_a(tmap_x, tmap_w, p, conv_grid, pdl, setup->coop_pre_a, s)
                                  : sm90::launch_bf16dq(plan.cons, tmap_x, tmap_w, p, plan.grid, pdl, s);
  host::timing_mark(host::Phase::kLaunch);
  return st;
}

m3qkv_status sm90_fused_fast(const m3qkv_fused_args& a, const DeviceInfo& dev, float* acc_tap, cudaStream_t s,
                             int cluster) {
  if (cluster != 0 && cluster != 1 && cluster != 2 && cluster != 4)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT, "sm90_fused_fast: cluster = %d is not 0 (automatic), 1, 2 or 4", cluster);
  if (activations_bf16(a) != nullptr)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT, "sm90_fused_fast: the fp8 fast mode reads MXFP8 activations (xq, xsf)");
  const Sm90Setup* setup = nullptr;
  M3QKV_TRY(prepare_device(dev, &setup));
  host::timing_mark(host::Phase::kSetup);
  const int heads = total_heads(a.nq, a.nkv, a.niq, a.nik);
  const int64_t n = static_cast<int64_t>(heads) * kHeadDim;
  const int64_t m_blocks = (a.m + sm90::fast::kBM - 1) / sm90::fast::kBM;
  const int64_t tiles = m_blocks * heads;
  if (tiles > INT32_MAX)
    return fail(M3QKV_ERROR_TOO_LARGE, "sm90_fused_fast: %lld tiles exceed the kernel's int32 tile index",
                static_cast<long long>(tiles));
  sm90::FastPlanInput in;
  in.m_blocks = m_blocks;
  in.heads = heads;
  in.cluster = cluster;
  in.num_sms = dev.num_sms;
  in.grid = a.grid;
  for (int i = 0; i < 3; ++i) in.resident[i] = setup->fast_clusters[i];
  const sm90::FastPlan fp = sm90::fast_plan(in);
  const int cm = fp.clu_m, ch = fp.clu_h, grid = fp.grid;
  host::timing_mark(host::Phase::kPlan);

  // x' and the scales: the launch's body of the stream workspace.
  const sm90::fast::Workspace wl = sm90::fast::workspace(a.m, heads, a.k);
  host::WorkspaceLease lease;  // through the launch
  void* ws = nullptr;
  void* body = nullptr;
  M3QKV_TRY(host::launch_workspace(dev, s, wl.bytes, &ws, &body, &lease));
  sm90::FastLaunch f;
  f.xq = static_cast<const uint8_t*>(a.xq);
  f.xsf = static_cast<const uint8_t*>(a.xsf);
  f.wsf = static_cast<const uint8_t*>(a.wsf);
  f.xq_out = static_cast<uint8_t*>(body);
  f.sx = reinterpret_cast<float*>(f.xq_out + wl.sx_off);
  f.sw = reinterpret_cast<float*>(f.xq_out + wl.sw_off);
  CUtensorMap tmap_x, tmap_w;
  M3QKV_TRY(host::make_tensor_map_2d_u8(kFn, &tmap_x, "x' (workspace)", f.xq_out, static_cast<uint64_t>(a.k),
                                        static_cast<uint64_t>(a.m), static_cast<uint64_t>(a.k), sm90::kBK,
                                        static_cast<uint32_t>(sm90::fast::kBM / ch), CU_TENSOR_MAP_SWIZZLE_128B));
  M3QKV_TRY(host::make_tensor_map_2d_u8(kFn, &tmap_w, "wq", a.wq, static_cast<uint64_t>(a.k), static_cast<uint64_t>(n),
                                        static_cast<uint64_t>(a.k), sm90::kBK, static_cast<uint32_t>(sm90::kBN / cm),
                                        CU_TENSOR_MAP_SWIZZLE_128B));
  host::timing_mark(host::Phase::kTensorMaps);

  sm90::KernelParams p;
  p.m = static_cast<int32_t>(a.m);
  p.heads = heads;
  p.m_blocks = static_cast<int32_t>(m_blocks);
  p.band_heads = kBandHeads;
  p.k_stages = static_cast<int32_t>(a.k / sm90::kBK);
  p.num_tiles = static_cast<int32_t>(tiles);
  p.split = 1;
  p.clu_m = cm;
  p.clu_h = ch;
  p.xsf = reinterpret_cast<const uint8_t*>(f.sx);
  p.wsf = reinterpret_cast<const uint8_t*>(f.sw);
  p.acc_tap = acc_tap;
  p.n = n;
  p.epi = epi::make_epilogue_params(a);
  p.trace = g_trace;
  p.trace_ctas = g_trace_ctas;
  const m3qkv_status st = sm90::launch_fast(f, tmap_x, tmap_w, p, grid, a.use_pdl != 0, dev.num_sms, s);
  host::timing_mark(host::Phase::kLaunch);
  return st;
}

m3qkv_status sm90_fused(const m3qkv_fused_args& a, const DeviceInfo& dev, float* acc_tap, cudaStream_t s) {
  // The fp8 fast mode where it beats exact mode on the same (prepared)
  // weights (sm90::fast_preferred, measured); elsewhere exact mode reads them as MXFP8.
  if (a.precision == 1 && sm90::fast_preferred(a.m, total_heads(a.nq, a.nkv, a.niq, a.nik)))
    return sm90_fused_fast(a, dev, acc_tap, s);
  // Batch invariance: one kernel and one K order at every M (split 1: the
  // unit of a (head, token block) walks all of K in stage order).
  if (a.batch_invariant != 0) return sm90_fused_decode(a, dev, acc_tap, s, 1, kSm90DecodeXTransform);
  if (sm90_uses_decode(a.m, total_heads(a.nq, a.nkv, a.niq, a.nik), activations_bf16(a) != nullptr))
    return sm90_fused_decode(a, dev, acc_tap, s, 0);
  return sm90_fused_variant(a, dev, acc_tap, s, kSm90AutoVariant, 0, 0);
}

m3qkv_status sm90_warmup(const DeviceInfo& dev) {
  const Sm90Setup* setup = nullptr;
  return prepare_device(dev, &setup);
}

void sm90_set_trace(uint64_t* device_buffer, int ctas) {
  g_trace = ctas > 0 ? device_buffer : nullptr;
  g_trace_ctas = g_trace != nullptr ? ctas : 0;
}

int sm90_max_active_clusters(const DeviceInfo& dev, int split) {
  const Sm90Setup* setup = nullptr;
  if (split < 2 || split > kSm90MaxSplit || prepare_device(dev, &setup) != M3QKV_SUCCESS) return 0;
  return max_clusters(*setup, split);
}

}  // namespace m3qkv
