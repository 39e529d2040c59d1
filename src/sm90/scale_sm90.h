// E8M0 scale decode for the SM90 mainloops (host + device).
#pragma once

#include <stdint.h>

#include "common/numerics.h"

namespace m3qkv::sm90 {

// Bit-identical to m3qkv::e8m0_to_f32 for all 256 bytes (tests/cpu/test_sm90_desc.cpp),
// without branches: 2^(b-127) is b << 23 for b in 1..254; b = 0 (2^-127, the
// subnormal 0x00400000) and b = 0xFF (NaN, 0x7FC00000) are b << 23 plus bit 22.
// numerics.h's if/else form compiles to divergent branches in the variant-B
// promotion loop (34 decodes per thread per 32 K).
M3_HD float e8m0_to_f32_nobranch(uint32_t b) {
  const uint32_t special = ((b + 1u) & 0xfeu) == 0u ? 1u : 0u;  // b == 0 or b == 0xFF
  return bits_f32((b << 23) | (special << 22));
}

}  // namespace m3qkv::sm90
