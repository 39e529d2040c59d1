// The quad transpose behind the register epilogue's 16-byte stores
// (epi::quad_store_row in common/epilogue_quad.cuh), written once for the
// device and the CPU model test (tests/cpu/test_quad_store.cpp); host + device.
//
// A quad (lanes q = 0..3) holds one output row as 16 "units" per lane of
// U = 1, 2 or 4 bytes (an NVFP4 code byte, an e4m3 pair, a bf16 pair): unit j
// of lane q belongs at row byte (4j + q)·U. Stored per j that is 16 stores of
// U bytes per lane. Instead each lane packs its units in order into 4U words
// (quad_put_unit: unit j at lane byte U·j), so its word k holds the units
// with U·j in [4k, 4k + 4). Row chunk k (bytes 16k .. 16k + 15) holds the
// units with (4j + q)·U in [16k, 16k + 16), i.e. U·j in [4k, 4k + 4), of every
// q: word k of each of the four lanes. So
//  1. a 4x4 word transpose within the quad (two butterfly steps of xor
//     shuffles, quad_xpose_send / quad_xpose_recv) of words 4G .. 4G + 3 gives
//     lane L word 4G + L of lanes r = 0..3 in t[r];
//  2. a byte permutation within the lane (quad_chunk_bytes) puts those 16
//     bytes in row order: byte b of t[r] goes to chunk byte
//     U·(4·(b / U) + r) + b % U (the identity for U = 4);
//  3. lane L stores chunk 4G + L (quad_chunk_offset), G = 0 .. U - 1: per
//     store instruction the quad writes 64 contiguous bytes.
#pragma once

#include <stdint.h>

#include "common/numerics.h"

namespace m3qkv {

// Packs unit j (its low U bytes) of this lane at lane byte U·j of w; w starts
// at zero. j is a compile-time index wherever it is unrolled.
template <int U>
M3_HD void quad_put_unit(uint32_t (&w)[4 * U], int j, uint32_t unit) {
  static_assert(U == 1 || U == 2 || U == 4, "units of 1, 2 or 4 bytes");
  constexpr uint32_t kMask = U == 4 ? 0xffffffffu : (1u << (8 * U)) - 1u;
  w[U * j / 4] |= (unit & kMask) << (8 * (U * j % 4));
}

// Butterfly step (m = 1 then 2; pairs p = 0, 1) of the 4x4 transpose
// "t[r] of lane q -> t[q] of lane r": the pair of word indices {lo, lo | m}
// differs in bit m; lane q and its partner q ^ m swap the word whose index bit
// m differs from their own lane bit m. Each lane sends that word and
// overwrites it with its partner's.
M3_HD constexpr int quad_xpose_lo(int m, int p) { return m == 1 ? 2 * p : p; }
M3_HD uint32_t quad_xpose_send(const uint32_t (&t)[4], int q, int m, int p) {
  const int lo = quad_xpose_lo(m, p);
  return (q & m) ? t[lo] : t[lo | m];
}
M3_HD void quad_xpose_recv(uint32_t (&t)[4], int q, int m, int p, uint32_t v) {
  const int lo = quad_xpose_lo(m, p);
  if (q & m)
    t[lo] = v;
  else
    t[lo | m] = v;
}

// prmt.b32 / __byte_perm (default mode): byte n of the result is byte
// (s >> 4n) & 7 of the 8-byte value {b, a} (a = bytes 0..3).
M3_HD uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, s);
#else
  const uint64_t x = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t r = 0;
  for (int n = 0; n < 4; ++n) r |= static_cast<uint32_t>((x >> (8 * ((s >> (4 * n)) & 7u))) & 0xffu) << (8 * n);
  return r;
#endif
}

// Step 2: t[r] = word k of lane r -> c = chunk k in row order.
template <int U>
M3_HD void quad_chunk_bytes(const uint32_t (&t)[4], uint32_t (&c)[4]) {
  static_assert(U == 1 || U == 2 || U == 4, "units of 1, 2 or 4 bytes");
  if constexpr (U == 4) {
    // t[r] = lane r's unit k: chunk word r.
    for (int r = 0; r < 4; ++r) c[r] = t[r];
  } else if constexpr (U == 2) {
    // t[r] = lane r's units 2k (low half), 2k + 1 (high half); chunk halves:
    // unit 2k of lanes 0..3, then unit 2k + 1 of lanes 0..3.
    c[0] = byte_perm(t[0], t[1], 0x5410u);
    c[1] = byte_perm(t[2], t[3], 0x5410u);
    c[2] = byte_perm(t[0], t[1], 0x7632u);
    c[3] = byte_perm(t[2], t[3], 0x7632u);
  } else {
    // t[r] byte b = lane r's unit 4k + b, at chunk byte 4b + r: a 4x4 byte
    // transpose, interleaving bytes of pairs then halves of pairs.
    const uint32_t x0 = byte_perm(t[0], t[1], 0x5140u), x1 = byte_perm(t[0], t[1], 0x7362u);
    const uint32_t y0 = byte_perm(t[2], t[3], 0x5140u), y1 = byte_perm(t[2], t[3], 0x7362u);
    c[0] = byte_perm(x0, y0, 0x5410u);
    c[1] = byte_perm(x0, y0, 0x7632u);
    c[2] = byte_perm(x1, y1, 0x5410u);
    c[3] = byte_perm(x1, y1, 0x7632u);
  }
}

// Step 3: row byte offset of the chunk lane q stores in round G (0 .. U - 1).
M3_HD constexpr int quad_chunk_offset(int q, int g) { return 16 * (4 * g + q); }

}  // namespace m3qkv
