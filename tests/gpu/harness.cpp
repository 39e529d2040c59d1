// GPU test harness (see harness.h).
#include "gpu/harness.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include <sys/wait.h>
#include <unistd.h>

#include "api/internal.h"  // m3qkv_testing_fused_qkv (test-only tap + forced backend)
#include "api/validate.h"
#include "common/layouts.h"
#include "common/numerics.h"
#include "golden/golden.h"

namespace m3qkv_gpu {

// ------------------------------------------------------------ GuardedBuffer
cudaError_t GuardedBuffer::init(size_t bytes, int salt) {
  bytes_ = bytes;
  salt_ = salt;
  if (bytes == 0) {
    buf_.reset();
    return cudaSuccess;
  }
  const cudaError_t e = buf_.alloc(bytes + 2 * kGuard);
  if (e != cudaSuccess) return e;
  return repoison(salt);
}

cudaError_t GuardedBuffer::repoison(int salt) {
  salt_ = salt;
  if (bytes_ == 0) return cudaSuccess;
  const size_t total = bytes_ + 2 * kGuard;
  std::vector<uint8_t> h(total);
  for (size_t i = 0; i < total; ++i) h[i] = salted_poison(i, salt);
  return cudaMemcpy(buf_.get(), h.data(), total, cudaMemcpyHostToDevice);
}

std::vector<uint8_t> GuardedBuffer::initial_payload() const {
  std::vector<uint8_t> h(bytes_);
  for (size_t i = 0; i < bytes_; ++i) h[i] = salted_poison(i + kGuard, salt_);
  return h;
}

cudaError_t GuardedBuffer::fetch(std::vector<uint8_t>* payload, bool* guards_ok, int64_t* first_bad) const {
  *guards_ok = true;
  *first_bad = 0;
  payload->clear();
  if (bytes_ == 0) return cudaSuccess;
  const size_t total = bytes_ + 2 * kGuard;
  std::vector<uint8_t> h(total);
  const cudaError_t e = cudaMemcpy(h.data(), buf_.get(), total, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) return e;
  for (size_t i = 0; i < total; ++i) {
    if (i == kGuard) i = kGuard + bytes_;
    if (i >= total) break;
    if (h[i] != salted_poison(i, salt_)) {
      *guards_ok = false;
      *first_bad = static_cast<int64_t>(i) - static_cast<int64_t>(kGuard);
      break;
    }
  }
  payload->assign(h.begin() + kGuard, h.begin() + kGuard + bytes_);
  return cudaSuccess;
}

// ------------------------------------------------------------- DeviceInputs
cudaError_t DeviceInputs::upload(const Problem& p) {
  bufs_.clear();
  for (const auto& b : p.inputs()) {
    DeviceBuffer d;
    if (b.bytes) {
      cudaError_t e = d.alloc(b.bytes);
      if (e != cudaSuccess) return e;
      e = cudaMemcpy(d.get(), b.data, b.bytes, cudaMemcpyHostToDevice);
      if (e != cudaSuccess) return e;
    }
    bufs_.emplace_back(b.name, std::move(d));
  }
  return cudaSuccess;
}

const void* DeviceInputs::get(const m3qkv_test::HostBuffer& b) const {
  for (const auto& x : bufs_)
    if (x.first == b.name) return x.second.get();
  return nullptr;
}

// ------------------------------------------------------------ DeviceOutputs
cudaError_t DeviceOutputs::init(const Problem& p, int salt, uint32_t preset_flags) {
  cudaError_t e;
  if ((e = q_out.init(p.q_out_bytes(), salt)) != cudaSuccess) return e;
  if ((e = q_fp8_out.init(p.q_fp8_out_bytes(), salt)) != cudaSuccess) return e;
  if ((e = index_q_out.init(p.index_q_out_bytes(), salt)) != cudaSuccess) return e;
  if ((e = kv_cache.init(p.kv_cache_bytes(), salt)) != cudaSuccess) return e;
  if ((e = v_cache.init(p.v_cache_bytes(), salt)) != cudaSuccess) return e;
  v_in_kv = p.v_in_kv;
  if ((e = index_cache.init(p.index_cache_bytes(), salt)) != cudaSuccess) return e;
  if ((e = flags.alloc(sizeof(uint32_t))) != cudaSuccess) return e;
  return cudaMemcpy(flags.get(), &preset_flags, sizeof preset_flags, cudaMemcpyHostToDevice);
}

cudaError_t DeviceOutputs::repoison(int salt, uint32_t preset_flags) {
  cudaError_t e;
  if ((e = q_out.repoison(salt)) != cudaSuccess) return e;
  if ((e = q_fp8_out.repoison(salt)) != cudaSuccess) return e;
  if ((e = index_q_out.repoison(salt)) != cudaSuccess) return e;
  if ((e = kv_cache.repoison(salt)) != cudaSuccess) return e;
  if ((e = v_cache.repoison(salt)) != cudaSuccess) return e;
  if ((e = index_cache.repoison(salt)) != cudaSuccess) return e;
  return cudaMemcpy(flags.get(), &preset_flags, sizeof preset_flags, cudaMemcpyHostToDevice);
}

m3qkv_test::OutputPtrs DeviceOutputs::ptrs(bool with_flags) const {
  m3qkv_test::OutputPtrs o;
  o.q_out = q_out.payload();
  o.q_fp8_out = q_fp8_out.payload();
  o.index_q_out = index_q_out.payload();
  o.kv_cache = kv_cache.payload();
  o.v_cache = v_in_kv >= 0 ? (kv_cache.payload() ? static_cast<uint8_t*>(kv_cache.payload()) + v_in_kv : nullptr)
                           : v_cache.payload();
  o.index_cache = index_cache.payload();
  o.error_flags = with_flags ? flags.as<uint32_t>() : nullptr;
  return o;
}

cudaError_t fetch_outputs(const DeviceOutputs& d, Fetched* f) {
  struct Item {
    const char* name;
    const GuardedBuffer* g;
    std::vector<uint8_t>* v;
  } items[] = {{"q_out", &d.q_out, &f->q_out},
               {"q_fp8_out", &d.q_fp8_out, &f->q_fp8_out},
               {"index_q_out", &d.index_q_out, &f->index_q_out},
               {"kv_cache", &d.kv_cache, &f->kv_cache},
               {"v_cache", &d.v_cache, &f->v_cache},
               {"index_cache", &d.index_cache, &f->index_cache}};
  f->guards_ok = true;
  f->guard_report.clear();
  for (const auto& it : items) {
    bool ok = true;
    int64_t bad = 0;
    const cudaError_t e = it.g->fetch(it.v, &ok, &bad);
    if (e != cudaSuccess) return e;
    if (!ok) {
      f->guards_ok = false;
      f->guard_report += std::string(it.name) + ": write outside the buffer at offset " + std::to_string(bad) +
                         (bad < 0 ? " (before the start); " : " (past the end); ");
    }
  }
  f->flags = 0;
  return cudaMemcpy(&f->flags, d.flags.get(), sizeof(uint32_t), cudaMemcpyDeviceToHost);
}

// ------------------------------------------------------- host expectations
HostOutputs poisoned_host_outputs(const Problem& p, int salt, uint32_t preset_flags) {
  HostOutputs o = p.make_outputs(0);
  auto fill = [&](void* data, size_t bytes) {
    uint8_t* b = static_cast<uint8_t*>(data);
    for (size_t i = 0; i < bytes; ++i) b[i] = salted_poison(i + kGuard, salt);
  };
  fill(o.q_out.data(), o.q_out.size() * 2);
  fill(o.q_fp8_out.data(), o.q_fp8_out.size());
  fill(o.index_q_out.data(), o.index_q_out.size());
  fill(o.kv_cache.data(), o.kv_cache.size());
  fill(o.v_cache.data(), o.v_cache.size());
  fill(o.index_cache.data(), o.index_cache.size());
  o.flags = preset_flags;
  return o;
}

void golden_epilogue(const Problem& p, const float* acc, HostOutputs* o) {
  const m3qkv_fused_args a = p.host_args(o->ptrs());
  m3qkv::golden::epilogue(a, acc, &o->flags);
}

InsertLayoutScope::InsertLayoutScope(int layout) {
  EXPECT_EQ(m3qkv_testing_insert_layout(layout), M3QKV_SUCCESS) << m3qkv_last_error();
}
InsertLayoutScope::~InsertLayoutScope() { (void)m3qkv_testing_insert_layout(0); }

void golden_insert(const Problem& p, const uint16_t* qkv, HostOutputs* o) {
  const m3qkv_insert_args a = p.host_insert_args(qkv, o->ptrs());
  m3qkv::golden::insert(a, &o->flags);
}

// ------------------------------------------------------------- comparisons
std::string describe_offset(const Problem& p, const char* buffer, size_t off) {
  std::ostringstream os;
  const std::string b = buffer;
  if (b == "q_out" || b == "q_fp8_out" || b == "index_q_out") {
    const size_t elem = b == "q_out" ? off / 2 : off;
    const int heads = b == "index_q_out" ? p.niq : p.nq;
    const size_t row_elems = static_cast<size_t>(heads) * 128;
    const size_t r = elem / row_elems, c = elem % row_elems;
    os << b << " byte " << off << " = row " << r << ", head " << c / 128 << ", col " << c % 128
       << " (position " << (r < p.positions.size() ? p.positions[r] : -1) << ")";
  } else if ((b == "kv_cache" && p.kv_flat()) || b == "v_cache" || (b == "index_cache" && p.index_flat())) {
    const bool ix = b == "index_cache";
    const int64_t stride = ix ? p.index_page_stride : p.kv_page_stride;
    const int64_t page = static_cast<int64_t>(off) / stride, w = static_cast<int64_t>(off) % stride;
    const int e = ix ? p.index_elem() : p.kv_elem();
    os << b << " (" << (e == 1 ? "fp8" : "bf16") << ") byte " << off << " = page " << page;
    bool found = false;
    for (int part = 0; part < 2 && !found; ++part) {
      const int64_t base = part == 0 ? 0 : (b == "kv_cache" ? p.v_in_kv : -1);
      if (base < 0) break;
      const int heads = ix ? 1 : p.nkv;
      const int64_t ts = ix ? 128 * e : p.kv_token_stride, hs = ix ? 0 : p.kv_head_stride;
      for (int t = 0; t < p.block_size && !found; ++t)
        for (int h = 0; h < heads && !found; ++h) {
          const int64_t r = w - base - t * ts - h * hs;
          if (r < 0 || r >= 128 * e) continue;
          found = true;
          const bool is_v = b == "v_cache" || part == 1;
          os << ", " << (ix ? "index_k" : (is_v ? "V" : "K")) << " head " << h << " token " << t << " col " << r / e;
          const int64_t slot = page * p.block_size + t;
          const auto& map = ix ? p.index_slot_mapping : p.slot_mapping;
          int64_t tok = -1;
          for (size_t i = 0; i < map.size(); ++i)
            if (map[i] == slot) tok = static_cast<int64_t>(i);
          os << "; cache slot " << slot << (tok >= 0 ? " <- token " + std::to_string(tok) : " (no token maps here)");
        }
    }
    if (!found) os << ", no element (padding or gap: must never be written)";
  } else if (b == "kv_cache" || b == "index_cache") {
    const bool kv = b == "kv_cache";
    const int64_t stride = kv ? p.kv_page_stride : p.index_page_stride;
    const int64_t packed = kv ? m3qkv::kv_page_min_bytes(p.nkv, p.block_size) : m3qkv::nvfp4_slot_bytes(p.block_size);
    const int64_t page = static_cast<int64_t>(off) / stride, w = static_cast<int64_t>(off) % stride;
    os << b << " byte " << off << " = page " << page;
    if (w >= packed) {
      os << ", page padding byte " << w - packed << " (must never be written)";
    } else {
      const int64_t sb = m3qkv::nvfp4_slot_bytes(p.block_size);
      const int64_t slot_in_page = w / sb, in = w % sb;
      os << ", slot-in-page " << slot_in_page;
      if (kv) os << " (" << (slot_in_page % 2 ? "V" : "K") << " of kv head " << slot_in_page / 2 << ")";
      if (in < int64_t(p.block_size) * 64) {
        os << ", token " << in / 64 << ", data byte " << in % 64 << " (cols " << 2 * (in % 64) << ","
           << 2 * (in % 64) + 1 << ")";
      } else {
        os << ", scale area byte " << in - int64_t(p.block_size) * 64;
      }
      const int64_t slot = page * p.block_size + (in < int64_t(p.block_size) * 64 ? in / 64 : -1);
      if (in < int64_t(p.block_size) * 64) {
        const auto& map = kv ? p.slot_mapping : p.index_slot_mapping;
        int64_t tok = -1;
        for (size_t t = 0; t < map.size(); ++t)
          if (map[t] == slot) tok = static_cast<int64_t>(t);
        os << "; cache slot " << slot << (tok >= 0 ? " <- token " + std::to_string(tok) : " (no token maps here)");
      }
    }
  } else {
    os << b << " byte " << off;
  }
  return os.str();
}

namespace {
void compare_one(const Problem& p, const char* name, const uint8_t* want, size_t want_n, const std::vector<uint8_t>& got,
                 const std::string& what) {
  if (want_n != got.size()) {
    ADD_FAILURE() << what << ": " << name << " size " << got.size() << " != expected " << want_n;
    return;
  }
  const int64_t first = first_diff(want, got.data(), want_n);
  if (first < 0) return;
  const size_t n_bad = count_diff(want, got.data(), want_n);
  const size_t f = static_cast<size_t>(first);
  const bool poisoned = got[f] == salted_poison(f + kGuard, 0) || got[f] == salted_poison(f + kGuard, 1);
  const bool want_poison = want[f] == salted_poison(f + kGuard, 0) || want[f] == salted_poison(f + kGuard, 1);
  ADD_FAILURE() << what << ": " << name << " differs in " << n_bad << " of " << want_n << " bytes; first at "
                << describe_offset(p, name, f) << ": got 0x" << std::hex << int(got[f]) << ", expected 0x"
                << int(want[f]) << std::dec
                << (poisoned ? " [got still holds the poison: byte NOT WRITTEN]" : "")
                << (want_poison ? " [expected is the poison: byte must NOT be written]" : "") << "\n  "
                << p.cfg.describe();
}
}  // namespace

void expect_same_outputs(const Problem& p, const HostOutputs& e, const Fetched& g, const std::string& what,
                         bool compare_flags) {
  EXPECT_TRUE(g.guards_ok) << what << ": " << g.guard_report << "\n  " << p.cfg.describe();
  compare_one(p, "q_out", reinterpret_cast<const uint8_t*>(e.q_out.data()), e.q_out.size() * 2, g.q_out, what);
  compare_one(p, "q_fp8_out", e.q_fp8_out.data(), e.q_fp8_out.size(), g.q_fp8_out, what);
  compare_one(p, "index_q_out", e.index_q_out.data(), e.index_q_out.size(), g.index_q_out, what);
  compare_one(p, "kv_cache", e.kv_cache.data(), e.kv_cache.size(), g.kv_cache, what);
  compare_one(p, "v_cache", e.v_cache.data(), e.v_cache.size(), g.v_cache, what);
  compare_one(p, "index_cache", e.index_cache.data(), e.index_cache.size(), g.index_cache, what);
  if (compare_flags)
    EXPECT_EQ(g.flags, e.flags) << what << ": error_flags 0x" << std::hex << g.flags << ", golden 0x" << e.flags
                                << std::dec << "\n  " << p.cfg.describe();
}

void expect_same_fetched(const Problem& p, const Fetched& a, const Fetched& b, const std::string& what) {
  EXPECT_TRUE(b.guards_ok) << what << ": " << b.guard_report;
  compare_one(p, "q_out", a.q_out.data(), a.q_out.size(), b.q_out, what);
  compare_one(p, "q_fp8_out", a.q_fp8_out.data(), a.q_fp8_out.size(), b.q_fp8_out, what);
  compare_one(p, "index_q_out", a.index_q_out.data(), a.index_q_out.size(), b.index_q_out, what);
  compare_one(p, "kv_cache", a.kv_cache.data(), a.kv_cache.size(), b.kv_cache, what);
  compare_one(p, "v_cache", a.v_cache.data(), a.v_cache.size(), b.v_cache, what);
  compare_one(p, "index_cache", a.index_cache.data(), a.index_cache.size(), b.index_cache, what);
  EXPECT_EQ(a.flags, b.flags) << what << ": error_flags differ";
}

// ---------------------------------------------------------------- running
void run_fused(const Problem& p, const DeviceInputs& in, const FusedRun& run, int salt, Fetched* out,
               std::vector<float>* acc, uint32_t preset_flags) {
  DeviceOutputs d;
  CUDA_OK(d.init(p, salt, preset_flags));
  // The poison goes up with cudaMemcpy from pageable memory, which may return
  // before the DMA reaches the device; the kernel runs on a non-blocking
  // stream that does not order after it. Wait, so the poison is in place.
  CUDA_OK(cudaDeviceSynchronize());
  m3qkv_fused_args a = p.args_with(in.mapper(), d.ptrs(run.with_flags));
  a.use_pdl = run.use_pdl;
  a.grid = run.grid;
  a.cta_group = run.cta_group;
  DeviceBuffer tap;
  const size_t tap_bytes = static_cast<size_t>(p.acc_elems()) * sizeof(float);
  if (run.tap) {
    CUDA_OK(tap.alloc(tap_bytes));
    CUDA_OK(cudaMemset(tap.get(), 0xFF, tap_bytes));  // NaN: an unwritten entry cannot pass
  }
  Stream s;
  CUDA_OK(s.error());
  if (run.tap || run.backend != M3QKV_BACKEND_NONE) {
    M3QKV_OK(m3qkv_testing_fused_qkv(&a, run.tap ? tap.as<float>() : nullptr, run.backend, s.get()));
  } else {
    M3QKV_OK(m3qkv_fused_qkv(&a, s.get()));
  }
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaStreamSynchronize(s.get()));
  CUDA_OK(fetch_outputs(d, out));
  if (run.tap && acc) CUDA_OK(tap.download_as(acc));
}

void run_direct(const Problem& p, const DeviceInputs& in, int use_pdl, int grid, int salt, const DirectLaunch& launch,
                Fetched* out, std::vector<float>* tap_out, cudaStream_t stream) {
  DeviceOutputs d;
  CUDA_OK(d.init(p, salt));
  CUDA_OK(cudaDeviceSynchronize());  // the poison in place before a non-blocking stream runs (run_fused says why)
  m3qkv_fused_args a = p.args_with(in.mapper(), d.ptrs());
  a.use_pdl = use_pdl;
  a.grid = grid;
  bool noop = true;
  m3qkv_fused_args checked;
  M3QKV_OK(m3qkv::validate_fused(&a, &checked, &noop));
  ASSERT_FALSE(noop);
  m3qkv::DeviceInfo dev;
  M3QKV_OK(m3qkv::current_device_info(&dev));
  DeviceBuffer tap;
  const size_t tap_bytes = static_cast<size_t>(p.acc_elems()) * sizeof(float);
  if (tap_out != nullptr) {
    CUDA_OK(tap.alloc(tap_bytes));
    CUDA_OK(cudaMemset(tap.get(), 0xFF, tap_bytes));  // NaN: an unwritten entry cannot pass
  }
  Stream own;
  CUDA_OK(own.error());
  const cudaStream_t st = stream != nullptr ? stream : own.get();
  M3QKV_OK(launch(a, dev, tap_out != nullptr ? tap.as<float>() : nullptr, st));
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaStreamSynchronize(st));
  CUDA_OK(fetch_outputs(d, out));
  if (tap_out != nullptr) CUDA_OK(tap.download_as(tap_out));
}

void check_exact_direct(const Problem& p, const std::vector<float>& acc, const std::string& what, const ExactRun& run) {
  for (int salt = 0; salt < 2; ++salt) {
    SCOPED_TRACE(what + ", poison salt " + std::to_string(salt));
    Fetched got;
    std::vector<float> tap;
    ASSERT_NO_FATAL_FAILURE(run(salt, &got, salt == 0 ? &tap : nullptr));
    HostOutputs want = poisoned_host_outputs(p, salt);
    golden_epilogue(p, acc.data(), &want);
    expect_same_outputs(p, want, got, what);
    if (salt == 0) {
      ASSERT_EQ(tap.size(), acc.size());
      int64_t first = -1;
      const int64_t bad = count_f32_mismatch(tap.data(), acc.data(), acc.size(), &first);
      EXPECT_EQ(bad, 0) << "tap differs from the exact golden accumulator in " << bad << " entries; first ["
                        << first / p.n() << ", " << first % p.n() << "]: got "
                        << (first >= 0 ? tap[size_t(first)] : 0.f) << ", expected "
                        << (first >= 0 ? acc[size_t(first)] : 0.f);
    }
    if (::testing::Test::HasFailure()) return;
  }
}

std::string backend_label(m3qkv_backend_kind k) {
  switch (k) {
    case M3QKV_BACKEND_NONE: return "auto";
    case M3QKV_BACKEND_PORTABLE: return "portable";
    case M3QKV_BACKEND_SM90: return "sm90";
    case M3QKV_BACKEND_SM100: return "sm100";
  }
  return "?";
}

std::vector<m3qkv_backend_kind> fused_backends() {
  // M3QKV_TEST_BACKENDS=portable,sm90,sm100 overrides (e.g. the tcgen05
  // emulation build forces sm100 on the H200).
  if (const char* env = std::getenv("M3QKV_TEST_BACKENDS")) {
    std::vector<m3qkv_backend_kind> v;
    const std::string s = env;
    if (s.find("portable") != std::string::npos) v.push_back(M3QKV_BACKEND_PORTABLE);
    if (s.find("sm90") != std::string::npos) v.push_back(M3QKV_BACKEND_SM90);
    if (s.find("sm100") != std::string::npos) v.push_back(M3QKV_BACKEND_SM100);
    if (!v.empty()) return v;
  }
  std::vector<m3qkv_backend_kind> v{M3QKV_BACKEND_PORTABLE};
  int dev = 0;
  m3qkv_backend_kind k = M3QKV_BACKEND_NONE;
  if (cudaGetDevice(&dev) == cudaSuccess && m3qkv_backend(dev, &k) == M3QKV_SUCCESS && k != M3QKV_BACKEND_NONE &&
      k != M3QKV_BACKEND_PORTABLE)
    v.push_back(k);
  return v;
}

bool in_child() {
  const char* v = std::getenv("M3QKV_CHILD");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

void expect_child_passes(const std::string& test, const std::string& env) {
  char exe[4096];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  ASSERT_GT(len, 0);
  exe[len] = '\0';
  const std::string cmd = "M3QKV_CHILD=1 " + env + " '" + exe + "' --gtest_filter='" + test +
                          "' --gtest_also_run_disabled_tests 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[4096];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  const int status = pclose(f);
  std::printf("---- child %s (%s) ----\n%s---- end of child ----\n", test.c_str(), env.c_str(), out.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the child " << test << " failed or died (status " << status << ")";
  EXPECT_NE(out.find("[  PASSED  ] 1 test."), std::string::npos) << "the child did not run and pass " << test;
  EXPECT_EQ(out.find("[  SKIPPED ]"), std::string::npos) << "the child skipped " << test;
}

ErrorFigure relative_error(const float* a, const double* ref, size_t n) {
  ErrorFigure f;
  double num = 0.0, den = 0.0, max_ref = 0.0, max_err = 0.0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i])) {
      ++f.non_finite;
      continue;
    }
    const double d = static_cast<double>(a[i]) - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
    max_ref = std::max(max_ref, std::fabs(ref[i]));
    max_err = std::max(max_err, std::fabs(d));
  }
  f.rel_fro = den > 0 ? std::sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
  f.max_abs_over_max_ref = max_ref > 0 ? max_err / max_ref : 0.0;
  return f;
}

int64_t count_f32_mismatch(const float* a, const float* b, size_t n, int64_t* first) {
  int64_t c = 0;
  *first = -1;
  for (size_t i = 0; i < n; ++i) {
    if (m3qkv::f32_bits(a[i]) != m3qkv::f32_bits(b[i])) {
      if (c == 0) *first = static_cast<int64_t>(i);
      ++c;
    }
  }
  return c;
}

}  // namespace m3qkv_gpu
