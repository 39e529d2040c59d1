// Validation of the cache-format fields (docs/contract.md §4.3): kv_cache_dtype,
// index_cache_dtype, v_cache, kv_token_stride, kv_head_stride. Every rule of
// the "Cache formats" block of the validator has a rejecting case here (status
// and a message naming the argument and its value, through validate_* and the
// public entry point, fused and insert), and the layouts a user must be able
// to express are accepted: vLLM flash [num_blocks, block_size, nkv, 128] as two
// tensors or as one [num_blocks, 2, block_size, nkv, 128] allocation, head-major
// pages, padded rows and pages, V before K.
// Shared machinery (Api, Case, expect_rejected): validation_cases.h.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "validation_cases.h"

namespace {

using namespace m3qkv_validation;

// The valid TP4 struct (nkv 1, block_size 16, num_blocks 4, kv_page_stride
// 2304) turned into a valid FP8 one: K rows of 128 B, two separate tensors
// (v_cache 1 MiB away), the NVFP4 page stride 2304 is a padded fp8 page (2048 + 256).
template <class A>
void to_fp8(A& a) {
  a.kv_cache_dtype = M3QKV_CACHE_FP8;
  a.v_cache = fake(24);
  a.kv_head_stride = 128;
  a.kv_token_stride = 128;
}
// TP1-like nkv 4, bf16, vLLM flash: head 256, token 1024, page 16 · 1024 = 16384.
template <class A>
void to_bf16_nkv4(A& a) {
  a.nq = 64;
  a.nkv = 4;
  a.niq = 4;
  a.kv_cache_dtype = M3QKV_CACHE_BF16;
  a.v_cache = fake(24);
  a.kv_head_stride = 256;
  a.kv_token_stride = 1024;
  a.kv_page_stride = 16384;
}
// One [num_blocks, 2, block_size, nkv, 128] allocation of the bf16 nkv 4 layout.
template <class A>
void to_bf16_interleaved(A& a) {
  to_bf16_nkv4(a);
  a.kv_page_stride = 2 * 16384;
  a.v_cache = static_cast<char*>(a.kv_cache) + 16384;
}

template <class A>
std::vector<Case<A>> cases() {
  const std::string kv = hex(fake(18));
  return {
      // dtypes
      {"kv_cache_dtype_3", [](A& a) { a.kv_cache_dtype = 3; }, kArg, {"kv_cache_dtype = 3", "0 (NVFP4), 1 (FP8) or 2 (BF16)"}},
      {"kv_cache_dtype_negative", [](A& a) { a.kv_cache_dtype = -1; }, kArg, {"kv_cache_dtype = -1"}},
      {"index_cache_dtype_7", [](A& a) { a.index_cache_dtype = 7; }, kArg, {"index_cache_dtype = 7"}},
      // NVFP4: the flat-only fields unused
      {"nvfp4_with_v_cache", [](A& a) { a.v_cache = fake(24); }, kArg,
       {"v_cache = " + hex(fake(24)), "must be NULL with kv_cache_dtype = 0"}},
      {"nvfp4_with_token_stride", [](A& a) { a.kv_token_stride = 128; }, kArg,
       {"kv_token_stride = 128 must be 0 with kv_cache_dtype = 0"}},
      {"nvfp4_with_head_stride", [](A& a) { a.kv_head_stride = 256; }, kArg, {"kv_head_stride = 256 must be 0"}},
      // flat KV: v_cache
      {"fp8_v_cache_null", [](A& a) { to_fp8(a); a.v_cache = nullptr; }, kNull, {"v_cache = NULL"}},
      {"fp8_v_cache_misaligned", [](A& a) { to_fp8(a); a.v_cache = fake(24, 8); }, kAlign,
       {"v_cache = " + hex(fake(24, 8)), "16-byte aligned"}},
      {"bf16_kv_cache_misaligned", [](A& a) { to_bf16_nkv4(a); a.kv_cache = fake(18, 4); }, kAlign,
       {"kv_cache = " + hex(fake(18, 4))}},
      // flat KV: strides positive, % 16
      {"fp8_token_stride_zero", [](A& a) { to_fp8(a); a.kv_token_stride = 0; }, kShape, {"kv_token_stride = 0", "> 0"}},
      {"fp8_head_stride_negative", [](A& a) { to_fp8(a); a.kv_head_stride = -128; }, kShape, {"kv_head_stride = -128"}},
      {"fp8_page_stride_zero", [](A& a) { to_fp8(a); a.kv_page_stride = 0; }, kShape, {"kv_page_stride = 0"}},
      {"fp8_token_stride_not_multiple_of_16", [](A& a) { to_fp8(a); a.kv_token_stride = 136; }, kShape,
       {"kv_token_stride = 136 is not a multiple of 16"}},
      {"fp8_head_stride_not_multiple_of_16", [](A& a) { to_fp8(a); a.kv_head_stride = 132; }, kShape,
       {"kv_head_stride = 132 is not a multiple of 16"}},
      {"fp8_page_stride_not_multiple_of_16", [](A& a) { to_fp8(a); a.kv_page_stride = 2056; }, kShape,
       {"kv_page_stride = 2056 is not a multiple of 16"}},
      {"fp8_num_blocks_zero", [](A& a) { to_fp8(a); a.num_blocks = 0; }, kShape, {"num_blocks = 0"}},
      // flat KV: K elements pairwise disjoint
      {"fp8_token_stride_below_row", [](A& a) { to_fp8(a); a.kv_token_stride = 112; }, kShape,
       {"kv_token_stride = 112 is smaller than the 128 bytes"}},
      {"fp8_page_stride_below_page", [](A& a) { to_fp8(a); a.kv_page_stride = 2032; }, kShape,
       {"kv_page_stride = 2032 is smaller than the 2048 bytes"}},
      {"bf16_head_stride_below_row", [](A& a) { to_bf16_nkv4(a); a.kv_head_stride = 128; }, kShape,
       {"kv_head_stride = 128 is smaller than the 256 bytes"}},
      {"bf16_token_stride_below_its_heads", [](A& a) { to_bf16_nkv4(a); a.kv_token_stride = 768; }, kShape,
       {"kv_token_stride = 768 is smaller than the 1024 bytes"}},
      {"bf16_token_stride_equal_head_stride", [](A& a) { to_bf16_nkv4(a); a.kv_token_stride = 256; }, kShape,
       {"kv_token_stride = 256 is smaller than the 1024 bytes"}},
      {"bf16_page_stride_below_page", [](A& a) { to_bf16_nkv4(a); a.kv_page_stride = 16384 - 16; }, kShape,
       {"kv_page_stride = 16368 is smaller than the 16384 bytes"}},
      {"bf16_head_major_head_stride_below_its_tokens",
       [](A& a) { to_bf16_nkv4(a); a.kv_token_stride = 256; a.kv_head_stride = 2048; a.kv_page_stride = 4 * 4096; },
       kShape, {"kv_head_stride = 2048 is smaller than the 4096 bytes"}},
      {"fp8_span_overflows", [](A& a) { to_fp8(a); a.num_blocks = INT64_MAX / 1000; }, kLarge,
       {"overflows int64"}},
      // flat KV: V elements disjoint from K elements
      {"fp8_v_cache_equals_kv_cache", [](A& a) { to_fp8(a); a.v_cache = a.kv_cache; }, kArg,
       {"v_cache = kv_cache + 0 bytes", "share bytes with a K element"}},
      {"fp8_v_cache_inside_a_k_row", [](A& a) { to_fp8(a); a.v_cache = static_cast<char*>(a.kv_cache) + 64; }, kArg,
       {"v_cache = kv_cache + 64 bytes"}},
      {"fp8_v_cache_in_page_padding_too_small",  // V rows from byte 2048 of page 0 run into page 1 at 2304
       [](A& a) { to_fp8(a); a.v_cache = static_cast<char*>(a.kv_cache) + 2048; }, kArg,
       {"v_cache = kv_cache + 2048 bytes"}},
      {"bf16_interleaved_v_one_row_early",
       [](A& a) { to_bf16_interleaved(a); a.v_cache = static_cast<char*>(a.kv_cache) + 16384 - 256; }, kArg,
       {"v_cache = kv_cache + 16128 bytes"}},
      {"bf16_interleaved_v_before_k_overlapping",
       [](A& a) { to_bf16_interleaved(a); a.v_cache = static_cast<char*>(a.kv_cache) - 16384 + 16; }, kArg,
       {"v_cache = kv_cache - 16368 bytes"}},
      {"bf16_v_in_the_next_head_row", [](A& a) { to_bf16_nkv4(a); a.kv_head_stride = 512; a.kv_token_stride = 2048;
                                                  a.kv_page_stride = 32768; a.v_cache = static_cast<char*>(a.kv_cache) + 512; },
       kArg, {"v_cache = kv_cache + 512 bytes"}},
      // flat index cache
      {"fp8_index_page_stride_not_multiple_of_16",
       [](A& a) { a.index_cache_dtype = M3QKV_CACHE_FP8; a.index_page_stride = 2056; }, kShape,
       {"index_page_stride = 2056 is not a multiple of 16"}},
      {"fp8_index_page_stride_below_page",
       [](A& a) { a.index_cache_dtype = M3QKV_CACHE_FP8; a.index_page_stride = 2032; }, kShape,
       {"index_page_stride = 2032 is smaller than one FP8 index page", "2048"}},
      {"bf16_index_page_stride_below_page",
       [](A& a) { a.index_cache_dtype = M3QKV_CACHE_BF16; a.index_page_stride = 2048; }, kShape,
       {"index_page_stride = 2048 is smaller than one BF16 index page", "4096"}},
      {"fp8_num_index_blocks_zero",
       [](A& a) { a.index_cache_dtype = M3QKV_CACHE_FP8; a.index_page_stride = 2048; a.num_index_blocks = 0; },
       kShape, {"num_index_blocks = 0"}},
      {"fp8_index_cache_bytes_overflow",
       [](A& a) { a.index_cache_dtype = M3QKV_CACHE_FP8; a.index_page_stride = 2048; a.num_index_blocks = INT64_MAX / 1000; },
       kLarge, {"num_index_blocks*index_page_stride"}},
      // scales: still checked for FP8
      {"fp8_k_scale_zero", [](A& a) { to_fp8(a); a.k_scale = 0.0f; }, kArg, {"k_scale = 0"}},
      {"fp8_v_scale_nan", [](A& a) { to_fp8(a); a.v_scale = std::numeric_limits<float>::quiet_NaN(); }, kArg,
       {"v_scale = nan"}},
  };
}

class FusedCacheFormatValidation : public testing::TestWithParam<Case<m3qkv_fused_args>> {};
TEST_P(FusedCacheFormatValidation, Rejects) { expect_rejected(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Rules, FusedCacheFormatValidation, testing::ValuesIn(cases<m3qkv_fused_args>()),
                         case_name<m3qkv_fused_args>);

class InsertCacheFormatValidation : public testing::TestWithParam<Case<m3qkv_insert_args>> {};
TEST_P(InsertCacheFormatValidation, Rejects) { expect_rejected(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Rules, InsertCacheFormatValidation, testing::ValuesIn(cases<m3qkv_insert_args>()),
                         case_name<m3qkv_insert_args>);

template <class A>
void valid_layouts() {
  const std::vector<std::pair<const char*, std::function<void(A&)>>> variants = {
      {"fp8, two tensors [nb, 16, 1, 128], padded page", [](A& a) { to_fp8(a); }},
      {"fp8, tight page", [](A& a) { to_fp8(a); a.kv_page_stride = 2048; }},
      {"bf16 nkv 4, two tensors [nb, 16, 4, 128]", [](A& a) { to_bf16_nkv4(a); }},
      {"bf16 nkv 4, one [nb, 2, 16, 4, 128] allocation", [](A& a) { to_bf16_interleaved(a); }},
      {"bf16 interleaved, V half first (v_cache = kv_cache - 16384)",
       [](A& a) { to_bf16_interleaved(a); a.v_cache = static_cast<char*>(a.kv_cache) - 16384; }},
      {"fp8 interleaved nkv 2 with padded pages",
       [](A& a) {
         a.nq = 32; a.nkv = 2; a.niq = 2;
         a.kv_cache_dtype = M3QKV_CACHE_FP8;
         a.kv_head_stride = 128; a.kv_token_stride = 256; a.kv_page_stride = 2 * 4096 + 512;
         a.v_cache = static_cast<char*>(a.kv_cache) + 4096;
       }},
      {"bf16 head-major pages [nkv][16][128] with 32-B padded rows",
       [](A& a) { to_bf16_nkv4(a); a.kv_token_stride = 288; a.kv_head_stride = 16 * 288; a.kv_page_stride = 4 * 16 * 288; }},
      {"bf16 padded head rows (head stride 272)",
       [](A& a) { to_bf16_nkv4(a); a.kv_head_stride = 272; a.kv_token_stride = 4 * 272; a.kv_page_stride = 16 * 4 * 272; }},
      {"V rows in the gaps of padded K rows (head stride 512, V at +256)",
       [](A& a) { to_bf16_nkv4(a); a.kv_head_stride = 512; a.kv_token_stride = 2048; a.kv_page_stride = 32768;
                  a.v_cache = static_cast<char*>(a.kv_cache) + 256; }},
      {"pages interleaved inside tokens ([16][nb][128], 4 pages)",
       [](A& a) { to_fp8(a); a.kv_page_stride = 128; a.kv_token_stride = 4 * 128; }},
      {"nkv 1: the head stride of a single head is not constrained",
       [](A& a) { to_fp8(a); a.kv_head_stride = 16; }},
      {"bf16 KV: k_scale / v_scale unused (0 and NaN accepted)",
       [](A& a) { to_bf16_nkv4(a); a.k_scale = 0.0f; a.v_scale = std::numeric_limits<float>::quiet_NaN(); }},
      {"fp8 index cache, exact page", [](A& a) { a.index_cache_dtype = M3QKV_CACHE_FP8; a.index_page_stride = 2048; }},
      {"bf16 index cache, padded page", [](A& a) { a.index_cache_dtype = M3QKV_CACHE_BF16; a.index_page_stride = 4096 + 16; }},
      {"fp8 KV with NVFP4 index", [](A& a) { to_fp8(a); }},
      {"NVFP4 KV with bf16 index", [](A& a) { a.index_cache_dtype = M3QKV_CACHE_BF16; a.index_page_stride = 4096; }},
      {"dense: index_cache_dtype not used, not checked",
       [](A& a) {
         a.niq = 0; a.nik = 0; a.index_cache_dtype = 99; a.index_cache = nullptr; a.index_q_out = nullptr;
         a.index_q_norm_weight = nullptr; a.index_k_norm_weight = nullptr; a.index_slot_mapping = nullptr;
       }},
  };
  for (const auto& v : variants) {
    A a = Api<A>::valid();
    v.second(a);
    expect_valid(a, v.first);
  }
}

TEST(CacheFormatValidation, UsableLayoutsAccepted) {
  valid_layouts<m3qkv_fused_args>();
  valid_layouts<m3qkv_insert_args>();
}

// m == 0: the scalar rules still apply, the pointer rules do not.
TEST(CacheFormatValidation, EmptyBatch) {
  m3qkv_fused_args a = m3qkv_valid_args::valid_fused();
  a.m = 0;
  a.kv_cache_dtype = 5;
  bool noop = false;
  EXPECT_EQ(validate(&a, &noop), M3QKV_ERROR_INVALID_ARGUMENT);
  a = m3qkv_valid_args::valid_fused();
  a.m = 0;
  to_fp8(a);
  a.v_cache = nullptr;  // not looked at on an empty batch
  EXPECT_EQ(validate(&a, &noop), M3QKV_SUCCESS) << m3qkv_last_error();
  EXPECT_TRUE(noop);
  a.kv_token_stride = 8;  // a scalar rule: still checked
  EXPECT_EQ(validate(&a, &noop), M3QKV_ERROR_INVALID_SHAPE);
}

}  // namespace
