// mbarrier wrappers: one thin asm per instruction, named after the mnemonic.
// PTX ISA 9.x §9.7.13.15 "Parallel Synchronization and Communication
// Instructions: mbarrier" (init, arrive, arrive.expect_tx, try_wait.parity).
// All addresses are 32-bit shared-window addresses (cvta.to.shared), so the
// callers never pay for generic-address conversions in the hot loops.
#pragma once

#include <stdint.h>

namespace m3qkv::ptx {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// mbarrier.init.shared::cta.b64 [addr], count;
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

// fence.mbarrier_init.release.cluster: makes prior mbarrier.init visible to
// the other CTAs of the cluster and to the async proxy (TMA complete_tx,
// tcgen05.commit) before they may signal the barrier (PTX §9.7.13.4 "membar/fence").
__device__ __forceinline__ void fence_mbarrier_init_release_cluster() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// mbarrier.arrive.shared::cta.b64 _, [addr];  (release, CTA scope by default)
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// mbarrier.arrive.expect_tx.shared::cta.b64 _, [addr], tx;  one arrival plus
// `tx` bytes the async copies must complete before the phase can flip.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t tx_bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(tx_bytes) : "memory");
}

// mbarrier.arrive.release.cluster.shared::cluster.b64 _, [raddr];  arrive on a
// barrier of another CTA of the cluster; `raddr` comes from mapa (ptx/cluster.cuh).
__device__ __forceinline__ void mbarrier_arrive_remote(uint32_t cluster_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(cluster_bar) : "memory");
}

// mbarrier.arrive.shared::cluster.b64 _, [raddr];  the same arrival with the
// default CTA-scope release: orders this thread's earlier accesses without the
// GPU-scope fence (MEMBAR.ALL.GPU in SASS) that .release.cluster costs; for a
// consumer releasing a stage a peer's TMA multicast overwrites (its reads are
// complete once the wgmma wait returned and its loads have their values).
__device__ __forceinline__ void mbarrier_arrive_remote_cta(uint32_t cluster_bar) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(cluster_bar) : "memory");
}

// mbarrier.try_wait.parity.shared::cta.b64 p, [addr], parity;  (acquire, CTA scope)
// true once the phase with the given parity has completed.
__device__ __forceinline__ bool mbarrier_try_wait_parity(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
  return ok != 0;
}

// mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64: the same with
// cluster-scope acquire, for phases completed by arrivals from the peer CTA
// (remote arrives, multicast commits, 2-CTA TMA complete_tx).
__device__ __forceinline__ bool mbarrier_try_wait_parity_cluster(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
  return ok != 0;
}

// Spin helpers (not instructions: loops over the wrappers above).
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  while (!mbarrier_try_wait_parity(bar, parity)) {
  }
}
__device__ __forceinline__ void mbarrier_wait_cluster(uint32_t bar, uint32_t parity) {
  while (!mbarrier_try_wait_parity_cluster(bar, parity)) {
  }
}

}  // namespace m3qkv::ptx
