/*
 * m3qkv — MiniMax-M3 attention pre-processing in one kernel.
 *
 *   [q | k | v | index_q | index_k] = x · Wᵀ        (MXFP8 GEMM, f32 accumulator)
 *   q, k, index_q, index_k: Gemma RMSNorm + partial NeoX RoPE (64 of 128 columns)
 *   q -> bf16 and/or e4m3; index_q -> e4m3; k, v, index_k -> paged caches in
 *   NVFP4 (the default), FP8 E4M3 or BF16 (kv_cache_dtype, index_cache_dtype).
 *
 * Public C API (C99). Every entry point validates all of its arguments before
 * anything is launched and returns a status; m3qkv_last_error() gives a
 * thread-local message naming the offending argument and its value. Nothing
 * aborts, asserts or throws across this boundary.
 *
 * Conventions used in the field documentation below:
 *   M  tokens (rows of x),          K  hidden size (K % 128 == 0),
 *   D  = 128 head dim,              N  = (nq + 2·nkv + niq + nik) · 128,
 *   "device" = a CUDA device pointer, "host" = a value passed by value.
 * All tensors are contiguous row-major unless a stride is given.
 *
 * Buffers: no buffer a call writes (kv_cache, index_cache, q_out, q_fp8_out,
 * index_q_out, error_flags, out, xq/xsf of the quantizer) may share a byte
 * with another buffer of the call, each taken as the bytes the call touches
 * (a paged cache: the packed part of each of its pages); inputs may alias
 * each other, and two caches may interleave page by page (e.g. the index
 * pages in the padding of the KV pages). A violation is
 * M3QKV_ERROR_INVALID_ARGUMENT naming both buffers.
 *
 * Contexts, streams, threads: a call runs on the device and in the CUDA
 * context of its stream (the current context for NULL, cudaStreamLegacy and
 * cudaStreamPerThread), also when that is not the caller's current context;
 * the caller's current context and device are the same after the call. Every
 * entry point may be called from any number of threads at once; one-time
 * setup is per context, so calls after cudaDeviceReset() or in a context of
 * cuCtxCreate work. See docs/contract.md §6.
 *
 * Checked mode: with M3QKV_CHECKED=1 in the environment (read once, at the
 * first call), every call also checks that each pointer is device memory of
 * the call's device and that each buffer, as the call touches it, lies inside
 * its allocation (M3QKV_ERROR_INVALID_ARGUMENT naming the buffer otherwise).
 * It costs a driver query per buffer, so it is off by default.
 */
#ifndef M3QKV_M3QKV_H_
#define M3QKV_M3QKV_H_

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#if defined(_WIN32)
#define M3QKV_API
#else
#define M3QKV_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define M3QKV_VERSION_MAJOR 0
#define M3QKV_VERSION_MINOR 1
#define M3QKV_VERSION_PATCH 0

/* Head dimension and NVFP4 cache geometry (docs/contract.md §4.2). */
#define M3QKV_HEAD_DIM 128
#define M3QKV_NVFP4_SLOT_BYTES_PER_TOKEN 72 /* 64 data bytes + 8 scale bytes */

typedef enum m3qkv_status {
  M3QKV_SUCCESS = 0,
  /* An argument has a value outside its documented domain (e.g. eps <= 0,
     a scale whose reciprocal is not a normal float, cta_group = 3,
     use_pdl = 7, overlapping buffers; in checked mode a pointer that is not
     device memory of the call's device or a buffer larger than its allocation). */
  M3QKV_ERROR_INVALID_ARGUMENT = 1,
  /* A pointer is not aligned as its field documents (page strides that are
     not multiples of 32 are M3QKV_ERROR_INVALID_SHAPE). */
  M3QKV_ERROR_MISALIGNED = 2,
  /* No backend for this device (compute capability < 8.0, or the library was
     built without a target for it). */
  M3QKV_ERROR_UNSUPPORTED_DEVICE = 3,
  /* A CUDA runtime or driver call failed; the message carries its name. */
  M3QKV_ERROR_CUDA_ERROR = 4,
  /* A required pointer (args, an input or an output) is NULL. */
  M3QKV_ERROR_NULL_POINTER = 5,
  /* args->struct_size is not the sizeof of a released version of the struct. */
  M3QKV_ERROR_STRUCT_SIZE = 6,
  /* A shape, head-count or stride rule of docs/contract.md §2.1 / §4 fails
     (K % 128, nq % nkv, niq ∈ {0, nkv}, nik ∈ {0, 1}, block_size % 4, page
     strides, sizes). */
  M3QKV_ERROR_INVALID_SHAPE = 7,
  /* A size computation would overflow 64-bit arithmetic or a kernel limit. */
  M3QKV_ERROR_TOO_LARGE = 8,
  /* A bug in m3qkv (should never be returned). */
  M3QKV_ERROR_INTERNAL = 9,
  /* m3qkv_selftest, or m3qkv_warmup in self-test mode: a kernel wrote wrong
     bytes (or could not run) on the built-in problems; the report and
     m3qkv_last_error() name the kernel and its first wrong byte. */
  M3QKV_ERROR_SELFTEST_FAILED = 10,
  /* Not an error. m3qkv_warmup in self-test mode (M3QKV_SELFTEST_ON_WARMUP=1)
     found that the automatic backend of the device failed its self-test and
     switched m3qkv_fused_qkv on that device to the next backend that passed
     (slower, correct output); m3qkv_last_error() says which and why, and
     m3qkv_backend() reports the backend now in use. */
  M3QKV_WARNING_BACKEND_FALLBACK = 11
} m3qkv_status;

typedef enum m3qkv_backend_kind {
  M3QKV_BACKEND_NONE = 0,     /* no GPU backend for this device */
  M3QKV_BACKEND_PORTABLE = 1, /* CC >= 8.0: mma.sync kernels, unfused-capable */
  M3QKV_BACKEND_SM90 = 2,     /* CC 9.0: TMA + wgmma fused kernel */
  M3QKV_BACKEND_SM100 = 3     /* CC 10.x: tcgen05 fused kernel */
} m3qkv_backend_kind;

/*
 * Backend choice of m3qkv_fused_qkv (the unfused ops always run the portable
 * kernels). In order:
 *   1. m3qkv_set_backend(device, kind), or the fallback of m3qkv_warmup in
 *      self-test mode (M3QKV_WARNING_BACKEND_FALLBACK);
 *   2. the environment variable M3QKV_BACKEND = auto | portable | sm90 | sm100
 *      (read once, at the first call that needs it; unset or "" = auto);
 *   3. automatic: CC 10.x -> sm100 (when built with 100f), CC 9.0 -> sm90,
 *      any other CC >= 8.0 -> portable.
 * An explicit choice is never replaced silently: an unknown M3QKV_BACKEND
 * value makes every m3qkv_fused_qkv, m3qkv_backend and m3qkv_warmup call fail
 * with M3QKV_ERROR_INVALID_ARGUMENT, and a backend that this library lacks or
 * that cannot run on the call's device with M3QKV_ERROR_UNSUPPORTED_DEVICE,
 * each with a message naming the setting.
 */

/* Bits set (atomicOr) in *error_flags by the device-side guards (docs/contract.md §5.3). */
#define M3QKV_FLAG_SLOT_OUT_OF_RANGE 0x1u       /* slot_mapping[t] >= num_blocks·block_size: not written */
#define M3QKV_FLAG_INDEX_SLOT_OUT_OF_RANGE 0x2u /* index_slot_mapping[t] >= num_index_blocks·block_size */
#define M3QKV_FLAG_POSITION_OUT_OF_RANGE 0x4u   /* positions[t] outside [0, max_position): clamped for the read */

/*
 * Cache formats (kv_cache_dtype, index_cache_dtype; docs/contract.md §4.2,
 * §4.3). Zero is the default, so a zero-initialized struct keeps the NVFP4
 * caches.
 *   NVFP4: the paged layout of docs/contract.md §4.2 (64 e2m1 data bytes + 8
 *          e4m3 scale bytes per token and head; K and V of a head in slots
 *          2h / 2h+1 of a page).
 *   FP8:   one e4m3 byte per element, e4m3_satfinite_rn(value · RN(1/scale))
 *          with k_scale for K (normed + roped) and v_scale for V (raw), the rule
 *          of q_fp8_out; index_k: e4m3_satfinite_rn(y), unit scale.
 *   BF16:  one bf16 per element, bf16_rn(value); k_scale / v_scale are not used.
 * FP8 / BF16 KV element (page p, token t, KV head h, column c) lives at
 *   kv_cache + p·kv_page_stride + t·kv_token_stride + h·kv_head_stride + c·e
 * for K and at the same offset from v_cache for V (e = 1 or 2 bytes), so the
 * vLLM flash layout [num_blocks, block_size, nkv, 128] (two tensors, or one
 * [num_blocks, 2, block_size, nkv, 128] allocation) is expressed by strides.
 * FP8 / BF16 index_k token t of page p: index_cache + p·index_page_stride + t·128·e.
 */
typedef enum m3qkv_cache_dtype {
  M3QKV_CACHE_NVFP4 = 0,
  M3QKV_CACHE_FP8 = 1,
  M3QKV_CACHE_BF16 = 2
} m3qkv_cache_dtype;

/*
 * Arguments of m3qkv_fused_qkv: the fused projection + epilogue.
 * Start with `size_t struct_size = sizeof(m3qkv_fused_args)`; zero-initialize
 * the rest before filling it (memset or `= {0}`). Fields are only ever added
 * at the end of a struct, with 0 as their default: this library accepts the
 * struct_size of every released version of a struct (the first, m3qkv 0.1,
 * up to this header's sizeof) and reads the fields past the caller's
 * struct_size as 0. Any other struct_size is M3QKV_ERROR_STRUCT_SIZE.
 */
typedef struct m3qkv_fused_args {
  size_t struct_size; /* = sizeof(m3qkv_fused_args) */

  /* ---- shapes (host) ---- */
  int64_t m;   /* tokens, >= 0; 0 is a no-op */
  int64_t k;   /* hidden size, > 0, multiple of 128 (MiniMax-M3: 6144) */
  int32_t nq;  /* query heads, >= 1, multiple of nkv */
  int32_t nkv; /* KV heads, >= 1 */
  int32_t niq; /* index-query heads: 0 or nkv */
  int32_t nik; /* index-key heads: 0 or 1 */

  /* ---- GEMM operands (device) ---- */
  const void* xq;  /* e4m3 [M, K], 16-B aligned (NULL with x_bf16, at the end) */
  const void* xsf; /* e8m0 bytes, F8_128x4 swizzle of [M, K/32], ceil(M/128)·128 · ceil(K/128)·4 bytes, 16-B aligned (NULL with x_bf16) */
  const void* wq;  /* e4m3 [N, K] K-major, rows [q×nq | k×nkv | v×nkv | index_q×niq | index_k×nik]·128, 16-B aligned */
  const void* wsf; /* e8m0 bytes, F8_128x4 swizzle of [N, K/32], 16-B aligned */

  /* ---- epilogue inputs (device unless noted) ---- */
  const int64_t* positions;  /* int64 [M] RoPE positions, 8-B aligned */
  int64_t max_position;      /* host: rows of cos_sin_cache, >= 1 */
  const void* cos_sin_cache; /* bf16 [max_position, 64], row = [cos 0..31 | sin 0..31], 16-B aligned */
  const void* q_norm_weight;       /* bf16 [128], Gemma scale (1 + w), 16-B aligned */
  const void* k_norm_weight;       /* bf16 [128], 16-B aligned */
  const void* index_q_norm_weight; /* bf16 [128], required when niq > 0 */
  const void* index_k_norm_weight; /* bf16 [128], required when nik > 0 */
  float eps;                       /* host: RMSNorm epsilon, finite, > 0 (M3: 1e-6); 0 would turn an all-zero head row into NaN */

  const int64_t* slot_mapping;       /* int64 [M]: KV slot per token, < 0 = skip, 8-B aligned */
  const int64_t* index_slot_mapping; /* int64 [M]: index-cache slot, < 0 = skip; required when nik > 0 */

  /* KV cache, 16-B aligned. NVFP4: uint8 pages [num_blocks][2·nkv][block_size][72].
     FP8 / BF16: the K elements (layout at m3qkv_cache_dtype; V from v_cache). */
  void* kv_cache;
  /* host: bytes between pages. NVFP4: % 32 == 0, >= 2·nkv·block_size·72.
     FP8 / BF16: % 16 == 0, and the K elements of all pages pairwise disjoint
     (see kv_token_stride). */
  int64_t kv_page_stride;
  int64_t num_blocks;     /* host: pages in kv_cache (and v_cache), >= 1 */
  /* index_k cache, required when nik > 0, 16-B aligned. NVFP4: uint8 pages
     [num_index_blocks][block_size][72]. FP8 / BF16: pages of block_size tokens of 128 elements. */
  void* index_cache;
  /* host, when nik > 0: NVFP4 % 32 == 0, >= block_size·72; FP8 / BF16 % 16 == 0, >= block_size·128·e */
  int64_t index_page_stride;
  int64_t num_index_blocks;  /* host: >= 1 when nik > 0 */
  int32_t block_size;        /* host: tokens per page, > 0, % 4 == 0 (M3: 128) */

  /* ---- outputs (device; at least one of q_out / q_fp8_out) ---- */
  void* q_out;       /* bf16 [M, nq·128] or NULL, 16-B aligned */
  void* q_fp8_out;   /* e4m3 [M, nq·128] or NULL, 16-B aligned */
  void* index_q_out; /* e4m3 [M, niq·128], required when niq > 0, 16-B aligned */

  /* ---- dequantization scales (host): finite, > 0, and RN(1/scale) a finite
     normal float (about 2.9e-39 <= scale <= 8.5e37): the kernels multiply by
     the reciprocal, which would otherwise saturate or zero every value ---- */
  float q_fp8_scale; /* q_fp8_out = e4m3(y / q_fp8_scale); checked only when q_fp8_out != NULL */
  float k_scale;     /* NVFP4 / FP8 K cache: value · RN(1/k_scale) is quantized; not used (nor checked) for BF16 */
  float v_scale;     /* V cache likewise */

  /* ---- launch options (host) ---- */
  int32_t cta_group; /* SM100 only: 0 = auto, 1 or 2; other backends accept 0, 1, 2 and ignore it */
  int32_t use_pdl;   /* 0 or 1: programmatic dependent launch attribute */
  int32_t grid;      /* persistent grid size, 0 = auto, else >= 1 */
  uint32_t* error_flags; /* device, optional: M3QKV_FLAG_* bits are OR-ed in; 4-B aligned */

  /* ---- cache formats (appended in 0.2; all zero = the NVFP4 caches above) ---- */
  int32_t kv_cache_dtype;    /* host: m3qkv_cache_dtype of kv_cache (and v_cache): 0 NVFP4, 1 FP8, 2 BF16 */
  int32_t index_cache_dtype; /* host: m3qkv_cache_dtype of index_cache (checked when nik > 0) */
  /* FP8 / BF16: the V elements, same strides as K (16-B aligned, required;
     may lie inside kv_cache's allocation, e.g. [num_blocks, 2, block_size, nkv, 128],
     when no V element meets a K element). NVFP4: must be NULL (V is in kv_cache). */
  void* v_cache;
  /* host, FP8 / BF16 only (must be 0 for NVFP4): bytes between the tokens of a
     page and between the KV heads of a token, > 0, % 16 == 0. The K elements
     must be pairwise disjoint: with the four dimensions (column: e bytes × 128,
     head: kv_head_stride × nkv, token: kv_token_stride × block_size, page:
     kv_page_stride × num_blocks) sorted by stride, each stride of a dimension
     of extent > 1 is at least the byte span of the smaller ones (any nesting
     order, e.g. [block_size, nkv, 128] or [nkv, block_size, 128] pages; gaps allowed). */
  int64_t kv_token_stride;
  int64_t kv_head_stride;

  /* ---- bf16 activations (appended in 0.3; NULL = the MXFP8 xq / xsf above) ----
     W8A16: acc[m][n] = Σ_k float(x_bf16[m,k]) · (float(e4m3(wq[n,k])) · 2^(e−127)) in f32,
     the weight's e8m0 scale e from wsf; xq and xsf must then be NULL. Backends:
     portable and sm90; sm100 refuses it (M3QKV_ERROR_INVALID_ARGUMENT). */
  const void* x_bf16;  /* bf16 [M, K] row-major, 16-B aligned; exactly one of x_bf16 and (xq, xsf) given */

  /* ---- batch invariance (appended in 0.3; 0 = off) ----
     1: a token's outputs are bit-identical whatever M, `grid` and the other
     tokens of the call: every accumulator is summed in one K order fixed by K
     alone (sm90: the swap-AB kernel at every M, K not split; portable: always
     so). sm100 refuses it (M3QKV_ERROR_INVALID_ARGUMENT). Costs speed at small M
     (no split-K): bench entry fused_sm90_invariant_fp8. */
  int32_t batch_invariant;

  /* ---- precision (appended in 0.3; 0 = exact) ----
     0: exact (docs/contract.md §3). 1: Hopper's fp8 fast mode (docs/contract.md
     "fp8 fast mode"): wq / wsf must be weights prepared by
     m3qkv_prepare_weights_fp8 (the four 32-K scales of each 128-K group equal);
     the activations are folded the same way per 128 K, each 128-K group runs
     as fp8 MMAs and is added to the f32 accumulator times its two scales.
     The epilogue is unchanged. sm90 only (portable and sm100 refuse it), MXFP8
     activations only (xq / xsf), batch_invariant 0. Small M may run the exact
     kernels on the prepared weights (never slower than exact mode). */
  int32_t precision;
} m3qkv_fused_args;

/*
 * Arguments of m3qkv_qknorm_rope_kv_insert: the epilogue alone, on a bf16
 * projection (the vLLM-style unfused path). Same fields and rules as
 * m3qkv_fused_args minus the GEMM operands, K and cta_group.
 */
typedef struct m3qkv_insert_args {
  size_t struct_size; /* = sizeof(m3qkv_insert_args) (or a released size, see m3qkv_fused_args) */
  int64_t m;
  int32_t nq;
  int32_t nkv;
  int32_t niq;
  int32_t nik;
  const void* qkv; /* bf16 [M, N] row-major, 16-B aligned; the epilogue reads float(bf16) */

  const int64_t* positions;
  int64_t max_position;
  const void* cos_sin_cache;
  const void* q_norm_weight;
  const void* k_norm_weight;
  const void* index_q_norm_weight;
  const void* index_k_norm_weight;
  float eps;
  const int64_t* slot_mapping;
  const int64_t* index_slot_mapping;
  void* kv_cache;
  int64_t kv_page_stride;
  int64_t num_blocks;
  void* index_cache;
  int64_t index_page_stride;
  int64_t num_index_blocks;
  int32_t block_size;
  void* q_out;
  void* q_fp8_out;
  void* index_q_out;
  float q_fp8_scale;
  float k_scale;
  float v_scale;
  int32_t use_pdl;
  int32_t grid; /* 0 = auto */
  uint32_t* error_flags;
  /* cache formats, as in m3qkv_fused_args */
  int32_t kv_cache_dtype;
  int32_t index_cache_dtype;
  void* v_cache;
  int64_t kv_token_stride;
  int64_t kv_head_stride;
} m3qkv_insert_args;

/* Arguments of m3qkv_mxfp8_gemm: out = bf16_rn(acc), acc as in docs/contract.md §3. */
typedef struct m3qkv_gemm_args {
  size_t struct_size; /* = sizeof(m3qkv_gemm_args) (or a released size, see m3qkv_fused_args) */
  int64_t m;          /* >= 0; 0 is a no-op */
  int64_t n;          /* > 0, multiple of 128 */
  int64_t k;          /* > 0, multiple of 128 */
  const void* xq;     /* e4m3 [M, K], 16-B aligned (NULL with x_bf16) */
  const void* xsf;    /* F8_128x4 scales of [M, K/32], 16-B aligned (NULL with x_bf16) */
  const void* wq;     /* e4m3 [N, K], 16-B aligned */
  const void* wsf;    /* F8_128x4 scales of [N, K/32], 16-B aligned */
  void* out;          /* bf16 [M, N], 16-B aligned */
  int32_t use_pdl;    /* 0 or 1 */
  int32_t grid;       /* 0 = auto */
  /* ---- bf16 activations (appended in 0.3; NULL = xq / xsf), as in m3qkv_fused_args ---- */
  const void* x_bf16; /* bf16 [M, K] row-major, 16-B aligned; exactly one of x_bf16 and (xq, xsf) given */
} m3qkv_gemm_args;

/*
 * Arguments of m3qkv_prepare_weights_fp8: the one-time fold of an MXFP8
 * weight for the fp8 fast mode (precision = 1). Per (row, 128-K group) the
 * scale becomes E = the largest of its four block scales and each block's
 * e4m3 values are multiplied by 2^(e - E) and rounded to e4m3 (RN-even): exact
 * unless a value falls below e4m3's normal range. The result is an MXFP8
 * weight of the same layout (wsf_out holds E in all four blocks of a group),
 * so exact mode reads it too. Outputs are the sizes of the inputs
 * (m3qkv_prepare_weights_fp8_sizes) and must not overlap them.
 */
typedef struct m3qkv_fold_stats {
  int64_t changed;       /* weight elements whose value the fold changed */
  double max_rel_change; /* largest ||w' - w|| / ||w|| of a (row, 128-K group): the bound,
                            relative to ||w||·||x||, of the change of that group's dot product */
} m3qkv_fold_stats;

typedef struct m3qkv_prepare_args {
  size_t struct_size; /* = sizeof(m3qkv_prepare_args) */
  int64_t n;          /* rows, > 0, multiple of 128 */
  int64_t k;          /* > 0, multiple of 128 */
  const void* wq;     /* e4m3 [N, K], 16-B aligned */
  const void* wsf;    /* F8_128x4 scales of [N, K/32], 16-B aligned */
  void* wq_out;       /* e4m3 [N, K], 16-B aligned */
  void* wsf_out;      /* F8_128x4 [N, K/32], 16-B aligned */
  /* host, optional: the fold's statistics. When given, the call waits for the
     stream (not allowed while it is capturing: M3QKV_ERROR_INVALID_ARGUMENT). */
  m3qkv_fold_stats* stats;
} m3qkv_prepare_args;

/*
 * Arguments of m3qkv_mxfp8_quantize: bf16 x [M, K] -> e4m3 xq + F8_128x4 xsf
 * with the OCP MX rule: per 32 consecutive values, e = clamp(floor(log2(amax)) - 8,
 * -127, 127) (amax = 0 gives e = -127), scale byte = e + 127,
 * xq = e4m3_satfinite_rn(x / 2^e). Padding bytes of xsf (rows >= M up to the
 * next multiple of 128) are written as 0x7F (scale 1.0).
 */
typedef struct m3qkv_quantize_args {
  size_t struct_size; /* = sizeof(m3qkv_quantize_args) (or a released size, see m3qkv_fused_args) */
  int64_t m;          /* >= 0; 0 is a no-op */
  int64_t k;          /* > 0, multiple of 128 */
  const void* x;      /* bf16 [M, K], 16-B aligned */
  void* xq;           /* e4m3 [M, K], 16-B aligned */
  void* xsf;          /* ceil(M/128)·128 · K/32 bytes, 16-B aligned */
  int32_t use_pdl;    /* 0 or 1 */
} m3qkv_quantize_args;

/*
 * Self-test report (m3qkv_selftest). Start with `size_t struct_size =
 * sizeof(m3qkv_selftest_report)`; the library fills the rest. Versioned like
 * the args structs: fields are only ever appended, a later library writes
 * only the fields of the caller's struct_size, and any other struct_size is
 * M3QKV_ERROR_STRUCT_SIZE (nothing written).
 */
typedef enum m3qkv_selftest_result {
  M3QKV_SELFTEST_NOT_AVAILABLE = 0, /* not run: not compiled in, or the device cannot run it (message says which) */
  M3QKV_SELFTEST_PASS = 1,          /* every byte of every output of every problem equals the golden model's */
  M3QKV_SELFTEST_FAIL = 2,          /* a byte differs: problem / output / offset / expected / got name the first */
  M3QKV_SELFTEST_ERROR = 3          /* the kernel could not run (a launch or CUDA error): message */
} m3qkv_selftest_result;

#define M3QKV_SELFTEST_MAX_ENTRIES 16

/* One kernel of one backend on the built-in problems. */
typedef struct m3qkv_selftest_entry {
  int32_t backend;  /* m3qkv_backend_kind */
  /* Which kernel of the backend: portable 0; sm90 0 = the tile kernel
     (what M > 256 runs), 1 = the decode kernel (M <= 256); sm100: the
     cta_group, 1 or 2. */
  int32_t variant;
  int32_t result;   /* m3qkv_selftest_result */
  int32_t problems; /* problems it ran (the decode kernel takes only M <= 256) */
  int64_t time_us;  /* wall time: uploads, launches, downloads, comparison */
  /* The first wrong byte (result FAIL; otherwise problem = -1, offset = -1,
     expected = got = -1, output = ""). */
  int32_t problem;  /* index into the built-in problems, 0 ... report.problems - 1 */
  /* 1: every output byte equals the portable backend's; 0: some differ;
     -1: not compared (this is portable, or portable did not run). On exact
     data both must equal the golden model, so 0 with result PASS means the
     portable backend failed. */
  int32_t portable_agrees;
  /* Byte offset in `output`; negative or >= its size: a byte of the guard
     zones around it (a write outside the buffer). */
  int64_t offset;
  int64_t wrong_bytes;   /* bytes that differ, over every output of every problem */
  int32_t expected;      /* the golden byte (0 ... 255) */
  int32_t got;           /* the kernel's byte */
  char name[32];         /* "portable", "sm90 tile", "sm90 decode", "sm100 cta_group 1", ... */
  char output[32];       /* "q_out", "q_fp8_out", "index_q_out", "kv_cache", "v_cache", "index_cache", "error_flags" */
  char message[192];     /* why not available, the error, or the first wrong byte in words */
} m3qkv_selftest_entry;

typedef struct m3qkv_selftest_report {
  size_t struct_size;  /* = sizeof(m3qkv_selftest_report), set by the caller */
  int32_t status;      /* m3qkv_status, the value m3qkv_selftest returned */
  int32_t device;
  int32_t cc_major;
  int32_t cc_minor;
  int32_t problems;    /* built-in problems (exact data: TP4, TP8, TP2, dense; M 1 ... 300; every cache format) */
  int32_t num_entries; /* entries[0 ... num_entries - 1]: every kernel this library knows, run or not */
  int64_t total_us;    /* wall time of the whole call, the golden model on the CPU included */
  char message[256];   /* one line: the verdict, or the first failure */
  m3qkv_selftest_entry entries[M3QKV_SELFTEST_MAX_ENTRIES];
} m3qkv_selftest_report;

/* The fused op (docs/contract.md §2-§4). Asynchronous on `stream`. */
M3QKV_API m3qkv_status m3qkv_fused_qkv(const m3qkv_fused_args* args, cudaStream_t stream);
/* RMSNorm + RoPE + q outputs + cache insert (any cache format) on a bf16 projection. */
M3QKV_API m3qkv_status m3qkv_qknorm_rope_kv_insert(const m3qkv_insert_args* args, cudaStream_t stream);
/* MXFP8 GEMM with bf16 output. */
M3QKV_API m3qkv_status m3qkv_mxfp8_gemm(const m3qkv_gemm_args* args, cudaStream_t stream);
/* bf16 -> MXFP8 activation quantizer (OCP MX rule). */
M3QKV_API m3qkv_status m3qkv_mxfp8_quantize(const m3qkv_quantize_args* args, cudaStream_t stream);
/* Folds an MXFP8 weight for precision = 1 (m3qkv_prepare_args), on `stream`. */
M3QKV_API m3qkv_status m3qkv_prepare_weights_fp8(const m3qkv_prepare_args* args, cudaStream_t stream);
/* Bytes of m3qkv_prepare_args' wq_out and wsf_out for an [n, k] weight;
   M3QKV_ERROR_INVALID_SHAPE for shapes the fold does not take. */
M3QKV_API m3qkv_status m3qkv_prepare_weights_fp8_sizes(int64_t n, int64_t k, size_t* wq_bytes, size_t* wsf_bytes);
/*
 * Load modules and set shared-memory attributes for `device` ahead of the
 * first call. Self-test mode (M3QKV_SELFTEST_ON_WARMUP=1 in the environment,
 * read once; "0" or unset = off, any other value = M3QKV_ERROR_INVALID_ARGUMENT):
 * it also runs the self-test (m3qkv_selftest) of the backend m3qkv_fused_qkv
 * would use on the device. Automatic backend passes: M3QKV_SUCCESS. It fails:
 * the next backend in the automatic order that can run there (sm100 -> sm90
 * -> portable) and passes becomes the device's backend, and the call returns
 * M3QKV_WARNING_BACKEND_FALLBACK with the reason in m3qkv_last_error(); none
 * passes: M3QKV_ERROR_SELFTEST_FAILED. A backend chosen explicitly
 * (m3qkv_set_backend, M3QKV_BACKEND) that fails is M3QKV_ERROR_SELFTEST_FAILED
 * and stays chosen: no explicit choice is replaced. Each such warmup tests
 * again (an automatic backend that passes again is used again). Costs one
 * self-test of that backend: well under a second.
 */
M3QKV_API m3qkv_status m3qkv_warmup(int device);
/* The backend m3qkv_fused_qkv uses on `device` (see "Backend choice"):
   M3QKV_BACKEND_NONE when the device has none. */
M3QKV_API m3qkv_status m3qkv_backend(int device, m3qkv_backend_kind* out);
/* Static text for a status (never NULL). */
M3QKV_API const char* m3qkv_status_string(m3qkv_status status);
/* Detail of the last failure on this thread ("" when none). */
M3QKV_API const char* m3qkv_last_error(void);
/* Name of a backend kind (never NULL). */
M3QKV_API const char* m3qkv_backend_name(m3qkv_backend_kind kind);

/*
 * Self-test of `device` (run this first on a new kind of GPU): every kernel of
 * every backend this library has for the device (portable; sm90 tile and
 * decode kernels on CC 9.0; sm100 at cta_group 1 and 2 on CC 10.x) runs the
 * built-in exact-data problems (TP4, TP8, TP2 with its odd head count, dense;
 * M from 1 to 300, one and several tiles; NVFP4, FP8 and BF16 caches;
 * out-of-range slots and positions), and every output byte, the bytes around
 * each output and error_flags are compared with the CPU golden model and with
 * the portable backend, whatever the backend choice (M3QKV_BACKEND and
 * m3qkv_set_backend do not change what it tests). Runs synchronously in the
 * device's primary context on a stream of its own, and leaves the caller's
 * current context and device,
 * the CUDA last error and the device's memory as they were: its buffers and
 * the split-K workspace of its stream are freed before it returns (the
 * kernels' code, loaded on first use as by any call, stays). Well under a
 * second on an H200 after the first call of a process.
 * Returns M3QKV_SUCCESS when every kernel that can run passed,
 * M3QKV_ERROR_SELFTEST_FAILED when one failed (the report says which and the
 * first wrong byte; m3qkv_last_error() says the same in words),
 * M3QKV_ERROR_UNSUPPORTED_DEVICE without a usable GPU or backend, else the
 * error that stopped it. report->status is the returned status.
 */
M3QKV_API m3qkv_status m3qkv_selftest(int device, m3qkv_selftest_report* report);

/*
 * Frees the device memory the library holds for `stream` (the split-K and
 * conversion workspace of its calls), for callers that create and destroy
 * streams: call it after the stream's last m3qkv call has completed (e.g.
 * after cudaStreamSynchronize) and before cudaStreamDestroy. The next call on
 * the stream allocates again. Workspaces of graphs captured on the stream are
 * kept (the graphs still use them). Refused with M3QKV_ERROR_INVALID_ARGUMENT,
 * touching nothing, while the stream is capturing. Appended in 0.3.
 */
M3QKV_API m3qkv_status m3qkv_release_stream(cudaStream_t stream);

/*
 * Chooses the backend of m3qkv_fused_qkv on `device` for the rest of the
 * process (calls that start after it returns): M3QKV_BACKEND_PORTABLE, _SM90,
 * _SM100, or M3QKV_BACKEND_NONE to go back to M3QKV_BACKEND / the automatic
 * choice. A backend this library lacks or that cannot run on the device is
 * M3QKV_ERROR_UNSUPPORTED_DEVICE, another value M3QKV_ERROR_INVALID_ARGUMENT;
 * nothing changes then. m3qkv_backend reports the choice.
 */
M3QKV_API m3qkv_status m3qkv_set_backend(int device, m3qkv_backend_kind kind);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* M3QKV_M3QKV_H_ */
