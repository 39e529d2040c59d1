// ldmatrix (PTX ISA 6.5, sm_75+: "Warp Level Matrix Load Instruction: ldmatrix").
// .x4: lanes 8i..8i+7 give the 8 row addresses (16 bytes each) of matrix i;
// register i of every lane receives matrix i's (row lane/4, elements 2(lane%4)..+1).
#pragma once

#include <stdint.h>

__device__ __forceinline__ void ldmatrix_sync_aligned_m8n8_x4_shared_b16(uint32_t (&r)[4], const void* smem_row) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
