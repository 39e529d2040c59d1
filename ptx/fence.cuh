// Proxy fences. PTX ISA 9.x §9.7.13.4 "membar/fence": fence.proxy.async orders
// generic-proxy accesses of shared memory against later async-proxy accesses
// (TMA, tcgen05.cp/mma reading shared memory) and vice versa; the .global
// form does the same for global memory (generic stores that a TMA load of
// another CTA reads after a grid barrier).
#pragma once

namespace m3qkv::ptx {

// fence.proxy.async.shared::cta;
__device__ __forceinline__ void fence_proxy_async_shared_cta() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// fence.proxy.async.global;
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

}  // namespace m3qkv::ptx
