// Host launcher of the SM90 fused kernels: tensor maps, tile shape, persistent
// grid, PDL, variant choice. The kernels are in fused_fp8promo_sm90.cu (B) and
// fused_bf16dq_sm90.cu (A); docs/sm90.md has the design.
#include <atomic>
#include <climits>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "common/epilogue.cuh"
#include "common/tensor_map.h"
#include "sm90/decode_config.h"
#include "sm90/kernel_sm90.cuh"
#include "sm90/sm90.h"

#define SM90_TRY(expr)                    \
  do {                                    \
    const m3qkv_status st_ = (expr);      \
    if (st_ != M3QKV_SUCCESS) return st_; \
  } while (0)

namespace m3qkv {
namespace {

// Grouped rasterization: heads per band (kernel_sm90.cuh tile_of). 8 heads of
// K = 6144 e4m3 weights are 6 MiB; with ~132 resident tiles that is ~16 row
// blocks of activations (12 MiB at BM = 128): both stay in the 50 MiB L2.
constexpr int kBandHeads = 8;

// cudaOccupancyMaxActiveClusters of the split-K instances, per device /
// variant / epilogue / cluster size (filled by prepare_device).
constexpr int kMaxDevices = 64;
int g_max_clusters[kMaxDevices][2][2][kSm90MaxSplit + 1];

// Test-only timeline buffer (sm90_set_trace); null = off.
uint64_t* g_trace = nullptr;
int g_trace_ctas = 0;

// cudaFuncSetAttribute (max dynamic shared memory) and the cluster occupancy
// table, once per device. The slow path runs under a mutex: two host threads
// making their first call at once would otherwise both write the table (same
// values, but a data race). A failed occupancy query leaves 0 in the table
// (no split-K of that size for this call) and the device unprepared, so the
// next call asks again instead of running without split-K for the rest of
// the process.
m3qkv_status prepare_device(const DeviceInfo& dev) {
  static std::atomic<uint64_t> prepared{0};
  static std::mutex slow_path;
  const uint64_t bit = (dev.device >= 0 && dev.device < 64) ? (uint64_t{1} << dev.device) : 0;
  if (bit != 0 && (prepared.load(std::memory_order_acquire) & bit) != 0) return M3QKV_SUCCESS;
  std::lock_guard<std::mutex> lock(slow_path);
  if (bit != 0 && (prepared.load(std::memory_order_acquire) & bit) != 0) return M3QKV_SUCCESS;
  cudaError_t e = sm90::prepare_fp8promo();
  if (e == cudaSuccess) e = sm90::prepare_bf16dq();
  if (e == cudaSuccess) e = sm90::decode::prepare_decode();
  if (e != cudaSuccess)
    return fail(M3QKV_ERROR_CUDA_ERROR, "sm90: cudaFuncSetAttribute(MaxDynamicSharedMemorySize) on device %d: %s (%s)",
                dev.device, cudaGetErrorName(e), cudaGetErrorString(e));
  bool complete = bit != 0;
  if (bit != 0) {
    for (int v = 0; v < 2; ++v)
      for (int ep = 0; ep < 2; ++ep)
        for (int sp = 2; sp <= kSm90MaxSplit; ++sp) {
          const int n = v == kSm90Fp8Promote ? sm90::max_clusters_fp8promo(ep != 0, sp)
                                             : sm90::max_clusters_bf16dq(ep != 0, sp);
          g_max_clusters[dev.device][v][ep][sp] = n > 0 ? n : 0;
          complete = complete && n >= 0;
        }
  }
  if (complete) prepared.fetch_or(bit, std::memory_order_acq_rel);
  return M3QKV_SUCCESS;
}

// Split-K workspace of the decode kernel, one per (device, stream): partial
// slots and arrival counters that each launch leaves at zero. Concurrent calls
// on different streams must not share one; calls on one stream are ordered.
// INTERIM (to move into the host layer's per-context service): streams are
// named by cudaStreamGetId outside capture and by their handle during capture
// (cudaStreamGetId is refused while a stream captures: seen on the H200,
// cudaErrorStreamCaptureUnsupported); the allocation runs with the thread's
// capture mode exchanged to relaxed and the zeroing on a private stream, so
// nothing joins a capture; buffers are freed at process exit.
struct WorkspaceTable {
  struct Entry {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  std::mutex mu;
  std::map<std::tuple<int, int, unsigned long long>, Entry> live;
  std::vector<void*> retired;
  std::map<int, cudaStream_t> zero_streams;
  ~WorkspaceTable() {
    for (auto& kv : live) (void)cudaFree(kv.second.ptr);
    for (void* p : retired) (void)cudaFree(p);
    (void)cudaGetLastError();
  }
};
WorkspaceTable& workspaces() {
  static WorkspaceTable t;
  return t;
}

m3qkv_status decode_workspace(const DeviceInfo& dev, cudaStream_t s, size_t bytes, size_t zero_bytes, void** out) {
  const char* fn = "m3qkv_fused_qkv: decode workspace";
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  cudaError_t e = cudaStreamIsCapturing(s, &cs);
  if (e != cudaSuccess) return fail(M3QKV_ERROR_CUDA_ERROR, "%s: cudaStreamIsCapturing: %s", fn, cudaGetErrorName(e));
  const bool capturing = cs != cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  if (capturing) {
    id = static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(s));
  } else if ((e = cudaStreamGetId(s, &id)) != cudaSuccess) {
    return fail(M3QKV_ERROR_CUDA_ERROR, "%s: cudaStreamGetId: %s", fn, cudaGetErrorName(e));
  }
  WorkspaceTable& t = workspaces();
  std::lock_guard<std::mutex> lock(t.mu);
  WorkspaceTable::Entry& w = t.live[std::make_tuple(dev.device, capturing ? 1 : 0, id)];
  if (w.bytes < bytes) {
    const size_t want = w.bytes * 2 > bytes ? w.bytes * 2 : bytes;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    e = cudaThreadExchangeStreamCaptureMode(&mode);
    void* p = nullptr;
    if (e == cudaSuccess) e = cudaMalloc(&p, want);
    cudaStream_t& zs = t.zero_streams[dev.device];
    if (e == cudaSuccess && zs == nullptr) e = cudaStreamCreateWithFlags(&zs, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMemsetAsync(p, 0, zero_bytes < want ? zero_bytes : want, zs);
    if (e == cudaSuccess) e = cudaStreamSynchronize(zs);
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    if (e != cudaSuccess) {
      if (p != nullptr) (void)cudaFree(p);
      (void)cudaGetLastError();
      return fail(M3QKV_ERROR_CUDA_ERROR, "%s: allocating %zu bytes: %s (%s)", fn, want, cudaGetErrorName(e),
                  cudaGetErrorString(e));
    }
    // The old buffer may still be in use by earlier launches (or a captured
    // graph): kept until exit (growth is geometric: O(log) buffers).
    if (w.ptr != nullptr) t.retired.push_back(w.ptr);
    w.ptr = p;
    w.bytes = want;
  }
  *out = w.ptr;
  return M3QKV_SUCCESS;
}

}  // namespace

bool sm90_uses_decode(int64_t m) { return m >= 1 && m <= sm90::kDecodeMaxM; }

m3qkv_status sm90_fused_decode(const m3qkv_fused_args& a, const DeviceInfo& dev, float* acc_tap, cudaStream_t s,
                               int split) {
  if (a.m < 1 || a.m > sm90::kDecodeMaxM)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT, "sm90_fused_decode: m = %lld is outside [1, %lld]",
                static_cast<long long>(a.m), static_cast<long long>(sm90::kDecodeMaxM));
  if (split < 0)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT, "sm90_fused_decode: split = %d must be >= 0 (0 = automatic)", split);
  SM90_TRY(prepare_device(dev));
  const int heads = total_heads(a.nq, a.nkv, a.niq, a.nik);
  const int ks = static_cast<int>(a.k / sm90::kBK);
  const sm90::DecodePlan plan = sm90::plan_decode(a.m, heads, ks, dev.num_sms, split, a.grid);
  if (plan.nt == 0 || plan.units > INT32_MAX)
    return fail(M3QKV_ERROR_INTERNAL, "sm90_fused_decode: no decode plan for m = %lld, %d heads, k = %lld",
                static_cast<long long>(a.m), heads, static_cast<long long>(a.k));

  CUtensorMap tmap_w, tmap_x;
  SM90_TRY(make_tensor_map_2d_u8(&tmap_w, "wq", a.wq, static_cast<uint64_t>(a.k),
                                 static_cast<uint64_t>(heads) * kHeadDim, static_cast<uint64_t>(a.k), sm90::decode::kBK,
                                 sm90::decode::kHeadRows, CU_TENSOR_MAP_SWIZZLE_NONE));
  SM90_TRY(make_tensor_map_2d_u8(&tmap_x, "xq", a.xq, static_cast<uint64_t>(a.k), static_cast<uint64_t>(a.m),
                                 static_cast<uint64_t>(a.k), sm90::decode::kBK, static_cast<uint32_t>(plan.nt),
                                 CU_TENSOR_MAP_SWIZZLE_NONE));

  sm90::decode::Params p;
  p.m = static_cast<int32_t>(a.m);
  p.heads = heads;
  p.k_stages = ks;
  p.token_blocks = plan.token_blocks;
  p.split = plan.split;
  p.units = static_cast<int32_t>(plan.units);
  p.xsf = static_cast<const uint8_t*>(a.xsf);
  p.wsf = static_cast<const uint8_t*>(a.wsf);
  p.counters = nullptr;
  p.partials = nullptr;
  if (plan.split > 1) {
    void* ws = nullptr;
    SM90_TRY(decode_workspace(dev, s, static_cast<size_t>(plan.workspace_bytes), static_cast<size_t>(plan.counter_bytes),
                              &ws));
    p.counters = static_cast<uint32_t*>(ws);
    p.partials = reinterpret_cast<float*>(static_cast<uint8_t*>(ws) + plan.counter_bytes);
  }
  p.acc_tap = acc_tap;
  p.n = static_cast<int64_t>(heads) * kHeadDim;
  p.epi = epi::make_epilogue_params(a);
  const cudaError_t e = sm90::decode::launch_decode(plan.nt, tmap_w, tmap_x, p, plan.grid, a.use_pdl != 0, s);
  if (e != cudaSuccess)
    return fail(M3QKV_ERROR_CUDA_ERROR, "m3qkv_fused_qkv: SM90 decode kernel launch (NT %d, split %d, grid %d): %s (%s)",
                plan.nt, plan.split, plan.grid, cudaGetErrorName(e), cudaGetErrorString(e));
  return M3QKV_SUCCESS;
}

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
  SM90_TRY(prepare_device(dev));

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
  SM90_TRY(make_tensor_map_2d_u8(&tmap_x, "xq", a.xq, static_cast<uint64_t>(a.k), static_cast<uint64_t>(a.m),
                                 static_cast<uint64_t>(a.k), sm90::kBK, static_cast<uint32_t>(bm),
                                 CU_TENSOR_MAP_SWIZZLE_128B));
  SM90_TRY(make_tensor_map_2d_u8(&tmap_w, "wq", a.wq, static_cast<uint64_t>(a.k),
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
  const int dev_idx = dev.device >= 0 && dev.device < kMaxDevices ? dev.device : -1;
  int sp = 1;
  if (split > 1) {
    if (cons != 1)
      return fail(M3QKV_ERROR_INVALID_ARGUMENT,
                  "sm90_fused_variant: split-K needs 64-row tiles (block_m %d, M %lld gives 128)", block_m,
                  static_cast<long long>(a.m));
    sp = split < ks ? split : ks;
  } else if (split == 0 && cons == 1 && dev_idx >= 0) {
    const int64_t sms = dev.num_sms > 0 ? dev.num_sms : 1;
    int64_t best = ((tiles + sms - 1) / sms) * (kFixed + ks);
    for (int c = 2; c <= kSm90MaxSplit && c <= ks; ++c) {
      const int64_t mc = g_max_clusters[dev_idx][variant][epilogue][c];
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
    const int64_t mc = dev_idx >= 0 ? g_max_clusters[dev_idx][variant][epilogue][sp] : 0;
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
  const cudaError_t e = variant == kSm90Fp8Promote
                            ? sm90::launch_fp8promo(cons, reg_epi, tmap_x, tmap_w, p, grid, pdl, s)
                            : sm90::launch_bf16dq(cons, reg_epi, tmap_x, tmap_w, p, grid, pdl, s);
  if (e != cudaSuccess)
    return fail(M3QKV_ERROR_CUDA_ERROR,
                "m3qkv_fused_qkv: SM90 kernel launch (variant %d, epilogue %d, BM %d, grid %d, split %d): %s (%s)",
                variant, epilogue, bm, grid, sp, cudaGetErrorName(e), cudaGetErrorString(e));
  return M3QKV_SUCCESS;
}

m3qkv_status sm90_fused(const m3qkv_fused_args& a, const DeviceInfo& dev, float* acc_tap, cudaStream_t s) {
  if (sm90_uses_decode(a.m)) return sm90_fused_decode(a, dev, acc_tap, s, 0);
  return sm90_fused_variant(a, dev, acc_tap, s, kSm90DefaultVariant, 0, kSm90DefaultEpilogue, 0);
}

m3qkv_status sm90_warmup(const DeviceInfo& dev) { return prepare_device(dev); }

void sm90_set_trace(uint64_t* device_buffer, int ctas) {
  g_trace = ctas > 0 ? device_buffer : nullptr;
  g_trace_ctas = g_trace != nullptr ? ctas : 0;
}

int sm90_max_active_clusters(const DeviceInfo& dev, int variant, int epilogue, int split) {
  if (dev.device < 0 || dev.device >= kMaxDevices || (variant != 0 && variant != 1) || (epilogue != 0 && epilogue != 1) ||
      split < 2 || split > kSm90MaxSplit || prepare_device(dev) != M3QKV_SUCCESS)
    return 0;
  return g_max_clusters[dev.device][variant][epilogue][split];
}

}  // namespace m3qkv
