#pragma once
// The machinery every validation test of the C API shares (test_validation*.cpp):
// per-struct glue (the valid struct, the validator, the public entry point, the
// message prefix, the released struct sizes), one rejection rule as a table row
// (Case) and the one check of a rejection: validate_* and the public entry point
// give the same status, and the message opens with the function name and names
// the argument and its value.
//
// Fake device pointers only (valid_args.h): a public entry point is called only
// with arguments validate_* has already rejected, so nothing is ever launched.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "api/extents.h"
#include "api/internal.h"
#include "api/validate.h"
#include "m3qkv/m3qkv.h"
#include "valid_args.h"

namespace m3qkv_validation {

using m3qkv_valid_args::fake;

// A pointer as the messages print it.
inline std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(p)));
  return buf;
}

// Per-struct glue. kReleased: the sizes of the earlier releases on LP64
// (src/api/validate.cpp pins them; docs/contract.md §7.2).
template <class A>
struct Api;
template <>
struct Api<m3qkv_fused_args> {
  static m3qkv_fused_args valid() { return m3qkv_valid_args::valid_fused(); }
  static m3qkv_status validate(const m3qkv_fused_args* a, m3qkv_fused_args* out, bool* n) {
    return m3qkv::validate_fused(a, out, n);
  }
  static m3qkv_status call(const m3qkv_fused_args* a) { return m3qkv_fused_qkv(a, nullptr); }
  static m3qkv_status extents(const m3qkv_fused_args& a, m3qkv::api::Extents* x) {
    return m3qkv::api::fused_extents(fn, a, x);
  }
  static constexpr const char* fn = "m3qkv_fused_qkv";
  static constexpr size_t kReleased[] = {264, 296};  // 0.1, 0.2 (the cache formats)
};
template <>
struct Api<m3qkv_insert_args> {
  static m3qkv_insert_args valid() { return m3qkv_valid_args::valid_insert(); }
  static m3qkv_status validate(const m3qkv_insert_args* a, m3qkv_insert_args* out, bool* n) {
    return m3qkv::validate_insert(a, out, n);
  }
  static m3qkv_status call(const m3qkv_insert_args* a) { return m3qkv_qknorm_rope_kv_insert(a, nullptr); }
  static m3qkv_status extents(const m3qkv_insert_args& a, m3qkv::api::Extents* x) {
    return m3qkv::api::insert_extents(fn, a, x);
  }
  static constexpr const char* fn = "m3qkv_qknorm_rope_kv_insert";
  static constexpr size_t kReleased[] = {232, 264};  // 0.1, 0.2
};
template <>
struct Api<m3qkv_gemm_args> {
  static m3qkv_gemm_args valid() { return m3qkv_valid_args::valid_gemm(); }
  static m3qkv_status validate(const m3qkv_gemm_args* a, m3qkv_gemm_args* out, bool* n) {
    return m3qkv::validate_gemm(a, out, n);
  }
  static m3qkv_status call(const m3qkv_gemm_args* a) { return m3qkv_mxfp8_gemm(a, nullptr); }
  static m3qkv_status extents(const m3qkv_gemm_args& a, m3qkv::api::Extents* x) {
    return m3qkv::api::gemm_extents(fn, a, x);
  }
  static constexpr const char* fn = "m3qkv_mxfp8_gemm";
  static constexpr size_t kReleased[] = {80};  // 0.1 = 0.2
};
template <>
struct Api<m3qkv_quantize_args> {
  static m3qkv_quantize_args valid() { return m3qkv_valid_args::valid_quantize(); }
  static m3qkv_status validate(const m3qkv_quantize_args* a, m3qkv_quantize_args* out, bool* n) {
    return m3qkv::validate_quantize(a, out, n);
  }
  static m3qkv_status call(const m3qkv_quantize_args* a) { return m3qkv_mxfp8_quantize(a, nullptr); }
  static m3qkv_status extents(const m3qkv_quantize_args& a, m3qkv::api::Extents* x) {
    return m3qkv::api::quantize_extents(fn, a, x);
  }
  static constexpr const char* fn = "m3qkv_mxfp8_quantize";
  static constexpr size_t kReleased[] = {56};  // 0.1 = 0.2
};

// validate_* of `a` (the normalized copy discarded); *noop = its no-op flag.
template <class A>
m3qkv_status validate(const A* a, bool* noop) {
  A out;
  return Api<A>::validate(a, &out, noop);
}

// validate_* of a struct as a binary built against an earlier release passes
// it: `a` with struct_size = `size`, its first `copied` bytes in a buffer whose
// rest (what lies in memory past the caller's struct) is poison; *out, the
// normalized struct, is poisoned first.
template <class A>
m3qkv_status validate_released(A a, size_t size, size_t copied, A* out, bool* noop) {
  a.struct_size = size;
  std::vector<unsigned char> buf(sizeof(A) + 64, 0xAB);
  std::memcpy(buf.data(), &a, copied);
  std::memset(out, 0x5C, sizeof(A));
  return Api<A>::validate(reinterpret_cast<const A*>(buf.data()), out, noop);
}

// Shorthands for the case tables.
constexpr m3qkv_status kShape = M3QKV_ERROR_INVALID_SHAPE;
constexpr m3qkv_status kArg = M3QKV_ERROR_INVALID_ARGUMENT;
constexpr m3qkv_status kNull = M3QKV_ERROR_NULL_POINTER;
constexpr m3qkv_status kAlign = M3QKV_ERROR_MISALIGNED;
constexpr m3qkv_status kLarge = M3QKV_ERROR_TOO_LARGE;
constexpr m3qkv_status kSize = M3QKV_ERROR_STRUCT_SIZE;

// `a` is rejected by validate_* and by the public entry point with `want` and
// a message that opens with the function name and contains every needle.
template <class A>
void expect_rejected(const A& a, m3qkv_status want, const std::vector<std::string>& needles) {
  bool noop = true;
  const m3qkv_status direct = validate(&a, &noop);
  EXPECT_FALSE(noop);
  // Guard: never call the public API with arguments that pass validation.
  ASSERT_NE(direct, M3QKV_SUCCESS) << "accepted by validation";
  EXPECT_EQ(direct, want) << m3qkv_status_string(direct) << ": " << m3qkv_last_error();
  const m3qkv_status st = Api<A>::call(&a);
  const std::string msg = m3qkv_last_error();
  EXPECT_EQ(st, want) << m3qkv_status_string(st) << ": " << msg;
  EXPECT_EQ(msg.rfind(std::string(Api<A>::fn) + ": ", 0), 0u) << msg;
  for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "missing '" << n << "' in: " << msg;
}

// `a` passes validate_* (and is not a no-op).
template <class A>
void expect_valid(const A& a, const std::string& what) {
  bool noop = true;
  EXPECT_EQ(validate(&a, &noop), M3QKV_SUCCESS) << what << ": " << m3qkv_last_error();
  EXPECT_FALSE(noop) << what;
}

// One rejection rule: how to break the valid struct, the expected status and
// the substrings the message must contain (argument name and value).
template <class A>
struct Case {
  std::string name;
  std::function<void(A&)> mutate;
  m3qkv_status want;
  std::vector<std::string> needles;
};
template <class A>
void PrintTo(const Case<A>& c, std::ostream* os) {
  *os << c.name;
}
template <class A>
std::string case_name(const testing::TestParamInfo<Case<A>>& info) {
  return info.param.name;
}
template <class A>
void expect_rejected(const Case<A>& c) {
  SCOPED_TRACE(c.name);
  A a = Api<A>::valid();
  c.mutate(a);
  expect_rejected(a, c.want, c.needles);
}
template <class A>
std::vector<Case<A>> concat(std::vector<Case<A>> a, const std::vector<Case<A>>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace m3qkv_validation
