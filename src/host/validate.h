// Full argument validation of the four entry points (SPEC §2, §6, §8).
// Launches nothing and touches no device memory.
#pragma once

#include "m3qkv/m3qkv.h"

namespace m3qkv {

// On success *noop is set when m == 0 (nothing to do).
m3qkv_status validate_fused(const m3qkv_fused_args* a, bool* noop);
m3qkv_status validate_insert(const m3qkv_insert_args* a, bool* noop);
m3qkv_status validate_gemm(const m3qkv_gemm_args* a, bool* noop);
m3qkv_status validate_quantize(const m3qkv_quantize_args* a, bool* noop);

}  // namespace m3qkv
