// Test-only C ABI over the CPU golden model, loaded by the Python tests with
// ctypes (python/tests): they run the golden model on the same host buffers as
// the torch port of the epilogue in python/m3qkv/reference.py, and on the GPU
// results of the Python ops. All pointers in the structs are HOST pointers.
// Not installed, not part of the product's API.
#include <cstdint>

#include "golden/golden.h"
#include "m3qkv/m3qkv.h"

#define GOLDEN_API extern "C" __attribute__((visibility("default")))

// sizeof of the structs this golden model was compiled with; the Python side
// checks them against its ctypes mirror before passing a struct in.
GOLDEN_API size_t m3qkv_golden_sizeof_fused(void) { return sizeof(m3qkv_fused_args); }
GOLDEN_API size_t m3qkv_golden_sizeof_insert(void) { return sizeof(m3qkv_insert_args); }
GOLDEN_API size_t m3qkv_golden_sizeof_gemm(void) { return sizeof(m3qkv_gemm_args); }

// The epilogue on a given f32 accumulator acc [m, N].
GOLDEN_API void m3qkv_golden_epilogue(const m3qkv_fused_args* a, const float* acc, uint32_t* flags) {
  m3qkv::golden::epilogue(*a, acc, flags);
}
// The golden f32 accumulator acc [m, n] (f64 sum rounded once) of x_bf16
// (bf16 activations) when set, else of xq / xsf.
GOLDEN_API void m3qkv_golden_acc(const m3qkv_fused_args* a, int64_t n, float* acc) {
  if (a->x_bf16 != nullptr) {
    m3qkv::golden::w8a16_acc(static_cast<const uint16_t*>(a->x_bf16), static_cast<const uint8_t*>(a->wq),
                             static_cast<const uint8_t*>(a->wsf), a->m, n, a->k, acc);
    return;
  }
  m3qkv::golden::mxfp8_acc(static_cast<const uint8_t*>(a->xq), static_cast<const uint8_t*>(a->xsf),
                           static_cast<const uint8_t*>(a->wq), static_cast<const uint8_t*>(a->wsf), a->m, n, a->k,
                           acc);
}
GOLDEN_API void m3qkv_golden_fused(const m3qkv_fused_args* a, uint32_t* flags) { m3qkv::golden::fused_qkv(*a, flags); }
GOLDEN_API void m3qkv_golden_insert(const m3qkv_insert_args* a, uint32_t* flags) { m3qkv::golden::insert(*a, flags); }
GOLDEN_API void m3qkv_golden_gemm(const m3qkv_gemm_args* a) { m3qkv::golden::gemm_bf16(*a); }
GOLDEN_API void m3qkv_golden_quantize(const uint16_t* x, int64_t m, int64_t k, uint8_t* xq, uint8_t* xsf) {
  m3qkv::golden::mxfp8_quantize(x, m, k, xq, xsf);
}
