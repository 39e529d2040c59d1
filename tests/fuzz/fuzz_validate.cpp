// libFuzzer target over the argument validation of the four entry points
// (src/api/validate.h) and the extents of an accepted call
// (src/api/extents.h). Built and run by tools/fuzz.sh (clang,
// -fsanitize=fuzzer,address,undefined); .ci/run runs it for 60 s.
//
// An input is a header byte and a list of field mutations applied to one of
// a few valid argument structs (docs/contract.md shapes: TP4-like heads,
// NVFP4 / FP8 / BF16 caches, MXFP8 or bf16 activations):
//   - struct_size: the released sizes (0.1, 0.2, this header), their
//     neighbours, 0, huge values;
//   - integers and floats from edge-value pools (0, ±1, INT32/INT64 limits,
//     multiples and non-multiples of 16 / 32 / 128, the page sizes of the
//     current shape; NaN, ±inf, denormals and the bounds of the scales'
//     reciprocal rule), small deltas and raw bytes;
//   - pointers: NULL, a few regions 64 KiB apart in one fake address space,
//     another field's pointer plus a shape-derived delta (aliasing and
//     interleaving), raw values (misaligned, near 2^64).
// By default the pointers are then laid out back to back for the mutated
// shape (with gaps of -32 ... 64 bytes), so that accepted calls are common
// and a one-field change makes buffers meet.
//
// Invariants (a violation aborts: libFuzzer records the input as a crash):
//   - no crash, no ASan / UBSan report; no CUDA call (the CUDA table is one
//     whose every entry aborts) and no dereference of a fake device pointer
//     (they lie in ASan's unmapped shadow gap);
//   - the caller's struct is read only up to its struct_size (it lives in a
//     heap block of exactly that size), and the copy the validator hands on
//     has struct_size = sizeof and zeros past the caller's bytes;
//   - a struct_size is accepted iff it is a released size;
//   - a rejection is one of the validation statuses, with a message that
//     starts with the entry point's name and names an argument (a field of
//     the struct); an acceptance leaves no message and *noop iff m == 0;
//   - an accepted call with m > 0: its extents can be built and match the
//     contract's sizes (tests/fuzz/oracle.h), and no written buffer shares
//     a byte with another buffer (nor a flat cache's element with another of
//     its elements), decided exactly by the oracle.
#include <fuzzer/FuzzedDataProvider.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <type_traits>

#include "fuzz/oracle.h"
#include "host/cuda.h"
#include "api/extents.h"
#include "host/status.h"
#include "api/validate.h"
#include "m3qkv/m3qkv.h"

namespace {

namespace O = m3qkv_oracle;
using O::i128;

[[noreturn]] void die(const char* what, const char* detail = "") {
  std::fprintf(stderr, "fuzz_validate: INVARIANT FAILED: %s %s\n", what, detail);
  std::fflush(stderr);
  std::abort();
}

// strcmp without libFuzzer's interceptor (it records every comparison).
bool same(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) ++a, ++b;
  return *a == *b;
}

// ---------------------------------------------------------------------------
// A CUDA table that aborts on any call: validation must make none.
// ---------------------------------------------------------------------------
template <class F>
struct Trap;
template <class R, class... A>
struct Trap<R (*)(A...)> {
  static R call(A...) { die("validation called into the CUDA table"); }
};
m3qkv::host::Cuda make_poison_table() {
  m3qkv::host::Cuda t{};
#define M3QKV_TRAP(member) t.member = &Trap<decltype(t.member)>::call
  M3QKV_TRAP(get_last_error);
  M3QKV_TRAP(get_device_count);
  M3QKV_TRAP(get_device);
  M3QKV_TRAP(set_device);
  M3QKV_TRAP(device_get_attribute);
  M3QKV_TRAP(driver_get_version);
  M3QKV_TRAP(stream_get_id);
  M3QKV_TRAP(stream_get_capture_info);
  M3QKV_TRAP(malloc);
  M3QKV_TRAP(free);
  M3QKV_TRAP(malloc_async);
  M3QKV_TRAP(free_async);
  M3QKV_TRAP(event_create);
  M3QKV_TRAP(event_record);
  M3QKV_TRAP(event_destroy);
  M3QKV_TRAP(stream_wait_event);
  M3QKV_TRAP(user_object_create);
  M3QKV_TRAP(user_object_release);
  M3QKV_TRAP(graph_retain_user_object);
  M3QKV_TRAP(memset_async);
  M3QKV_TRAP(memcpy_async);
  M3QKV_TRAP(stream_create_with_flags);
  M3QKV_TRAP(stream_synchronize);
  M3QKV_TRAP(stream_destroy);
  M3QKV_TRAP(exchange_capture_mode);
  M3QKV_TRAP(occupancy_max_active_blocks);
  t.driver_resolved = true;
  M3QKV_TRAP(get_error_name);
  M3QKV_TRAP(ctx_get_current);
  M3QKV_TRAP(ctx_push_current);
  M3QKV_TRAP(ctx_pop_current);
  M3QKV_TRAP(ctx_get_id);
  M3QKV_TRAP(ctx_get_device);
  M3QKV_TRAP(stream_get_ctx);
  M3QKV_TRAP(primary_ctx_retain);
  M3QKV_TRAP(primary_ctx_release);
  M3QKV_TRAP(primary_ctx_get_state);
  M3QKV_TRAP(pointer_get_attributes);
  M3QKV_TRAP(tensor_map_encode_tiled);
#undef M3QKV_TRAP
  return t;
}
const m3qkv::host::Cuda g_poison = make_poison_table();

// ---------------------------------------------------------------------------
// Fields of each struct.
// ---------------------------------------------------------------------------
enum Kind { kSize, kI64, kI32, kF32, kPtr };
struct Field {
  const char* name;
  size_t off;
  Kind kind;
};
#define FLD(S, f, k) Field{#f, offsetof(S, f), k}
#define EPILOGUE_FIELDS(S)                                                                                         \
  FLD(S, m, kI64), FLD(S, nq, kI32), FLD(S, nkv, kI32), FLD(S, niq, kI32), FLD(S, nik, kI32),                     \
      FLD(S, positions, kPtr), FLD(S, max_position, kI64), FLD(S, cos_sin_cache, kPtr),                           \
      FLD(S, q_norm_weight, kPtr), FLD(S, k_norm_weight, kPtr), FLD(S, index_q_norm_weight, kPtr),                \
      FLD(S, index_k_norm_weight, kPtr), FLD(S, eps, kF32), FLD(S, slot_mapping, kPtr),                           \
      FLD(S, index_slot_mapping, kPtr), FLD(S, kv_cache, kPtr), FLD(S, kv_page_stride, kI64),                     \
      FLD(S, num_blocks, kI64), FLD(S, index_cache, kPtr), FLD(S, index_page_stride, kI64),                       \
      FLD(S, num_index_blocks, kI64), FLD(S, block_size, kI32), FLD(S, q_out, kPtr), FLD(S, q_fp8_out, kPtr),     \
      FLD(S, index_q_out, kPtr), FLD(S, q_fp8_scale, kF32), FLD(S, k_scale, kF32), FLD(S, v_scale, kF32),         \
      FLD(S, use_pdl, kI32), FLD(S, grid, kI32), FLD(S, error_flags, kPtr), FLD(S, kv_cache_dtype, kI32),         \
      FLD(S, index_cache_dtype, kI32), FLD(S, v_cache, kPtr), FLD(S, kv_token_stride, kI64),                      \
      FLD(S, kv_head_stride, kI64)

const Field kFusedFields[] = {FLD(m3qkv_fused_args, struct_size, kSize), EPILOGUE_FIELDS(m3qkv_fused_args),
                              FLD(m3qkv_fused_args, k, kI64),           FLD(m3qkv_fused_args, xq, kPtr),
                              FLD(m3qkv_fused_args, xsf, kPtr),         FLD(m3qkv_fused_args, wq, kPtr),
                              FLD(m3qkv_fused_args, wsf, kPtr),         FLD(m3qkv_fused_args, cta_group, kI32),
                              FLD(m3qkv_fused_args, x_bf16, kPtr),      FLD(m3qkv_fused_args, batch_invariant, kI32)};
const Field kInsertFields[] = {FLD(m3qkv_insert_args, struct_size, kSize), EPILOGUE_FIELDS(m3qkv_insert_args),
                               FLD(m3qkv_insert_args, qkv, kPtr)};
const Field kGemmFields[] = {FLD(m3qkv_gemm_args, struct_size, kSize), FLD(m3qkv_gemm_args, m, kI64),
                             FLD(m3qkv_gemm_args, n, kI64),           FLD(m3qkv_gemm_args, k, kI64),
                             FLD(m3qkv_gemm_args, xq, kPtr),          FLD(m3qkv_gemm_args, xsf, kPtr),
                             FLD(m3qkv_gemm_args, wq, kPtr),          FLD(m3qkv_gemm_args, wsf, kPtr),
                             FLD(m3qkv_gemm_args, out, kPtr),         FLD(m3qkv_gemm_args, use_pdl, kI32),
                             FLD(m3qkv_gemm_args, grid, kI32),        FLD(m3qkv_gemm_args, x_bf16, kPtr)};
const Field kQuantizeFields[] = {FLD(m3qkv_quantize_args, struct_size, kSize), FLD(m3qkv_quantize_args, m, kI64),
                                 FLD(m3qkv_quantize_args, k, kI64),           FLD(m3qkv_quantize_args, x, kPtr),
                                 FLD(m3qkv_quantize_args, xq, kPtr),          FLD(m3qkv_quantize_args, xsf, kPtr),
                                 FLD(m3qkv_quantize_args, use_pdl, kI32)};
#undef FLD
#undef EPILOGUE_FIELDS

// The released struct sizes (LP64; docs/contract.md §7.2): 0.1, 0.2, 0.3.
static_assert(sizeof(void*) == 8, "the released sizes below are LP64's");
static_assert(sizeof(m3qkv_fused_args) == 312 && sizeof(m3qkv_insert_args) == 264 && sizeof(m3qkv_gemm_args) == 88 &&
                  sizeof(m3qkv_quantize_args) == 56,
              "a struct grew: add its new released size below");
constexpr size_t kFusedSizes[] = {264, 296, 312};
constexpr size_t kInsertSizes[] = {232, 264, 264};
constexpr size_t kGemmSizes[] = {80, 80, 88};
constexpr size_t kQuantizeSizes[] = {56, 56, 56};

// ---------------------------------------------------------------------------
// Value pools.
// ---------------------------------------------------------------------------
constexpr int64_t kI64Pool[] = {0, 1, -1, 2, 3, 4, 7, 8, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 72, 96, 127, 128,
                                129, 144, 255, 256, 257, 384, 1024, 1152, 2304, 4096, 4608, 6144, 8192, 65536,
                                int64_t{1} << 20, (int64_t{1} << 20) + 128, (int64_t{1} << 20) - 128, int64_t{1} << 24,
                                (int64_t{1} << 24) + 128, (int64_t{1} << 31) - 1, int64_t{1} << 31,
                                (int64_t{1} << 31) + 1, int64_t{1} << 32, INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN,
                                INT64_MAX - 127, INT64_MAX / 2, int64_t{1} << 40, int64_t{1} << 44, int64_t{1} << 62,
                                -16, -128, -4096};
constexpr int32_t kI32Pool[] = {0,      1,         -1,        2,         3,         4,        5,
                                7,      8,         12,        15,        16,        17,       31,
                                32,     33,        64,        127,       128,       129,      1000,
                                131071, 131072,    131073,    1 << 24,   INT32_MAX, INT32_MIN, INT32_MAX - 1,
                                -4,     1 << 30,   (1 << 30) + 4, 1000000};
float bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
const float kF32Pool[] = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          1e-6f,
                          0.5f,
                          448.0f,
                          bits(0x00000001u),                         // smallest denormal
                          bits(0x00800000u),                         // FLT_MIN
                          bits(0x007fffffu),                         // largest denormal
                          bits(0x00200000u),                         // 2^-128 (denormal: 1/x = 2^128 = inf)
                          bits(0x00200001u),                         // just above: 1/x < 2^128
                          bits(0x002AAAABu),                         // ~3.9e-39
                          bits(0x7E800000u),                         // 2^126 = 8.507e37: 1/x = 2^-126 = FLT_MIN
                          bits(0x7E800001u),                         // just above: 1/x denormal
                          bits(0x7E7FFFFFu),                         // just below
                          bits(0x7F7FFFFFu),                         // FLT_MAX
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          -std::numeric_limits<float>::quiet_NaN(),
                          bits(0x7F800001u),                         // signalling NaN
                          1e38f,
                          2.9e-39f};

// Fake device memory: regions 64 KiB apart inside ASan's shadow gap (unmapped
// and inaccessible on x86-64), so a dereference faults; one region near the
// top of the address space for the wrap-around rules.
constexpr uint64_t kRegion0 = uint64_t{1} << 40;
constexpr uint64_t kRegionStep = uint64_t{1} << 16;
uint64_t region(int r) {
  if (r == 4) return ~uint64_t{0} - (uint64_t{1} << 20) + 1;  // 2^64 - 1 MiB
  return kRegion0 + static_cast<uint64_t>(r) * kRegionStep;
}

template <class T>
T get(const void* s, size_t off) {
  T v;
  std::memcpy(&v, static_cast<const char*>(s) + off, sizeof(T));
  return v;
}
template <class T>
void put(void* s, size_t off, T v) {
  std::memcpy(static_cast<char*>(s) + off, &v, sizeof(T));
}

// ---------------------------------------------------------------------------
// Base structs: valid calls (m 7, K 256, TP4-like heads 2/1/1/1, block_size
// 16), the pointers filled in by the layout step.
// ---------------------------------------------------------------------------
constexpr uintptr_t kPlaceholder = 0x100;  // non-NULL until laid out

template <class A>
void base_epilogue(A& a, int variant) {
  a.m = 7;
  a.nq = 2;
  a.nkv = 1;
  a.niq = 1;
  a.nik = 1;
  a.max_position = 64;
  a.eps = 1e-6f;
  a.block_size = 16;
  a.num_blocks = 4;
  a.num_index_blocks = 2;
  a.q_fp8_scale = 1.0f;
  a.k_scale = 0.5f;
  a.v_scale = 2.0f;
  a.use_pdl = 1;
  a.grid = 0;
  const auto ph = [](auto*& p) { p = reinterpret_cast<std::remove_reference_t<decltype(p)>>(kPlaceholder); };
  ph(a.positions), ph(a.cos_sin_cache), ph(a.q_norm_weight), ph(a.k_norm_weight), ph(a.index_q_norm_weight);
  ph(a.index_k_norm_weight), ph(a.slot_mapping), ph(a.index_slot_mapping), ph(a.kv_cache), ph(a.index_cache);
  ph(a.q_out), ph(a.q_fp8_out), ph(a.index_q_out), ph(a.error_flags);
  switch (variant & 3) {
    case 0:  // NVFP4 caches
    case 3:
      a.kv_page_stride = 2 * 1 * 16 * 72;
      a.index_page_stride = 16 * 72;
      break;
    case 1:  // FP8 KV as two [num_blocks, block_size, nkv, 128] tensors, FP8 index
      a.kv_cache_dtype = M3QKV_CACHE_FP8;
      a.index_cache_dtype = M3QKV_CACHE_FP8;
      a.kv_head_stride = 128;
      a.kv_token_stride = 128;
      a.kv_page_stride = 16 * 128;
      a.index_page_stride = 16 * 128;
      ph(a.v_cache);
      break;
    case 2:  // BF16 KV in one [num_blocks, 2, nkv, block_size, 128] allocation, BF16 index
      a.kv_cache_dtype = M3QKV_CACHE_BF16;
      a.index_cache_dtype = M3QKV_CACHE_BF16;
      a.kv_head_stride = 16 * 256;
      a.kv_token_stride = 256;
      a.kv_page_stride = 2 * 16 * 256;
      a.index_page_stride = 16 * 256;
      ph(a.v_cache);
      break;
  }
}

void make_base(m3qkv_fused_args* a, int variant) {
  std::memset(a, 0, sizeof(*a));
  a->struct_size = sizeof(*a);
  base_epilogue(*a, variant);
  a->k = 256;
  if ((variant & 3) == 3) {
    a->x_bf16 = reinterpret_cast<const void*>(kPlaceholder);
  } else {
    a->xq = reinterpret_cast<const void*>(kPlaceholder);
    a->xsf = reinterpret_cast<const void*>(kPlaceholder);
  }
  a->wq = a->wsf = reinterpret_cast<const void*>(kPlaceholder);
}
void make_base(m3qkv_insert_args* a, int variant) {
  std::memset(a, 0, sizeof(*a));
  a->struct_size = sizeof(*a);
  base_epilogue(*a, variant);
  a->qkv = reinterpret_cast<const void*>(kPlaceholder);
}
void make_base(m3qkv_gemm_args* a, int variant) {
  std::memset(a, 0, sizeof(*a));
  a->struct_size = sizeof(*a);
  a->m = 7;
  a->n = 640;
  a->k = 256;
  if ((variant & 3) == 3) {
    a->x_bf16 = reinterpret_cast<const void*>(kPlaceholder);
  } else {
    a->xq = a->xsf = reinterpret_cast<const void*>(kPlaceholder);
  }
  a->wq = a->wsf = reinterpret_cast<const void*>(kPlaceholder);
  a->out = reinterpret_cast<void*>(kPlaceholder);
}
void make_base(m3qkv_quantize_args* a, int) {
  std::memset(a, 0, sizeof(*a));
  a->struct_size = sizeof(*a);
  a->m = 7;
  a->k = 256;
  a->x = reinterpret_cast<const void*>(kPlaceholder);
  a->xq = a->xsf = reinterpret_cast<void*>(kPlaceholder);
  a->use_pdl = 1;
}

// Shape-derived values: the page and row sizes of the current struct, the
// deltas that make buffers interleave or just touch.
template <class A>
int derived(const A& a, int64_t* out) {
  int n = 0;
  const auto i64 = [&](size_t off) { return get<int64_t>(&a, off); };
  out[n++] = i64(offsetof(A, m));
  if constexpr (std::is_same_v<A, m3qkv_fused_args> || std::is_same_v<A, m3qkv_insert_args>) {
    // Wrapping products (the fields may hold anything by now).
    const uint64_t nkv = static_cast<uint64_t>(int64_t{a.nkv}), bs = static_cast<uint64_t>(int64_t{a.block_size});
    const uint64_t e = a.kv_cache_dtype == M3QKV_CACHE_BF16 ? 2 : 1;
    const uint64_t ie = a.index_cache_dtype == M3QKV_CACHE_BF16 ? 2 : 1;
    const auto s = [](uint64_t v) { return static_cast<int64_t>(v); };
    out[n++] = s(2 * nkv * bs * 72);
    out[n++] = s(bs * 72);
    out[n++] = s(bs * 128 * ie);
    out[n++] = s(128 * e);
    out[n++] = s(nkv * 128 * e);
    out[n++] = s(bs * 128 * e);
    out[n++] = s(bs * nkv * 128 * e);
    out[n++] = s(2 * bs * nkv * 128 * e);
    out[n++] = a.kv_page_stride;
    out[n++] = a.kv_page_stride / 2;
    out[n++] = a.kv_token_stride;
    out[n++] = a.kv_head_stride;
    out[n++] = a.index_page_stride;
    out[n++] = s(static_cast<uint64_t>(int64_t{a.nq}) * 256);
    // Cache hulls: a pointer there lands in (or just past) the last page.
    const uint64_t nb = static_cast<uint64_t>(a.num_blocks), nib = static_cast<uint64_t>(a.num_index_blocks);
    out[n++] = s(nb * static_cast<uint64_t>(a.kv_page_stride));
    out[n++] = s((nb - 1) * static_cast<uint64_t>(a.kv_page_stride));
    out[n++] = s(nib * static_cast<uint64_t>(a.index_page_stride));
    out[n++] = s((nib - 1) * static_cast<uint64_t>(a.index_page_stride));
    out[n++] = s(static_cast<uint64_t>(a.m) * static_cast<uint64_t>(int64_t{a.nq}) * 128);
  } else if constexpr (std::is_same_v<A, m3qkv_gemm_args>) {
    out[n++] = a.n;
    out[n++] = a.k;
  } else {
    out[n++] = a.k;
  }
  return n;
}

// ---------------------------------------------------------------------------
// Mutation of one field.
// ---------------------------------------------------------------------------
// A pointer set relative to another one (or to its own laid-out place),
// resolved after the layout step.
struct Rel {
  size_t field, other;
  int64_t delta;
};
struct Rels {
  static constexpr int kMax = 16;
  Rel r[kMax];
  int n = 0;
};

template <class A>
void mutate(A* a, const Field* fields, size_t nf, const Field& f, const size_t* sizes, FuzzedDataProvider& fdp,
            bool* pinned, Rels* rels) {
  const uint8_t mode = fdp.ConsumeIntegral<uint8_t>();
  int64_t der[32];
  const int nd = derived(*a, der);
  switch (f.kind) {
    case kSize: {
      const size_t s = sizes[fdp.ConsumeIntegralInRange<int>(0, 2)];
      static constexpr int64_t kDelta[] = {0, 0, 0, 1, -1, 8, -8, 16, -16, 4};
      size_t v;
      switch (mode % 4) {
        case 0: v = s; break;
        case 1: v = s + static_cast<size_t>(kDelta[fdp.ConsumeIntegralInRange<int>(0, 9)]); break;
        case 2: v = fdp.PickValueInArray<size_t>({0, 1, 8, 16, 1000, 4096, SIZE_MAX, SIZE_MAX / 2}); break;
        default: v = fdp.ConsumeIntegral<size_t>(); break;
      }
      put<size_t>(a, f.off, v);
      break;
    }
    case kI64:
    case kI32: {
      const bool wide = f.kind == kI64;
      const int64_t cur = wide ? get<int64_t>(a, f.off) : get<int32_t>(a, f.off);
      int64_t v = cur;
      const int8_t small = fdp.ConsumeIntegral<int8_t>();
      static constexpr int64_t kMul[] = {1, 4, 16, 32, 72, 128, 256, 1152};
      switch (mode % 8) {
        case 0:
        case 1:
        case 2:
          v = wide ? fdp.PickValueInArray(kI64Pool) : fdp.PickValueInArray(kI32Pool);
          break;
        case 3: v = int64_t{small} * kMul[fdp.ConsumeIntegralInRange<int>(0, 7)]; break;
        case 4: v = static_cast<int64_t>(static_cast<uint64_t>(cur) + static_cast<uint64_t>(int64_t{small} * 16)); break;
        case 5: v = static_cast<int64_t>(static_cast<uint64_t>(cur) + static_cast<uint64_t>(int64_t{small})); break;
        case 6: v = wide ? fdp.ConsumeIntegral<int64_t>() : fdp.ConsumeIntegral<int32_t>(); break;
        default: {
          const int64_t d = der[fdp.ConsumeIntegralInRange<int>(0, nd - 1)];
          v = static_cast<int64_t>(static_cast<uint64_t>(d) * static_cast<uint64_t>(fdp.ConsumeIntegralInRange<int>(1, 3)) +
                                   static_cast<uint64_t>(int64_t{small % 3} * 16));
          break;
        }
      }
      if (wide) put<int64_t>(a, f.off, v);
      else put<int32_t>(a, f.off, static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(v))));
      break;
    }
    case kF32: {
      float v;
      switch (mode % 4) {
        case 0:
        case 1: v = fdp.PickValueInArray(kF32Pool); break;
        case 2: v = bits(fdp.ConsumeIntegral<uint32_t>()); break;
        default: {
          const float cur = get<float>(a, f.off);
          v = std::nextafter(cur, (mode & 8) ? std::numeric_limits<float>::infinity() : 0.0f);
          break;
        }
      }
      put<float>(a, f.off, v);
      break;
    }
    case kPtr: {
      uint64_t v = 0;
      switch (mode % 8) {
        case 0: v = 0; break;
        case 1:
        case 2: v = region(fdp.ConsumeIntegralInRange<int>(0, 4)) + static_cast<uint64_t>(int64_t{fdp.ConsumeIntegral<int16_t>()} * 16); break;
        case 3: v = region(fdp.ConsumeIntegralInRange<int>(0, 4)) + fdp.ConsumeIntegralInRange<uint64_t>(0, 4095); break;
        case 4:
        case 5: {  // another pointer plus a delta (aliasing, interleaving), once the pointers are laid out
          const size_t g = fdp.ConsumeIntegralInRange<size_t>(0, nf - 1);
          int64_t d = 0;
          switch (fdp.ConsumeIntegralInRange<int>(0, 3)) {
            case 0: d = int64_t{fdp.ConsumeIntegral<int8_t>()} * 16; break;
            case 1:
              d = static_cast<int64_t>(static_cast<uint64_t>(der[fdp.ConsumeIntegralInRange<int>(0, nd - 1)]) +
                                       static_cast<uint64_t>(int64_t{fdp.ConsumeIntegral<int8_t>()} * 16));
              break;
            case 2: d = static_cast<int64_t>(0 - static_cast<uint64_t>(der[fdp.ConsumeIntegralInRange<int>(0, nd - 1)])); break;
            default: d = fdp.ConsumeIntegralInRange<int64_t>(-64, 64); break;
          }
          if (rels->n < Rels::kMax) rels->r[rels->n++] = Rel{static_cast<size_t>(&f - fields), g, d};
          pinned[&f - fields] = true;
          return;
        }
        case 6: v = fdp.ConsumeIntegral<uint64_t>(); break;
        default:  // its own laid-out place plus a small delta
          if (rels->n < Rels::kMax)
            rels->r[rels->n++] = Rel{static_cast<size_t>(&f - fields), static_cast<size_t>(&f - fields),
                                     int64_t{fdp.ConsumeIntegral<int8_t>()} * 16};
          return;
      }
      put<uint64_t>(a, f.off, v);
      pinned[&f - fields] = true;
      break;
    }
  }
}

// Lays the non-NULL, not explicitly set pointers out back to back in region
// 0, each as large as the contract says for the current shape (the hull of
// its bytes), 16-B aligned, with gaps from `gap_mode`. A flat KV cache in
// variant 2 keeps V in the same allocation as K (page-interleaved).
size_t v_cache_index(const Field* fields, size_t nf) {
  for (size_t i = 0; i < nf; ++i)
    if (same(fields[i].name, "v_cache")) return i;
  return 0;
}

template <class A>
void layout(A* a, const Field* fields, size_t nf, const bool* pinned, int gap_mode, int variant,
            FuzzedDataProvider& fdp) {
  // The contract's sizes of the current shape, its 64-bit fields clamped to
  // ±2^40 (they may hold anything; the products stay far inside 128 bits).
  A c = *a;
  for (size_t i = 0; i < nf; ++i) {
    if (fields[i].kind != kI64) continue;
    const int64_t v = get<int64_t>(&c, fields[i].off), lim = int64_t{1} << 40;
    put<int64_t>(&c, fields[i].off, v > lim ? lim : v < -lim ? -lim : v);
  }
  O::Buffers bufs;
  O::buffers(c, &bufs);
  uint64_t cursor = region(0);
  uint64_t kv_base = 0, v_offset = 0;
  bool kv_set = false, interleave = false;
  if constexpr (std::is_same_v<A, m3qkv_fused_args> || std::is_same_v<A, m3qkv_insert_args>) {
    interleave = (variant & 3) == 2 && a->v_cache != nullptr && !pinned[v_cache_index(fields, nf)];
    v_offset = static_cast<uint64_t>(a->kv_page_stride) / 2 / 16 * 16;
  }
  for (size_t i = 0; i < nf; ++i) {
    const Field& f = fields[i];
    if (f.kind != kPtr || pinned[i] || get<uint64_t>(a, f.off) == 0) continue;
    const bool is_kv = same(f.name, "kv_cache");
    if (interleave && kv_set && same(f.name, "v_cache")) {
      put<uint64_t>(a, f.off, kv_base + v_offset);  // [num_blocks, 2, ...]: V half a page after K
      continue;
    }
    uint64_t bytes = 256;  // a field the call does not use
    for (int b = 0; b < bufs.n; ++b) {
      if (!same(bufs.b[b].name, f.name)) continue;
      const i128 h = bufs.b[b].hi() - bufs.b[b].lo();
      bytes = h <= 0 ? 16 : h > (i128{1} << 62) ? (uint64_t{1} << 62) : static_cast<uint64_t>(h);
    }
    if (is_kv && interleave) bytes += v_offset;  // room for V's last page too
    int64_t gap = 0;
    switch (gap_mode) {
      case 0: gap = 0; break;
      case 1: gap = 16; break;
      case 2: gap = 4096; break;
      default: gap = fdp.PickValueInArray<int64_t>({-32, -16, 0, 0, 0, 16, 64}); break;
    }
    put<uint64_t>(a, f.off, cursor);
    if (is_kv) kv_base = cursor, kv_set = true;
    cursor = (cursor + bytes + 15) / 16 * 16 + static_cast<uint64_t>(gap);
  }
}

// ---------------------------------------------------------------------------
// Checks.
// ---------------------------------------------------------------------------
bool is_ident(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'; }
bool names_word(const char* msg, const char* word) {
  const size_t n = std::strlen(word);
  for (const char* p = std::strstr(msg, word); p != nullptr; p = std::strstr(p + 1, word)) {
    const bool before = p == msg || !is_ident(p[-1]);
    const bool after = !is_ident(p[n]);
    if (before && after) return true;
  }
  return false;
}

struct Stats {
  unsigned long long runs = 0, accepted = 0, noop = 0, by_status[16] = {};
  ~Stats() {
    const char* quiet = std::getenv("M3QKV_FUZZ_QUIET");
    if (runs == 0 || (quiet != nullptr && quiet[0] != '\0')) return;
    std::fprintf(stderr, "fuzz_validate: %llu calls: %llu accepted (%llu with m = 0)", runs, accepted, noop);
    for (int s = 1; s < 16; ++s)
      if (by_status[s]) std::fprintf(stderr, ", status %d: %llu", s, by_status[s]);
    std::fprintf(stderr, "\n");
  }
};
Stats g_stats;

// The contract's buffers of a failing call, for the report.
void dump(const O::Buffers& bufs) {
  for (int i = 0; i < bufs.n; ++i) {
    const O::Pattern& p = bufs.b[i];
    std::fprintf(stderr, "  %-20s %s base 0x%llx width %llu", p.name, p.written ? "w" : "r",
                 static_cast<unsigned long long>(p.base), static_cast<unsigned long long>(p.width));
    for (int d = 0; d < p.ndims; ++d)
      std::fprintf(stderr, " [stride %lld x %lld]", static_cast<long long>(p.dims[d].stride),
                   static_cast<long long>(p.dims[d].extent));
    std::fprintf(stderr, "\n");
  }
}

bool extents_match(const O::Buffers& bufs, const m3qkv::api::Extents& x, char* why, size_t cap) {
  if (x.count != bufs.n) {
    std::snprintf(why, cap, "extents list %d buffers, the contract %d", x.count, bufs.n);
    return false;
  }
  for (int i = 0; i < bufs.n; ++i) {
    const O::Pattern& p = bufs.b[i];
    const m3qkv::api::Extent* e = nullptr;
    for (int j = 0; j < x.count; ++j)
      if (same(x.items[j].name, p.name)) e = &x.items[j];
    if (e == nullptr) {
      std::snprintf(why, cap, "no extent for %s", p.name);
      return false;
    }
    bool ok = e->lo == static_cast<uint64_t>(p.base) && e->written == p.written;
    if (p.ndims == 0) {
      ok = ok && e->count == 1 && static_cast<i128>(e->span) == p.width;
    } else if (p.ndims == 3) {
      // A flat KV cache page by page (each page the hull of its rows) when
      // its pages do not interleave, else the hull of all its rows.
      const i128 page = p.width + (p.dims[0].extent - 1) * p.dims[0].stride + (p.dims[1].extent - 1) * p.dims[1].stride;
      const O::Dim& pg = p.dims[2];
      if (pg.extent > 1 && pg.stride >= page)
        ok = ok && static_cast<i128>(e->span) == page && static_cast<i128>(e->period) == pg.stride &&
             static_cast<i128>(e->count) == pg.extent;
      else
        ok = ok && e->count == 1 && static_cast<i128>(e->span) == p.hi() - p.lo();
    } else {
      ok = ok && static_cast<i128>(e->span) == p.width && static_cast<i128>(e->period) == p.dims[0].stride &&
           static_cast<i128>(e->count) == p.dims[0].extent;
    }
    if (!ok) {
      std::snprintf(why, cap, "%s: extent lo 0x%llx span %llu period %llu count %llu; contract base 0x%llx width %llu",
                    p.name, static_cast<unsigned long long>(e->lo), static_cast<unsigned long long>(e->span),
                    static_cast<unsigned long long>(e->period), static_cast<unsigned long long>(e->count),
                    static_cast<unsigned long long>(p.base), static_cast<unsigned long long>(p.width));
      return false;
    }
  }
  return true;
}

m3qkv_status extents_of(const m3qkv_fused_args& a, m3qkv::api::Extents* x) { return m3qkv::api::fused_extents("f", a, x); }
m3qkv_status extents_of(const m3qkv_insert_args& a, m3qkv::api::Extents* x) { return m3qkv::api::insert_extents("f", a, x); }
m3qkv_status extents_of(const m3qkv_gemm_args& a, m3qkv::api::Extents* x) { return m3qkv::api::gemm_extents("f", a, x); }
m3qkv_status extents_of(const m3qkv_quantize_args& a, m3qkv::api::Extents* x) { return m3qkv::api::quantize_extents("f", a, x); }

template <class A>
void run(FuzzedDataProvider& fdp, int variant, bool relayout, int gap_mode, const Field* fields, size_t nf,
         const size_t* sizes, const char* fn, m3qkv_status (*validate)(const A*, A*, bool*)) {
  A a;
  make_base(&a, variant);
  bool pinned[64] = {};
  Rels rels;
  // Mutations: (field, mode, value bytes) until the input runs out (or 64).
  for (int i = 0; i < 64 && fdp.remaining_bytes() > 0; ++i) {
    const Field& f = fields[fdp.ConsumeIntegralInRange<size_t>(0, nf - 1)];
    mutate(&a, fields, nf, f, sizes, fdp, pinned, &rels);
  }
  if (relayout) {
    layout(&a, fields, nf, pinned, gap_mode, variant, fdp);
  } else {  // the placeholders become region-0 pointers 4 KiB apart
    for (size_t i = 0; i < nf; ++i)
      if (fields[i].kind == kPtr && get<uint64_t>(&a, fields[i].off) == kPlaceholder)
        put<uint64_t>(&a, fields[i].off, region(0) + i * 4096);
  }
  for (int i = 0; i < rels.n; ++i) {
    const Rel& r = rels.r[i];
    const uint64_t other = fields[r.other].kind == kPtr ? get<uint64_t>(&a, fields[r.other].off) : region(0);
    put<uint64_t>(&a, fields[r.field].off, other + static_cast<uint64_t>(r.delta));
  }

  // The caller's struct in a heap block of exactly its struct_size bytes
  // (at least the size field; at most sizeof: a larger struct_size must be
  // refused before anything past it is read).
  const size_t claimed = a.struct_size;
  const size_t block = claimed < sizeof(size_t) ? sizeof(size_t) : claimed > sizeof(A) ? sizeof(A) : claimed;
  char* mem = static_cast<char*>(std::malloc(block));
  std::memcpy(mem, &a, block);
  const A* in = reinterpret_cast<const A*>(mem);

  A out;
  std::memset(&out, 0xA5, sizeof(out));
  bool noop = true;
  m3qkv::clear_error();
  const m3qkv_status st = validate(in, &out, &noop);
  const char* msg = m3qkv::last_error_message();
  ++g_stats.runs;
  ++g_stats.by_status[static_cast<unsigned>(st) & 15u];

  const bool released = claimed == sizes[0] || claimed == sizes[1] || claimed == sizes[2];
  if (!released && st != M3QKV_ERROR_STRUCT_SIZE) die(fn, "accepted a struct_size that is not a released size");
  if (released && st == M3QKV_ERROR_STRUCT_SIZE) die(fn, "refused a released struct_size");

  if (st != M3QKV_SUCCESS) {
    if (st != M3QKV_ERROR_INVALID_ARGUMENT && st != M3QKV_ERROR_MISALIGNED && st != M3QKV_ERROR_NULL_POINTER &&
        st != M3QKV_ERROR_STRUCT_SIZE && st != M3QKV_ERROR_INVALID_SHAPE && st != M3QKV_ERROR_TOO_LARGE)
      die(fn, msg);
    if (noop) die(fn, "a rejection set *noop");
    const size_t fl = std::strlen(fn);
    if (std::strncmp(msg, fn, fl) != 0 || msg[fl] != ':' || msg[fl + 1] != ' ')
      die("a rejection message does not start with its entry point:", msg);
    bool named = false;
    for (size_t i = 0; i < nf && !named; ++i) named = names_word(msg + fl, fields[i].name);
    if (!named) die("a rejection message names no argument:", msg);
    std::free(mem);
    return;
  }
  ++g_stats.accepted;
  if (msg[0] != '\0') die("an accepted call left a message:", msg);
  // The copy: struct_size = sizeof, the caller's bytes, zeros past them.
  if (out.struct_size != sizeof(A)) die(fn, "the validated copy's struct_size is not sizeof");
  if (std::memcmp(reinterpret_cast<const char*>(&out) + sizeof(size_t), mem + sizeof(size_t),
                  claimed - sizeof(size_t)) != 0)
    die(fn, "the validated copy differs from the caller's bytes");
  for (size_t i = claimed; i < sizeof(A); ++i)
    if (reinterpret_cast<const char*>(&out)[i] != 0) die(fn, "a field past the caller's struct_size is not 0");
  std::free(mem);
  if (noop != (out.m == 0)) die(fn, "*noop is not m == 0");
  if (noop) {
    ++g_stats.noop;
    return;
  }
  // Extents build and match the contract's sizes; the oracle finds no shared byte.
  m3qkv::api::Extents x;
  if (extents_of(out, &x) != M3QKV_SUCCESS) die("the extents of an accepted call cannot be built:", m3qkv::last_error_message());
  O::Buffers bufs;
  O::buffers(out, &bufs);
  char why[512];
  if (!extents_match(bufs, x, why, sizeof(why))) dump(bufs), die("extents differ from the contract's sizes:", why);
  bool undecided = false;
  const O::Violation v = O::first_violation(bufs, &undecided);
  if (undecided) dump(bufs), die(fn, "the oracle ran out of budget on an accepted call");
  if (v.a != nullptr) {
    std::snprintf(why, sizeof(why), "%s [0x%llx, 0x%llx) and %s", v.a->name, static_cast<unsigned long long>(v.a->lo()),
                  static_cast<unsigned long long>(v.a->hi()), v.b->name);
    dump(bufs);
    die("an accepted call has buffers that share a byte (or wrap):", why);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  m3qkv::host::testing_install_cuda(&g_poison);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider fdp(data, size);
  // Header: entry point (2 bits), base variant (2), relayout off (1), gap mode (2).
  const uint8_t h = fdp.ConsumeIntegral<uint8_t>();
  const int entry = h & 3, variant = (h >> 2) & 3, gap_mode = (h >> 5) & 3;
  const bool relayout = ((h >> 4) & 1) == 0;
  switch (entry) {
    case 0:
      run<m3qkv_fused_args>(fdp, variant, relayout, gap_mode, kFusedFields, std::size(kFusedFields), kFusedSizes,
                            "m3qkv_fused_qkv", &m3qkv::validate_fused);
      break;
    case 1:
      run<m3qkv_insert_args>(fdp, variant, relayout, gap_mode, kInsertFields, std::size(kInsertFields), kInsertSizes,
                             "m3qkv_qknorm_rope_kv_insert", &m3qkv::validate_insert);
      break;
    case 2:
      run<m3qkv_gemm_args>(fdp, variant, relayout, gap_mode, kGemmFields, std::size(kGemmFields), kGemmSizes,
                           "m3qkv_mxfp8_gemm", &m3qkv::validate_gemm);
      break;
    default:
      run<m3qkv_quantize_args>(fdp, variant, relayout, gap_mode, kQuantizeFields, std::size(kQuantizeFields),
                               kQuantizeSizes, "m3qkv_mxfp8_quantize", &m3qkv::validate_quantize);
      break;
  }
  return 0;
}
