// m3qkv_sm100_fused_kernel: the SM100-family (tcgen05) fused MXFP8 QKV
// projection + epilogue (docs/sm100.md). Persistent, warp-specialized:
//
//   warp 0      TMA producer (one elected lane): A, B, SFA, SFB per stage
//   warp 1      TMEM allocator + MMA issuer (one elected lane; leader CTA only at CG 2)
//   warps 2-3   (cta_group 2 only) padding: warps 0-3 form warpgroup 0, which
//               gives registers to the epilogue with setmaxnreg
//   epilogue    4·CG warps = one warpgroup per 128-column head; each thread
//               owns one accumulator row (tcgen05.ld 32x32b) and runs the
//               shared epilogue of src/common/epilogue.cuh on it
//
// cta_group 1: one CTA computes a 128-token × 1-head tile with m128n128 MMAs.
// cta_group 2: a cluster of two CTAs (a CTA pair) computes 256 tokens × 2
// heads with one m256n256 MMA per 32-K slice, issued by the even CTA; each
// CTA loads its own 128 rows of A and 128 rows (one head) of B, its own SFA
// chunk and one SFB chunk multicast to both.
//
// Every barrier, its arrival count and the phase logic of each pipeline are
// documented in docs/sm100.md. Nothing here has run on Blackwell hardware.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

// Emulation builds: this TU defines the C test hooks of the tcgen05 model
// (src/sm100/emu/tcgen05_emu.cuh); they act on every SM100 kernel TU's model state.
#define M3QKV_EMU_DEFINE_HOOKS 1

#include "common/epilogue.cuh"
#include "host/launch.h"
#include "ptx/cluster.cuh"
#include "ptx/elect.cuh"
#include "ptx/fence.cuh"
#include "ptx/griddepcontrol.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/setmaxnreg.cuh"
#include "ptx/barrier.cuh"

// The tcgen05 emulation (issue 6) runs the MMA issuer's and the TMA forms'
// functional models inside the producer warps, code far larger than the 24
// registers the real kernel leaves them: after setmaxnreg.dec those warps
// would touch registers they no longer own (an illegal-instruction fault on
// the H200, seen in the first emulated cta_group 2 runs). The emulation build
// therefore keeps the launch-time split (ptxas fits every role into it, with
// local-memory spills the emulation tolerates); the real build moves registers.
#if defined(M3QKV_TCGEN05_EMULATION)
constexpr bool kUseSetmaxnreg = false;
#else
constexpr bool kUseSetmaxnreg = true;
#endif
#include "sm100/tensor_core.cuh"  // tcgen05 and the .cta_group::2 TMA forms (or their emulation)
#include "ptx/tma.cuh"
#include "sm100/config.h"
#include "sm100/desc.h"
#include "sm100/pipeline.h"

namespace m3qkv::sm100 {
namespace {

// Grouped-M rasterization: tiles are numbered so that a group of `group_m`
// m-tiles is walked m-fastest for each n-tile (head group); CTAs that run at
// the same time then share weight tiles in L2.
__device__ __forceinline__ void tile_coords(int32_t t, const Params& p, int32_t* mt, int32_t* nt) {
  const int32_t per_group = p.group_m * p.num_n_tiles;
  const int32_t g = t / per_group;
  const int32_t first_m = g * p.group_m;
  const int32_t rem_m = p.num_m_tiles - first_m;
  const int32_t gsize = rem_m < p.group_m ? rem_m : p.group_m;
  const int32_t r = t - g * per_group;
  *mt = first_m + r % gsize;
  *nt = r / gsize;
}

// Static persistent schedule: cluster c takes tiles c, c + #clusters, ...
// (blockIdx / gridDim are re-read inside each role rather than kept live
// across its setmaxnreg: values live across a register-limit change spill).
template <int CG>
__device__ __forceinline__ int32_t first_tile() {
  return static_cast<int32_t>(blockIdx.x) / CG;
}
template <int CG>
__device__ __forceinline__ int32_t tile_stride() {
  return static_cast<int32_t>(gridDim.x) / CG;
}

// Reads the 32-column chunk kFirst of a head row (the columns shared by the
// two accumulators at cta_group 2), releases it with one arrive per warp on
// the pair's overlap barrier, then reads the other three chunks. Constant
// chunk indices keep `r` in registers.
template <uint32_t kFirst>
__device__ __forceinline__ void load_row_overlap_first(uint32_t taddr, uint32_t (&r)[4][32], uint32_t lane,
                                                       uint32_t ovl_bar_cluster) {
  ptx::tcgen05_ld_32x32b_x32(taddr + 32 * kFirst, r[kFirst]);
  ptx::tcgen05_wait_ld();
  ptx::tcgen05_fence_before_thread_sync();
  __syncwarp();
  if (lane == 0) ptx::mbarrier_arrive_remote(ovl_bar_cluster);
#pragma unroll
  for (uint32_t c = 0; c < 4; ++c)
    if (c != kFirst) ptx::tcgen05_ld_32x32b_x32(taddr + 32 * c, r[c]);
}

}  // namespace
}  // namespace m3qkv::sm100

template <int CG>
__global__ void __launch_bounds__(m3qkv::sm100::Config<CG>::kNumThreads, 1)
    m3qkv_sm100_fused_kernel(const __grid_constant__ CUtensorMap tmap_a, const __grid_constant__ CUtensorMap tmap_b,
                             const __grid_constant__ CUtensorMap tmap_sfa, const __grid_constant__ CUtensorMap tmap_sfb,
                             const __grid_constant__ m3qkv::sm100::Params p) {
  using namespace m3qkv;
  using namespace m3qkv::sm100;
  using namespace m3qkv::ptx;
  using C = Config<CG>;
  constexpr uint32_t S = C::kStages;

  // ---------------------------------------------------------- shared memory
  // [A × S][B × S][SFA × S][SFB × S][full × S][empty × S][tmem_full × 2]
  // [tmem_empty × 2][tmem_ovl × 2][TMEM base]. The base is rounded up to 1024 B
  // (128B-swizzle atoms); both CTAs of a pair compute the same offsets.
  extern __shared__ uint8_t smem_raw[];
  const uint32_t smem_base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  uint8_t* smem_gen = smem_raw + (smem_base - smem_u32(smem_raw));
  auto a_tile = [&](uint32_t s) { return smem_base + s * C::kABytes; };
  auto b_tile = [&](uint32_t s) { return smem_base + S * C::kABytes + s * C::kBBytes; };
  auto sfa_chunk = [&](uint32_t s) { return smem_base + S * (C::kABytes + C::kBBytes) + s * C::kSfaBytes; };
  auto sfb_chunk = [&](uint32_t s) {
    return smem_base + S * (C::kABytes + C::kBBytes + C::kSfaBytes) + s * C::kSfbBytes;
  };
  const uint32_t bar_base = smem_base + S * C::kStageBytes;
  auto full_bar = [&](uint32_t s) { return bar_base + 8u * s; };
  auto empty_bar = [&](uint32_t s) { return bar_base + 8u * (C::kMaxStages + s); };
  auto tmem_full_bar = [&](uint32_t b) { return bar_base + 8u * (2 * C::kMaxStages + b); };
  auto tmem_empty_bar = [&](uint32_t b) { return bar_base + 8u * (2 * C::kMaxStages + 2 + b); };
  auto tmem_ovl_bar = [&](uint32_t b) { return bar_base + 8u * (2 * C::kMaxStages + 4 + b); };
  const uint32_t tmem_base_slot = bar_base + 8u * (2 * C::kMaxStages + 6);
  const volatile uint32_t* tmem_base_ptr =
      reinterpret_cast<const volatile uint32_t*>(smem_gen + (tmem_base_slot - smem_base));

  const uint32_t warp = threadIdx.x / 32;
  const uint32_t lane = threadIdx.x % 32;
  const uint32_t rank = CG == 1 ? 0u : cluster_ctarank();  // 0 = even (leader) CTA of the pair
  const bool leader = rank == 0;

  // ------------------------------------------------------------- prologue
  // Barrier init, TMEM allocation and descriptor prefetch read no input, so
  // they run before griddepcontrol.wait and overlap the predecessor's tail
  // (PDL). TMEM is allocated here, not after the wait: our grid is persistent
  // (every CTA resident, one per SM), and a predecessor still holding TMEM on
  // this SM never waits on us, so the allocation can only be delayed, not
  // deadlock; successors are released only at our end (launch_dependents).
  if (warp == C::kTmaWarp && elect_sync()) {
    prefetch_tensormap(&tmap_a);
    prefetch_tensormap(&tmap_b);
    prefetch_tensormap(&tmap_sfa);
    prefetch_tensormap(&tmap_sfb);
  }
  if (threadIdx.x == 0) {
    for (uint32_t s = 0; s < S; ++s) {
      mbarrier_init(full_bar(s), 1);   // the leader's TMA thread: arrive.expect_tx (+ tx from the pair)
      mbarrier_init(empty_bar(s), 1);  // the MMA thread's commit (multicast to both CTAs)
    }
    for (uint32_t b = 0; b < C::kNumAccBufs; ++b) {
      mbarrier_init(tmem_full_bar(b), 1);                      // MMA commit after the tile's last k-block
      mbarrier_init(tmem_empty_bar(b), CG * C::kNumEpiWarps);  // every epilogue warp of the pair
      mbarrier_init(tmem_ovl_bar(b), CG * 4);                  // the overlap-owning warpgroup of the pair
    }
    fence_mbarrier_init_release_cluster();
  }
  __syncwarp();  // reconverge warp 0 (elected / thread-0 branches) before .aligned barriers
  if constexpr (CG == 2) {
    // Both CTAs' barriers initialized before any cross-CTA signal, and both
    // CTAs started before the collective 2-CTA allocation (known pitfall:
    // unsynchronized 2-CTA alloc/dealloc).
    barrier_cluster_arrive();
    barrier_cluster_wait();
  }
  if (warp == C::kMmaWarp) {
    tcgen05_alloc<CG>(tmem_base_slot, C::kTmemAllocCols);
    tcgen05_relinquish_alloc_permit<CG>();
  }
  tcgen05_fence_before_thread_sync();
  if constexpr (CG == 2) {
    barrier_cluster_arrive();
    barrier_cluster_wait();
  } else {
    __syncthreads();
  }
  tcgen05_fence_after_thread_sync();
  const uint32_t tmem_base = *tmem_base_ptr;

  // PDL: nothing below may read the predecessor's outputs or write anything
  // it might still read before this point.
  griddepcontrol_wait();

  const int32_t num_kb = p.num_k_blocks;

  // Register split (cta_group 2): warpgroup 0 (TMA, MMA, 2 padding warps)
  // gives registers to the two epilogue warpgroups. Each setmaxnreg sits at
  // the head of its role branch so that it dominates that role's code (ptxas
  // allocates each region within its limit).
  if (warp < C::kFirstEpiWarp) {
    if constexpr (CG == 2 && kUseSetmaxnreg) setmaxnreg_dec<C::kProducerRegs>();
    if (warp == C::kTmaWarp) {
      // ================================================================ TMA
      if (elect_sync()) {
        pipe::Ring<S> st;
        uint32_t issued = 0;  // k-blocks issued by this CTA (for the final drain)
        for (int32_t t = first_tile<CG>(); t < p.num_tiles; t += tile_stride<CG>()) {
          int32_t mt, nt;
          tile_coords(t, p, &mt, &nt);
          const int32_t a_row = mt * static_cast<int32_t>(C::kRowsPerTile) + static_cast<int32_t>(rank * C::BM);
          const int32_t head = nt * CG + static_cast<int32_t>(rank);  // the head whose B rows this CTA loads
          const int32_t b_row = head * 128;
          const int32_t sfa_chunk_base = (mt * CG + static_cast<int32_t>(rank)) * num_kb;
          const int32_t sfb_chunk_base = head * num_kb;
          for (int32_t kb = 0; kb < num_kb; ++kb, ++issued, st.advance()) {
            // First pass over a stage: parity phase^1 = 1 refers to the phase
            // "before" phase 0, which counts as complete: no wait.
            if constexpr (CG == 1)
              mbarrier_wait(empty_bar(st.idx), st.phase ^ 1u);
            else
              mbarrier_wait_cluster(empty_bar(st.idx), st.phase ^ 1u);
            const int32_t kx = kb * static_cast<int32_t>(C::BK);
            // SF tensor maps view the F8_128x4 buffers as rows of 256 B: chunk c
            // (512 B: 128 rows × 4 scale columns) is rows 2c, 2c+1.
            if constexpr (CG == 1) {
              const uint32_t fb = full_bar(st.idx);
              mbarrier_arrive_expect_tx(fb, C::kTxBytesPerStage);
              cp_async_bulk_tensor_2d(a_tile(st.idx), &tmap_a, kx, a_row, fb);
              cp_async_bulk_tensor_2d(b_tile(st.idx), &tmap_b, kx, b_row, fb);
              cp_async_bulk_tensor_2d(sfa_chunk(st.idx), &tmap_sfa, 0, 2 * (sfa_chunk_base + kb), fb);
              cp_async_bulk_tensor_2d(sfb_chunk(st.idx), &tmap_sfb, 0, 2 * (sfb_chunk_base + kb), fb);
            } else {
              // All bytes of the pair are counted on the even CTA's full barrier
              // (one arrival: the leader's expect_tx). The peer's complete_tx may
              // land before that expect_tx: tx-count may go negative (valid
              // range -(2^20-1)..2^20-1, PTX ISA §9.7.13.15.2) and the phase
              // cannot complete while the leader's arrival is pending. It cannot
              // belong to the next phase: the peer refills stage s only after
              // empty[s], i.e. after the MMAs that consumed this phase.
              if (leader) mbarrier_arrive_expect_tx(full_bar(st.idx), C::kTxBytesPerStage);
              const uint32_t fb = mapa_shared_cluster(full_bar(st.idx), 0);
              cp_async_bulk_tensor_2d_cta_group_2(a_tile(st.idx), &tmap_a, kx, a_row, fb);
              cp_async_bulk_tensor_2d_cta_group_2(b_tile(st.idx), &tmap_b, kx, b_row, fb);
              cp_async_bulk_tensor_2d_cta_group_2(sfa_chunk(st.idx), &tmap_sfa, 0, 2 * (sfa_chunk_base + kb), fb);
              // This CTA's SFB half goes to slot `rank` of both CTAs.
              cp_async_bulk_tensor_2d_multicast_cta_group_2(sfb_chunk(st.idx) + rank * kSfChunkBytes, &tmap_sfb, 0,
                                                            2 * (sfb_chunk_base + kb), fb, 0x3);
            }
          }
        }
        // Drain: wait for the MMA commits of the last (up to S) k-blocks, so
        // no asynchronous arrive is still on its way to this CTA's shared
        // memory when the CTA exits.
        for (uint32_t g = issued > S ? issued - S : 0u; g < issued; ++g) {
          if constexpr (CG == 1)
            mbarrier_wait(empty_bar(pipe::stage_of(g, S)), pipe::commit_parity(g, S));
          else
            mbarrier_wait_cluster(empty_bar(pipe::stage_of(g, S)), pipe::commit_parity(g, S));
        }
      }
      __syncwarp();  // reconverge the warp before the .aligned teardown barriers
    } else if (warp == C::kMmaWarp) {
      // ================================================================ MMA
      if (leader && elect_sync()) {
        constexpr uint32_t kIdesc = make_idesc_mxf8f6f4(C::UMMA_M, C::UMMA_N);
        pipe::Ring<S> st;
        uint32_t g = 0;  // k-blocks issued so far (global over tiles): SF slot ring
        // i: local tile counter (accumulator buffer i & 1, its use i >> 1)
        for (int32_t t = first_tile<CG>(), i = 0; t < p.num_tiles; t += tile_stride<CG>(), ++i) {
          const uint32_t buf = pipe::acc_buf(static_cast<uint32_t>(i));
          const uint32_t d_tmem = tmem_base + (buf == 0 ? C::kAccBase0 : C::kAccBase1);
          // The epilogue of the previous occupant of `buf` has read it all...
          mbarrier_wait_cluster(tmem_empty_bar(buf), pipe::acc_empty_parity(static_cast<uint32_t>(i)));
          // ...and (cta_group 2) the previous tile has read the shared columns.
          if (pipe::ovl_wait(static_cast<uint32_t>(i), C::kOverlapCols > 0))
            mbarrier_wait_cluster(tmem_ovl_bar(pipe::ovl_wait_buf(static_cast<uint32_t>(i))),
                                  pipe::ovl_wait_parity(static_cast<uint32_t>(i)));
          tcgen05_fence_after_thread_sync();
          for (int32_t kb = 0; kb < num_kb; ++kb, ++g, st.advance()) {
            if constexpr (CG == 1)
              mbarrier_wait(full_bar(st.idx), st.phase);
            else
              mbarrier_wait_cluster(full_bar(st.idx), st.phase);
            tcgen05_fence_after_thread_sync();
            // Scale factors go to TMEM slot g % R. tcgen05.mma -> tcgen05.cp is
            // not an ordered pipeline pair (PTX ISA §9.7.16.6.2), so the slot is
            // rewritten only after the MMAs that read it (k-block g - R) have
            // completed: their commit is phase ((g-R)/S) of empty[(g-R) % S].
            const uint32_t slot = pipe::sf_slot(g, C::kSfSlots);
            if (pipe::sf_reuse_wait(g, C::kSfSlots)) {
              const uint32_t rs = pipe::sf_reuse_stage(g, C::kSfSlots, S);
              const uint32_t rp = pipe::sf_reuse_parity(g, C::kSfSlots, S);
              if constexpr (CG == 1)
                mbarrier_wait(empty_bar(rs), rp);
              else
                mbarrier_wait_cluster(empty_bar(rs), rp);
              tcgen05_fence_after_thread_sync();
            }
            const uint32_t sfa_tmem = tmem_base + C::kSfBase + slot * C::kSfSlotCols;
            const uint32_t sfb_tmem = sfa_tmem + C::kSfaCols;
            // tcgen05.cp -> tcgen05.mma is an ordered pair: no wait in between.
            tcgen05_cp_32x128b_warpx4<CG>(sfa_tmem, make_sf_desc(sfa_chunk(st.idx)));
#pragma unroll
            for (uint32_t c = 0; c < CG; ++c)
              tcgen05_cp_32x128b_warpx4<CG>(sfb_tmem + 4 * c, make_sf_desc(sfb_chunk(st.idx) + c * kSfChunkBytes));
            const uint64_t a_desc = make_operand_desc(a_tile(st.idx));
            const uint64_t b_desc = make_operand_desc(b_tile(st.idx));
#pragma unroll
            for (uint32_t j = 0; j < C::kMmaPerStage; ++j) {
              // K slice j: 32 bytes into the 128-B swizzle atom; scale byte j.
              tcgen05_mma_mxf8f6f4_block_scale<CG>(
                  d_tmem, operand_desc_advance(a_desc, 32 * j), operand_desc_advance(b_desc, 32 * j),
                  idesc_with_sf_ids(kIdesc, j, j), sfa_tmem, sfb_tmem, kb > 0 || j > 0);
            }
            // Stage s is free once these MMAs (and the cps) completed.
            if constexpr (CG == 1)
              tcgen05_commit<CG>(empty_bar(st.idx));
            else
              tcgen05_commit_multicast<CG>(empty_bar(st.idx), 0x3);
          }
          // Accumulator complete: wake the epilogue of both CTAs.
          if constexpr (CG == 1)
            tcgen05_commit<CG>(tmem_full_bar(buf));
          else
            tcgen05_commit_multicast<CG>(tmem_full_bar(buf), 0x3);
        }
      }
      __syncwarp();  // reconverge (tcgen05.dealloc and barrier.cluster are .aligned)
    }
  } else {
    // =========================================================== epilogue
    if constexpr (CG == 2 && kUseSetmaxnreg) setmaxnreg_inc<C::kEpilogueRegs>();
    const uint32_t e = warp - C::kFirstEpiWarp;
    const uint32_t wg = e / 4;          // head within the tile
    const uint32_t quarter = warp % 4;  // TMEM lane quarter this warp may access
    const uint32_t row_in_cta = quarter * 32 + lane;
    const uint32_t lane_addr = (quarter * 32) << 16;
    auto& owners = reinterpret_cast<typename C::OwnerTable*>(smem_gen + C::kOwnersOff)[wg];
    for (int32_t t = first_tile<CG>(), i = 0; t < p.num_tiles; t += tile_stride<CG>(), ++i) {
      int32_t mt, nt;
      tile_coords(t, p, &mt, &nt);
      const int64_t m0 = static_cast<int64_t>(mt) * C::kRowsPerTile + rank * C::BM;
      const int32_t head = nt * CG + static_cast<int32_t>(wg);
      // The warpgroup's slot owners for its 128 rows, built while the MMA
      // runs (its named barrier first orders the previous tile's queries).
      const uint32_t maps =
          head < p.num_heads ? epi::slot_maps_of(head_info(head, p.ep.nq, p.ep.nkv, p.ep.niq).kind) : 0u;
      if (maps != 0u) {
        auto sync = [wg] { bar_sync(C::kOwnersBarrier0 + wg, 128); };
        sync();
        epi::build_slot_owners(owners, p.ep.slot_mapping, p.ep.index_slot_mapping, maps, p.m, m0, C::BM,
                               static_cast<int>(row_in_cta), 128, sync);
      }
      const uint32_t buf = pipe::acc_buf(static_cast<uint32_t>(i));
      if constexpr (CG == 1)
        mbarrier_wait(tmem_full_bar(buf), pipe::acc_full_parity(static_cast<uint32_t>(i)));
      else
        mbarrier_wait_cluster(tmem_full_bar(buf), pipe::acc_full_parity(static_cast<uint32_t>(i)));
      tcgen05_fence_after_thread_sync();
      const uint32_t col0 = (buf == 0 ? C::kAccBase0 : C::kAccBase1) + wg * 128;
      uint32_t r[4][32];
      // At cta_group 2 the warpgroup owning the shared columns (head 1 of
      // buffer 0: its chunk 3; head 0 of buffer 1: its chunk 0) reads them
      // first and releases them before reading the rest.
      const bool owns_overlap = C::kOverlapCols > 0 && wg == pipe::overlap_owner_wg(buf);
      const uint32_t taddr = tmem_base + lane_addr + col0;
      if (owns_overlap) {
        const uint32_t ovl_bar = mapa_shared_cluster(tmem_ovl_bar(buf), 0);
        if (buf == 0)
          load_row_overlap_first<pipe::overlap_chunk(0)>(taddr, r, lane, ovl_bar);
        else
          load_row_overlap_first<pipe::overlap_chunk(1)>(taddr, r, lane, ovl_bar);
      } else {
#pragma unroll
        for (uint32_t c = 0; c < 4; ++c) tcgen05_ld_32x32b_x32(taddr + 32 * c, r[c]);
      }
      tcgen05_wait_ld();
      // The whole row is in registers: release the accumulator to the MMA.
      tcgen05_fence_before_thread_sync();
      __syncwarp();
      if (lane == 0) {
        if constexpr (CG == 1)
          mbarrier_arrive(tmem_empty_bar(buf));
        else
          mbarrier_arrive_remote(mapa_shared_cluster(tmem_empty_bar(buf), 0));
      }

      float x[128];
#pragma unroll
      for (int c = 0; c < 128; ++c) x[c] = __uint_as_float(r[c / 32][c % 32]);
      const int64_t m = m0 + row_in_cta;
      // Rows past M and the phantom head (odd head count at cta_group 2:
      // computed from TMA zero-fill) are never stored.
      if (m < p.m && head < p.num_heads) {
        if (p.acc_tap != nullptr) {
          float4* dst = reinterpret_cast<float4*>(p.acc_tap + (m * p.num_heads + head) * 128);
#pragma unroll
          for (int c = 0; c < 32; ++c) dst[c] = make_float4(x[4 * c], x[4 * c + 1], x[4 * c + 2], x[4 * c + 3]);
        }
        epi::epilogue_head_row(p.ep, owners.view(), m, head, x);
      }
    }
  }

  // ------------------------------------------------------------- teardown
  // Let a dependent grid start its prologue; its griddepcontrol.wait still
  // waits for this grid to complete and flush.
  griddepcontrol_launch_dependents();
  // Every TMEM access of the pair is finished (the epilogue waited for the
  // last accumulators and read them) before the collective dealloc.
  tcgen05_fence_before_thread_sync();
  if constexpr (CG == 2) {
    barrier_cluster_arrive();
    barrier_cluster_wait();
  } else {
    __syncthreads();
  }
  if (warp == C::kMmaWarp) {
    tcgen05_fence_after_thread_sync();
    tcgen05_dealloc<CG>(tmem_base, C::kTmemAllocCols);
  }
}

namespace m3qkv::sm100 {

template <int CG>
cudaError_t set_kernel_attributes() {
  return cudaFuncSetAttribute(m3qkv_sm100_fused_kernel<CG>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(Config<CG>::kSmemBytes));
}

template <int CG>
int max_active_clusters() {
  return host::max_active_clusters(m3qkv_sm100_fused_kernel<CG>, Config<CG>::kNumThreads, Config<CG>::kSmemBytes, CG);
}

template <int CG>
m3qkv_status launch_kernel(const TensorMaps& tm, const Params& p, unsigned grid, bool use_pdl, cudaStream_t s) {
  host::LaunchShape shape;
  shape.grid = grid;
  shape.threads = Config<CG>::kNumThreads;
  shape.smem = Config<CG>::kSmemBytes;
  shape.pdl = use_pdl;
  shape.cluster = CG;  // the attribute even at CG 1, as the kernel has always been launched
  return host::launch("m3qkv_fused_qkv", "m3qkv_sm100_fused_kernel", m3qkv_sm100_fused_kernel<CG>, shape, s, tm.a,
                      tm.b, tm.sfa, tm.sfb, p);
}

template cudaError_t set_kernel_attributes<1>();
template cudaError_t set_kernel_attributes<2>();
template int max_active_clusters<1>();
template int max_active_clusters<2>();
template m3qkv_status launch_kernel<1>(const TensorMaps&, const Params&, unsigned, bool, cudaStream_t);
template m3qkv_status launch_kernel<2>(const TensorMaps&, const Params&, unsigned, bool, cudaStream_t);

}  // namespace m3qkv::sm100
