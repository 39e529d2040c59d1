// wgmma wrappers (sm_90a): one thin inline-asm wrapper per instruction, named
// after the mnemonic. PTX ISA 8.0+, "Asynchronous Warpgroup Level Matrix
// Multiply-Accumulate Instructions" (wgmma.mma_async, wgmma.fence,
// wgmma.commit_group, wgmma.wait_group) and "Matrix Descriptor Format".
// Only the shapes m3qkv uses exist here: m64n128 with an f32 accumulator, both
// operands K-major in shared memory (descriptors), for bf16 (k16) and e4m3 (k32);
// and m64n{16,32,64,128}k16 bf16 with A in registers (the decode kernel).
//
// Accumulator fragment (PTX ISA "Register fragments: wgmma .m64nNk*, f32
// accumulator D"): thread t of the warpgroup, warp w = t/32, lane l = t%32,
// holds d[4j + 2h + b] = D[16w + l/4 + 8h][8j + 2(l%4) + b], j in 0..N/8-1,
// h, b in {0, 1}. m3qkv relies on this (src/sm90/epilogue_sm90.cuh).
#pragma once

#include <stdint.h>

#if defined(__CUDACC__)
#define M3QKV_WGMMA_HD __host__ __device__ __forceinline__
#else
#define M3QKV_WGMMA_HD inline
#endif

namespace m3qkv {
namespace wgmma {

// ---- shared-memory matrix descriptor (64 bits), PTX ISA "Matrix Descriptor
// Format" for wgmma (sm_90; differs from the tcgen05 one: no version bits,
// 2-bit swizzle field at 62-63):
//   bits  0-13 start address >> 4      bits 16-29 leading-dimension byte offset >> 4
//   bits 32-45 stride byte offset >> 4 bits 49-51 base offset (0: atoms 1024-B aligned)
//   bits 62-63 swizzle: 0 none, 1 = 128 B, 2 = 64 B, 3 = 32 B.
// For a K-major operand with the 128-byte swizzle, one row of the tile is one
// 128-byte swizzle row, 8 rows form a 1024-byte atom, SBO = 1024 is the distance
// between 8-row groups, and LBO is unused (PTX ISA: "not used" for swizzled
// K-major layouts; encoded 1 as CUTLASS does).
enum : uint32_t { kSwizzleNone = 0, kSwizzle128B = 1, kSwizzle64B = 2, kSwizzle32B = 3 };

M3QKV_WGMMA_HD uint64_t make_smem_desc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes,
                                       uint32_t swizzle) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((smem_addr >> 4) & 0x3FFFu);
  d |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16;
  d |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32;
  d |= static_cast<uint64_t>(swizzle & 3u) << 62;
  return d;
}
// K-major, 128-byte swizzle, 8-row atoms 1024 B apart (the layout TMA writes
// with CU_TENSOR_MAP_SWIZZLE_128B and a 128-byte inner box).
M3QKV_WGMMA_HD uint64_t make_desc_kmajor_sw128(uint32_t smem_addr) {
  return make_smem_desc(smem_addr, 16u, 1024u, kSwizzle128B);
}
// Start address step for the next K slice inside a 128-byte swizzle row: the
// hardware applies the swizzle to the absolute address bits, so a K offset of
// `bytes` (< 128, multiple of 16) inside 1024-B aligned atoms is a plain add on
// the encoded start address.
M3QKV_WGMMA_HD uint64_t desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// The instructions exist only on sm_90a (arch-specific feature set); callers
// guard their use with M3QKV_HAS_WGMMA (0 in host passes and other targets).
// The wrappers themselves are declared in every CUDA pass so kernel templates
// parse everywhere.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define M3QKV_HAS_WGMMA 1
#else
#define M3QKV_HAS_WGMMA 0
#endif

#if defined(__CUDACC__)

// wgmma.fence.sync.aligned: orders register accesses of the warpgroup before
// the next wgmma.mma_async (accumulator registers written by ordinary code).
__device__ __forceinline__ void fence_sync_aligned() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
// wgmma.commit_group.sync.aligned: closes the group of prior wgmma.mma_async.
__device__ __forceinline__ void commit_group_sync_aligned() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
// wgmma.wait_group.sync.aligned N: waits until at most N groups are pending.
template <int N>
__device__ __forceinline__ void wait_group_sync_aligned() {
  static_assert(N >= 0 && N <= 7, "wgmma.wait_group immediate");
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// The accumulator registers are "+f" operands: the compiler must not move
// reads/writes of them across fence/commit/wait. warpgroup_fence_operand keeps
// a register live at a point (same trick CUTLASS uses), at no instruction cost.
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 (A, B from shared
// memory, both K-major: imm-trans-a = imm-trans-b = 0). scale_d = 0 writes
// D = A·B (ignores the old D), 1 accumulates D += A·B.
__device__ __forceinline__ void mma_async_m64n128k16_f32_bf16_bf16(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                                   uint32_t scale_d) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 (fp8: K-major only,
// no transpose immediates).
__device__ __forceinline__ void mma_async_m64n128k32_f32_e4m3_e4m3(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                                   uint32_t scale_d) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1;\n"
      "}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16 with A from REGISTERS
// (PTX ISA "wgmma.mma_async", register form: d, a, b-desc, scale-d,
// imm-scale-a, imm-scale-b, imm-trans-b; B K-major in shared memory). The
// A fragment (PTX ISA "Register fragments: wgmma .m64nNk16", matrix A) is four
// bf16x2 registers: thread (warp w, lane l) holds a[e] for element e = 0..7 at
// row 16w + l/4 + 8·((e/2) % 2), column 8·(e/4) + 2(l%4) + (e % 2), i.e.
// a[0] = (row r, k 2q..2q+1), a[1] = (row r+8, same k), a[2] = (row r, k
// 2q+8..2q+9), a[3] = (row r+8, k 2q+8..2q+9), q = l % 4 — the same layout as
// the accumulator of an m64n16 tile. D has N/2 f32 registers per thread in
// the accumulator layout above (d[4j + 2h + b]). Used by the SM90 decode
// kernel (weights as A, tokens as N = 16..128).
__device__ __forceinline__ void mma_async_m64n16k16_f32_bf16_bf16_rs(float (&d)[8], const uint32_t (&a)[4],
                                                                   uint64_t desc_b, uint32_t scale_d) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7}, "
      "{%8, %9, %10, %11}, %12, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}
__device__ __forceinline__ void mma_async_m64n32k16_f32_bf16_bf16_rs(float (&d)[16], const uint32_t (&a)[4],
                                                                   uint64_t desc_b, uint32_t scale_d) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}
__device__ __forceinline__ void mma_async_m64n64k16_f32_bf16_bf16_rs(float (&d)[32], const uint32_t (&a)[4],
                                                                   uint64_t desc_b, uint32_t scale_d) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}
__device__ __forceinline__ void mma_async_m64n128k16_f32_bf16_bf16_rs(float (&d)[64], const uint32_t (&a)[4],
                                                                   uint64_t desc_b, uint32_t scale_d) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}
#endif  // __CUDACC__

}  // namespace wgmma
}  // namespace m3qkv
