// Host launcher of the SM90 fused kernels: tensor maps, tile shape, persistent
// grid, PDL, variant choice. The kernels are in fused_fp8promo_sm90.cu (B) and
// fused_bf16dq_sm90.cu (A); docs/sm90.md has the design.
#include <atomic>
#include <climits>
#include <cstdint>

#include "common/epilogue.cuh"
#include "host/once.h"
#include "host/tensor_map.h"
#include "sm90/kernel_sm90.cuh"
#include "sm90/sm90.h"

namespace m3qkv {
namespace {

constexpr const char* kFn = "m3qkv_fused_qkv";

// Grouped rasterization: heads per band (kernel_sm90.cuh tile_of). 8 heads of
// K = 6144 e4m3 weights are 6 MiB; with ~132 resident tiles that is ~16 row
// blocks of activations (12 MiB at BM = 128): both stay in the 50 MiB L2.
constexpr int kBandHeads = 8;

// Test-only timeline buffer (sm90_set_trace); null = off.
uint64_t* g_trace = nullptr;
int g_trace_ctas = 0;

// The one-time setup of a context: every instance's shared-memory attribute
// is set, and cudaOccupancyMaxActiveClusters of the split-K instances per
// variant / epilogue / cluster size. An occupancy query that fails leaves -1
// (unknown) in its entry: that call runs without split-K of that size, and
// the next call that needs the entry asks again (max_clusters below) instead
// of running without it for the rest of the process. Entries are mutable
// atomics: two threads may fill the same unknown entry (with equal values).
struct Sm90Setup {
  mutable std::atomic<int> max_clusters[2][2][kSm90MaxSplit + 1];
};

int query_max_clusters(int variant, int epilogue, int split) {
  const int n = variant == kSm90Fp8Promote ? sm90::max_clusters_fp8promo(epilogue != 0, split)
                                           : sm90::max_clusters_bf16dq(epilogue != 0, split);
  return n < 0 ? -1 : n;
}

m3qkv_status prepare_device(const DeviceInfo& dev, const Sm90Setup** out) {
  return host::once(kFn, dev, host::OnceSlot::kSm90, [](Sm90Setup* s) -> m3qkv_status {
    cudaError_t e = sm90::prepare_fp8promo();
    if (e == cudaSuccess) e = sm90::prepare_bf16dq();
    if (e != cudaSuccess) return cuda_fail(kFn, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize) of the SM90 kernels", e);
    for (int v = 0; v < 2; ++v)
      for (int ep = 0; ep < 2; ++ep)
        for (int sp = 0; sp <= kSm90MaxSplit; ++sp)
          s->max_clusters[v][ep][sp].store(sp >= 2 ? query_max_clusters(v, ep, sp) : 0, std::memory_order_relaxed);
    return M3QKV_SUCCESS;
  }, out);
}

// Resident clusters of `split` CTAs (0: not schedulable or still unknown).
int max_clusters(const Sm90Setup& s, int variant, int epilogue, int split) {
  std::atomic<int>& entry = s.max_clusters[variant][epilogue][split];
  int n = entry.load(std::memory_order_relaxed);
  if (n < 0) {
    n = query_max_clusters(variant, epilogue, split);
    entry.store(n, std::memory_order_relaxed);
  }
  return n > 0 ? n : 0;
}

}  // namespace

m3qkv_status sm90_fused_variant(const m3qkv_fused_args& a, const DeviceInfo& dev, float* acc_tap, cudaStream_t s,
                                int variant, int block_m, int epilogue, int split) {
  if (variant != kSm90Bf16Dequant && variant != kSm90Fp8Promote)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT,
                "sm90_fused_variant: variant = %d is not 0 (bf16 dequant) or 1 (fp8 promote)", variant);
  if (epilogue != kSm90EpilogueStaged && epilogue != kSm90EpilogueRegisters)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT, "sm90_fused_variant: epilogue = %d is not 0 (staged) or 1 (registers)",
                epilogue);
  if (block_m != 0 && block_m != 64 && block_m != 128)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT, "sm90_fused_variant: block_m = %d is not 0, 64 or 128", block_m);
  if (split < 0 || split > kSm90MaxSplit)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT, "sm90_fused_variant: split = %d is not in [0, %d]", split,
                kSm90MaxSplit);
  const int64_t heads = static_cast<int64_t>(a.nq) + 2 * a.nkv + a.niq + a.nik;
  if (a.m > INT32_MAX - 256 || a.k / 128 > INT32_MAX)
    return fail(M3QKV_ERROR_TOO_LARGE, "m3qkv_fused_qkv: m = %lld exceeds the SM90 kernel's 32-bit row index",
                static_cast<long long>(a.m));
  const Sm90Setup* setup = nullptr;
  M3QKV_TRY(prepare_device(dev, &setup));

  // Tile height: two consumer warpgroups (BM = 128) when that already gives
  // every SM a tile; otherwise BM = 64 doubles the tile count for M > 64 (and
  // for M <= 64 drops the idle second warpgroup). Decode sizes (M <= 64) still
  // run one tile per head: the cluster split-K design (docs/sm90.md) is what
  // fills the machine there.
  const int64_t tiles128 = (a.m + 127) / 128 * heads;
  const int cons = block_m == 64 ? 1 : block_m == 128 ? 2 : (tiles128 < dev.num_sms ? 1 : 2);
  const int bm = 64 * cons;
  const int64_t m_blocks = (a.m + bm - 1) / bm;
  const int64_t tiles = m_blocks * heads;
  if (tiles > INT32_MAX)
    return fail(M3QKV_ERROR_TOO_LARGE, "m3qkv_fused_qkv: %lld tiles exceed the SM90 scheduler's 32-bit index",
                static_cast<long long>(tiles));

  CUtensorMap tmap_x, tmap_w;
  M3QKV_TRY(host::make_tensor_map_2d_u8(kFn, &tmap_x, "xq", a.xq, static_cast<uint64_t>(a.k), static_cast<uint64_t>(a.m),
                                 static_cast<uint64_t>(a.k), sm90::kBK, static_cast<uint32_t>(bm),
                                 CU_TENSOR_MAP_SWIZZLE_128B));
  M3QKV_TRY(host::make_tensor_map_2d_u8(kFn, &tmap_w, "wq", a.wq, static_cast<uint64_t>(a.k),
                                 static_cast<uint64_t>(heads * kHeadDim), static_cast<uint64_t>(a.k), sm90::kBK,
                                 sm90::kBN, CU_TENSOR_MAP_SWIZZLE_128B));

  sm90::KernelParams p;
  p.m = static_cast<int32_t>(a.m);
  p.heads = static_cast<int32_t>(heads);
  p.m_blocks = static_cast<int32_t>(m_blocks);
  p.band_heads = kBandHeads;
  p.k_stages = static_cast<int32_t>(a.k / sm90::kBK);
  p.num_tiles = static_cast<int32_t>(tiles);
  p.xsf = static_cast<const uint8_t*>(a.xsf);
  p.wsf = static_cast<const uint8_t*>(a.wsf);
  p.acc_tap = acc_tap;
  p.trace = g_trace;
  p.trace_ctas = g_trace_ctas;
  p.n = heads * kHeadDim;
  p.epi = epi::make_epilogue_params(a);

  // Split-K (docs/sm90.md), with 64-row tiles (chosen when 128-row tiles would
  // leave SMs idle): at decode sizes the tiles (one per head) leave most SMs
  // idle, and a few more tiles than SMs (M = 512 at TP4: 160 tiles) run in 2
  // waves; a cluster of `sp` CTAs sharing a tile, each K / sp, fixes both.
  // Automatic choice: the smallest modelled time
  //   waves · (kFixed + ceil(ks / sp) + (sp - 1) · kRank)   [stage times]
  // with waves from cudaOccupancyMaxActiveClusters. Fitted on the H200 (TP4,
  // K = 6144, M = 1 / 64 / 128 / 512, cluster sizes 1..8; docs/sm90.md
  // "Performance log" step 2): a stage costs ~1.2 (B) / 1.5 (A) us per CTA, a
  // wave ~12 us besides its stages (~8 stages), each extra rank ~1.4 us (the
  // leader's DSMEM pull, ~1 stage).
  constexpr int64_t kFixed = 8, kRank = 1;
  const int ks = static_cast<int>(a.k / sm90::kBK);
  int sp = 1;
  if (split > 1) {
    if (cons != 1)
      return fail(M3QKV_ERROR_INVALID_ARGUMENT,
                  "sm90_fused_variant: split-K needs 64-row tiles (block_m %d, M %lld gives 128)", block_m,
                  static_cast<long long>(a.m));
    sp = split < ks ? split : ks;
  } else if (split == 0 && cons == 1) {
    const int64_t sms = dev.num_sms > 0 ? dev.num_sms : 1;
    int64_t best = ((tiles + sms - 1) / sms) * (kFixed + ks);
    for (int c = 2; c <= kSm90MaxSplit && c <= ks; ++c) {
      const int64_t mc = max_clusters(*setup, variant, epilogue, c);
      if (mc <= 0) continue;
      const int64_t cost = ((tiles + mc - 1) / mc) * (kFixed + (ks + c - 1) / c + (c - 1) * kRank);
      if (cost < best) {
        best = cost;
        sp = c;
      }
    }
  }
  p.split = sp;

  int64_t grid64;
  if (sp > 1) {
    const int64_t mc = max_clusters(*setup, variant, epilogue, sp);
    int64_t clusters = a.grid > 0 ? a.grid / sp : (mc > 0 ? mc : 1);
    if (clusters < 1) clusters = 1;
    if (clusters > tiles) clusters = tiles;
    grid64 = clusters * sp;
  } else {
    const int64_t auto_grid = tiles < dev.num_sms ? tiles : dev.num_sms;
    grid64 = a.grid > 0 && a.grid < tiles ? a.grid : (a.grid > 0 ? tiles : auto_grid);
  }
  const int grid = static_cast<int>(grid64);
  const bool pdl = a.use_pdl != 0;
  const bool reg_epi = epilogue == kSm90EpilogueRegisters;
  return variant == kSm90Fp8Promote ? sm90::launch_fp8promo(cons, reg_epi, tmap_x, tmap_w, p, grid, pdl, s)
                                    : sm90::launch_bf16dq(cons, reg_epi, tmap_x, tmap_w, p, grid, pdl, s);
}

m3qkv_status sm90_fused(const m3qkv_fused_args& a, const DeviceInfo& dev, float* acc_tap, cudaStream_t s) {
  return sm90_fused_variant(a, dev, acc_tap, s, kSm90DefaultVariant, 0, kSm90DefaultEpilogue, 0);
}

m3qkv_status sm90_warmup(const DeviceInfo& dev) {
  const Sm90Setup* setup = nullptr;
  return prepare_device(dev, &setup);
}

void sm90_set_trace(uint64_t* device_buffer, int ctas) {
  g_trace = ctas > 0 ? device_buffer : nullptr;
  g_trace_ctas = g_trace != nullptr ? ctas : 0;
}

int sm90_max_active_clusters(const DeviceInfo& dev, int variant, int epilogue, int split) {
  const Sm90Setup* setup = nullptr;
  if ((variant != 0 && variant != 1) || (epilogue != 0 && epilogue != 1) || split < 2 || split > kSm90MaxSplit ||
      prepare_device(dev, &setup) != M3QKV_SUCCESS)
    return 0;
  return max_clusters(*setup, variant, epilogue, split);
}

}  // namespace m3qkv
