// Full argument validation of the four entry points (docs/contract.md §2, §5.2, §7.2).
// Launches nothing and touches no device memory.
#pragma once

#include "m3qkv/m3qkv.h"

namespace m3qkv {

// `args` as the caller passed it; on success *out is the struct of this
// version (struct_size = sizeof, fields past the caller's struct_size at
// their defaults), which everything after validation reads, and *noop is set
// when m == 0 (nothing to do).
m3qkv_status validate_fused(const m3qkv_fused_args* args, m3qkv_fused_args* out, bool* noop);
m3qkv_status validate_insert(const m3qkv_insert_args* args, m3qkv_insert_args* out, bool* noop);
m3qkv_status validate_gemm(const m3qkv_gemm_args* args, m3qkv_gemm_args* out, bool* noop);
m3qkv_status validate_quantize(const m3qkv_quantize_args* args, m3qkv_quantize_args* out, bool* noop);

}  // namespace m3qkv
