// Cluster wrappers. PTX ISA 9.x §9.7.13.3 "barrier.cluster", §9.7.9.x "mapa",
// §10 special registers (%cluster_ctarank).
#pragma once

#include <stdint.h>

namespace m3qkv::ptx {

// mov.u32 r, %cluster_ctarank;  rank of this CTA in its cluster.
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// barrier.cluster.arrive.release.aligned;  all threads of the CTA (aligned).
__device__ __forceinline__ void barrier_cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
// barrier.cluster.arrive.relaxed.aligned;  no memory ordering (start-up sync
// before TMEM allocation needs only the execution barrier).
__device__ __forceinline__ void barrier_cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
// barrier.cluster.wait.acquire.aligned;
__device__ __forceinline__ void barrier_cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// mapa.shared::cluster.u32 d, a, rank;  the shared::cluster address of the
// same shared::cta offset `a` in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t mapa_shared_cluster(uint32_t smem_addr, uint32_t rank) {
  uint32_t d;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(d) : "r"(smem_addr), "r"(rank));
  return d;
}

// ld.shared::cluster.f32 d, [addr];  PTX ISA 7.8+, sm_90 ("ld", state space
// .shared::cluster): a load from the shared memory of any CTA of the cluster
// (distributed shared memory); `addr` comes from mapa (ptx/cluster.cuh).
// volatile: the data is written by another CTA; ordering comes from the
// mbarrier acquire before it.
__device__ __forceinline__ float ld_shared_cluster_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr));
  return v;
}

// ld.shared::cluster.v4.f32 {d0..d3}, [addr];  the same, 16 bytes (addr 16-B aligned).
__device__ __forceinline__ float4 ld_shared_cluster_v4_f32(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr));
  return v;
}

}  // namespace m3qkv::ptx
