// Complete argument validation for the four entry points (docs/contract.md §2, §5.2, §7.2).
// Nothing here touches the GPU or dereferences a device pointer: every rule is
// a host-side check on scalars and pointer values, so a rejected call never
// launches anything.
//
// Order of the checks, the same for every entry point:
//   1. args != NULL                      -> M3QKV_ERROR_NULL_POINTER
//   2. args->struct_size is the size of a released version of the struct
//      (-> M3QKV_ERROR_STRUCT_SIZE); the caller's bytes are copied into a
//      zeroed struct of this version, so fields past struct_size read as
//      their defaults (0), and everything below reads the copy
//   3. host scalars: shapes and head counts (M3QKV_ERROR_INVALID_SHAPE),
//      size limits / int64 overflow (M3QKV_ERROR_TOO_LARGE), values such as
//      eps, scales and launch options (M3QKV_ERROR_INVALID_ARGUMENT)
//   4. m == 0: valid no-op. We stop here with *noop = true, BEFORE looking at
//      any pointer, so that a caller with an empty batch may pass NULL (or
//      stale) data pointers. The scalar rules of step 3 still apply: a bad
//      K or head count is a bug in the caller even on an empty batch.
//   5. required pointers present (M3QKV_ERROR_NULL_POINTER; "no q output at
//      all" is M3QKV_ERROR_INVALID_ARGUMENT)
//   6. alignment of every pointer a kernel reads or writes with wide accesses
//      (M3QKV_ERROR_MISALIGNED)
//   7. no written buffer overlaps another buffer of the call, each taken as
//      the bytes the call touches (api/extents.h; M3QKV_ERROR_INVALID_ARGUMENT)
// Fields that an operation does not use (index_* when niq/nik are 0) are not
// checked at all.
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "common/layouts.h"
#include "common/numerics.h"
#include "api/extents.h"
#include "host/status.h"
#include "api/validate.h"

namespace m3qkv {
namespace {

constexpr int64_t kSlotBytesPerToken = M3QKV_NVFP4_SLOT_BYTES_PER_TOKEN;
// K is consumed in 128-wide k-blocks (4 MX scale columns = one F8_128x4 column tile).
constexpr int64_t kKMultiple = 128;
// The GEMM N dimension is tiled by heads of 128 rows.
constexpr int64_t kNMultiple = kHeadDim;
// The V scale swizzle groups tokens by 4 (docs/contract.md §4.2).
constexpr int64_t kBlockSizeMultiple = 4;
// Pages are addressed with 32-byte aligned vector/TMA accesses (docs/contract.md §4.2).
constexpr int64_t kPageStrideMultiple = 32;
// Kernel limits: token rows and columns are indexed with 32-bit integers in
// the kernels (grid coordinates, tile indices), K with 32-bit k-block counters.
constexpr int64_t kMaxM = int64_t{1} << 31;  // m < 2^31
constexpr int64_t kMaxK = int64_t{1} << 20;  // k <= 2^20
constexpr int64_t kMaxN = int64_t{1} << 24;  // N <= 2^24 (131072 heads)
constexpr int64_t kScaleRowTile = 128;       // F8_128x4 pads rows to 128
static_assert(kKMultiple % (kMxBlock * 4) == 0, "K multiple must cover whole F8_128x4 column tiles");
static_assert((kBlockSizeMultiple * kSlotBytesPerToken) % kPageStrideMultiple == 0,
              "a packed page of any valid block_size is a multiple of the page stride alignment");

constexpr size_t kWideAlign = 16;  // 16-byte vector / TMA accesses
constexpr size_t kI64Align = 8;    // int64 positions and slot mappings
constexpr size_t kFlagAlign = 4;   // uint32 error flags (atomicOr)
// The kernels store whole output / cache rows with 16-byte vector stores
// (common/layouts.h kRowStoreAlign): every row start must be 16-B aligned,
// i.e. every base pointer and every stride between rows (the NVFP4 slot
// size block_size·72 included) a multiple of it.
static_assert(kWideAlign % kRowStoreAlign == 0, "16-B aligned output and cache bases");
static_assert(kPageStrideMultiple % kRowStoreAlign == 0, "NVFP4 page strides keep rows 16-B aligned");
static_assert((kBlockSizeMultiple * kSlotBytesPerToken) % kRowStoreAlign == 0,
              "NVFP4 slots (block_size·72 bytes) keep rows 16-B aligned");

using ll = long long;

// The entry point a message is about ("m3qkv_fused_qkv: ...").
struct Ctx {
  const char* fn;
};

// ---------------------------------------------------------------------------
// Small rule helpers shared by all four structs. Each returns SUCCESS or a
// status with a message naming the function, the argument and its value.
// ---------------------------------------------------------------------------

// sizeof of each struct in each release: the end of its last field of that
// release, rounded up to the struct's alignment. Fields are only ever
// appended, so these stay valid when later versions grow the structs.
template <class A>
constexpr size_t released_size(size_t end_of_last_field) {
  return (end_of_last_field + alignof(A) - 1) / alignof(A) * alignof(A);
}
// 0.1: the first release.
constexpr size_t kFusedArgsSizeV1 =
    released_size<m3qkv_fused_args>(offsetof(m3qkv_fused_args, error_flags) + sizeof(uint32_t*));
constexpr size_t kInsertArgsSizeV1 =
    released_size<m3qkv_insert_args>(offsetof(m3qkv_insert_args, error_flags) + sizeof(uint32_t*));
constexpr size_t kGemmArgsSizeV1 = released_size<m3qkv_gemm_args>(offsetof(m3qkv_gemm_args, grid) + sizeof(int32_t));
constexpr size_t kQuantizeArgsSizeV1 =
    released_size<m3qkv_quantize_args>(offsetof(m3qkv_quantize_args, use_pdl) + sizeof(int32_t));
// 0.2: the cache formats (kv_cache_dtype ... kv_head_stride) appended to the
// fused and insert structs; gemm and quantize unchanged.
constexpr size_t kFusedArgsSizeV2 =
    released_size<m3qkv_fused_args>(offsetof(m3qkv_fused_args, kv_head_stride) + sizeof(int64_t));
constexpr size_t kInsertArgsSizeV2 =
    released_size<m3qkv_insert_args>(offsetof(m3qkv_insert_args, kv_head_stride) + sizeof(int64_t));
constexpr size_t kGemmArgsSizeV2 = kGemmArgsSizeV1;
constexpr size_t kQuantizeArgsSizeV2 = kQuantizeArgsSizeV1;
// 0.3 (this header): x_bf16 appended to the fused and gemm structs,
// batch_invariant to the fused one; their sizeof. The insert and quantize structs are unchanged since 0.2 / 0.1.
// The released sizes on LP64 (what binaries built against each release pass).
static_assert(sizeof(void*) != 8 || (kFusedArgsSizeV1 == 264 && kInsertArgsSizeV1 == 232 &&
                                     kGemmArgsSizeV1 == 80 && kQuantizeArgsSizeV1 == 56),
              "a field of a released struct moved");
static_assert(sizeof(void*) != 8 || (kFusedArgsSizeV2 == 296 && kInsertArgsSizeV2 == 264),
              "a field of a released struct moved");
static_assert(sizeof(void*) != 8 || (sizeof(m3qkv_fused_args) == 312 && sizeof(m3qkv_gemm_args) == 88 &&
                                     sizeof(m3qkv_insert_args) == 264 && sizeof(m3qkv_quantize_args) == 56),
              "the 0.3 sizes (x_bf16 appended to the fused and gemm structs, batch_invariant to the fused one)");

// The sizes of A in 0.1, 0.2 and this version, in that order.
template <class A>
struct Released {
  size_t size[3];
};
template <class A>
constexpr Released<A> released_sizes();
template <>
constexpr Released<m3qkv_fused_args> released_sizes<m3qkv_fused_args>() { return {{kFusedArgsSizeV1, kFusedArgsSizeV2, sizeof(m3qkv_fused_args)}}; }
template <>
constexpr Released<m3qkv_insert_args> released_sizes<m3qkv_insert_args>() {
  return {{kInsertArgsSizeV1, kInsertArgsSizeV2, sizeof(m3qkv_insert_args)}};
}
template <>
constexpr Released<m3qkv_gemm_args> released_sizes<m3qkv_gemm_args>() { return {{kGemmArgsSizeV1, kGemmArgsSizeV2, sizeof(m3qkv_gemm_args)}}; }
template <>
constexpr Released<m3qkv_quantize_args> released_sizes<m3qkv_quantize_args>() {
  return {{kQuantizeArgsSizeV1, kQuantizeArgsSizeV2, sizeof(m3qkv_quantize_args)}};
}
template <>  // new in 0.3
constexpr Released<m3qkv_prepare_args> released_sizes<m3qkv_prepare_args>() {
  return {{sizeof(m3qkv_prepare_args), sizeof(m3qkv_prepare_args), sizeof(m3qkv_prepare_args)}};
}

// struct_size must be a released size (0.1's, 0.2's or this header's
// sizeof). A size in between would cut a field in half.
template <class A>
m3qkv_status check_struct_size(Ctx c, size_t got, const char* type) {
  constexpr Released<A> r = released_sizes<A>();
  static const char* const kRelease[3] = {"m3qkv 0.1", "m3qkv 0.2", "this version"};
  for (size_t s : r.size)
    if (got == s) return M3QKV_SUCCESS;
  if (r.size[0] == sizeof(A)) {
    return fail(M3QKV_ERROR_STRUCT_SIZE, "%s: struct_size = %zu is not sizeof(%s) = %zu", c.fn, got, type,
                sizeof(A));
  }
  // "264 (m3qkv 0.1), 296 (m3qkv 0.2) or 304 (this version)": each size once,
  // named by the first release that has it (and "this version" when it is
  // this header's sizeof too).
  size_t uniq[3];
  int first[3], n = 0;
  for (int i = 0; i < 3; ++i) {
    bool seen = false;
    for (int j = 0; j < n; ++j) seen = seen || uniq[j] == r.size[i];
    if (!seen) uniq[n] = r.size[i], first[n++] = i;
  }
  char list[192];
  int pos = 0;
  for (int j = 0; j < n; ++j) {
    const bool also_this = first[j] != 2 && uniq[j] == sizeof(A);
    pos += std::snprintf(list + pos, sizeof(list) - static_cast<size_t>(pos), "%s%zu (%s%s)",
                         j == 0 ? "" : (j == n - 1 ? " or " : ", "), uniq[j], kRelease[first[j]],
                         also_this ? ", this version" : "");
  }
  return fail(M3QKV_ERROR_STRUCT_SIZE, "%s: struct_size = %zu is not the size of a released %s: %s", c.fn, got, type,
              list);
}

m3qkv_status positive(Ctx c, const char* name, int64_t v) {
  if (v > 0) return M3QKV_SUCCESS;
  return fail(M3QKV_ERROR_INVALID_SHAPE, "%s: %s = %lld must be > 0", c.fn, name, static_cast<ll>(v));
}

m3qkv_status at_least(Ctx c, const char* name, int64_t v, int64_t lo) {
  if (v >= lo) return M3QKV_SUCCESS;
  return fail(M3QKV_ERROR_INVALID_SHAPE, "%s: %s = %lld must be >= %lld", c.fn, name, static_cast<ll>(v),
              static_cast<ll>(lo));
}

m3qkv_status multiple_of(Ctx c, const char* name, int64_t v, int64_t mult) {
  if (v % mult == 0) return M3QKV_SUCCESS;
  return fail(M3QKV_ERROR_INVALID_SHAPE, "%s: %s = %lld is not a multiple of %lld", c.fn, name, static_cast<ll>(v),
              static_cast<ll>(mult));
}

// Kernel limit: v < limit (exclusive) or v <= limit (inclusive).
m3qkv_status within_limit(Ctx c, const char* name, int64_t v, int64_t limit, bool inclusive) {
  if (inclusive ? v <= limit : v < limit) return M3QKV_SUCCESS;
  return fail(M3QKV_ERROR_TOO_LARGE, "%s: %s = %lld exceeds the kernel limit (must be %s %lld)", c.fn, name,
              static_cast<ll>(v), inclusive ? "<=" : "<", static_cast<ll>(limit));
}

// *out = product of non-negative factors, or TOO_LARGE when it overflows int64.
// `what` spells the product, e.g. "num_blocks·kv_page_stride".
m3qkv_status product(Ctx c, const char* what, std::initializer_list<int64_t> factors, int64_t* out) {
  int64_t p = 1;
  for (int64_t f : factors) {
    if (__builtin_mul_overflow(p, f, &p)) {
      char buf[160];
      int pos = 0;
      for (int64_t g : factors) {
        pos += std::snprintf(buf + pos, sizeof(buf) - static_cast<size_t>(pos), "%s%lld", pos ? " * " : "",
                             static_cast<ll>(g));
        if (pos >= static_cast<int>(sizeof(buf))) break;
      }
      return fail(M3QKV_ERROR_TOO_LARGE, "%s: %s = %s overflows int64", c.fn, what, buf);
    }
  }
  *out = p;
  return M3QKV_SUCCESS;
}

// eps > 0: with eps = 0 an all-zero head row gives t = 0, rsqrt(0) = inf
// and 0·inf = NaN in every output of the row.
m3qkv_status check_eps(Ctx c, float eps) {
  if (std::isfinite(eps) && eps > 0.0f) return M3QKV_SUCCESS;
  return fail(M3QKV_ERROR_INVALID_ARGUMENT,
              "%s: eps = %.9g must be finite and > 0 (with eps <= 0 an all-zero head row gives rsqrt(0) = inf and "
              "NaN outputs)",
              c.fn, static_cast<double>(eps));
}

// A dequantization scale: finite, > 0, and its f32 reciprocal RN(1/scale),
// which the kernels multiply by (docs/contract.md §3.3, §3.5), a finite normal number:
// about 2.9e-39 <= scale <= 8.5e37. Outside, the reciprocal is inf (every
// value saturates) or subnormal (every value rounds to zero).
m3qkv_status check_scale(Ctx c, const char* name, float v) {
  if (!(std::isfinite(v) && v > 0.0f)) {
    return fail(M3QKV_ERROR_INVALID_ARGUMENT, "%s: %s = %.9g must be finite and > 0", c.fn, name,
                static_cast<double>(v));
  }
  const float r = rcp_rn(v);
  if (std::isnormal(r)) return M3QKV_SUCCESS;
  return fail(M3QKV_ERROR_INVALID_ARGUMENT,
              "%s: %s = %.9g: its reciprocal RN(1/%s) = %.9g is not a finite normal f32 (the kernels multiply by it)",
              c.fn, name, static_cast<double>(v), name, static_cast<double>(r));
}

// v in [lo, hi]; `domain` spells the allowed values for the message.
m3qkv_status in_range(Ctx c, const char* name, int64_t v, int64_t lo, int64_t hi, const char* domain) {
  if (v >= lo && v <= hi) return M3QKV_SUCCESS;
  return fail(M3QKV_ERROR_INVALID_ARGUMENT, "%s: %s = %lld must be %s", c.fn, name, static_cast<ll>(v), domain);
}

m3qkv_status non_null(Ctx c, const char* name, const void* p) {
  if (p != nullptr) return M3QKV_SUCCESS;
  return fail(M3QKV_ERROR_NULL_POINTER, "%s: %s = NULL, but it is required", c.fn, name);
}

// NULL passes (presence is checked separately).
m3qkv_status aligned(Ctx c, const char* name, const void* p, size_t align) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  if (v % align == 0) return M3QKV_SUCCESS;
  return fail(M3QKV_ERROR_MISALIGNED, "%s: %s = 0x%llx is not %zu-byte aligned", c.fn, name,
              static_cast<unsigned long long>(v), align);
}

// ---------------------------------------------------------------------------
// Field groups shared between structs, as views, so each rule is written once.
// ---------------------------------------------------------------------------

// m and k, shared by fused, gemm and quantize.
m3qkv_status check_m(Ctx c, int64_t m) {
  M3QKV_TRY(at_least(c, "m", m, 0));
  return within_limit(c, "m", m, kMaxM, /*inclusive=*/false);
}

m3qkv_status check_k(Ctx c, int64_t k) {
  M3QKV_TRY(positive(c, "k", k));
  M3QKV_TRY(multiple_of(c, "k", k, kKMultiple));
  return within_limit(c, "k", k, kMaxK, /*inclusive=*/true);
}

m3qkv_status check_use_pdl(Ctx c, int32_t use_pdl) { return in_range(c, "use_pdl", use_pdl, 0, 1, "0 or 1"); }

m3qkv_status check_grid(Ctx c, int32_t grid) {
  return in_range(c, "grid", grid, 0, INT32_MAX, ">= 0 (0 = auto)");
}

// The operands of an [M, K] x [N, K]^T GEMM (fused and gemm): the MXFP8
// weight and either the MXFP8 activations (xq, xsf) or bf16 ones (x_bf16).
struct GemmOperands {
  int64_t m, n, k;
  const void *xq, *xsf, *wq, *wsf;
  const void* x_bf16;
};

// Byte extents of the operands fit int64 (m, n, k are already bounded, this
// keeps the rule explicit rather than implied by the bounds).
m3qkv_status check_gemm_sizes(Ctx c, const GemmOperands& g) {
  int64_t bytes = 0;
  const int64_t m_pad = (g.m + kScaleRowTile - 1) / kScaleRowTile * kScaleRowTile;
  const int64_t n_pad = (g.n + kScaleRowTile - 1) / kScaleRowTile * kScaleRowTile;
  M3QKV_TRY(product(c, "m*k (xq bytes)", {g.m, g.k}, &bytes));
  M3QKV_TRY(product(c, "m*k*2 (x_bf16 bytes)", {g.m, g.k, 2}, &bytes));
  M3QKV_TRY(product(c, "m*n*4 (output / accumulator bytes)", {g.m, g.n, 4}, &bytes));
  M3QKV_TRY(product(c, "n*k (wq bytes)", {g.n, g.k}, &bytes));
  M3QKV_TRY(product(c, "ceil(m/128)*128*k/32 (xsf bytes)", {m_pad, g.k / kMxBlock}, &bytes));
  M3QKV_TRY(product(c, "ceil(n/128)*128*k/32 (wsf bytes)", {n_pad, g.k / kMxBlock}, &bytes));
  return M3QKV_SUCCESS;
}

// The activations: exactly one of x_bf16 (bf16) and the pair (xq, xsf)
// (MXFP8). Both: INVALID_ARGUMENT naming the fields given; none of the three:
// NULL_POINTER naming all three; half a pair without x_bf16: NULL_POINTER
// naming the missing one.
m3qkv_status check_activation_pointers(Ctx c, const GemmOperands& g) {
  const auto hx = [](const void* p) { return static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(p)); };
  if (g.x_bf16 != nullptr) {
    if (g.xq == nullptr && g.xsf == nullptr) return M3QKV_SUCCESS;
    return fail(M3QKV_ERROR_INVALID_ARGUMENT,
                "%s: x_bf16 = 0x%llx and xq = 0x%llx, xsf = 0x%llx: give exactly one of x_bf16 (bf16 activations) and "
                "(xq, xsf) (MXFP8 activations); set xq and xsf to NULL with x_bf16",
                c.fn, hx(g.x_bf16), hx(g.xq), hx(g.xsf));
  }
  if (g.xq == nullptr && g.xsf == nullptr)
    return fail(M3QKV_ERROR_NULL_POINTER,
                "%s: xq = NULL, xsf = NULL and x_bf16 = NULL: the activations are required, either xq and xsf "
                "(MXFP8) or x_bf16 (bf16 [M, K])",
                c.fn);
  M3QKV_TRY(non_null(c, "xq", g.xq));
  return non_null(c, "xsf", g.xsf);
}

m3qkv_status check_gemm_pointers(Ctx c, const GemmOperands& g) {
  M3QKV_TRY(check_activation_pointers(c, g));
  M3QKV_TRY(non_null(c, "wq", g.wq));
  M3QKV_TRY(non_null(c, "wsf", g.wsf));
  return M3QKV_SUCCESS;
}

m3qkv_status check_gemm_alignment(Ctx c, const GemmOperands& g) {
  M3QKV_TRY(aligned(c, "xq", g.xq, kWideAlign));
  M3QKV_TRY(aligned(c, "xsf", g.xsf, kWideAlign));
  M3QKV_TRY(aligned(c, "x_bf16", g.x_bf16, kWideAlign));
  M3QKV_TRY(aligned(c, "wq", g.wq, kWideAlign));
  M3QKV_TRY(aligned(c, "wsf", g.wsf, kWideAlign));
  return M3QKV_SUCCESS;
}

// The epilogue fields shared by m3qkv_fused_args and m3qkv_insert_args.
struct Epilogue {
  int64_t m;
  int32_t nq, nkv, niq, nik;
  const int64_t* positions;
  int64_t max_position;
  const void* cos_sin_cache;
  const void *q_norm_weight, *k_norm_weight, *index_q_norm_weight, *index_k_norm_weight;
  float eps;
  const int64_t *slot_mapping, *index_slot_mapping;
  const void* kv_cache;
  int64_t kv_page_stride, num_blocks;
  const void* index_cache;
  int64_t index_page_stride, num_index_blocks;
  int32_t block_size;
  const void *q_out, *q_fp8_out, *index_q_out;
  float q_fp8_scale, k_scale, v_scale;
  int32_t use_pdl, grid;
  const uint32_t* error_flags;
  int32_t kv_cache_dtype, index_cache_dtype;
  const void* v_cache;
  int64_t kv_token_stride, kv_head_stride;
};

template <class A>
Epilogue epilogue_view(const A& a) {
  return Epilogue{a.m,
                  a.nq,
                  a.nkv,
                  a.niq,
                  a.nik,
                  a.positions,
                  a.max_position,
                  a.cos_sin_cache,
                  a.q_norm_weight,
                  a.k_norm_weight,
                  a.index_q_norm_weight,
                  a.index_k_norm_weight,
                  a.eps,
                  a.slot_mapping,
                  a.index_slot_mapping,
                  a.kv_cache,
                  a.kv_page_stride,
                  a.num_blocks,
                  a.index_cache,
                  a.index_page_stride,
                  a.num_index_blocks,
                  a.block_size,
                  a.q_out,
                  a.q_fp8_out,
                  a.index_q_out,
                  a.q_fp8_scale,
                  a.k_scale,
                  a.v_scale,
                  a.use_pdl,
                  a.grid,
                  a.error_flags,
                  a.kv_cache_dtype,
                  a.index_cache_dtype,
                  a.v_cache,
                  a.kv_token_stride,
                  a.kv_head_stride};
}

// Head counts (docs/contract.md §2.1); *n_out = N = (nq + 2·nkv + niq + nik)·128.
m3qkv_status check_heads(Ctx c, const Epilogue& e, int64_t* n_out) {
  M3QKV_TRY(at_least(c, "nq", e.nq, 1));
  M3QKV_TRY(at_least(c, "nkv", e.nkv, 1));
  if (e.nq % e.nkv != 0) {
    return fail(M3QKV_ERROR_INVALID_SHAPE, "%s: nq = %d is not a multiple of nkv = %d", c.fn, e.nq, e.nkv);
  }
  if (e.niq != 0 && e.niq != e.nkv) {
    return fail(M3QKV_ERROR_INVALID_SHAPE, "%s: niq = %d must be 0 or nkv = %d", c.fn, e.niq, e.nkv);
  }
  if (e.nik != 0 && e.nik != 1) {
    return fail(M3QKV_ERROR_INVALID_SHAPE, "%s: nik = %d must be 0 or 1", c.fn, e.nik);
  }
  // int64 sum of int32 counts: cannot overflow.
  const int64_t heads = int64_t{e.nq} + 2 * int64_t{e.nkv} + e.niq + e.nik;
  const int64_t n = heads * kHeadDim;
  if (n > kMaxN) {
    return fail(M3QKV_ERROR_TOO_LARGE,
                "%s: N = (nq + 2*nkv + niq + nik)*128 = (%d + 2*%d + %d + %d)*128 = %lld exceeds the kernel limit "
                "(must be <= %lld)",
                c.fn, e.nq, e.nkv, e.niq, e.nik, static_cast<ll>(n), static_cast<ll>(kMaxN));
  }
  *n_out = n;
  return M3QKV_SUCCESS;
}

// One paged NVFP4 cache: stride % 32, stride >= one packed page, pages >= 1,
// and the byte / slot extents fit int64.
m3qkv_status check_cache(Ctx c, const char* stride_name, int64_t stride, const char* pages_name, int64_t pages,
                         int64_t page_bytes, const char* page_formula) {
  M3QKV_TRY(multiple_of(c, stride_name, stride, kPageStrideMultiple));
  if (stride < page_bytes) {
    return fail(M3QKV_ERROR_INVALID_SHAPE, "%s: %s = %lld is smaller than one packed page (%s = %lld bytes)", c.fn,
                stride_name, static_cast<ll>(stride), page_formula, static_cast<ll>(page_bytes));
  }
  M3QKV_TRY(at_least(c, pages_name, pages, 1));
  int64_t bytes = 0;
  if (!__builtin_mul_overflow(pages, stride, &bytes)) return M3QKV_SUCCESS;
  // The name of the product only for the message: an snprintf per cache on
  // the success path would be about a third of validate_fused's CPU time.
  char what[96];
  std::snprintf(what, sizeof(what), "%s*%s (cache bytes)", pages_name, stride_name);
  return product(c, what, {pages, stride}, &bytes);
}

// ---------------------------------------------------------------------------
// Cache formats (docs/contract.md §4.3): kv_cache_dtype / index_cache_dtype,
// v_cache, kv_token_stride, kv_head_stride. Kept in one block, called from the
// epilogue checks below at the step each rule belongs to.
//
// Rules (FP8 / BF16 = the "flat" formats, e = 1 or 2 bytes per element):
//  - dtypes in {0 NVFP4, 1 FP8, 2 BF16}            INVALID_ARGUMENT
//    (index_cache_dtype only when nik > 0, like every index_* field)
//  - NVFP4 KV: kv_token_stride = kv_head_stride = 0 INVALID_ARGUMENT, and
//    v_cache = NULL (V lives in kv_cache; a non-null v_cache with NVFP4 is
//    a caller who forgot kv_cache_dtype)          INVALID_ARGUMENT
//  - flat KV: kv_page_stride, kv_token_stride, kv_head_stride > 0 and % 16
//                                                  INVALID_SHAPE
//    and no two K elements meet: the dimensions (column: e × 128, head:
//    kv_head_stride × nkv, token: kv_token_stride × block_size, page:
//    kv_page_stride × num_blocks), those of extent 1 dropped, sorted by
//    stride, each stride at least the byte span of the smaller dimensions
//    (a sufficient rule that accepts every nesting order, padding and gaps,
//    e.g. [block_size][nkv][128] and [nkv][block_size][128] pages, and an
//    interleaved [num_blocks][2][page] allocation)  INVALID_SHAPE; the K
//    span fits int64                               TOO_LARGE
//  - flat KV: v_cache required                     NULL_POINTER
//             v_cache 16-B aligned                 MISALIGNED
//             no V element meets a K element (exact for the nested layouts
//             above; what lets one allocation hold K and V interleaved)
//                                                  INVALID_ARGUMENT
//  - flat index: index_page_stride % 16 and >= block_size·128·e
//                                                  INVALID_SHAPE
//  - k_scale / v_scale are checked unless the KV cache is BF16 (unused there).
// ---------------------------------------------------------------------------
constexpr int64_t kFlatStrideMultiple = 16;  // 16-B vector stores of a cache row
static_assert(kFlatStrideMultiple % kRowStoreAlign == 0, "FP8 / BF16 strides keep rows 16-B aligned");

const char* dtype_name(int32_t d) { return d == M3QKV_CACHE_FP8 ? "FP8" : d == M3QKV_CACHE_BF16 ? "BF16" : "NVFP4"; }
int64_t flat_elem(int32_t d) { return d == M3QKV_CACHE_BF16 ? 2 : 1; }
bool kv_is_flat(const Epilogue& e) { return e.kv_cache_dtype != M3QKV_CACHE_NVFP4; }
bool index_is_flat(const Epilogue& e) { return e.nik > 0 && e.index_cache_dtype != M3QKV_CACHE_NVFP4; }

m3qkv_status check_cache_dtypes(Ctx c, const Epilogue& e) {
  M3QKV_TRY(in_range(c, "kv_cache_dtype", e.kv_cache_dtype, 0, 2, "0 (NVFP4), 1 (FP8) or 2 (BF16)"));
  if (e.nik > 0)
    M3QKV_TRY(in_range(c, "index_cache_dtype", e.index_cache_dtype, 0, 2, "0 (NVFP4), 1 (FP8) or 2 (BF16)"));
  return M3QKV_SUCCESS;
}

// One dimension of the K element pattern of a flat KV cache.
struct FlatDim {
  const char* what;  // the stride's field name
  int64_t stride, extent;
};

// The K dimensions with extent > 1, sorted by stride (column first: its
// "stride" is the element, and its span is the contiguous 128·e row).
int flat_kv_dims(const Epilogue& e, FlatDim (&d)[3]) {
  const FlatDim all[3] = {{"kv_head_stride", e.kv_head_stride, e.nkv},
                          {"kv_token_stride", e.kv_token_stride, e.block_size},
                          {"kv_page_stride", e.kv_page_stride, e.num_blocks}};
  int n = 0;
  for (const FlatDim& x : all)
    if (x.extent > 1) d[n++] = x;
  for (int i = 1; i < n; ++i)  // insertion sort, stable: ties keep head, token, page order
    for (int j = i; j > 0 && d[j].stride < d[j - 1].stride; --j) std::swap(d[j], d[j - 1]);
  return n;
}

m3qkv_status check_flat_kv_scalars(Ctx c, const Epilogue& e) {
  for (const FlatDim& x : {FlatDim{"kv_page_stride", e.kv_page_stride, 0}, FlatDim{"kv_token_stride", e.kv_token_stride, 0},
                           FlatDim{"kv_head_stride", e.kv_head_stride, 0}}) {
    M3QKV_TRY(positive(c, x.what, x.stride));
    M3QKV_TRY(multiple_of(c, x.what, x.stride, kFlatStrideMultiple));
  }
  M3QKV_TRY(at_least(c, "num_blocks", e.num_blocks, 1));
  const int64_t el = flat_elem(e.kv_cache_dtype);
  FlatDim d[3];
  const int n = flat_kv_dims(e, d);
  int64_t span = kHeadDim * el;  // one contiguous row of 128 elements
  for (int i = 0; i < n; ++i) {
    if (d[i].stride < span) {
      return fail(M3QKV_ERROR_INVALID_SHAPE,
                  "%s: %s = %lld is smaller than the %lld bytes the smaller dimensions of a %s K/V row span "
                  "(nkv = %d, block_size = %d, num_blocks = %lld, 128 elements of %lld B; strides: head %lld, "
                  "token %lld, page %lld): two cache elements would share bytes",
                  c.fn, d[i].what, static_cast<ll>(d[i].stride), static_cast<ll>(span), dtype_name(e.kv_cache_dtype),
                  e.nkv, e.block_size, static_cast<ll>(e.num_blocks), static_cast<ll>(el),
                  static_cast<ll>(e.kv_head_stride), static_cast<ll>(e.kv_token_stride),
                  static_cast<ll>(e.kv_page_stride));
    }
    int64_t add = 0;
    if (__builtin_mul_overflow(d[i].extent - 1, d[i].stride, &add) || __builtin_add_overflow(span, add, &span))
      return fail(M3QKV_ERROR_TOO_LARGE, "%s: the K cache span (%s = %lld over %lld) overflows int64", c.fn, d[i].what,
                  static_cast<ll>(d[i].stride), static_cast<ll>(d[i].extent));
  }
  return M3QKV_SUCCESS;
}

m3qkv_status check_nvfp4_kv_unused_fields(Ctx c, const Epilogue& e) {
  if (e.kv_token_stride != 0 || e.kv_head_stride != 0) {
    const bool tok = e.kv_token_stride != 0;
    return fail(M3QKV_ERROR_INVALID_ARGUMENT,
                "%s: %s = %lld must be 0 with kv_cache_dtype = 0 (NVFP4: the page layout is fixed; the strides "
                "are for FP8 / BF16 caches)",
                c.fn, tok ? "kv_token_stride" : "kv_head_stride",
                static_cast<ll>(tok ? e.kv_token_stride : e.kv_head_stride));
  }
  return M3QKV_SUCCESS;
}

m3qkv_status check_flat_index_scalars(Ctx c, const Epilogue& e) {
  M3QKV_TRY(multiple_of(c, "index_page_stride", e.index_page_stride, kFlatStrideMultiple));
  const int64_t page = int64_t{e.block_size} * kHeadDim * flat_elem(e.index_cache_dtype);  // < 2^31 · 256
  if (e.index_page_stride < page)
    return fail(M3QKV_ERROR_INVALID_SHAPE,
                "%s: index_page_stride = %lld is smaller than one %s index page (block_size*128*%lld = %lld bytes)",
                c.fn, static_cast<ll>(e.index_page_stride), dtype_name(e.index_cache_dtype),
                static_cast<ll>(flat_elem(e.index_cache_dtype)), static_cast<ll>(page));
  M3QKV_TRY(at_least(c, "num_index_blocks", e.num_index_blocks, 1));
  int64_t bytes = 0;
  return product(c, "num_index_blocks*index_page_stride (cache bytes)", {e.num_index_blocks, e.index_page_stride},
                 &bytes);
}

// Pointer presence (step 5): v_cache required for flat KV, NULL for NVFP4.
m3qkv_status check_v_cache_pointer(Ctx c, const Epilogue& e) {
  if (kv_is_flat(e)) return non_null(c, "v_cache", e.v_cache);
  if (e.v_cache != nullptr)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT,
                "%s: v_cache = 0x%llx must be NULL with kv_cache_dtype = 0 (NVFP4 keeps V in kv_cache); set "
                "kv_cache_dtype for an FP8 / BF16 cache",
                c.fn, static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(e.v_cache)));
  return M3QKV_SUCCESS;
}

// Whether some V element meets some K element, V = K shifted by `d` bytes.
// K rows are [x, x + 128·e) for x in the lattice of the sorted dimensions
// d[0..k) (validated nested: each stride >= the span of the smaller ones).
// The K-K differences of the dimensions below k lie in (-span, span), so at
// level k only the two multiples m·stride nearest to d can leave a remainder
// in that range: at most two branches per level, exact.
bool flat_shift_meets(__int128 d, const FlatDim* dims, int k, int64_t row) {
  if (k == 0) return d > -row && d < row;
  const FlatDim& x = dims[k - 1];
  int64_t span = row;  // span of dims[0..k-1)
  for (int i = 0; i < k - 1; ++i) span += (dims[i].extent - 1) * dims[i].stride;  // fits: checked in scalars
  const __int128 s = x.stride;
  __int128 m0 = d / s;
  if (d % s != 0 && d < 0) --m0;  // floor
  for (__int128 m = m0; m <= m0 + 1; ++m) {
    if (m <= -x.extent || m >= x.extent) continue;
    const __int128 r = d - m * s;
    if (r > -span && r < span && flat_shift_meets(r, dims, k - 1, row)) return true;
  }
  return false;
}

// Step 6 (after alignment): the V elements are disjoint from the K elements.
m3qkv_status check_kv_pair_disjoint(Ctx c, const Epilogue& e) {
  if (!kv_is_flat(e)) return M3QKV_SUCCESS;
  FlatDim d[3];
  const int n = flat_kv_dims(e, d);
  const __int128 shift = static_cast<__int128>(reinterpret_cast<uintptr_t>(e.v_cache)) -
                         static_cast<__int128>(reinterpret_cast<uintptr_t>(e.kv_cache));
  if (flat_shift_meets(shift, d, n, kHeadDim * flat_elem(e.kv_cache_dtype)))
    return fail(M3QKV_ERROR_INVALID_ARGUMENT,
                "%s: v_cache = kv_cache %c %lld bytes: some V element would share bytes with a K element (strides: "
                "head %lld, token %lld, page %lld; nkv = %d, block_size = %d, num_blocks = %lld)",
                c.fn, shift < 0 ? '-' : '+', static_cast<ll>(shift < 0 ? -shift : shift),
                static_cast<ll>(e.kv_head_stride), static_cast<ll>(e.kv_token_stride),
                static_cast<ll>(e.kv_page_stride), e.nkv, e.block_size, static_cast<ll>(e.num_blocks));
  return M3QKV_SUCCESS;
}
// ------------------------------------------------------- end of cache formats

// All host scalars of the epilogue: shapes, limits and values. *n_out = N.
m3qkv_status check_epilogue_scalars(Ctx c, const Epilogue& e, int64_t* n_out) {
  M3QKV_TRY(check_m(c, e.m));
  M3QKV_TRY(check_heads(c, e, n_out));

  M3QKV_TRY(positive(c, "block_size", e.block_size));
  M3QKV_TRY(multiple_of(c, "block_size", e.block_size, kBlockSizeMultiple));

  M3QKV_TRY(check_cache_dtypes(c, e));
  int64_t kv_page = 0, slots = 0;
  if (kv_is_flat(e)) {
    M3QKV_TRY(check_flat_kv_scalars(c, e));
  } else {
    M3QKV_TRY(check_nvfp4_kv_unused_fields(c, e));
    M3QKV_TRY(
        product(c, "2*nkv*block_size*72 (kv page bytes)", {2, e.nkv, e.block_size, kSlotBytesPerToken}, &kv_page));
    M3QKV_TRY(check_cache(c, "kv_page_stride", e.kv_page_stride, "num_blocks", e.num_blocks, kv_page,
                            "2*nkv*block_size*72"));
  }
  M3QKV_TRY(product(c, "num_blocks*block_size (kv slots)", {e.num_blocks, e.block_size}, &slots));
  if (e.nik > 0) {
    if (index_is_flat(e)) {
      M3QKV_TRY(check_flat_index_scalars(c, e));
    } else {
      const int64_t index_page = int64_t{e.block_size} * kSlotBytesPerToken;  // < 2^31 · 72: no overflow
      M3QKV_TRY(check_cache(c, "index_page_stride", e.index_page_stride, "num_index_blocks", e.num_index_blocks,
                              index_page, "block_size*72"));
    }
    M3QKV_TRY(product(c, "num_index_blocks*block_size (index slots)", {e.num_index_blocks, e.block_size}, &slots));
  }

  M3QKV_TRY(at_least(c, "max_position", e.max_position, 1));
  int64_t bytes = 0;
  M3QKV_TRY(product(c, "max_position*64*2 (cos_sin_cache bytes)", {e.max_position, 64, 2}, &bytes));
  M3QKV_TRY(product(c, "m*N*4 (accumulator bytes)", {e.m, *n_out, 4}, &bytes));

  M3QKV_TRY(check_eps(c, e.eps));
  // q_fp8_scale only matters when the fp8 q output is requested.
  if (e.q_fp8_out != nullptr) M3QKV_TRY(check_scale(c, "q_fp8_scale", e.q_fp8_scale));
  // The KV scales are not used by a BF16 KV cache (docs/contract.md §4.3).
  if (e.kv_cache_dtype != M3QKV_CACHE_BF16) {
    M3QKV_TRY(check_scale(c, "k_scale", e.k_scale));
    M3QKV_TRY(check_scale(c, "v_scale", e.v_scale));
  }
  M3QKV_TRY(check_use_pdl(c, e.use_pdl));
  M3QKV_TRY(check_grid(c, e.grid));
  return M3QKV_SUCCESS;
}

m3qkv_status check_epilogue_pointers(Ctx c, const Epilogue& e) {
  M3QKV_TRY(non_null(c, "positions", e.positions));
  M3QKV_TRY(non_null(c, "cos_sin_cache", e.cos_sin_cache));
  M3QKV_TRY(non_null(c, "q_norm_weight", e.q_norm_weight));
  M3QKV_TRY(non_null(c, "k_norm_weight", e.k_norm_weight));
  M3QKV_TRY(non_null(c, "slot_mapping", e.slot_mapping));
  M3QKV_TRY(non_null(c, "kv_cache", e.kv_cache));
  if (e.niq > 0) {
    M3QKV_TRY(non_null(c, "index_q_norm_weight", e.index_q_norm_weight));
    M3QKV_TRY(non_null(c, "index_q_out", e.index_q_out));
  }
  if (e.nik > 0) {
    M3QKV_TRY(non_null(c, "index_k_norm_weight", e.index_k_norm_weight));
    M3QKV_TRY(non_null(c, "index_slot_mapping", e.index_slot_mapping));
    M3QKV_TRY(non_null(c, "index_cache", e.index_cache));
  }
  M3QKV_TRY(check_v_cache_pointer(c, e));
  if (e.q_out == nullptr && e.q_fp8_out == nullptr) {
    return fail(M3QKV_ERROR_INVALID_ARGUMENT, "%s: q_out = NULL and q_fp8_out = NULL: at least one q output is required",
                c.fn);
  }
  return M3QKV_SUCCESS;
}

m3qkv_status check_epilogue_alignment(Ctx c, const Epilogue& e) {
  M3QKV_TRY(aligned(c, "positions", e.positions, kI64Align));
  M3QKV_TRY(aligned(c, "cos_sin_cache", e.cos_sin_cache, kWideAlign));
  M3QKV_TRY(aligned(c, "q_norm_weight", e.q_norm_weight, kWideAlign));
  M3QKV_TRY(aligned(c, "k_norm_weight", e.k_norm_weight, kWideAlign));
  M3QKV_TRY(aligned(c, "slot_mapping", e.slot_mapping, kI64Align));
  M3QKV_TRY(aligned(c, "kv_cache", e.kv_cache, kWideAlign));
  M3QKV_TRY(aligned(c, "q_out", e.q_out, kWideAlign));
  M3QKV_TRY(aligned(c, "q_fp8_out", e.q_fp8_out, kWideAlign));
  if (e.niq > 0) {
    M3QKV_TRY(aligned(c, "index_q_norm_weight", e.index_q_norm_weight, kWideAlign));
    M3QKV_TRY(aligned(c, "index_q_out", e.index_q_out, kWideAlign));
  }
  if (e.nik > 0) {
    M3QKV_TRY(aligned(c, "index_k_norm_weight", e.index_k_norm_weight, kWideAlign));
    M3QKV_TRY(aligned(c, "index_slot_mapping", e.index_slot_mapping, kI64Align));
    M3QKV_TRY(aligned(c, "index_cache", e.index_cache, kWideAlign));
  }
  M3QKV_TRY(aligned(c, "error_flags", e.error_flags, kFlagAlign));
  M3QKV_TRY(aligned(c, "v_cache", e.v_cache, kWideAlign));
  return check_kv_pair_disjoint(c, e);
}

// Steps 1-2 of the order above: *out = the caller's struct_size bytes of
// *in, zero past them, struct_size = sizeof(A).
template <class A>
m3qkv_status check_header(Ctx c, const A* in, const char* type, A* out, bool* noop) {
  if (noop != nullptr) *noop = false;
  if (in == nullptr) return fail(M3QKV_ERROR_NULL_POINTER, "%s: args = NULL", c.fn);
  const size_t size = in->struct_size;
  M3QKV_TRY(check_struct_size<A>(c, size, type));
  std::memset(out, 0, sizeof(A));
  std::memcpy(out, in, size);
  out->struct_size = sizeof(A);
  return M3QKV_SUCCESS;
}

// The fp8 fast mode (precision 1) folds MXFP8 activations and sums in its
// own K order: bf16 activations and batch invariance need exact mode.
m3qkv_status check_precision(Ctx c, int32_t precision, const void* x_bf16, int32_t batch_invariant) {
  M3QKV_TRY(in_range(c, "precision", precision, 0, 1, "0 (exact) or 1 (fp8 fast mode)"));
  if (precision == 1 && x_bf16 != nullptr)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT,
                "%s: precision = 1 (fp8 fast mode) takes MXFP8 activations (xq, xsf), not x_bf16; quantize them with "
                "m3qkv_mxfp8_quantize or use precision = 0",
                c.fn);
  if (precision == 1 && batch_invariant != 0)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT,
                "%s: batch_invariant = 1 needs precision = 0 (the fp8 fast mode's K order depends on the plan)", c.fn);
  return M3QKV_SUCCESS;
}

// Step 4 of the order above; returns true when validation is complete.
bool is_noop(int64_t m, bool* noop) {
  if (m != 0) return false;
  if (noop != nullptr) *noop = true;
  return true;
}

}  // namespace

namespace {
// The weight shapes the fold takes (m3qkv_prepare_weights_fp8 and its sizes query).
m3qkv_status prepare_shape(Ctx c, int64_t n, int64_t k) {
  M3QKV_TRY(positive(c, "n", n));
  M3QKV_TRY(multiple_of(c, "n", n, kNMultiple));
  M3QKV_TRY(within_limit(c, "n", n, kMaxN, /*inclusive=*/true));
  M3QKV_TRY(check_k(c, k));
  int64_t bytes = 0;
  return product(c, "n*k (wq bytes)", {n, k}, &bytes);
}
}  // namespace

m3qkv_status validate_fused(const m3qkv_fused_args* args, m3qkv_fused_args* out, bool* noop) {
  const Ctx c{"m3qkv_fused_qkv"};
  M3QKV_TRY(check_header(c, args, "m3qkv_fused_args", out, noop));
  const m3qkv_fused_args* a = out;
  const Epilogue e = epilogue_view(*a);
  int64_t n = 0;
  M3QKV_TRY(check_k(c, a->k));
  M3QKV_TRY(check_epilogue_scalars(c, e, &n));
  const GemmOperands g{a->m, n, a->k, a->xq, a->xsf, a->wq, a->wsf, a->x_bf16};
  M3QKV_TRY(check_gemm_sizes(c, g));
  M3QKV_TRY(in_range(c, "cta_group", a->cta_group, 0, 2, "0 (auto), 1 or 2"));
  M3QKV_TRY(in_range(c, "batch_invariant", a->batch_invariant, 0, 1, "0 (off) or 1"));
  M3QKV_TRY(check_precision(c, a->precision, a->x_bf16, a->batch_invariant));
  if (is_noop(a->m, noop)) return M3QKV_SUCCESS;
  M3QKV_TRY(check_gemm_pointers(c, g));
  M3QKV_TRY(check_epilogue_pointers(c, e));
  M3QKV_TRY(check_gemm_alignment(c, g));
  M3QKV_TRY(check_epilogue_alignment(c, e));
  api::Extents x;
  M3QKV_TRY(api::fused_extents(c.fn, *a, &x));
  return api::check_overlaps(c.fn, &x);
}

m3qkv_status validate_insert(const m3qkv_insert_args* args, m3qkv_insert_args* out, bool* noop) {
  const Ctx c{"m3qkv_qknorm_rope_kv_insert"};
  M3QKV_TRY(check_header(c, args, "m3qkv_insert_args", out, noop));
  const m3qkv_insert_args* a = out;
  const Epilogue e = epilogue_view(*a);
  int64_t n = 0;
  M3QKV_TRY(check_epilogue_scalars(c, e, &n));
  int64_t bytes = 0;
  M3QKV_TRY(product(c, "m*N*2 (qkv bytes)", {a->m, n, 2}, &bytes));
  if (is_noop(a->m, noop)) return M3QKV_SUCCESS;
  M3QKV_TRY(non_null(c, "qkv", a->qkv));
  M3QKV_TRY(check_epilogue_pointers(c, e));
  M3QKV_TRY(aligned(c, "qkv", a->qkv, kWideAlign));
  M3QKV_TRY(check_epilogue_alignment(c, e));
  api::Extents x;
  M3QKV_TRY(api::insert_extents(c.fn, *a, &x));
  return api::check_overlaps(c.fn, &x);
}

m3qkv_status validate_gemm(const m3qkv_gemm_args* args, m3qkv_gemm_args* out, bool* noop) {
  const Ctx c{"m3qkv_mxfp8_gemm"};
  M3QKV_TRY(check_header(c, args, "m3qkv_gemm_args", out, noop));
  const m3qkv_gemm_args* a = out;
  M3QKV_TRY(check_m(c, a->m));
  M3QKV_TRY(positive(c, "n", a->n));
  M3QKV_TRY(multiple_of(c, "n", a->n, kNMultiple));
  M3QKV_TRY(within_limit(c, "n", a->n, kMaxN, /*inclusive=*/true));
  M3QKV_TRY(check_k(c, a->k));
  const GemmOperands g{a->m, a->n, a->k, a->xq, a->xsf, a->wq, a->wsf, a->x_bf16};
  M3QKV_TRY(check_gemm_sizes(c, g));
  M3QKV_TRY(check_use_pdl(c, a->use_pdl));
  M3QKV_TRY(check_grid(c, a->grid));
  if (is_noop(a->m, noop)) return M3QKV_SUCCESS;
  M3QKV_TRY(check_gemm_pointers(c, g));
  M3QKV_TRY(non_null(c, "out", a->out));
  M3QKV_TRY(check_gemm_alignment(c, g));
  M3QKV_TRY(aligned(c, "out", a->out, kWideAlign));
  api::Extents x;
  M3QKV_TRY(api::gemm_extents(c.fn, *a, &x));
  return api::check_overlaps(c.fn, &x);
}

m3qkv_status validate_quantize(const m3qkv_quantize_args* args, m3qkv_quantize_args* out, bool* noop) {
  const Ctx c{"m3qkv_mxfp8_quantize"};
  M3QKV_TRY(check_header(c, args, "m3qkv_quantize_args", out, noop));
  const m3qkv_quantize_args* a = out;
  M3QKV_TRY(check_m(c, a->m));
  M3QKV_TRY(check_k(c, a->k));
  int64_t bytes = 0;
  const int64_t m_pad = (a->m + kScaleRowTile - 1) / kScaleRowTile * kScaleRowTile;
  M3QKV_TRY(product(c, "m*k*2 (x bytes)", {a->m, a->k, 2}, &bytes));
  M3QKV_TRY(product(c, "ceil(m/128)*128*k/32 (xsf bytes)", {m_pad, a->k / kMxBlock}, &bytes));
  M3QKV_TRY(check_use_pdl(c, a->use_pdl));
  if (is_noop(a->m, noop)) return M3QKV_SUCCESS;
  M3QKV_TRY(non_null(c, "x", a->x));
  M3QKV_TRY(non_null(c, "xq", a->xq));
  M3QKV_TRY(non_null(c, "xsf", a->xsf));
  M3QKV_TRY(aligned(c, "x", a->x, kWideAlign));
  M3QKV_TRY(aligned(c, "xq", a->xq, kWideAlign));
  M3QKV_TRY(aligned(c, "xsf", a->xsf, kWideAlign));
  api::Extents x;
  M3QKV_TRY(api::quantize_extents(c.fn, *a, &x));
  return api::check_overlaps(c.fn, &x);
}

m3qkv_status validate_prepare(const m3qkv_prepare_args* args, m3qkv_prepare_args* out) {
  const Ctx c{"m3qkv_prepare_weights_fp8"};
  M3QKV_TRY(check_header(c, args, "m3qkv_prepare_args", out, nullptr));
  const m3qkv_prepare_args* a = out;
  M3QKV_TRY(prepare_shape(c, a->n, a->k));
  M3QKV_TRY(non_null(c, "wq", a->wq));
  M3QKV_TRY(non_null(c, "wsf", a->wsf));
  M3QKV_TRY(non_null(c, "wq_out", a->wq_out));
  M3QKV_TRY(non_null(c, "wsf_out", a->wsf_out));
  M3QKV_TRY(aligned(c, "wq", a->wq, kWideAlign));
  M3QKV_TRY(aligned(c, "wsf", a->wsf, kWideAlign));
  M3QKV_TRY(aligned(c, "wq_out", a->wq_out, kWideAlign));
  M3QKV_TRY(aligned(c, "wsf_out", a->wsf_out, kWideAlign));
  api::Extents x;
  M3QKV_TRY(api::prepare_extents(c.fn, *a, &x));
  return api::check_overlaps(c.fn, &x);
}

m3qkv_status prepare_sizes(int64_t n, int64_t k, size_t* wq_bytes, size_t* wsf_bytes) {
  const Ctx c{"m3qkv_prepare_weights_fp8_sizes"};
  M3QKV_TRY(non_null(c, "wq_bytes", wq_bytes));
  M3QKV_TRY(non_null(c, "wsf_bytes", wsf_bytes));
  M3QKV_TRY(prepare_shape(c, n, k));
  *wq_bytes = static_cast<size_t>(n) * static_cast<size_t>(k);
  *wsf_bytes = static_cast<size_t>(f8_128x4_bytes(n, k / kMxBlock));
  return M3QKV_SUCCESS;
}

}  // namespace m3qkv
