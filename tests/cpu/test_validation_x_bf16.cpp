// Validation of the bf16-activation field x_bf16 (issue 28 item 2, appended
// in 0.3 to m3qkv_fused_args and m3qkv_gemm_args): exactly one of x_bf16 and
// (xq, xsf) (both: INVALID_ARGUMENT naming the fields; none: NULL_POINTER
// naming all three), 16-B alignment, the overlap rule with x_bf16 as an input
// of M·K·2 bytes, the released struct sizes (0.1 and 0.2 read x_bf16 as NULL
// whatever lies past their end), and the extents checked mode uses.
// Shared machinery (Api, expect_rejected): validation_cases.h.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "validation_cases.h"

namespace {

using namespace m3qkv_validation;

// M·K·2 bytes of the valid structs (M 7, K 6144).
constexpr int64_t kXBf16Bytes = 7 * 6144 * 2;

// The valid struct with bf16 activations instead of the MXFP8 ones (slot 8).
template <class A>
A valid_x_bf16() {
  A a = Api<A>::valid();
  a.xq = nullptr;
  a.xsf = nullptr;
  a.x_bf16 = fake(8);
  return a;
}

template <class A>
m3qkv_status validate(const A& a) {
  bool noop = true;
  const m3qkv_status st = m3qkv_validation::validate(&a, &noop);
  EXPECT_FALSE(noop);
  return st;
}

template <class A>
class XBf16Validation : public testing::Test {};
using Structs = testing::Types<m3qkv_fused_args, m3qkv_gemm_args>;
TYPED_TEST_SUITE(XBf16Validation, Structs);

TYPED_TEST(XBf16Validation, Bf16ActivationsAloneAreValid) {
  using A = TypeParam;
  const A a = valid_x_bf16<A>();
  A out;
  bool noop = true;
  ASSERT_EQ(Api<A>::validate(&a, &out, &noop), M3QKV_SUCCESS) << m3qkv_last_error();
  EXPECT_FALSE(noop);
  EXPECT_EQ(out.x_bf16, a.x_bf16);
  EXPECT_EQ(out.xq, nullptr);
  EXPECT_EQ(out.xsf, nullptr);
  // The MXFP8 struct stays valid with x_bf16 = NULL.
  const A q = Api<A>::valid();
  ASSERT_EQ(Api<A>::validate(&q, &out, &noop), M3QKV_SUCCESS) << m3qkv_last_error();
  EXPECT_EQ(out.x_bf16, nullptr);
}

TYPED_TEST(XBf16Validation, BothActivationOperandsAreRejected) {
  using A = TypeParam;
  A a = Api<A>::valid();
  a.x_bf16 = fake(8);
  expect_rejected(a, M3QKV_ERROR_INVALID_ARGUMENT,
                  {"x_bf16 = " + hex(a.x_bf16), "xq = " + hex(a.xq), "xsf = " + hex(a.xsf), "exactly one of x_bf16",
                   "(xq, xsf)"});
  // Half of the MXFP8 pair next to x_bf16 is "both" too.
  A b = valid_x_bf16<A>();
  b.xq = fake(1);
  expect_rejected(b, M3QKV_ERROR_INVALID_ARGUMENT, {"x_bf16 = " + hex(b.x_bf16), "xq = " + hex(b.xq), "xsf = 0x0"});
  A c = valid_x_bf16<A>();
  c.xsf = fake(2);
  expect_rejected(c, M3QKV_ERROR_INVALID_ARGUMENT, {"xq = 0x0", "xsf = " + hex(c.xsf), "exactly one"});
}

TYPED_TEST(XBf16Validation, NoActivationOperandIsRejected) {
  using A = TypeParam;
  A a = valid_x_bf16<A>();
  a.x_bf16 = nullptr;
  expect_rejected(a, M3QKV_ERROR_NULL_POINTER,
                  {"xq = NULL, xsf = NULL and x_bf16 = NULL", "the activations are required"});
  // Half an MXFP8 pair without x_bf16 names the missing half (as in 0.1).
  A b = Api<A>::valid();
  b.xsf = nullptr;
  expect_rejected(b, M3QKV_ERROR_NULL_POINTER, {"xsf = NULL, but it is required"});
  A c = Api<A>::valid();
  c.xq = nullptr;
  expect_rejected(c, M3QKV_ERROR_NULL_POINTER, {"xq = NULL, but it is required"});
}

TYPED_TEST(XBf16Validation, MisalignedBf16ActivationsAreRejected) {
  using A = TypeParam;
  for (uintptr_t off : {uintptr_t{2}, uintptr_t{8}, uintptr_t{1}}) {
    SCOPED_TRACE(off);
    A a = valid_x_bf16<A>();
    a.x_bf16 = fake(8, off);
    expect_rejected(a, M3QKV_ERROR_MISALIGNED, {"x_bf16 = " + hex(a.x_bf16) + " is not 16-byte aligned"});
  }
}

TYPED_TEST(XBf16Validation, EmptyBatchDoesNotLookAtTheActivations) {
  using A = TypeParam;
  A a = Api<A>::valid();
  a.m = 0;
  a.x_bf16 = fake(8, 2);  // both given and misaligned: pointers are not checked at m = 0
  A out;
  bool noop = false;
  EXPECT_EQ(Api<A>::validate(&a, &out, &noop), M3QKV_SUCCESS) << m3qkv_last_error();
  EXPECT_TRUE(noop);
}

// x_bf16 is an input of M·K·2 bytes: a written buffer may start at its end,
// not 16 bytes before it; a written buffer at x_bf16's address is rejected
// naming both.
template <class A>
void written_buffers_must_not_meet_x_bf16(const std::vector<std::pair<const char*, std::function<void(A&, void*)>>>& outs) {
  for (const auto& o : outs) {
    SCOPED_TRACE(o.first);
    A a = valid_x_bf16<A>();
    o.second(a, const_cast<void*>(a.x_bf16));
    expect_rejected(a, M3QKV_ERROR_INVALID_ARGUMENT, {std::string(" ") + o.first + " [0x", " x_bf16 [0x", "overlaps"});
    A b = valid_x_bf16<A>();
    o.second(b, static_cast<char*>(const_cast<void*>(b.x_bf16)) + kXBf16Bytes - 16);
    expect_rejected(b, M3QKV_ERROR_INVALID_ARGUMENT, {std::string(" ") + o.first + " [0x", " x_bf16 [0x"});
    A c = valid_x_bf16<A>();
    o.second(c, static_cast<char*>(const_cast<void*>(c.x_bf16)) + kXBf16Bytes);
    EXPECT_EQ(validate(c), M3QKV_SUCCESS) << m3qkv_last_error();
  }
}

TEST(XBf16ValidationFused, WrittenBuffersMustNotOverlapTheBf16Activations) {
  using A = m3qkv_fused_args;
  written_buffers_must_not_meet_x_bf16<A>({
      {"q_out", [](A& a, void* p) { a.q_out = p; }},
      {"q_fp8_out", [](A& a, void* p) { a.q_fp8_out = p; }},
      {"index_q_out", [](A& a, void* p) { a.index_q_out = p; }},
      {"error_flags", [](A& a, void* p) { a.error_flags = static_cast<uint32_t*>(p); }},
  });
  // A KV page over x_bf16 (the cache is written page by page).
  A a = valid_x_bf16<A>();
  a.kv_cache = static_cast<char*>(const_cast<void*>(a.x_bf16)) - 2 * 2304;
  expect_rejected(a, M3QKV_ERROR_INVALID_ARGUMENT, {" kv_cache [0x", " x_bf16 [0x"});
  // Inputs may alias each other: x_bf16 on the weight is not an overlap error.
  A b = valid_x_bf16<A>();
  b.x_bf16 = b.wq;
  EXPECT_EQ(validate(b), M3QKV_SUCCESS) << m3qkv_last_error();
}

TEST(XBf16ValidationGemm, TheOutputMustNotOverlapTheBf16Activations) {
  using A = m3qkv_gemm_args;
  written_buffers_must_not_meet_x_bf16<A>({{"out", [](A& a, void* p) { a.out = p; }}});
}

// The released sizes (0.1, 0.2) read x_bf16 as NULL, whatever lies in memory
// past the caller's struct: a struct that sets xq and xsf and has a non-NULL
// x_bf16 after its end is the MXFP8 call it was in that release.
TYPED_TEST(XBf16Validation, OlderStructSizesReadXBf16AsNull) {
  using A = TypeParam;
  for (size_t released : Api<A>::kReleased) {
    SCOPED_TRACE(released);
    ASSERT_LE(released, offsetof(A, x_bf16));
    A valid = Api<A>::valid();
    valid.x_bf16 = fake(8);  // past `released`: must not be read
    A out;
    bool noop = true;
    // x_bf16 lies in memory after the old struct
    ASSERT_EQ(validate_released(valid, released, sizeof(A), &out, &noop), M3QKV_SUCCESS) << m3qkv_last_error();
    EXPECT_FALSE(noop);
    EXPECT_EQ(out.struct_size, sizeof(A));
    EXPECT_EQ(out.x_bf16, nullptr);
    EXPECT_EQ(out.xq, valid.xq);
    EXPECT_EQ(out.xsf, valid.xsf);
  }
  // This version's size reads it: both operands given is rejected.
  A both = Api<A>::valid();
  both.x_bf16 = fake(8);
  EXPECT_EQ(validate(both), M3QKV_ERROR_INVALID_ARGUMENT);
}

// batch_invariant (0.3): 0 or 1, anything else refused by name.
TEST(BatchInvariantField, IsZeroOrOne) {
  for (int32_t v : {0, 1}) {
    m3qkv_fused_args a = valid_x_bf16<m3qkv_fused_args>();
    a.batch_invariant = v;
    EXPECT_EQ(validate(a), M3QKV_SUCCESS) << v << ": " << m3qkv_last_error();
  }
  for (int32_t v : {-1, 2, INT32_MAX}) {
    m3qkv_fused_args a = valid_x_bf16<m3qkv_fused_args>();
    a.batch_invariant = v;
    EXPECT_EQ(validate(a), M3QKV_ERROR_INVALID_ARGUMENT) << v;
    EXPECT_NE(std::string(m3qkv_last_error()).find("m3qkv_fused_qkv: batch_invariant = " + std::to_string(v)),
              std::string::npos)
        << m3qkv_last_error();
  }
  EXPECT_EQ(offsetof(m3qkv_fused_args, batch_invariant), 304u);
}

TEST(XBf16StructSize, TheNewSizesAndTheMessageListingThem) {
  EXPECT_EQ(sizeof(m3qkv_fused_args), 312u);
  EXPECT_EQ(offsetof(m3qkv_fused_args, x_bf16), 296u);
  EXPECT_EQ(sizeof(m3qkv_gemm_args), 88u);
  EXPECT_EQ(offsetof(m3qkv_gemm_args, x_bf16), 80u);
  m3qkv_fused_args a = valid_x_bf16<m3qkv_fused_args>();
  a.struct_size = 300;
  EXPECT_EQ(m3qkv_fused_qkv(&a, nullptr), M3QKV_ERROR_STRUCT_SIZE);
  EXPECT_STREQ(m3qkv_last_error(),
               "m3qkv_fused_qkv: struct_size = 300 is not the size of a released m3qkv_fused_args: 264 (m3qkv 0.1), "
               "296 (m3qkv 0.2) or 312 (this version)");
  m3qkv_gemm_args g = valid_x_bf16<m3qkv_gemm_args>();
  g.struct_size = 84;
  EXPECT_EQ(m3qkv_mxfp8_gemm(&g, nullptr), M3QKV_ERROR_STRUCT_SIZE);
  EXPECT_STREQ(m3qkv_last_error(),
               "m3qkv_mxfp8_gemm: struct_size = 84 is not the size of a released m3qkv_gemm_args: 80 (m3qkv 0.1) or "
               "88 (this version)");
  m3qkv_insert_args i = m3qkv_valid_args::valid_insert();
  i.struct_size = 240;
  EXPECT_EQ(m3qkv_qknorm_rope_kv_insert(&i, nullptr), M3QKV_ERROR_STRUCT_SIZE);
  EXPECT_STREQ(m3qkv_last_error(),
               "m3qkv_qknorm_rope_kv_insert: struct_size = 240 is not the size of a released m3qkv_insert_args: 232 "
               "(m3qkv 0.1) or 264 (m3qkv 0.2, this version)");
}

// Checked mode's list (and the overlap rule's): x_bf16 as M·K·2 input bytes,
// no xq / xsf entries.
TYPED_TEST(XBf16Validation, ExtentsHoldTheBf16ActivationsAsAnInput) {
  using A = TypeParam;
  const A a = valid_x_bf16<A>();
  m3qkv::api::Extents x;
  ASSERT_EQ(Api<A>::extents(a, &x), M3QKV_SUCCESS) << m3qkv_last_error();
  int found = 0;
  for (int i = 0; i < x.count; ++i) {
    const std::string name = x.items[i].name;
    EXPECT_NE(name, "xq");
    EXPECT_NE(name, "xsf");
    if (name != "x_bf16") continue;
    ++found;
    EXPECT_EQ(x.items[i].lo, reinterpret_cast<uintptr_t>(a.x_bf16));
    EXPECT_EQ(x.items[i].hi() - x.items[i].lo, static_cast<uint64_t>(kXBf16Bytes));
    EXPECT_FALSE(x.items[i].written);
  }
  EXPECT_EQ(found, 1);
  // The MXFP8 struct has no x_bf16 entry.
  const A q = Api<A>::valid();
  ASSERT_EQ(Api<A>::extents(q, &x), M3QKV_SUCCESS);
  for (int i = 0; i < x.count; ++i) EXPECT_NE(std::string(x.items[i].name), "x_bf16");
}

}  // namespace
