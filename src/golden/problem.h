// Test problems of the golden model: every input of m3qkv_fused_args as host
// vectors, built from a seed, plus helpers that turn one into an args struct
// with host pointers (the golden model) or with any other pointers (device
// buffers, through a mapping callback). The one definition of the problems
// that the GPU tests (tests/common/problem.h wraps it) and the library's
// self-test (m3qkv_selftest, src/api/selftest.cpp) run; compiled into the
// library with the golden model (-ffp-contract=off, no fast-math).
//
// Data modes (docs/contract.md §3.8):
//  - random (exact_data = false): bf16 activations ~N(0,1) with per-row scale
//    variation and a few outliers, weights ~N(0, 0.02), both quantized by the
//    golden MXFP8 quantizer; realistic RoPE table; small random norm weights.
//  - exact (exact_data = true): e4m3 operands in {0, ±1, ±2} and e8m0 scales in
//    2^[-2, 2] such that every partial sum of every dot product, in any order,
//    is exactly representable with 12 significant bits (bound documented at
//    kExactMaxNonzero and checked by a CPU test), so acc is exact on any
//    hardware and every backend must produce the golden bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "m3qkv/m3qkv.h"

namespace m3qkv {
namespace golden {

// The poison byte pattern for output buffers: position-dependent and
// non-zero, so a kernel that writes zeros, or copies a neighbour, or skips a
// byte, is caught (the expectation starts from the same pattern).
inline uint8_t poison_byte(size_t i) { return static_cast<uint8_t>(0xA5u ^ static_cast<uint8_t>(i * 0x3Bu + (i >> 8))); }

// One problem: shape, cache formats and layouts, q modes, scales, data mode.
struct ProblemConfig {
  int64_t m = 7;
  int64_t k = 512;
  int nq = 16, nkv = 1, niq = 1, nik = 1;
  int block_size = 16;
  int64_t num_blocks = 0;         // 0 = auto: enough pages for ~2·m tokens (at least 3 pages)
  int64_t kv_page_stride = 0;     // 0 = packed page (2·nkv·block_size·72) + 64 bytes
  int64_t num_index_blocks = 0;   // 0 = auto, as num_blocks
  int64_t index_page_stride = 0;  // 0 = packed page (block_size·72) + 64 bytes
  int64_t max_position = 4096;
  bool q_bf16 = true;             // write q_out
  bool q_fp8 = true;              // write q_fp8_out
  float q_fp8_scale = 0.0625f;
  float k_scale = 0.5f;
  float v_scale = 2.0f;
  float eps = 1e-6f;
  bool exact_data = false;
  // bf16 activations (x_bf16 of m3qkv_fused_args; xq / xsf stay empty and
  // NULL in the args). Exact data: x elements ±j·2^(bx−6), j in [1, 255]
  // (8 significant bits: every bit of the bf16 significand matters), as sparse
  // as the MXFP8 exact data, with the same exact weights (bound at
  // kExactBf16Log2Bound). Random data: the bf16 activations themselves, not
  // quantized (the same draws the MXFP8 problem of this seed quantizes).
  bool x_bf16 = false;
  // Seed of the generator (std::mt19937_64; any value). The tests'
  // m3qkv_test::make_problem replaces 0 with m3qkv_test::test_seed().
  uint64_t seed = 0;
  double slot_skip_fraction = 0.125;  // tokens whose slot (and, independently, index slot) is < 0
  bool out_of_range_slots = false;      // some slots / index slots >= capacity
  // Tokens that take the slot (and, independently, the index slot) of another
  // token, a third of them one of a few hot tokens' (docs/contract.md §4.4:
  // the last token naming a slot writes it).
  double shared_slot_fraction = 0.0;
  bool out_of_range_positions = false;  // some positions < 0 or >= max_position
  // Cache formats (docs/contract.md §4.3): m3qkv_cache_dtype of the KV and the index cache.
  int kv_dtype = 0;
  int index_dtype = 0;
  // FP8 / BF16 KV layout. Token-major pages [block_size][nkv][128] (vLLM flash)
  // unless kv_head_major ([nkv][block_size][128]). kv_row_pad bytes (% 16) are
  // added to the innermost stride (head stride, or token stride when
  // head-major), so that stride is not 128·e. kv_interleaved: one allocation
  // [num_blocks][2][page] with v_cache = kv_cache + the K block; else two
  // separate buffers of num_blocks pages. kv_page_stride = 0: the page (both
  // halves when interleaved) + 64 bytes.
  bool kv_head_major = false;
  int64_t kv_row_pad = 0;
  bool kv_interleaved = false;
  std::string describe() const;
};

// Exact-data bound (see problem.cpp exact_operands): per dot product at most kExactMaxNonzero
// nonzero products, |product| / min|product| <= 2^kExactLog2Ratio, so
// Σ|products| / min|product| <= kExactMaxNonzero·2^kExactLog2Ratio < 2^11.
constexpr int kExactMaxNonzero = 127;
constexpr int kExactLog2Ratio = 4;
static_assert(kExactMaxNonzero * (1 << kExactLog2Ratio) < (1 << 11), "exact-data bound");
// Exact data with bf16 activations: per dot product at most kExactMaxNonzero
// nonzero products, each an integer multiple j·w of p_min = 2^(bx − 6 + bw)
// with j <= 255 and w <= 4, so every partial sum, in any order, is an integer
// times p_min of magnitude < 2^kExactBf16Log2Bound: exact in f32 (24 bits),
// also for an accumulator that aligns the addends to the largest and cuts
// the bits below its 24-bit window (the bf16 MMAs' f32 accumulation).
constexpr int kExactBf16MaxJ = 255;
constexpr int kExactBf16Log2Bound = 17;
static_assert(int64_t{kExactMaxNonzero} * kExactBf16MaxJ * 4 < (int64_t{1} << kExactBf16Log2Bound),
              "exact-data bound (bf16 activations)");

// One input buffer of the problem (host bytes).
struct HostBuffer {
  const char* name;  // the m3qkv_fused_args field name
  const void* data;  // host pointer (nullptr when bytes == 0)
  size_t bytes;
};

// Output pointers (host or device, as the caller needs). Null = not requested.
struct OutputPtrs {
  void* q_out = nullptr;
  void* q_fp8_out = nullptr;
  void* index_q_out = nullptr;
  void* kv_cache = nullptr;
  void* v_cache = nullptr;  // FP8 / BF16 KV only
  void* index_cache = nullptr;
  uint32_t* error_flags = nullptr;
};

// Host output buffers, poisoned at construction.
struct HostOutputs {
  std::vector<uint16_t> q_out;
  std::vector<uint8_t> q_fp8_out;
  std::vector<uint8_t> index_q_out;
  std::vector<uint8_t> kv_cache;
  std::vector<uint8_t> v_cache;  // separate V buffer (FP8 / BF16, not interleaved)
  std::vector<uint8_t> index_cache;
  int64_t v_in_kv = -1;  // >= 0: V lives in kv_cache at this byte offset (interleaved)
  uint32_t flags = 0;
  OutputPtrs ptrs();  // empty vectors give nullptr
};

struct Problem {
  ProblemConfig cfg;  // with auto fields resolved and seed filled in
  int64_t m = 0, k = 0;
  int nq = 0, nkv = 0, niq = 0, nik = 0;
  int block_size = 0;
  int64_t num_blocks = 0, kv_page_stride = 0, num_index_blocks = 0, index_page_stride = 0;
  int64_t max_position = 0;
  int kv_dtype = 0, index_dtype = 0;
  int64_t kv_token_stride = 0, kv_head_stride = 0;  // FP8 / BF16 KV (0 for NVFP4)
  int64_t v_in_kv = -1;  // interleaved: byte offset of v_cache in kv_cache; -1: separate buffer

  std::vector<uint8_t> xq, xsf, wq, wsf;  // xq, xsf empty with cfg.x_bf16
  std::vector<uint16_t> x_bf16;           // bf16 [m, k] with cfg.x_bf16, else empty
  std::vector<int64_t> positions;
  std::vector<uint16_t> cos_sin_cache;  // bf16 [max_position, 64]
  std::vector<uint16_t> q_norm_weight, k_norm_weight, index_q_norm_weight, index_k_norm_weight;  // bf16 [128]
  std::vector<int64_t> slot_mapping, index_slot_mapping;

  int64_t n() const { return int64_t(nq + 2 * nkv + niq + nik) * 128; }
  int64_t q_elems() const { return m * nq * 128; }          // q_out / q_fp8_out elements
  int64_t index_q_elems() const { return m * niq * 128; }
  int64_t acc_elems() const { return m * n(); }
  size_t q_out_bytes() const { return cfg.q_bf16 ? size_t(q_elems()) * 2 : 0; }
  size_t q_fp8_out_bytes() const { return cfg.q_fp8 ? size_t(q_elems()) : 0; }
  size_t index_q_out_bytes() const { return size_t(index_q_elems()); }
  size_t kv_cache_bytes() const { return size_t(num_blocks * kv_page_stride); }
  bool kv_flat() const { return kv_dtype != 0; }
  bool index_flat() const { return index_dtype != 0; }
  int kv_elem() const { return kv_dtype == 2 ? 2 : 1; }
  int index_elem() const { return index_dtype == 2 ? 2 : 1; }
  size_t v_cache_bytes() const { return kv_flat() && v_in_kv < 0 ? kv_cache_bytes() : 0; }
  size_t index_cache_bytes() const { return nik ? size_t(num_index_blocks * index_page_stride) : 0; }
  int64_t kv_capacity() const { return num_blocks * block_size; }
  int64_t index_capacity() const { return num_index_blocks * block_size; }
  float k_sf() const;  // RN(1/k_scale) as the quantizer uses it
  float v_sf() const;

  // The inputs, in m3qkv_fused_args order (x_bf16, appended in 0.3, last);
  // index_* buffers are empty when the head count is 0, xq / xsf with
  // cfg.x_bf16 and x_bf16 without it (their fields are then null).
  std::vector<HostBuffer> inputs() const;
  // Outputs sized for this problem, every byte = poison (flags = 0).
  HostOutputs make_outputs(uint8_t poison) const;

  // m3qkv_fused_args with HOST input pointers (for the golden model).
  m3qkv_fused_args host_args(const OutputPtrs& out) const;
  // m3qkv_fused_args whose input pointers are map(buffer) for every non-empty
  // input (e.g. a callback that copies to the device and returns the device
  // pointer), nullptr for empty ones.
  m3qkv_fused_args args_with(const std::function<const void*(const HostBuffer&)>& map, const OutputPtrs& out) const;
  // m3qkv_insert_args for a bf16 qkv [m, n] at `qkv` (host or device, same
  // convention as args_with for the other inputs).
  m3qkv_insert_args insert_args_with(const std::function<const void*(const HostBuffer&)>& map, const void* qkv,
                                     const OutputPtrs& out) const;
  m3qkv_insert_args host_insert_args(const void* qkv, const OutputPtrs& out) const;
};

// Builds a problem from cfg (cfg.seed as given). Throws std::invalid_argument
// on a bad config.
Problem build_problem(const ProblemConfig& cfg);

// Golden reference outputs for a problem: poisoned outputs, then the golden
// epilogue on `acc` (or on the golden accumulator when acc == nullptr).
HostOutputs golden_outputs(const Problem& p, uint8_t poison, const float* acc = nullptr);

// The golden f32 accumulator [m, N] of p: w8a16_acc on x_bf16 or mxfp8_acc on
// (xq, xsf) (golden::fused_acc).
std::vector<float> problem_acc(const Problem& p);

// p with its MXFP8 activations replaced by bf16 ones holding exactly their
// values (bf16_rn(e4m3(xq)·2^e), every one checked to be exact; throws
// std::invalid_argument otherwise): cfg.x_bf16 = true, xq / xsf empty. Its
// golden accumulator has the bits of p's.
Problem with_dequantized_x_bf16(const Problem& p);

}  // namespace golden
}  // namespace m3qkv
