// m3qkv_demo — the main job: one MiniMax-M3 TP4 attention pre-processing step
// on the GPU, checked against the CPU golden model.
//
//   m3qkv_demo [--m M] [--reps R] [--seed S] [--q bf16|fp8|both] [--cpu]
//   m3qkv_demo --selftest      (only the self-test: the first thing to run on a new GPU)
//
// First, on the GPU, it runs and prints m3qkv_selftest: every kernel the
// library has for the device on its built-in exact-data problems, compared
// byte for byte with the golden model (one line per kernel: PASS / FAIL with
// the first wrong byte / not available and why).
// Problem: K = 6144 hidden, TP4 heads (nq 16, nkv 1, niq 1, nik 1 → N = 2560),
// NVFP4 paged caches with block_size 128, M tokens (default 256).
//  1. random bf16 activations are quantized to MXFP8 on the GPU with
//     m3qkv_mxfp8_quantize (checked byte for byte against the golden quantizer);
//  2. m3qkv_fused_qkv runs on them (plus one run of the test-only entry point
//     that also returns the f32 accumulator: the "tap");
//  3. every output byte (q bf16/fp8, index_q, the K/V/index_k cache pages incl.
//     bytes that must stay untouched) is compared with the golden epilogue run
//     on the tap accumulator — bit-exact by the numerics contract — and the
//     accumulator itself with an f64 reference (relative error figure);
//  4. time per call from CUDA events over --reps calls with L2 flushed before
//     each, achieved GB/s and TFLOP/s.
// Without a CUDA device (or with --cpu) it prints why in the library's words
// (m3qkv_backend's message: no driver, an old driver, no GPU) and runs the
// golden model alone on the CPU (default M = 16): its own consistency checks,
// nothing of the GPU code.
// Exit code: 0 = all checks that ran passed (on the CPU path: the golden
// model's), 1 = a mismatch (or a kernel failed the self-test), 2 = bad command
// line, 3 = a CUDA / m3qkv error, or --selftest without a GPU (nothing to test).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "api/internal.h"  // m3qkv_testing_fused_qkv: the accumulator tap
#include "common/layouts.h"
#include "common/numerics.h"
#include "golden/golden.h"
#include "m3qkv/m3qkv.h"

namespace {

// ---------------------------------------------------------------- problem
constexpr int64_t kK = 6144;
constexpr int kNq = 16, kNkv = 1, kNiq = 1, kNik = 1;  // MiniMax-M3 at TP4
constexpr int kBlock = 128;
constexpr int64_t kMaxPosition = 8192;
constexpr int64_t kN = int64_t(kNq + 2 * kNkv + kNiq + kNik) * 128;  // 2560
static_assert(kN == 2560, "TP4 projection width");

struct Options {
  int64_t m = -1;  // -1: 256 on the GPU, 16 on the CPU
  int reps = 20;
  uint64_t seed = 0;
  bool q_bf16 = true, q_fp8 = true;
  bool cpu = false;
  bool selftest_only = false;
};

struct HostProblem {
  int64_t m = 0;
  std::vector<uint16_t> x;           // bf16 [M, K] activations
  std::vector<uint8_t> wq, wsf;      // MXFP8 weight [N, K]
  std::vector<int64_t> positions;
  std::vector<uint16_t> cos_sin;     // bf16 [max_position, 64]
  std::vector<uint16_t> qw, kw, iqw, ikw;
  std::vector<int64_t> slots, islots;
  int64_t num_blocks = 0, num_index_blocks = 0;
  int64_t kv_page_stride = 0, index_page_stride = 0;
  float eps = 1e-6f, q_fp8_scale = 1.0f, k_scale = 1.0f, v_scale = 1.0f;
};

uint16_t bf16(double v) { return m3qkv::f32_to_bf16_rn_soft(static_cast<float>(v)); }

HostProblem build_problem(int64_t m, uint64_t seed) {
  HostProblem p;
  p.m = m;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  // Activations: N(0, 1) rows with per-row magnitude 2^[-2, 2] and rare outliers.
  p.x.resize(size_t(m * kK));
  for (int64_t r = 0; r < m; ++r) {
    const double rs = std::exp2(ud(rng) * 4.0 - 2.0);
    for (int64_t c = 0; c < kK; ++c) {
      double v = nd(rng) * rs;
      if (ud(rng) < 1e-3) v *= 30.0;
      p.x[size_t(r * kK + c)] = bf16(v);
    }
  }
  // Weights: bf16 N(0, 0.02), MXFP8-quantized offline (as a checkpoint is).
  {
    std::vector<uint16_t> w(size_t(kN * kK));
    for (auto& v : w) v = bf16(nd(rng) * 0.02);
    p.wq.resize(size_t(kN * kK));
    p.wsf.resize(size_t(m3qkv::f8_128x4_bytes(kN, kK / 32)));
    m3qkv::golden::mxfp8_quantize(w.data(), kN, kK, p.wq.data(), p.wsf.data());
  }
  // RoPE table: NeoX, 64 rotary dims, theta 10000.
  p.cos_sin.resize(size_t(kMaxPosition * 64));
  for (int64_t pos = 0; pos < kMaxPosition; ++pos)
    for (int i = 0; i < 32; ++i) {
      const double a = double(pos) * std::pow(10000.0, -2.0 * i / 64.0);
      p.cos_sin[size_t(pos * 64 + i)] = bf16(std::cos(a));
      p.cos_sin[size_t(pos * 64 + 32 + i)] = bf16(std::sin(a));
    }
  auto norm_w = [&](std::vector<uint16_t>& w) {
    w.resize(128);
    for (auto& v : w) v = bf16(nd(rng) * 0.1);
  };
  norm_w(p.qw);
  norm_w(p.kw);
  norm_w(p.iqw);
  norm_w(p.ikw);
  p.positions.resize(size_t(m));
  for (auto& v : p.positions) v = int64_t(rng() % uint64_t(kMaxPosition));
  // Paged caches with room for 2·M tokens; each token gets a distinct random slot.
  p.num_blocks = p.num_index_blocks = std::max<int64_t>(2, (2 * m + kBlock - 1) / kBlock);
  p.kv_page_stride = m3qkv::kv_page_min_bytes(kNkv, kBlock);
  p.index_page_stride = m3qkv::nvfp4_slot_bytes(kBlock);
  auto slots = [&](std::vector<int64_t>& s, int64_t cap) {
    std::vector<int64_t> pool(static_cast<size_t>(cap));
    for (int64_t i = 0; i < cap; ++i) pool[size_t(i)] = i;
    std::shuffle(pool.begin(), pool.end(), rng);
    s.assign(pool.begin(), pool.begin() + m);
    for (auto& v : s)
      if (ud(rng) < 0.05) v = -1;  // padding tokens
  };
  slots(p.slots, p.num_blocks * kBlock);
  slots(p.islots, p.num_index_blocks * kBlock);
  return p;
}

// Host output buffers (one poison byte everywhere).
struct Outputs {
  std::vector<uint8_t> q, q8, iq, kv, ix;
  uint32_t flags = 0;
};
Outputs make_outputs(const HostProblem& p, const Options& o, uint8_t poison) {
  Outputs r;
  if (o.q_bf16) r.q.assign(size_t(p.m * kNq * 128 * 2), poison);
  if (o.q_fp8) r.q8.assign(size_t(p.m * kNq * 128), poison);
  r.iq.assign(size_t(p.m * kNiq * 128), poison);
  r.kv.assign(size_t(p.num_blocks * p.kv_page_stride), poison);
  r.ix.assign(size_t(p.num_index_blocks * p.index_page_stride), poison);
  return r;
}

// The args struct for any pointer set (host or device).
struct Ptrs {
  const void *xq, *xsf, *wq, *wsf, *pos, *cs, *qw, *kw, *iqw, *ikw, *slots, *islots;
  void *q, *q8, *iq, *kv, *ix;
  uint32_t* flags;
};
m3qkv_fused_args make_args(const HostProblem& p, const Options& o, const Ptrs& x) {
  m3qkv_fused_args a;
  std::memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.m = p.m;
  a.k = kK;
  a.nq = kNq;
  a.nkv = kNkv;
  a.niq = kNiq;
  a.nik = kNik;
  a.xq = x.xq;
  a.xsf = x.xsf;
  a.wq = x.wq;
  a.wsf = x.wsf;
  a.positions = static_cast<const int64_t*>(x.pos);
  a.max_position = kMaxPosition;
  a.cos_sin_cache = x.cs;
  a.q_norm_weight = x.qw;
  a.k_norm_weight = x.kw;
  a.index_q_norm_weight = x.iqw;
  a.index_k_norm_weight = x.ikw;
  a.eps = p.eps;
  a.slot_mapping = static_cast<const int64_t*>(x.slots);
  a.index_slot_mapping = static_cast<const int64_t*>(x.islots);
  a.kv_cache = x.kv;
  a.kv_page_stride = p.kv_page_stride;
  a.num_blocks = p.num_blocks;
  a.index_cache = x.ix;
  a.index_page_stride = p.index_page_stride;
  a.num_index_blocks = p.num_index_blocks;
  a.block_size = kBlock;
  a.q_out = o.q_bf16 ? x.q : nullptr;
  a.q_fp8_out = o.q_fp8 ? x.q8 : nullptr;
  a.index_q_out = x.iq;
  a.q_fp8_scale = p.q_fp8_scale;
  a.k_scale = p.k_scale;
  a.v_scale = p.v_scale;
  a.use_pdl = 1;
  a.error_flags = x.flags;
  return a;
}
Ptrs host_ptrs(const HostProblem& p, const std::vector<uint8_t>& xq, const std::vector<uint8_t>& xsf, Outputs& o) {
  auto nz = [](auto& v) -> void* { return v.empty() ? nullptr : static_cast<void*>(v.data()); };
  return Ptrs{xq.data(), xsf.data(), p.wq.data(), p.wsf.data(), p.positions.data(), p.cos_sin.data(),
              p.qw.data(), p.kw.data(), p.iqw.data(), p.ikw.data(), p.slots.data(), p.islots.data(),
              nz(o.q), nz(o.q8), nz(o.iq), nz(o.kv), nz(o.ix), &o.flags};
}

// Bytes one call must move at least once: weights, activations, the small
// inputs (positions, slots, one cos/sin row per token, norm weights) and the
// outputs (q, index_q, 72 bytes per written cache slot per head).
double call_bytes(const HostProblem& p, const Options& o) {
  const double m = double(p.m);
  double b = double(kN * kK) + double(m3qkv::f8_128x4_bytes(kN, kK / 32));
  b += m * double(kK) + double(m3qkv::f8_128x4_bytes(p.m, kK / 32));
  b += m * (8 + 8 + 8 + 128) + 4 * 256;
  b += (o.q_bf16 ? m * kNq * 128 * 2 : 0) + (o.q_fp8 ? m * kNq * 128 : 0) + m * kNiq * 128;
  b += m * (2 * kNkv + kNik) * 72;
  return b;
}

// f64 reference of the accumulator for `rows` (sampled) against `acc`.
struct GemmCheck {
  double rel = 0.0;
  int64_t rows = 0, non_finite = 0;
};
GemmCheck gemm_error(const HostProblem& p, const std::vector<uint8_t>& xq, const std::vector<uint8_t>& xsf,
                     const float* acc) {
  GemmCheck g;
  std::vector<int64_t> rows;
  const int64_t want = std::min<int64_t>(p.m, 256);
  for (int64_t i = 0; i < want; ++i) rows.push_back(i * p.m / want);
  g.rows = int64_t(rows.size());
  const auto w = m3qkv::golden::mxfp8_decode(p.wq.data(), p.wsf.data(), kN, kK);
  std::vector<double> num(rows.size(), 0.0), den(rows.size(), 0.0);
  std::vector<int64_t> nf(rows.size(), 0);
  auto work = [&](size_t i) {
    const int64_t r = rows[i];
    std::vector<double> a(static_cast<size_t>(kK));
    for (int64_t c = 0; c < kK; ++c) {
      const uint8_t s = xsf[size_t(m3qkv::f8_128x4_offset(r, c / 32, kK / 32))];
      a[size_t(c)] = double(m3qkv::e4m3_to_f32(xq[size_t(r * kK + c)])) * std::ldexp(1.0, int(s) - 127);
    }
    for (int64_t n = 0; n < kN; ++n) {
      double ref = 0.0;
      const double* wr = w.data() + n * kK;
      for (int64_t c = 0; c < kK; ++c) ref += a[size_t(c)] * wr[c];
      const float v = acc[r * kN + n];
      if (!std::isfinite(v)) {
        ++nf[i];
        continue;
      }
      num[i] += (double(v) - ref) * (double(v) - ref);
      den[i] += ref * ref;
    }
  };
  const unsigned nt = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> th;
  for (unsigned t = 0; t < nt; ++t)
    th.emplace_back([&, t] {
      for (size_t i = t; i < rows.size(); i += nt) work(i);
    });
  for (auto& t : th) t.join();
  double sn = 0, sd = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    sn += num[i];
    sd += den[i];
    g.non_finite += nf[i];
  }
  g.rel = sd > 0 ? std::sqrt(sn / sd) : 0.0;
  return g;
}

// First differing byte of two buffers, described; "" when equal.
std::string compare(const char* name, const std::vector<uint8_t>& want, const std::vector<uint8_t>& got) {
  if (want.size() != got.size()) return std::string(name) + ": size differs";
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (want[i] != got[i] && bad++ == 0) first = i;
  if (!bad) return "";
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s: %zu of %zu bytes differ, first at byte %zu (got 0x%02x, expected 0x%02x)", name,
                bad, want.size(), first, got[first], want[first]);
  return buf;
}

bool usage(const char* argv0, const char* why) {
  if (why) std::fprintf(stderr, "m3qkv_demo: %s\n", why);
  std::fprintf(stderr,
               "usage: %s [--m M] [--reps R] [--seed S] [--q bf16|fp8|both] [--cpu] [--selftest]\n"
               "  --m M      tokens (default 256 on the GPU, 16 for the CPU-only run)\n"
               "  --reps R   timed calls (default 20)\n"
               "  --seed S   data seed (default: random, printed)\n"
               "  --q MODE   which q outputs to write (default both)\n"
               "  --cpu      run the golden model alone on the CPU even when a GPU is present\n"
               "  --selftest run only m3qkv_selftest on the current device and print its report\n"
               "             (exit 0: every kernel passed, 1: one failed, 3: no GPU / error)\n",
               argv0);
  return false;
}

bool parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&](const char* what) -> const char* {
      if (i + 1 >= argc) {
        usage(argv[0], (std::string(what) + " needs a value").c_str());
        return nullptr;
      }
      return argv[++i];
    };
    if (a == "--m") {
      const char* v = next("--m");
      if (!v) return false;
      char* end = nullptr;
      o->m = std::strtoll(v, &end, 10);
      if (*end || o->m < 1 || o->m > (int64_t(1) << 20)) return usage(argv[0], "--m must be an integer in [1, 2^20]");
    } else if (a == "--reps") {
      const char* v = next("--reps");
      if (!v) return false;
      o->reps = std::atoi(v);
      if (o->reps < 1 || o->reps > 100000) return usage(argv[0], "--reps must be in [1, 100000]");
    } else if (a == "--seed") {
      const char* v = next("--seed");
      if (!v) return false;
      o->seed = std::strtoull(v, nullptr, 0);
    } else if (a == "--q") {
      const char* v = next("--q");
      if (!v) return false;
      const std::string q = v;
      if (q == "bf16") { o->q_bf16 = true; o->q_fp8 = false; }
      else if (q == "fp8") { o->q_bf16 = false; o->q_fp8 = true; }
      else if (q == "both") { o->q_bf16 = o->q_fp8 = true; }
      else return usage(argv[0], "--q must be bf16, fp8 or both");
    } else if (a == "--cpu") {
      o->cpu = true;
    } else if (a == "--selftest") {
      o->selftest_only = true;
    } else if (a == "--help" || a == "-h") {
      usage(argv[0], nullptr);
      std::exit(0);
    } else {
      return usage(argv[0], ("unknown argument " + a).c_str());
    }
  }
  return true;
}

// ------------------------------------------------------------- CPU only
int run_cpu(const Options& o, const char* why, const std::string& library_says = "") {
  const int64_t m = o.m >= 0 ? o.m : 16;
  std::printf("m3qkv demo — MiniMax-M3 TP4 (K %" PRId64 ", N %" PRId64 ", nq %d, nkv %d, niq %d, nik %d, block %d), M = %" PRId64 "\n",
              kK, kN, kNq, kNkv, kNiq, kNik, kBlock, m);
  if (!library_says.empty()) std::printf("m3qkv: %s\n", library_says.c_str());
  std::printf("NOTE: %s: running the golden model ALONE on the CPU. Nothing ran on a GPU; no GPU result is checked.\n",
              why);
  std::printf("self-test: not run (m3qkv_selftest needs a GPU)\n");
  std::printf("seed %" PRIu64 "\n", o.seed);
  const HostProblem p = build_problem(m, o.seed);
  std::vector<uint8_t> xq(size_t(m * kK)), xsf(size_t(m3qkv::f8_128x4_bytes(m, kK / 32)));
  const auto t0 = std::chrono::steady_clock::now();
  m3qkv::golden::mxfp8_quantize(p.x.data(), m, kK, xq.data(), xsf.data());
  const auto acc = m3qkv::golden::mxfp8_acc(xq.data(), xsf.data(), p.wq.data(), p.wsf.data(), m, kN, kK);
  Outputs a = make_outputs(p, o, 0x00), b = make_outputs(p, o, 0xFF);
  m3qkv_fused_args fa = make_args(p, o, host_ptrs(p, xq, xsf, a));
  m3qkv::golden::epilogue(fa, acc.data(), &a.flags);
  const auto t1 = std::chrono::steady_clock::now();
  m3qkv_fused_args fb = make_args(p, o, host_ptrs(p, xq, xsf, b));
  m3qkv::golden::epilogue(fb, acc.data(), &b.flags);
  bool ok = true;
  // Sanity of the golden run: every q / index_q byte written (two poisons agree),
  std::string e;
  if (!(e = compare("q_out", a.q, b.q)).empty() || !(e = compare("q_fp8_out", a.q8, b.q8)).empty() ||
      !(e = compare("index_q_out", a.iq, b.iq)).empty()) {
    std::printf("FAIL golden outputs depend on the poison: %s\n", e.c_str());
    ok = false;
  }
  // the accumulator is the f64 sum rounded once,
  const GemmCheck g = gemm_error(p, xq, xsf, acc.data());
  std::printf("golden accumulator vs f64 reference (%" PRId64 " rows): rel error %.3e\n", g.rows, g.rel);
  if (g.rel > 1e-7 || g.non_finite) ok = false;
  // and the V cache decodes back to the projection within NVFP4 precision.
  double num = 0, den = 0;
  for (int64_t t = 0; t < m; ++t) {
    if (p.slots[size_t(t)] < 0) continue;
    float dec[128];
    m3qkv::golden::decode_nvfp4_token(a.kv.data(), p.kv_page_stride, kBlock, 1, p.slots[size_t(t)], true,
                                      m3qkv::rcp_rn(p.v_scale), dec);
    const float* v = acc.data() + t * kN + (kNq + kNkv) * 128;
    for (int c = 0; c < 128; ++c) {
      num += (double(dec[c]) - v[c]) * (double(dec[c]) - v[c]);
      den += double(v[c]) * v[c];
    }
  }
  const double v_rel = den > 0 ? std::sqrt(num / den) : 0.0;
  std::printf("V cache NVFP4 round trip: rel error %.3f (4-bit codes: ~0.1 expected)\n", v_rel);
  if (!(v_rel < 0.25)) ok = false;
  std::printf("golden model time on the CPU: %.1f ms (quantize + f64 GEMM + epilogue)\n",
              std::chrono::duration<double, std::milli>(t1 - t0).count());
  std::printf("verdict: %s (CPU golden model only)\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

// ------------------------------------------------------------- self-test
const char* result_word(int32_t r) {
  switch (r) {
    case M3QKV_SELFTEST_PASS: return "PASS";
    case M3QKV_SELFTEST_FAIL: return "FAIL";
    case M3QKV_SELFTEST_ERROR: return "ERROR";
    default: return "not available";
  }
}

// Prints the report: one line per kernel, then the verdict.
void print_selftest(const m3qkv_selftest_report& r) {
  std::printf("self-test (m3qkv_selftest) on device %d, CC %d.%d: %d built-in exact-data problems, %.1f ms\n", r.device,
              r.cc_major, r.cc_minor, r.problems, r.total_us / 1000.0);
  if (r.num_entries > 0) std::printf("  %-18s %-13s %8s %10s  %s\n", "kernel", "result", "problems", "time", "details");
  for (int i = 0; i < r.num_entries; ++i) {
    const m3qkv_selftest_entry& e = r.entries[i];
    std::string details = e.message;
    if (e.result == M3QKV_SELFTEST_PASS && e.portable_agrees == 1) {
      details = "every byte = golden = portable" + (details.empty() ? std::string() : "; " + details);
    } else if (e.result == M3QKV_SELFTEST_PASS) {
      details = "every byte = golden" + (details.empty() ? std::string() : "; " + details);
    }
    if (e.result == M3QKV_SELFTEST_NOT_AVAILABLE) {
      std::printf("  %-18s %-13s %8s %10s  %s\n", e.name, result_word(e.result), "-", "-", details.c_str());
    } else {
      std::printf("  %-18s %-13s %8d %7.2f ms  %s\n", e.name, result_word(e.result), e.problems, e.time_us / 1000.0,
                  details.c_str());
    }
  }
  std::printf("  => %s: %s\n", m3qkv_status_string(static_cast<m3qkv_status>(r.status)), r.message);
}

// Runs and prints the self-test of `dev`; its status.
m3qkv_status run_selftest(int dev) {
  m3qkv_selftest_report r;
  std::memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  const m3qkv_status st = m3qkv_selftest(dev, &r);
  print_selftest(r);
  return st;
}

// ------------------------------------------------------------------ GPU
#define DEMO_CUDA(call)                                                                              \
  do {                                                                                               \
    const cudaError_t e_ = (call);                                                                   \
    if (e_ != cudaSuccess) {                                                                         \
      std::fprintf(stderr, "CUDA error: %s: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
      return 3;                                                                                      \
    }                                                                                                \
  } while (0)
#define DEMO_M3(call)                                                                                \
  do {                                                                                               \
    const m3qkv_status s_ = (call);                                                                  \
    if (s_ != M3QKV_SUCCESS) {                                                                       \
      std::fprintf(stderr, "m3qkv error: %s: %s: %s\n", #call, m3qkv_status_string(s_), m3qkv_last_error()); \
      return 3;                                                                                      \
    }                                                                                                \
  } while (0)

// Device buffers freed at exit of run_gpu.
struct Dev {
  std::vector<void*> ptrs;
  ~Dev() {
    for (void* p : ptrs) cudaFree(p);
  }
  cudaError_t alloc(void** p, size_t n) {
    *p = nullptr;
    if (n == 0) return cudaSuccess;
    const cudaError_t e = cudaMalloc(p, n);
    if (e == cudaSuccess) ptrs.push_back(*p);
    return e;
  }
};

template <class T>
cudaError_t upload(Dev& d, void** p, const std::vector<T>& h) {
  cudaError_t e = d.alloc(p, h.size() * sizeof(T));
  if (e != cudaSuccess || h.empty()) return e;
  return cudaMemcpy(*p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
}

int run_gpu(const Options& o) {
  const int64_t m = o.m >= 0 ? o.m : 256;
  int dev = 0;
  DEMO_CUDA(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  DEMO_CUDA(cudaGetDeviceProperties(&prop, dev));
  m3qkv_backend_kind backend = M3QKV_BACKEND_NONE;
  DEMO_M3(m3qkv_backend(dev, &backend));
  std::printf("m3qkv demo — MiniMax-M3 TP4 (K %" PRId64 ", N %" PRId64 ", nq %d, nkv %d, niq %d, nik %d, block %d), M = %" PRId64 "\n",
              kK, kN, kNq, kNkv, kNiq, kNik, kBlock, m);
  std::printf("device %d: %s (CC %d.%d, %d SMs), backend: %s, seed %" PRIu64 "\n", dev, prop.name, prop.major,
              prop.minor, prop.multiProcessorCount, m3qkv_backend_name(backend), o.seed);
  // The self-test first: on a GPU nobody has run m3qkv on before, its report
  // says which kernels are right before the main job trusts one of them.
  const m3qkv_status selftest = run_selftest(dev);
  if (selftest != M3QKV_SUCCESS && selftest != M3QKV_ERROR_SELFTEST_FAILED) return 3;
  bool ok = selftest == M3QKV_SUCCESS;
  {
    // With M3QKV_SELFTEST_ON_WARMUP=1 the warmup may switch to a backend that passed.
    const m3qkv_status w = m3qkv_warmup(dev);
    if (w == M3QKV_WARNING_BACKEND_FALLBACK) {
      std::printf("m3qkv_warmup: %s\n", m3qkv_last_error());
      DEMO_M3(m3qkv_backend(dev, &backend));
      std::printf("backend now: %s\n", m3qkv_backend_name(backend));
    } else {
      DEMO_M3(w);
    }
  }
  const HostProblem p = build_problem(m, o.seed);
  Dev d;
  void *dx, *dxq, *dxsf, *dwq, *dwsf, *dpos, *dcs, *dqw, *dkw, *diqw, *dikw, *dsl, *disl, *dflags;
  DEMO_CUDA(upload(d, &dx, p.x));
  DEMO_CUDA(d.alloc(&dxq, size_t(m * kK)));
  const size_t xsf_bytes = size_t(m3qkv::f8_128x4_bytes(m, kK / 32));
  DEMO_CUDA(d.alloc(&dxsf, xsf_bytes));
  DEMO_CUDA(upload(d, &dwq, p.wq));
  DEMO_CUDA(upload(d, &dwsf, p.wsf));
  DEMO_CUDA(upload(d, &dpos, p.positions));
  DEMO_CUDA(upload(d, &dcs, p.cos_sin));
  DEMO_CUDA(upload(d, &dqw, p.qw));
  DEMO_CUDA(upload(d, &dkw, p.kw));
  DEMO_CUDA(upload(d, &diqw, p.iqw));
  DEMO_CUDA(upload(d, &dikw, p.ikw));
  DEMO_CUDA(upload(d, &dsl, p.slots));
  DEMO_CUDA(upload(d, &disl, p.islots));
  DEMO_CUDA(d.alloc(&dflags, 4));
  cudaStream_t s;
  DEMO_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  struct StreamGuard {
    cudaStream_t s;
    ~StreamGuard() { cudaStreamDestroy(s); }
  } sg{s};

  // 1. Quantize the activations on the GPU; check against the golden quantizer.
  m3qkv_quantize_args qa;
  std::memset(&qa, 0, sizeof qa);
  qa.struct_size = sizeof qa;
  qa.m = m;
  qa.k = kK;
  qa.x = dx;
  qa.xq = dxq;
  qa.xsf = dxsf;
  DEMO_M3(m3qkv_mxfp8_quantize(&qa, s));
  std::vector<uint8_t> xq(size_t(m * kK)), xsf(xsf_bytes), gxq(xq.size()), gxsf(xsf_bytes);
  DEMO_CUDA(cudaStreamSynchronize(s));
  if (m > 0) {
    DEMO_CUDA(cudaMemcpy(xq.data(), dxq, xq.size(), cudaMemcpyDeviceToHost));
    DEMO_CUDA(cudaMemcpy(xsf.data(), dxsf, xsf_bytes, cudaMemcpyDeviceToHost));
  }
  m3qkv::golden::mxfp8_quantize(p.x.data(), m, kK, gxq.data(), gxsf.data());
  {
    std::string e1 = compare("xq", gxq, xq), e2 = compare("xsf", gxsf, xsf);
    std::printf("check 1  m3qkv_mxfp8_quantize vs golden quantizer: %s\n",
                e1.empty() && e2.empty() ? "bit-exact" : ("MISMATCH " + e1 + " " + e2).c_str());
    ok &= e1.empty() && e2.empty();
  }

  // Device outputs, poisoned with 0xA5.
  Outputs host0 = make_outputs(p, o, 0xA5);
  void *dq = nullptr, *dq8 = nullptr, *diq = nullptr, *dkv = nullptr, *dix = nullptr;
  DEMO_CUDA(upload(d, &dq, host0.q));
  DEMO_CUDA(upload(d, &dq8, host0.q8));
  DEMO_CUDA(upload(d, &diq, host0.iq));
  DEMO_CUDA(upload(d, &dkv, host0.kv));
  DEMO_CUDA(upload(d, &dix, host0.ix));
  const Ptrs dp{dxq, dxsf, dwq, dwsf, dpos, dcs, dqw, dkw, diqw, dikw, dsl, disl,
                dq, dq8, diq, dkv, dix, static_cast<uint32_t*>(dflags)};
  m3qkv_fused_args a = make_args(p, o, dp);
  auto reset_outputs = [&]() -> cudaError_t {
    cudaError_t e = cudaSuccess;
    auto put = [&](void* dst, const std::vector<uint8_t>& h) {
      if (e == cudaSuccess && !h.empty()) e = cudaMemcpy(dst, h.data(), h.size(), cudaMemcpyHostToDevice);
    };
    put(dq, host0.q);
    put(dq8, host0.q8);
    put(diq, host0.iq);
    put(dkv, host0.kv);
    put(dix, host0.ix);
    if (e == cudaSuccess) e = cudaMemset(dflags, 0, 4);
    return e;
  };
  auto fetch = [&](Outputs* out) -> cudaError_t {
    *out = make_outputs(p, o, 0);
    cudaError_t e = cudaSuccess;
    auto get = [&](std::vector<uint8_t>& h, const void* src) {
      if (e == cudaSuccess && !h.empty()) e = cudaMemcpy(h.data(), src, h.size(), cudaMemcpyDeviceToHost);
    };
    get(out->q, dq);
    get(out->q8, dq8);
    get(out->iq, diq);
    get(out->kv, dkv);
    get(out->ix, dix);
    if (e == cudaSuccess) e = cudaMemcpy(&out->flags, dflags, 4, cudaMemcpyDeviceToHost);
    return e;
  };

  // 2. One run with the accumulator tap (test-only entry point, same kernel).
  void* dtap = nullptr;
  DEMO_CUDA(d.alloc(&dtap, size_t(m * kN) * 4));
  DEMO_CUDA(reset_outputs());
  DEMO_M3(m3qkv_testing_fused_qkv(&a, static_cast<float*>(dtap), M3QKV_BACKEND_NONE, s));
  DEMO_CUDA(cudaStreamSynchronize(s));
  Outputs tapped;
  DEMO_CUDA(fetch(&tapped));
  std::vector<float> acc(size_t(m * kN));
  if (m > 0) DEMO_CUDA(cudaMemcpy(acc.data(), dtap, acc.size() * 4, cudaMemcpyDeviceToHost));

  // 3. The public entry point gives the same bytes.
  DEMO_CUDA(reset_outputs());
  DEMO_M3(m3qkv_fused_qkv(&a, s));
  DEMO_CUDA(cudaStreamSynchronize(s));
  Outputs pub;
  DEMO_CUDA(fetch(&pub));
  {
    std::string e;
    const char* names[] = {"q_out", "q_fp8_out", "index_q_out", "kv_cache", "index_cache"};
    const std::vector<uint8_t>* A[] = {&tapped.q, &tapped.q8, &tapped.iq, &tapped.kv, &tapped.ix};
    const std::vector<uint8_t>* B[] = {&pub.q, &pub.q8, &pub.iq, &pub.kv, &pub.ix};
    for (int i = 0; i < 5 && e.empty(); ++i) e = compare(names[i], *A[i], *B[i]);
    if (e.empty() && tapped.flags != pub.flags) e = "error_flags differ";
    std::printf("check 2  m3qkv_fused_qkv == tapped run: %s\n", e.empty() ? "identical bytes" : ("MISMATCH " + e).c_str());
    ok &= e.empty();
  }

  // 4. Golden epilogue on the tap accumulator: every byte (incl. untouched ones).
  {
    Outputs want = make_outputs(p, o, 0xA5);
    m3qkv_fused_args ha = make_args(p, o, host_ptrs(p, xq, xsf, want));
    m3qkv::golden::epilogue(ha, acc.data(), &want.flags);
    std::string e;
    const char* names[] = {"q_out", "q_fp8_out", "index_q_out", "kv_cache", "index_cache"};
    const std::vector<uint8_t>* A[] = {&want.q, &want.q8, &want.iq, &want.kv, &want.ix};
    const std::vector<uint8_t>* B[] = {&pub.q, &pub.q8, &pub.iq, &pub.kv, &pub.ix};
    for (int i = 0; i < 5 && e.empty(); ++i) e = compare(names[i], *A[i], *B[i]);
    if (e.empty() && want.flags != pub.flags) e = "error_flags differ";
    std::printf("check 3  outputs vs golden epilogue on the kernel's accumulator: %s\n",
                e.empty() ? "bit-exact (q, index_q, K/V/index_k cache pages)" : ("MISMATCH " + e).c_str());
    ok &= e.empty();
  }

  // 5. GEMM accuracy against f64.
  {
    const GemmCheck g = gemm_error(p, xq, xsf, acc.data());
    const bool gok = g.non_finite == 0 && g.rel <= 1e-5;
    std::printf("check 4  accumulator vs f64 reference (%" PRId64 " rows): rel error %.3e (%s, limit 1e-5)\n", g.rows,
                g.rel, gok ? "ok" : "TOO LARGE");
    ok &= gok;
  }

  // 6. Timing: CUDA events around each call, L2 flushed before each.
  int l2 = 0;
  DEMO_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  void* flush = nullptr;
  const size_t flush_bytes = size_t(std::max(l2, 1 << 20)) * 2;
  DEMO_CUDA(d.alloc(&flush, flush_bytes));
  cudaEvent_t e0, e1;
  DEMO_CUDA(cudaEventCreate(&e0));
  DEMO_CUDA(cudaEventCreate(&e1));
  struct EvGuard {
    cudaEvent_t a, b;
    ~EvGuard() { cudaEventDestroy(a); cudaEventDestroy(b); }
  } eg{e0, e1};
  for (int i = 0; i < 3; ++i) DEMO_M3(m3qkv_fused_qkv(&a, s));
  double total_ms = 0.0, best_ms = 1e30;
  for (int r = 0; r < o.reps; ++r) {
    DEMO_CUDA(cudaMemsetAsync(flush, r & 0xff, flush_bytes, s));
    DEMO_CUDA(cudaEventRecord(e0, s));
    DEMO_M3(m3qkv_fused_qkv(&a, s));
    DEMO_CUDA(cudaEventRecord(e1, s));
    DEMO_CUDA(cudaEventSynchronize(e1));
    float ms = 0.0f;
    DEMO_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    total_ms += ms;
    best_ms = std::min(best_ms, double(ms));
  }
  const double t = total_ms / o.reps * 1e-3;
  const double bytes = call_bytes(p, o), flops = 2.0 * double(m) * double(kN) * double(kK);
  std::printf("time per call (L2 flushed, %d reps): mean %.2f us, best %.2f us\n", o.reps, t * 1e6, best_ms * 1e3);
  std::printf("achieved: %.1f GB/s (%.2f MB moved at least once), %.1f TFLOP/s (2·M·N·K = %.3g FLOP)\n",
              bytes / t * 1e-9, bytes * 1e-6, flops / t * 1e-12, flops);
  std::printf("verdict: %s\n", ok ? "PASS — every output equals the golden model"
                                  : selftest != M3QKV_SUCCESS ? "FAIL — a kernel failed the self-test (above)" : "FAIL");
  return ok ? 0 : 1;
}

// Why this process has no GPU, in the library's words: m3qkv_backend tells no
// driver, an old driver and no GPU apart (CUDA itself reports a missing
// driver as "CUDA driver version is insufficient").
std::string no_gpu_reason() {
  m3qkv_backend_kind kind = M3QKV_BACKEND_NONE;
  const m3qkv_status st = m3qkv_backend(0, &kind);
  if (st != M3QKV_SUCCESS && m3qkv_last_error()[0] != '\0') return m3qkv_last_error();
  return "no CUDA device (cudaGetDeviceCount reports 0)";
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, &o)) return 2;
  if (o.seed == 0) o.seed = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  const bool no_gpu = e != cudaSuccess || n == 0;
  if (no_gpu) (void)cudaGetLastError();
  if (o.selftest_only) {
    int dev = 0;
    if (no_gpu || cudaGetDevice(&dev) != cudaSuccess) {
      (void)cudaGetLastError();
      std::printf("m3qkv self-test: %s\n", no_gpu_reason().c_str());
      std::printf("m3qkv self-test: no CUDA driver / no GPU: nothing to test\n");
      return 3;
    }
    const m3qkv_status st = run_selftest(dev);
    return st == M3QKV_SUCCESS ? 0 : st == M3QKV_ERROR_SELFTEST_FAILED ? 1 : 3;
  }
  if (o.cpu) return run_cpu(o, "--cpu given");
  if (no_gpu) return run_cpu(o, "no CUDA driver / no GPU", no_gpu_reason());
  return run_gpu(o);
}
