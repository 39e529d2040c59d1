// Warp-level MMA (PTX ISA 7.0, sm_80+: "Warp Level Matrix Multiply-Accumulate
// Instructions: mma", shape .m16n8k16, bf16 inputs, f32 accumulator).
// Fragments (g = lane / 4, t = lane % 4), from the PTX ISA figures for m16n8k16:
//   a[0]: (row g,   k 2t..2t+1)   a[1]: (row g+8, k 2t..2t+1)
//   a[2]: (row g,   k 2t+8..+9)   a[3]: (row g+8, k 2t+8..+9)
//   b[0]: (k 2t..2t+1, col g)     b[1]: (k 2t+8..+9, col g)
//   c[0..1]: (row g, cols 2t, 2t+1)   c[2..3]: (row g+8, cols 2t, 2t+1)
// Each 32-bit register holds two bf16, the lower index in the low half.
#pragma once

#include <stdint.h>

__device__ __forceinline__ void mma_sync_m16n8k16_row_col_f32_bf16_bf16_f32(float (&c)[4], const uint32_t (&a)[4],
                                                                           const uint32_t (&b)[2]) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
