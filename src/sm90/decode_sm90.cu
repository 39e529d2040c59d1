// SM90 decode kernel (M <= 256): the weights are the wgmma M side, the tokens
// the N side (swap A/B), K is split across a persistent grid so that every SM
// streams weights, and the f32 partials meet through a workspace in L2.
//
//   warps 0-7  consumers: two warpgroups, rows 0-63 / 64-127 of the head. Per
//              64-K step each thread dequantizes its 2 weight rows × 16 B
//              straight into wgmma A-fragment registers (e4m3 · 2^e is exact
//              in bf16), the 256 threads convert the step's activations into a
//              bf16 B tile in shared memory, then 4 × wgmma m64nNTk16 (A from
//              registers). At the end of a unit: partial -> workspace, arrival
//              count, and in the last arriving unit the fixed-order sum and the
//              epilogue (epi::quad_row_epilogue, one quad per token row).
//   warp 8     TMA producer (one elected lane): per 128-K stage the head's
//              weight tile, the token block's activation tile and both scale
//              chunks, through a ring of kStages stages.
//
// K permutation. The A fragment of wgmma m64nNk16 gives lane q = l % 4 the
// logical columns {2q, 2q+1, 2q+8, 2q+9} of each k16 step (ptx/wgmma.cuh). A
// thread loads the 16 physical bytes [16q, 16q+16) of its row and a 64-K step
// and feeds byte 16q + 4s + 2h + b to logical column 16s + 8h + 2q + b of k16
// step s (h, b in {0, 1}). The activation converter writes the bf16 B tile in
// the same logical order, so the sum over K is unchanged — only its order,
// which SPEC §3 leaves to the hardware.
//
// Ordering (one named barrier per 128-K stage over the 256 consumers):
//   stage i: [A regs set i%2, both 64-K steps] [convert X into B buffers of
//            slot i%3] fence.proxy.async  bar(i)  wgmma group i (8 wgmmas)
//            commit  wait_group 1 (group i-1 retired)
//   slot i%3 was last read by group i-3, retired in both warpgroups by their
//   wait at the end of stage i-2, before bar(i-1); A set i%2 by group i-2,
//   retired by this thread's wait at the end of stage i-1.
#include <cuda.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "common/epilogue_quad.cuh"
#include "common/splitk_reduce.cuh"
#include "common/layouts.h"
#include "host/launch.h"
#include "ptx/elect.cuh"
#include "ptx/fence.cuh"
#include "ptx/globaltimer.cuh"
#include "ptx/griddepcontrol.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/setmaxnreg.cuh"
#include "ptx/sm90_extra.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"
#include "sm100/pipeline.h"
#include "sm90/decode_config.h"
#include "sm90/dequant_sm90.cuh"

namespace m3qkv::sm90::decode {
namespace {

using sm100::pipe::Ring;

template <int NT>
__device__ __forceinline__ void mma_rs(float (&acc)[NT / 2], const uint32_t (&a)[4], uint64_t desc_b, uint32_t scale_d) {
  if constexpr (NT == 16)
    wgmma::mma_async_m64n16k16_f32_bf16_bf16_rs(acc, a, desc_b, scale_d);
  else if constexpr (NT == 32)
    wgmma::mma_async_m64n32k16_f32_bf16_bf16_rs(acc, a, desc_b, scale_d);
  else if constexpr (NT == 64)
    wgmma::mma_async_m64n64k16_f32_bf16_bf16_rs(acc, a, desc_b, scale_d);
  else
    wgmma::mma_async_m64n128k16_f32_bf16_bf16_rs(acc, a, desc_b, scale_d);
}

template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) wgmma::fence_operand(r[i]);
}
__device__ __forceinline__ void fence_regs(uint32_t (&a)[kStepsPerStage][kMmasPerStep][4]) {
#pragma unroll
  for (int c2 = 0; c2 < kStepsPerStage; ++c2)
#pragma unroll
    for (int s = 0; s < kMmasPerStep; ++s)
#pragma unroll
      for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[c2][s][i])::"memory");
}

// Byte (r, scale column c) of a 512-B F8_128x4 chunk is at
// (r % 32)·16 + (r / 32)·4 + c: the 4 scale bytes of row r are one word.
__device__ __forceinline__ int sf_word_offset(int r) { return (r % 32) * 16 + (r / 32) * 4; }

// The reduction tile T[NT][128] f32 (splitk::tile_index layout) aliases the B ring.
using splitk::tile_index;

// The A fragments of one stage: rows r and r + 8, physical bytes [16q, 16q+16)
// of each 64-K step c2 of the stage's weight tile (row-major, 128 B per row,
// no swizzle), dequantized with the row's scale of MX block 2·c2 + q/2.
// a[c2][s] is the fragment of k16 slice s of step c2.
template <bool kBig>
__device__ __forceinline__ void load_a_stage(const uint8_t* w_tile, int r, int q, uint32_t sw_r, uint32_t sw_r8,
                                             uint32_t (&a)[kStepsPerStage][kMmasPerStep][4]) {
#pragma unroll
  for (int c2 = 0; c2 < kStepsPerStage; ++c2) {
    const uint4 wr = *reinterpret_cast<const uint4*>(w_tile + r * kBK + 64 * c2 + 16 * q);
    const uint4 wr8 = *reinterpret_cast<const uint4*>(w_tile + (r + 8) * kBK + 64 * c2 + 16 * q);
    const int blk = 2 * c2 + q / 2;
    const Pow2Bf16 fr = make_pow2_bf16((sw_r >> (8 * blk)) & 0xffu);
    const Pow2Bf16 fr8 = make_pow2_bf16((sw_r8 >> (8 * blk)) & 0xffu);
    const uint32_t vr[4] = {wr.x, wr.y, wr.z, wr.w};
    const uint32_t vr8[4] = {wr8.x, wr8.y, wr8.z, wr8.w};
#pragma unroll
    for (int s = 0; s < kMmasPerStep; ++s) {
      a[c2][s][0] = dequant_e4m3_lo_pair<kBig>(vr[s], fr);    // row r,     logical 2q, 2q+1
      a[c2][s][1] = dequant_e4m3_lo_pair<kBig>(vr8[s], fr8);  // row r + 8
      a[c2][s][2] = dequant_e4m3_hi_pair<kBig>(vr[s], fr);    // row r,     logical 2q+8, 2q+9
      a[c2][s][3] = dequant_e4m3_hi_pair<kBig>(vr8[s], fr8);  // row r + 8
    }
  }
}

// Converter task (token n, k16 slice s, half h, step c2): physical bytes
// 16q + 4s + {2h, 2h+1} for q = 0..3 of token n -> logical columns
// 16s + 8h + 2q + {0, 1}: 16-B unit 2s + h of the token's bf16 row in the
// step's B buffer (rows of 128 B, 16-B units XOR-swizzled by n % 8: the
// K-major 128B-swizzle layout of the wgmma descriptor). The raw X tile is
// TMA-written with the same swizzle (16-B unit u of row n at u ^ (n % 8)), so
// the 8 tokens a quarter warp converts hit 8 different bank groups in both.
// `sx` = the token's 4 scale bytes of the stage (MX block 2·c2 for q < 2,
// 2·c2 + 1 for q >= 2).
template <bool kBig>
__device__ __forceinline__ void convert_x_task(const uint8_t* x_tile, uint8_t* b_buf, int n, int s, int h, int c2,
                                               uint32_t sx) {
  const Pow2Bf16 f0 = make_pow2_bf16((sx >> (16 * c2)) & 0xffu);
  const Pow2Bf16 f1 = make_pow2_bf16((sx >> (16 * c2 + 8)) & 0xffu);
  const uint8_t* row = x_tile + n * kBK;
  uint32_t w[4];
#pragma unroll
  for (int q = 0; q < 4; ++q)
    w[q] = *reinterpret_cast<const uint32_t*>(row + (((4 * c2 + q) ^ (n & 7)) << 4) + 4 * s);
  uint4 o;
  if (h == 0)
    o = make_uint4(dequant_e4m3_lo_pair<kBig>(w[0], f0), dequant_e4m3_lo_pair<kBig>(w[1], f0),
                   dequant_e4m3_lo_pair<kBig>(w[2], f1), dequant_e4m3_lo_pair<kBig>(w[3], f1));
  else
    o = make_uint4(dequant_e4m3_hi_pair<kBig>(w[0], f0), dequant_e4m3_hi_pair<kBig>(w[1], f0),
                   dequant_e4m3_hi_pair<kBig>(w[2], f1), dequant_e4m3_hi_pair<kBig>(w[3], f1));
  *reinterpret_cast<uint4*>(b_buf + n * 128 + (((2 * s + h) ^ (n & 7)) << 4)) = o;
}

// Test-only timeline (decode_set_trace).
__device__ __forceinline__ void trace_value(const Params& p, int ev, uint64_t v) {
  if (p.trace != nullptr && static_cast<int>(blockIdx.x) < p.trace_ctas)
    p.trace[static_cast<int64_t>(blockIdx.x) * kTraceEvents + ev] = v;
}
__device__ __forceinline__ void trace_event(const Params& p, int ev) {
  if (p.trace != nullptr) trace_value(p, ev, ptx::globaltimer());
}

// -------------------------------------------------------------------- roles

template <int NT>
__device__ __forceinline__ void producer(const Params& p, const CUtensorMap* tmap_w, const CUtensorMap* tmap_x,
                                         uint32_t stage0, uint32_t full0, uint32_t empty0) {
  using C = Config<NT>;
  trace_event(p, kTrSetup);
  ptx::prefetch_tensormap(tmap_w);
  ptx::prefetch_tensormap(tmap_x);
  // (An L2 prefetch of the unit's weight tiles here, ahead of the wait, put
  // the whole unit's stream in front of the first stage's load on the copy
  // engine: first stage 6.2 µs after entry on a cold L2; H200 timeline, run 3.)
  griddepcontrol_wait();
  trace_event(p, kTrPdlDone);
  Ring<C::kStages> ring;
  for (int u = blockIdx.x; u < p.units; u += gridDim.x) {
    const splitk::Unit w = unit_of(p, u);
    const uint8_t* wsf = p.wsf + static_cast<int64_t>(w.head) * p.k_stages * kSfChunk;
    const uint8_t* xsf = p.xsf + static_cast<int64_t>((w.tb * NT) / 128) * p.k_stages * kSfChunk;
    for (int kb = w.k0; kb < w.k1; ++kb) {
      const uint32_t st = stage0 + ring.idx * C::kStageBytes;
      const uint32_t full = full0 + 8 * ring.idx;
      ptx::mbarrier_wait(empty0 + 8 * ring.idx, ring.phase ^ 1u);
      ptx::mbarrier_arrive_expect_tx(full, C::kTxBytes);
      ptx::cp_async_bulk_tensor_2d(st + C::kWOff, tmap_w, kb * kBK, w.head * kHeadRows, full);
      ptx::cp_async_bulk_tensor_2d(st + C::kXOff, tmap_x, kb * kBK, w.tb * NT, full);
      ptx::cp_async_bulk_shared_global(st + C::kWsfOff, wsf + static_cast<int64_t>(kb) * kSfChunk, kSfChunk, full);
      ptx::cp_async_bulk_shared_global(st + C::kXsfOff, xsf + static_cast<int64_t>(kb) * kSfChunk, kSfChunk, full);
      ring.advance();
    }
  }
}

// The end of a unit in the 256 consumer threads: accumulators -> T, then the
// shared split-K end (splitk::finish_unit: partial -> workspace, arrival; the
// last arriver sums the partials in the order s = 0..S-1 and runs the
// epilogue). Returns after a barrier that frees T / the B ring.
template <int NT>
__device__ __forceinline__ bool finish_unit(const Params& p, const splitk::Unit& w, int u, float (&acc)[NT / 2],
                                            float* T, volatile uint32_t* flag) {
  const int t = threadIdx.x;
  const int wg = t / kWarpgroup, warp = (t % kWarpgroup) / 32, l = t % 32, q = l % 4;
  const int r0 = 64 * wg + 16 * warp + l / 4;
  // Accumulator fragment: acc[4j + 2h + b] = D[row r0 + 8h][token 8j + 2q + b].
#pragma unroll
  for (int j = 0; j < NT / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int b = 0; b < 2; ++b) T[tile_index(8 * j + 2 * q + b, r0 + 8 * h)] = acc[4 * j + 2 * h + b];
  ptx::bar_sync(kBarrierNamed, kConsumerThreads);
  return splitk::finish_unit<NT, kConsumerThreads, kBarrierNamed>(p, w, u, t, T, flag, /*skip_split=*/-1, [&] {
    if (t == 0) trace_event(p, kTrArrived);
  });
}

// One stage of the consumers (both 64-K steps): A set `a` and the stage's B
// buffers converted, the stage released, one barrier, 8 wgmmas; then the
// wait that retires the previous stage's group and the fence that keeps the
// previous A set `a_prev` alive until then.
template <int NT>
__device__ __forceinline__ void consume_stage(const Params& p, const uint8_t* st, uint8_t* smem, uint32_t smem_s,
                                              uint32_t empty, uint32_t bslot, int r, int q, int n, int tb, bool first,
                                              float (&acc)[NT / 2], uint32_t (&a)[kStepsPerStage][kMmasPerStep][4],
                                              uint32_t (&a_prev)[kStepsPerStage][kMmasPerStep][4]) {
  using C = Config<NT>;
  const int t = threadIdx.x;
  // Converter tasks: this thread's token is n = t % NT for all of them (NT
  // divides 256); (s, h, c2) = bits of t / NT + i · 256 / NT.
  constexpr int kTasksPerThread = NT * kMmasPerStep * 2 * kStepsPerStage / kConsumerThreads;
  static_assert(kTasksPerThread >= 1 && kConsumerThreads % NT == 0, "converter tasks cover the stage evenly");
  const uint32_t sw_r = *reinterpret_cast<const uint32_t*>(st + C::kWsfOff + sf_word_offset(r));
  const uint32_t sw_r8 = *reinterpret_cast<const uint32_t*>(st + C::kWsfOff + sf_word_offset(r + 8));
  const uint32_t sx = *reinterpret_cast<const uint32_t*>(st + C::kXsfOff + sf_word_offset((tb * NT) % 128 + n));
  uint8_t* bbuf = smem + C::kRingOff + bslot * (kStepsPerStage * C::kBBufBytes);
  auto convert = [&](auto big) {
    constexpr bool kBig = decltype(big)::value;
    load_a_stage<kBig>(st + C::kWOff, r, q, sw_r, sw_r8, a);
#pragma unroll
    for (int i = 0; i < kTasksPerThread; ++i) {
      const int k = t / NT + i * (kConsumerThreads / NT);  // 0 .. 15
      const int s = k % kMmasPerStep, h = (k / kMmasPerStep) % 2, c2 = k / (2 * kMmasPerStep);
      convert_x_task<kBig>(st + C::kXOff, bbuf + c2 * C::kBBufBytes, n, s, h, c2, sx);
    }
  };
  // Scales above 2^7 need a second multiply: a warp-uniform choice, so the
  // common case issues one multiply per pair (MXFP8 scales sit near 2^-8).
  if (__any_sync(0xffffffffu, any_big_scale(sw_r) || any_big_scale(sw_r8) || any_big_scale(sx)))
    convert(std::true_type{});
  else
    convert(std::false_type{});
  // Every read of the stage's shared memory is done: release it to the
  // producer. Every thread arrives for its own reads (one arrival per warp
  // after __syncwarp is ordered too, but compute-sanitizer racecheck does not
  // model __syncwarp: 60k WAR reports against the scale chunks' bulk copies).
  ptx::mbarrier_arrive(empty);
  // Generic-proxy stores read next by wgmma (async proxy): fence in every
  // writing thread before the barrier (HOPPER.md "Ordering").
  ptx::fence_proxy_async_shared_cta();
  ptx::bar_sync(kBarrierNamed, kConsumerThreads);
  const uint64_t db = wgmma::make_desc_kmajor_sw128(smem_s + C::kRingOff + bslot * (kStepsPerStage * C::kBBufBytes));
  // No register fence on acc inside the unit: its only writers are the wgmmas,
  // so a fence here would "define" registers of a group in flight and
  // serialize it (ptxas C7515).
  wgmma::fence_sync_aligned();
#pragma unroll
  for (int c2 = 0; c2 < kStepsPerStage; ++c2)
#pragma unroll
    for (int s = 0; s < kMmasPerStep; ++s)
      mma_rs<NT>(acc, a[c2][s], wgmma::desc_advance(db + c2 * (C::kBBufBytes >> 4), 32 * s),
                 (first && c2 == 0 && s == 0) ? 0u : 1u);
  wgmma::commit_group_sync_aligned();
  wgmma::wait_group_sync_aligned<1>();
  // The previous stage's group is retired: its A set may be rewritten.
  fence_regs(a_prev);
}

template <int NT>
__device__ __forceinline__ void consumer(const Params& p, uint8_t* smem, uint32_t smem_s, uint32_t full0, uint32_t empty0,
                                         volatile uint32_t* flag) {
  using C = Config<NT>;
  const int t = threadIdx.x;
  const int wg = t / kWarpgroup, warp = (t % kWarpgroup) / 32, l = t % 32, q = l % 4;
  const int r = 64 * wg + 16 * warp + l / 4;  // weight rows r and r + 8 of the head
  const int n = t % NT;                       // this thread's converter token
  float* T = reinterpret_cast<float*>(smem + C::kRingOff);
  griddepcontrol_wait();  // the epilogue reads inputs and the workspace of this launch

  Ring<C::kStages> ring;
  uint32_t gstage = 0;  // stages walked by this CTA: B slot gstage % kBStageSlots
  // The two A sets alternate by stage (compile-time names: the stage loop is
  // unrolled by two). A set stays live until the wait that retires its group.
  uint32_t a0[kStepsPerStage][kMmasPerStep][4], a1[kStepsPerStage][kMmasPerStep][4];
  int units = 0, lasts = 0;
  for (int u = blockIdx.x; u < p.units; u += gridDim.x) {
    const splitk::Unit w = unit_of(p, u);
    float acc[C::kAccRegs];  // the unit's first wgmma ignores D (scale_d = 0)
    auto stage = [&](int kb, auto& a, auto& a_prev) {
      ptx::mbarrier_wait(full0 + 8 * ring.idx, ring.phase);
      if (t == 0 && units == 0 && kb == w.k0) trace_event(p, kTrFirstFull);
      consume_stage<NT>(p, smem + C::kStageOff + ring.idx * C::kStageBytes, smem, smem_s, empty0 + 8 * ring.idx,
                        gstage % kBStageSlots, r, q, n, w.tb, kb == w.k0, acc, a, a_prev);
      ring.advance();
      ++gstage;
    };
    // Every unit starts with set a0: the previous unit's wait_group 0 retired both.
    for (int kb = w.k0; kb < w.k1; kb += 2) {
      stage(kb, a0, a1);
      if (kb + 1 < w.k1) stage(kb + 1, a1, a0);
    }
    wgmma::wait_group_sync_aligned<0>();
    fence_regs(acc);
    fence_regs(a0);
    fence_regs(a1);
    if (t == 0) trace_event(p, kTrMainDone);
    // Both warpgroups' wgmmas have read the B ring before T overwrites it.
    ptx::bar_sync(kBarrierNamed, kConsumerThreads);
    lasts += finish_unit<NT>(p, w, u, acc, T, flag) ? 1 : 0;
    if (t == 0) trace_event(p, kTrEpiDone);
    ++units;
  }
  if (t == 0) {
    trace_value(p, kTrUnits, static_cast<uint64_t>(units));
    trace_value(p, kTrLastArrivals, static_cast<uint64_t>(lasts));
  }
}

}  // namespace

template <int NT>
__global__ void __launch_bounds__(kThreads, 1)
    m3qkv_sm90_decode_kernel(const __grid_constant__ CUtensorMap tmap_w, const __grid_constant__ CUtensorMap tmap_x,
                             const __grid_constant__ Params p) {
#if defined(__CUDA_ARCH__) && M3QKV_HAS_WGMMA
  using C = Config<NT>;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = ptx::smem_u32(smem_raw);
  const uint32_t base = (raw + kSwizzleAtom - 1) & ~static_cast<uint32_t>(kSwizzleAtom - 1);
  uint8_t* smem = smem_raw + (base - raw);
  const uint32_t full0 = base + C::kBarOff;
  const uint32_t empty0 = full0 + 8 * C::kMaxStages;
  volatile uint32_t* flag = reinterpret_cast<volatile uint32_t*>(smem + C::kBarOff + 16 * C::kMaxStages);
  if (threadIdx.x == 0) {
    trace_event(p, kTrEntry);
    for (int s = 0; s < C::kStages; ++s) {
      ptx::mbarrier_init(full0 + 8 * s, 1);
      ptx::mbarrier_init(empty0 + 8 * s, kConsumerThreads);
    }
    ptx::fence_mbarrier_init_release_cluster();  // visible to the async proxy (TMA complete_tx)
  }
  __syncthreads();
  if (threadIdx.x >= kConsumerThreads) {
    ptx::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x / 32 == kProducerWarp) {
      if (ptx::elect_sync()) producer<NT>(p, &tmap_w, &tmap_x, base + C::kStageOff, full0, empty0);
      __syncwarp();
    }
    griddepcontrol_launch_dependents();
  } else {
    ptx::setmaxnreg_inc<kConsumerRegs>();
    consumer<NT>(p, smem, base, full0, empty0, flag);
  }
#endif
}

// ----------------------------------------------------------------- host side

template <int NT>
cudaError_t decode_set_smem() {
  return cudaFuncSetAttribute(m3qkv_sm90_decode_kernel<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              Config<NT>::kSmemBytes);
}

namespace {
uint64_t* g_trace = nullptr;
int g_trace_ctas = 0;
}  // namespace

void decode_set_trace(uint64_t* device_buffer, int ctas) {
  g_trace = ctas > 0 ? device_buffer : nullptr;
  g_trace_ctas = g_trace != nullptr ? ctas : 0;
}

cudaError_t prepare_decode() {
  cudaError_t e = decode_set_smem<16>();
  if (e == cudaSuccess) e = decode_set_smem<32>();
  if (e == cudaSuccess) e = decode_set_smem<64>();
  if (e == cudaSuccess) e = decode_set_smem<128>();
  return e;
}

template <int NT>
m3qkv_status launch_decode_nt(const CUtensorMap& tw, const CUtensorMap& tx, const Params& p, int grid, bool pdl,
                              cudaStream_t s) {
  host::LaunchShape shape;
  shape.grid = static_cast<unsigned>(grid);
  shape.threads = kThreads;
  shape.smem = Config<NT>::kSmemBytes;
  shape.pdl = pdl;
  Params pt = p;
  pt.trace = g_trace;
  pt.trace_ctas = g_trace_ctas;
  return host::launch("m3qkv_fused_qkv", "m3qkv_sm90_decode_kernel", m3qkv_sm90_decode_kernel<NT>, shape, s, tw, tx,
                      pt);
}

m3qkv_status launch_decode(int nt, const CUtensorMap& tw, const CUtensorMap& tx, const Params& p, int grid, bool pdl,
                           cudaStream_t s) {
  switch (nt) {
    case 16: return launch_decode_nt<16>(tw, tx, p, grid, pdl, s);
    case 32: return launch_decode_nt<32>(tw, tx, p, grid, pdl, s);
    case 64: return launch_decode_nt<64>(tw, tx, p, grid, pdl, s);
    case 128: return launch_decode_nt<128>(tw, tx, p, grid, pdl, s);
    default: return fail(M3QKV_ERROR_INTERNAL, "m3qkv_fused_qkv: no decode kernel for token block %d", nt);
  }
}

}  // namespace m3qkv::sm90::decode
