// The self-test engine (see selftest.h).
#include "api/selftest.h"

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>

#include "golden/golden.h"
#include "host/cuda.h"
#include "host/status.h"
#include "api/validate.h"
#include "host/workspace.h"
#include "sm90/decode_plan.h"

namespace m3qkv::selftest {
namespace {

// Bytes of poison before and after every output buffer: a kernel that writes
// outside a buffer changes one of them.
constexpr int64_t kGuard = 256;
constexpr int64_t kAlign = 256;  // every buffer starts 256-B aligned (cudaMalloc's alignment)
int64_t align_up(int64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

const PathInfo kPathInfo[kPaths] = {
    {M3QKV_BACKEND_PORTABLE, 0, "portable"},
    {M3QKV_BACKEND_SM90, 0, "sm90 tile"},
    {M3QKV_BACKEND_SM90, 1, "sm90 decode"},
    {M3QKV_BACKEND_SM100, 1, "sm100 cta_group 1"},
    {M3QKV_BACKEND_SM100, 2, "sm100 cta_group 2"},
};

golden::ProblemConfig exact(int64_t m, int64_t k, int nq, int nkv, int niq, int nik, int block_size, uint64_t seed) {
  golden::ProblemConfig c;
  c.m = m;
  c.k = k;
  c.nq = nq;
  c.nkv = nkv;
  c.niq = niq;
  c.nik = nik;
  c.block_size = block_size;
  c.exact_data = true;
  c.seed = seed;
  c.max_position = 1024;  // a small RoPE table keeps the uploads small
  return c;
}

// The built-in problems. Exact data (golden/problem.h): the accumulator is
// exact on any hardware, so every output byte must equal the golden model's.
// Chosen to reach every branch a kernel has for M3 serving at small cost (the
// golden accumulator of all of them is ~0.5 G multiply-adds on the CPU):
// TP4, TP8, TP2 (39 heads: odd, the phantom head of cta_group 2) and dense
// (no indexer); M = 1 (one tile), 33, 64, 129 (two decode token blocks),
// 257 and 300 (several tiles; the SM90 tile kernel's range); K from 128 to
// 512 (1 to 4 K stages: the decode kernel's split-K); every KV and index
// cache format (NVFP4, FP8, BF16; separate, interleaved, head-major, padded
// rows); block sizes 16 to 128; q as bf16, e4m3 or both; PDL on and off;
// skipped and out-of-range slots and positions (error_flags).
std::vector<NamedProblem> make_problems() {
  std::vector<NamedProblem> v;
  {
    golden::ProblemConfig c = exact(1, 512, 16, 1, 1, 1, 16, 0x5e1f7e5700000001ull);
    c.index_dtype = M3QKV_CACHE_FP8;
    v.push_back({"TP4 M=1 K=512, NVFP4 KV, FP8 index", c});
  }
  {
    golden::ProblemConfig c = exact(300, 256, 8, 1, 1, 1, 64, 0x5e1f7e5700000002ull);
    c.kv_dtype = M3QKV_CACHE_FP8;
    c.kv_row_pad = 16;
    c.index_dtype = M3QKV_CACHE_BF16;
    c.q_bf16 = false;
    c.out_of_range_slots = true;
    c.out_of_range_positions = true;
    v.push_back({"TP8 M=300 K=256, FP8 KV (two tensors, padded rows), BF16 index, out-of-range slots/positions", c});
  }
  {
    golden::ProblemConfig c = exact(129, 256, 32, 2, 2, 1, 16, 0x5e1f7e5700000003ull);
    c.kv_dtype = M3QKV_CACHE_BF16;
    c.kv_interleaved = true;
    c.kv_head_major = true;
    c.q_fp8 = false;
    v.push_back({"TP2 M=129 K=256 (39 heads), BF16 KV (one allocation, head-major), NVFP4 index", c});
  }
  {
    golden::ProblemConfig c = exact(257, 256, 16, 1, 1, 1, 128, 0x5e1f7e5700000004ull);
    v.push_back({"TP4 M=257 K=256, NVFP4 caches, block_size 128", c});
  }
  {
    golden::ProblemConfig c = exact(64, 384, 8, 1, 1, 1, 16, 0x5e1f7e5700000005ull);
    c.kv_dtype = M3QKV_CACHE_FP8;
    c.kv_interleaved = true;
    c.index_dtype = M3QKV_CACHE_BF16;
    c.q_fp8_scale = 0.25f;
    c.k_scale = 2.0f;
    c.v_scale = 0.125f;
    v.push_back({"TP8 M=64 K=384, FP8 KV (one allocation), BF16 index", c});
  }
  {
    golden::ProblemConfig c = exact(33, 128, 16, 2, 0, 0, 32, 0x5e1f7e5700000006ull);
    v.push_back({"dense M=33 K=128 (no indexer), NVFP4 KV", c});
  }
  return v;
}

// One output buffer of one problem inside the output image.
struct Output {
  const char* name;
  int64_t payload;  // offset of its first byte in the output image
  int64_t bytes;
};

// One problem, laid out.
struct Laid {
  golden::Problem p;
  std::vector<Output> outputs;   // non-empty outputs, error_flags last
  m3qkv_fused_args args{};       // device pointers
};

void copy_text(char* dst, size_t cap, const std::string& s) {
  const size_t n = std::min(cap - 1, s.size());
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return buf;
}

int64_t us_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
}

// Sets the thread's message back to `msg` (a cleanup may have replaced it).
void restore_message(const std::string& msg) {
  if (msg.empty()) clear_error();
  else fail(M3QKV_ERROR_INTERNAL, "%s", msg.c_str());  // only the text is kept
}

// What the run owns on the device; released on every way out.
struct DeviceSide {
  const host::Cuda& c;
  const DeviceInfo& dev;
  cudaStream_t stream = nullptr;
  void* base = nullptr;
  // Frees everything; the first failure, if any, as a status (message set;
  // the message is untouched when everything succeeds).
  m3qkv_status release(const char* fn) {
    cudaError_t err = cudaSuccess;
    const char* what = nullptr;
    const auto note = [&](cudaError_t e, const char* call) {
      if (e != cudaSuccess && err == cudaSuccess) err = e, what = call;
    };
    if (stream != nullptr) note(c.stream_synchronize(stream), "cudaStreamSynchronize (self-test stream)");
    if (base != nullptr) note(c.free(base), "cudaFree (self-test buffers)");
    base = nullptr;
    m3qkv_status st = M3QKV_SUCCESS;
    if (stream != nullptr) {
      // The decode kernel's split-K workspace of this stream (host/workspace.h).
      st = host::release_stream_workspace("m3qkv_selftest", dev, stream);
      note(c.stream_destroy(stream), "cudaStreamDestroy (self-test stream)");
      stream = nullptr;
    }
    // One cuda_fail after every call: it also clears the runtime's last error.
    if (err != cudaSuccess) return cuda_fail(fn, what, err);
    return st;
  }
  // The early ways out (their message is what the caller must see).
  ~DeviceSide() {
    if (stream == nullptr && base == nullptr) return;
    const std::string keep = last_error_message();
    (void)release("m3qkv_selftest");
    restore_message(keep);
  }
};

}  // namespace

const PathInfo& path_info(int path) { return kPathInfo[path]; }

bool path_takes(int path, int64_t m) { return path != kSm90Decode || (m >= 1 && m <= sm90::kDecodeMaxM); }

const std::vector<NamedProblem>& problems() {
  static const std::vector<NamedProblem> v = make_problems();
  return v;
}

void fill_failed(m3qkv_status st, int device, m3qkv_selftest_report* out) {
  std::memset(out, 0, sizeof(*out));
  out->struct_size = sizeof(*out);
  out->status = st;
  out->device = device;
  out->problems = static_cast<int32_t>(problems().size());
  copy_text(out->message, sizeof(out->message), last_error_message());
}

m3qkv_status run(const char* fn, const DeviceInfo& dev, const Request& req, Launch launch,
                 m3qkv_selftest_report* out) {
  const auto t0 = std::chrono::steady_clock::now();
  m3qkv_selftest_report& r = *out;
  std::memset(&r, 0, sizeof(r));
  r.struct_size = sizeof(r);
  r.device = dev.device;
  r.cc_major = dev.cc_major;
  r.cc_minor = dev.cc_minor;
  const std::vector<NamedProblem>& named = problems();
  r.problems = static_cast<int32_t>(named.size());
  r.num_entries = kPaths;
  for (int p = 0; p < kPaths; ++p) {
    m3qkv_selftest_entry& e = r.entries[p];
    e.backend = kPathInfo[p].backend;
    e.variant = kPathInfo[p].variant;
    e.result = M3QKV_SELFTEST_NOT_AVAILABLE;
    e.problem = -1;
    e.portable_agrees = -1;
    e.offset = -1;
    e.expected = e.got = -1;
    copy_text(e.name, sizeof(e.name), kPathInfo[p].name);
    copy_text(e.message, sizeof(e.message), req.run[p] || req.note[p][0] ? req.note[p] : "not requested");
  }
  const auto finish = [&](m3qkv_status st) {
    r.status = st;
    r.total_us = us_since(t0);
    copy_text(r.message, sizeof(r.message), last_error_message());
    return st;
  };

  // 1. The problems, their layout, the host images and the golden bytes.
  std::vector<Laid> laid(named.size());
  int64_t in_bytes = 0, out_bytes = 0;
  std::vector<std::vector<int64_t>> in_offsets(named.size());
  for (size_t i = 0; i < named.size(); ++i) {
    Laid& L = laid[i];
    L.p = golden::build_problem(named[i].cfg);
    for (const golden::HostBuffer& b : L.p.inputs()) {
      in_offsets[i].push_back(b.bytes ? align_up(in_bytes) : -1);
      if (b.bytes) in_bytes = align_up(in_bytes) + static_cast<int64_t>(b.bytes);
    }
    const golden::Problem& P = L.p;
    const struct {
      const char* name;
      size_t bytes;
    } outs[] = {{"q_out", P.q_out_bytes()},       {"q_fp8_out", P.q_fp8_out_bytes()},
                {"index_q_out", P.index_q_out_bytes()}, {"kv_cache", P.kv_cache_bytes()},
                {"v_cache", P.v_cache_bytes()},   {"index_cache", P.index_cache_bytes()},
                {"error_flags", sizeof(uint32_t)}};
    for (const auto& o : outs) {
      if (o.bytes == 0) continue;
      const int64_t payload = align_up(out_bytes) + kGuard;
      L.outputs.push_back(Output{o.name, payload, static_cast<int64_t>(o.bytes)});
      out_bytes = payload + static_cast<int64_t>(o.bytes) + kGuard;
    }
  }
  in_bytes = align_up(in_bytes);
  out_bytes = align_up(out_bytes);

  std::vector<uint8_t> in_image(static_cast<size_t>(in_bytes), 0);
  std::vector<uint8_t> poisoned(static_cast<size_t>(out_bytes));
  for (size_t i = 0; i < poisoned.size(); ++i) poisoned[i] = golden::poison_byte(i);
  for (const Laid& L : laid) {
    // error_flags start at 0: the kernels OR bits in.
    const Output& f = L.outputs.back();
    std::memset(poisoned.data() + f.payload, 0, static_cast<size_t>(f.bytes));
  }
  std::vector<uint8_t> expected = poisoned;
  const auto out_ptrs = [](const Laid& L, uint8_t* image) {
    golden::OutputPtrs o;
    for (const Output& x : L.outputs) {
      void* p = image + x.payload;
      const std::string n = x.name;
      if (n == "q_out") o.q_out = p;
      else if (n == "q_fp8_out") o.q_fp8_out = p;
      else if (n == "index_q_out") o.index_q_out = p;
      else if (n == "kv_cache") o.kv_cache = p;
      else if (n == "v_cache") o.v_cache = p;
      else if (n == "index_cache") o.index_cache = p;
      else o.error_flags = static_cast<uint32_t*>(p);
    }
    // Interleaved FP8 / BF16 KV: V inside kv_cache's allocation.
    if (L.p.v_in_kv >= 0 && o.kv_cache != nullptr) o.v_cache = static_cast<uint8_t*>(o.kv_cache) + L.p.v_in_kv;
    return o;
  };
  for (size_t i = 0; i < laid.size(); ++i) {
    Laid& L = laid[i];
    const auto ins = L.p.inputs();
    for (size_t j = 0; j < ins.size(); ++j)
      if (ins[j].bytes) std::memcpy(in_image.data() + in_offsets[i][j], ins[j].data, ins[j].bytes);
    const golden::OutputPtrs host_out = out_ptrs(L, expected.data());
    const std::vector<float> acc =
        golden::mxfp8_acc(L.p.xq.data(), L.p.xsf.data(), L.p.wq.data(), L.p.wsf.data(), L.p.m, L.p.n(), L.p.k);
    uint32_t flags = 0;
    golden::epilogue(L.p.host_args(host_out), acc.data(), &flags);
    std::memcpy(host_out.error_flags, &flags, sizeof(flags));
  }

  // 2. Device buffers and the stream.
  const host::Cuda& c = host::cuda_unresolved();  // enter_primary resolved it
  DeviceSide side{c, dev};
  {
    const cudaError_t e = c.stream_create_with_flags(&side.stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      side.stream = nullptr;
      return finish(cuda_fail(fn, "cudaStreamCreateWithFlags (self-test stream)", e));
    }
  }
  {
    const cudaError_t e = c.malloc(&side.base, static_cast<size_t>(in_bytes + out_bytes));
    if (e != cudaSuccess) {
      side.base = nullptr;
      return finish(cuda_fail(fn, "cudaMalloc (self-test buffers)", e));
    }
  }
  uint8_t* const d_in = static_cast<uint8_t*>(side.base);
  uint8_t* const d_out = d_in + in_bytes;
  for (size_t i = 0; i < laid.size(); ++i) {
    Laid& L = laid[i];
    const auto ins = L.p.inputs();
    const auto map = [&](const golden::HostBuffer& b) -> const void* {
      for (size_t j = 0; j < ins.size(); ++j)
        if (std::strcmp(ins[j].name, b.name) == 0) return in_offsets[i][j] >= 0 ? d_in + in_offsets[i][j] : nullptr;
      return nullptr;
    };
    L.args = L.p.args_with(map, out_ptrs(L, d_out));
    L.args.use_pdl = static_cast<int32_t>(i % 2 == 0);  // PDL on for half of them, off for the others
    m3qkv_fused_args checked;
    bool noop = false;
    if (validate_fused(&L.args, &checked, &noop) != M3QKV_SUCCESS || noop) {
      return finish(fail(M3QKV_ERROR_INTERNAL, "%s: built-in problem %zu (%s) does not validate: %s", fn, i,
                         named[i].name, last_error_message()));
    }
  }
  {
    const cudaError_t e = c.memcpy_async(d_in, in_image.data(), static_cast<size_t>(in_bytes),
                                         cudaMemcpyHostToDevice, side.stream);
    if (e != cudaSuccess) return finish(cuda_fail(fn, "cudaMemcpyAsync (self-test inputs)", e));
  }

  // 3. Every requested kernel on every problem it takes.
  std::vector<uint8_t> got(static_cast<size_t>(out_bytes)), portable;
  bool portable_ran = false;
  int failed = 0, first_failed = -1;
  m3qkv_status stop = M3QKV_SUCCESS;  // an error of the self-test's own CUDA calls
  for (int path = 0; path < kPaths && stop == M3QKV_SUCCESS; ++path) {
    if (!req.run[path]) continue;
    m3qkv_selftest_entry& e = r.entries[path];
    const auto tp = std::chrono::steady_clock::now();
    e.result = M3QKV_SELFTEST_PASS;
    cudaError_t ce = c.memcpy_async(d_out, poisoned.data(), static_cast<size_t>(out_bytes), cudaMemcpyHostToDevice,
                                    side.stream);
    if (ce != cudaSuccess) {
      stop = cuda_fail(fn, "cudaMemcpyAsync (self-test poison)", ce);
      e.result = M3QKV_SELFTEST_ERROR;
      copy_text(e.message, sizeof(e.message), last_error_message());
      break;
    }
    for (size_t i = 0; i < laid.size(); ++i) {
      if (!path_takes(path, laid[i].p.m)) continue;
      clear_error();
      const m3qkv_status st = launch(path, laid[i].args, dev, side.stream);
      if (st != M3QKV_SUCCESS) {
        e.result = M3QKV_SELFTEST_ERROR;
        e.problem = static_cast<int32_t>(i);
        copy_text(e.message, sizeof(e.message),
                  format("problem %zu (%s): %s: %s", i, named[i].name, m3qkv_status_string(st), last_error_message()));
        break;
      }
      ++e.problems;
    }
    clear_error();
    // A kernel that faulted shows here (its context is then most likely dead:
    // nothing after it can run).
    ce = c.stream_synchronize(side.stream);
    if (ce == cudaSuccess) {
      ce = c.memcpy_async(got.data(), d_out, static_cast<size_t>(out_bytes), cudaMemcpyDeviceToHost, side.stream);
      if (ce == cudaSuccess) ce = c.stream_synchronize(side.stream);
    }
    if (ce != cudaSuccess) {
      stop = cuda_fail(fn, "cudaStreamSynchronize / cudaMemcpyAsync after the self-test kernels", ce);
      e.result = M3QKV_SELFTEST_ERROR;
      copy_text(e.message, sizeof(e.message), format("%s ran; then %s", kPathInfo[path].name, last_error_message()));
      e.time_us = us_since(tp);
      ++failed;
      if (first_failed < 0) first_failed = path;
      break;
    }
    if (e.result == M3QKV_SELFTEST_PASS) {
      // Every byte of every output the kernel ran, guard zones included.
      bool agrees = true;
      for (size_t i = 0; i < laid.size(); ++i) {
        const Laid& L = laid[i];
        if (!path_takes(path, L.p.m)) continue;
        for (const Output& o : L.outputs) {
          for (int64_t b = o.payload - kGuard; b < o.payload + o.bytes + kGuard; ++b) {
            const size_t u = static_cast<size_t>(b);
            if (portable_ran && path != kPortable && got[u] != portable[u]) agrees = false;
            if (got[u] == expected[u]) continue;
            if (e.wrong_bytes++ == 0) {
              e.result = M3QKV_SELFTEST_FAIL;
              e.problem = static_cast<int32_t>(i);
              e.offset = b - o.payload;
              e.expected = expected[u];
              e.got = got[u];
              copy_text(e.output, sizeof(e.output), o.name);
            }
          }
        }
      }
      if (path != kPortable && portable_ran) e.portable_agrees = agrees ? 1 : 0;
      if (e.result == M3QKV_SELFTEST_FAIL) {
        const Output* o = nullptr;
        for (const Output& x : laid[static_cast<size_t>(e.problem)].outputs)
          if (std::strcmp(x.name, e.output) == 0) o = &x;
        const bool outside = o != nullptr && (e.offset < 0 || e.offset >= o->bytes);
        copy_text(e.message, sizeof(e.message),
                  format("problem %d (%s): %s byte %lld is 0x%02x, golden 0x%02x%s; %lld wrong bytes in all", e.problem,
                         named[static_cast<size_t>(e.problem)].name, e.output, static_cast<long long>(e.offset), e.got,
                         e.expected, outside ? " (a guard byte: written outside the buffer)" : "",
                         static_cast<long long>(e.wrong_bytes)));
      }
    }
    if (path == kPortable) {
      portable = got;
      portable_ran = e.result == M3QKV_SELFTEST_PASS || e.result == M3QKV_SELFTEST_FAIL;
    }
    if (e.result != M3QKV_SELFTEST_PASS) {
      ++failed;
      if (first_failed < 0) first_failed = path;
    }
    e.time_us = us_since(tp);
  }
  if (stop != M3QKV_SUCCESS) {
    for (int path = 0; path < kPaths; ++path) {
      m3qkv_selftest_entry& e = r.entries[path];
      if (req.run[path] && e.result == M3QKV_SELFTEST_NOT_AVAILABLE) {
        e.result = M3QKV_SELFTEST_ERROR;
        copy_text(e.message, sizeof(e.message), "not run: an earlier CUDA error stopped the self-test");
      }
    }
  }

  // 4. Release everything (also after an error: the allocation must not stay).
  const std::string stop_msg = last_error_message();
  const m3qkv_status rel = side.release(fn);
  if (stop != M3QKV_SUCCESS) {
    restore_message(stop_msg);  // the first error is the one to see
    return finish(stop);
  }
  if (rel != M3QKV_SUCCESS) return finish(rel);

  int ran = 0;
  std::string names;
  for (int path = 0; path < kPaths; ++path) {
    if (!req.run[path]) continue;
    ++ran;
    if (!names.empty()) names += ", ";
    names += kPathInfo[path].name;
  }
  if (failed > 0) {
    const m3qkv_selftest_entry& e = r.entries[first_failed];
    fail(M3QKV_ERROR_SELFTEST_FAILED, "%s: device %d (CC %d.%d): %d of %d kernels FAILED; first: %s %s: %s", fn,
         dev.device, dev.cc_major, dev.cc_minor, failed, ran, e.name,
         e.result == M3QKV_SELFTEST_FAIL ? "wrote wrong bytes" : "could not run", e.message);
    return finish(M3QKV_ERROR_SELFTEST_FAILED);
  }
  clear_error();
  const m3qkv_status st = finish(M3QKV_SUCCESS);
  copy_text(r.message, sizeof(r.message),
            format("device %d (CC %d.%d): PASS: %s bit-exact with the golden model on %d problems (%.1f ms)",
                   dev.device, dev.cc_major, dev.cc_minor, names.c_str(), r.problems, r.total_us / 1000.0));
  return st;
}

}  // namespace m3qkv::selftest
