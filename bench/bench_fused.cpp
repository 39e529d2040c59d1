// m3qkv benchmark (Google Benchmark, manual time from CUDA events).
//
// MiniMax-M3 TP4 (K = 6144, nq 16, nkv 1, niq 1, nik 1 → N = 2560, NVFP4
// caches with block_size 128, q written as bf16, index_q as e4m3) at
// M ∈ {1, 64, 512, 4096}:
//   fused/<backend>   m3qkv fused kernel (portable forced; plus the automatic
//                     backend when it differs, e.g. sm90)
//   unfused           m3qkv_mxfp8_gemm (bf16 qkv) + m3qkv_qknorm_rope_kv_insert
//   cublas_bf16       cuBLAS bf16 GEMM [M,K]·[N,K]ᵀ → bf16 (the weight stream is 2×)
//   cublaslt_fp8      cuBLASLt e4m3 GEMM, per-tensor scales, → bf16
// The cuBLAS lines are GEMM-only baselines (no epilogue), for scale.
//
// Cold-L2 methodology: every op rotates over R input/output sets with
// R·(set bytes) ≥ 3 × L2, so no call finds its weights in L2. One benchmark
// iteration = one pass over the R sets between two CUDA events, replayed as
// a CUDA graph (see timed_loop); the iteration time reported is the pass
// time / R (time per call).
//
// Counters: us (per call), TFLOP/s (2·M·N·K), GB/s over "bytes" = weights +
// activations (+ scale factors) + outputs (+ the small per-token inputs for
// the m3qkv ops), i.e. what one call must move at least once. The unfused
// pair also moves the bf16 qkv twice (write + read): reported as traffic_MB,
// not counted in GB/s, so GB/s stays comparable to the fused kernel.
//
// No GPU: prints a message and exits 0 without running anything.
#include <benchmark/benchmark.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "api/internal.h"  // m3qkv_testing_fused_qkv (forced backend)
#if M3QKV_WITH_SM90
#include "sm90/sm90.h"  // sm90_fused_variant: the two MX mainloops side by side
#endif
#include "common/layouts.h"
#include "common/numerics.h"
#include "m3qkv/m3qkv.h"

namespace {

constexpr int64_t kK = 6144;
constexpr int kNq = 16, kNkv = 1, kNiq = 1, kNik = 1;
constexpr int64_t kN = int64_t(kNq + 2 * kNkv + kNiq + kNik) * 128;
constexpr int kBlock = 128;
constexpr int64_t kMaxPosition = 8192;
static_assert(kN == 2560, "TP4");
const int64_t kMs[] = {1, 64, 512, 4096};

// ------------------------------------------------------------ bytes / flops
double fused_bytes(int64_t m) {
  const double md = double(m);
  double b = double(kN * kK) + double(m3qkv::f8_128x4_bytes(kN, kK / 32));  // wq + wsf
  b += md * double(kK) + double(m3qkv::f8_128x4_bytes(m, kK / 32));          // xq + xsf
  b += md * (8 + 8 + 8 + 128) + 4 * 256;  // positions, 2 slot maps, cos/sin row, norm weights
  b += md * kNq * 128 * 2 + md * kNiq * 128;  // q bf16 + index_q e4m3
  b += md * (2 * kNkv + kNik) * 72;           // K, V, index_k cache slots
  return b;
}
double flops(int64_t m) { return 2.0 * double(m) * double(kN) * double(kK); }

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

void* dev_upload(std::vector<DevPtr>& own, const void* h, size_t n) {
  auto d = std::make_unique<DevMem>();
  cudaError_t e = cudaMalloc(&d->p, std::max<size_t>(n, 16));
  if (e == cudaSuccess && h && n) e = cudaMemcpy(d->p, h, n, cudaMemcpyHostToDevice);
  if (e == cudaSuccess && !h && n) e = cudaMemset(d->p, 0, n);
  if (e != cudaSuccess) {
    if (g_error.empty()) g_error = std::string("cuda allocation/copy failed: ") + cudaGetErrorString(e);
    return nullptr;
  }
  void* p = d->p;
  own.push_back(std::move(d));
  return p;
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

// Number of rotating sets so that R·set_bytes ≥ 3·L2 (2..64).
int rotation(double set_bytes) {
  const double l2 = std::max(dev().l2, 1 << 20);
  return int(std::min(64.0, std::max(2.0, std::ceil(3.0 * l2 / set_bytes))));
}

uint8_t random_e4m3(std::mt19937_64& rng) {
  uint8_t b = uint8_t(rng());
  if ((b & 0x7f) == 0x7f) b ^= 1;  // no NaN
  return b;
}

// -------------------------------------------------------------- m3qkv sets
// One set = every buffer one call touches that is large (operands, outputs).
struct M3Set {
  m3qkv_fused_args fused;
  m3qkv_gemm_args gemm;
  m3qkv_insert_args insert;
};
struct M3Sets {
  std::vector<DevPtr> own;
  std::vector<M3Set> sets;
  double set_bytes = 0;
};

std::map<int64_t, std::unique_ptr<M3Sets>>& m3_cache() {
  static std::map<int64_t, std::unique_ptr<M3Sets>> c;
  return c;
}

M3Sets* m3_sets(int64_t m) {
  auto& c = m3_cache();
  auto it = c.find(m);
  if (it != c.end()) return it->second.get();
  g_error.clear();  // errors are per builder (one failing baseline must not block the others)
  auto s = std::make_unique<M3Sets>();
  std::mt19937_64 rng(0x5EED0000ULL + uint64_t(m));
  std::normal_distribution<double> nd(0.0, 1.0);
  // Host data shared by all sets (contents do not matter for L2, addresses do).
  std::vector<uint8_t> xq(size_t(m * kK)), wq(size_t(kN * kK));
  for (auto& b : xq) b = random_e4m3(rng);
  for (auto& b : wq) b = random_e4m3(rng);
  std::vector<uint8_t> xsf(size_t(m3qkv::f8_128x4_bytes(m, kK / 32))), wsf(size_t(m3qkv::f8_128x4_bytes(kN, kK / 32)));
  for (auto& b : xsf) b = uint8_t(120 + rng() % 8);
  for (auto& b : wsf) b = uint8_t(110 + rng() % 8);
  std::vector<uint16_t> cs(size_t(kMaxPosition * 64)), nw(128);
  for (auto& v : cs) v = m3qkv::f32_to_bf16_rn_soft(float(nd(rng) * 0.5));
  for (auto& v : nw) v = m3qkv::f32_to_bf16_rn_soft(float(nd(rng) * 0.1));
  std::vector<int64_t> pos(static_cast<size_t>(m)), slots(static_cast<size_t>(m)), islots(static_cast<size_t>(m));
  const int64_t pages = std::max<int64_t>(1, (m + kBlock - 1) / kBlock);
  for (int64_t i = 0; i < m; ++i) {
    pos[size_t(i)] = int64_t(rng() % uint64_t(kMaxPosition));
    slots[size_t(i)] = i;  // contiguous, as a prefill writes them
    islots[size_t(i)] = i;
  }
  const int64_t kv_stride = m3qkv::kv_page_min_bytes(kNkv, kBlock), ix_stride = m3qkv::nvfp4_slot_bytes(kBlock);
  const size_t q_bytes = size_t(m * kNq * 128 * 2), iq_bytes = size_t(m * kNiq * 128);
  const size_t qkv_bytes = size_t(m * kN * 2);
  s->set_bytes = double(xq.size() + wq.size() + xsf.size() + wsf.size() + q_bytes + iq_bytes + qkv_bytes) +
                 double(pages * (kv_stride + ix_stride));
  const int r = rotation(s->set_bytes);
  // Small shared inputs (L2-resident in real serving too).
  void* dcs = dev_upload(s->own, cs.data(), cs.size() * 2);
  void* dnw = dev_upload(s->own, nw.data(), 256);
  void* dpos = dev_upload(s->own, pos.data(), pos.size() * 8);
  void* dsl = dev_upload(s->own, slots.data(), slots.size() * 8);
  void* disl = dev_upload(s->own, islots.data(), islots.size() * 8);
  for (int i = 0; i < r; ++i) {
    void* dxq = dev_upload(s->own, xq.data(), xq.size());
    void* dxsf = dev_upload(s->own, xsf.data(), xsf.size());
    void* dwq = dev_upload(s->own, wq.data(), wq.size());
    void* dwsf = dev_upload(s->own, wsf.data(), wsf.size());
    void* dq = dev_upload(s->own, nullptr, q_bytes);
    void* diq = dev_upload(s->own, nullptr, iq_bytes);
    void* dkv = dev_upload(s->own, nullptr, size_t(pages * kv_stride));
    void* dix = dev_upload(s->own, nullptr, size_t(pages * ix_stride));
    void* dqkv = dev_upload(s->own, nullptr, qkv_bytes);
    if (!g_error.empty()) return nullptr;
    M3Set set;
    m3qkv_fused_args& a = set.fused;
    std::memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.m = m;
    a.k = kK;
    a.nq = kNq;
    a.nkv = kNkv;
    a.niq = kNiq;
    a.nik = kNik;
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
    g.n = kN;
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
    in.nq = kNq;
    in.nkv = kNkv;
    in.niq = kNiq;
    in.nik = kNik;
    in.qkv = dqkv;
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
    s->sets.push_back(set);
  }
  M3Sets* out = s.get();
  c[m] = std::move(s);
  return out;
}

// ------------------------------------------------------------- cuBLAS sets
struct BlasSets {
  std::vector<DevPtr> own;
  struct Set {
    void *a, *b, *c;  // a = W [N, K], b = X [M, K], c = out [M, N]
  };
  std::vector<Set> sets;
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

std::map<std::pair<int64_t, bool>, std::unique_ptr<BlasSets>>& blas_cache() {
  static std::map<std::pair<int64_t, bool>, std::unique_ptr<BlasSets>> c;
  return c;
}

BlasSets* blas_sets(int64_t m, bool fp8) {
  auto& c = blas_cache();
  auto key = std::make_pair(m, fp8);
  auto it = c.find(key);
  if (it != c.end()) return it->second.get();
  g_error.clear();
  auto s = std::make_unique<BlasSets>();
  std::mt19937_64 rng(0xB1A5ULL + uint64_t(m));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const size_t esz = fp8 ? 1 : 2;
  std::vector<uint8_t> w(size_t(kN * kK) * esz), x(size_t(m * kK) * esz);
  auto fill = [&](std::vector<uint8_t>& v, float sigma) {
    if (fp8) {
      for (auto& b : v) b = random_e4m3(rng);
    } else {
      uint16_t* h = reinterpret_cast<uint16_t*>(v.data());
      for (size_t i = 0; i < v.size() / 2; ++i) h[i] = m3qkv::f32_to_bf16_rn_soft(nd(rng) * sigma);
    }
  };
  fill(w, 0.02f);
  fill(x, 1.0f);
  const size_t out_bytes = size_t(m * kN * 2);
  const int r = rotation(double(w.size() + x.size() + out_bytes));
  for (int i = 0; i < r; ++i) {
    BlasSets::Set set;
    set.a = dev_upload(s->own, w.data(), w.size());
    set.b = dev_upload(s->own, x.data(), x.size());
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
    chk(cublasLtMatrixLayoutCreate(&s->la, CUDA_R_8F_E4M3, kK, kN, kK), "layout A");
    chk(cublasLtMatrixLayoutCreate(&s->lb, CUDA_R_8F_E4M3, kK, m, kK), "layout B");
    chk(cublasLtMatrixLayoutCreate(&s->lc, CUDA_R_16BF, kN, m, kN), "layout C/D");
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
  BlasSets* out = s.get();
  c[key] = std::move(s);
  return out;
}

// ---------------------------------------------------------------- timing
// One pass = call(0..R-1). The pass is captured once into a CUDA graph (as
// decode is served) so that host launch overhead — validation plus
// cudaLaunchKernelEx, a few µs per call — does not hide a few-µs kernel;
// M3QKV_BENCH_NO_GRAPH=1 times direct launches instead. Counter "graph" says
// which one ran (a failed capture falls back to direct launches).
template <class Call>
bool capture_pass(int r, Call& call, cudaGraphExec_t* exec) {
  Device& d = dev();
  *exec = nullptr;
  if (const char* e = std::getenv("M3QKV_BENCH_NO_GRAPH"))
    if (std::strcmp(e, "0") != 0) return false;
  if (cudaStreamBeginCapture(d.stream, cudaStreamCaptureModeRelaxed) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  bool ok = true;
  for (int i = 0; i < r && ok; ++i) ok = call(i).empty();
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

// Runs `call(i)` over the R sets once per iteration between two events.
// call returns an error string ("" on success).
template <class Call>
void timed_loop(benchmark::State& state, int r, double bytes, double flop, double traffic, Call&& call) {
  Device& d = dev();
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
  const bool graph = capture_pass(r, call, &exec);
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
      for (int i = 0; i < r && e.empty(); ++i) e = call(i);
    }
    cudaEventRecord(d.e1, d.stream);
    const cudaError_t se = cudaEventSynchronize(d.e1);
    if (!e.empty() || se != cudaSuccess) {
      state.SkipWithError(e.empty() ? cudaGetErrorString(se) : e.c_str());
      break;
    }
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, d.e0, d.e1);
    const double per_call = double(ms) * 1e-3 / r;
    state.SetIterationTime(per_call);
    total += double(ms) * 1e-3;
    calls += r;
  }
  if (calls == 0) return;
  const double t = total / double(calls);
  state.counters["us"] = t * 1e6;
  state.counters["TFLOP/s"] = flop / t * 1e-12;
  state.counters["GB/s"] = bytes / t * 1e-9;
  state.counters["bytes_MB"] = bytes * 1e-6;
  if (traffic > 0) state.counters["traffic_MB"] = traffic * 1e-6;
  state.counters["sets"] = r;
  state.counters["graph"] = graph ? 1 : 0;
}

std::string m3err(m3qkv_status s) {
  return s == M3QKV_SUCCESS ? std::string() : std::string(m3qkv_status_string(s)) + ": " + m3qkv_last_error();
}

void bench_fused(benchmark::State& state, m3qkv_backend_kind backend) {
  const int64_t m = state.range(0);
  M3Sets* s = dev().ok ? m3_sets(m) : nullptr;
  if (!s) {
    state.SkipWithError(g_error.empty() ? "no CUDA device" : g_error.c_str());
    return;
  }
  timed_loop(state, int(s->sets.size()), fused_bytes(m), flops(m), 0.0, [&](int i) {
    return m3err(m3qkv_testing_fused_qkv(&s->sets[size_t(i)].fused, nullptr, backend, dev().stream));
  });
}

#if M3QKV_WITH_SM90
// The SM90 kernel with an explicit mainloop variant and epilogue (issue 4:
// measure both MX mainloops side by side before choosing).
void bench_sm90_variant(benchmark::State& state, int variant, int epilogue) {
  const int64_t m = state.range(0);
  M3Sets* s = dev().ok ? m3_sets(m) : nullptr;
  if (!s) {
    state.SkipWithError(g_error.empty() ? "no CUDA device" : g_error.c_str());
    return;
  }
  m3qkv::DeviceInfo info;
  if (m3qkv::current_device_info(&info) != M3QKV_SUCCESS || info.cc_major != 9) {
    state.SkipWithError("SM90 variants need a CC 9.0 device");
    return;
  }
  timed_loop(state, int(s->sets.size()), fused_bytes(m), flops(m), 0.0, [&](int i) {
    return m3err(m3qkv::sm90_fused_variant(s->sets[size_t(i)].fused, info, nullptr, dev().stream, variant, 0, epilogue));
  });
}
#endif

void bench_unfused(benchmark::State& state) {
  const int64_t m = state.range(0);
  M3Sets* s = dev().ok ? m3_sets(m) : nullptr;
  if (!s) {
    state.SkipWithError(g_error.empty() ? "no CUDA device" : g_error.c_str());
    return;
  }
  const double traffic = fused_bytes(m) + 2.0 * double(m * kN) * 2.0;
  timed_loop(state, int(s->sets.size()), fused_bytes(m), flops(m), traffic, [&](int i) {
    std::string e = m3err(m3qkv_mxfp8_gemm(&s->sets[size_t(i)].gemm, dev().stream));
    if (e.empty()) e = m3err(m3qkv_qknorm_rope_kv_insert(&s->sets[size_t(i)].insert, dev().stream));
    return e;
  });
}

void bench_cublas_bf16(benchmark::State& state) {
  const int64_t m = state.range(0);
  BlasSets* s = dev().ok ? blas_sets(m, false) : nullptr;
  if (!s) {
    state.SkipWithError(g_error.empty() ? "no CUDA device" : g_error.c_str());
    return;
  }
  const double bytes = double(kN * kK) * 2 + double(m * kK) * 2 + double(m * kN) * 2;
  const float alpha = 1.0f, beta = 0.0f;
  timed_loop(state, int(s->sets.size()), bytes, flops(m), 0.0, [&](int i) -> std::string {
    const auto& x = s->sets[size_t(i)];
    // Column-major: C[N, M] = W[K, N]ᵀ · X[K, M].
    const cublasStatus_t st =
        cublasGemmEx(dev().blas, CUBLAS_OP_T, CUBLAS_OP_N, int(kN), int(m), int(kK), &alpha, x.a, CUDA_R_16BF,
                     int(kK), x.b, CUDA_R_16BF, int(kK), &beta, x.c, CUDA_R_16BF, int(kN), CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
    return st == CUBLAS_STATUS_SUCCESS ? std::string() : "cublasGemmEx failed: " + std::to_string(int(st));
  });
}

void bench_cublaslt_fp8(benchmark::State& state) {
  const int64_t m = state.range(0);
  BlasSets* s = dev().ok ? blas_sets(m, true) : nullptr;
  if (!s) {
    state.SkipWithError(g_error.empty() ? "no CUDA device" : g_error.c_str());
    return;
  }
  const double bytes = double(kN * kK) + double(m * kK) + double(m * kN) * 2;
  const float alpha = 1.0f, beta = 0.0f;
  timed_loop(state, int(s->sets.size()), bytes, flops(m), 0.0, [&](int i) -> std::string {
    const auto& x = s->sets[size_t(i)];
    const cublasStatus_t st = cublasLtMatmul(dev().lt, s->op, &alpha, x.a, s->la, x.b, s->lb, &beta, x.c, s->lc, x.c,
                                             s->lc, &s->algo, dev().workspace, dev().workspace_bytes, dev().stream);
    return st == CUBLAS_STATUS_SUCCESS ? std::string() : "cublasLtMatmul failed: " + std::to_string(int(st));
  });
}

const char* backend_tag(m3qkv_backend_kind k) {
  switch (k) {
    case M3QKV_BACKEND_PORTABLE: return "portable";
    case M3QKV_BACKEND_SM90: return "sm90";
    case M3QKV_BACKEND_SM100: return "sm100";
    default: return "none";
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    std::printf("m3qkv_bench: no CUDA device (%s): all benchmarks skipped.\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "device count 0");
    return 0;
  }
  if (!init_device()) {
    std::fprintf(stderr, "m3qkv_bench: device setup failed (CUDA / cuBLAS / m3qkv_warmup)\n");
    shutdown_device();
    return 1;
  }
  std::vector<m3qkv_backend_kind> backends{M3QKV_BACKEND_PORTABLE};
  m3qkv_backend_kind autok = M3QKV_BACKEND_NONE;
  if (m3qkv_backend(dev().id, &autok) == M3QKV_SUCCESS && autok != M3QKV_BACKEND_NONE &&
      autok != M3QKV_BACKEND_PORTABLE)
    backends.push_back(autok);
  benchmark::AddCustomContext("device", dev().name);
  benchmark::AddCustomContext("l2_bytes", std::to_string(dev().l2));
  benchmark::AddCustomContext("problem", "MiniMax-M3 TP4: K=6144 N=2560 nq=16 nkv=1 niq=1 nik=1 block=128, q bf16");
  for (int64_t m : kMs) {
    for (m3qkv_backend_kind b : backends)
      benchmark::RegisterBenchmark((std::string("fused_") + backend_tag(b)).c_str(),
                                   [b](benchmark::State& st) { bench_fused(st, b); })
          ->Arg(m)->ArgName("M")->UseManualTime()->Unit(benchmark::kMicrosecond);
#if M3QKV_WITH_SM90
    if (dev().cc_major == 9)
      for (int v = 0; v < 2; ++v)
        for (int ep = 0; ep < 2; ++ep)
          benchmark::RegisterBenchmark((std::string("sm90_") + (v == 0 ? "A_bf16dq" : "B_fp8promo") +
                                        (ep == 0 ? "_staged" : "_regs")).c_str(),
                                       [v, ep](benchmark::State& st) { bench_sm90_variant(st, v, ep); })
              ->Arg(m)->ArgName("M")->UseManualTime()->Unit(benchmark::kMicrosecond);
#endif
    benchmark::RegisterBenchmark("unfused_gemm+insert", bench_unfused)
        ->Arg(m)->ArgName("M")->UseManualTime()->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("cublas_bf16", bench_cublas_bf16)
        ->Arg(m)->ArgName("M")->UseManualTime()->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("cublaslt_fp8", bench_cublaslt_fp8)
        ->Arg(m)->ArgName("M")->UseManualTime()->Unit(benchmark::kMicrosecond);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  m3_cache().clear();
  blas_cache().clear();
  shutdown_device();
  return 0;
}
