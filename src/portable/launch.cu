// Host launchers of the portable backend (CC >= 8.0). Arguments arrive
// validated with m > 0 (api.cpp). With use_pdl the programmatic-stream-
// serialization attribute is set on CC >= 9.0 (the kernels call
// griddepcontrol.wait before reading any input). `grid` (fused, gemm,
// insert): the kernels loop over their work items with a grid stride, so any
// grid >= 1 is correct; plan.h turns it into the CTA count (0 = one CTA per
// tile for fused and gemm, one item per warp for insert: plan.h insert_plan).
#include "host/launch.h"
#include "host/once.h"
#include "host/timing.h"
#include "host/workspace.h"
#include "portable/kernels.cuh"
#include "portable/mainloop.cuh"
#include "portable/plan.h"
#include "portable/portable.h"

namespace m3qkv {
namespace {

using portable::kSmemBytes;

// Nothing to keep: the slot records that the attributes are set.
struct PortableSetup {};

// cudaFuncSetAttribute (max dynamic shared memory) of the two GEMM kernels,
// once per context (warmup or first use).
m3qkv_status ensure_smem_attributes(const char* fn, const DeviceInfo& dev) {
  if (dev.max_smem_optin < kSmemBytes)
    return fail(M3QKV_ERROR_UNSUPPORTED_DEVICE,
                "%s: portable kernels need %d bytes of shared memory per block, device %d allows %d", fn, kSmemBytes,
                dev.device, dev.max_smem_optin);
  const PortableSetup* setup = nullptr;
  return host::once(fn, dev, host::OnceSlot::kPortable, [fn](PortableSetup*) -> m3qkv_status {
    M3QKV_CUDA_TRY(fn, cudaFuncSetAttribute(m3qkv_portable_fused_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            kSmemBytes));
    M3QKV_CUDA_TRY(fn, cudaFuncSetAttribute(m3qkv_portable_gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            kSmemBytes));
    return M3QKV_SUCCESS;
  }, &setup);
}

host::LaunchShape shape(unsigned grid, int threads, int smem, int32_t use_pdl, const DeviceInfo& dev) {
  host::LaunchShape s;
  s.grid = grid;
  s.threads = static_cast<unsigned>(threads);
  s.smem = static_cast<size_t>(smem);
  s.pdl = use_pdl != 0 && dev.cc_major >= 9;  // PDL exists from CC 9.0
  return s;
}

portable::GemmOperands operands(const void* xq, const void* xsf, const void* x_bf16, const void* wq, const void* wsf,
                                int64_t m, int64_t n, int64_t k) {
  portable::GemmOperands g;
  g.xq = static_cast<const uint8_t*>(xq);
  g.xsf = static_cast<const uint8_t*>(xsf);
  g.xb = static_cast<const uint16_t*>(x_bf16);
  g.wq = static_cast<const uint8_t*>(wq);
  g.wsf = static_cast<const uint8_t*>(wsf);
  g.m = m;
  g.n = n;
  g.k = k;
  return g;
}

}  // namespace

m3qkv_status portable_fused(const m3qkv_fused_args& a, const DeviceInfo& dev, float* acc_tap, cudaStream_t s) {
  const char* fn = "m3qkv_fused_qkv";
  M3QKV_TRY(ensure_smem_attributes(fn, dev));
  host::timing_mark(host::Phase::kSetup);
  const int64_t n = static_cast<int64_t>(total_heads(a.nq, a.nkv, a.niq, a.nik)) * kHeadDim;
  const int64_t tiles = portable::gemm_tiles(a.m, n, portable::kBM, portable::kBN);
  const host::LaunchShape sh = shape(portable::plan_grid(tiles, 1, a.grid), portable::kThreads, kSmemBytes, a.use_pdl, dev);
  host::timing_mark(host::Phase::kPlan);
  portable::FusedParams p;
  p.g = operands(a.xq, a.xsf, a.x_bf16, a.wq, a.wsf, a.m, n, a.k);
  p.e = epi::make_epilogue_params(a);
  p.acc_tap = acc_tap;
  const m3qkv_status st = host::launch(fn, "m3qkv_portable_fused_kernel", m3qkv_portable_fused_kernel, sh, s, p);
  host::timing_mark(host::Phase::kLaunch);
  return st;
}

m3qkv_status portable_gemm(const m3qkv_gemm_args& a, const DeviceInfo& dev, cudaStream_t s) {
  const char* fn = "m3qkv_mxfp8_gemm";
  M3QKV_TRY(ensure_smem_attributes(fn, dev));
  host::timing_mark(host::Phase::kSetup);
  const int64_t tiles = portable::gemm_tiles(a.m, a.n, portable::kBM, portable::kBN);
  const host::LaunchShape sh = shape(portable::plan_grid(tiles, 1, a.grid), portable::kThreads, kSmemBytes, a.use_pdl, dev);
  host::timing_mark(host::Phase::kPlan);
  portable::GemmParams p;
  p.g = operands(a.xq, a.xsf, a.x_bf16, a.wq, a.wsf, a.m, a.n, a.k);
  p.out = static_cast<uint16_t*>(a.out);
  const m3qkv_status st = host::launch(fn, "m3qkv_portable_gemm_kernel", m3qkv_portable_gemm_kernel, sh, s, p);
  host::timing_mark(host::Phase::kLaunch);
  return st;
}

namespace {
// The whole-call owner passes (plan.h kOwnerPassMinM): the table and the
// resolved slot words in the stream workspace past its zeroed head; p's slot
// words then point at the resolved ones.
m3qkv_status resolve_slot_owners(const char* fn, const m3qkv_insert_args& a, const DeviceInfo& dev, cudaStream_t s,
                                 portable::InsertParams* p, host::WorkspaceLease* lease) {
  portable::OwnerPassParams q;
  q.slots = a.nkv > 0 ? static_cast<const int64_t*>(a.slot_mapping) : nullptr;
  q.index_slots = a.nik > 0 ? static_cast<const int64_t*>(a.index_slot_mapping) : nullptr;
  q.m = a.m;
  q.entries = epi::owner_entries_for(2 * a.m);
  const size_t m8 = static_cast<size_t>(a.m) * 8, e = static_cast<size_t>(q.entries);
  const size_t off_key = host::kSplitkPartialsOffset, off_last = off_key + e * 8, off_slots = off_last + e * 4,
               off_index = off_slots + (m8 + 255) / 256 * 256, bytes = off_index + m8;
  void* ws = nullptr;
  M3QKV_TRY(host::stream_workspace(dev, s, bytes, &ws, lease));
  uint8_t* b = static_cast<uint8_t*>(ws);
  q.key = reinterpret_cast<unsigned long long*>(b + off_key);
  q.last = reinterpret_cast<int32_t*>(b + off_last);
  q.out_slots = reinterpret_cast<int64_t*>(b + off_slots);
  q.out_index = reinterpret_cast<int64_t*>(b + off_index);
  const auto grid_for = [&](int64_t work) {
    const int64_t blocks = (work + portable::kInsertThreads - 1) / portable::kInsertThreads;
    const int64_t cap = int64_t{8} * dev.num_sms;  // grid-stride beyond 8 CTAs per SM
    return static_cast<unsigned>(blocks < cap ? blocks : cap);
  };
  M3QKV_TRY(host::launch(fn, "m3qkv_portable_slot_owners_clear_kernel", m3qkv_portable_slot_owners_clear_kernel,
                         shape(grid_for(q.entries), portable::kInsertThreads, 0, a.use_pdl, dev), s, q));
  M3QKV_TRY(host::launch(fn, "m3qkv_portable_slot_owners_insert_kernel", m3qkv_portable_slot_owners_insert_kernel,
                         shape(grid_for(2 * a.m), portable::kInsertThreads, 0, a.use_pdl, dev), s, q));
  M3QKV_TRY(host::launch(fn, "m3qkv_portable_slot_owners_resolve_kernel", m3qkv_portable_slot_owners_resolve_kernel,
                         shape(grid_for(a.m), portable::kInsertThreads, 0, a.use_pdl, dev), s, q));
  if (q.slots != nullptr) p->e.slot_mapping = q.out_slots;
  if (q.index_slots != nullptr) p->e.index_slot_mapping = q.out_index;
  p->owners_resolved = 1;
  return M3QKV_SUCCESS;
}
}  // namespace

m3qkv_status portable_insert(const m3qkv_insert_args& a, const DeviceInfo& dev, cudaStream_t s, int layout) {
  const portable::InsertPlan plan =
      portable::insert_plan(a.m, total_heads(a.nq, a.nkv, a.niq, a.nik), cache_heads(a.nkv, a.nik),
                            a.kv_cache_dtype == kCacheNvfp4, dev.num_sms, a.grid, static_cast<portable::InsertLayout>(layout));
  const host::LaunchShape sh = shape(plan.grid, portable::kInsertThreads, 0, a.use_pdl, dev);
  host::timing_mark(host::Phase::kPlan);
  portable::InsertParams p;
  p.qkv = static_cast<const uint16_t*>(a.qkv);
  p.m = a.m;
  p.e = epi::make_epilogue_params(a);
  p.owners_resolved = 0;
  const char* fn = "m3qkv_qknorm_rope_kv_insert";
  host::WorkspaceLease lease;  // through the launches
  if (plan.owner_passes) M3QKV_TRY(resolve_slot_owners(fn, a, dev, s, &p, &lease));
  m3qkv_status st;
  switch (plan.layout) {
    case portable::InsertLayout::kWarpRows:
      st = host::launch(fn, "m3qkv_portable_insert_warp_kernel", m3qkv_portable_insert_warp_kernel, sh, s, p);
      break;
    case portable::InsertLayout::kLane8Rows:
      st = host::launch(fn, "m3qkv_portable_insert_lanes8_kernel", m3qkv_portable_insert_lanes8_kernel, sh, s, p);
      break;
    case portable::InsertLayout::kSplitC32Q8:
      st = host::launch(fn, "m3qkv_portable_insert_split_c32q8_kernel", m3qkv_portable_insert_split_c32q8_kernel, sh, s,
                        p);
      break;
    case portable::InsertLayout::kSplitC16Q8:
      st = host::launch(fn, "m3qkv_portable_insert_split_c16q8_kernel", m3qkv_portable_insert_split_c16q8_kernel, sh, s,
                        p);
      break;
    case portable::InsertLayout::kSplitC16Q8Guess:
      st = host::launch(fn, "m3qkv_portable_insert_split_c16q8_guess_kernel",
                        m3qkv_portable_insert_split_c16q8_guess_kernel, sh, s, p);
      break;
    default:  // quad rows
      st = host::launch(fn, "m3qkv_portable_insert_kernel", m3qkv_portable_insert_kernel, sh, s, p);
  }
  host::timing_mark(host::Phase::kLaunch);
  return st;
}

m3qkv_status portable_quantize(const m3qkv_quantize_args& a, const DeviceInfo& dev, cudaStream_t s) {
  const int64_t items = f8_128x4_padded_rows(a.m) * (a.k / kMxBlock);
  const host::LaunchShape sh =
      shape(portable::plan_grid(items, portable::kQuantizeThreads, 0), portable::kQuantizeThreads, 0, a.use_pdl, dev);
  host::timing_mark(host::Phase::kPlan);
  portable::QuantizeParams p;
  p.x = static_cast<const uint16_t*>(a.x);
  p.xq = static_cast<uint8_t*>(a.xq);
  p.xsf = static_cast<uint8_t*>(a.xsf);
  p.m = a.m;
  p.k = a.k;
  const m3qkv_status st = host::launch("m3qkv_mxfp8_quantize", "m3qkv_portable_quantize_kernel",
                                       m3qkv_portable_quantize_kernel, sh, s, p);
  host::timing_mark(host::Phase::kLaunch);
  return st;
}

m3qkv_status portable_warmup(const DeviceInfo& dev) {
  const char* fn = "m3qkv_warmup";
  M3QKV_TRY(ensure_smem_attributes(fn, dev));
  // Loads the module (lazy loading would otherwise do it on the first launch).
  cudaFuncAttributes attr;
  M3QKV_CUDA_TRY(fn, cudaFuncGetAttributes(&attr, m3qkv_portable_fused_kernel));
  M3QKV_CUDA_TRY(fn, cudaFuncGetAttributes(&attr, m3qkv_portable_gemm_kernel));
  M3QKV_CUDA_TRY(fn, cudaFuncGetAttributes(&attr, m3qkv_portable_insert_kernel));
  M3QKV_CUDA_TRY(fn, cudaFuncGetAttributes(&attr, m3qkv_portable_insert_warp_kernel));
  M3QKV_CUDA_TRY(fn, cudaFuncGetAttributes(&attr, m3qkv_portable_insert_lanes8_kernel));
  M3QKV_CUDA_TRY(fn, cudaFuncGetAttributes(&attr, m3qkv_portable_insert_split_c32q8_kernel));
  M3QKV_CUDA_TRY(fn, cudaFuncGetAttributes(&attr, m3qkv_portable_insert_split_c16q8_kernel));
  M3QKV_CUDA_TRY(fn, cudaFuncGetAttributes(&attr, m3qkv_portable_insert_split_c16q8_guess_kernel));
  M3QKV_CUDA_TRY(fn, cudaFuncGetAttributes(&attr, m3qkv_portable_quantize_kernel));
  return M3QKV_SUCCESS;
}

}  // namespace m3qkv
