// What the SM100 kernels use of tcgen05 and the SM100-only TMA forms: the
// PTX wrappers, or in the tcgen05 emulation build (M3QKV_TCGEN05_EMULATION,
// docs/emulation.md) their functional models on sm_90a, under the same names.
#pragma once

#if defined(M3QKV_TCGEN05_EMULATION)
#include "sm100/emu/tcgen05_emu.cuh"
#include "sm100/emu/tma_sm100_emu.cuh"
#else
#include "ptx/tcgen05.cuh"
#include "ptx/tma_sm100.cuh"
#endif
