// Full argument validation of the entry points (docs/contract.md §2, §5.2, §7.2).
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
// m3qkv_prepare_weights_fp8 (n > 0 always: no no-op) and its sizes query.
m3qkv_status validate_prepare(const m3qkv_prepare_args* args, m3qkv_prepare_args* out);
m3qkv_status prepare_sizes(int64_t n, int64_t k, size_t* wq_bytes, size_t* wsf_bytes);

}  // namespace m3qkv
