// The grid rule of cooperative launches (host/launch.h co_resident_ctas,
// cooperative_grid; issue 30: "a user grid is clamped to what can be
// co-resident on every path, cooperative included") on the fake CUDA table's
// occupancy model: CTAs per SM x the device's SMs, the caller's grid clamped
// to [1, that], the query's failures named.
#include <gtest/gtest.h>

#include <climits>
#include <string>

#include "fake_cuda.h"
#include "host/context.h"
#include "host/launch.h"

namespace {

namespace host = m3qkv::host;

__attribute__((noinline)) void fake_kernel(int) {}

class CooperativeGrid : public testing::Test {
 protected:
  FakeCudaInstall cuda_;
  m3qkv::DeviceInfo dev() {
    host::ContextScope scope;
    m3qkv::DeviceInfo d;
    EXPECT_EQ(host::enter_stream("test", nullptr, &scope, &d), M3QKV_SUCCESS) << m3qkv_last_error();
    return d;
  }
};

TEST_F(CooperativeGrid, CapacityIsCtasPerSmTimesSms) {
  const m3qkv::DeviceInfo d = dev();  // fake device 1: 101 SMs
  ASSERT_EQ(d.num_sms, 101);
  unsigned cap = 0;
  // 384 threads, 200 KiB: one CTA per SM (228 KiB of shared memory).
  ASSERT_EQ(host::co_resident_ctas("test", "k", d, &fake_kernel, 384, 200 << 10, &cap), M3QKV_SUCCESS);
  EXPECT_EQ(cap, 101u);
  // 256 threads, 64 KiB: three per SM (shared memory bounds it before threads do).
  ASSERT_EQ(host::co_resident_ctas("test", "k", d, &fake_kernel, 256, 64 << 10, &cap), M3QKV_SUCCESS);
  EXPECT_EQ(cap, 303u);
  // 128 threads, no shared memory: 16 per SM (2048 threads).
  ASSERT_EQ(host::co_resident_ctas("test", "k", d, &fake_kernel, 128, 0, &cap), M3QKV_SUCCESS);
  EXPECT_EQ(cap, 1616u);
  EXPECT_EQ(fake_cuda().occupancy_calls.load(), 3);
}

TEST_F(CooperativeGrid, EveryGridValueIsClampedToTheCoResidentCtas) {
  const m3qkv::DeviceInfo d = dev();
  // The grid values: 1, 7, 132, 133, 10^6, INT32_MAX (and 0 = auto before the plan picks one).
  const long long grids[] = {0, 1, 7, 100, 101, 102, 132, 133, 1000000, INT32_MAX, LLONG_MAX, -5};
  for (long long g : grids) {
    unsigned grid = 0;
    ASSERT_EQ(host::cooperative_grid("test", "k", d, &fake_kernel, 384, 200 << 10, g, &grid), M3QKV_SUCCESS) << g;
    const long long want = g < 1 ? 1 : g;
    EXPECT_EQ(grid, static_cast<unsigned>(want < 101 ? want : 101)) << g;
    EXPECT_GE(grid, 1u);
    EXPECT_LE(grid, 101u);
  }
}

TEST_F(CooperativeGrid, AKernelThatFitsNoSmIsRefusedByName) {
  const m3qkv::DeviceInfo d = dev();
  unsigned grid = 7;
  ASSERT_EQ(host::cooperative_grid("m3qkv_fused_qkv", "fused_prefill_kernel", d, &fake_kernel, 384, 300 << 10, 132,
                                   &grid),
            M3QKV_ERROR_UNSUPPORTED_DEVICE);
  const std::string msg = m3qkv_last_error();
  EXPECT_NE(msg.find("m3qkv_fused_qkv: fused_prefill_kernel"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cooperative"), std::string::npos) << msg;
}

TEST_F(CooperativeGrid, AFailedQueryIsACudaErrorNamingTheKernel) {
  const m3qkv::DeviceInfo d = dev();
  {
    std::lock_guard<std::mutex> lock(fake_cuda().mu);
    fake_cuda().occupancy_err = cudaErrorInvalidDeviceFunction;
  }
  unsigned grid = 0;
  ASSERT_EQ(host::cooperative_grid("m3qkv_fused_qkv", "fused_prefill_kernel", d, &fake_kernel, 384, 1024, 640, &grid),
            M3QKV_ERROR_CUDA_ERROR);
  const std::string msg = m3qkv_last_error();
  EXPECT_NE(msg.find("cudaOccupancyMaxActiveBlocksPerMultiprocessor(fused_prefill_kernel, block 384, smem 1024)"),
            std::string::npos)
      << msg;
}

}  // namespace
