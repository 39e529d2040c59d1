// m3qkv_sm100_decode_kernel<NT>: the SM100-family decode variant (M <= 128)
// of the fused MXFP8 QKV projection + epilogue. Swap A/B: the weights are the
// MMA's M = 128 side (one head), the tokens its N = NT side (a token block of
// 32, 64 or 128); K is split across a persistent grid so that every SM
// streams weights (src/common/splitk_plan.h), and the f32 partials meet in a
// per-stream workspace where the last arriving unit of a (head, token block)
// sums them in the order s = 0..S-1 and runs the epilogue
// (src/common/splitk_reduce.cuh, shared with the SM90 decode kernel).
//
//   warp 0      TMA producer (one elected lane): per 128-K stage the head's
//               weight tile W, the token block's activation tile X and both
//               scale chunks, through a ring of kStages stages
//   warp 1      TMEM allocator + MMA issuer (one elected lane): per stage two
//               tcgen05.cp (weight / activation scales) and 4 × m128nNTk32
//               block-scaled MMAs into one of two TMEM accumulators
//   warps 2-9   epilogue (two warpgroups): accumulator (lanes = head columns,
//               columns = tokens) -> the smem tile T[token][column] -> partial
//               slot, arrival, and in the last arriver the fixed-order sum and
//               the quad epilogue (epi::quad_row_epilogue)
//
// PDL and TMEM (docs/sm100.md "Decode variant"): before griddepcontrol.wait
// the kernel reads no input and allocates nothing; it only initializes its
// barriers, prefetches the tensor maps and (l2_prefetch) asks L2 for its first
// unit's weight tiles. After the wait the producer streams immediately while
// the MMA warp allocates TMEM: the predecessor has completed, so its TMEM is
// free and the allocation cannot wait on it. Dependents are released only
// after the allocation, so a successor that allocates before its own wait
// never holds columns this grid still needs. Nothing here has run on Blackwell.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/splitk_reduce.cuh"
#include "host/launch.h"
#include "ptx/elect.cuh"
#include "ptx/griddepcontrol.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/barrier.cuh"
#include "sm100/tensor_core.cuh"  // tcgen05 and the .cta_group::2 TMA forms (or their emulation)
#include "ptx/tma.cuh"
#include "sm100/decode_config.h"
#include "sm100/desc.h"
#include "sm100/pipeline.h"

namespace m3qkv::sm100::decode {
namespace {

__device__ __forceinline__ splitk::Unit unit_of(const DecodeParams& p, int u) {
  return splitk::unit_of(u, p.token_blocks, p.split, p.k_stages);
}

// Shared-memory addresses (shared::cta window) of one CTA's layout.
template <int NT>
struct Smem {
  using C = DecodeConfig<NT>;
  uint32_t base;  // 1024-B aligned
  __device__ uint32_t stage(uint32_t s) const { return base + C::kStageOff + s * C::kStageBytes; }
  __device__ uint32_t full(uint32_t s) const { return base + C::kBarOff + 8u * s; }
  __device__ uint32_t empty(uint32_t s) const { return base + C::kBarOff + 8u * (C::kMaxStages + s); }
  __device__ uint32_t tmem_full(uint32_t b) const { return base + C::kBarOff + 8u * (2 * C::kMaxStages + b); }
  __device__ uint32_t tmem_empty(uint32_t b) const {
    return base + C::kBarOff + 8u * (2 * C::kMaxStages + C::kNumAccBufs + b);
  }
  __device__ uint32_t flag() const { return base + C::kBarOff + 8u * (2 * C::kMaxStages + 2 * C::kNumAccBufs); }
  __device__ uint32_t tmem_slot() const { return flag() + 4u; }
};

// ===================================================================== TMA
// The F8_128x4 tensor maps view the scale buffers as rows of 256 B: chunk c
// (512 B: 128 rows × 4 scale columns = one stage) is rows 2c, 2c + 1.
template <int NT>
__device__ __forceinline__ void producer(const DecodeParams& p, const Smem<NT>& sm, const DecodeTensorMaps& tm) {
  using C = DecodeConfig<NT>;
  constexpr uint32_t S = C::kStages;
  pipe::Ring<S> st;
  uint32_t issued = 0;  // k-blocks issued by this CTA (for the final drain)
  for (int u = blockIdx.x; u < p.units; u += gridDim.x) {
    const splitk::Unit w = unit_of(p, u);
    const int32_t w_row = w.head * 128;
    const int32_t x_row = w.tb * NT;
    const int32_t sfw_chunk0 = w.head * p.k_stages;
    const int32_t sfx_chunk0 = ((w.tb * NT) / 128) * p.k_stages;
    for (int kb = w.k0; kb < w.k1; ++kb, ++issued, st.advance()) {
      // First pass over a stage: parity 1 (the phase "before" phase 0) is complete.
      ptx::mbarrier_wait(sm.empty(st.idx), st.phase ^ 1u);
      const uint32_t fb = sm.full(st.idx);
      const uint32_t s0 = sm.stage(st.idx);
      const int32_t kx = kb * static_cast<int32_t>(C::BK);
      ptx::mbarrier_arrive_expect_tx(fb, C::kTxBytes);
      ptx::cp_async_bulk_tensor_2d(s0 + C::kWOff, &tm.w, kx, w_row, fb);
      ptx::cp_async_bulk_tensor_2d(s0 + C::kXOff, &tm.x, kx, x_row, fb);
      ptx::cp_async_bulk_tensor_2d(s0 + C::kSfwOff, &tm.sfw, 0, 2 * (sfw_chunk0 + kb), fb);
      ptx::cp_async_bulk_tensor_2d(s0 + C::kSfxOff, &tm.sfx, 0, 2 * (sfx_chunk0 + kb), fb);
    }
  }
  // Drain: the MMA commits of the last (up to S) k-blocks, so no asynchronous
  // arrive is still on its way to this CTA's shared memory when it exits.
  for (uint32_t g = issued > S ? issued - S : 0u; g < issued; ++g)
    ptx::mbarrier_wait(sm.empty(pipe::stage_of(g, S)), pipe::commit_parity(g, S));
}

// ===================================================================== MMA
template <int NT>
__device__ __forceinline__ void mma_issuer(const DecodeParams& p, const Smem<NT>& sm, uint32_t tmem_base) {
  using C = DecodeConfig<NT>;
  constexpr uint32_t S = C::kStages;
  constexpr uint32_t kIdesc = make_idesc_mxf8f6f4(C::UMMA_M, C::UMMA_N);
  pipe::Ring<S> st;
  uint32_t g = 0;  // k-blocks issued so far (over all units): the SF slot ring
  // i: local unit counter (accumulator buffer i & 1, its use i >> 1)
  for (int u = blockIdx.x, i = 0; u < p.units; u += gridDim.x, ++i) {
    const splitk::Unit w = unit_of(p, u);
    const uint32_t buf = pipe::acc_buf(static_cast<uint32_t>(i));
    const uint32_t d_tmem = tmem_base + (buf == 0 ? C::kAccBase0 : C::kAccBase1);
    // The epilogue of the buffer's previous unit has read it all.
    ptx::mbarrier_wait(sm.tmem_empty(buf), pipe::acc_empty_parity(static_cast<uint32_t>(i)));
    ptx::tcgen05_fence_after_thread_sync();
    const uint32_t sfx_off = sfx_col_offset(w.tb, NT);
    for (int kb = w.k0; kb < w.k1; ++kb, ++g, st.advance()) {
      ptx::mbarrier_wait(sm.full(st.idx), st.phase);
      ptx::tcgen05_fence_after_thread_sync();
      // tcgen05.mma -> tcgen05.cp is not an ordered pair (PTX ISA §9.7.16.6.2):
      // slot g % R is rewritten only after the MMAs of k-block g - R completed
      // (their commit: phase (g - R) / S of empty[(g - R) % S]).
      const uint32_t slot = pipe::sf_slot(g, C::kSfSlots);
      if (pipe::sf_reuse_wait(g, C::kSfSlots)) {
        ptx::mbarrier_wait(sm.empty(pipe::sf_reuse_stage(g, C::kSfSlots, S)),
                           pipe::sf_reuse_parity(g, C::kSfSlots, S));
        ptx::tcgen05_fence_after_thread_sync();
      }
      const uint32_t sfw_tmem = tmem_base + C::kSfBase + slot * C::kSfSlotCols;
      const uint32_t sfx_tmem = sfw_tmem + C::kSfwCols;
      const uint32_t s0 = sm.stage(st.idx);
      // tcgen05.cp -> tcgen05.mma is an ordered pair: no wait in between.
      ptx::tcgen05_cp_32x128b_warpx4<1>(sfw_tmem, make_sf_desc(s0 + C::kSfwOff));
      ptx::tcgen05_cp_32x128b_warpx4<1>(sfx_tmem, make_sf_desc(s0 + C::kSfxOff));
      const uint64_t a_desc = make_operand_desc(s0 + C::kWOff);
      const uint64_t b_desc = make_operand_desc(s0 + C::kXOff);
#pragma unroll
      for (uint32_t j = 0; j < C::kMmaPerStage; ++j) {
        // K slice j: 32 bytes into the 128-B swizzle atom; scale byte j.
        ptx::tcgen05_mma_mxf8f6f4_block_scale<1>(d_tmem, operand_desc_advance(a_desc, 32 * j),
                                                 operand_desc_advance(b_desc, 32 * j), idesc_with_sf_ids(kIdesc, j, j),
                                                 sfw_tmem, sfx_tmem + sfx_off, kb > w.k0 || j > 0);
      }
      // Stage s is free once these MMAs (and the cps) completed.
      ptx::tcgen05_commit<1>(sm.empty(st.idx));
    }
    // The unit's partial is complete: wake the epilogue.
    ptx::tcgen05_commit<1>(sm.tmem_full(buf));
  }
}

// ================================================================ epilogue
// Accumulator -> T: warp e of the two warpgroups reads its lane quarter
// (head columns c = 32·(warp % 4) + lane) for tokens [h·NT/2, h·NT/2 + NT/2),
// h = e / 4, and stores them transposed into T[token][column].
template <int NT>
__device__ __forceinline__ void load_accumulator(uint32_t taddr, float* T, int col, int tok0) {
  using C = DecodeConfig<NT>;
  if constexpr (C::kEpiColsPerWarp == 16) {
    uint32_t r[16];
    ptx::tcgen05_ld_32x32b_x16(taddr, r);
    ptx::tcgen05_wait_ld();
#pragma unroll
    for (int j = 0; j < 16; ++j) T[splitk::tile_index(tok0 + j, col)] = __uint_as_float(r[j]);
  } else {
    constexpr int kChunks = C::kEpiColsPerWarp / 32;
    uint32_t r[kChunks][32];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) ptx::tcgen05_ld_32x32b_x32(taddr + 32 * c, r[c]);
    ptx::tcgen05_wait_ld();
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
#pragma unroll
      for (int j = 0; j < 32; ++j) T[splitk::tile_index(tok0 + 32 * c + j, col)] = __uint_as_float(r[c][j]);
  }
}

template <int NT>
__device__ __forceinline__ void epilogue(const DecodeParams& p, const Smem<NT>& sm, uint32_t tmem_base, float* T,
                                         typename DecodeConfig<NT>::OwnerTable* owners, volatile uint32_t* flag) {
  using C = DecodeConfig<NT>;
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = static_cast<int>(threadIdx.x) - static_cast<int>(32 * C::kFirstEpiWarp);  // 0 .. 255
  const uint32_t quarter = warp % 4;  // TMEM lane quarter this warp may access
  const uint32_t half = (warp - C::kFirstEpiWarp) / 4;
  const int col = static_cast<int>(quarter * 32 + lane);
  const int tok0 = static_cast<int>(half * C::kEpiColsPerWarp);
  for (int u = blockIdx.x, i = 0; u < p.units; u += gridDim.x, ++i) {
    const splitk::Unit w = unit_of(p, u);
    const uint32_t buf = pipe::acc_buf(static_cast<uint32_t>(i));
    ptx::mbarrier_wait(sm.tmem_full(buf), pipe::acc_full_parity(static_cast<uint32_t>(i)));
    ptx::tcgen05_fence_after_thread_sync();
    const uint32_t taddr =
        tmem_base + ((quarter * 32) << 16) + (buf == 0 ? C::kAccBase0 : C::kAccBase1) + half * C::kEpiColsPerWarp;
    load_accumulator<NT>(taddr, T, col, tok0);
    // This warp's accumulator columns are in T: release the buffer to the MMA.
    ptx::tcgen05_fence_before_thread_sync();
    __syncwarp();
    if (lane == 0) ptx::mbarrier_arrive(sm.tmem_empty(buf));
    ptx::bar_sync(C::kEpiBarrier, C::kEpiThreads);
    splitk::finish_unit<NT, C::kEpiThreads, C::kEpiBarrier>(p, w, u, t, T, owners, flag, p.test_skip_split,
                                                            /*spread=*/false, [](int) {});
  }
}

}  // namespace
}  // namespace m3qkv::sm100::decode

template <int NT>
__global__ void __launch_bounds__(m3qkv::sm100::decode::DecodeConfig<NT>::kNumThreads, 1)
    m3qkv_sm100_decode_kernel(const __grid_constant__ m3qkv::sm100::decode::DecodeTensorMaps tm,
                              const __grid_constant__ m3qkv::sm100::decode::DecodeParams p) {
  using namespace m3qkv;
  using namespace m3qkv::sm100;
  using namespace m3qkv::sm100::decode;
  using C = DecodeConfig<NT>;

  extern __shared__ uint8_t smem_raw[];
  Smem<NT> sm;
  sm.base = (ptx::smem_u32(smem_raw) + 1023u) & ~1023u;
  uint8_t* smem_gen = smem_raw + (sm.base - ptx::smem_u32(smem_raw));
  float* T = reinterpret_cast<float*>(smem_gen + C::kTileOff);
  auto* owners = reinterpret_cast<typename C::OwnerTable*>(smem_gen + C::kOwnersOff);
  volatile uint32_t* flag = reinterpret_cast<volatile uint32_t*>(smem_gen + (sm.flag() - sm.base));
  const volatile uint32_t* tmem_base_ptr = reinterpret_cast<const volatile uint32_t*>(smem_gen + (sm.tmem_slot() - sm.base));
  const uint32_t warp = threadIdx.x / 32;

  // ------------------------------------------------------------- prologue
  // Reads no input, allocates nothing: overlaps the predecessor's tail (PDL).
  if (warp == C::kTmaWarp && ptx::elect_sync()) {
    ptx::prefetch_tensormap(&tm.w);
    ptx::prefetch_tensormap(&tm.x);
    ptx::prefetch_tensormap(&tm.sfw);
    ptx::prefetch_tensormap(&tm.sfx);
    // The first unit's first weight stages into L2 (no destination, no
    // completion): safe before the wait, as L2 is the point of coherence, a
    // prefetch delivers nothing to the SM and a later load of a line the
    // predecessor rewrote sees the new bytes. Only with PDL: without it the
    // wait returns at once and the prefetch would queue in front of the loads
    // (seen on the SM90 decode kernel, docs/sm90.md).
    if (p.l2_prefetch != 0 && static_cast<int>(blockIdx.x) < p.units) {
      const splitk::Unit w = unit_of(p, static_cast<int>(blockIdx.x));
      const int k_end = w.k1 < w.k0 + static_cast<int>(C::kStages) ? w.k1 : w.k0 + static_cast<int>(C::kStages);
#pragma unroll 1
      for (int kb = w.k0; kb < k_end; ++kb)
        ptx::cp_async_bulk_prefetch_tensor_2d_l2(&tm.w, kb * static_cast<int32_t>(C::BK), w.head * 128);
    }
  }
  if (threadIdx.x == 0) {
    for (uint32_t s = 0; s < C::kStages; ++s) {
      ptx::mbarrier_init(sm.full(s), 1);   // the TMA thread's arrive.expect_tx (+ the stage's tx bytes)
      ptx::mbarrier_init(sm.empty(s), 1);  // the MMA thread's commit
    }
    for (uint32_t b = 0; b < C::kNumAccBufs; ++b) {
      ptx::mbarrier_init(sm.tmem_full(b), 1);                  // the MMA commit after the unit's last k-block
      ptx::mbarrier_init(sm.tmem_empty(b), C::kNumEpiWarps);  // every epilogue warp, after reading its columns
    }
    ptx::fence_mbarrier_init_release_cluster();  // visible to the async proxy (TMA complete_tx, tcgen05.commit)
  }
  __syncwarp();  // reconverge warp 0 (elected / thread-0 branches) before the .aligned barrier
  __syncthreads();

  // PDL: every read of an input and every write below this point.
  griddepcontrol_wait();

  if (warp == C::kTmaWarp) {
    // ================================================================ TMA
    // Streams from here, while warp 1 allocates TMEM.
    if (ptx::elect_sync()) producer<NT>(p, sm, tm);
    __syncwarp();  // reconverge before the teardown barrier
  } else {
    // TMEM after griddepcontrol.wait: the predecessor has completed and freed its columns.
    if (warp == C::kMmaWarp) {
      ptx::tcgen05_alloc<1>(sm.tmem_slot(), C::kTmemAllocCols);
      ptx::tcgen05_relinquish_alloc_permit<1>();
    }
    ptx::tcgen05_fence_before_thread_sync();
    ptx::bar_sync(C::kTmemReadyBarrier, C::kTmemReadyThreads);
    ptx::tcgen05_fence_after_thread_sync();
    const uint32_t tmem_base = *tmem_base_ptr;
    // Dependents may launch once this CTA holds its TMEM.
    griddepcontrol_launch_dependents();
    if (warp == C::kMmaWarp) {
      // ================================================================ MMA
      if (ptx::elect_sync()) mma_issuer<NT>(p, sm, tmem_base);
      __syncwarp();  // reconverge (tcgen05.dealloc is .sync.aligned)
    } else {
      // =========================================================== epilogue
      epilogue<NT>(p, sm, tmem_base, T, owners, flag);
    }
  }

  // ------------------------------------------------------------- teardown
  // Every TMEM access is finished (the epilogue waited for the last
  // accumulator and read it) before the dealloc.
  ptx::tcgen05_fence_before_thread_sync();
  __syncthreads();
  if (warp == C::kTmaWarp) griddepcontrol_launch_dependents();
  if (warp == C::kMmaWarp) {
    ptx::tcgen05_fence_after_thread_sync();
    ptx::tcgen05_dealloc<1>(*tmem_base_ptr, C::kTmemAllocCols);
  }
}

namespace m3qkv::sm100::decode {

static_assert(kTarget.num_token_blocks == 3 && kTarget.token_blocks[0] == 32 && kTarget.token_blocks[1] == 64 &&
                  kTarget.token_blocks[2] == 128,
              "launch_decode instantiates exactly the plan's token blocks");

namespace {
template <int NT>
cudaError_t set_attributes_nt() {
  return cudaFuncSetAttribute(m3qkv_sm100_decode_kernel<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(DecodeConfig<NT>::kSmemBytes));
}

template <int NT>
m3qkv_status launch_nt(const DecodeTensorMaps& tm, const DecodeParams& p, int grid, bool pdl, cudaStream_t s) {
  host::LaunchShape shape;
  shape.grid = static_cast<unsigned>(grid);
  shape.threads = DecodeConfig<NT>::kNumThreads;
  shape.smem = DecodeConfig<NT>::kSmemBytes;
  shape.pdl = pdl;
  // Clusters of one CTA, as the tile kernel at cta_group 1 is launched: the
  // commits and barrier arrivals use .shared::cluster addresses of the CTA itself.
  shape.cluster = 1;
  return host::launch("m3qkv_fused_qkv", "m3qkv_sm100_decode_kernel", m3qkv_sm100_decode_kernel<NT>, shape, s, tm,
                      p);
}
}  // namespace

cudaError_t set_decode_attributes() {
  cudaError_t e = set_attributes_nt<32>();
  if (e == cudaSuccess) e = set_attributes_nt<64>();
  if (e == cudaSuccess) e = set_attributes_nt<128>();
  return e;
}

uint32_t decode_smem_bytes_max() {
  uint32_t b = DecodeConfig<32>::kSmemBytes;
  if (DecodeConfig<64>::kSmemBytes > b) b = DecodeConfig<64>::kSmemBytes;
  if (DecodeConfig<128>::kSmemBytes > b) b = DecodeConfig<128>::kSmemBytes;
  return b;
}

m3qkv_status launch_decode(int nt, const DecodeTensorMaps& tm, const DecodeParams& p, int grid, bool pdl,
                           cudaStream_t s) {
  switch (nt) {
    case 32: return launch_nt<32>(tm, p, grid, pdl, s);
    case 64: return launch_nt<64>(tm, p, grid, pdl, s);
    case 128: return launch_nt<128>(tm, p, grid, pdl, s);
    default: return fail(M3QKV_ERROR_INTERNAL, "m3qkv_fused_qkv: no SM100 decode kernel for token block %d", nt);
  }
}

}  // namespace m3qkv::sm100::decode
