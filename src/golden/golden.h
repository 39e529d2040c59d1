// CPU golden model of m3qkv (docs/contract.md §2-§4, §5.3): the reference every GPU
// backend is compared with. Every rounding step goes through the primitives of
// common/numerics.h and every address through common/layouts.h, so the kernels
// and this model share one definition of the contract. Compiled with
// -ffp-contract=off and without fast-math (an FMA contraction here would
// silently change the bits the contract fixes).
//
// All pointers are HOST pointers. Shapes are those of the public header.
#pragma once

#include <cstdint>
#include <vector>

#include "m3qkv/m3qkv.h"

namespace m3qkv {
namespace golden {

// ---------------------------------------------------------------- MXFP8
// bf16 x [m, k] -> e4m3 xq [m, k] + F8_128x4 xsf (f8_128x4_bytes(m, k/32)
// bytes) with the OCP MX rule of m3qkv_quantize_args (shared exponent from
// mx_shared_exponent(), elements mx_quantize_value(); see numerics.h for
// NaN/inf). Padding rows (>= m) of xsf are written as 0x7F. k % 32 == 0.
void mxfp8_quantize(const uint16_t* x_bf16, int64_t m, int64_t k, uint8_t* xq, uint8_t* xsf);

// acc[m][n] = Σ_k e4m3(xq[m,k])·2^ex · e4m3(wq[n,k])·2^ew: every product is
// exact in f64, the sum is taken in f64 (fixed order) and rounded once to f32.
// NaN/inf operands propagate as IEEE f64 arithmetic does. Multithreaded
// (std::thread, hardware_concurrency); the summation order is fixed (lane
// k % 4 in k order, then (l0 + l1) + (l2 + l3)), so the result does not depend
// on the thread count.
void mxfp8_acc(const uint8_t* xq, const uint8_t* xsf, const uint8_t* wq, const uint8_t* wsf, int64_t m,
               int64_t n, int64_t k, float* acc);
std::vector<float> mxfp8_acc(const uint8_t* xq, const uint8_t* xsf, const uint8_t* wq, const uint8_t* wsf,
                             int64_t m, int64_t n, int64_t k);
// Same sum without the final rounding (f64 [m, n]), for relative-error figures.
std::vector<double> mxfp8_acc_f64(const uint8_t* xq, const uint8_t* xsf, const uint8_t* wq, const uint8_t* wsf,
                                  int64_t m, int64_t n, int64_t k);
// Decodes one MXFP8 operand to f64 [rows, k] (value = e4m3 · 2^(sf - 127)), exact.
std::vector<double> mxfp8_decode(const uint8_t* q, const uint8_t* sf, int64_t rows, int64_t k);

// The fp8 fast mode's fold (common/fold_fp8.h) of an MXFP8 matrix [n, k]
// (weights or activations; wsf in the F8_128x4 layout, k % 128 == 0): e4m3
// values into wq_out [n, k] and one e8m0 byte per (row, 128 K) into
// scale_out [n, k / 128] (row-major). stats: the elements whose value the fold changed, and the
// largest ||w' - w|| / ||w|| of a (row, group) (the bound, relative to
// ||w||·||x||, of the change of that group's dot product with any x).
struct FoldStats {
  int64_t changed = 0;
  double max_rel_change = 0.0;
};
void fold_mxfp8(const uint8_t* wq, const uint8_t* wsf, int64_t n, int64_t k, uint8_t* wq_out, uint8_t* scale_out,
                FoldStats* stats);
// m3qkv_prepare_weights_fp8's result: fold_mxfp8's values, and its group
// scales in the F8_128x4 layout of wsf (the scale in all four blocks of a
// group; padding rows as in wsf), so the result is an MXFP8 weight too.
void prepare_fp8(const uint8_t* wq, const uint8_t* wsf, int64_t n, int64_t k, std::vector<uint8_t>* wq_out,
                 std::vector<uint8_t>* wsf_out, FoldStats* stats);
// The accumulator of two folded operands in f64 (no rounding but the fold's):
// acc[i][j] = Σ_g 2^(sx[i,g] + sw[j,g] − 254) · Σ_{k∈g} x'[i,k]·w'[j,k].
std::vector<double> folded_acc_f64(const uint8_t* xq, const uint8_t* xs, const uint8_t* wq, const uint8_t* ws, int64_t m,
                                   int64_t n, int64_t k);

// bf16 activations (W8A16, x_bf16 of m3qkv_fused_args / m3qkv_gemm_args):
// acc[m][n] = Σ_k float(x_bf16[m,k]) · e4m3(wq[n,k])·2^ew. Every product is
// exact in f64 (8 + 4 significant bits); the sum is the same f64 sum in the
// same fixed order as mxfp8_acc, rounded once to f32, so on x_bf16 holding
// exactly the dequantized values of (xq, xsf) both give the same bits.
void w8a16_acc(const uint16_t* x_bf16, const uint8_t* wq, const uint8_t* wsf, int64_t m, int64_t n, int64_t k,
               float* acc);
std::vector<float> w8a16_acc(const uint16_t* x_bf16, const uint8_t* wq, const uint8_t* wsf, int64_t m, int64_t n,
                             int64_t k);
std::vector<double> w8a16_acc_f64(const uint16_t* x_bf16, const uint8_t* wq, const uint8_t* wsf, int64_t m,
                                  int64_t n, int64_t k);
// bf16 [rows, k] -> f64 (exact).
std::vector<double> bf16_decode(const uint16_t* x, int64_t rows, int64_t k);
// The accumulator [m, N] of a fused call: w8a16_acc when a.x_bf16 is set,
// else mxfp8_acc (host pointers).
std::vector<float> fused_acc(const m3qkv_fused_args& a);

// ------------------------------------------------------------- epilogue
// The complete epilogue of docs/contract.md §3 on an f32 accumulator acc [m, N]
// (row-major, N = (nq + 2nkv + niq + nik)·128), with the layouts of §4 and the
// guards of §6, writing q_out / q_fp8_out / index_q_out / kv_cache / v_cache /
// index_cache at the host pointers of `a` in the formats a.kv_cache_dtype /
// a.index_cache_dtype select (the GEMM operand fields and a.error_flags are
// not used). Guards: slot < 0 -> skipped silently;
// slot >= num_blocks·block_size -> not written, *flags |= M3QKV_FLAG_SLOT_OUT_OF_RANGE
// (index: M3QKV_FLAG_INDEX_SLOT_OUT_OF_RANGE); position outside
// [0, max_position) -> clamped into it for the cos/sin read,
// *flags |= M3QKV_FLAG_POSITION_OUT_OF_RANGE. `flags` may be null.
// Two tokens that name the same slot: which one lands is unspecified (as on
// the GPU). Bytes of the caches other than the written tokens are not touched.
void epilogue(const m3qkv_fused_args& a, const float* acc, uint32_t* flags);
// fused_acc (MXFP8 or bf16 activations) + epilogue.
void fused_qkv(const m3qkv_fused_args& a, uint32_t* flags);
// The epilogue on float(bf16 a.qkv).
void insert(const m3qkv_insert_args& a, uint32_t* flags);
// out = bf16_rn(acc) (m3qkv_mxfp8_gemm; acc of a.x_bf16 when set, else of xq / xsf).
void gemm_bf16(const m3qkv_gemm_args& a);

// ------------------------------------------------- per-head pieces (tests)
// RMSNorm (docs/contract.md §3.1) then RoPE (§3.2) of one head row. cs_row = the 64 bf16
// of cos_sin_cache[pos]; nullptr skips RoPE.
void head_rms(const float x[128], const uint16_t w_bf16[128], float eps, float y[128]);
void head_rope(float y[128], const uint16_t* cs_row);
void head_rms_rope(const float x[128], const uint16_t w_bf16[128], float eps, const uint16_t* cs_row, float y[128]);
// FP8 / BF16 cache rows (docs/contract.md §4.3): out[c] = e4m3_satfinite_rn(v[c] · sf)
// (has_sf; K with RN(1/k_scale), V with RN(1/v_scale)) or e4m3_satfinite_rn(v[c])
// with no multiply at all (index_k, unit scale); bf16_rn(v[c]).
void fp8_head(const float v[128], bool has_sf, float sf, uint8_t out[128]);
void bf16_head(const float v[128], uint16_t out[128]);
// NVFP4 quantization of one head row (docs/contract.md §3.5): data[64] (element 2i in the
// low nibble of byte i) and scales[8] (group order g = 0..7, before any cache
// swizzle). has_sf = false for index_k; sf = RN(1/k_scale) or RN(1/v_scale).
void nvfp4_quant_head(const float y[128], bool has_sf, float sf, uint8_t data[64], uint8_t scales[8]);

// -------------------------------------------------------------- decoders
// One token of one NVFP4 cache slot -> f32[128].
//   cache: base of the cache, page_stride: bytes between pages, slot: the
//   slot id (page = slot / block_size, token = slot % block_size),
//   slot_in_page: 2h for K of KV head h, 2h+1 for V, 0 for index_k;
//   v_swizzle: true for V (4-token swizzled scales), false for K / index_k.
// decoded = f32( e2m1(code) · float(e4m3 scale byte) / sf ), where sf is the
// quantizer's factor: RN(1/k_scale) for K, RN(1/v_scale) for V, and 1 for
// index_k (then decoded = e2m1 · s exactly). e2m1·s is exact in f32, so the
// only rounding is the final division.
void decode_nvfp4_token(const uint8_t* cache, int64_t page_stride, int block_size, int slot_in_page, int64_t slot,
                        bool v_swizzle, float sf, float out[128]);
// Raw fields of one token: the 128 codes (4-bit) and 8 scale bytes.
void read_nvfp4_token(const uint8_t* cache, int64_t page_stride, int block_size, int slot_in_page, int64_t slot,
                      bool v_swizzle, uint8_t codes[128], uint8_t scales[8]);
// One token of a flat (FP8 / BF16) cache: the 128 elements of K or V of KV
// head `head` (base = kv_cache or v_cache; strides in bytes), or of index_k
// (head_stride and token_stride ignored: packed rows), decoded exactly
// (e4m3 or bf16 -> f32; no division by the scale).
void decode_flat_kv_token(const uint8_t* base, int32_t dtype, int64_t page_stride, int64_t token_stride,
                          int64_t head_stride, int block_size, int head, int64_t slot, float out[128]);
void decode_flat_index_token(const uint8_t* base, int32_t dtype, int64_t page_stride, int block_size, int64_t slot,
                             float out[128]);
// e4m3 bytes -> f32 (exact), n values.
void decode_e4m3(const uint8_t* in, int64_t n, float* out);

// Clamped position used for the RoPE read (docs/contract.md §5.3).
int64_t clamp_position(int64_t pos, int64_t max_position);

}  // namespace golden
}  // namespace m3qkv
