// Kernel declarations and parameter blocks of the portable backend (sm_80+),
// shared by the kernel files and the launchers (src/portable/launch.cu).
#pragma once

#include <stdint.h>

#include "common/epilogue.cuh"
#include "portable/plan.h"

namespace m3qkv {
namespace portable {

struct GemmOperands {
  const uint8_t* xq;   // e4m3 [M, K] (null with xb)
  const uint8_t* xsf;  // F8_128x4 of [M, K/32] (null with xb)
  const uint16_t* xb;  // bf16 activations [M, K] (x_bf16) or null
  const uint8_t* wq;   // e4m3 [N, K]
  const uint8_t* wsf;  // F8_128x4 of [N, K/32]
  int64_t m, n, k;
};

struct FusedParams {
  GemmOperands g;
  epi::EpilogueParams e;
  float* acc_tap;  // test only: f32 [M, N] or null
};
struct GemmParams {
  GemmOperands g;
  uint16_t* out;  // bf16 [M, N]
};
struct InsertParams {
  const uint16_t* qkv;  // bf16 [M, N]
  int64_t m;
  epi::EpilogueParams e;
  // 1: e's slot words were resolved by the owner passes below (every row owns
  // what it names), so the kernels skip their per-round owner tables.
  int32_t owners_resolved;
};
// The whole-call slot-owner passes (common/slot_owners.cuh) the insert runs
// first at large M: clear the table, insert every row's slot words, write the
// resolved words; grid-stride loops.
struct OwnerPassParams {
  const int64_t* slots;        // the call's slot_mapping (null: no KV cache heads)
  const int64_t* index_slots;  // index_slot_mapping (null: no index_k head)
  int64_t m;
  unsigned long long* key;  // [entries]
  int32_t* last;            // [entries]
  int64_t entries;          // a power of two
  int64_t* out_slots;       // [m] resolved slot_mapping
  int64_t* out_index;       // [m] resolved index_slot_mapping
};
struct QuantizeParams {
  const uint16_t* x;  // bf16 [M, K]
  uint8_t* xq;        // e4m3 [M, K]
  uint8_t* xsf;       // F8_128x4 of [M, K/32], ceil(M/128)·128 rows
  int64_t m, k;
};

constexpr int kQuantizeThreads = 256;

}  // namespace portable
}  // namespace m3qkv

// Persistent over tiles (grid may be smaller than the tile count): tile t is
// head t % heads of row block t / heads.
__global__ void m3qkv_portable_fused_kernel(const m3qkv::portable::FusedParams p);
__global__ void m3qkv_portable_gemm_kernel(const m3qkv::portable::GemmParams p);
// The insert's lane layouts (plan.h insert_plan). Quad rows: grid-stride
// over (8-row group, head) items, one warp per item, a quad of lanes per
// 128-value head row (epi::quad_row_epilogue). L-lane rows (warp: L = 32, 8):
// over (32/L-row group, head) items, L lanes per head row
// (epi::lane_row_epilogue<L>). Split c32q8 / c16q8: the cache heads' items in
// 32- / 16-lane rows first, then the q / index_q heads' in 8-lane rows.
// All but split c16q8 guess each warp's first row before griddepcontrol.wait
// (epi::row_guess); split c16q8 has an instance with the guess and one without.
__global__ void m3qkv_portable_insert_kernel(const m3qkv::portable::InsertParams p);
__global__ void m3qkv_portable_insert_warp_kernel(const m3qkv::portable::InsertParams p);
__global__ void m3qkv_portable_insert_lanes8_kernel(const m3qkv::portable::InsertParams p);
__global__ void m3qkv_portable_insert_split_c32q8_kernel(const m3qkv::portable::InsertParams p);
__global__ void m3qkv_portable_insert_split_c16q8_kernel(const m3qkv::portable::InsertParams p);
__global__ void m3qkv_portable_insert_split_c16q8_guess_kernel(const m3qkv::portable::InsertParams p);
__global__ void m3qkv_portable_slot_owners_clear_kernel(const m3qkv::portable::OwnerPassParams p);
__global__ void m3qkv_portable_slot_owners_insert_kernel(const m3qkv::portable::OwnerPassParams p);
__global__ void m3qkv_portable_slot_owners_resolve_kernel(const m3qkv::portable::OwnerPassParams p);
// Grid-stride over (padded row, 32-value block) items.
__global__ void m3qkv_portable_quantize_kernel(const m3qkv::portable::QuantizeParams p);
