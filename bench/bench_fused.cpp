// m3qkv benchmark (Google Benchmark, manual time from CUDA events).
//
// Sweep (issue 4): MiniMax-M3 with K = 6144, NVFP4 caches with block_size
// 128, q written as bf16, index_q as e4m3, for the four tensor-parallel head
// layouts (nq, nkv, niq, nik; N = (nq + 2·nkv + niq + nik)·128):
//   TP4 (16, 1, 1, 1) N = 2560    TP2 (32, 2, 2, 1) N = 4992
//   TP1 (64, 4, 4, 1) N = 9856    TP8 ( 8, 1, 1, 1) N = 1536
// and M ∈ {1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}. Every
// benchmark takes (TP, M) as arguments, so names read
// `<op>/TP:<tp>/M:<m>/manual_time` and --benchmark_filter selects subsets
// (e.g. 'TP:4/', '/M:4096/', '^fused_'). Ops per (TP, M), in this order:
//   fused_<backend>      m3qkv fused kernel, automatic backend (sm90 on H200)
//   unfused_gemm+insert  m3qkv_mxfp8_gemm (bf16 qkv) + m3qkv_qknorm_rope_kv_insert
//   cublas_bf16          cuBLAS bf16 GEMM [M,K]·[N,K]ᵀ → bf16 (the weight stream is 2×)
//   cublas_bf16+insert   the same, then m3qkv's insert on its bf16 [M, N] output
//   cublaslt_fp8         cuBLASLt e4m3 GEMM, per-tensor scales, → bf16
//   cublaslt_fp8+insert  the same, then m3qkv's insert on its output
//   fused_<backend>_xbf16_fp8 the fused kernel, FP8 caches, bf16 activations (x_bf16)
//   fused_<backend>_invariant_fp8 the fused kernel, FP8 caches, batch_invariant = 1
//   fused_sm90_fast_fp8         FP8 caches, precision = 1 on prepared weights (sm90_fast: its kernel forced)
//   fused_<backend>_<fmt> the fused kernel writing FP8 or BF16 caches (fmt = fp8,
//                        bf16: KV and index cache in that format, vLLM flash KV
//                        layout [num_blocks, 128, nkv, 128] as two tensors)
//   insert_<fmt>         m3qkv_qknorm_rope_kv_insert alone on the bf16 qkv
//                        (fmt = nvfp4, fp8, bf16), with counters bound_us =
//                        1.5 · bytes / copy bandwidth + 2 µs (the issue-13
//                        target) and x_bound = time / bound_us; beside each
//                        (M <= 4096), insert_<fmt>_quad / _warp / _l8 /
//                        _c32q8 / _c16q8 / _c16q8g with the lane layout
//                        forced (the plan's thresholds)
// plus copy_d2d (first, after the peaks): cudaMemcpyAsync device to device of
// 1 GiB, whose bandwidth (bytes read + written) the insert bounds use (4.24 TB/s,
// an H200's, when it is filtered out: counter copy_bw_assumed).
// The "+insert" lines are what a serving stack without m3qkv would run: a
// vendor GEMM, then a separate norm/RoPE/cache-insert pass over the bf16
// projection. Only at TP4 and M ∈ {1, 64, 512, 4096} (they are slow and exist
// for the performance log): fused_portable (portable backend forced, when it
// is not the automatic one). At every TP from M = 512: sm90_A_regs /
// sm90_A_preA / sm90_prefill (the three SM90 tile instances on the same
// 128-row plan). First of all, peak_bf16 / peak_fp8:
// cuBLAS(Lt) 8192³ GEMMs (warm L2, compute-bound) whose TFLOP/s are the peak
// the "≥ 75 % of the bf16 tensor peak" target is measured against, taken in
// the same run as the rest. Run order: peaks, then TP4, TP2, TP1, TP8, each
// by ascending M (a run cut short still has the reference TP4 complete).
// tools/bench_table.py turns the JSON output into the per-TP tables.
// Last, host_fused_qkv / host_insert / host_gemm / host_quantize (issue 12):
// the CPU time of the call itself with the GPU idle, its phases and the
// kernel time beside it (see bench_host), and the same measurement of
// host_cublas_bf16 / host_cublaslt_fp8 (one cuBLAS call, TP4) and
// host_launch_empty (a bare cudaLaunchKernelEx with PDL: the launch floor of
// this host); select them with --benchmark_filter='^host_'.
//
// Cold-L2 methodology: every op rotates over R input/output sets with
// R·(per-call bytes) ≥ 3 × L2, so no call finds its weights in L2. R is one
// number per (TP, M), taken from the op with the smallest footprint, so all
// ops of a case share the sets (the "+insert" lines pair cuBLAS set i with the
// insert outputs of m3qkv set i). One benchmark iteration = U = ceil(64 / R)
// passes over the R sets between two CUDA events, captured once as one CUDA
// graph of U·R calls and replayed (see timed_loop: at least 64 calls, so the
// graph's start-up cost is spread alike over every case); the iteration time
// reported is the iteration's time / (U·R) (time per call).
//
// Counters: us (per call), TFLOP/s (2·M·N·K), GB/s over "bytes" = weights +
// activations (+ scale factors) + outputs (+ the small per-token inputs for
// the m3qkv ops), i.e. what one call must move at least once. The unfused and
// "+insert" pairs also move the bf16 qkv twice (write + read): reported as
// traffic_MB, not counted in GB/s, so GB/s stays comparable to the fused
// kernel.
//
// Run time: Google Benchmark sizes its runs by the *manual* time, i.e. per
// call, while one iteration costs U·R calls of wall time; each benchmark
// therefore gets MinTime(target / (U·R)), which makes every entry cost about
// 1.5 × target seconds of GPU time whatever its R or M (target =
// M3QKV_BENCH_TARGET_S, default 0.3 s; per-benchmark MinTime overrides
// --benchmark_min_time). The per-benchmark min_time would appear in the names
// ("/min_time:0.025/"); the reporters drop it so names stay
// `<op>/TP:<tp>/M:<m>/manual_time` in the console and JSON output (not in
// --benchmark_list_tests, nor for the filter, which see the full name).
// Only one (TP, M) case is resident at a time (buffers are freed when the
// sweep moves on): the largest, TP1 M = 16384 with R = 2, needs ~4 GB.
//
// No GPU: prints a message and exits 0 without running anything
// (--benchmark_list_tests still lists the sweep as an H200 would register it).
#include <benchmark/benchmark.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#ifndef M3QKV_WITH_SM90  // set by bench/CMakeLists.txt
#define M3QKV_WITH_SM90 0
#endif

#include "api/internal.h"  // m3qkv_testing_fused_qkv (forced backend)
#if M3QKV_WITH_SM90
#include "sm90/sm90.h"  // sm90_fused_variant: the two MX mainloops side by side
#endif
#include "common/layouts.h"
#include "floor_read.h"
#include "m3qkv/m3qkv.h"

namespace {

constexpr int64_t kK = 6144;
constexpr int kBlock = 128;
constexpr int64_t kMaxPosition = 8192;
constexpr int64_t kPeakDim = 8192;  // peak_bf16 / peak_fp8: 8192³

// Head layouts of docs/contract.md §2.1 (the same as tests/gpu/harness.h), in sweep order:
// TP4 first (the reference configuration), so a cut-short run still has it.
struct Heads {
  int tp, nq, nkv, niq, nik;
  int64_t n() const { return int64_t(nq + 2 * nkv + niq + nik) * 128; }
};
constexpr Heads kHeads[] = {{4, 16, 1, 1, 1}, {2, 32, 2, 2, 1}, {1, 64, 4, 4, 1}, {8, 8, 1, 1, 1}};
const int64_t kMs[] = {1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 16384};
// The slow TP4-only entries (forced portable, SM90 mainloop variants).
constexpr int kExtraTp = 4;
const int64_t kExtraMs[] = {1, 64, 512, 4096};
// Every TP: the decode and tile paths of SM90 side by side (the crossover).
const int64_t kCrossoverMs[] = {32, 64, 128, 256, 512, 1024};

const Heads& heads_of(int64_t tp) {
  for (const Heads& h : kHeads)
    if (h.tp == tp) return h;
  return kHeads[0];  // unreachable: only registered TPs reach here
}

// ------------------------------------------------------------ bytes / flops
// What the attention pre-processing must move per call besides the GEMM
// operands: the small per-token inputs and the outputs.
// Cache formats of the sweep (m3qkv_cache_dtype): bytes one cache token of one head takes.
constexpr int kFormats = 3;
const char* const kFormatNames[kFormats] = {"nvfp4", "fp8", "bf16"};
constexpr double kTokenBytes[kFormats] = {72, 128, 256};  // NVFP4 64 data + 8 scales; 128 elements of 1 / 2 B
double epilogue_bytes(const Heads& h, int64_t m, int fmt = 0) {
  const double md = double(m);
  double b = md * (8 + 8 + 8 + 128) + 4 * 256;  // positions, 2 slot maps, cos/sin row, norm weights
  b += md * h.nq * 128 * 2 + md * h.niq * 128;  // q bf16 + index_q e4m3
  b += md * (2 * h.nkv + h.nik) * kTokenBytes[fmt];  // K, V, index_k cache tokens
  return b;
}
// What one insert call must move at least once (bench/README.md):
// the bf16 qkv [M, N] it reads plus everything the epilogue reads and writes.
double insert_bytes(const Heads& h, int64_t m, int fmt) { return double(m * h.n()) * 2 + epilogue_bytes(h, m, fmt); }
// Bytes one fused call must move at least once (bench/README.md).
double fused_bytes(const Heads& h, int64_t m, int fmt = 0) {
  const int64_t n = h.n();
  double b = double(n * kK) + double(m3qkv::f8_128x4_bytes(n, kK / 32));   // wq + wsf
  b += double(m * kK) + double(m3qkv::f8_128x4_bytes(m, kK / 32));         // xq + xsf
  return b + epilogue_bytes(h, m, fmt);
}
// A cuBLAS GEMM alone: operands of esz bytes per element + the bf16 output.
double blas_bytes(const Heads& h, int64_t m, int esz) {
  return double(esz) * double(h.n() * kK + m * kK) + double(m * h.n()) * 2;
}
// A cuBLAS GEMM + insert: operands + what the insert writes (the bf16 qkv in
// between is traffic, as in the unfused pair).
double blas_insert_bytes(const Heads& h, int64_t m, int esz) {
  return double(esz) * double(h.n() * kK + m * kK) + epilogue_bytes(h, m);
}
double qkv_round_trip(const Heads& h, int64_t m) { return 2.0 * double(m * h.n()) * 2.0; }
double flops(const Heads& h, int64_t m) { return 2.0 * double(m) * double(h.n()) * double(kK); }

// ----------------------------------------------------------------- helpers
struct DevMem {
  void* p = nullptr;
  DevMem() = default;
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
  ~DevMem() {
    if (p) cudaFree(p);
  }
};
using DevPtr = std::unique_ptr<DevMem>;

std::string g_error;  // first setup error (reported through SkipWithError)

void* dev_alloc(std::vector<DevPtr>& own, size_t n) {
  auto d = std::make_unique<DevMem>();
  const cudaError_t e = cudaMalloc(&d->p, std::max<size_t>(n, 16));
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    if (g_error.empty()) g_error = std::string("cudaMalloc failed: ") + cudaGetErrorString(e);
    return nullptr;
  }
  void* p = d->p;
  own.push_back(std::move(d));
  return p;
}

// Host data (or zeros when h is null) into a new device buffer.
void* dev_upload(std::vector<DevPtr>& own, const void* h, size_t n) {
  void* p = dev_alloc(own, n);
  if (!p) return nullptr;
  cudaError_t e = cudaSuccess;
  if (h && n) e = cudaMemcpy(p, h, n, cudaMemcpyHostToDevice);
  if (!h && n) e = cudaMemset(p, 0, n);
  if (e != cudaSuccess && g_error.empty()) g_error = std::string("cuda copy failed: ") + cudaGetErrorString(e);
  return e == cudaSuccess ? p : nullptr;
}

// A device-side copy of src: the sets after the first are cloned on the
// device, far faster than another host upload of hundreds of MB.
void* dev_clone(std::vector<DevPtr>& own, const void* src, size_t n) {
  void* p = dev_alloc(own, n);
  if (!p) return nullptr;
  const cudaError_t e = cudaMemcpy(p, src, n, cudaMemcpyDeviceToDevice);
  if (e != cudaSuccess && g_error.empty()) g_error = std::string("cuda copy failed: ") + cudaGetErrorString(e);
  return e == cudaSuccess ? p : nullptr;
}

// Set 0 gets the host data, set i > 0 a device copy of set 0's buffer.
void* dev_set_buffer(std::vector<DevPtr>& own, const void* host, const void* first, size_t n) {
  return first ? dev_clone(own, first, n) : dev_upload(own, host, n);
}

struct Device {
  int id = 0;
  int l2 = 0;
  int sms = 0;
  int cc_major = 0;
  std::string name;
  cudaStream_t stream = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = size_t(32) << 20;
  bool ok = false;
};
Device& dev() {
  static Device d;
  return d;
}

bool init_device() {
  Device& d = dev();
  if (cudaGetDevice(&d.id) != cudaSuccess) return false;
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, d.id) != cudaSuccess) return false;
  d.name = prop.name;
  d.l2 = prop.l2CacheSize;
  d.sms = prop.multiProcessorCount;
  d.cc_major = prop.major;
  if (cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking) != cudaSuccess) return false;
  if (cudaEventCreate(&d.e0) != cudaSuccess || cudaEventCreate(&d.e1) != cudaSuccess) return false;
  if (cublasCreate(&d.blas) != CUBLAS_STATUS_SUCCESS) return false;
  if (cublasSetStream(d.blas, d.stream) != CUBLAS_STATUS_SUCCESS) return false;
  if (cublasLtCreate(&d.lt) != CUBLAS_STATUS_SUCCESS) return false;
  if (cudaMalloc(&d.workspace, d.workspace_bytes) != cudaSuccess) return false;
  if (cublasSetWorkspace(d.blas, d.workspace, d.workspace_bytes) != CUBLAS_STATUS_SUCCESS) return false;
  if (m3qkv_warmup(d.id) != M3QKV_SUCCESS) {
    std::fprintf(stderr, "m3qkv_warmup: %s\n", m3qkv_last_error());
    return false;
  }
  d.ok = true;
  return true;
}

void shutdown_device() {
  Device& d = dev();
  if (d.lt) cublasLtDestroy(d.lt);
  if (d.blas) cublasDestroy(d.blas);
  if (d.workspace) cudaFree(d.workspace);
  if (d.e0) cudaEventDestroy(d.e0);
  if (d.e1) cudaEventDestroy(d.e1);
  if (d.stream) cudaStreamDestroy(d.stream);
}

// Without a device (--benchmark_list_tests offline) the H200's 60 MiB stands
// in, so the listing shows what an H200 run registers.
constexpr int kAssumedL2 = 60 << 20;

// Number of rotating sets so that R·set_bytes ≥ 3·L2 (2..64).
int rotation(double set_bytes) {
  const double l2 = std::max(dev().l2 > 0 ? dev().l2 : kAssumedL2, 1 << 20);
  return int(std::min(64.0, std::max(2.0, std::ceil(3.0 * l2 / set_bytes))));
}
// One R per (TP, M) from the op with the smallest per-call footprint (the
// fused kernel or the fp8 GEMM): every other op of the case touches at least
// as much per call, so it also rotates through ≥ 3 × L2 per pass.
int case_rotation(const Heads& h, int64_t m) {
  return rotation(std::min(fused_bytes(h, m), blas_bytes(h, m, 1)));
}

// Host fill. Contents do not matter for L2 (addresses do), but random bits
// keep the tensor cores' power draw representative. splitmix64 instead of
// std::normal_distribution: the largest case fills ~500 MB, which the
// standard distributions would take seconds to produce.
struct FastRng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
};
// Random e4m3 bytes, no NaN (0x7f / 0xff).
void fill_e4m3(std::vector<uint8_t>& v, uint64_t seed) {
  FastRng rng{seed};
  for (size_t i = 0; i < v.size(); i += 8) {
    uint64_t r = rng.next();
    for (size_t j = i; j < std::min(v.size(), i + 8); ++j, r >>= 8) {
      uint8_t b = uint8_t(r);
      if ((b & 0x7f) == 0x7f) b ^= 1;
      v[j] = b;
    }
  }
}
// E8M0 scale bytes in [base, base + 7].
void fill_scales(std::vector<uint8_t>& v, uint8_t base, uint64_t seed) {
  FastRng rng{seed};
  for (auto& b : v) b = uint8_t(base + (rng.next() & 7));
}
// Random-sign bf16 with magnitudes in [2^(e-127), 2^(e-123)), random mantissa.
void fill_bf16(uint16_t* p, size_t n, int e, uint64_t seed) {
  FastRng rng{seed};
  for (size_t i = 0; i < n; i += 4) {
    uint64_t r = rng.next();
    for (size_t j = i; j < std::min(n, i + 4); ++j, r >>= 16) {
      const uint16_t bits = uint16_t(r);
      p[j] = uint16_t((bits & 0x8000u) | (uint16_t(e + ((bits >> 7) & 3)) << 7) | (bits & 0x7fu));
    }
  }
}

// -------------------------------------------------------------- m3qkv sets
// One set = every buffer one call touches that is large (operands, outputs).
struct M3Set {
  m3qkv_fused_args fused;    // NVFP4 caches
  m3qkv_gemm_args gemm;
  m3qkv_insert_args insert;  // NVFP4 caches
  // The same calls writing caches of format f (index: m3qkv_cache_dtype; [0] = the NVFP4 ones above).
  m3qkv_fused_args fused_fmt[kFormats];
  m3qkv_insert_args insert_fmt[kFormats];
  // FP8 caches with bf16 activations (x_bf16, W8A16) instead of xq / xsf.
  m3qkv_fused_args fused_xbf16;
};
struct M3Sets {
  std::vector<DevPtr> own;
  std::vector<M3Set> sets;
  // precision = 1 (fp8 fast mode): each set's FP8-cache call on its own
  // prepared copy of the weights (built on first use: fast_args).
  std::vector<m3qkv_fused_args> fast;
};

std::unique_ptr<M3Sets> build_m3_sets(const Heads& h, int64_t m, int r) {
  auto s = std::make_unique<M3Sets>();
  const int64_t n = h.n();
  const uint64_t seed = 0x5EED0000ULL + uint64_t(h.tp) * 0x10000ULL + uint64_t(m);
  // Host data shared by all sets (contents do not matter for L2, addresses do).
  std::vector<uint8_t> xq(size_t(m * kK)), wq(size_t(n * kK));
  fill_e4m3(xq, seed + 1);
  fill_e4m3(wq, seed + 2);
  std::vector<uint8_t> xsf(size_t(m3qkv::f8_128x4_bytes(m, kK / 32))), wsf(size_t(m3qkv::f8_128x4_bytes(n, kK / 32)));
  fill_scales(xsf, 120, seed + 3);
  fill_scales(wsf, 110, seed + 4);
  std::vector<uint16_t> xb(size_t(m * kK));
  fill_bf16(xb.data(), xb.size(), 127, seed + 8);
  std::vector<uint16_t> cs(size_t(kMaxPosition * 64)), nw(128);
  fill_bf16(cs.data(), cs.size(), 123, seed + 5);  // |cos|, |sin| < 1
  fill_bf16(nw.data(), nw.size(), 119, seed + 6);  // small Gemma offsets (scale 1 + w)
  std::vector<int64_t> pos(static_cast<size_t>(m)), slots(static_cast<size_t>(m));
  const int64_t pages = std::max<int64_t>(1, (m + kBlock - 1) / kBlock);
  FastRng rng{seed + 7};
  for (int64_t i = 0; i < m; ++i) {
    pos[size_t(i)] = int64_t(rng.next() % uint64_t(kMaxPosition));
    slots[size_t(i)] = i;  // contiguous, as a prefill writes them (also the index cache)
  }
  const int64_t kv_stride = m3qkv::kv_page_min_bytes(h.nkv, kBlock), ix_stride = m3qkv::nvfp4_slot_bytes(kBlock);
  const size_t q_bytes = size_t(m * h.nq * 128 * 2), iq_bytes = size_t(m * h.niq * 128);
  const size_t qkv_bytes = size_t(m * n * 2);
  // Small shared inputs (L2-resident in real serving too).
  void* dcs = dev_upload(s->own, cs.data(), cs.size() * 2);
  void* dnw = dev_upload(s->own, nw.data(), 256);
  void* dpos = dev_upload(s->own, pos.data(), pos.size() * 8);
  void* dsl = dev_upload(s->own, slots.data(), slots.size() * 8);
  void* disl = dev_upload(s->own, slots.data(), slots.size() * 8);
  if (!g_error.empty()) return nullptr;
  for (int i = 0; i < r; ++i) {
    const M3Set* first = i ? &s->sets[0] : nullptr;
    void* dxq = dev_set_buffer(s->own, xq.data(), first ? first->fused.xq : nullptr, xq.size());
    void* dxsf = dev_set_buffer(s->own, xsf.data(), first ? first->fused.xsf : nullptr, xsf.size());
    void* dwq = dev_set_buffer(s->own, wq.data(), first ? first->fused.wq : nullptr, wq.size());
    void* dwsf = dev_set_buffer(s->own, wsf.data(), first ? first->fused.wsf : nullptr, wsf.size());
    void* dxb = dev_set_buffer(s->own, xb.data(), first ? first->fused_xbf16.x_bf16 : nullptr, xb.size() * 2);
    void* dq = dev_upload(s->own, nullptr, q_bytes);
    void* diq = dev_upload(s->own, nullptr, iq_bytes);
    void* dkv = dev_upload(s->own, nullptr, size_t(pages * kv_stride));
    void* dix = dev_upload(s->own, nullptr, size_t(pages * ix_stride));
    void* dqkv = dev_upload(s->own, nullptr, qkv_bytes);
    // FP8 / BF16 caches (allocated for bf16, reused by fp8): K and V tensors
    // [pages, 128, nkv, 128] and the index cache [pages, 128, 128].
    const size_t flat_kv = size_t(pages * kBlock * h.nkv * 128 * 2), flat_ix = size_t(pages * kBlock * 128 * 2);
    void* dk = dev_upload(s->own, nullptr, flat_kv);
    void* dv = dev_upload(s->own, nullptr, flat_kv);
    void* dfx = dev_upload(s->own, nullptr, flat_ix);
    if (!g_error.empty()) return nullptr;
    M3Set set;
    m3qkv_fused_args& a = set.fused;
    std::memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.m = m;
    a.k = kK;
    a.nq = h.nq;
    a.nkv = h.nkv;
    a.niq = h.niq;
    a.nik = h.nik;
    a.xq = dxq;
    a.xsf = dxsf;
    a.wq = dwq;
    a.wsf = dwsf;
    a.positions = static_cast<const int64_t*>(dpos);
    a.max_position = kMaxPosition;
    a.cos_sin_cache = dcs;
    a.q_norm_weight = a.k_norm_weight = a.index_q_norm_weight = a.index_k_norm_weight = dnw;
    a.eps = 1e-6f;
    a.slot_mapping = static_cast<const int64_t*>(dsl);
    a.index_slot_mapping = static_cast<const int64_t*>(disl);
    a.kv_cache = dkv;
    a.kv_page_stride = kv_stride;
    a.num_blocks = pages;
    a.index_cache = dix;
    a.index_page_stride = ix_stride;
    a.num_index_blocks = pages;
    a.block_size = kBlock;
    a.q_out = dq;
    a.index_q_out = diq;
    a.q_fp8_scale = 1.0f;
    a.k_scale = 1.0f;
    a.v_scale = 1.0f;
    a.use_pdl = 1;
    m3qkv_gemm_args& g = set.gemm;
    std::memset(&g, 0, sizeof g);
    g.struct_size = sizeof g;
    g.m = m;
    g.n = n;
    g.k = kK;
    g.xq = dxq;
    g.xsf = dxsf;
    g.wq = dwq;
    g.wsf = dwsf;
    g.out = dqkv;
    g.use_pdl = 1;
    m3qkv_insert_args& in = set.insert;
    std::memset(&in, 0, sizeof in);
    in.struct_size = sizeof in;
    in.m = m;
    in.nq = h.nq;
    in.nkv = h.nkv;
    in.niq = h.niq;
    in.nik = h.nik;
    in.qkv = dqkv;  // bf16 [M, N] row-major; the cuBLAS "+insert" lines swap in their output
    in.positions = a.positions;
    in.max_position = a.max_position;
    in.cos_sin_cache = a.cos_sin_cache;
    in.q_norm_weight = in.k_norm_weight = in.index_q_norm_weight = in.index_k_norm_weight = dnw;
    in.eps = a.eps;
    in.slot_mapping = a.slot_mapping;
    in.index_slot_mapping = a.index_slot_mapping;
    in.kv_cache = a.kv_cache;
    in.kv_page_stride = a.kv_page_stride;
    in.num_blocks = a.num_blocks;
    in.index_cache = a.index_cache;
    in.index_page_stride = a.index_page_stride;
    in.num_index_blocks = a.num_index_blocks;
    in.block_size = a.block_size;
    in.q_out = a.q_out;
    in.index_q_out = a.index_q_out;
    in.q_fp8_scale = 1.0f;
    in.k_scale = 1.0f;
    in.v_scale = 1.0f;
    in.use_pdl = 1;
    set.fused_fmt[0] = a;
    set.insert_fmt[0] = in;
    for (int f = 1; f < kFormats; ++f) {
      const int64_t e = f == M3QKV_CACHE_BF16 ? 2 : 1;
      m3qkv_fused_args& fa = set.fused_fmt[f];
      fa = a;
      fa.kv_cache_dtype = fa.index_cache_dtype = f;
      fa.kv_cache = dk;
      fa.v_cache = dv;
      fa.kv_head_stride = 128 * e;
      fa.kv_token_stride = h.nkv * 128 * e;
      fa.kv_page_stride = kBlock * fa.kv_token_stride;
      fa.index_cache = dfx;
      fa.index_page_stride = kBlock * 128 * e;
      m3qkv_insert_args& fi = set.insert_fmt[f];
      fi = in;
      fi.kv_cache_dtype = fi.index_cache_dtype = f;
      fi.kv_cache = fa.kv_cache;
      fi.v_cache = fa.v_cache;
      fi.kv_head_stride = fa.kv_head_stride;
      fi.kv_token_stride = fa.kv_token_stride;
      fi.kv_page_stride = fa.kv_page_stride;
      fi.index_cache = fa.index_cache;
      fi.index_page_stride = fa.index_page_stride;
    }
    set.fused_xbf16 = set.fused_fmt[M3QKV_CACHE_FP8];
    set.fused_xbf16.xq = set.fused_xbf16.xsf = nullptr;
    set.fused_xbf16.x_bf16 = dxb;
    s->sets.push_back(set);
  }
  return s;
}

// ------------------------------------------------------------- cuBLAS sets
// D = X·Wᵀ, X [M, K] and W [N, K] row-major (K contiguous, as the MX
// operands). cuBLAS is column-major, so it computes the transpose: the
// column-major C[N, M] = op(W)[N, K] · X[K, M] with ldc = N, which in memory
// is exactly the row-major bf16 [M, N] matrix m3qkv_mxfp8_gemm writes and the
// insert reads (row m at c + m·N, heads in the weight-row order).
struct BlasSets {
  std::vector<DevPtr> own;
  struct Set {
    void *a, *b, *c;  // a = W [N, K], b = X [M, K], c = out [M, N] row-major
  };
  std::vector<Set> sets;
  int64_t n = 0, k = 0, m = 0;
  // cuBLASLt fp8 objects
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  float* scale = nullptr;
  ~BlasSets() {
    if (op) cublasLtMatmulDescDestroy(op);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
  }
};

std::unique_ptr<BlasSets> build_blas_sets(int64_t n, int64_t k, int64_t m, int r, bool fp8, uint64_t seed) {
  auto s = std::make_unique<BlasSets>();
  s->n = n;
  s->k = k;
  s->m = m;
  const size_t esz = fp8 ? 1 : 2;
  std::vector<uint8_t> w(size_t(n * k) * esz), x(size_t(m * k) * esz);
  if (fp8) {
    fill_e4m3(w, seed + 1);
    fill_e4m3(x, seed + 2);
  } else {
    fill_bf16(reinterpret_cast<uint16_t*>(w.data()), w.size() / 2, 118, seed + 1);  // |w| ~ 2^-9..2^-5
    fill_bf16(reinterpret_cast<uint16_t*>(x.data()), x.size() / 2, 124, seed + 2);  // |x| ~ 2^-3..2
  }
  const size_t out_bytes = size_t(m * n * 2);
  for (int i = 0; i < r; ++i) {
    const BlasSets::Set* first = i ? &s->sets[0] : nullptr;
    BlasSets::Set set;
    set.a = dev_set_buffer(s->own, w.data(), first ? first->a : nullptr, w.size());
    set.b = dev_set_buffer(s->own, x.data(), first ? first->b : nullptr, x.size());
    set.c = dev_upload(s->own, nullptr, out_bytes);
    if (!g_error.empty()) return nullptr;
    s->sets.push_back(set);
  }
  if (fp8) {
    const float one = 1.0f;
    s->scale = static_cast<float*>(dev_upload(s->own, &one, sizeof one));
    if (!g_error.empty()) return nullptr;
    auto chk = [&](cublasStatus_t st, const char* what) {
      if (st != CUBLAS_STATUS_SUCCESS && g_error.empty()) g_error = std::string("cuBLASLt ") + what + " failed";
      return st == CUBLAS_STATUS_SUCCESS;
    };
    // Column-major view: D[N, M] = op(A)[N, K] · B[K, M] with A = W stored
    // K×N (ld K, transposed: the fp8 "TN" layout) and B = X stored K×M.
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    if (!chk(cublasLtMatmulDescCreate(&s->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate")) return nullptr;
    chk(cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "TRANSA");
    chk(cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "TRANSB");
    chk(cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &s->scale, sizeof s->scale),
        "A_SCALE_POINTER");
    chk(cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &s->scale, sizeof s->scale),
        "B_SCALE_POINTER");
    chk(cublasLtMatrixLayoutCreate(&s->la, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(n), k), "layout A");
    chk(cublasLtMatrixLayoutCreate(&s->lb, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(m), k), "layout B");
    chk(cublasLtMatrixLayoutCreate(&s->lc, CUDA_R_16BF, uint64_t(n), uint64_t(m), n), "layout C/D");
    cublasLtMatmulPreference_t pref = nullptr;
    chk(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
    chk(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &dev().workspace_bytes,
                                             sizeof dev().workspace_bytes),
        "MAX_WORKSPACE_BYTES");
    cublasLtMatmulHeuristicResult_t res{};
    int count = 0;
    chk(cublasLtMatmulAlgoGetHeuristic(dev().lt, s->op, s->la, s->lb, s->lc, s->lc, pref, 1, &res, &count),
        "AlgoGetHeuristic");
    cublasLtMatmulPreferenceDestroy(pref);
    if (count < 1 && g_error.empty()) g_error = "cuBLASLt found no fp8 algorithm for this shape";
    if (!g_error.empty()) return nullptr;
    s->algo = res.algo;
  }
  return s;
}

// ------------------------------------------------------ the resident case
// Buffers of one (TP, M) at a time, built on first use by the ops of that
// case and freed as soon as a benchmark asks for another case (the sweep runs
// case by case, so each case is built once; ~4 GB at TP1 M = 16384). tp = 0
// holds the peak GEMMs.
struct Case {
  int tp = -1;
  int64_t m = -1;
  int r = 0;
  std::unique_ptr<M3Sets> m3;
  std::unique_ptr<BlasSets> bf16, fp8;
};
Case& select_case(int tp, int64_t m, int r) {
  static Case c;
  if (c.tp != tp || c.m != m) {
    c.m3.reset();
    c.bf16.reset();
    c.fp8.reset();
    c.tp = tp;
    c.m = m;
    c.r = r;
  }
  return c;
}
void release_case() { select_case(-1, -1, 0); }

// Every builder ends with a device synchronization: the uploads, clones and
// memsets ran on the legacy stream, the timed work runs on a non-blocking one.
bool finish_build() {
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess && g_error.empty()) g_error = std::string("set-up failed: ") + cudaGetErrorString(e);
  return g_error.empty();
}

M3Sets* m3_sets(const Heads& h, int64_t m) {
  if (!dev().ok) return nullptr;
  Case& c = select_case(h.tp, m, case_rotation(h, m));
  if (!c.m3) {
    g_error.clear();  // errors are per builder (one failing baseline must not block the others)
    auto s = build_m3_sets(h, m, c.r);
    if (s && finish_build()) c.m3 = std::move(s);
  }
  return c.m3.get();
}

BlasSets* blas_sets(const Heads& h, int64_t m, bool fp8) {
  if (!dev().ok) return nullptr;
  Case& c = select_case(h.tp, m, case_rotation(h, m));
  std::unique_ptr<BlasSets>& slot = fp8 ? c.fp8 : c.bf16;
  if (!slot) {
    g_error.clear();
    auto s = build_blas_sets(h.n(), kK, m, c.r, fp8, 0xB1A50000ULL + uint64_t(h.tp) * 0x10000ULL + uint64_t(m));
    if (s && finish_build()) slot = std::move(s);
  }
  return slot.get();
}

// The peak GEMMs: one set (warm L2 is fine, 8192³ is compute-bound).
BlasSets* peak_sets(bool fp8) {
  if (!dev().ok) return nullptr;
  Case& c = select_case(0, kPeakDim, 1);
  std::unique_ptr<BlasSets>& slot = fp8 ? c.fp8 : c.bf16;
  if (!slot) {
    g_error.clear();
    auto s = build_blas_sets(kPeakDim, kPeakDim, kPeakDim, 1, fp8, 0xFEA4ULL);
    if (s && finish_build()) slot = std::move(s);
  }
  return slot.get();
}

// ---------------------------------------------------------------- timing
// One pass = call(0..R-1). The pass is captured once into a CUDA graph (as
// decode is served) so that host launch overhead — validation plus
// cudaLaunchKernelEx, a few µs per call — does not hide a few-µs kernel;
// M3QKV_BENCH_NO_GRAPH=1 times direct launches instead. Counter "graph" says
// which one ran (a failed capture falls back to direct launches).
template <class Call>
bool capture_pass(int r, int passes, Call& call, cudaGraphExec_t* exec) {
  Device& d = dev();
  *exec = nullptr;
  if (const char* e = std::getenv("M3QKV_BENCH_NO_GRAPH"))
    if (std::strcmp(e, "0") != 0) return false;
  if (cudaStreamBeginCapture(d.stream, cudaStreamCaptureModeRelaxed) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  bool ok = true;
  for (int k = 0; k < r * passes && ok; ++k) ok = call(k % r).empty();
  cudaGraph_t g = nullptr;
  const cudaError_t ee = cudaStreamEndCapture(d.stream, &g);
  if (!ok || ee != cudaSuccess || !g) {
    if (g) cudaGraphDestroy(g);
    (void)cudaGetLastError();
    return false;
  }
  const cudaError_t ie = cudaGraphInstantiate(exec, g, 0);
  cudaGraphDestroy(g);
  if (ie != cudaSuccess) {
    (void)cudaGetLastError();
    *exec = nullptr;
    return false;
  }
  return true;
}

// Calls per timed iteration, at least: one iteration is U = ceil(64 / R)
// passes over the R sets (one graph of U·R calls), so the fixed cost of
// starting a graph (~3.5 µs on the H200: per-call times go as
// a + 3.5 µs / R with R = 4 ... 20 at small M) weighs < 0.06 µs on every
// case, as in serving, where one graph holds a whole decode step.
constexpr int kMinCallsPerIteration = 64;
int passes_per_iteration(int r) { return std::max(1, (kMinCallsPerIteration + r - 1) / r); }
int calls_per_iteration(int r) { return r * passes_per_iteration(r); }

// Runs `call(i)` over the R sets U times per iteration between two events.
// call returns an error string ("" on success).
template <class Call>
void timed_loop(benchmark::State& state, int r, double bytes, double flop, double traffic, Call&& call) {
  Device& d = dev();
  const int passes = passes_per_iteration(r);
  const int per_iter = calls_per_iteration(r);
  // Warm-up pass (module load, first-touch).
  for (int i = 0; i < r; ++i) {
    const std::string e = call(i);
    if (!e.empty()) {
      state.SkipWithError(e.c_str());
      return;
    }
  }
  if (cudaStreamSynchronize(d.stream) != cudaSuccess) {
    state.SkipWithError("warm-up failed");
    return;
  }
  cudaGraphExec_t exec = nullptr;
  const bool graph = capture_pass(r, passes, call, &exec);
  struct ExecGuard {
    cudaGraphExec_t e;
    ~ExecGuard() {
      if (e) cudaGraphExecDestroy(e);
    }
  } guard{exec};
  double total = 0.0;
  int64_t calls = 0;
  for (auto _ : state) {
    cudaEventRecord(d.e0, d.stream);
    std::string e;
    if (graph) {
      const cudaError_t le = cudaGraphLaunch(exec, d.stream);
      if (le != cudaSuccess) e = std::string("cudaGraphLaunch: ") + cudaGetErrorString(le);
    } else {
      for (int k = 0; k < per_iter && e.empty(); ++k) e = call(k % r);
    }
    cudaEventRecord(d.e1, d.stream);
    const cudaError_t se = cudaEventSynchronize(d.e1);
    if (!e.empty() || se != cudaSuccess) {
      state.SkipWithError(e.empty() ? cudaGetErrorString(se) : e.c_str());
      break;
    }
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, d.e0, d.e1);
    const double per_call = double(ms) * 1e-3 / per_iter;
    state.SetIterationTime(per_call);
    total += double(ms) * 1e-3;
    calls += per_iter;
  }
  if (calls == 0) return;
  // Plain launches of the same calls (no graph), as a caller without graphs
  // issues them: the median of 3 timed passes, counter plain_us.
  if (graph) {
    std::vector<double> plain;
    for (int rep = 0; rep < 3; ++rep) {
      cudaEventRecord(d.e0, d.stream);
      std::string e;
      for (int k = 0; k < per_iter && e.empty(); ++k) e = call(k % r);
      cudaEventRecord(d.e1, d.stream);
      if (!e.empty() || cudaEventSynchronize(d.e1) != cudaSuccess) break;
      float ms = 0.0f;
      cudaEventElapsedTime(&ms, d.e0, d.e1);
      plain.push_back(double(ms) * 1e3 / per_iter);
    }
    if (plain.size() == 3) {
      std::sort(plain.begin(), plain.end());
      state.counters["plain_us"] = plain[1];
    }
  }
  const double t = total / double(calls);
  state.counters["us"] = t * 1e6;
  state.counters["TFLOP/s"] = flop / t * 1e-12;
  state.counters["GB/s"] = bytes / t * 1e-9;
  state.counters["bytes_MB"] = bytes * 1e-6;
  if (traffic > 0) state.counters["traffic_MB"] = traffic * 1e-6;
  state.counters["sets"] = r;
  state.counters["calls_per_iter"] = per_iter;
  state.counters["graph"] = graph ? 1 : 0;
}

std::string m3err(m3qkv_status s) {
  return s == M3QKV_SUCCESS ? std::string() : std::string(m3qkv_status_string(s)) + ": " + m3qkv_last_error();
}

void skip_setup(benchmark::State& state) {
  state.SkipWithError(!dev().ok ? "no CUDA device" : g_error.empty() ? "set-up failed" : g_error.c_str());
}

// Benchmark arguments: range(0) = TP, range(1) = M.
const Heads& arg_heads(const benchmark::State& state) { return heads_of(state.range(0)); }

void bench_fused(benchmark::State& state, m3qkv_backend_kind backend) {
  const Heads& h = arg_heads(state);
  const int64_t m = state.range(1);
  M3Sets* s = m3_sets(h, m);
  if (!s) return skip_setup(state);
  timed_loop(state, int(s->sets.size()), fused_bytes(h, m), flops(h, m), 0.0, [&](int i) {
    return m3err(m3qkv_testing_fused_qkv(&s->sets[size_t(i)].fused, nullptr, backend, dev().stream));
  });
}

// The fused kernel writing FP8 / BF16 caches (fmt = m3qkv_cache_dtype).
void bench_fused_fmt(benchmark::State& state, m3qkv_backend_kind backend, int fmt) {
  const Heads& h = arg_heads(state);
  const int64_t m = state.range(1);
  M3Sets* s = m3_sets(h, m);
  if (!s) return skip_setup(state);
  timed_loop(state, int(s->sets.size()), fused_bytes(h, m, fmt), flops(h, m), 0.0, [&](int i) {
    return m3err(m3qkv_testing_fused_qkv(&s->sets[size_t(i)].fused_fmt[fmt], nullptr, backend, dev().stream));
  });
}

// fused_<backend>_xbf16_fp8: FP8 caches, bf16 activations (x_bf16, M·K·2 bytes
// read instead of xq + xsf).
void bench_fused_xbf16(benchmark::State& state, m3qkv_backend_kind backend) {
  const Heads& h = arg_heads(state);
  const int64_t m = state.range(1);
  M3Sets* s = m3_sets(h, m);
  if (!s) return skip_setup(state);
  const double bytes = fused_bytes(h, m, M3QKV_CACHE_FP8) - double(m * kK) -
                       double(m3qkv::f8_128x4_bytes(m, kK / 32)) + double(m * kK) * 2;
  timed_loop(state, int(s->sets.size()), bytes, flops(h, m), 0.0, [&](int i) {
    return m3err(m3qkv_testing_fused_qkv(&s->sets[size_t(i)].fused_xbf16, nullptr, backend, dev().stream));
  });
}

// fused_<backend>_invariant_fp8: FP8 caches, MXFP8 activations, batch_invariant
// = 1 (one K order at every M: no split-K).
void bench_fused_invariant(benchmark::State& state, m3qkv_backend_kind backend) {
  const Heads& h = arg_heads(state);
  const int64_t m = state.range(1);
  M3Sets* s = m3_sets(h, m);
  if (!s) return skip_setup(state);
  std::vector<m3qkv_fused_args> args;
  for (const auto& set : s->sets) {
    args.push_back(set.fused_fmt[M3QKV_CACHE_FP8]);
    args.back().batch_invariant = 1;
  }
  timed_loop(state, int(args.size()), fused_bytes(h, m, M3QKV_CACHE_FP8), flops(h, m), 0.0, [&](int i) {
    return m3err(m3qkv_testing_fused_qkv(&args[size_t(i)], nullptr, backend, dev().stream));
  });
}

// Each set's FP8-cache args with precision = 1 on weights folded by
// m3qkv_prepare_weights_fp8 into new buffers (one per set: cold L2 as for the others).
const std::vector<m3qkv_fused_args>* fast_args(M3Sets* s, const Heads& h) {
  if (!s->fast.empty()) return &s->fast;
  size_t qb = 0, sb = 0;
  if (m3qkv_prepare_weights_fp8_sizes(h.n(), kK, &qb, &sb) != M3QKV_SUCCESS) return nullptr;
  std::vector<m3qkv_fused_args> out;
  for (const auto& set : s->sets) {
    m3qkv_fused_args a = set.fused_fmt[M3QKV_CACHE_FP8];
    m3qkv_prepare_args pa{};
    pa.struct_size = sizeof pa;
    pa.n = h.n();
    pa.k = kK;
    pa.wq = a.wq;
    pa.wsf = a.wsf;
    pa.wq_out = dev_alloc(s->own, qb);
    pa.wsf_out = dev_alloc(s->own, sb);
    if (!pa.wq_out || !pa.wsf_out || m3qkv_prepare_weights_fp8(&pa, dev().stream) != M3QKV_SUCCESS) return nullptr;
    a.wq = pa.wq_out;
    a.wsf = pa.wsf_out;
    a.precision = 1;
    out.push_back(a);
  }
  if (cudaStreamSynchronize(dev().stream) != cudaSuccess) return nullptr;
  s->fast = std::move(out);
  return &s->fast;
}

// fused_<backend>_fast_fp8: FP8 caches, precision = 1 (the plan's route: the
// fast kernel from sm90::kFastMinM, exact mode on the prepared weights below).
// sm90_fast: the fast kernel forced at every M (the route is read off these).
void bench_fused_fast(benchmark::State& state, m3qkv_backend_kind backend, bool forced, int cluster = 0) {
  const Heads& h = arg_heads(state);
  const int64_t m = state.range(1);
  M3Sets* s = m3_sets(h, m);
  if (!s) return skip_setup(state);
  const std::vector<m3qkv_fused_args>* args = fast_args(s, h);
  if (!args) return state.SkipWithError((std::string("prepare failed: ") + m3qkv_last_error()).c_str());
#if M3QKV_WITH_SM90
  m3qkv::DeviceInfo info;
  if (forced && (m3qkv::current_device_info(&info) != M3QKV_SUCCESS || info.cc_major != 9))
    return state.SkipWithError("the SM90 fast kernel needs a CC 9.0 device");
#else
  if (forced) return state.SkipWithError("built without the SM90 backend");
#endif
  timed_loop(state, int(args->size()), fused_bytes(h, m, M3QKV_CACHE_FP8), flops(h, m), 0.0, [&](int i) {
#if M3QKV_WITH_SM90
    if (forced) return m3err(m3qkv::sm90_fused_fast((*args)[size_t(i)], info, nullptr, dev().stream, cluster));
#endif
    return m3err(m3qkv_testing_fused_qkv(&(*args)[size_t(i)], nullptr, backend, dev().stream));
  });
}

// Device-to-device copy bandwidth of this run (bytes read + written per second);
// 0 until copy_d2d ran.
double g_copy_bw = 0.0;
constexpr double kAssumedCopyBw = 4.24e12;  // an H200's copy_d2d
constexpr size_t kCopyBytes = size_t(1) << 30;

void bench_copy(benchmark::State& state) {
  if (!dev().ok) return skip_setup(state);
  static std::vector<DevPtr> own;
  static void* src = nullptr;
  static void* dst = nullptr;
  if (!src) {
    g_error.clear();
    src = dev_upload(own, nullptr, kCopyBytes);
    dst = dev_upload(own, nullptr, kCopyBytes);
    if (!finish_build()) return skip_setup(state);
  }
  timed_loop(state, 1, 2.0 * double(kCopyBytes), 0.0, 0.0, [&](int) {
    const cudaError_t e = cudaMemcpyAsync(dst, src, kCopyBytes, cudaMemcpyDeviceToDevice, dev().stream);
    return e == cudaSuccess ? std::string() : std::string("cudaMemcpyAsync: ") + cudaGetErrorString(e);
  });
  const auto it = state.counters.find("GB/s");
  if (it != state.counters.end()) g_copy_bw = double(it->second) * 1e9;
  own.clear();
  src = dst = nullptr;
}

// m3qkv_qknorm_rope_kv_insert alone on the set's bf16 qkv, caches of format fmt.
// layout: 0 = the plan's lane layout (insert_<fmt>), 1 .. 6 = quad rows /
// warp rows / 8-lane rows / split c32q8 / split c16q8 / split c16q8 + guess
// forced (insert_<fmt>_quad / _warp / _l8 / _c32q8 / _c16q8 / _c16q8g, M <=
// 4096: the plan's thresholds are read off these).
void bench_insert(benchmark::State& state, int fmt, int layout = 0) {
  const Heads& h = arg_heads(state);
  const int64_t m = state.range(1);
  M3Sets* s = m3_sets(h, m);
  if (!s) return skip_setup(state);
  const double bytes = insert_bytes(h, m, fmt);
  if (m3qkv_testing_insert_layout(layout) != M3QKV_SUCCESS) {
    state.SkipWithError("m3qkv_testing_insert_layout failed");
    return;
  }
  timed_loop(state, int(s->sets.size()), bytes, 0.0, 0.0, [&](int i) {
    return m3err(m3qkv_qknorm_rope_kv_insert(&s->sets[size_t(i)].insert_fmt[fmt], dev().stream));
  });
  (void)m3qkv_testing_insert_layout(0);
  const auto it = state.counters.find("us");
  if (it == state.counters.end()) return;
  const double bw = g_copy_bw > 0 ? g_copy_bw : kAssumedCopyBw;
  const double bound_us = 1.5 * bytes / bw * 1e6 + 2.0;
  state.counters["bound_us"] = bound_us;
  state.counters["x_bound"] = double(it->second) / bound_us;
  state.counters["copy_bw_assumed"] = g_copy_bw > 0 ? 0 : 1;
}

#if M3QKV_WITH_SM90
// An SM90 tile-kernel instance forced (sm90_fused_variant), on a given tile height.
void bench_sm90_variant(benchmark::State& state, int variant, int block_m) {
  const Heads& h = arg_heads(state);
  const int64_t m = state.range(1);
  M3Sets* s = m3_sets(h, m);
  if (!s) return skip_setup(state);
  m3qkv::DeviceInfo info;
  if (m3qkv::current_device_info(&info) != M3QKV_SUCCESS || info.cc_major != 9) {
    state.SkipWithError("SM90 variants need a CC 9.0 device");
    return;
  }
  timed_loop(state, int(s->sets.size()), fused_bytes(h, m), flops(h, m), 0.0, [&](int i) {
    return m3err(
        m3qkv::sm90_fused_variant(s->sets[size_t(i)].fused, info, nullptr, dev().stream, variant, block_m, 0));
  });
}

// The SM90 decode kernel with the plan's split (MXFP8 activations converted by
// its transform warps, or once per call: x_path; partials through L2 or over a
// cluster: reduce), and the tile kernel (variant A, its own split-K) at the
// same M: the crossovers sm90_fused routes by (sm90::decode_preferred,
// decode_converts_x, cluster_plan), read off these.
void bench_sm90_path(benchmark::State& state, bool decode, int x_path = m3qkv::kSm90DecodeXTransform,
                     int reduce = m3qkv::kSm90DecodeReduceAuto) {
  const Heads& h = arg_heads(state);
  const int64_t m = state.range(1);
  M3Sets* s = m3_sets(h, m);
  if (!s) return skip_setup(state);
  m3qkv::DeviceInfo info;
  if (m3qkv::current_device_info(&info) != M3QKV_SUCCESS || info.cc_major != 9) {
    state.SkipWithError("SM90 paths need a CC 9.0 device");
    return;
  }
  if (decode) {  // which plan ran: split, cluster size (0: through L2), grid
    m3qkv::splitk::Plan plan;
    int clusters[9] = {};
    if (m3qkv::sm90_decode_plan(s->sets[0].fused, info, 0, reduce, &plan, clusters) == M3QKV_SUCCESS) {
      state.counters["split"] = plan.split;
      state.counters["cluster"] = plan.cluster;
      state.counters["spread"] = plan.spread ? 1 : 0;
      state.counters["grid"] = plan.grid;
      if ((reduce == m3qkv::kSm90DecodeReduceSpread && !plan.spread) ||
          (reduce == m3qkv::kSm90DecodeReduceCluster && plan.cluster < 2)) {
        state.SkipWithError("no plan of this reduction form at this shape");
        return;
      }
    }
  }
  timed_loop(state, int(s->sets.size()), fused_bytes(h, m), flops(h, m), 0.0, [&](int i) {
    const m3qkv_fused_args& a = s->sets[size_t(i)].fused;
    return m3err(decode ? m3qkv::sm90_fused_decode(a, info, nullptr, dev().stream, 0, x_path, reduce)
                        : m3qkv::sm90_fused_variant(a, info, nullptr, dev().stream, m3qkv::kSm90Bf16Dequant, 0, 0));
  });
}
#endif

// floor_read/TP:t/M:0: the weight + weight-scale bytes of the layer read once
// (16-B streaming loads), over the same rotation of cold sets as every op.
void bench_floor_read(benchmark::State& state) {
  const Heads& h = arg_heads(state);
  M3Sets* s = m3_sets(h, 0);
  if (!s) return skip_setup(state);
  static uint32_t* sink = nullptr;
  const int blocks = dev().sms * 4;
  if (!sink && cudaMalloc(reinterpret_cast<void**>(&sink), size_t(blocks) * 4) != cudaSuccess) {
    (void)cudaGetLastError();
    state.SkipWithError("cudaMalloc(sink) failed");
    return;
  }
  const size_t wq = size_t(h.n() * kK), wsf = size_t(m3qkv::f8_128x4_bytes(h.n(), kK / 32));
  timed_loop(state, int(s->sets.size()), double(wq + wsf), 0.0, 0.0, [&](int i) {
    const m3qkv_fused_args& a = s->sets[size_t(i)].fused;
    const cudaError_t e = m3qkv_bench_floor_read(a.wq, wq, a.wsf, wsf, sink, blocks, dev().stream);
    return e == cudaSuccess ? std::string() : std::string("floor_read: ") + cudaGetErrorString(e);
  });
}

void bench_unfused(benchmark::State& state) {
  const Heads& h = arg_heads(state);
  const int64_t m = state.range(1);
  M3Sets* s = m3_sets(h, m);
  if (!s) return skip_setup(state);
  const double traffic = fused_bytes(h, m) + qkv_round_trip(h, m);
  timed_loop(state, int(s->sets.size()), fused_bytes(h, m), flops(h, m), traffic, [&](int i) {
    std::string e = m3err(m3qkv_mxfp8_gemm(&s->sets[size_t(i)].gemm, dev().stream));
    if (e.empty()) e = m3err(m3qkv_qknorm_rope_kv_insert(&s->sets[size_t(i)].insert, dev().stream));
    return e;
  });
}

// One cuBLAS GEMM of set x: bf16 through cublasGemmEx, e4m3 through
// cublasLtMatmul. Both write the row-major bf16 [M, N] (see BlasSets).
std::string blas_gemm(const BlasSets& s, const BlasSets::Set& x, bool fp8) {
  const float alpha = 1.0f, beta = 0.0f;
  if (!fp8) {
    const cublasStatus_t st =
        cublasGemmEx(dev().blas, CUBLAS_OP_T, CUBLAS_OP_N, int(s.n), int(s.m), int(s.k), &alpha, x.a, CUDA_R_16BF,
                     int(s.k), x.b, CUDA_R_16BF, int(s.k), &beta, x.c, CUDA_R_16BF, int(s.n), CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
    return st == CUBLAS_STATUS_SUCCESS ? std::string() : "cublasGemmEx failed: " + std::to_string(int(st));
  }
  const cublasStatus_t st = cublasLtMatmul(dev().lt, s.op, &alpha, x.a, s.la, x.b, s.lb, &beta, x.c, s.lc, x.c, s.lc,
                                           &s.algo, dev().workspace, dev().workspace_bytes, dev().stream);
  return st == CUBLAS_STATUS_SUCCESS ? std::string() : "cublasLtMatmul failed: " + std::to_string(int(st));
}

// cuBLAS GEMM alone, or followed by m3qkv's insert reading its output
// (with_insert): GEMM and insert back to back on the stream, both inside the
// timed pass and the graph, so the time per call is the pair's.
void bench_blas(benchmark::State& state, bool fp8, bool with_insert) {
  const Heads& h = arg_heads(state);
  const int64_t m = state.range(1);
  const int esz = fp8 ? 1 : 2;
  BlasSets* s = blas_sets(h, m, fp8);
  if (!s) return skip_setup(state);
  std::vector<m3qkv_insert_args> inserts;
  if (with_insert) {
    M3Sets* m3 = m3_sets(h, m);  // same case: s stays resident
    if (!m3) return skip_setup(state);
    for (size_t i = 0; i < s->sets.size(); ++i) {
      m3qkv_insert_args in = m3->sets[i].insert;  // set i's q / index_q / cache outputs
      in.qkv = s->sets[i].c;                      // ... from cuBLAS set i's bf16 [M, N]
      inserts.push_back(in);
    }
  }
  const double bytes = with_insert ? blas_insert_bytes(h, m, esz) : blas_bytes(h, m, esz);
  const double traffic = with_insert ? bytes + qkv_round_trip(h, m) : 0.0;
  timed_loop(state, int(s->sets.size()), bytes, flops(h, m), traffic, [&](int i) {
    std::string e = blas_gemm(*s, s->sets[size_t(i)], fp8);
    if (e.empty() && with_insert) e = m3err(m3qkv_qknorm_rope_kv_insert(&inserts[size_t(i)], dev().stream));
    return e;
  });
}

// Tensor peak of the device as cuBLAS reaches it (issue 4: "≥ 75 % of the bf16
// tensor peak measured in the same run").
void bench_peak(benchmark::State& state, bool fp8) {
  BlasSets* s = peak_sets(fp8);
  if (!s) return skip_setup(state);
  const double d = double(kPeakDim);
  // bytes: A and B (1 or 2 bytes per element) + the bf16 D.
  timed_loop(state, 1, d * d * (fp8 ? 4.0 : 6.0), 2.0 * d * d * d, 0.0,
             [&](int) { return blas_gemm(*s, s->sets[0], fp8); });
}

const char* backend_tag(m3qkv_backend_kind k) {
  switch (k) {
    case M3QKV_BACKEND_PORTABLE: return "portable";
    case M3QKV_BACKEND_SM90: return "sm90";
    case M3QKV_BACKEND_SM100: return "sm100";
    default: return "none";
  }
}

// ------------------------------------------------------------- reporting
// Drops the per-benchmark "min_time:…" from the reported names (it only
// reflects R, see the header) so names stay <op>/TP:<tp>/M:<m>/manual_time.
class PlainNames : public benchmark::BenchmarkReporter {
 public:
  explicit PlainNames(benchmark::BenchmarkReporter* inner) : inner_(inner) {}
  bool ReportContext(const Context& context) override {
    // Google Benchmark points *this* reporter at the --benchmark_out file.
    inner_->SetOutputStream(&GetOutputStream());
    inner_->SetErrorStream(&GetErrorStream());
    return inner_->ReportContext(context);
  }
  void ReportRuns(const std::vector<Run>& runs) override {
    std::vector<Run> plain(runs);
    for (Run& r : plain) r.run_name.min_time.clear();
    inner_->ReportRuns(plain);
  }
  void Finalize() override { inner_->Finalize(); }

 private:
  benchmark::BenchmarkReporter* inner_;
};

// Flags have to be read before benchmark::Initialize consumes them.
struct CliFlags {
  bool list_tests = false;
  bool has_out = false;
  std::string out_format = "json";
};
CliFlags scan_flags(int argc, char** argv) {
  CliFlags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value_of = [&](const char* flag) -> const char* {
      const size_t n = std::strlen(flag);
      if (a.compare(0, n, flag) != 0) return nullptr;
      if (a.size() == n) return "";
      return a[n] == '=' ? argv[i] + n + 1 : nullptr;
    };
    if (const char* v = value_of("--benchmark_list_tests"))
      f.list_tests = !(std::strcmp(v, "false") == 0 || std::strcmp(v, "0") == 0);
    if (const char* v = value_of("--benchmark_out")) f.has_out = *v != '\0';
    if (const char* v = value_of("--benchmark_out_format")) f.out_format = v;
  }
  return f;
}

double target_seconds() {
  if (const char* e = std::getenv("M3QKV_BENCH_TARGET_S")) {
    const double t = std::atof(e);
    if (t > 0) return t;
  }
  return 0.3;
}

// -------------------------------------------------------------- host cost
// host_<op>/TP:t/M:m (issue 12): the CPU time of one call itself, with the
// GPU idle (the stream is synchronized before every timed call, outside the
// timed region), reported as the iteration time (the console's Time column:
// the mean) and as counters host_us / host_p90_us (median, p90), the host
// path's phases (host/timing.h; medians over a second
// pass with the phase marks on, which cost ~20 ns each), and beside it the
// kernel time of the same call (kernel_us: a CUDA graph of 64 calls on one
// set, warm L2, replayed 5 times). Counter checked = 1 when the process runs
// with M3QKV_CHECKED=1 (run the filter twice to price checked mode).
// The host-cost ops: m3qkv's four, and beside them in the same run the same
// measurement of a cuBLAS bf16 GEMM call, a cuBLASLt fp8 matmul call and a
// bare cudaLaunchKernelEx of an empty kernel (what a launch costs this host).
enum class HostOp { kFused, kInsert, kGemm, kQuantize, kCublasBf16, kCublasLtFp8, kEmptyLaunch };

// bf16 x [M, K] -> xq, xsf for host_quantize (one set; contents irrelevant).
struct QuantizeSet {
  int64_t m = -1;
  std::vector<DevPtr> own;
  m3qkv_quantize_args args{};
};
const m3qkv_quantize_args* quantize_args(int64_t m) {
  static QuantizeSet q;
  if (q.m != m) {
    q.own.clear();
    g_error.clear();
    std::memset(&q.args, 0, sizeof q.args);
    q.args.struct_size = sizeof q.args;
    q.args.m = m;
    q.args.k = kK;
    q.args.x = dev_upload(q.own, nullptr, size_t(m * kK * 2));
    q.args.xq = dev_upload(q.own, nullptr, size_t(m * kK));
    q.args.xsf = dev_upload(q.own, nullptr, size_t(m3qkv::f8_128x4_bytes(m, kK / 32)));
    q.args.use_pdl = 1;
    if (!finish_build()) return nullptr;
    q.m = m;
  }
  return &q.args;
}

double median_of(std::vector<double> v, double q = 0.5) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size())))];
}

// Kernel time per call: a graph of 64 calls (kMinCallsPerIteration) replayed
// 5 times between events.
template <class Call>
double kernel_us(Call& call) {
  Device& d = dev();
  constexpr int kCalls = kMinCallsPerIteration, kReplays = 5;
  if (cudaStreamBeginCapture(d.stream, cudaStreamCaptureModeRelaxed) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0.0;
  }
  bool ok = true;
  for (int i = 0; i < kCalls && ok; ++i) ok = call() == M3QKV_SUCCESS;
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  const cudaError_t ee = cudaStreamEndCapture(d.stream, &g);
  if (!ok || ee != cudaSuccess || cudaGraphInstantiate(&exec, g, 0) != cudaSuccess) {
    if (g) cudaGraphDestroy(g);
    (void)cudaGetLastError();
    return 0.0;
  }
  cudaGraphDestroy(g);
  std::vector<double> per_call;
  cudaGraphLaunch(exec, d.stream);  // warm
  for (int r = 0; r < kReplays; ++r) {
    cudaEventRecord(d.e0, d.stream);
    cudaGraphLaunch(exec, d.stream);
    cudaEventRecord(d.e1, d.stream);
    cudaEventSynchronize(d.e1);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, d.e0, d.e1);
    per_call.push_back(double(ms) * 1e3 / kCalls);
  }
  cudaGraphExecDestroy(exec);
  return median_of(per_call);
}

void bench_host(benchmark::State& state, HostOp op, EmptyLaunch how = EmptyLaunch::kRuntimeExPdl) {
  const Heads& h = arg_heads(state);
  const int64_t m = state.range(1);
  M3Sets* s = m3_sets(h, m);
  if (!s) return skip_setup(state);
  const M3Set& set = s->sets[0];
  const m3qkv_quantize_args* qa = op == HostOp::kQuantize ? quantize_args(m) : nullptr;
  if (op == HostOp::kQuantize && !qa) return skip_setup(state);
  const bool blas = op == HostOp::kCublasBf16 || op == HostOp::kCublasLtFp8;
  BlasSets* bs = blas ? blas_sets(h, m, op == HostOp::kCublasLtFp8) : nullptr;
  if (blas && !bs) return skip_setup(state);
  cudaStream_t stream = dev().stream;
  auto call = [&]() -> m3qkv_status {
    switch (op) {
      case HostOp::kFused: return m3qkv_fused_qkv(&set.fused, stream);
      case HostOp::kInsert: return m3qkv_qknorm_rope_kv_insert(&set.insert, stream);
      case HostOp::kGemm: return m3qkv_mxfp8_gemm(&set.gemm, stream);
      case HostOp::kQuantize: return m3qkv_mxfp8_quantize(qa, stream);
      case HostOp::kCublasBf16:
      case HostOp::kCublasLtFp8:
        return blas_gemm(*bs, bs->sets[0], op == HostOp::kCublasLtFp8).empty() ? M3QKV_SUCCESS
                                                                                 : M3QKV_ERROR_CUDA_ERROR;
      case HostOp::kEmptyLaunch:
        return m3qkv_bench_empty_launch(stream, how) == cudaSuccess ? M3QKV_SUCCESS : M3QKV_ERROR_CUDA_ERROR;
    }
    return M3QKV_ERROR_INTERNAL;
  };
  for (int i = 0; i < 3; ++i) {  // first calls: module load, setup, tensor-map encodes
    const m3qkv_status st = call();
    if (st != M3QKV_SUCCESS) {
      state.SkipWithError(m3err(st).c_str());
      return;
    }
  }
  if (cudaStreamSynchronize(stream) != cudaSuccess) {
    state.SkipWithError("warm-up failed");
    return;
  }
  const double kernel = kernel_us(call);
  std::vector<double> host_us;
  for (auto _ : state) {
    cudaStreamSynchronize(stream);
    const auto t0 = std::chrono::steady_clock::now();
    const m3qkv_status st = call();
    const auto t1 = std::chrono::steady_clock::now();
    if (st != M3QKV_SUCCESS) {
      state.SkipWithError(m3err(st).c_str());
      break;
    }
    const double sec = std::chrono::duration<double>(t1 - t0).count();
    state.SetIterationTime(sec);
    host_us.push_back(sec * 1e6);
  }
  cudaStreamSynchronize(stream);
  // The breakdown, in a second pass with the phase marks on (m3qkv's ops only).
  unsigned long long ns[16] = {};
  const bool ours = op == HostOp::kFused || op == HostOp::kInsert || op == HostOp::kGemm || op == HostOp::kQuantize;
  const int phases = ours ? m3qkv_testing_host_phases(ns, 16) : 0;
  std::vector<std::vector<double>> per_phase(static_cast<size_t>(phases));
  if (ours) m3qkv_testing_host_timing(1);
  for (int i = 0; i < (ours ? 500 : 0); ++i) {
    cudaStreamSynchronize(stream);
    if (call() != M3QKV_SUCCESS) break;
    m3qkv_testing_host_phases(ns, 16);
    for (int p = 0; p < phases; ++p) per_phase[size_t(p)].push_back(double(ns[p]) * 1e-3);
  }
  m3qkv_testing_host_timing(0);
  cudaStreamSynchronize(stream);
  state.counters["host_us"] = median_of(host_us);
  state.counters["host_p90_us"] = median_of(host_us, 0.9);
  state.counters["kernel_us"] = kernel;
  const char* checked = std::getenv("M3QKV_CHECKED");
  state.counters["checked"] = checked != nullptr && std::strcmp(checked, "1") == 0 ? 1 : 0;
  for (int p = 0; p < phases; ++p)
    state.counters[std::string("phase_") + m3qkv_testing_host_phase_name(p) + "_us"] = median_of(per_phase[size_t(p)]);
}

// The host-cost entries: every TP at the decode and prefill sizes for the
// fused op, TP4 for the single ops.
void register_host() {
  const int64_t ms[] = {1, 64, 512, 4096};
  auto add = [](const char* name, const Heads& h, int64_t m, HostOp op) {
    benchmark::RegisterBenchmark(name, [op](benchmark::State& st) { bench_host(st, op); })
        ->Args({h.tp, m})
        ->ArgNames({"TP", "M"})
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond)
        ->MinTime(0.01);  // of host time: ~2000 calls at 5 us (each also waits for its kernel)
  };
  for (const Heads& h : kHeads)
    for (int64_t m : ms) add("host_fused_qkv", h, m, HostOp::kFused);
  for (int64_t m : ms) {
    add("host_insert", kHeads[0], m, HostOp::kInsert);
    add("host_gemm", kHeads[0], m, HostOp::kGemm);
    add("host_quantize", kHeads[0], m, HostOp::kQuantize);
    add("host_cublas_bf16", kHeads[0], m, HostOp::kCublasBf16);
    add("host_cublaslt_fp8", kHeads[0], m, HostOp::kCublasLtFp8);
  }
  const std::pair<const char*, EmptyLaunch> launches[] = {
      {"host_launch_empty", EmptyLaunch::kRuntimeExPdl},
      {"host_launch_runtime_nopdl", EmptyLaunch::kRuntimeEx},
      {"host_launch_chevron", EmptyLaunch::kChevron},
      {"host_launch_runtime_big", EmptyLaunch::kRuntimeExPdlBig},
      {"host_launch_driver", EmptyLaunch::kDriverExPdl},
      {"host_launch_driver_nopdl", EmptyLaunch::kDriverEx},
      {"host_launch_driver_big", EmptyLaunch::kDriverExPdlBig},
      {"host_launch_driver_cukernel", EmptyLaunch::kDriverKernelExPdl},
  };
  for (const auto& [name, how] : launches)
    benchmark::RegisterBenchmark(name, [how](benchmark::State& st) { bench_host(st, HostOp::kEmptyLaunch, how); })
        ->Args({kHeads[0].tp, 1})
        ->ArgNames({"TP", "M"})
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond)
        ->MinTime(0.01);
}

void register_sweep(m3qkv_backend_kind autok, bool sm90_variants) {
  const double target = target_seconds();
  auto add = [&](const std::string& name, const Heads& h, int64_t m, auto fn) {
    benchmark::RegisterBenchmark(name.c_str(), fn)
        ->Args({h.tp, m})
        ->ArgNames({"TP", "M"})
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond)
        ->MinTime(target / calls_per_iteration(case_rotation(h, m)));
  };
  // The peaks first: ~1.6 / 0.9 ms per call, 0.5 s each so the clocks settle
  // under sustained load as they do in the large cases of the sweep.
  benchmark::RegisterBenchmark("peak_bf16", [](benchmark::State& st) { bench_peak(st, false); })
      ->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.5);
  benchmark::RegisterBenchmark("peak_fp8", [](benchmark::State& st) { bench_peak(st, true); })
      ->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.5);
  benchmark::RegisterBenchmark("copy_d2d", bench_copy)->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.3);
  for (const Heads& h : kHeads) {
    add("floor_read", h, 0, bench_floor_read);
    for (int64_t m : kMs) {
      add(std::string("fused_") + backend_tag(autok), h, m,
          [autok](benchmark::State& st) { bench_fused(st, autok); });
      add("unfused_gemm+insert", h, m, bench_unfused);
      add("cublas_bf16", h, m, [](benchmark::State& st) { bench_blas(st, false, false); });
      add("cublas_bf16+insert", h, m, [](benchmark::State& st) { bench_blas(st, false, true); });
      add("cublaslt_fp8", h, m, [](benchmark::State& st) { bench_blas(st, true, false); });
      add("cublaslt_fp8+insert", h, m, [](benchmark::State& st) { bench_blas(st, true, true); });
      // Cache formats (issue 13): the fused kernel with FP8 / BF16 caches, the insert in every format.
      for (int f = 1; f < kFormats; ++f)
        add(std::string("fused_") + backend_tag(autok) + "_" + kFormatNames[f], h, m,
            [autok, f](benchmark::State& st) { bench_fused_fmt(st, autok, f); });
      add(std::string("fused_") + backend_tag(autok) + "_xbf16_fp8", h, m,
          [autok](benchmark::State& st) { bench_fused_xbf16(st, autok); });
      add(std::string("fused_") + backend_tag(autok) + "_invariant_fp8", h, m,
          [autok](benchmark::State& st) { bench_fused_invariant(st, autok); });
      if (autok == M3QKV_BACKEND_SM90)
        add(std::string("fused_") + backend_tag(autok) + "_fast_fp8", h, m,
            [autok](benchmark::State& st) { bench_fused_fast(st, autok, false); });
      for (int f = 0; f < kFormats; ++f) {
        add(std::string("insert_") + kFormatNames[f], h, m, [f](benchmark::State& st) { bench_insert(st, f); });
        if (m > 4096) continue;  // the forced layouts where the plan's choice is read off
        static const char* const kLayoutTags[] = {"_quad", "_warp", "_l8", "_c32q8", "_c16q8", "_c16q8g"};
        for (int l = 1; l <= 6; ++l)
          add(std::string("insert_") + kFormatNames[f] + kLayoutTags[l - 1], h, m,
              [f, l](benchmark::State& st) { bench_insert(st, f, l); });
      }
#if M3QKV_WITH_SM90
      if (sm90_variants) {  // every TP: the decode/tile routing rule is read off these
        const bool crossover = std::find(std::begin(kCrossoverMs), std::end(kCrossoverMs), m) != std::end(kCrossoverMs);
        if (crossover || m <= 16) {
          add("sm90_decode", h, m, [](benchmark::State& st) { bench_sm90_path(st, true); });
          add("sm90_decode_l2", h, m, [](benchmark::State& st) {
            bench_sm90_path(st, true, m3qkv::kSm90DecodeXTransform, m3qkv::kSm90DecodeReduceL2);
          });
          add("sm90_decode_spread", h, m, [](benchmark::State& st) {
            bench_sm90_path(st, true, m3qkv::kSm90DecodeXTransform, m3qkv::kSm90DecodeReduceSpread);
          });
          add("sm90_decode_cluster", h, m, [](benchmark::State& st) {
            bench_sm90_path(st, true, m3qkv::kSm90DecodeXTransform, m3qkv::kSm90DecodeReduceCluster);
          });
        }
        if (crossover || m <= 16) {  // M <= 16: transform warps vs converted x (decode_converts_x)
          add("sm90_decode_xhat", h, m, [](benchmark::State& st) {
            bench_sm90_path(st, true, m3qkv::kSm90DecodeXConverted);
          });
          add("sm90_decode_xhat_l2", h, m, [](benchmark::State& st) {
            bench_sm90_path(st, true, m3qkv::kSm90DecodeXConverted, m3qkv::kSm90DecodeReduceL2);
          });
        }
        if (crossover) add("sm90_tile", h, m, [](benchmark::State& st) { bench_sm90_path(st, false); });
      }
      // Prefill step 1 (issue 11): variant A with and without the activations
      // pre-converted, on the same plan (128-row tiles forced), every TP, M >= 512
      // (below the automatic plan's 128-row threshold too: the routing rule is read off these).
      if (sm90_variants && m >= 64)
        for (int c : {0, 1, 4})
          add(c == 0 ? std::string("sm90_fast") : "sm90_fast_c" + std::to_string(c), h, m,
              [c](benchmark::State& st) { bench_fused_fast(st, M3QKV_BACKEND_SM90, true, c); });
      if (sm90_variants && m >= 512) {
        add("sm90_A_regs", h, m, [](benchmark::State& st) {
          bench_sm90_variant(st, m3qkv::kSm90Bf16Dequant, 128);
        });
        add("sm90_A_preA", h, m, [](benchmark::State& st) {
          bench_sm90_variant(st, m3qkv::kSm90Bf16DequantPreA, 128);
        });
        add("sm90_prefill", h, m, [](benchmark::State& st) {
          bench_sm90_variant(st, m3qkv::kSm90Bf16Prefill, 128);
        });
      }
#endif
      if (h.tp != kExtraTp || std::find(std::begin(kExtraMs), std::end(kExtraMs), m) == std::end(kExtraMs))
        continue;
      if (autok != M3QKV_BACKEND_PORTABLE)
        add("fused_portable", h, m, [](benchmark::State& st) { bench_fused(st, M3QKV_BACKEND_PORTABLE); });
#if !M3QKV_WITH_SM90
      (void)sm90_variants;
#endif
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const CliFlags flags = scan_flags(argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    if (flags.list_tests) {
      // What an H200 would register: the SM90 backend (when built) and its variants.
      std::fprintf(stderr, "m3qkv_bench: no CUDA device: listing the sweep as an H200 would run it\n");
      const bool sm90 = M3QKV_WITH_SM90 != 0;
      register_sweep(sm90 ? M3QKV_BACKEND_SM90 : M3QKV_BACKEND_PORTABLE, sm90);
      register_host();
      benchmark::RunSpecifiedBenchmarks();
      benchmark::Shutdown();
      return 0;
    }
    std::printf("m3qkv_bench: no CUDA device (%s): all benchmarks skipped.\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "device count 0");
    return 0;
  }
  if (!init_device()) {
    std::fprintf(stderr, "m3qkv_bench: device setup failed (CUDA / cuBLAS / m3qkv_warmup)\n");
    shutdown_device();
    return 1;
  }
  m3qkv_backend_kind autok = M3QKV_BACKEND_NONE;
  if (m3qkv_backend(dev().id, &autok) != M3QKV_SUCCESS || autok == M3QKV_BACKEND_NONE)
    autok = M3QKV_BACKEND_PORTABLE;
  benchmark::AddCustomContext("device", dev().name);
  benchmark::AddCustomContext("l2_bytes", std::to_string(dev().l2));
  benchmark::AddCustomContext("problem",
                              "MiniMax-M3 K=6144 block=128 q bf16; TP4 nq16 nkv1 niq1 nik1 N=2560, TP2 32/2/2/1 "
                              "N=4992, TP1 64/4/4/1 N=9856, TP8 8/1/1/1 N=1536");
  benchmark::AddCustomContext("target_s", std::to_string(target_seconds()));
  register_sweep(autok, dev().cc_major == 9);
  register_host();
  // Reporters that drop min_time from the names; a csv --benchmark_out keeps
  // Google Benchmark's own file reporter (full names).
  PlainNames display(benchmark::CreateDefaultDisplayReporter());
  std::unique_ptr<benchmark::BenchmarkReporter> file_inner;
  if (flags.has_out && flags.out_format == "json") file_inner = std::make_unique<benchmark::JSONReporter>();
  if (flags.has_out && flags.out_format == "console")
    file_inner = std::make_unique<benchmark::ConsoleReporter>(benchmark::ConsoleReporter::OO_None);
  std::unique_ptr<PlainNames> file;
  if (file_inner) file = std::make_unique<PlainNames>(file_inner.get());
  benchmark::RunSpecifiedBenchmarks(&display, file.get());
  benchmark::Shutdown();
  release_case();
  shutdown_device();
  return 0;
}
