#pragma once
// Harness of the GPU end-to-end tests: a test Problem (tests/common/problem.h)
// mirrored on the device, outputs in guarded poisoned buffers, the golden
// expectation built on the same poison, and a byte-for-byte comparison that
// names the first differing element.
//
// Poison: every output buffer (and a guard zone of kGuard bytes on each side)
// is filled with a position-dependent non-zero pattern; `salt` 1 uses the
// complement of salt 0. The golden model writes into host copies of the same
// pattern, so comparing the whole buffers checks both "every byte that must be
// written is" and "no other byte changes" (skipped slots, other pages, page
// padding, rows past M). A byte the kernel fails to write could only escape if
// its golden value equalled the poison, which cannot hold for both salts: the
// tests that claim full coverage run both.
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "common/problem.h"
#include "common/test_util.h"
#include "gpu/gpu_util.h"
#include "host/device.h"
#include "m3qkv/m3qkv.h"

namespace m3qkv_gpu {

using m3qkv_test::HostOutputs;
using m3qkv_test::Problem;
using m3qkv_test::ProblemConfig;

// Prints the test seed once per process (replay a failure with M3QKV_TEST_SEED).
inline void print_seed_once() {
  static bool done = false;
  if (!done) {
    std::printf("[ seed ] M3QKV_TEST_SEED=%" PRIu64 "\n", m3qkv_test::test_seed());
    done = true;
  }
}

// Head layouts of docs/contract.md §2.1 used across the GPU tests (nq, nkv, niq, nik). Head
// counts nq + 2nkv + niq + nik: TP1 77 and TP2 39 are odd (a phantom head at
// SM100 cta_group 2), TP4 20, TP8 12, dense 20 (GQA without the indexer).
struct Heads {
  const char* name;
  int nq, nkv, niq, nik;
};
constexpr Heads kTP1{"TP1", 64, 4, 4, 1};
constexpr Heads kTP2{"TP2", 32, 2, 2, 1};
constexpr Heads kTP4{"TP4", 16, 1, 1, 1};
constexpr Heads kTP8{"TP8", 8, 1, 1, 1};
constexpr Heads kDense{"Dense", 16, 2, 0, 0};

// A problem's shape and data kind for one head layout (the other fields at
// their ProblemConfig defaults: NVFP4 caches, seed from the test seed).
inline ProblemConfig heads_config(const Heads& h, int64_t m, int64_t k, bool exact, int block_size) {
  ProblemConfig cfg;
  cfg.m = m;
  cfg.k = k;
  cfg.nq = h.nq;
  cfg.nkv = h.nkv;
  cfg.niq = h.niq;
  cfg.nik = h.nik;
  cfg.block_size = block_size;
  cfg.exact_data = exact;
  return cfg;
}

constexpr size_t kGuard = 4096;  // keeps the payload 16-B (and 4 KiB) aligned

inline uint8_t salted_poison(size_t i, int salt) { return static_cast<uint8_t>(poison_byte(i) ^ (salt ? 0xFFu : 0u)); }

// A device buffer of `bytes` payload with poisoned guard zones on both sides.
class GuardedBuffer {
 public:
  // Allocates and fills payload + guards with the salted pattern.
  cudaError_t init(size_t bytes, int salt);
  // Refills payload + guards with the pattern of `salt` in place: the address
  // stays, so a captured CUDA graph that writes here can be replayed on it.
  // Synchronous cudaMemcpy (legacy stream): before work on a non-blocking
  // stream reads or writes the buffer, synchronize the device.
  cudaError_t repoison(int salt);
  void* payload() const { return bytes_ ? static_cast<uint8_t*>(buf_.get()) + kGuard : nullptr; }
  size_t bytes() const { return bytes_; }
  // The payload's initial content (what the host expectation starts from).
  std::vector<uint8_t> initial_payload() const;
  // Downloads; *guards_ok = the guard zones still hold the poison; *first_bad
  // = offset relative to the payload of the first changed guard byte.
  cudaError_t fetch(std::vector<uint8_t>* payload, bool* guards_ok, int64_t* first_bad) const;

 private:
  DeviceBuffer buf_;
  size_t bytes_ = 0;
  int salt_ = 0;
};

// Every input of a Problem on the device.
class DeviceInputs {
 public:
  cudaError_t upload(const Problem& p);
  // The mapping callback of Problem::args_with (device pointer by field name).
  const void* get(const m3qkv_test::HostBuffer& b) const;
  std::function<const void*(const m3qkv_test::HostBuffer&)> mapper() const {
    return [this](const m3qkv_test::HostBuffer& b) { return get(b); };
  }

 private:
  std::vector<std::pair<std::string, DeviceBuffer>> bufs_;
};

// The outputs of the fused op / insert on the device (guarded, poisoned).
struct DeviceOutputs {
  GuardedBuffer q_out, q_fp8_out, index_q_out, kv_cache, v_cache, index_cache;
  int64_t v_in_kv = -1;  // >= 0: V inside kv_cache at this offset (interleaved FP8 / BF16 layout)
  DeviceBuffer flags;  // uint32, zeroed (or preset)
  cudaError_t init(const Problem& p, int salt, uint32_t preset_flags = 0);
  // Re-poisons every buffer in place (GuardedBuffer::repoison) and presets
  // the flags; the pointers of ptrs() do not change.
  cudaError_t repoison(int salt, uint32_t preset_flags = 0);
  m3qkv_test::OutputPtrs ptrs(bool with_flags = true) const;
};

// Host results of one run, as downloaded.
struct Fetched {
  std::vector<uint8_t> q_out, q_fp8_out, index_q_out, kv_cache, v_cache, index_cache;
  bool guards_ok = true;
  std::string guard_report;
  uint32_t flags = 0;
};
cudaError_t fetch_outputs(const DeviceOutputs& d, Fetched* f);

// Host expectation: outputs poisoned with the same salted pattern.
HostOutputs poisoned_host_outputs(const Problem& p, int salt, uint32_t preset_flags = 0);
// Golden epilogue of `p` on accumulator `acc` [M, N] into `o` (in place).
void golden_epilogue(const Problem& p, const float* acc, HostOutputs* o);
// Golden insert of `p` on a bf16 projection `qkv` [M, N] into `o` (in place).
void golden_insert(const Problem& p, const uint16_t* qkv, HostOutputs* o);

// The standalone insert's lane layouts (portable/plan.h InsertLayout), forced
// for one scope through m3qkv_testing_insert_layout; the destructor restores
// the plan's choice. Tests of the insert run each in turn.
constexpr int kInsertQuadRows = 1, kInsertWarpRows = 2, kInsertLane8Rows = 3, kInsertSplitC32Q8 = 4,
              kInsertSplitC16Q8 = 5, kInsertSplitC16Q8Guess = 6;
constexpr int kInsertLayouts[] = {kInsertQuadRows,   kInsertWarpRows,   kInsertLane8Rows,
                                  kInsertSplitC32Q8, kInsertSplitC16Q8, kInsertSplitC16Q8Guess};
constexpr int kInsertLayoutCount = sizeof(kInsertLayouts) / sizeof(kInsertLayouts[0]);
inline const char* insert_layout_name(int layout) {
  return layout == kInsertWarpRows     ? "warp rows"
         : layout == kInsertLane8Rows  ? "8-lane rows"
         : layout == kInsertSplitC32Q8 ? "split c32q8"
         : layout == kInsertSplitC16Q8 ? "split c16q8"
         : layout == kInsertSplitC16Q8Guess ? "split c16q8 + guess"
                                            : "quad rows";
}
class InsertLayoutScope {
 public:
  explicit InsertLayoutScope(int layout);
  ~InsertLayoutScope();
  InsertLayoutScope(const InsertLayoutScope&) = delete;
  InsertLayoutScope& operator=(const InsertLayoutScope&) = delete;
};

// Compares every output buffer byte for byte (gtest failures, non-fatal,
// with the first differing element decoded). `what` prefixes the messages.
void expect_same_outputs(const Problem& p, const HostOutputs& expected, const Fetched& got, const std::string& what,
                         bool compare_flags = true);
// Same comparison between two device runs.
void expect_same_fetched(const Problem& p, const Fetched& a, const Fetched& b, const std::string& what);

// Where byte `off` of a buffer sits, in words (row/col, page/slot/token).
std::string describe_offset(const Problem& p, const char* buffer, size_t off);

// Options of one fused run.
struct FusedRun {
  m3qkv_backend_kind backend = M3QKV_BACKEND_PORTABLE;  // NONE = public m3qkv_fused_qkv (auto dispatch)
  bool tap = false;        // also fetch the f32 accumulator (test-only entry point)
  int use_pdl = 0;
  int grid = 0;
  int cta_group = 0;
  bool with_flags = true;  // pass error_flags
};

// Runs the fused op once on fresh poisoned outputs (salt) and fetches them.
// `acc` receives the tap [M, N] when run.tap. Fatal gtest failures on error
// (call through ASSERT_NO_FATAL_FAILURE).
void run_fused(const Problem& p, const DeviceInputs& in, const FusedRun& run, int salt, Fetched* out,
               std::vector<float>* acc = nullptr, uint32_t preset_flags = 0);

// The tests of one kernel family call its backend entry directly:
// launch(validated args, device, f32 tap or null, stream) -> status.
using DirectLaunch =
    std::function<m3qkv_status(const m3qkv_fused_args&, const m3qkv::DeviceInfo&, float* tap, cudaStream_t)>;

// Runs `launch` once on fresh poisoned outputs (salt) and fetches them: the
// problem's args with use_pdl / grid set, validated (not a no-op), an f32 tap
// poisoned with NaN where `tap_out` is wanted, on `stream` (a fresh stream,
// so a fresh workspace, where null), synchronized. Fatal gtest failures on
// error (call through ASSERT_NO_FATAL_FAILURE).
void run_direct(const Problem& p, const DeviceInputs& in, int use_pdl, int grid, int salt, const DirectLaunch& launch,
                Fetched* out, std::vector<float>* tap_out, cudaStream_t stream = nullptr);

// Exact data: run(salt, out, tap) for poison salts 0 and 1 (the tap on salt 0
// only, null on salt 1: the path without a tap), each output against the
// golden epilogue on `acc`, the tap against `acc` entry by entry.
using ExactRun = std::function<void(int salt, Fetched* out, std::vector<float>* tap)>;
void check_exact_direct(const Problem& p, const std::vector<float>& acc, const std::string& what, const ExactRun& run);

// Backends m3qkv_fused_qkv can be forced to on this device: the portable one
// and, when different, the one automatic dispatch picks.
std::vector<m3qkv_backend_kind> fused_backends();
std::string backend_label(m3qkv_backend_kind k);

// ------------------------------------------------------------- children
// Tests that change process-wide state (a reset device, environment variables
// read once, the warmup's backend fallback) run in a child: this binary again
// with --gtest_filter on a DISABLED_ test and M3QKV_CHILD=1 (DISABLED_ keeps
// them out of a normal run; CHILD_ONLY() skips them outside a child).
bool in_child();
// Runs DISABLED_<test> of this binary in a child process with `env` (e.g.
// "M3QKV_CHECKED=1"); expects it to run and pass. Its output is printed.
void expect_child_passes(const std::string& test, const std::string& env = "");

// ‖a − ref‖₂ / ‖ref‖₂ over all elements, plus the largest |a − ref| / max|ref|.
struct ErrorFigure {
  double rel_fro = 0.0;
  double max_abs_over_max_ref = 0.0;
  int64_t non_finite = 0;
};
ErrorFigure relative_error(const float* a, const double* ref, size_t n);

// Number of elements whose f32 bits differ (first index in *first).
int64_t count_f32_mismatch(const float* a, const float* b, size_t n, int64_t* first);

}  // namespace m3qkv_gpu

#define CHILD_ONLY()                                                                   \
  do {                                                                                 \
    if (!::m3qkv_gpu::in_child()) GTEST_SKIP() << "runs in a child process of its parent test"; \
    M3QKV_REQUIRE_GPU();                                                               \
  } while (0)
