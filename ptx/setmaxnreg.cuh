// setmaxnreg (PTX ISA 9.x §9.7.19.x "setmaxnreg"; sm_90a, sm_100f/sm_100a):
// every warp of a warpgroup executes it with the same immediate; the count is
// a multiple of 8 in [24, 256].
#pragma once

namespace m3qkv::ptx {

template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}

}  // namespace m3qkv::ptx
