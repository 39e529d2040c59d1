// sm_90 implementations of the SM100-only TMA forms of ptx/tma_sm100.cuh for the
// tcgen05 emulation build (M3QKV_TCGEN05_EMULATION), with the same completion
// semantics (PTX ISA 9.x §9.7.9.25.5.2 cp.async.bulk.tensor):
//  * .cta_group::2: the box lands in this CTA's shared memory at `dst`; its
//    complete_tx (bytes = the whole box) is performed on `bar_cluster`, which
//    may be a barrier of this CTA or of its peer.
//  * .multicast::cluster.cta_group::2: the box lands at `dst` in every CTA of
//    ctaMask; the complete_tx of each destination CTA d goes to the barrier at
//    bar's offset in the CTA of d's pair with bar's %cluster_ctarank parity.
// sm_90 has no TMA form that signals a barrier of another CTA, so the model
// loads the box into this CTA with the sm_90 tile form, completing on a
// private barrier (emu_common.cuh), waits for it, copies the box to the other
// destination CTAs through distributed shared memory, then performs the
// complete_tx on the right barrier(s) with mbarrier.complete_tx (sm_90).
// Same bytes on the same barriers as the hardware; the copy is synchronous in
// the issuing thread (timing differs, not the protocol).
//
// The box size is not an argument: it is read from the tensor map by probing
// with tensormap.replace (sm_90a) on a private copy: the box_dim value whose
// re-encoding leaves the copy unchanged is the map's. Element type UINT8 and
// element strides 1 are assumed (src/common/tensor_map.h builds only such
// maps for this kernel). Cached per CTA and tensor map.
#pragma once

#include <stdint.h>

#include "sm100/emu/emu_common.cuh"

namespace m3qkv::ptx::emu {

namespace {
__device__ __align__(128) uint8_t g_tmap_probe[1024][128];  // one scratch tensor map per resident CTA slot
}

__device__ __forceinline__ bool tmap_copy_equal(const uint4* a, const uint4* b) {
  bool eq = true;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint4 x = a[i], y = b[i];
    eq &= x.x == y.x && x.y == y.y && x.z == y.z && x.w == y.w;
  }
  return eq;
}

// Bytes of one box of the 2-D tiled tensor map `tmap` (UINT8 elements).
static __device__ __noinline__ uint32_t tmap_box_bytes(const void* tmap) {
  for (int i = 0; i < 4; ++i)
    if (s_cta.tmap_cache[i] == tmap) return s_cta.tmap_bytes[i];
  const uint4* orig = static_cast<const uint4*>(tmap);
  uint4* scratch = reinterpret_cast<uint4*>(g_tmap_probe[blockIdx.x % 1024u]);
  const uint64_t sa = static_cast<uint64_t>(__cvta_generic_to_global(scratch));  // .global operand
  auto reset = [&]() {
#pragma unroll
    for (int i = 0; i < 8; ++i) scratch[i] = orig[i];
    __threadfence_block();
  };
  uint32_t box[2] = {0, 0};
  for (uint32_t v = 1; v <= 256 && box[0] == 0; ++v) {
    reset();
    asm volatile("tensormap.replace.tile.box_dim.global.b1024.b32 [%0], 0, %1;" ::"l"(sa), "r"(v) : "memory");
    __threadfence_block();
    if (tmap_copy_equal(scratch, orig)) box[0] = v;
  }
  for (uint32_t v = 1; v <= 256 && box[1] == 0; ++v) {
    reset();
    asm volatile("tensormap.replace.tile.box_dim.global.b1024.b32 [%0], 1, %1;" ::"l"(sa), "r"(v) : "memory");
    __threadfence_block();
    if (tmap_copy_equal(scratch, orig)) box[1] = v;
  }
  if (box[0] == 0 || box[1] == 0) M3QKV_EMU_TRAP("SM100 TMA model: could not read the box size of tensor map %p", tmap);
  // TMA boxes have a multiple of 16 bytes along the inner dimension: a probe
  // that matched a field the encoding ignores would give 1 here.
  if (box[0] % 16u != 0)
    M3QKV_EMU_TRAP("SM100 TMA model: implausible box %u x %u read from tensor map %p", box[0], box[1], tmap);
  const uint32_t bytes = box[0] * box[1];
  for (int i = 0; i < 4; ++i)
    if (s_cta.tmap_cache[i] == nullptr) {
      s_cta.tmap_cache[i] = tmap;
      s_cta.tmap_bytes[i] = bytes;
      break;
    }
  return bytes;
}

// Loads the box into this CTA at `dst` and waits until it has landed.
__device__ __forceinline__ uint32_t tma_load_local_and_wait(uint32_t dst, const void* tmap, int32_t x, int32_t y) {
  // v[3] of a trap record = the tensor map: tells the four loads of a stage apart.
  require_state("SM100 TMA (.cta_group::2)", reinterpret_cast<unsigned long long>(tmap));
  const uint32_t bytes = tmap_box_bytes(tmap);
  const uint32_t bar = smem_addr(&s_cta.tma_bar);
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(x), "r"(y), "r"(bar)
      : "memory");
  const uint32_t parity = s_cta.tma_phase;
  uint32_t ok = 0;
  const uint64_t t0 = globaltimer_ns();
  while (!ok) {
    if (globaltimer_ns() - t0 > 2000000000ull)
      M3QKV_EMU_TRAP("SM100 TMA model: box of %u bytes (tensor map %p, {%d, %d}) not landed after 2 s", bytes, tmap, x, y);
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(ok)
        : "r"(bar), "r"(parity)
        : "memory");
  }
  s_cta.tma_phase = parity ^ 1u;
  return bytes;
}

}  // namespace m3qkv::ptx::emu

namespace m3qkv::ptx {

__device__ __forceinline__ void cp_async_bulk_tensor_2d_cta_group_2(uint32_t dst, const void* tmap, int32_t x,
                                                                    int32_t y, uint32_t bar_cluster) {
  using namespace emu;
  const uint32_t bytes = tma_load_local_and_wait(dst, tmap, x, y);
  // Release the landed box (observed through the private barrier) at cluster
  // scope before the complete_tx that lets the consumer's acquire see it.
  asm volatile("fence.acq_rel.cluster;" ::: "memory");
  complete_tx_cluster(bar_cluster, bytes);
}

__device__ __forceinline__ void cp_async_bulk_tensor_2d_multicast_cta_group_2(uint32_t dst, const void* tmap, int32_t x,
                                                                              int32_t y, uint32_t bar_cluster,
                                                                              uint16_t cta_mask) {
  using namespace emu;
  const uint32_t me = cta_rank();
  const uint32_t n = cluster_size();
  if (!((cta_mask >> me) & 1u))
    M3QKV_EMU_TRAP("SM100 TMA model: multicast mask %04x without the issuing CTA (rank %u) not modeled", cta_mask, me);
  uint32_t bar_rank, bar_local;
  if (!cluster_addr_owner(bar_cluster, &bar_rank, &bar_local)) {
    const uint32_t ref = smem_addr(&s_cta);
    // v = {the address, this CTA's shared::cta address of s_cta, mapa of it to ranks 0 and 1}
    M3QKV_EMU_TRAP_V(bar_cluster, ref, mapa(ref, 0), mapa(ref, n > 1 ? 1u : 0u),
                     "SM100 TMA model: %08x is not a shared::cluster barrier address", bar_cluster);
  }
  const uint32_t bytes = tma_load_local_and_wait(dst, tmap, x, y);
  if (bytes % 16u) M3QKV_EMU_TRAP("SM100 TMA model: multicast box of %u bytes not a multiple of 16", bytes);
  for (uint32_t d = 0; d < 16; ++d) {
    if (!((cta_mask >> d) & 1u) || d == me) continue;
    if (d >= n) M3QKV_EMU_TRAP("SM100 TMA model: ctaMask %04x names rank %u of a %u-CTA cluster", cta_mask, d, n);
    const uint32_t remote = mapa(dst, d);
    for (uint32_t o = 0; o < bytes; o += 16) st_cluster_v4(remote + o, ld_cluster_v4(mapa(dst + o, me)));
  }
  // Generic-proxy writes to the peer's shared memory, later overwritten by
  // its TMA (async proxy): proxy fence, then release at cluster scope.
  asm volatile("fence.proxy.async;" ::: "memory");
  asm volatile("fence.acq_rel.cluster;" ::: "memory");
  for (uint32_t d = 0; d < 16; ++d) {
    if (!((cta_mask >> d) & 1u)) continue;
    const uint32_t target = (d & ~1u) | (bar_rank & 1u);
    complete_tx_cluster(mapa(bar_local, target), bytes);
  }
}

}  // namespace m3qkv::ptx
