// Validation of the C API (docs/contract.md §2, §5.2, §7.2): every rule has a test that the bad
// value is rejected with its status and a message naming the argument and its
// value; fully valid argument structs pass.
//
// Safety on GPU machines: these tests use fake device pointers (well-aligned
// integers, never dereferenced). A public entry point is only called with
// arguments that validate_* has already rejected (rejections launch nothing),
// or with m == 0 (a no-op), or — for the "no device" checks — only when the
// process sees no CUDA device.
#include <gtest/gtest.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "api/internal.h"
#include "api/extents.h"
#include "api/validate.h"
#include "m3qkv/m3qkv.h"
#include "validation_cases.h"

namespace {

using namespace m3qkv_validation;
using m3qkv_valid_args::valid_fused;
using m3qkv_valid_args::valid_gemm;
using m3qkv_valid_args::valid_insert;
using m3qkv_valid_args::valid_quantize;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

bool process_sees_a_gpu() {
  int count = 0;
  const bool gpu = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  (void)cudaGetLastError();
  return gpu;
}

// Float rules: each bad value of `field` (a member pointer) gives kArg with "<field> = <value>".
template <class A>
std::vector<Case<A>> bad_floats(const char* field, float A::*member, bool zero_ok) {
  std::vector<Case<A>> out;
  struct Bad {
    const char* tag;
    float v;
    const char* text;
  };
  std::vector<Bad> bads = {{"negative", -0.5f, "-0.5"}, {"nan", kNaN, "nan"}, {"inf", kInf, "inf"},
                           {"minus_inf", -kInf, "-inf"}};
  if (!zero_ok) bads.push_back({"zero", 0.0f, "= 0 "});
  for (const Bad& b : bads) {
    const float v = b.v;
    std::string needle = std::string(field) + " = " + (b.text[0] == '=' ? "0 " : b.text);
    out.push_back({std::string(field) + "_" + b.tag, [member, v](A& a) { a.*member = v; }, kArg, {needle}});
  }
  return out;
}

// Pointer rules: NULL -> kNull "<field> = NULL"; +offset -> kAlign "<field> = 0x..." "<align>-byte".
template <class A, class P>
std::vector<Case<A>> bad_pointer(const char* field, P A::*member, bool required, uintptr_t offset, int align) {
  std::vector<Case<A>> out;
  if (required) {
    out.push_back({std::string(field) + "_null", [member](A& a) { a.*member = nullptr; }, kNull,
                   {std::string(field) + " = NULL"}});
  }
  A probe = Api<A>::valid();
  const void* bad = reinterpret_cast<const char*>(probe.*member) + offset;
  out.push_back({std::string(field) + "_misaligned_by_" + std::to_string(offset),
                 [member, offset](A& a) {
                   a.*member = reinterpret_cast<P>(reinterpret_cast<uintptr_t>(a.*member) + offset);
                 },
                 kAlign,
                 {std::string(field) + " = " + hex(bad), std::to_string(align) + "-byte aligned"}});
  return out;
}

template <class A>
std::vector<Case<A>> struct_size_cases() {
  const size_t s = sizeof(A);
  return {
      {"struct_size_zero", [](A& a) { a.struct_size = 0; }, kSize, {"struct_size = 0", std::to_string(s)}},
      // s - 4: no release has it (s - 8 is 0.2's size of the fused and 0.1's of the gemm struct).
      {"struct_size_smaller", [s](A& a) { a.struct_size = s - 4; }, kSize, {"struct_size = " + std::to_string(s - 4)}},
      {"struct_size_larger", [s](A& a) { a.struct_size = s + 8; }, kSize, {"struct_size = " + std::to_string(s + 8)}},
  };
}

template <class A>
std::vector<Case<A>> m_cases() {
  return {
      {"m_negative", [](A& a) { a.m = -1; }, kShape, {"m = -1", ">= 0"}},
      {"m_min_int64", [](A& a) { a.m = INT64_MIN; }, kShape, {"m = " + std::to_string(INT64_MIN)}},
      {"m_2pow31", [](A& a) { a.m = int64_t{1} << 31; }, kLarge, {"m = 2147483648"}},
  };
}

template <class A>
std::vector<Case<A>> k_cases() {
  return {
      {"k_zero", [](A& a) { a.k = 0; }, kShape, {"k = 0", "> 0"}},
      {"k_negative", [](A& a) { a.k = -128; }, kShape, {"k = -128"}},
      {"k_not_multiple_of_128", [](A& a) { a.k = 100; }, kShape, {"k = 100 is not a multiple of 128"}},
      {"k_64", [](A& a) { a.k = 64; }, kShape, {"k = 64 is not a multiple of 128"}},
      {"k_over_2pow20", [](A& a) { a.k = (int64_t{1} << 20) + 128; }, kLarge, {"k = 1048704"}},
  };
}

template <class A>
std::vector<Case<A>> use_pdl_grid_cases() {
  return {
      {"use_pdl_2", [](A& a) { a.use_pdl = 2; }, kArg, {"use_pdl = 2"}},
      {"use_pdl_negative", [](A& a) { a.use_pdl = -1; }, kArg, {"use_pdl = -1"}},
      {"grid_negative", [](A& a) { a.grid = -1; }, kArg, {"grid = -1"}},
  };
}

// eps and the dequantization scales (docs/contract.md §5.2): eps > 0, since an all-zero
// head row would give rsqrt(0) = inf and NaN; a scale whose f32 reciprocal is
// not a finite normal number saturates or zeroes everything it scales.
template <class A>
std::vector<Case<A>> eps_and_scale_cases() {
  return {
      {"eps_zero_says_why", [](A& a) { a.eps = 0.0f; }, kArg, {"eps = 0 must be finite and > 0", "rsqrt(0) = inf"}},
      {"eps_minus_zero", [](A& a) { a.eps = -0.0f; }, kArg, {"eps = -0 must be"}},
      {"k_scale_subnormal_reciprocal_inf", [](A& a) { a.k_scale = 1e-40f; }, kArg,
       {"k_scale = 9.9999461e-41", "RN(1/k_scale) = inf", "not a finite normal f32"}},
      {"v_scale_1e38_reciprocal_subnormal", [](A& a) { a.v_scale = 1e38f; }, kArg,
       {"v_scale = 9.99999968e+37", "RN(1/v_scale) = 1.00000", "not a finite normal f32"}},
      {"v_scale_just_above_range", [](A& a) { a.v_scale = 8.6e37f; }, kArg, {"RN(1/v_scale)"}},
      {"k_scale_just_below_range", [](A& a) { a.k_scale = 2.9e-39f; }, kArg, {"RN(1/k_scale) = inf"}},
      {"q_fp8_scale_1e_minus_45", [](A& a) { a.q_fp8_scale = 1e-45f; }, kArg, {"q_fp8_scale = 1.40129846e-45", "RN(1/q_fp8_scale)"}},
  };
}

// Every pointer field of a struct, by name, with whether the call writes it.
template <class A>
struct PtrField {
  const char* name;
  bool written;
  std::function<uintptr_t(const A&)> get;
  std::function<void(A&, uintptr_t)> set;
};
#define M3QKV_PTR_FIELD(A, field, written)                                                           \
  PtrField<A> {                                                                                      \
    #field, written, [](const A& a) { return reinterpret_cast<uintptr_t>(a.field); },               \
        [](A& a, uintptr_t v) { a.field = reinterpret_cast<decltype(a.field)>(v); }                   \
  }

template <class A>
std::vector<PtrField<A>> epilogue_pointers() {
  return {
      M3QKV_PTR_FIELD(A, positions, false),       M3QKV_PTR_FIELD(A, cos_sin_cache, false),
      M3QKV_PTR_FIELD(A, q_norm_weight, false),   M3QKV_PTR_FIELD(A, k_norm_weight, false),
      M3QKV_PTR_FIELD(A, index_q_norm_weight, false), M3QKV_PTR_FIELD(A, index_k_norm_weight, false),
      M3QKV_PTR_FIELD(A, slot_mapping, false),    M3QKV_PTR_FIELD(A, index_slot_mapping, false),
      M3QKV_PTR_FIELD(A, kv_cache, true),         M3QKV_PTR_FIELD(A, index_cache, true),
      M3QKV_PTR_FIELD(A, q_out, true),            M3QKV_PTR_FIELD(A, q_fp8_out, true),
      M3QKV_PTR_FIELD(A, index_q_out, true),      M3QKV_PTR_FIELD(A, error_flags, true),
  };
}
template <class A>
std::vector<PtrField<A>> gemm_operand_pointers() {
  return {M3QKV_PTR_FIELD(A, xq, false), M3QKV_PTR_FIELD(A, xsf, false), M3QKV_PTR_FIELD(A, wq, false),
          M3QKV_PTR_FIELD(A, wsf, false)};
}

// For every written buffer W and every other buffer B of the call: B placed
// at W's address is rejected naming both; also B starting in W's last byte
// range (inside, not at the start), when B may be placed there aligned.
template <class A>
std::vector<Case<A>> overlap_cases(const std::vector<PtrField<A>>& fields) {
  std::vector<Case<A>> out;
  for (const PtrField<A>& w : fields) {
    if (!w.written) continue;
    for (const PtrField<A>& b : fields) {
      if (b.name == w.name) continue;
      const auto wg = w.get, bs = b.set;
      out.push_back({std::string(b.name) + "_at_" + w.name, [wg, bs](A& a) { bs(a, wg(a)); }, kArg,
                     {std::string(" ") + w.name + " [0x", std::string(" ") + b.name + " [0x", "overlaps"}});
    }
  }
  return out;
}

// Rules of the epilogue fields, shared by m3qkv_fused_args and m3qkv_insert_args.
template <class A>
std::vector<Case<A>> epilogue_cases() {
  std::vector<Case<A>> c = {
      // Head counts (docs/contract.md §2.1).
      {"nq_zero", [](A& a) { a.nq = 0; }, kShape, {"nq = 0", ">= 1"}},
      {"nq_negative", [](A& a) { a.nq = -16; }, kShape, {"nq = -16"}},
      {"nkv_zero", [](A& a) { a.nkv = 0; }, kShape, {"nkv = 0"}},
      {"nkv_negative", [](A& a) { a.nkv = -1; }, kShape, {"nkv = -1"}},
      {"nq_not_multiple_of_nkv", [](A& a) { a.nkv = 3; a.niq = 3; a.kv_page_stride = 6912; }, kShape,
       {"nq = 16 is not a multiple of nkv = 3"}},
      {"niq_not_nkv", [](A& a) { a.nkv = 2; a.niq = 1; a.kv_page_stride = 4608; }, kShape, {"niq = 1", "nkv = 2"}},
      {"niq_above_nkv", [](A& a) { a.niq = 2; }, kShape, {"niq = 2"}},
      {"niq_negative", [](A& a) { a.niq = -1; }, kShape, {"niq = -1"}},
      {"nik_2", [](A& a) { a.nik = 2; }, kShape, {"nik = 2", "0 or 1"}},
      {"nik_negative", [](A& a) { a.nik = -1; }, kShape, {"nik = -1"}},
      {"too_many_heads", [](A& a) { a.nq = 1 << 17; }, kLarge, {"N = ", "131072"}},
      // Paged caches (docs/contract.md §2.1, §4.2).
      {"block_size_zero", [](A& a) { a.block_size = 0; }, kShape, {"block_size = 0"}},
      {"block_size_negative", [](A& a) { a.block_size = -16; }, kShape, {"block_size = -16"}},
      {"block_size_not_multiple_of_4", [](A& a) { a.block_size = 6; }, kShape,
       {"block_size = 6 is not a multiple of 4"}},
      {"kv_page_stride_not_multiple_of_32", [](A& a) { a.kv_page_stride = 2304 + 16; }, kShape,
       {"kv_page_stride = 2320 is not a multiple of 32"}},
      {"kv_page_stride_below_packed_page", [](A& a) { a.kv_page_stride = 2304 - 32; }, kShape,
       {"kv_page_stride = 2272", "2304"}},
      {"kv_page_stride_below_page_of_block_size_64", [](A& a) { a.block_size = 64; }, kShape,
       {"kv_page_stride = 2304", "9216"}},
      {"kv_page_stride_below_page_of_nkv_2", [](A& a) { a.nq = 32; a.nkv = 2; a.niq = 2; }, kShape,
       {"kv_page_stride = 2304", "4608"}},
      {"kv_page_stride_zero", [](A& a) { a.kv_page_stride = 0; }, kShape, {"kv_page_stride = 0"}},
      {"kv_page_stride_negative", [](A& a) { a.kv_page_stride = -2304; }, kShape, {"kv_page_stride = -2304"}},
      {"num_blocks_zero", [](A& a) { a.num_blocks = 0; }, kShape, {"num_blocks = 0", ">= 1"}},
      {"num_blocks_negative", [](A& a) { a.num_blocks = -3; }, kShape, {"num_blocks = -3"}},
      {"kv_cache_bytes_overflow", [](A& a) { a.num_blocks = INT64_MAX / 1000; }, kLarge,
       {"num_blocks*kv_page_stride", std::to_string(INT64_MAX / 1000)}},
      {"index_page_stride_not_multiple_of_32", [](A& a) { a.index_page_stride = 1152 + 8; }, kShape,
       {"index_page_stride = 1160 is not a multiple of 32"}},
      {"index_page_stride_below_packed_page", [](A& a) { a.index_page_stride = 1152 - 32; }, kShape,
       {"index_page_stride = 1120", "1152"}},
      {"index_page_stride_zero", [](A& a) { a.index_page_stride = 0; }, kShape, {"index_page_stride = 0"}},
      {"num_index_blocks_zero", [](A& a) { a.num_index_blocks = 0; }, kShape, {"num_index_blocks = 0"}},
      {"index_cache_bytes_overflow", [](A& a) { a.num_index_blocks = INT64_MAX / 1000; }, kLarge,
       {"num_index_blocks*index_page_stride"}},
      {"max_position_zero", [](A& a) { a.max_position = 0; }, kShape, {"max_position = 0", ">= 1"}},
      {"max_position_negative", [](A& a) { a.max_position = -5; }, kShape, {"max_position = -5"}},
      {"max_position_overflow", [](A& a) { a.max_position = INT64_MAX / 64; }, kLarge,
       {"max_position", std::to_string(INT64_MAX / 64)}},
      // q outputs.
      {"no_q_output", [](A& a) { a.q_out = nullptr; a.q_fp8_out = nullptr; }, kArg,
       {"q_out = NULL", "q_fp8_out = NULL", "at least one"}},
  };
  c = concat(c, m_cases<A>());
  c = concat(c, use_pdl_grid_cases<A>());
  c = concat(c, struct_size_cases<A>());
  c = concat(c, bad_floats<A>("eps", &A::eps, /*zero_ok=*/false));
  c = concat(c, eps_and_scale_cases<A>());
  c = concat(c, bad_floats<A>("q_fp8_scale", &A::q_fp8_scale, false));
  c = concat(c, bad_floats<A>("k_scale", &A::k_scale, false));
  c = concat(c, bad_floats<A>("v_scale", &A::v_scale, false));
  c = concat(c, bad_pointer<A>("positions", &A::positions, true, 4, 8));
  c = concat(c, bad_pointer<A>("cos_sin_cache", &A::cos_sin_cache, true, 8, 16));
  c = concat(c, bad_pointer<A>("q_norm_weight", &A::q_norm_weight, true, 2, 16));
  c = concat(c, bad_pointer<A>("k_norm_weight", &A::k_norm_weight, true, 8, 16));
  c = concat(c, bad_pointer<A>("index_q_norm_weight", &A::index_q_norm_weight, true, 8, 16));
  c = concat(c, bad_pointer<A>("index_k_norm_weight", &A::index_k_norm_weight, true, 4, 16));
  c = concat(c, bad_pointer<A>("slot_mapping", &A::slot_mapping, true, 4, 8));
  c = concat(c, bad_pointer<A>("index_slot_mapping", &A::index_slot_mapping, true, 1, 8));
  c = concat(c, bad_pointer<A>("kv_cache", &A::kv_cache, true, 3, 16));
  c = concat(c, bad_pointer<A>("index_cache", &A::index_cache, true, 8, 16));
  c = concat(c, bad_pointer<A>("q_out", &A::q_out, false, 8, 16));
  c = concat(c, bad_pointer<A>("q_fp8_out", &A::q_fp8_out, false, 1, 16));
  c = concat(c, bad_pointer<A>("index_q_out", &A::index_q_out, true, 8, 16));
  c = concat(c, bad_pointer<A>("error_flags", &A::error_flags, false, 2, 4));
  return c;
}

template <class A>
std::vector<Case<A>> gemm_operand_cases() {
  std::vector<Case<A>> c;
  c = concat(c, bad_pointer<A>("xq", &A::xq, true, 8, 16));
  c = concat(c, bad_pointer<A>("xsf", &A::xsf, true, 4, 16));
  c = concat(c, bad_pointer<A>("wq", &A::wq, true, 1, 16));
  c = concat(c, bad_pointer<A>("wsf", &A::wsf, true, 8, 16));
  return c;
}

std::vector<Case<m3qkv_fused_args>> fused_cases() {
  using A = m3qkv_fused_args;
  std::vector<Case<A>> c = {
      {"cta_group_3", [](A& a) { a.cta_group = 3; }, kArg, {"cta_group = 3"}},
      {"cta_group_negative", [](A& a) { a.cta_group = -1; }, kArg, {"cta_group = -1"}},
      // Partial overlaps, as the call touches each buffer.
      {"q_out_inside_kv_cache", [](A& a) { a.q_out = static_cast<char*>(a.kv_cache) + 2304; }, kArg,
       {" q_out [0x", " kv_cache [0x"}},
      {"index_cache_meets_the_kv_pages_by_32_bytes",
       [](A& a) {
         a.kv_page_stride = 4096;
         a.index_page_stride = 4096;
         a.index_cache = static_cast<char*>(a.kv_cache) + 2304 - 32;
       },
       kArg, {" kv_cache [0x", " index_cache [0x"}},
      {"index_cache_interleaved_with_another_stride",
       [](A& a) {
         a.kv_page_stride = 4096;
         a.index_page_stride = 2048;
         a.index_cache = static_cast<char*>(a.kv_cache) + 2304;
       },
       kArg, {" kv_cache [0x", " index_cache [0x"}},
      {"xq_ends_inside_q_fp8_out", [](A& a) { a.xq = static_cast<char*>(a.q_fp8_out) - 7 * 6144 + 16; }, kArg,
       {" q_fp8_out [0x", " xq [0x"}},
      {"q_out_inside_an_fp8_v_cache",
       [](A& a) {
         a.kv_cache_dtype = M3QKV_CACHE_FP8;  // K rows of 128 B, 16 tokens per 2304-B page
         a.v_cache = fake(24);
         a.kv_head_stride = 128;
         a.kv_token_stride = 128;
         a.q_out = static_cast<char*>(a.v_cache) + 3 * 2304 + 128;  // the V rows of page 3
       },
       kArg, {" q_out [0x", " v_cache [0x"}},
      {"error_flags_in_the_last_kv_page", [](A& a) { a.error_flags = reinterpret_cast<uint32_t*>(static_cast<char*>(a.kv_cache) + 3 * 2304 + 2300); },
       kArg, {" error_flags [0x", " kv_cache [0x"}},
  };
  {
    std::vector<PtrField<A>> f = epilogue_pointers<A>();
    const std::vector<PtrField<A>> g = gemm_operand_pointers<A>();
    f.insert(f.end(), g.begin(), g.end());
    c = concat(c, overlap_cases<A>(f));
  }
  c = concat(c, epilogue_cases<A>());
  c = concat(c, k_cases<A>());
  c = concat(c, gemm_operand_cases<A>());
  return c;
}

std::vector<Case<m3qkv_insert_args>> insert_cases() {
  using A = m3qkv_insert_args;
  std::vector<PtrField<A>> f = epilogue_pointers<A>();
  f.push_back(M3QKV_PTR_FIELD(A, qkv, false));
  return concat(concat(epilogue_cases<A>(), bad_pointer<A>("qkv", &A::qkv, true, 8, 16)), overlap_cases<A>(f));
}

std::vector<Case<m3qkv_gemm_args>> gemm_cases() {
  using A = m3qkv_gemm_args;
  std::vector<Case<A>> c = {
      {"n_zero", [](A& a) { a.n = 0; }, kShape, {"n = 0", "> 0"}},
      {"n_negative", [](A& a) { a.n = -128; }, kShape, {"n = -128"}},
      {"n_not_multiple_of_128", [](A& a) { a.n = 2500; }, kShape, {"n = 2500 is not a multiple of 128"}},
      {"n_over_2pow24", [](A& a) { a.n = (int64_t{1} << 24) + 128; }, kLarge, {"n = 16777344"}},
  };
  c = concat(c, m_cases<A>());
  c = concat(c, k_cases<A>());
  c = concat(c, use_pdl_grid_cases<A>());
  c = concat(c, struct_size_cases<A>());
  c = concat(c, gemm_operand_cases<A>());
  c = concat(c, bad_pointer<A>("out", &A::out, true, 8, 16));
  std::vector<PtrField<A>> f = gemm_operand_pointers<A>();
  f.push_back(M3QKV_PTR_FIELD(A, out, true));
  c = concat(c, overlap_cases<A>(f));
  c.push_back({"out_ends_in_wq", [](A& a) { a.out = const_cast<char*>(static_cast<const char*>(a.wq)) - 7 * 2560 * 2 + 16; }, kArg,
               {" out [0x", " wq [0x"}});
  return c;
}

std::vector<Case<m3qkv_quantize_args>> quantize_cases() {
  using A = m3qkv_quantize_args;
  std::vector<Case<A>> c = {
      {"use_pdl_2", [](A& a) { a.use_pdl = 2; }, kArg, {"use_pdl = 2"}},
      {"use_pdl_negative", [](A& a) { a.use_pdl = -3; }, kArg, {"use_pdl = -3"}},
  };
  c = concat(c, m_cases<A>());
  c = concat(c, k_cases<A>());
  c = concat(c, struct_size_cases<A>());
  c = concat(c, bad_pointer<A>("x", &A::x, true, 8, 16));
  c = concat(c, bad_pointer<A>("xq", &A::xq, true, 4, 16));
  c = concat(c, bad_pointer<A>("xsf", &A::xsf, true, 1, 16));
  c = concat(c, overlap_cases<A>({M3QKV_PTR_FIELD(A, x, false), M3QKV_PTR_FIELD(A, xq, true),
                                  M3QKV_PTR_FIELD(A, xsf, true)}));
  // xsf is written whole, padding rows included (128 rows x 192 scale bytes at M 7).
  c.push_back({"x_in_the_padding_rows_of_xsf", [](A& a) { a.x = static_cast<char*>(a.xsf) + 128 * 192 - 16; }, kArg,
               {" xsf [0x", " x [0x"}});
  return c;
}

// ---------------------------------------------------------------------------
// One parameterized test per rule and entry point.
// ---------------------------------------------------------------------------
class FusedValidation : public testing::TestWithParam<Case<m3qkv_fused_args>> {};
TEST_P(FusedValidation, Rejects) { expect_rejected(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Rules, FusedValidation, testing::ValuesIn(fused_cases()), case_name<m3qkv_fused_args>);

class InsertValidation : public testing::TestWithParam<Case<m3qkv_insert_args>> {};
TEST_P(InsertValidation, Rejects) { expect_rejected(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Rules, InsertValidation, testing::ValuesIn(insert_cases()), case_name<m3qkv_insert_args>);

class GemmValidation : public testing::TestWithParam<Case<m3qkv_gemm_args>> {};
TEST_P(GemmValidation, Rejects) { expect_rejected(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Rules, GemmValidation, testing::ValuesIn(gemm_cases()), case_name<m3qkv_gemm_args>);

class QuantizeValidation : public testing::TestWithParam<Case<m3qkv_quantize_args>> {};
TEST_P(QuantizeValidation, Rejects) { expect_rejected(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Rules, QuantizeValidation, testing::ValuesIn(quantize_cases()),
                         case_name<m3qkv_quantize_args>);

// ---------------------------------------------------------------------------
// Exact message format, NULL args, valid structs, no-op.
// ---------------------------------------------------------------------------
TEST(Validation, MessageFormatIsExact) {
  m3qkv_fused_args a = valid_fused();
  a.k = 100;
  bool noop = false;
  ASSERT_EQ(validate(&a, &noop), M3QKV_ERROR_INVALID_SHAPE);
  EXPECT_STREQ(m3qkv_last_error(), "m3qkv_fused_qkv: k = 100 is not a multiple of 128");

  a = valid_fused();
  a.kv_cache = fake(18, 3);
  ASSERT_EQ(m3qkv_fused_qkv(&a, nullptr), M3QKV_ERROR_MISALIGNED);
  EXPECT_EQ(std::string(m3qkv_last_error()), "m3qkv_fused_qkv: kv_cache = " + hex(a.kv_cache) + " is not 16-byte aligned");
}

TEST(Validation, NullArgsRejected) {
  EXPECT_EQ(m3qkv_fused_qkv(nullptr, nullptr), M3QKV_ERROR_NULL_POINTER);
  EXPECT_STREQ(m3qkv_last_error(), "m3qkv_fused_qkv: args = NULL");
  EXPECT_EQ(m3qkv_qknorm_rope_kv_insert(nullptr, nullptr), M3QKV_ERROR_NULL_POINTER);
  EXPECT_STREQ(m3qkv_last_error(), "m3qkv_qknorm_rope_kv_insert: args = NULL");
  EXPECT_EQ(m3qkv_mxfp8_gemm(nullptr, nullptr), M3QKV_ERROR_NULL_POINTER);
  EXPECT_STREQ(m3qkv_last_error(), "m3qkv_mxfp8_gemm: args = NULL");
  EXPECT_EQ(m3qkv_mxfp8_quantize(nullptr, nullptr), M3QKV_ERROR_NULL_POINTER);
  EXPECT_STREQ(m3qkv_last_error(), "m3qkv_mxfp8_quantize: args = NULL");
  bool noop = true;
  EXPECT_EQ(validate<m3qkv_fused_args>(nullptr, &noop), M3QKV_ERROR_NULL_POINTER);
  EXPECT_FALSE(noop);
}

// Valid variants pass validation (validate_* directly: no launch on GPU machines).
TEST(Validation, ValidFusedVariantsPass) {
  using A = m3qkv_fused_args;
  const std::vector<std::pair<const char*, std::function<void(A&)>>> variants = {
      {"TP4 seed", [](A&) {}},
      {"TP8", [](A& a) { a.nq = 8; }},
      {"TP2", [](A& a) { a.nq = 32; a.nkv = 2; a.niq = 2; a.kv_page_stride = 4608; }},
      {"TP1", [](A& a) { a.nq = 64; a.nkv = 4; a.niq = 4; a.kv_page_stride = 2 * 4 * 16 * 72; }},
      {"dense (niq = nik = 0, index fields unset)",
       [](A& a) {
         a.niq = 0;
         a.nik = 0;
         a.index_q_norm_weight = nullptr;
         a.index_k_norm_weight = fake(15, 1);  // unused: neither presence nor alignment checked
         a.index_q_out = nullptr;
         a.index_slot_mapping = nullptr;
         a.index_cache = nullptr;
         a.index_page_stride = 0;
         a.num_index_blocks = 0;
       }},
      {"niq = 0 with nik = 1", [](A& a) { a.niq = 0; a.index_q_out = nullptr; a.index_q_norm_weight = nullptr; }},
      {"q_out only, q_fp8_scale unchecked", [](A& a) { a.q_fp8_out = nullptr; a.q_fp8_scale = kNaN; }},
      {"q_fp8_out only", [](A& a) { a.q_out = nullptr; }},
      {"no error_flags", [](A& a) { a.error_flags = nullptr; }},
      {"cta_group 1", [](A& a) { a.cta_group = 1; }},
      {"cta_group 2", [](A& a) { a.cta_group = 2; }},
      {"grid 132, use_pdl 0", [](A& a) { a.grid = 132; a.use_pdl = 0; }},
      {"eps: the smallest subnormal", [](A& a) { a.eps = 1e-45f; }},
      {"scales 0.5 / 2, tiny q scale", [](A& a) { a.k_scale = 0.5f; a.v_scale = 2.0f; a.q_fp8_scale = 1e-30f; }},
      {"scales at the ends of the normal-reciprocal range (a subnormal scale has a normal reciprocal)",
       [](A& a) { a.k_scale = 3e-39f; a.v_scale = 8.5e37f; a.q_fp8_scale = 5e-39f; }},
      {"inputs may alias each other (one norm weight for q and k, positions as slots)",
       [](A& a) { a.k_norm_weight = a.q_norm_weight; a.slot_mapping = a.positions; }},
      {"the index cache in the padding of the KV pages (interleaved, disjoint)",
       [](A& a) {
         a.kv_page_stride = 4096;  // packed KV page 2304 B
         a.index_page_stride = 4096;
         a.index_cache = static_cast<char*>(a.kv_cache) + 2304;  // 1152 B: ends at 3456 < 4096
       }},
      {"q_out right after the last KV page (touching, not overlapping)",
       [](A& a) { a.q_out = static_cast<char*>(a.kv_cache) + 3 * 2304 + 2304; }},
      {"block_size 4", [](A& a) { a.block_size = 4; }},
      {"block_size 128, exact pages",
       [](A& a) { a.block_size = 128; a.kv_page_stride = 2 * 128 * 72; a.index_page_stride = 128 * 72; }},
      {"page strides larger than a page", [](A& a) { a.kv_page_stride = 4096; a.index_page_stride = 2048; }},
      {"m 1", [](A& a) { a.m = 1; }},
      {"m 2^31 - 1", [](A& a) { a.m = (int64_t{1} << 31) - 1; }},
      {"k 128", [](A& a) { a.k = 128; }},
      {"k 2^20", [](A& a) { a.k = int64_t{1} << 20; }},
      {"max_position 1", [](A& a) { a.max_position = 1; }},
      {"nq 3 nkv 3 niq 3", [](A& a) { a.nq = 3; a.nkv = 3; a.niq = 3; a.kv_page_stride = 2 * 3 * 16 * 72; }},
      {"8-byte aligned int64 arrays, 4-byte flags",
       [](A& a) {
         a.positions = fake<const int64_t>(10, 8);
         a.slot_mapping = fake<const int64_t>(16, 24);
         a.index_slot_mapping = fake<const int64_t>(17, 40);
         a.error_flags = fake<uint32_t>(23, 4);
       }},
  };
  for (const auto& v : variants) {
    A a = valid_fused();
    v.second(a);
    expect_valid(a, v.first);
  }
}

TEST(Validation, ValidInsertGemmQuantizePass) {
  expect_valid(valid_insert(), "insert TP4");
  m3qkv_insert_args dense = valid_insert();
  dense.niq = dense.nik = 0;
  dense.index_cache = nullptr;
  dense.num_index_blocks = 0;
  expect_valid(dense, "insert dense");
  expect_valid(valid_gemm(), "gemm");
  m3qkv_gemm_args g = valid_gemm();
  g.n = 128;
  g.k = 128;
  g.grid = 7;
  expect_valid(g, "gemm 128x128");
  expect_valid(valid_quantize(), "quantize");
}

// m == 0 is a no-op: SUCCESS with every data pointer NULL, through the public
// API too (nothing is launched, no device is needed).
TEST(Validation, EmptyBatchIsNoopWithNullPointers) {
  m3qkv_fused_args f = valid_fused();
  f.m = 0;
  f.xq = f.xsf = f.wq = f.wsf = nullptr;
  f.positions = f.slot_mapping = f.index_slot_mapping = nullptr;
  f.cos_sin_cache = f.q_norm_weight = f.k_norm_weight = f.index_q_norm_weight = f.index_k_norm_weight = nullptr;
  f.kv_cache = f.index_cache = f.q_out = f.q_fp8_out = f.index_q_out = nullptr;
  f.error_flags = fake<uint32_t>(23, 1);  // misaligned, but never looked at
  bool noop = false;
  EXPECT_EQ(validate(&f, &noop), M3QKV_SUCCESS) << m3qkv_last_error();
  EXPECT_TRUE(noop);
  EXPECT_EQ(m3qkv_fused_qkv(&f, nullptr), M3QKV_SUCCESS) << m3qkv_last_error();
  EXPECT_STREQ(m3qkv_last_error(), "");
  EXPECT_EQ(m3qkv_testing_fused_qkv(&f, nullptr, M3QKV_BACKEND_SM100, nullptr), M3QKV_SUCCESS);

  m3qkv_insert_args i = valid_insert();
  i.m = 0;
  i.qkv = nullptr;
  i.kv_cache = nullptr;
  i.q_out = i.q_fp8_out = nullptr;
  noop = false;
  EXPECT_EQ(validate(&i, &noop), M3QKV_SUCCESS) << m3qkv_last_error();
  EXPECT_TRUE(noop);
  EXPECT_EQ(m3qkv_qknorm_rope_kv_insert(&i, nullptr), M3QKV_SUCCESS) << m3qkv_last_error();

  m3qkv_gemm_args g = valid_gemm();
  g.m = 0;
  g.xq = g.xsf = g.wq = g.wsf = nullptr;
  g.out = nullptr;
  EXPECT_EQ(m3qkv_mxfp8_gemm(&g, nullptr), M3QKV_SUCCESS) << m3qkv_last_error();

  m3qkv_quantize_args q = valid_quantize();
  q.m = 0;
  q.x = nullptr;
  q.xq = q.xsf = nullptr;
  EXPECT_EQ(m3qkv_mxfp8_quantize(&q, nullptr), M3QKV_SUCCESS) << m3qkv_last_error();
}

// The scalar rules still apply on an empty batch (checked before the no-op exit).
TEST(Validation, EmptyBatchStillChecksScalars) {
  m3qkv_fused_args f = valid_fused();
  f.m = 0;
  f.k = 100;
  EXPECT_EQ(m3qkv_fused_qkv(&f, nullptr), M3QKV_ERROR_INVALID_SHAPE);
  EXPECT_NE(std::string(m3qkv_last_error()).find("k = 100"), std::string::npos);
  f = valid_fused();
  f.m = 0;
  f.struct_size = 4;
  EXPECT_EQ(m3qkv_fused_qkv(&f, nullptr), M3QKV_ERROR_STRUCT_SIZE);
  f = valid_fused();
  f.m = 0;
  f.eps = kNaN;
  EXPECT_EQ(m3qkv_fused_qkv(&f, nullptr), M3QKV_ERROR_INVALID_ARGUMENT);
  m3qkv_gemm_args g = valid_gemm();
  g.m = 0;
  g.n = 100;
  EXPECT_EQ(m3qkv_mxfp8_gemm(&g, nullptr), M3QKV_ERROR_INVALID_SHAPE);
  m3qkv_quantize_args q = valid_quantize();
  q.m = 0;
  q.use_pdl = 5;
  EXPECT_EQ(m3qkv_mxfp8_quantize(&q, nullptr), M3QKV_ERROR_INVALID_ARGUMENT);
}

// ---------------------------------------------------------------------------
// API: statuses, names, thread-local errors, device queries.
// ---------------------------------------------------------------------------
const std::vector<m3qkv_status> kAllStatuses = {
    M3QKV_SUCCESS,          M3QKV_ERROR_INVALID_ARGUMENT, M3QKV_ERROR_MISALIGNED, M3QKV_ERROR_UNSUPPORTED_DEVICE,
    M3QKV_ERROR_CUDA_ERROR, M3QKV_ERROR_NULL_POINTER,     M3QKV_ERROR_STRUCT_SIZE, M3QKV_ERROR_INVALID_SHAPE,
    M3QKV_ERROR_TOO_LARGE,  M3QKV_ERROR_INTERNAL};

TEST(ApiStatus, StringsAreNonNullAndDistinct) {
  std::set<std::string> seen;
  for (m3qkv_status s : kAllStatuses) {
    const char* text = m3qkv_status_string(s);
    ASSERT_NE(text, nullptr);
    EXPECT_GT(std::strlen(text), 0u);
    EXPECT_TRUE(seen.insert(text).second) << "duplicate: " << text;
  }
  const char* unknown = m3qkv_status_string(static_cast<m3qkv_status>(1234));
  ASSERT_NE(unknown, nullptr);
  EXPECT_EQ(seen.count(unknown), 0u);
}

TEST(ApiStatus, BackendNamesAreNonNullAndDistinct) {
  std::set<std::string> seen;
  for (int k = M3QKV_BACKEND_NONE; k <= M3QKV_BACKEND_SM100; ++k) {
    const char* text = m3qkv_backend_name(static_cast<m3qkv_backend_kind>(k));
    ASSERT_NE(text, nullptr);
    EXPECT_TRUE(seen.insert(text).second) << text;
  }
  EXPECT_NE(m3qkv_backend_name(static_cast<m3qkv_backend_kind>(-5)), nullptr);
}

TEST(ApiLastError, ClearedByTheNextSuccessfulCall) {
  m3qkv_gemm_args g = valid_gemm();
  g.n = 100;
  ASSERT_EQ(m3qkv_mxfp8_gemm(&g, nullptr), M3QKV_ERROR_INVALID_SHAPE);
  EXPECT_STRNE(m3qkv_last_error(), "");
  g = valid_gemm();
  g.m = 0;
  ASSERT_EQ(m3qkv_mxfp8_gemm(&g, nullptr), M3QKV_SUCCESS);
  EXPECT_STREQ(m3qkv_last_error(), "");
}

TEST(ApiLastError, IsThreadLocal) {
  m3qkv_gemm_args g = valid_gemm();
  g.n = 100;
  ASSERT_EQ(m3qkv_mxfp8_gemm(&g, nullptr), M3QKV_ERROR_INVALID_SHAPE);
  const std::string mine = m3qkv_last_error();
  ASSERT_NE(mine.find("n = 100"), std::string::npos) << mine;

  std::string other_before, other_after;
  m3qkv_status other_status = M3QKV_SUCCESS;
  std::thread t([&] {
    other_before = m3qkv_last_error();
    m3qkv_quantize_args q = valid_quantize();
    q.k = 96;
    other_status = m3qkv_mxfp8_quantize(&q, nullptr);
    other_after = m3qkv_last_error();
  });
  t.join();
  EXPECT_EQ(other_before, "") << "a new thread sees another thread's error";
  EXPECT_EQ(other_status, M3QKV_ERROR_INVALID_SHAPE);
  EXPECT_NE(other_after.find("m3qkv_mxfp8_quantize: k = 96"), std::string::npos) << other_after;
  EXPECT_EQ(std::string(m3qkv_last_error()), mine) << "another thread's error overwrote this thread's";
}

TEST(ApiDevice, BackendQueryArgumentChecks) {
  EXPECT_EQ(m3qkv_backend(0, nullptr), M3QKV_ERROR_NULL_POINTER);
  EXPECT_NE(std::string(m3qkv_last_error()).find("m3qkv_backend: out = NULL"), std::string::npos)
      << m3qkv_last_error();
  m3qkv_backend_kind kind = M3QKV_BACKEND_SM100;
  EXPECT_EQ(m3qkv_backend(-1, &kind), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(m3qkv_last_error()).find("device = -1"), std::string::npos) << m3qkv_last_error();
  EXPECT_EQ(kind, M3QKV_BACKEND_NONE);
  EXPECT_EQ(m3qkv_warmup(-3), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(m3qkv_last_error()).find("m3qkv_warmup: device = -3"), std::string::npos)
      << m3qkv_last_error();
}

TEST(ApiDevice, OrdinalBeyondTheDeviceCountIsRejected) {
  m3qkv_backend_kind kind = M3QKV_BACKEND_SM100;
  const m3qkv_status st = m3qkv_backend(1 << 20, &kind);
  const std::string msg = m3qkv_last_error();
  EXPECT_EQ(kind, M3QKV_BACKEND_NONE);
  if (process_sees_a_gpu()) {
    EXPECT_EQ(st, M3QKV_ERROR_INVALID_ARGUMENT) << msg;
    EXPECT_NE(msg.find("device = 1048576"), std::string::npos) << msg;
  } else {
    EXPECT_EQ(st, M3QKV_ERROR_UNSUPPORTED_DEVICE) << msg;
    EXPECT_NE(msg.find("no CUDA driver or GPU was found"), std::string::npos) << msg;
  }
}

TEST(ApiTesting, ForcedBackendAndTapAreChecked) {
  m3qkv_fused_args a = valid_fused();
  EXPECT_EQ(m3qkv_testing_fused_qkv(&a, nullptr, static_cast<m3qkv_backend_kind>(7), nullptr),
            M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(m3qkv_last_error()).find("force_backend = 7"), std::string::npos) << m3qkv_last_error();
  EXPECT_EQ(m3qkv_testing_fused_qkv(&a, fake<float>(30, 4), M3QKV_BACKEND_NONE, nullptr), M3QKV_ERROR_MISALIGNED);
  EXPECT_NE(std::string(m3qkv_last_error()).find("acc_tap = " + hex(fake<float>(30, 4))), std::string::npos)
      << m3qkv_last_error();
  a.k = 100;  // argument validation comes first
  EXPECT_EQ(m3qkv_testing_fused_qkv(&a, nullptr, M3QKV_BACKEND_PORTABLE, nullptr), M3QKV_ERROR_INVALID_SHAPE);
}

// Without a CUDA device, fully valid calls are rejected after validation with
// UNSUPPORTED_DEVICE and a message that says no driver or GPU was found (not
// the runtime's "driver version is insufficient", which reads like "upgrade
// the driver"). On a GPU machine they would launch on fake pointers, so the
// test is skipped there; the GPU suite covers dispatch.
TEST(ApiDevice, NoDeviceGivesUnsupportedDevice) {
  if (process_sees_a_gpu()) GTEST_SKIP() << "a CUDA device is present: valid calls would launch";
  const auto expect_no_device = [](m3qkv_status st, const char* fn) {
    const std::string msg = m3qkv_last_error();
    EXPECT_EQ(st, M3QKV_ERROR_UNSUPPORTED_DEVICE) << fn << ": " << msg;
    EXPECT_EQ(msg.rfind(std::string(fn) + ": no CUDA driver or GPU was found: ", 0), 0u) << msg;
    EXPECT_EQ(msg.find("insufficient"), std::string::npos) << msg;
  };
  const m3qkv_fused_args f = valid_fused();
  const m3qkv_insert_args i = valid_insert();
  const m3qkv_gemm_args g = valid_gemm();
  const m3qkv_quantize_args q = valid_quantize();
  expect_no_device(m3qkv_fused_qkv(&f, nullptr), "m3qkv_fused_qkv");
  expect_no_device(m3qkv_testing_fused_qkv(&f, nullptr, M3QKV_BACKEND_PORTABLE, nullptr), "m3qkv_fused_qkv");
  expect_no_device(m3qkv_qknorm_rope_kv_insert(&i, nullptr), "m3qkv_qknorm_rope_kv_insert");
  expect_no_device(m3qkv_mxfp8_gemm(&g, nullptr), "m3qkv_mxfp8_gemm");
  expect_no_device(m3qkv_mxfp8_quantize(&q, nullptr), "m3qkv_mxfp8_quantize");
  m3qkv_backend_kind kind = M3QKV_BACKEND_SM90;
  expect_no_device(m3qkv_backend(0, &kind), "m3qkv_backend");
  EXPECT_EQ(kind, M3QKV_BACKEND_NONE);
  expect_no_device(m3qkv_warmup(0), "m3qkv_warmup");
}

}  // namespace

// ---------------------------------------------------------------------------
// struct_size: any released size of a struct (docs/contract.md §7.2); fields past it read
// as defaults.
// ---------------------------------------------------------------------------
template <class A>
void expect_released_sizes_accepted() {
  for (size_t v1 : Api<A>::kReleased) {
    SCOPED_TRACE(v1);
    const A valid = Api<A>::valid();
    A out;
    bool noop = true;
    ASSERT_EQ(validate_released(valid, v1, v1, &out, &noop), M3QKV_SUCCESS) << m3qkv_last_error();
    EXPECT_FALSE(noop);
    EXPECT_EQ(out.struct_size, sizeof(A));
    EXPECT_EQ(std::memcmp(reinterpret_cast<const char*>(&out) + sizeof(size_t),
                          reinterpret_cast<const char*>(&valid) + sizeof(size_t), v1 - sizeof(size_t)),
              0)
        << "the caller's fields were not copied";
    for (size_t i = v1; i < sizeof(A); ++i) {
      EXPECT_EQ(reinterpret_cast<const unsigned char*>(&out)[i], 0) << "byte " << i << " past struct_size is not 0";
    }
  }
}

// The sizes of 0.1 and 0.2 (Api<A>::kReleased): fields past them (0.2's cache
// formats, 0.3's x_bf16) read as defaults.
TEST(StructSize, TheReleasedSizesAreAccepted) {
  expect_released_sizes_accepted<m3qkv_fused_args>();
  expect_released_sizes_accepted<m3qkv_insert_args>();
  expect_released_sizes_accepted<m3qkv_gemm_args>();
  expect_released_sizes_accepted<m3qkv_quantize_args>();
}

TEST(StructSize, OtherSizesAreRejectedWithTheAcceptedOnes) {
  m3qkv_fused_args a = valid_fused();
  for (size_t bad : {size_t{8}, size_t{100}, sizeof(a) - 4, sizeof(a) + 4, size_t{1} << 40}) {
    a.struct_size = bad;
    EXPECT_EQ(m3qkv_fused_qkv(&a, nullptr), M3QKV_ERROR_STRUCT_SIZE) << bad;
    const std::string msg = m3qkv_last_error();
    EXPECT_NE(msg.find("struct_size = " + std::to_string(bad)), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(sizeof(a))), std::string::npos) << msg;
  }
}

// ---------------------------------------------------------------------------
// Extents: the overlap rule's geometry (src/api/extents.h).
// ---------------------------------------------------------------------------
using m3qkv::api::Extent;
Extent contiguous(uint64_t lo, uint64_t bytes, bool written = true) { return Extent{"c", lo, bytes, bytes, 1, written}; }
Extent paged(uint64_t lo, uint64_t span, uint64_t period, uint64_t count) {
  return Extent{"p", lo, span, period, count, true};
}

TEST(Extents, ContiguousBuffersMeetWhenTheyShareAByte) {
  EXPECT_FALSE(m3qkv::api::extents_overlap(contiguous(1000, 100), contiguous(1100, 100)));
  EXPECT_TRUE(m3qkv::api::extents_overlap(contiguous(1000, 101), contiguous(1100, 100)));
  EXPECT_TRUE(m3qkv::api::extents_overlap(contiguous(1000, 500), contiguous(1100, 1)));
  EXPECT_FALSE(m3qkv::api::extents_overlap(contiguous(1000, 100), contiguous(900, 100)));
}

TEST(Extents, PagesAgainstAContiguousBuffer) {
  const Extent pages = paged(1000, 60, 100, 3);  // [1000,1060) [1100,1160) [1200,1260)
  EXPECT_FALSE(m3qkv::api::extents_overlap(pages, contiguous(1060, 40)));   // padding of page 0
  EXPECT_TRUE(m3qkv::api::extents_overlap(pages, contiguous(1059, 41)));
  EXPECT_TRUE(m3qkv::api::extents_overlap(pages, contiguous(1150, 20)));
  EXPECT_FALSE(m3qkv::api::extents_overlap(pages, contiguous(1260, 500)));  // after the last page
  EXPECT_TRUE(m3qkv::api::extents_overlap(pages, contiguous(1259, 500)));
  EXPECT_TRUE(m3qkv::api::extents_overlap(pages, contiguous(900, 101)));
  EXPECT_FALSE(m3qkv::api::extents_overlap(pages, contiguous(900, 100)));
}

TEST(Extents, InterleavedPagesOfOneStride) {
  const Extent k = paged(1000, 60, 100, 3);
  EXPECT_FALSE(m3qkv::api::extents_overlap(k, paged(1060, 40, 100, 3)));  // the halves of one page
  EXPECT_TRUE(m3qkv::api::extents_overlap(k, paged(1059, 40, 100, 3)));
  EXPECT_TRUE(m3qkv::api::extents_overlap(k, paged(1061, 40, 100, 3))) << "reaches into the next page";
  EXPECT_FALSE(m3qkv::api::extents_overlap(k, paged(1160, 40, 100, 5)));  // starts two pages later
  EXPECT_TRUE(m3qkv::api::extents_overlap(k, paged(800, 60, 100, 3))) << "b's page 2 is a's page 0";
  EXPECT_FALSE(m3qkv::api::extents_overlap(k, paged(760, 40, 100, 3)));
  EXPECT_FALSE(m3qkv::api::extents_overlap(k, paged(1300, 60, 100, 3)));  // pool after pool
}

TEST(Extents, DifferentStridesMeetWhenTheirHullsDo) {
  EXPECT_TRUE(m3qkv::api::extents_overlap(paged(1000, 60, 100, 3), paged(1060, 20, 50, 4)));
  EXPECT_FALSE(m3qkv::api::extents_overlap(paged(1000, 60, 100, 3), paged(1260, 20, 50, 4)));
}

TEST(Extents, OnlyWrittenBuffersMustNotOverlap) {
  m3qkv::api::Extents e;
  e.items[0] = Extent{"in_a", 1000, 100, 100, 1, false};
  e.items[1] = Extent{"in_b", 1050, 100, 100, 1, false};
  e.items[2] = Extent{"out", 2000, 10, 10, 1, true};
  e.count = 3;
  EXPECT_EQ(m3qkv::api::check_overlaps("f", &e), M3QKV_SUCCESS);
  e.items[3] = Extent{"late", 1095, 10, 10, 1, true};
  e.count = 4;
  EXPECT_EQ(m3qkv::api::check_overlaps("f", &e), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(m3qkv_last_error()).rfind("f: late [0x447, 0x451) overlaps in_a [0x3e8, 0x44c)", 0), 0u)
      << m3qkv_last_error();
}

// Two extents of one group (the K and V elements of a flat KV cache, proven
// disjoint by their own rule) are not compared; anything else still is.
TEST(Extents, AGroupIsLeftToItsLayoutRule) {
  m3qkv::api::Extents e;
  e.items[0] = Extent{"kv_cache", 1000, 500, 500, 1, true, m3qkv::api::kGroupFlatKv};
  e.items[1] = Extent{"v_cache", 1100, 500, 500, 1, true, m3qkv::api::kGroupFlatKv};
  e.count = 2;
  EXPECT_EQ(m3qkv::api::check_overlaps("f", &e), M3QKV_SUCCESS) << m3qkv_last_error();
  e.items[2] = Extent{"q_out", 1550, 16, 16, 1, true};
  e.count = 3;
  EXPECT_EQ(m3qkv::api::check_overlaps("f", &e), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(m3qkv_last_error()).find("q_out"), std::string::npos) << m3qkv_last_error();
}
