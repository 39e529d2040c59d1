#pragma once
// Valid argument structs of the C API for the CPU tests (validation and
// dispatch), one definition: MiniMax-M3 TP4 (nq 16, nkv 1, niq 1, nik 1,
// K 6144, M 7, block_size 16: kv page 2·1·16·72 = 2304 B, index page
// 16·72 = 1152 B), every pointer a fake device address.
#include <cstdint>
#include <cstring>

#include "m3qkv/m3qkv.h"

namespace m3qkv_valid_args {

// Fake pointers: distinct addresses far from anything mapped, plus an
// optional byte offset to make them misaligned. Never dereferenced
// (validation rejects first; the dispatch tests' launchers are recorders).
// Slots are 2^44 bytes (16 TiB) apart, so even the largest valid shapes of
// the tests (m = 2^31 - 1: xq 12 TiB) keep every buffer apart and pass the
// overlap rule.
constexpr uintptr_t kFakeSlotBytes = uintptr_t{1} << 44;

template <class T = void>
T* fake(int slot, uintptr_t offset = 0) {
  return reinterpret_cast<T*>((static_cast<uintptr_t>(slot) + 1) * kFakeSlotBytes + offset);
}

template <class A>
void fill_epilogue(A& a) {
  a.m = 7;
  a.nq = 16;
  a.nkv = 1;
  a.niq = 1;
  a.nik = 1;
  a.positions = fake<const int64_t>(10);
  a.max_position = 4096;
  a.cos_sin_cache = fake(11);
  a.q_norm_weight = fake(12);
  a.k_norm_weight = fake(13);
  a.index_q_norm_weight = fake(14);
  a.index_k_norm_weight = fake(15);
  a.eps = 1e-6f;
  a.slot_mapping = fake<const int64_t>(16);
  a.index_slot_mapping = fake<const int64_t>(17);
  a.kv_cache = fake(18);
  a.kv_page_stride = 2304;
  a.num_blocks = 4;
  a.index_cache = fake(19);
  a.index_page_stride = 1152;
  a.num_index_blocks = 2;
  a.block_size = 16;
  a.q_out = fake(20);
  a.q_fp8_out = fake(21);
  a.index_q_out = fake(22);
  a.q_fp8_scale = 1.0f;
  a.k_scale = 1.0f;
  a.v_scale = 1.0f;
  a.use_pdl = 1;
  a.grid = 0;
  a.error_flags = fake<uint32_t>(23);
}

inline m3qkv_fused_args valid_fused() {
  m3qkv_fused_args a;
  std::memset(&a, 0, sizeof(a));
  a.struct_size = sizeof(a);
  fill_epilogue(a);
  a.k = 6144;
  a.xq = fake(1);
  a.xsf = fake(2);
  a.wq = fake(3);
  a.wsf = fake(4);
  a.cta_group = 0;
  return a;
}

inline m3qkv_insert_args valid_insert() {
  m3qkv_insert_args a;
  std::memset(&a, 0, sizeof(a));
  a.struct_size = sizeof(a);
  fill_epilogue(a);
  a.qkv = fake(5);
  return a;
}

inline m3qkv_gemm_args valid_gemm() {
  m3qkv_gemm_args a;
  std::memset(&a, 0, sizeof(a));
  a.struct_size = sizeof(a);
  a.m = 7;
  a.n = 2560;
  a.k = 6144;
  a.xq = fake(1);
  a.xsf = fake(2);
  a.wq = fake(3);
  a.wsf = fake(4);
  a.out = fake(6);
  a.use_pdl = 0;
  a.grid = 0;
  return a;
}

inline m3qkv_quantize_args valid_quantize() {
  m3qkv_quantize_args a;
  std::memset(&a, 0, sizeof(a));
  a.struct_size = sizeof(a);
  a.m = 7;
  a.k = 6144;
  a.x = fake(7);
  a.xq = fake(1);
  a.xsf = fake(2);
  a.use_pdl = 1;
  return a;
}

// N 256, K 1024: disjoint weights in and out.
inline m3qkv_prepare_args valid_prepare() {
  m3qkv_prepare_args a;
  std::memset(&a, 0, sizeof(a));
  a.struct_size = sizeof(a);
  a.n = 256;
  a.k = 1024;
  a.wq = fake(3);
  a.wsf = fake(4);
  a.wq_out = fake(8);
  a.wsf_out = fake(9);
  return a;
}

}  // namespace m3qkv_valid_args
