// Host launcher of the SM100 kernels: one-time setup, the choice between the
// tile kernel (fused_sm100.cu; plan.h: cta_group, tiles, grouped-M width,
// persistent grid) and the decode variant for small M (decode_sm100.cu;
// splitk_plan.h with decode_config.h's target), tensor maps, params, the
// decode workspace, cluster + PDL launch. Arguments arrive validated with
// m > 0 (api.cpp).
#include <cstdint>

#include "common/epilogue.cuh"
#include "common/layouts.h"
#include "host/once.h"
#include "host/tensor_map.h"
#include "host/timing.h"
#include "host/workspace.h"
#include "sm100/config.h"
#include "sm100/decode_config.h"
#include "sm100/plan.h"
#include "sm100/sm100.h"

namespace m3qkv {
namespace {

using sm100::Config;

constexpr const char* kFn = "m3qkv_fused_qkv";

static_assert(Config<1>::kRowsPerTile == 128 && Config<2>::kRowsPerTile == 256 && Config<1>::BK == 128 &&
                  Config<2>::BK == 128,
              "plan.h tiles are 128·cta_group rows, K blocks of 128");

// The one-time setup of a context: shared-memory attributes of both tile
// configurations and of the decode instances, and
// cudaOccupancyMaxActiveClusters of each tile configuration (asked here
// once, not per call; -1 when the query failed: the plan then assumes one
// cluster per cta_group SMs).
struct Sm100Setup {
  int resident_clusters[3];
};

m3qkv_status prepare(const DeviceInfo& dev, const Sm100Setup** out) {
  constexpr int kTileNeed =
      static_cast<int>(Config<1>::kSmemBytes > Config<2>::kSmemBytes ? Config<1>::kSmemBytes : Config<2>::kSmemBytes);
  const int decode_need = static_cast<int>(sm100::decode::decode_smem_bytes_max());
  const int kNeed = kTileNeed > decode_need ? kTileNeed : decode_need;
  if (dev.max_smem_optin < kNeed)
    return fail(M3QKV_ERROR_UNSUPPORTED_DEVICE,
                "%s: SM100 kernel needs %d bytes of shared memory per block, device %d allows %d", kFn, kNeed,
                dev.device, dev.max_smem_optin);
  return host::once(kFn, dev, host::OnceSlot::kSm100, [](Sm100Setup* s) -> m3qkv_status {
    M3QKV_CUDA_TRY(kFn, sm100::set_kernel_attributes<1>());
    M3QKV_CUDA_TRY(kFn, sm100::set_kernel_attributes<2>());
    M3QKV_CUDA_TRY(kFn, sm100::decode::set_decode_attributes());
    s->resident_clusters[0] = 0;
    s->resident_clusters[1] = sm100::max_active_clusters<1>();
    s->resident_clusters[2] = sm100::max_active_clusters<2>();
    return M3QKV_SUCCESS;
  }, out);
}

template <int CG>
m3qkv_status launch(const m3qkv_fused_args& a, const sm100::Plan& plan, float* acc_tap, cudaStream_t s) {
  using C = Config<CG>;
  const int heads = total_heads(a.nq, a.nkv, a.niq, a.nik);
  const int64_t n = static_cast<int64_t>(heads) * kHeadDim;
  const int64_t sf_cols = a.k / kMxBlock;
  const int64_t sfa_bytes = f8_128x4_bytes(a.m, sf_cols);
  const int64_t sfb_bytes = f8_128x4_bytes(n, sf_cols);

  sm100::TensorMaps tm;
  M3QKV_TRY(host::make_tensor_map_2d_u8(kFn, &tm.a, "xq", a.xq, a.k, a.m, a.k, 128, 128, CU_TENSOR_MAP_SWIZZLE_128B));
  M3QKV_TRY(host::make_tensor_map_2d_u8(kFn, &tm.b, "wq", a.wq, a.k, n, a.k, 128, 128, CU_TENSOR_MAP_SWIZZLE_128B));
  M3QKV_TRY(host::make_tensor_map_2d_u8(kFn, &tm.sfa, "xsf", a.xsf, 256, sfa_bytes / 256, 256, 256, 2,
                                        CU_TENSOR_MAP_SWIZZLE_NONE));
  M3QKV_TRY(host::make_tensor_map_2d_u8(kFn, &tm.sfb, "wsf", a.wsf, 256, sfb_bytes / 256, 256, 256, 2,
                                        CU_TENSOR_MAP_SWIZZLE_NONE));
  host::timing_mark(host::Phase::kTensorMaps);

  sm100::Params p;
  p.ep = epi::make_epilogue_params(a);
  p.m = a.m;
  p.num_heads = heads;
  p.num_k_blocks = static_cast<int32_t>(a.k / C::BK);
  p.num_m_tiles = static_cast<int32_t>(plan.num_m_tiles);
  p.num_n_tiles = static_cast<int32_t>(plan.num_n_tiles);
  p.num_tiles = static_cast<int32_t>(plan.num_tiles);
  p.group_m = plan.group_m;
  p.acc_tap = acc_tap;
  const m3qkv_status st = sm100::launch_kernel<CG>(tm, p, plan.grid, a.use_pdl != 0, s);
  host::timing_mark(host::Phase::kLaunch);
  return st;
}

}  // namespace

m3qkv_status sm100_fused_decode(const m3qkv_fused_args& a, const DeviceInfo& dev, float* acc_tap, cudaStream_t s,
                                const Sm100DecodeOptions& opt) {
  namespace dec = sm100::decode;
  if (a.m < 1 || a.m > dec::kMaxM)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT, "sm100_fused_decode: m = %lld is outside [1, %lld]",
                static_cast<long long>(a.m), static_cast<long long>(dec::kMaxM));
  if (opt.split < 0)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT, "sm100_fused_decode: split = %d must be >= 0 (0 = automatic)", opt.split);
  const Sm100Setup* setup = nullptr;
  M3QKV_TRY(prepare(dev, &setup));
  host::timing_mark(host::Phase::kSetup);
  const int heads = total_heads(a.nq, a.nkv, a.niq, a.nik);
  const int ks = static_cast<int>(a.k / 128);
  const splitk::Plan plan = sm100::plan_decode_memo(a.m, heads, ks, dev.num_sms, opt.split, a.grid);
  if (plan.nt == 0 || plan.units > INT32_MAX)
    return fail(M3QKV_ERROR_INTERNAL, "sm100_fused_decode: no decode plan for m = %lld, %d heads, k = %lld",
                static_cast<long long>(a.m), heads, static_cast<long long>(a.k));
  host::timing_mark(host::Phase::kPlan);

  const int64_t n = static_cast<int64_t>(heads) * kHeadDim;
  const int64_t sf_cols = a.k / kMxBlock;
  const int64_t sfx_bytes = f8_128x4_bytes(a.m, sf_cols);
  const int64_t sfw_bytes = f8_128x4_bytes(n, sf_cols);
  dec::DecodeTensorMaps tm;
  M3QKV_TRY(host::make_tensor_map_2d_u8(kFn, &tm.w, "wq", a.wq, a.k, n, a.k, 128, 128, CU_TENSOR_MAP_SWIZZLE_128B));
  M3QKV_TRY(host::make_tensor_map_2d_u8(kFn, &tm.x, "xq", a.xq, a.k, a.m, a.k, 128, static_cast<uint32_t>(plan.nt),
                                        CU_TENSOR_MAP_SWIZZLE_128B));
  M3QKV_TRY(host::make_tensor_map_2d_u8(kFn, &tm.sfw, "wsf", a.wsf, 256, sfw_bytes / 256, 256, 256, 2,
                                        CU_TENSOR_MAP_SWIZZLE_NONE));
  M3QKV_TRY(host::make_tensor_map_2d_u8(kFn, &tm.sfx, "xsf", a.xsf, 256, sfx_bytes / 256, 256, 256, 2,
                                        CU_TENSOR_MAP_SWIZZLE_NONE));
  host::timing_mark(host::Phase::kTensorMaps);

  dec::DecodeParams p;
  p.m = static_cast<int32_t>(a.m);
  p.heads = heads;
  p.k_stages = ks;
  p.token_blocks = plan.token_blocks;
  p.split = plan.split;
  p.units = static_cast<int32_t>(plan.units);
  host::WorkspaceLease lease;  // through the launch
  host::SplitkBuffers ws;
  M3QKV_TRY(host::splitk_workspace("sm100_fused_decode", dev, s, plan, &ws, &lease));
  p.counters = ws.counters;
  p.partials = ws.partials;
  p.acc_tap = acc_tap;
  p.n = n;
  p.epi = epi::make_epilogue_params(a);
  p.l2_prefetch = a.use_pdl != 0 ? 1 : 0;
  p.test_skip_split = opt.skip_split;
  const m3qkv_status st = dec::launch_decode(plan.nt, tm, p, plan.grid, a.use_pdl != 0, s);
  host::timing_mark(host::Phase::kLaunch);
  return st;
}

m3qkv_status sm100_fused(const m3qkv_fused_args& a, const DeviceInfo& dev, float* acc_tap, cudaStream_t s) {
  if (sm100::uses_decode(a.m, a.cta_group)) return sm100_fused_decode(a, dev, acc_tap, s);
  const Sm100Setup* setup = nullptr;
  M3QKV_TRY(prepare(dev, &setup));
  host::timing_mark(host::Phase::kSetup);
  sm100::PlanInput in;
  in.m = a.m;
  in.k = a.k;
  in.heads = total_heads(a.nq, a.nkv, a.niq, a.nik);
  in.cta_group = a.cta_group;
  in.grid = a.grid;
  in.num_sms = dev.num_sms;
  in.l2_bytes = dev.l2_bytes;
  for (int cg = 1; cg <= 2; ++cg) in.resident_clusters[cg] = setup->resident_clusters[cg];
  sm100::Plan plan;
  M3QKV_TRY(sm100::plan(kFn, in, &plan));
  host::timing_mark(host::Phase::kPlan);
  return plan.cta_group == 2 ? launch<2>(a, plan, acc_tap, s) : launch<1>(a, plan, acc_tap, s);
}

m3qkv_status sm100_warmup(const DeviceInfo& dev) {
  // Setting the attributes loads the module and prepares every configuration.
  const Sm100Setup* setup = nullptr;
  return prepare(dev, &setup);
}

}  // namespace m3qkv
