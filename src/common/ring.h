// The stage ring of a producer / consumer pipeline over mbarriers, written
// once for every kernel: both sides walk the same sequence of stages g = 0,
// 1, ...; stage g uses slot g % S in ring pass g / S, whose parity is what
// an mbarrier wait on that slot checks (PTX ISA, mbarrier.try_wait.parity).
// The SM100 protocol formulas built on it are in src/sm100/pipeline.h, with
// their CPU model in tests/cpu/test_sm100_protocol.cpp.
#pragma once

#include <stdint.h>

#include "common/numerics.h"  // M3_HD

namespace m3qkv {

template <uint32_t S>
struct Ring {
  uint32_t idx = 0, phase = 0;
  M3_HD void advance() {
    if (++idx == S) {
      idx = 0;
      phase ^= 1u;
    }
  }
};

}  // namespace m3qkv
