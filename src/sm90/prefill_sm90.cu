// SM90 prefill kernel (docs/sm90.md "Prefill step 2"): both operands in bf16,
// converted once per call by the grid itself before its mainloop
// (convert_sm90.cuh: x̂ = the activations, ŵ = the weights, e4m3·2^(s-127)
// exactly, into the stream workspace, then a grid barrier; one cooperative
// launch), TMA'd with the 128-B swizzle straight into the wgmma stages; bf16 wgmma m64n128k16 with f32
// accumulators over the whole K, so the accumulator is variant A's bit for
// bit (same operand values, same chain: mainloop_bf16). With no transform in
// the mainloop, its warpgroup slot runs the epilogue: the consumers hand each
// finished block over through shared memory and go on with the next tile.
//
// Warp roles (prefill_config.h has the budgets):
//   warpgroup 0: producer, one elected thread: per stage the x̂ and ŵ tiles
//                on full[s] (one arrive.expect_tx)           setmaxnreg.dec 40
//   warpgroups 1, 2: consumers, 64 rows each: mainloop_bf16, then the
//                block into hand-off buffer c (ho_full[c])    setmaxnreg.inc 152
//   warpgroup 3: epilogue: per tile, block c of the buffer through the
//                register epilogue (thread t holds consumer thread t's
//                fragment), then ho_empty[c]                  setmaxnreg.inc 168
// Barriers: full[s] (1 arrival + the stage's bytes), empty[s] (one arrival
// per consumer warp), ho_full[c] (consumer c's 128 threads), ho_empty[c]
// (the epilogue's 128 threads).
#include "sm90/convert_sm90.cuh"
#include "sm90/epilogue_regs_sm90.cuh"
#include "sm90/kernel_sm90.cuh"
#include "sm90/prefill_config.h"

namespace m3qkv::sm90 {
namespace {

namespace pf = prefill;

__global__ void __launch_bounds__(pf::kThreads, 1)
    fused_prefill_kernel(const __grid_constant__ CUtensorMap tmap_xbf, const __grid_constant__ CUtensorMap tmap_wbf,
                         const __grid_constant__ KernelParams p) {
#if defined(__CUDA_ARCH__) && M3QKV_HAS_WGMMA
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = ptx::smem_u32(smem_raw);
  const uint32_t base = (raw + kSwizzleAtom - 1) & ~static_cast<uint32_t>(kSwizzleAtom - 1);
  uint8_t* gbase = smem_raw + (base - raw);
  const uint32_t full0 = base + pf::kBarOff;
  const uint32_t empty0 = full0 + 8 * pf::kStages;
  const uint32_t ho_full0 = empty0 + 8 * pf::kStages;
  const uint32_t ho_empty0 = ho_full0 + 8 * pf::kCons;
  float* handoff = reinterpret_cast<float*>(gbase + pf::kHandoffOff);

  const int wg = threadIdx.x / kWarpgroup;
  const int warp = threadIdx.x / 32;
  if (threadIdx.x == 0) {
    trace_event(p, kTrEntry);
    for (int s = 0; s < pf::kStages; ++s) {
      ptx::mbarrier_init(full0 + 8 * s, 1);
      ptx::mbarrier_init(empty0 + 8 * s, 4 * pf::kCons);
    }
    for (int c = 0; c < pf::kCons; ++c) {
      ptx::mbarrier_init(ho_full0 + 8 * c, kWarpgroup);
      ptx::mbarrier_init(ho_empty0 + 8 * c, kWarpgroup);
    }
    ptx::fence_mbarrier_init_release_cluster();
  }
  if (threadIdx.x == 32) {
    ptx::prefetch_tensormap(&tmap_xbf);
    ptx::prefetch_tensormap(&tmap_wbf);
  }
  __syncthreads();
  griddepcontrol_wait();  // xq, wq and the epilogue inputs: the caller's (a previous grid's output)
  if (threadIdx.x == 0) trace_event(p, kTrPdlWaitDone);
  convert_phase(p);  // x̂, ŵ: every CTA converts its share, then the grid barrier

  if (wg == 0) {
    ptx::setmaxnreg_dec<pf::kProducerRegs>();
    if (warp == 0 && ptx::elect_sync()) {
      trace_event(p, kTrProducerStart);
      produce_bf16<pf::kBM, pf::kStages>(p, work_of<false>(p, 0), &tmap_xbf, &tmap_wbf, base + pf::kAOff,
                                          base + pf::kBOff, full0, empty0);
    }
    griddepcontrol_launch_dependents();
  } else if (wg <= pf::kCons) {
    ptx::setmaxnreg_inc<pf::kConsumerRegs>();
    const int cw = wg - 1;
    const bool cons_t0 = threadIdx.x == kWarpgroup;  // first consumer thread
    Ring<pf::kStages> bs;
    float acc[64];
    uint32_t ho_phase = 0;
    for (int ti = blockIdx.x; ti < p.num_tiles; ti += gridDim.x) {
      mainloop_bf16<pf::kStages>(acc, bs, 2 * p.k_stages, base + pf::kAOff + cw * kRowsPerWg * kSwizzleBytes,
                                 pf::kABytes, base + pf::kBOff, pf::kBBytes, full0, empty0, p,
                                 cons_t0 && ti == static_cast<int>(blockIdx.x));
      if (cons_t0) trace_event(p, kTrConsMainDone);
      // Hand the block over once the epilogue released the buffer's previous
      // block (parity starts at 1: a fresh barrier's preceding phase counts
      // as complete), then go on with the next tile.
      ptx::mbarrier_wait(ho_empty0 + 8 * cw, ho_phase ^ 1u);
      handoff_store(handoff + cw * 64 * kWarpgroup, acc);
      ptx::mbarrier_arrive(ho_full0 + 8 * cw);
      ho_phase ^= 1u;
    }
  } else {
    ptx::setmaxnreg_inc<pf::kEpilogueRegs>();
    const bool epi_t0 = threadIdx.x == (1 + pf::kCons) * kWarpgroup;
    BlockOwners& owners = *reinterpret_cast<BlockOwners*>(gbase + pf::kOwnersOff);
    uint32_t ho_phase = 0;
    for (int ti = blockIdx.x; ti < p.num_tiles; ti += gridDim.x) {
      const Tile tl = tile_of(p, ti);
#pragma unroll 1
      for (int c = 0; c < pf::kCons; ++c) {
        const int64_t row_base = static_cast<int64_t>(tl.mb) * pf::kBM + kRowsPerWg * c;
        block_owners(owners, p, tl, row_base, pf::kOwnersBarrier);  // before the wait: overlaps the mainloop
        ptx::mbarrier_wait(ho_full0 + 8 * c, ho_phase);
        epilogue_block_handoff(p, owners.view(), handoff + c * 64 * kWarpgroup, tl, row_base);
        ptx::mbarrier_arrive(ho_empty0 + 8 * c);
      }
      ho_phase ^= 1u;
    }
    if (epi_t0) trace_event(p, kTrConsEpiDone);
  }
  if (threadIdx.x == 0) trace_event(p, kTrExit);
#endif
}

}  // namespace

cudaError_t prepare_prefill() {
  return cudaFuncSetAttribute(fused_prefill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, pf::kSmemBytes);
}

m3qkv_status co_resident_prefill(const DeviceInfo& dev, unsigned* ctas) {
  return host::co_resident_ctas("m3qkv_fused_qkv", "fused_prefill_kernel", dev,
                                reinterpret_cast<const void*>(fused_prefill_kernel), pf::kThreads, pf::kSmemBytes, ctas);
}

m3qkv_status launch_prefill(const CUtensorMap& tmap_xbf, const CUtensorMap& tmap_wbf, const KernelParams& p, int grid,
                            bool pdl, unsigned max_ctas, cudaStream_t stream) {
  host::LaunchShape s;
  // The grid barrier needs every CTA resident: any grid is clamped to that.
  s.grid = host::clamp_grid(grid, max_ctas);
  s.threads = pf::kThreads;
  s.smem = pf::kSmemBytes;
  s.pdl = pdl;
  s.cooperative = true;  // the grid barrier after the conversion
  return host::launch("m3qkv_fused_qkv", "fused_prefill_kernel", fused_prefill_kernel, s, stream, tmap_xbf, tmap_wbf,
                      p);
}

}  // namespace m3qkv::sm90
