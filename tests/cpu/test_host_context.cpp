// The host layer's context records, one-time setup and stream workspaces
// (src/host/context.h, once.h, workspace.h) on the scripted CUDA of
// fake_cuda.h: which context a call uses, that a new context (cuCtxCreate,
// the primary context after cudaDeviceReset) gets fresh setup, that setup
// runs once under concurrency and is retried after a failure, and the
// workspace contract (size, zeroing, growth, capture mode, threads).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fake_cuda.h"
#include "api/checked.h"
#include "host/context.h"
#include "host/launch.h"
#include "host/once.h"
#include "host/tensor_map.h"
#include "host/workspace.h"

namespace {

using m3qkv::DeviceInfo;
namespace host = m3qkv::host;

class HostContext : public testing::Test {
 protected:
  FakeCudaInstall cuda_;

  // enter_stream on `s` from this thread; the scope ends here.
  DeviceInfo enter(cudaStream_t s = nullptr) {
    host::ContextScope scope;
    DeviceInfo d;
    EXPECT_EQ(host::enter_stream("test", s, &scope, &d), M3QKV_SUCCESS) << m3qkv_last_error();
    return d;
  }
};

struct Counted {
  int value = 0;
};
std::atomic<int> g_inits{0};

m3qkv_status once_counted(const DeviceInfo& d, const Counted** out) {
  return host::once("test", d, host::OnceSlot::kPortable, [](Counted* c) -> m3qkv_status {
    c->value = ++g_inits;
    return M3QKV_SUCCESS;
  }, out);
}

TEST_F(HostContext, TheNullStreamUsesTheCurrentContext) {
  const DeviceInfo d = enter();
  EXPECT_EQ(d.device, 1);
  EXPECT_EQ(d.num_sms, 101);
  ASSERT_NE(d.context, nullptr);
  EXPECT_EQ(enter(cudaStreamLegacy).context, d.context);
  EXPECT_EQ(enter(cudaStreamPerThread).context, d.context);
  fake_set_current_device(3);
  const DeviceInfo d3 = enter();
  EXPECT_EQ(d3.device, 3);
  EXPECT_NE(d3.context, d.context);
}

TEST_F(HostContext, AStreamOfAnotherContextIsCurrentForTheScopeOnly) {
  size_t other = 0;
  {
    std::lock_guard<std::mutex> lock(fake_cuda().mu);
    other = fake_cuda().new_context(4);  // as cuCtxCreate on device 4
  }
  const cudaStream_t s = fake_cuda().new_stream(other);
  const size_t callers = current_ctx();
  {
    host::ContextScope scope;
    DeviceInfo d;
    ASSERT_EQ(host::enter_stream("test", s, &scope, &d), M3QKV_SUCCESS) << m3qkv_last_error();
    EXPECT_EQ(d.device, 4);
    EXPECT_EQ(current_ctx(), other);  // launches inside the scope go to the stream's context
  }
  EXPECT_EQ(current_ctx(), callers);
  EXPECT_EQ(t_ctx_stack.size(), 1u);
  // A stream of the current context pushes nothing.
  const cudaStream_t mine = fake_cuda().new_stream(callers);
  enter(mine);  // the first call in this context makes its record
  const int calls = fake_cuda().calls.load();
  enter(mine);
  EXPECT_EQ(t_ctx_stack.size(), 1u);
  EXPECT_LE(fake_cuda().calls.load() - calls, 3) << "the steady state costs more than 3 CUDA calls";
}

TEST_F(HostContext, ANewContextOnTheSameDeviceGetsFreshSetup) {
  const DeviceInfo before = enter();
  const Counted* c1 = nullptr;
  ASSERT_EQ(once_counted(before, &c1), M3QKV_SUCCESS);
  const Counted* again = nullptr;
  ASSERT_EQ(once_counted(enter(), &again), M3QKV_SUCCESS);
  EXPECT_EQ(again, c1) << "the setup of one context ran twice";

  fake_cuda().reset_primary(1);  // cudaDeviceReset: same device, same handle, new context id
  const DeviceInfo after = enter();
  EXPECT_EQ(after.device, 1);
  EXPECT_NE(after.context, before.context);
  const Counted* c2 = nullptr;
  ASSERT_EQ(once_counted(after, &c2), M3QKV_SUCCESS);
  EXPECT_NE(c2, c1);
  EXPECT_EQ(c2->value, c1->value + 1);
}

TEST_F(HostContext, SetupRunsOnceUnderConcurrentFirstCalls) {
  fake_cuda().reset_primary(1);
  const int before = g_inits.load();
  std::vector<const Counted*> got(16, nullptr);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t) {
    threads.emplace_back([&, t] {
      fake_set_current_device(1);
      ready++;
      while (ready.load() < static_cast<int>(got.size())) std::this_thread::yield();
      host::ContextScope scope;
      DeviceInfo d;
      ASSERT_EQ(host::enter_stream("test", nullptr, &scope, &d), M3QKV_SUCCESS);
      ASSERT_EQ(once_counted(d, &got[t]), M3QKV_SUCCESS);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(g_inits.load(), before + 1);
  for (const Counted* c : got) EXPECT_EQ(c, got[0]);
}

TEST_F(HostContext, FailedSetupIsRetried) {
  const DeviceInfo d = enter();
  int attempts = 0;
  const auto init = [&](Counted*) -> m3qkv_status {
    return ++attempts == 1 ? m3qkv::fail(M3QKV_ERROR_CUDA_ERROR, "test: scripted") : M3QKV_SUCCESS;
  };
  const Counted* c = nullptr;
  EXPECT_EQ(host::once("test", d, host::OnceSlot::kSm90, init, &c), M3QKV_ERROR_CUDA_ERROR);
  EXPECT_EQ(host::once("test", d, host::OnceSlot::kSm90, init, &c), M3QKV_SUCCESS);
  EXPECT_EQ(host::once("test", d, host::OnceSlot::kSm90, init, &c), M3QKV_SUCCESS);
  EXPECT_EQ(attempts, 2);
  DeviceInfo no_context = d;
  no_context.context = nullptr;
  EXPECT_EQ(host::once("test", no_context, host::OnceSlot::kSm100, init, &c), M3QKV_ERROR_INTERNAL);
}

// m3qkv_warmup / m3qkv_selftest enter a device's primary context: one
// retain per device is kept for the process, every later one is given back.
TEST_F(HostContext, EnterPrimaryKeepsOneRetainPerDevice) {
  for (int i = 0; i < 3; ++i) {
    host::ContextScope scope;
    DeviceInfo d;
    ASSERT_EQ(host::enter_primary("test", 2, &scope, &d), M3QKV_SUCCESS) << m3qkv_last_error();
  }
  EXPECT_EQ(std::count(fake_cuda().retain_log.begin(), fake_cuda().retain_log.end(), 2), 3);
  EXPECT_EQ(std::count(fake_cuda().release_log.begin(), fake_cuda().release_log.end(), 2), 2)
      << "the warmup's retains pile up";
}

// ------------------------------------------------------------- workspaces
void* workspace(const DeviceInfo& d, cudaStream_t s, size_t bytes) {
  void* p = nullptr;
  host::WorkspaceLease lease;
  EXPECT_EQ(host::stream_workspace(d, s, bytes, &p, &lease), M3QKV_SUCCESS) << m3qkv_last_error();
  return p;
}
bool freed(void* p) {
  std::lock_guard<std::mutex> lock(fake_cuda().mu);
  return std::count(fake_cuda().frees.begin(), fake_cuda().frees.end(), p) > 0;
}

TEST_F(HostContext, WorkspaceIsZeroedOnceAndReused) {
  const DeviceInfo d = enter();
  const cudaStream_t s = fake_cuda().new_stream(current_ctx());
  void* p = workspace(d, s, 1000);
  ASSERT_EQ(fake_cuda().mallocs.size(), 1u);
  EXPECT_EQ(fake_cuda().mallocs[0].first, p);
  EXPECT_GE(fake_cuda().mallocs[0].second, 1000u);
  ASSERT_EQ(fake_cuda().memsets.size(), 1u);
  EXPECT_EQ(fake_cuda().memsets[0].first, p);
  EXPECT_EQ(fake_cuda().memsets[0].second, fake_cuda().mallocs[0].second) << "a small buffer is zeroed whole";
  const int calls = fake_cuda().calls.load();
  EXPECT_EQ(workspace(d, s, 1000), p);
  EXPECT_EQ(workspace(d, s, 10), p);
  EXPECT_EQ(fake_cuda().mallocs.size(), 1u);
  EXPECT_EQ(fake_cuda().memsets.size(), 1u);
  EXPECT_EQ(fake_cuda().calls.load() - calls, 6)
      << "a warm workspace costs two stream queries and the fence's record per call";
}

// The split-K decode launchers' view of the workspace: nothing for an
// unsplit plan; counters at the zeroed head, partials past the head (never
// inside it: a later plan's counters would find them there); a plan whose
// counters outgrow the head is an internal error, not a launch.
TEST_F(HostContext, SplitkWorkspaceBindsCountersAndPartials) {
  const DeviceInfo d = enter();
  const cudaStream_t s = fake_cuda().new_stream(current_ctx());
  m3qkv::splitk::Plan plan;
  plan.split = 1;
  plan.counter_bytes = 256;
  plan.partial_bytes = 4096;
  host::SplitkBuffers b;
  host::WorkspaceLease lease;
  b.counters = reinterpret_cast<uint32_t*>(uintptr_t{16});  // poisoned: the call must reset it
  ASSERT_EQ(host::splitk_workspace("f", d, s, plan, &b, &lease), M3QKV_SUCCESS) << m3qkv_last_error();
  EXPECT_EQ(b.counters, nullptr);
  EXPECT_EQ(b.partials, nullptr);
  EXPECT_TRUE(fake_cuda().mallocs.empty()) << "an unsplit plan takes no workspace";
  plan.split = 3;
  ASSERT_EQ(host::splitk_workspace("f", d, s, plan, &b, &lease), M3QKV_SUCCESS) << m3qkv_last_error();
  ASSERT_EQ(fake_cuda().mallocs.size(), 1u);
  EXPECT_GE(fake_cuda().mallocs[0].second, host::kWorkspaceZeroBytes + 4096);
  EXPECT_EQ(static_cast<void*>(b.counters), fake_cuda().mallocs[0].first);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(b.partials), reinterpret_cast<uint8_t*>(b.counters) + host::kWorkspaceZeroBytes);
  plan.counter_bytes = static_cast<int64_t>(host::kSplitkCounterBytesMax) + 256;
  EXPECT_EQ(host::splitk_workspace("sm90_fused_decode", d, s, plan, &b, &lease), M3QKV_ERROR_INTERNAL);
  EXPECT_NE(std::string(m3qkv_last_error()).find("sm90_fused_decode: 65536 counter bytes exceed"), std::string::npos)
      << m3qkv_last_error();
  EXPECT_EQ(fake_cuda().mallocs.size(), 1u);
}

// With extra bytes (the swap-AB kernel's converted activations): counters at
// the zeroed head, partials at the launch body's start, the extra bytes after
// them 256-B aligned; an unsplit plan has no counters or partials but still
// its extra bytes; the counter check still refuses a plan that outgrows the head.
TEST_F(HostContext, SplitkWorkspaceWithExtraBytesPutsThemAfterThePartials) {
  const DeviceInfo d = enter();
  const cudaStream_t s = fake_cuda().new_stream(current_ctx());
  m3qkv::splitk::Plan plan;
  plan.split = 3;
  plan.counter_bytes = 256;
  plan.partial_bytes = 4100;  // not a multiple of 256
  host::SplitkBuffers b;
  void* extra = reinterpret_cast<void*>(uintptr_t{16});  // poisoned: the call must set it
  {
    host::WorkspaceLease lease;
    ASSERT_EQ(host::splitk_workspace("f", d, s, plan, 1 << 20, &b, &extra, &lease), M3QKV_SUCCESS)
        << m3qkv_last_error();
    ASSERT_EQ(fake_cuda().async_mallocs.size(), 2u) << "the head and the body";
    EXPECT_EQ(static_cast<void*>(b.counters), fake_cuda().async_mallocs[0].first);
    EXPECT_EQ(static_cast<void*>(b.partials), fake_cuda().async_mallocs[1].first);
    EXPECT_EQ(static_cast<uint8_t*>(extra), reinterpret_cast<uint8_t*>(b.partials) + 4352);
    EXPECT_LE(d.context->stream_bytes, 2 * host::kWorkspaceZeroBytes) << "the body was kept in the stream workspace";
  }
  plan.split = 1;
  b.counters = reinterpret_cast<uint32_t*>(uintptr_t{16});
  {
    host::WorkspaceLease lease;
    ASSERT_EQ(host::splitk_workspace("f", d, s, plan, 4096, &b, &extra, &lease), M3QKV_SUCCESS) << m3qkv_last_error();
    EXPECT_EQ(b.counters, nullptr);
    EXPECT_EQ(b.partials, nullptr);
    ASSERT_EQ(fake_cuda().async_mallocs.size(), 3u);
    EXPECT_EQ(extra, fake_cuda().async_mallocs[2].first);
  }
  // A cluster plan splits without the workspace: no counters or partials
  // (the plan's byte counts are ignored), the extra bytes only; and the
  // split-only form allocates nothing.
  plan.split = 4;
  plan.cluster = 4;
  b.counters = reinterpret_cast<uint32_t*>(uintptr_t{16});
  b.partials = reinterpret_cast<float*>(uintptr_t{16});
  {
    host::WorkspaceLease lease;
    ASSERT_EQ(host::splitk_workspace("f", d, s, plan, 4096, &b, &extra, &lease), M3QKV_SUCCESS) << m3qkv_last_error();
    EXPECT_EQ(b.counters, nullptr);
    EXPECT_EQ(b.partials, nullptr);
    ASSERT_EQ(fake_cuda().async_mallocs.size(), 4u);
    EXPECT_EQ(extra, fake_cuda().async_mallocs[3].first);
    host::SplitkBuffers none;
    none.counters = reinterpret_cast<uint32_t*>(uintptr_t{16});
    host::WorkspaceLease lease2;
    ASSERT_EQ(host::splitk_workspace("f", d, s, plan, &none, &lease2), M3QKV_SUCCESS) << m3qkv_last_error();
    EXPECT_EQ(none.counters, nullptr);
    EXPECT_EQ(fake_cuda().async_mallocs.size(), 4u) << "a cluster plan allocated a workspace";
  }
  plan.cluster = 0;
  plan.split = 2;
  plan.counter_bytes = static_cast<int64_t>(host::kSplitkCounterBytesMax) + 256;
  host::WorkspaceLease lease;
  EXPECT_EQ(host::splitk_workspace("sm90_fused_decode", d, s, plan, 4096, &b, &extra, &lease), M3QKV_ERROR_INTERNAL);
  EXPECT_EQ(fake_cuda().async_mallocs.size(), 4u) << "allocated for a refused plan";
}

// A stream's outgrown buffer is freed at once (cudaFree waits for the work
// that used it); growth at least doubles, so a slowly growing request
// allocates rarely.
TEST_F(HostContext, StreamWorkspaceGrowsAndFreesTheOutgrownBuffer) {
  const DeviceInfo d = enter();
  const cudaStream_t s = fake_cuda().new_stream(current_ctx());
  void* small = workspace(d, s, 4096);
  void* big = workspace(d, s, size_t{1} << 20);
  EXPECT_NE(big, small);
  EXPECT_TRUE(freed(small)) << "the outgrown stream buffer was kept";
  ASSERT_EQ(fake_cuda().mallocs.size(), 2u);
  EXPECT_GE(fake_cuda().mallocs[1].second, size_t{1} << 20);
  ASSERT_EQ(fake_cuda().memsets.size(), 2u);
  EXPECT_EQ(fake_cuda().memsets[1].first, big);
  EXPECT_EQ(fake_cuda().memsets[1].second, host::kWorkspaceZeroBytes) << "only the counter region is zeroed";
  void* bigger = workspace(d, s, (size_t{1} << 20) + 1);
  ASSERT_EQ(fake_cuda().mallocs.size(), 3u);
  EXPECT_GE(fake_cuda().mallocs[2].second, size_t{2} << 20);
  EXPECT_EQ(workspace(d, s, (size_t{2} << 20) - 1), bigger);
  EXPECT_EQ(fake_cuda().mallocs.size(), 3u);
  EXPECT_TRUE(freed(big));
  EXPECT_FALSE(freed(bigger));
  EXPECT_EQ(d.context->stream_bytes, fake_cuda().mallocs[2].second);
}

TEST_F(HostContext, WorkspacePerStreamAndPerContext) {
  const DeviceInfo d = enter();
  const cudaStream_t s1 = fake_cuda().new_stream(current_ctx());
  const cudaStream_t s2 = fake_cuda().new_stream(current_ctx());
  void* a = workspace(d, s1, 256);
  void* b = workspace(d, s2, 256);
  void* legacy = workspace(d, nullptr, 256);
  EXPECT_EQ(std::set<void*>({a, b, legacy}).size(), 3u);
  EXPECT_EQ(workspace(d, s1, 256), a);
  fake_cuda().reset_primary(1);
  const DeviceInfo fresh = enter();
  void* c = workspace(fresh, s1, 256);
  EXPECT_NE(c, a) << "a buffer of a dead context was handed out";
}

TEST_F(HostContext, WorkspaceAllocationRelaxesTheCaptureMode) {
  const DeviceInfo d = enter();
  const cudaStream_t s = fake_cuda().new_stream(current_ctx());
  workspace(d, s, 256);
  ASSERT_EQ(fake_cuda().capture_modes.size(), 2u);
  EXPECT_EQ(fake_cuda().capture_modes[0], cudaStreamCaptureModeRelaxed);
  EXPECT_EQ(fake_cuda().capture_modes[1], cudaStreamCaptureModeGlobal) << "the thread's mode was not restored";
  EXPECT_EQ(t_capture_mode, cudaStreamCaptureModeGlobal);
}

// A stream's own workspace is zeroed on that stream, and the call does not
// wait on the host (workspace.h). A capture workspace is zeroed on m3qkv's
// own stream, synchronously, never on the capturing stream.
TEST_F(HostContext, WorkspaceZeroingIsStreamOrderedOutsideCapture) {
  const DeviceInfo d = enter();
  const cudaStream_t s = fake_cuda().new_stream(current_ctx());
  void* direct = workspace(d, s, 256);
  ASSERT_EQ(fake_cuda().memset_streams.size(), 1u);
  EXPECT_EQ(fake_cuda().memsets[0].first, direct);
  EXPECT_EQ(fake_cuda().memset_streams[0], s) << "not zeroed on the caller's stream";
  EXPECT_TRUE(fake_cuda().synchronized.empty()) << "a direct call waited on the host for the zeroing";
  EXPECT_EQ(fake_cuda().streams_created, 0) << "a direct call made a stream";
  workspace(d, s, size_t{1} << 20);  // growth: the same rule
  ASSERT_EQ(fake_cuda().memset_streams.size(), 2u);
  EXPECT_EQ(fake_cuda().memset_streams[1], s);
  EXPECT_TRUE(fake_cuda().synchronized.empty());
  fake_begin_capture(s);
  void* captured = workspace(d, s, 256);
  ASSERT_EQ(fake_cuda().memset_streams.size(), 3u);
  EXPECT_EQ(fake_cuda().memsets[2].first, captured);
  EXPECT_EQ(fake_cuda().streams_created, 1) << "no zeroing stream of m3qkv's own";
  const cudaStream_t zero = fake_cuda().memset_streams[2];
  EXPECT_NE(zero, s) << "a capture workspace was zeroed on the capturing stream (the memset would be captured)";
  ASSERT_EQ(fake_cuda().synchronized.size(), 1u);
  EXPECT_EQ(fake_cuda().synchronized[0], zero) << "the capture workspace's zeroing was not waited for";
  const cudaStream_t s2 = fake_cuda().new_stream(current_ctx());
  fake_begin_capture(s2);
  workspace(d, s2, 256);
  EXPECT_EQ(fake_cuda().streams_created, 1) << "one zeroing stream per context";
  EXPECT_EQ(fake_cuda().memset_streams.back(), zero);
}

TEST_F(HostContext, WorkspaceFailureIsReportedAndRetried) {
  const DeviceInfo d = enter();
  const cudaStream_t s = fake_cuda().new_stream(current_ctx());
  fake_cuda().malloc_err = cudaErrorMemoryAllocation;
  void* p = nullptr;
  {
    host::WorkspaceLease lease;
    EXPECT_EQ(host::stream_workspace(d, s, 256, &p, &lease), M3QKV_ERROR_CUDA_ERROR);
  }
  EXPECT_NE(std::string(m3qkv_last_error()).find("cudaErrorMemoryAllocation"), std::string::npos)
      << m3qkv_last_error();
  EXPECT_EQ(t_capture_mode, cudaStreamCaptureModeGlobal) << "a failure left the capture mode relaxed";
  fake_cuda().malloc_err = cudaSuccess;
  EXPECT_NE(workspace(d, s, 256), nullptr);
}

TEST_F(HostContext, WorkspaceUnderConcurrentFirstCalls) {
  const DeviceInfo d = enter();
  const cudaStream_t s = fake_cuda().new_stream(current_ctx());
  std::vector<void*> got(16, nullptr);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t) threads.emplace_back([&, t] { got[t] = workspace(d, s, 8192); });
  for (auto& th : threads) th.join();
  EXPECT_EQ(fake_cuda().mallocs.size(), 1u);
  for (void* p : got) EXPECT_EQ(p, got[0]);
}

}  // namespace

namespace {

// Each capture sequence has its own workspace (keyed by the capture id, not
// the stream handle), apart from the stream's direct one; a second capture
// on the same stream gets another.
TEST_F(HostContext, WorkspaceWhileCapturingIsTheCapturesOwn) {
  const DeviceInfo d = enter();
  const cudaStream_t s = fake_cuda().new_stream(current_ctx());
  void* direct = workspace(d, s, 256);
  fake_begin_capture(s);
  void* first = workspace(d, s, 256);
  EXPECT_NE(first, direct) << "a graph would share the buffer of direct calls on other streams' replays";
  EXPECT_EQ(workspace(d, s, 256), first) << "one capture, one workspace";
  fake_begin_capture(s);  // the next capture on the same stream
  void* second = workspace(d, s, 256);
  EXPECT_NE(second, first) << "two graphs captured on one stream share a workspace (they may replay concurrently)";
  {
    std::lock_guard<std::mutex> lock(fake_cuda().mu);
    fake_cuda().capturing.clear();
  }
  EXPECT_EQ(workspace(d, s, 256), direct);
  EXPECT_FALSE(freed(first));
  EXPECT_FALSE(freed(second));
  EXPECT_EQ(fake_cuda().user_objects.size(), 2u) << "each captured graph owns its workspace's lifetime";
}

// A capture workspace outgrown during the capture stays (nodes captured
// earlier use it); everything goes when the graph is destroyed, freed by the
// next call that is not capturing (the user object's destructor may make no
// CUDA call), never while the calling stream captures.
TEST_F(HostContext, CaptureWorkspaceLivesAsLongAsItsGraph) {
  const DeviceInfo d = enter();
  const cudaStream_t s = fake_cuda().new_stream(current_ctx());
  const cudaStream_t other = fake_cuda().new_stream(current_ctx());
  fake_begin_capture(s);
  void* small = workspace(d, s, 4096);
  void* big = workspace(d, s, size_t{1} << 20);
  EXPECT_FALSE(freed(small)) << "an outgrown capture buffer was freed during its capture";
  {
    std::lock_guard<std::mutex> lock(fake_cuda().mu);
    fake_cuda().capturing.clear();
  }
  fake_begin_capture(other);
  workspace(d, other, 256);  // another capture meanwhile
  fake_destroy_graphs();     // both graphs destroyed
  workspace(d, other, 256);  // still capturing: nothing freed from here
  EXPECT_FALSE(freed(small));
  EXPECT_FALSE(freed(big));
  {
    std::lock_guard<std::mutex> lock(fake_cuda().mu);
    fake_cuda().capturing.clear();
  }
  workspace(d, s, 256);  // the next direct call frees the dead graphs' buffers
  EXPECT_TRUE(freed(small));
  EXPECT_TRUE(freed(big));
}

// Stream workspaces are bounded per context (kMaxStreamWorkspaces streams,
// kStreamWorkspaceBudget bytes): a server that makes a stream per request
// keeps the most recent ones; a stream in steady use is never the one freed.
TEST_F(HostContext, StreamWorkspacesAreBoundedLeastRecentlyUsedFirst) {
  const DeviceInfo d = enter();
  const cudaStream_t hot = fake_cuda().new_stream(current_ctx());
  void* hot_ws = workspace(d, hot, 4096);
  std::vector<void*> churn;
  for (int i = 0; i < 3 * host::kMaxStreamWorkspaces; ++i) {
    churn.push_back(workspace(d, fake_cuda().new_stream(current_ctx()), 4096));
    EXPECT_EQ(workspace(d, hot, 4096), hot_ws) << "the stream in use lost its workspace at " << i;
  }
  int live = 0;
  for (void* p : churn) live += freed(p) ? 0 : 1;
  EXPECT_EQ(live, host::kMaxStreamWorkspaces - 1) << "the hot stream and the newest streams stay";
  for (size_t i = churn.size() - (host::kMaxStreamWorkspaces - 1); i < churn.size(); ++i)
    EXPECT_FALSE(freed(churn[i])) << "a recent stream was freed before an older one: " << i;
  EXPECT_FALSE(freed(hot_ws));
  // Each eviction is ordered after the evicted stream's fence, on the calling stream.
  EXPECT_EQ(fake_cuda().event_waits.size(), churn.size() - (host::kMaxStreamWorkspaces - 1));
  EXPECT_EQ(fake_cuda().async_frees.size(), fake_cuda().event_waits.size());
  for (size_t i = 0; i < fake_cuda().async_frees.size(); ++i)
    EXPECT_EQ(fake_cuda().async_frees[i].second, fake_cuda().event_waits[i].first) << "freed before the wait: " << i;
  // The byte budget: streams of a third of it each.
  const size_t third = host::kStreamWorkspaceBudget / 3 - (size_t{1} << 20);
  void* w[4];
  for (void*& p : w) p = workspace(d, fake_cuda().new_stream(current_ctx()), third);
  EXPECT_TRUE(freed(w[0])) << "more than the budget kept";
  EXPECT_FALSE(freed(w[1]) || freed(w[2]) || freed(w[3]));
  EXPECT_LE(d.context->stream_bytes, host::kStreamWorkspaceBudget);
}

// No buffer is freed while a lease on it is held (from the lookup through
// the launch): the eviction waits for it.
TEST_F(HostContext, StreamWorkspaceIsNotFreedUnderALease) {
  const DeviceInfo d = enter();
  const cudaStream_t s = fake_cuda().new_stream(current_ctx());
  void* p = nullptr;
  auto lease = std::make_unique<host::WorkspaceLease>();
  ASSERT_EQ(host::stream_workspace(d, s, 4096, &p, lease.get()), M3QKV_SUCCESS) << m3qkv_last_error();
  std::atomic<bool> done{false};
  std::thread churn([&] {
    fake_set_current_device(1);
    (void)enter();
    for (int i = 0; i < host::kMaxStreamWorkspaces + 1; ++i) workspace(d, fake_cuda().new_stream(current_ctx()), 256);
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(freed(p)) << "freed under a lease";
  EXPECT_FALSE(done.load()) << "the eviction did not wait for the lease";
  lease.reset();
  churn.join();
  EXPECT_TRUE(freed(p)) << "the least recently used stream was not the one freed";
}

// The prefill paths' launch body: stream-ordered from the pool outside
// capture (freed on the stream when the lease ends, after the launch), past
// the head of the capture's workspace during one.
TEST_F(HostContext, LaunchWorkspaceBodyIsStreamOrderedOutsideCapture) {
  const DeviceInfo d = enter();
  const cudaStream_t s = fake_cuda().new_stream(current_ctx());
  void *head = nullptr, *body = nullptr;
  {
    host::WorkspaceLease lease;
    ASSERT_EQ(host::launch_workspace(d, s, size_t{80} << 20, &head, &body, &lease), M3QKV_SUCCESS)
        << m3qkv_last_error();
    ASSERT_EQ(fake_cuda().async_mallocs.size(), 2u) << "the head and the body";
    EXPECT_EQ(fake_cuda().async_mallocs[1], std::make_pair(body, s));
    EXPECT_TRUE(fake_cuda().async_frees.empty()) << "the body was given back before the launch";
    EXPECT_TRUE(fake_cuda().event_records.empty()) << "the fence was recorded before the launch";
    EXPECT_LE(d.context->stream_bytes, 2 * host::kWorkspaceZeroBytes) << "the body was kept in the stream workspace";
  }
  ASSERT_EQ(fake_cuda().async_frees.size(), 1u);
  EXPECT_EQ(fake_cuda().async_frees[0], std::make_pair(body, s));
  ASSERT_EQ(fake_cuda().event_records.size(), 1u) << "the head's fence was not recorded after the launch";
  EXPECT_EQ(fake_cuda().event_records[0].second, s);
  EXPECT_EQ(workspace(d, s, 256), head);
  const size_t before_capture = fake_cuda().async_mallocs.size();
  fake_begin_capture(s);
  {
    host::WorkspaceLease lease;
    ASSERT_EQ(host::launch_workspace(d, s, 4096, &head, &body, &lease), M3QKV_SUCCESS) << m3qkv_last_error();
    EXPECT_EQ(static_cast<uint8_t*>(body), static_cast<uint8_t*>(head) + host::kWorkspaceZeroBytes);
  }
  for (size_t i = before_capture; i < fake_cuda().async_mallocs.size(); ++i)
    EXPECT_NE(fake_cuda().async_mallocs[i].second, s) << "a stream-ordered allocation on the capturing stream (a node of the graph)";
  EXPECT_EQ(fake_cuda().event_records.size(), 2u) << "a fence recorded into the graph";  // 2: the workspace() call
}

// A stream's workspace is freed by release_stream_workspace; another
// stream's stays; the released stream gets a fresh zeroed one on its next
// use (m3qkv_selftest's own stream).
TEST_F(HostContext, ReleaseStreamWorkspaceFreesThatStreamsBuffersOnly) {
  const DeviceInfo d = enter();
  const cudaStream_t mine = fake_cuda().new_stream(current_ctx());
  const cudaStream_t other = fake_cuda().new_stream(current_ctx());
  void* theirs = workspace(d, other, 4096);
  void* big = workspace(d, mine, size_t{1} << 20);  // this thread's cache names big
  const size_t frees = fake_cuda().frees.size();
  ASSERT_EQ(host::release_stream_workspace("test", d, mine), M3QKV_SUCCESS) << m3qkv_last_error();
  EXPECT_EQ(std::set<void*>(fake_cuda().frees.begin() + static_cast<std::ptrdiff_t>(frees), fake_cuda().frees.end()),
            (std::set<void*>{big}));
  EXPECT_EQ(workspace(d, other, 4096), theirs) << "another stream's workspace changed";
  const size_t mallocs = fake_cuda().mallocs.size();
  void* fresh = workspace(d, mine, 4096);  // this thread's cache must not hand out the freed buffer
  EXPECT_NE(fresh, big);
  EXPECT_EQ(fake_cuda().mallocs.size(), mallocs + 1);
  EXPECT_EQ(fake_cuda().memsets.back().first, fresh) << "the fresh workspace was not zeroed";
  // Nothing to release: no CUDA call fails, nothing freed.
  const size_t frees2 = fake_cuda().frees.size();
  EXPECT_EQ(host::release_stream_workspace("test", d, fake_cuda().new_stream(current_ctx())), M3QKV_SUCCESS);
  EXPECT_EQ(fake_cuda().frees.size(), frees2);
}

// m3qkv_release_stream's form (refuse_capture): while the stream captures it
// is refused by name and frees nothing; after the capture the stream's
// direct workspace is released and the capture's, which the captured graph
// uses, stays.
TEST_F(HostContext, ReleaseStreamWorkspaceRefusedDuringCaptureKeepsCaptureWorkspaces) {
  const DeviceInfo d = enter();
  const cudaStream_t s = fake_cuda().new_stream(current_ctx());
  void* direct = workspace(d, s, 256);
  fake_begin_capture(s);
  void* captured = workspace(d, s, 256);
  const size_t frees = fake_cuda().frees.size();
  EXPECT_EQ(host::release_stream_workspace("m3qkv_release_stream", d, s, true), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(m3qkv_last_error()).find("m3qkv_release_stream: stream"), std::string::npos)
      << m3qkv_last_error();
  EXPECT_NE(std::string(m3qkv_last_error()).find("capturing"), std::string::npos) << m3qkv_last_error();
  EXPECT_EQ(fake_cuda().frees.size(), frees) << "a refused release freed memory";
  {
    std::lock_guard<std::mutex> lock(fake_cuda().mu);
    fake_cuda().capturing.clear();
  }
  ASSERT_EQ(host::release_stream_workspace("m3qkv_release_stream", d, s, true), M3QKV_SUCCESS) << m3qkv_last_error();
  EXPECT_EQ(std::set<void*>(fake_cuda().frees.begin() + static_cast<std::ptrdiff_t>(frees), fake_cuda().frees.end()),
            (std::set<void*>{direct}));
  EXPECT_FALSE(freed(captured));
}

TEST_F(HostContext, WorkspacesOfLivePrimaryContextsAreFreedAtExit) {
  const DeviceInfo d1 = enter();  // device 1's primary context
  void* a = workspace(d1, fake_cuda().new_stream(current_ctx()), 256);
  void* b = workspace(d1, nullptr, 1 << 20);
  const cudaStream_t cs = fake_cuda().new_stream(current_ctx());
  fake_begin_capture(cs);
  void* c_small = workspace(d1, cs, 256);
  void* c_big = workspace(d1, cs, 1 << 20);
  {
    std::lock_guard<std::mutex> lock(fake_cuda().mu);
    fake_cuda().capturing.clear();
  }
  fake_set_current_device(2);
  const DeviceInfo d2 = enter();
  void* dead = workspace(d2, nullptr, 256);
  fake_cuda().reset_primary(2);  // that context died (cudaDeviceReset): its memory went with it
  host::release_workspaces();
  std::set<void*> freed_set(fake_cuda().frees.begin(), fake_cuda().frees.end());
  EXPECT_EQ(freed_set, (std::set<void*>{a, b, c_small, c_big}));
  EXPECT_EQ(freed_set.count(dead), 0u) << "a dead context's pointer was freed (it may be someone else's now)";
  EXPECT_EQ(t_ctx_stack.size(), 1u);
}

}  // namespace

namespace {

// ---------------------------------------------------------- checked mode
using m3qkv::api::Extent;

class CheckedMode : public HostContext {
 protected:
  void allocate(uintptr_t lo, size_t bytes, unsigned type = CU_MEMORYTYPE_DEVICE, int device = 1,
                size_t mapped = SIZE_MAX, bool managed = false) {
    std::lock_guard<std::mutex> lock(fake_cuda().mu);
    fake_cuda().allocations.push_back({lo, bytes, mapped == SIZE_MAX ? bytes : mapped, type, device, managed});
  }
  m3qkv_status check(const Extent& x) {
    m3qkv::api::Extents e;
    e.items[0] = x;
    e.count = 1;
    return m3qkv::api::check_pointers("f", enter(), e);
  }
  static Extent buffer(const char* name, uintptr_t lo, uint64_t bytes) { return Extent{name, lo, bytes, bytes, 1, false}; }
};

TEST_F(CheckedMode, DeviceMemoryOfTheCallsDeviceInsideItsAllocationPasses) {
  allocate(0x100000, 4096);
  EXPECT_EQ(check(buffer("xq", 0x100000, 4096)), M3QKV_SUCCESS) << m3qkv_last_error();
  EXPECT_EQ(check(buffer("xq", 0x100800, 2048)), M3QKV_SUCCESS) << "a tensor inside a larger allocation";
  EXPECT_EQ(check(Extent{"kv_cache", 0x100000, 100, 1000, 4, true}), M3QKV_SUCCESS);
  allocate(0x200000, 4096, CU_MEMORYTYPE_DEVICE, 0, SIZE_MAX, /*managed=*/true);
  EXPECT_EQ(check(buffer("x", 0x200000, 16)), M3QKV_SUCCESS) << "managed memory runs anywhere";
}

TEST_F(CheckedMode, HostAndUnknownPointersAreRejected) {
  allocate(0x300000, 4096, CU_MEMORYTYPE_HOST);
  EXPECT_EQ(check(buffer("xq", 0x300000, 16)), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(m3qkv_last_error()).find("f: xq = 0x300000 is host memory"), std::string::npos)
      << m3qkv_last_error();
  EXPECT_EQ(check(buffer("wq", 0x999000, 16)), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(m3qkv_last_error()).find("f: wq = 0x999000 is not memory CUDA knows"), std::string::npos)
      << m3qkv_last_error();
}

TEST_F(CheckedMode, AnotherDevicesMemoryIsRejected) {
  allocate(0x100000, 4096, CU_MEMORYTYPE_DEVICE, 3);
  EXPECT_EQ(check(buffer("q_out", 0x100000, 16)), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(m3qkv_last_error()).find("q_out = 0x100000 is memory of device 3; the call runs on device 1"),
            std::string::npos)
      << m3qkv_last_error();
}

TEST_F(CheckedMode, ABufferOneByteTooSmallIsRejected) {
  allocate(0x100000, 4095);
  EXPECT_EQ(check(buffer("xq", 0x100000, 4096)), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(m3qkv_last_error()).find("ends 1 bytes earlier"), std::string::npos) << m3qkv_last_error();
  // A cache whose last page runs past the allocation.
  allocate(0x200000, 3 * 1000 + 99);
  EXPECT_EQ(check(Extent{"kv_cache", 0x200000, 100, 1000, 4, true}), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(m3qkv_last_error()).find("kv_cache = 0x200000"), std::string::npos) << m3qkv_last_error();
}

TEST_F(CheckedMode, ABufferPastItsVmmMappingIsRejected) {
  // A reservation of 2 MiB with only its first 1 MiB mapped.
  allocate(0x400000, 2 << 20, CU_MEMORYTYPE_DEVICE, 1, 1 << 20);
  EXPECT_EQ(check(buffer("x", 0x400000, 1 << 20)), M3QKV_SUCCESS) << m3qkv_last_error();
  EXPECT_EQ(check(buffer("x", 0x400000, (1 << 20) + 1)), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(m3qkv_last_error()).find("its last byte is not mapped"), std::string::npos)
      << m3qkv_last_error();
  EXPECT_EQ(check(buffer("x", 0x400000 + (1 << 20), 16)), M3QKV_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(m3qkv_last_error()).find("not mapped"), std::string::npos) << m3qkv_last_error();
}

}  // namespace

namespace {

// cuTensorMapEncodeTiled costs microseconds: each thread keeps the maps it
// encoded, keyed by every argument of the encoder.
TEST_F(HostContext, TensorMapsAreEncodedOncePerThreadAndKey) {
  const auto encode = [](uintptr_t base, uint64_t rows, uint32_t box_rows, CUtensorMap* out) {
    return m3qkv::host::make_tensor_map_2d_u8("f", out, "xq", reinterpret_cast<const void*>(base), 6144, rows, 6144,
                                              128, box_rows, CU_TENSOR_MAP_SWIZZLE_128B);
  };
  const int before = fake_cuda().encodes.load();
  CUtensorMap a, b, c, d;
  ASSERT_EQ(encode(0x7000000, 7, 64, &a), M3QKV_SUCCESS);
  ASSERT_EQ(encode(0x7000000, 7, 64, &b), M3QKV_SUCCESS);
  EXPECT_EQ(fake_cuda().encodes.load() - before, 1);
  EXPECT_EQ(std::memcmp(&a, &b, sizeof(a)), 0);
  ASSERT_EQ(encode(0x7000000, 8, 64, &c), M3QKV_SUCCESS);   // another M
  ASSERT_EQ(encode(0x7000000, 7, 128, &d), M3QKV_SUCCESS);  // another box
  EXPECT_EQ(fake_cuda().encodes.load() - before, 3);
  EXPECT_NE(std::memcmp(&a, &c, sizeof(a)), 0);
  EXPECT_NE(std::memcmp(&a, &d, sizeof(a)), 0);
  ASSERT_EQ(encode(0x7000000, 7, 64, &b), M3QKV_SUCCESS);
  EXPECT_EQ(std::memcmp(&a, &b, sizeof(a)), 0);
  EXPECT_EQ(fake_cuda().encodes.load() - before, 3);
  std::thread([&] { EXPECT_EQ(encode(0x7000000, 7, 64, &b), M3QKV_SUCCESS); }).join();
  EXPECT_EQ(fake_cuda().encodes.load() - before, 4) << "the cache is per thread";
  // A rejected map is not cached.
  EXPECT_EQ(encode(0x7000001, 7, 64, &b), M3QKV_ERROR_MISALIGNED);
  EXPECT_EQ(encode(0x7000001, 7, 64, &b), M3QKV_ERROR_MISALIGNED);
}

}  // namespace

// The one launch-configuration builder: each attribute of the shape once, in
// the fixed order PDL, cluster, cooperative; none for a plain launch.
TEST(HostLaunch, ConfigCarriesEachRequestedAttribute) {
  cudaLaunchAttribute attr[host::kMaxLaunchAttrs];
  host::LaunchShape s;
  s.grid = 132;
  s.threads = 512;
  s.smem = 200 << 10;
  cudaLaunchConfig_t c = host::launch_config(s, nullptr, attr);
  EXPECT_EQ(c.numAttrs, 0u);
  EXPECT_EQ(c.gridDim.x, 132u);
  EXPECT_EQ(c.blockDim.x, 512u);
  EXPECT_EQ(c.dynamicSmemBytes, size_t{200} << 10);
  s.pdl = true;
  s.cluster = 2;
  s.cooperative = true;
  c = host::launch_config(s, nullptr, attr);
  ASSERT_EQ(c.numAttrs, 3u);
  EXPECT_EQ(c.attrs[0].id, cudaLaunchAttributeProgrammaticStreamSerialization);
  EXPECT_EQ(c.attrs[0].val.programmaticStreamSerializationAllowed, 1);
  EXPECT_EQ(c.attrs[1].id, cudaLaunchAttributeClusterDimension);
  EXPECT_EQ(c.attrs[1].val.clusterDim.x, 2u);
  EXPECT_EQ(c.attrs[2].id, cudaLaunchAttributeCooperative);
  EXPECT_EQ(c.attrs[2].val.cooperative, 1);
  s.pdl = false;
  s.cluster = 0;
  c = host::launch_config(s, nullptr, attr);
  ASSERT_EQ(c.numAttrs, 1u);
  EXPECT_EQ(c.attrs[0].id, cudaLaunchAttributeCooperative);
}
