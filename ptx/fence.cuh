// Proxy fences. PTX ISA 9.x §9.7.13.4 "membar/fence": fence.proxy.async orders
// generic-proxy accesses of shared memory against later async-proxy accesses
// (TMA, tcgen05.cp/mma reading shared memory) and vice versa.
#pragma once

namespace m3qkv::ptx {

// fence.proxy.async.shared::cta;
__device__ __forceinline__ void fence_proxy_async_shared_cta() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

}  // namespace m3qkv::ptx
