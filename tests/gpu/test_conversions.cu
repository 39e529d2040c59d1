// Hardware vs software numerics (docs/contract.md §3.6 and §3.8's "faster instructions only
// where a test proves them identical" rule):
//  - cvt.rn.satfinite.e4m3x2.f32 and cvt.rn.bf16x2.f32 against the M3_HD
//    software conversions of common/numerics.h over ALL 2^32 f32 bit patterns,
//    compared on the device (mismatches counted with atomics, first few kept);
//  - rcp.approx.ftz.f32 against RN(1/s) on the 126 positive finite e4m3 values;
//  - cvt.rn.f16x2.e4m3x2 + cvt.f32.f16 (epi::e4m3x2_to_f32x2_dev) against
//    e4m3_to_f32 on all 2^16 byte pairs;
//  - __frsqrt_rn against the host rsqrt_rn_host (exhaustive on [1, 4) and on
//    the subnormals, which with rsqrt(4t) = rsqrt(t)/2 covers every normal
//    input, plus a strided sample of the whole range and the specials);
//  - __fmul_rz against the host mul_rz_host on random pairs.
// The kernels in src/ rely on these equalities (the golden model uses the
// software side, the GPU kernels the hardware side).
#include <cuda_runtime.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "common/numerics.h"
#include "common/test_util.h"
#include "gpu/gpu_util.h"

#include "common/epilogue.cuh"
#include "ptx/cvt.cuh"

namespace {

using m3qkv_gpu::DeviceBuffer;

// The instructions come from the kernels' own wrappers (ptx/cvt.cuh), so the
// suite checks exactly what the kernels execute, lane order included (the
// wrappers take (lo, hi) in memory order). e4m3x2 exists from sm_89 on: the
// sm_80 pass of this file reports "unsupported" instead.

constexpr int kKeep = 8;  // mismatches kept for the report
struct Mismatches {
  unsigned long long count;
  uint32_t unsupported;
  uint32_t input[kKeep];
  uint32_t hw[kKeep];
  uint32_t sw[kKeep];
};

__device__ void record(Mismatches* mm, uint32_t in, uint32_t hw, uint32_t sw) {
  const unsigned long long i = atomicAdd(&mm->count, 1ull);
  if (i < kKeep) {
    mm->input[i] = in;
    mm->hw[i] = hw;
    mm->sw[i] = sw;
  }
}

// Every f32 pattern x in [begin, end) goes to the upper lane, ~x to the lower
// lane: over the whole range each lane sees all 2^32 patterns.
__global__ void exhaustive_e4m3_kernel(uint64_t begin, uint64_t end, Mismatches* mm) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = begin + blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < end; i += stride) {
    const uint32_t x = static_cast<uint32_t>(i);
    const uint32_t y = ~x;
    const float fx = __uint_as_float(x), fy = __uint_as_float(y);
#if M3QKV_HAS_CVT_RN_SATFINITE_E4M3X2_F32
    const uint16_t d = cvt_rn_satfinite_e4m3x2_f32(/*lo=*/fy, /*hi=*/fx);
#else
    const uint16_t d = 0;
    mm->unsupported = 1;
    return;
#endif
    const uint8_t hx = static_cast<uint8_t>(d >> 8), hy = static_cast<uint8_t>(d & 0xff);
    const uint8_t sx = m3qkv::f32_to_e4m3_satfinite_rn_soft(fx);
    const uint8_t sy = m3qkv::f32_to_e4m3_satfinite_rn_soft(fy);
    if (hx != sx) record(mm, x, hx, sx);
    if (hy != sy) record(mm, y, hy, sy);
  }
}

__global__ void exhaustive_bf16_kernel(uint64_t begin, uint64_t end, Mismatches* mm) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = begin + blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < end; i += stride) {
    const uint32_t x = static_cast<uint32_t>(i);
    const uint32_t y = ~x;
    const float fx = __uint_as_float(x), fy = __uint_as_float(y);
#if M3QKV_HAS_CVT_RN_BF16X2_F32
    const uint32_t d = cvt_rn_bf16x2_f32(/*lo=*/fy, /*hi=*/fx);
#else
    const uint32_t d = 0;  // host pass only (the wrapper exists on every device target)
#endif
    const uint16_t hx = static_cast<uint16_t>(d >> 16), hy = static_cast<uint16_t>(d & 0xffff);
    const uint16_t sx = m3qkv::f32_to_bf16_rn_soft(fx);
    const uint16_t sy = m3qkv::f32_to_bf16_rn_soft(fy);
    if (hx != sx) record(mm, x, hx, sx);
    if (hy != sy) record(mm, y, hy, sy);
  }
}

// The branch-free e2m1 encoder the device NVFP4 path uses against the
// reference one (both run here, on the device).
__global__ void exhaustive_e2m1_kernel(uint64_t begin, uint64_t end, Mismatches* mm) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = begin + blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < end; i += stride) {
    const uint32_t x = static_cast<uint32_t>(i);
    const float fx = __uint_as_float(x);
    const uint8_t h = m3qkv::f32_to_e2m1_satfinite_rn_branchfree(fx);
    const uint8_t r = m3qkv::f32_to_e2m1_satfinite_rn_soft(fx);
    if (h != r) record(mm, x, h, r);
  }
}

// Every byte pair through the NVFP4 scales' decoder, as the kernels call it.
// *hw = 1 where the instruction path was compiled (sm_89+).
__global__ void e4m3x2_to_f32x2_kernel(float2* out, uint32_t* hw) {
  const uint32_t pair = blockIdx.x * blockDim.x + threadIdx.x;
  if (pair >= 0x10000u) return;
  out[pair] = m3qkv::epi::e4m3x2_to_f32x2_dev(pair);
  if (pair == 0) *hw = (M3QKV_EPILOGUE_HW_CVT && M3QKV_HAS_CVT_RN_F16X2_E4M3X2) ? 1u : 0u;
}

__global__ void rcp_e4m3_kernel(float* approx, float* rn) {
  const int code = 1 + static_cast<int>(threadIdx.x);  // 0x01..0x7E
  if (code > 0x7e) return;
  const float s = m3qkv::e4m3_to_f32(static_cast<uint8_t>(code));
#if M3QKV_HAS_RCP_APPROX_FTZ_F32
  approx[code - 1] = rcp_approx_ftz_f32(s);
#else
  approx[code - 1] = 0.0f;  // host pass only
#endif
  rn[code - 1] = __frcp_rn(s);
}

__global__ void rsqrt_kernel(const uint32_t* in, uint32_t* out, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] = __float_as_uint(__frsqrt_rn(__uint_as_float(in[i])));
}

__global__ void mul_rz_kernel(const uint32_t* a, const uint32_t* b, uint32_t* out, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] = __float_as_uint(m3qkv::mul_rz(__uint_as_float(a[i]), __uint_as_float(b[i])));
}

int sm_count() {
  int dev = 0, n = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
  return n > 0 ? n : 1;
}

std::string describe(const Mismatches& mm, int hex_digits) {
  std::string s = "mismatches: " + std::to_string(mm.count);
  char buf[128];
  for (unsigned long long i = 0; i < std::min<unsigned long long>(mm.count, kKeep); ++i) {
    std::snprintf(buf, sizeof buf, "\n  f32 0x%08x (%.9g): hardware 0x%0*x, software 0x%0*x", mm.input[i],
                  m3qkv::bits_f32(mm.input[i]), hex_digits, mm.hw[i], hex_digits, mm.sw[i]);
    s += buf;
  }
  return s;
}

// Runs an exhaustive kernel over all 2^32 patterns in slices (keeps each
// launch short for watchdogs / sanitizers) and returns the device record.
template <class Kernel>
void run_exhaustive(Kernel kernel, Mismatches* host_mm) {
  M3QKV_ALLOC(dmm, sizeof(Mismatches));
  CUDA_OK(cudaMemset(dmm.get(), 0, sizeof(Mismatches)));
  const int blocks = sm_count() * 8;
  constexpr uint64_t kTotal = 1ull << 32, kSlice = 1ull << 30;
  for (uint64_t b = 0; b < kTotal; b += kSlice) {
    kernel<<<blocks, 256>>>(b, b + kSlice, dmm.as<Mismatches>());
    CUDA_OK(cudaGetLastError());
  }
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaMemcpy(host_mm, dmm.get(), sizeof(Mismatches), cudaMemcpyDeviceToHost));
}

// Parallel host loop (the H200 host has 16 cores; CI may have 2).
template <class F>
void parallel_for(size_t n, F f) {
  const unsigned nt = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
  std::vector<std::thread> th;
  for (unsigned t = 0; t < nt; ++t)
    th.emplace_back([=] {
      for (size_t i = n * t / nt; i < n * (t + 1) / nt; ++i) f(i);
    });
  for (auto& x : th) x.join();
}

}  // namespace

// The host references of numerics.h exist only in nvcc's host pass; the
// device pass (which still parses host code) sees just the declarations.
namespace m3qkv_gpu_conv {
uint32_t host_rsqrt_rn_bits(uint32_t t);
uint32_t host_mul_rz_bits(uint32_t a, uint32_t b);
#if !defined(__CUDA_ARCH__)
uint32_t host_rsqrt_rn_bits(uint32_t t) { return m3qkv::f32_bits(m3qkv::rsqrt_rn_host(m3qkv::bits_f32(t))); }
uint32_t host_mul_rz_bits(uint32_t a, uint32_t b) {
  return m3qkv::f32_bits(m3qkv::mul_rz_host(m3qkv::bits_f32(a), m3qkv::bits_f32(b)));
}
#endif
}  // namespace m3qkv_gpu_conv

namespace {
using m3qkv_gpu_conv::host_mul_rz_bits;
using m3qkv_gpu_conv::host_rsqrt_rn_bits;

bool same_f32(uint32_t a, uint32_t b) {
  // NaN payloads differ between the device (canonical 0x7fffffff) and the
  // host (0x7fc00000); every NaN is the same value for this comparison.
  if (m3qkv::is_nan_f32(m3qkv::bits_f32(a)) && m3qkv::is_nan_f32(m3qkv::bits_f32(b))) return true;
  return a == b;
}

// ---------------------------------------------------------------------------

TEST(GpuConversions, E4m3SatfiniteAllF32Patterns) {
  M3QKV_REQUIRE_GPU();
  if (m3qkv_gpu::device_cc() < 89) GTEST_SKIP() << "cvt.rn.satfinite.e4m3x2.f32 needs CC >= 8.9";
  Mismatches mm{};
  run_exhaustive(exhaustive_e4m3_kernel, &mm);
  if (HasFatalFailure()) return;
  ASSERT_EQ(mm.unsupported, 0u) << "the kernel ran a build without sm_89+ code for this device";
  RecordProperty("e4m3_mismatches", std::to_string(mm.count));
  std::printf("[ cvt ] e4m3x2 satfinite: 2^32 patterns x 2 lanes, %llu mismatches\n", mm.count);
  EXPECT_EQ(mm.count, 0ull) << describe(mm, 2);
}

TEST(GpuConversions, Bf16RnAllF32Patterns) {
  M3QKV_REQUIRE_GPU();
  Mismatches mm{};
  run_exhaustive(exhaustive_bf16_kernel, &mm);
  if (HasFatalFailure()) return;
  RecordProperty("bf16_mismatches", std::to_string(mm.count));
  std::printf("[ cvt ] bf16x2 rn: 2^32 patterns x 2 lanes, %llu mismatches\n", mm.count);
  EXPECT_EQ(mm.count, 0ull) << describe(mm, 4);
}

TEST(GpuConversions, E2m1BranchFreeAllF32Patterns) {
  M3QKV_REQUIRE_GPU();
  Mismatches mm{};
  run_exhaustive(exhaustive_e2m1_kernel, &mm);
  if (HasFatalFailure()) return;
  std::printf("[ cvt ] e2m1 branch-free vs reference: 2^32 patterns, %llu mismatches\n", mm.count);
  EXPECT_EQ(mm.count, 0ull) << describe(mm, 2);
}

// The NVFP4 quantizer computes rc = RN(1/s) with s a positive finite e4m3
// value (s >= 2^-9 by the clamp): rcp.approx.ftz may replace it only if it
// is exact on all 126 of them.
TEST(GpuConversions, RcpApproxEqualsRcpRnOnE4m3Values) {
  M3QKV_REQUIRE_GPU();
  M3QKV_ALLOC(dapprox, 126 * sizeof(float));
  M3QKV_ALLOC(drn, 126 * sizeof(float));
  rcp_e4m3_kernel<<<1, 128>>>(dapprox.as<float>(), drn.as<float>());
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> approx, rn;
  CUDA_OK(dapprox.download_as(&approx));
  CUDA_OK(drn.download_as(&rn));
  int bad = 0;
  for (int code = 1; code <= 0x7e; ++code) {
    const float s = m3qkv::e4m3_to_f32(static_cast<uint8_t>(code));
    const float host_rn = m3qkv::rcp_rn(s);  // host: IEEE 1.0f / s
    ASSERT_EQ(m3qkv::f32_bits(rn[code - 1]), m3qkv::f32_bits(host_rn))
        << "__frcp_rn differs from the host division for e4m3 code 0x" << std::hex << code;
    if (m3qkv::f32_bits(approx[code - 1]) != m3qkv::f32_bits(host_rn)) {
      ++bad;
      ADD_FAILURE() << "rcp.approx.ftz.f32(" << s << ") = " << approx[code - 1] << " (0x" << std::hex
                    << m3qkv::f32_bits(approx[code - 1]) << "), RN(1/s) = " << host_rn << " (0x"
                    << m3qkv::f32_bits(host_rn) << "): kernels must use rcp_rn here";
    }
  }
  std::printf("[ cvt ] rcp.approx.ftz vs RN(1/s): 126 e4m3 values, %d mismatches\n", bad);
}

// The NVFP4 group scales decode their e4m3 bytes with cvt.rn.f16x2.e4m3x2
// (epilogue.cuh e4m3x2_to_f32x2_dev): equal to the golden model's
// e4m3_to_f32 on every byte of every pair, the NaN codes 0x7F / 0xFF (which
// no scale takes) NaN on both sides.
TEST(GpuConversions, E4m3x2ToF32x2EqualsSoftwareOnAllPairs) {
  M3QKV_REQUIRE_GPU();
  int dev = 0, major = 0, minor = 0;
  CUDA_OK(cudaGetDevice(&dev));
  CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CUDA_OK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  M3QKV_ALLOC(dout, 0x10000 * sizeof(float2));
  M3QKV_ALLOC(dhw, sizeof(uint32_t));
  e4m3x2_to_f32x2_kernel<<<0x10000 / 256, 256>>>(dout.as<float2>(), dhw.as<uint32_t>());
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float2> out;
  std::vector<uint32_t> hw;
  CUDA_OK(dout.download_as(&out));
  CUDA_OK(dhw.download_as(&hw));
  if (major * 10 + minor >= 89) EXPECT_EQ(hw[0], 1u) << "sm_89+ must run the cvt.rn.f16x2.e4m3x2 path";
  int bad = 0;
  for (uint32_t pair = 0; pair < 0x10000u; ++pair) {
    const uint8_t b[2] = {static_cast<uint8_t>(pair & 0xffu), static_cast<uint8_t>(pair >> 8)};
    const float got[2] = {out[pair].x, out[pair].y};
    for (int h = 0; h < 2; ++h) {
      const float want = m3qkv::e4m3_to_f32(b[h]);
      const bool ok = (b[h] & 0x7fu) == 0x7fu ? std::isnan(got[h]) && std::isnan(want)
                                              : m3qkv::f32_bits(got[h]) == m3qkv::f32_bits(want);
      if (!ok && bad++ < 4)
        ADD_FAILURE() << "pair 0x" << std::hex << pair << " byte " << h << ": got 0x" << m3qkv::f32_bits(got[h])
                      << ", e4m3_to_f32 0x" << m3qkv::f32_bits(want);
    }
  }
  EXPECT_EQ(bad, 0);
  std::printf("[ cvt ] e4m3x2 -> f32x2 (hw path %u): 2^16 pairs, %d mismatches\n", hw[0], bad);
}

TEST(GpuConversions, FrsqrtRnMatchesHostRsqrtRn) {
  M3QKV_REQUIRE_GPU();
  std::vector<uint32_t> in;
  in.reserve((1u << 24) + (1u << 23) + (1u << 20));
  for (uint32_t u = 0x3f800000u; u < 0x40800000u; ++u) in.push_back(u);  // [1, 4): every mantissa, both exponent parities
  for (uint32_t u = 1; u < 0x00800000u; ++u) in.push_back(u);           // every positive subnormal
  for (uint32_t u = 0x00800000u; u < 0x7f800000u; u += 4099u) in.push_back(u);  // strided normals
  const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xbf800000u,
                               0x7f7fffffu, 0x00800000u, 0x358637bdu /* 1e-6 */, 0x3c000000u /* 2^-7 */};
  for (uint32_t u : specials) in.push_back(u);
  const size_t n = in.size();
  M3QKV_ALLOC(din, n * 4);
  M3QKV_ALLOC(dout, n * 4);
  CUDA_OK(din.upload(in));
  rsqrt_kernel<<<sm_count() * 8, 256>>>(din.as<uint32_t>(), dout.as<uint32_t>(), n);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint32_t> out;
  CUDA_OK(dout.download_as(&out));
  std::vector<uint8_t> bad(n, 0);
  parallel_for(n, [&](size_t i) {
    bad[i] = !same_f32(out[i], host_rsqrt_rn_bits(in[i]));
  });
  size_t nbad = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!bad[i]) continue;
    if (++nbad <= 8)
      ADD_FAILURE() << "rsqrt(0x" << std::hex << in[i] << "): __frsqrt_rn 0x" << out[i] << ", rsqrt_rn_host 0x"
                    << host_rsqrt_rn_bits(in[i]);
  }
  std::printf("[ cvt ] __frsqrt_rn vs rsqrt_rn_host: %zu inputs, %zu mismatches\n", n, nbad);
  EXPECT_EQ(nbad, 0u);
}

TEST(GpuConversions, FmulRzMatchesHostMulRz) {
  M3QKV_REQUIRE_GPU();
  const uint64_t seed = m3qkv_test::test_seed();
  std::printf("[ seed ] M3QKV_TEST_SEED=%" PRIu64 "\n", seed);
  std::mt19937_64 rng(seed ^ 0xF00D);
  constexpr size_t kPerClass = 1u << 22;
  std::vector<uint32_t> a, b;
  a.reserve(3 * kPerClass);
  b.reserve(3 * kPerClass);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> code(1, 0x7e);
  for (size_t i = 0; i < kPerClass; ++i) {  // 1: arbitrary bit patterns (specials, overflow, underflow)
    a.push_back(static_cast<uint32_t>(rng()));
    b.push_back(static_cast<uint32_t>(rng()));
  }
  for (size_t i = 0; i < kPerClass; ++i) {  // 2: the NVFP4 use: value · rc, rc = RN(1/s)·sf
    const float v = normal(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
    float rc = m3qkv::rcp_rn(m3qkv::e4m3_to_f32(static_cast<uint8_t>(code(rng))));
    if (rng() & 1) rc = m3qkv::mul_rn(rc, m3qkv::rcp_rn(0.5f + static_cast<float>(rng() % 1000) / 500.0f));
    a.push_back(m3qkv::f32_bits(v));
    b.push_back(m3qkv::f32_bits(rc));
  }
  for (size_t i = 0; i < kPerClass; ++i) {  // 3: products near the subnormal / overflow boundaries
    // unbiased product exponent (ea-127)+(eb-127) aimed at the subnormal
    // range [-155, -120] or just around overflow [125, 129]
    const int ea = static_cast<int>(rng() % 254) + 1;
    const int target = (rng() & 1) ? -155 + static_cast<int>(rng() % 36) : 125 + static_cast<int>(rng() % 5);
    const int ebc = std::min(254, std::max(1, target - (ea - 127) + 127));
    a.push_back((static_cast<uint32_t>(rng() & 1) << 31) | (static_cast<uint32_t>(ea) << 23) | (rng() & 0x7fffff));
    b.push_back((static_cast<uint32_t>(rng() & 1) << 31) | (static_cast<uint32_t>(ebc) << 23) | (rng() & 0x7fffff));
  }
  const size_t n = a.size();
  M3QKV_ALLOC(da, n * 4);
  M3QKV_ALLOC(db, n * 4);
  M3QKV_ALLOC(dout, n * 4);
  CUDA_OK(da.upload(a));
  CUDA_OK(db.upload(b));
  mul_rz_kernel<<<sm_count() * 8, 256>>>(da.as<uint32_t>(), db.as<uint32_t>(), dout.as<uint32_t>(), n);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint32_t> out;
  CUDA_OK(dout.download_as(&out));
  size_t nbad = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t h = host_mul_rz_bits(a[i], b[i]);
    if (same_f32(out[i], h)) continue;
    if (++nbad <= 8)
      ADD_FAILURE() << "mul_rz(0x" << std::hex << a[i] << ", 0x" << b[i] << "): __fmul_rz 0x" << out[i]
                    << ", mul_rz_host 0x" << h;
  }
  std::printf("[ cvt ] __fmul_rz vs mul_rz_host: %zu pairs, %zu mismatches\n", n, nbad);
  EXPECT_EQ(nbad, 0u);
}

}  // namespace
