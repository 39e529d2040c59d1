// Host launcher of the SM100 fused kernel (fused_sm100.cu): tensor maps,
// cta_group choice, persistent grid, grouped-M width, cluster + PDL launch.
// Arguments arrive validated with m > 0 (api.cpp).
#include <climits>
#include <cstdint>

#include "common/epilogue.cuh"
#include "common/layouts.h"
#include "host/once.h"
#include "host/tensor_map.h"
#include "sm100/config.h"
#include "sm100/sm100.h"

namespace m3qkv {
namespace {

using sm100::Config;

constexpr const char* kFn = "m3qkv_fused_qkv";

// Nothing to keep: the slot records that the attributes are set.
struct Sm100Setup {};

// Shared-memory attributes of both tile configurations (once per context).
m3qkv_status ensure_attributes(const DeviceInfo& dev) {
  constexpr int kNeed =
      static_cast<int>(Config<1>::kSmemBytes > Config<2>::kSmemBytes ? Config<1>::kSmemBytes : Config<2>::kSmemBytes);
  if (dev.max_smem_optin < kNeed)
    return fail(M3QKV_ERROR_UNSUPPORTED_DEVICE,
                "%s: SM100 kernel needs %d bytes of shared memory per block, device %d allows %d", kFn, kNeed,
                dev.device, dev.max_smem_optin);
  const Sm100Setup* setup = nullptr;
  return host::once(kFn, dev, host::OnceSlot::kSm100, [](Sm100Setup*) -> m3qkv_status {
    M3QKV_CUDA_TRY(kFn, sm100::set_kernel_attributes<1>());
    M3QKV_CUDA_TRY(kFn, sm100::set_kernel_attributes<2>());
    return M3QKV_SUCCESS;
  }, &setup);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// cta_group by wave quantization. Unit of time: one 128×128×K tile on one
// SM. cta_group 1 runs tiles1 = ceil(M/128)·heads such tiles, num_sms at a
// time. cta_group 2 runs tiles2 = ceil(M/256)·ceil(heads/2) pair tiles
// (256×256, 4 units of work on 2 SMs = 2 units of time), num_sms/2 at a time.
// Padding (M tail, the phantom head of an odd head count) counts as work.
// Ties go to cta_group 2: half the B traffic per FLOP and one N = 256 MMA.
int choose_cta_group(int64_t m, int heads, int num_sms) {
  if (num_sms < 2) return 1;
  const int64_t tiles1 = ceil_div(m, 128) * heads;
  const int64_t tiles2 = ceil_div(m, 256) * ceil_div(heads, 2);
  const int64_t time1 = ceil_div(tiles1, num_sms);
  const int64_t time2 = 2 * ceil_div(tiles2, num_sms / 2);
  return time2 <= time1 ? 2 : 1;
}

// Grouped-M width: when the weights fit in half the L2 they stay resident
// whatever the order (group 1: heads fastest); otherwise groups of up to 16
// m-tiles walk m fastest so the CTAs running together share weight tiles.
int choose_group_m(int64_t n, int64_t k, int64_t num_m_tiles, const DeviceInfo& dev) {
  const int64_t weight_bytes = n * k;
  if (dev.l2_bytes > 0 && weight_bytes <= static_cast<int64_t>(dev.l2_bytes) / 2) return 1;
  return static_cast<int>(num_m_tiles < 16 ? num_m_tiles : 16);
}

template <int CG>
m3qkv_status launch(const m3qkv_fused_args& a, const DeviceInfo& dev, float* acc_tap, cudaStream_t s) {
  using C = Config<CG>;
  const int heads = total_heads(a.nq, a.nkv, a.niq, a.nik);
  const int64_t n = static_cast<int64_t>(heads) * kHeadDim;
  const int64_t num_m_tiles = ceil_div(a.m, C::kRowsPerTile);
  const int64_t num_n_tiles = ceil_div(heads, CG);
  const int64_t num_tiles = num_m_tiles * num_n_tiles;
  const int64_t sf_cols = a.k / kMxBlock;
  const int64_t sfa_bytes = f8_128x4_bytes(a.m, sf_cols);
  const int64_t sfb_bytes = f8_128x4_bytes(n, sf_cols);
  // Kernel coordinates are int32: rows of A (incl. the pair's padding), SF
  // rows of 256 B, tile indices.
  if (num_m_tiles * C::kRowsPerTile > INT32_MAX || sfa_bytes / 256 > INT32_MAX || num_tiles > INT32_MAX)
    return fail(M3QKV_ERROR_TOO_LARGE, "%s: m = %lld, k = %lld exceed the SM100 kernel's 32-bit tile coordinates", kFn,
                static_cast<long long>(a.m), static_cast<long long>(a.k));

  sm100::TensorMaps tm;
  M3QKV_TRY(host::make_tensor_map_2d_u8(kFn, &tm.a, "xq", a.xq, a.k, a.m, a.k, 128, 128, CU_TENSOR_MAP_SWIZZLE_128B));
  M3QKV_TRY(host::make_tensor_map_2d_u8(kFn, &tm.b, "wq", a.wq, a.k, n, a.k, 128, 128, CU_TENSOR_MAP_SWIZZLE_128B));
  M3QKV_TRY(host::make_tensor_map_2d_u8(kFn, &tm.sfa, "xsf", a.xsf, 256, sfa_bytes / 256, 256, 256, 2,
                                        CU_TENSOR_MAP_SWIZZLE_NONE));
  M3QKV_TRY(host::make_tensor_map_2d_u8(kFn, &tm.sfb, "wsf", a.wsf, 256, sfb_bytes / 256, 256, 256, 2,
                                        CU_TENSOR_MAP_SWIZZLE_NONE));

  sm100::Params p;
  p.ep = epi::make_epilogue_params(a);
  p.m = a.m;
  p.num_heads = heads;
  p.num_k_blocks = static_cast<int32_t>(a.k / C::BK);
  p.num_m_tiles = static_cast<int32_t>(num_m_tiles);
  p.num_n_tiles = static_cast<int32_t>(num_n_tiles);
  p.num_tiles = static_cast<int32_t>(num_tiles);
  p.group_m = choose_group_m(n, a.k, num_m_tiles, dev);
  p.acc_tap = acc_tap;

  // Persistent grid: as many clusters as can be resident (occupancy query with
  // the cluster shape), at most one per tile; `grid` overrides the CTA count
  // (rounded down to whole clusters, at least one).
  int64_t clusters = 0;
  if (a.grid > 0) {
    clusters = a.grid / CG > 0 ? a.grid / CG : 1;
  } else {
    // A failed query (-1) falls back to one cluster per CG SMs, like 0.
    const int resident = sm100::max_active_clusters<CG>();
    clusters = resident > 0 ? resident : dev.num_sms / CG;
    if (clusters < 1) clusters = 1;
  }
  if (clusters > num_tiles) clusters = num_tiles;
  const unsigned grid = static_cast<unsigned>(clusters * CG);

  return sm100::launch_kernel<CG>(tm, p, grid, a.use_pdl != 0, s);
}

}  // namespace

m3qkv_status sm100_fused(const m3qkv_fused_args& a, const DeviceInfo& dev, float* acc_tap, cudaStream_t s) {
  M3QKV_TRY(ensure_attributes(dev));
  const int heads = total_heads(a.nq, a.nkv, a.niq, a.nik);
  const int cg = a.cta_group == 1 || a.cta_group == 2 ? a.cta_group : choose_cta_group(a.m, heads, dev.num_sms);
  return cg == 2 ? launch<2>(a, dev, acc_tap, s) : launch<1>(a, dev, acc_tap, s);
}

m3qkv_status sm100_warmup(const DeviceInfo& dev) {
  // Setting the attributes loads the module and prepares both tile configs.
  return ensure_attributes(dev);
}

}  // namespace m3qkv
