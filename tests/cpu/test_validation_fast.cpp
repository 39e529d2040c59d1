// Validation of the fp8 fast mode's fields (issue 29): `precision` (appended
// in 0.3 to m3qkv_fused_args: 0 or 1; 1 refuses x_bf16 and batch_invariant),
// m3qkv_prepare_weights_fp8's arguments (shapes, NULL, alignment, outputs
// that overlap the inputs, struct_size) and its sizes query.
//
// Fake device pointers only (tests/cpu/valid_args.h): nothing is launched.
#include <gtest/gtest.h>

#include <string>

#include "common/layouts.h"
#include "validation_cases.h"

namespace {

using m3qkv_valid_args::valid_prepare;

m3qkv_status validate(const m3qkv_fused_args& a) {
  bool noop = false;
  return m3qkv_validation::validate(&a, &noop);
}
bool says(const char* what) { return std::string(m3qkv_last_error()).find(what) != std::string::npos; }

TEST(ValidationFast, PrecisionIsZeroOrOne) {
  m3qkv_fused_args a = m3qkv_valid_args::valid_fused();
  a.precision = 1;
  EXPECT_EQ(validate(a), M3QKV_SUCCESS) << m3qkv_last_error();
  for (int32_t bad : {-1, 2, 7}) {
    a.precision = bad;
    EXPECT_EQ(validate(a), M3QKV_ERROR_INVALID_ARGUMENT) << bad;
    EXPECT_TRUE(says("precision")) << m3qkv_last_error();
  }
}

TEST(ValidationFast, PrecisionOneRefusesBf16ActivationsAndBatchInvariance) {
  m3qkv_fused_args a = m3qkv_valid_args::valid_fused();
  a.precision = 1;
  a.x_bf16 = a.xq;
  a.xq = a.xsf = nullptr;
  EXPECT_EQ(validate(a), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(says("x_bf16")) << m3qkv_last_error();
  a = m3qkv_valid_args::valid_fused();
  a.precision = 1;
  a.batch_invariant = 1;
  EXPECT_EQ(validate(a), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(says("batch_invariant")) << m3qkv_last_error();
}

m3qkv_status validate(const m3qkv_prepare_args& a) {
  m3qkv_prepare_args out;
  return m3qkv::validate_prepare(&a, &out);
}

TEST(ValidationFast, PrepareArguments) {
  EXPECT_EQ(validate(valid_prepare()), M3QKV_SUCCESS) << m3qkv_last_error();
  m3qkv_prepare_args out;
  EXPECT_EQ(m3qkv::validate_prepare(nullptr, &out), M3QKV_ERROR_NULL_POINTER);
  m3qkv_prepare_args a = valid_prepare();
  a.struct_size = sizeof(a) - 8;
  EXPECT_EQ(validate(a), M3QKV_ERROR_STRUCT_SIZE);
  a = valid_prepare(), a.n = 100;
  EXPECT_EQ(validate(a), M3QKV_ERROR_INVALID_SHAPE);
  EXPECT_TRUE(says("n")) << m3qkv_last_error();
  a = valid_prepare(), a.k = 0;
  EXPECT_EQ(validate(a), M3QKV_ERROR_INVALID_SHAPE);
  a = valid_prepare(), a.wsf_out = nullptr;
  EXPECT_EQ(validate(a), M3QKV_ERROR_NULL_POINTER);
  EXPECT_TRUE(says("wsf_out")) << m3qkv_last_error();
  a = valid_prepare(), a.wq_out = static_cast<uint8_t*>(a.wq_out) + 8;
  EXPECT_EQ(validate(a), M3QKV_ERROR_MISALIGNED);
  a = valid_prepare(), a.wq_out = const_cast<void*>(a.wq);  // in place
  EXPECT_NE(validate(a), M3QKV_SUCCESS);
  EXPECT_TRUE(says("wq_out") && says("wq")) << m3qkv_last_error();
  a = valid_prepare(), a.wsf_out = static_cast<uint8_t*>(a.wq_out) + 256 * 1024 - 16;  // last 16 B of wq_out
  EXPECT_NE(validate(a), M3QKV_SUCCESS);
  EXPECT_EQ(m3qkv_prepare_weights_fp8(nullptr, nullptr), M3QKV_ERROR_NULL_POINTER);
}

TEST(ValidationFast, PrepareSizes) {
  size_t q = 0, s = 0;
  ASSERT_EQ(m3qkv_prepare_weights_fp8_sizes(2560, 6144, &q, &s), M3QKV_SUCCESS);
  EXPECT_EQ(q, size_t(2560) * 6144);
  EXPECT_EQ(s, size_t(m3qkv::f8_128x4_bytes(2560, 6144 / 32)));
  EXPECT_EQ(m3qkv_prepare_weights_fp8_sizes(2560, 6144, nullptr, &s), M3QKV_ERROR_NULL_POINTER);
  EXPECT_EQ(m3qkv_prepare_weights_fp8_sizes(-128, 6144, &q, &s), M3QKV_ERROR_INVALID_SHAPE);
  EXPECT_EQ(m3qkv_prepare_weights_fp8_sizes(128, 6100, &q, &s), M3QKV_ERROR_INVALID_SHAPE);
}

}  // namespace
