// The device memory m3qkv keeps for its kernels between CTAs and launches:
// split-K arrival counters and partial sums, the prefill paths' bf16 copies.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <shared_mutex>

#include "common/splitk_plan.h"
#include "host/device.h"

namespace m3qkv::host {

// Bytes at the start of every workspace that are zero when it is handed out
// for the first time: kernels keep counters there and leave them zero.
constexpr size_t kWorkspaceZeroBytes = size_t{64} << 10;
// The head's last 256 bytes: the grid barrier of the one-launch SM90 prefill
// paths (sm90/convert_sm90.cuh): word 0 an arrival count (left zero), word 1
// a generation (any value; it only moves forward). Split-K counters stay
// below it.
constexpr size_t kGridSyncOffset = kWorkspaceZeroBytes - 256;
constexpr size_t kSplitkCounterBytesMax = kGridSyncOffset;

// The memory m3qkv keeps, per context:
//  - A stream's workspace, for calls on a stream that is not capturing: one
//    buffer per stream, named by its cudaStreamGetId (unique in the process,
//    unlike handles, which are reused). Bounded: at most
//    kMaxStreamWorkspaces streams and kStreamWorkspaceBudget bytes per
//    context; past either, the least recently used other streams' buffers
//    are freed (a stream that was destroyed is never used again, so a server
//    that makes a stream per request keeps at most the budget). Nothing in a
//    launch path waits on the host: buffers come from the device's current
//    memory pool (cudaMallocAsync) and go back stream-ordered (cudaFreeAsync):
//    an outgrown one on its own stream, an evicted one on the calling stream
//    after it waited for the evicted stream's fence (an event recorded after
//    every launch that used the buffer; its stream may be gone by then).
//  - A capture's workspace, for calls on a stream that captures a graph:
//    one per capture sequence (the id of cudaStreamGetCaptureInfo), so graphs
//    captured by different threads, on cudaStreamPerThread or on a reused
//    handle, never share one, and any two graphs may be replayed
//    concurrently. It lives as long as the graph: a user object the graph
//    owns queues it when the graph and its executable graphs are destroyed
//    and their launches are done, and the next m3qkv call in the context that
//    is not capturing frees it (on m3qkv's own stream). Allocated from the
//    pool on m3qkv's own stream too (never a node of the graph).
//  - Launch bodies (launch_workspace: the prefill paths' bf16 copies of x and
//    w) outside capture: stream-ordered from the device's current memory
//    pool (cudaMallocAsync / cudaFreeAsync on the call's stream around the
//    launch), so they are shared by every stream and go back to the driver
//    at the pool's release threshold (CUDA's default: at synchronization).
// A workspace's first min(kWorkspaceZeroBytes, size) bytes were zeroed when
// it was allocated; kernels keep their counters there and leave them zero;
// the rest holds whatever earlier calls left. A stream's workspace is zeroed
// by a cudaMemsetAsync on that stream (only launches on it use the buffer,
// so stream order suffices and a direct call never waits on the host); a
// capture's on m3qkv's own non-blocking stream and synchronously (a memset
// captured in the graph would run on every replay).
// Allocations and frees run with the thread's capture mode relaxed
// (RelaxedCaptureMode), so they are legal while any stream captures.
// Thread-safe; a warm call takes the context's lock shared, one atomic tick,
// two CUDA queries (cudaStreamGetCaptureInfo, cudaStreamGetId) and, outside
// capture, one cudaEventRecord.
constexpr int kMaxStreamWorkspaces = 64;
constexpr size_t kStreamWorkspaceBudget = size_t{256} << 20;

// Held from a workspace lookup through the launch that uses it: the context's
// workspace lock shared (no buffer handed out is freed meanwhile); when it
// ends, the stream workspace's fence is recorded on the stream (after the
// launch) and the launch body given back (cudaFreeAsync on the stream).
class WorkspaceLease {
 public:
  WorkspaceLease() = default;
  ~WorkspaceLease();
  WorkspaceLease(const WorkspaceLease&) = delete;
  WorkspaceLease& operator=(const WorkspaceLease&) = delete;

 private:
  friend struct LeaseAccess;  // workspace.cpp
  std::shared_lock<std::shared_mutex> lock_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t fence_ = nullptr;  // recorded on stream_ when the lease ends
  void* body_ = nullptr;         // freed on stream_ when the lease ends
};

// *out = at least `bytes` bytes of the workspace of (dev.context, stream):
// the stream's, or while it captures the capture's (rules above), valid while
// `lease` lives. Call with dev from enter_* (its context current).
m3qkv_status stream_workspace(const DeviceInfo& dev, cudaStream_t stream, size_t bytes, void** out,
                              WorkspaceLease* lease);
// *head = the zeroed head (kWorkspaceZeroBytes) of the workspace, *body =
// `body_bytes` bytes for this launch: stream-ordered from the memory pool
// outside capture, past the head of the capture's workspace during one; both
// valid while `lease` lives.
m3qkv_status launch_workspace(const DeviceInfo& dev, cudaStream_t stream, size_t body_bytes, void** head,
                              void** body, WorkspaceLease* lease);

// The split-K decode kernels' buffers in the stream workspace
// (common/splitk_plan.h): the arrival counters in the zeroed head
// (plan.counter_bytes of it; the kernels leave them zero) and the partial
// slots from kSplitkPartialsOffset, past the head, so that nothing but
// counters is ever written into the head: partials right after one plan's
// counters would leave a later plan with more counters on the same stream
// (e.g. TP2 at M <= 128, then M 129..256) counters dirty with partial sums,
// and its last-arriver test `arrived == split - 1` would never fire. Both
// null when the plan does not reduce through L2 (splitk::reduces_through_l2). `fn` names the launcher in the message of a plan
// whose counters outgrow the head.
constexpr size_t kSplitkPartialsOffset = kWorkspaceZeroBytes;
inline size_t splitk_workspace_bytes(const splitk::Plan& plan) {
  return kSplitkPartialsOffset + static_cast<size_t>(plan.partial_bytes);
}
struct SplitkBuffers {
  uint32_t* counters = nullptr;
  float* partials = nullptr;
};
m3qkv_status splitk_workspace(const char* fn, const DeviceInfo& dev, cudaStream_t stream, const splitk::Plan& plan,
                              SplitkBuffers* out, WorkspaceLease* lease);
// The same with `extra_bytes` for the launch besides (the swap-AB kernel's
// converted activations): the counters in the zeroed head as above, the
// partials and then the extra bytes (*extra, 256-B aligned) in the launch
// body (launch_workspace: from the memory pool outside capture, so a large
// M does not grow the stream's workspace).
m3qkv_status splitk_workspace(const char* fn, const DeviceInfo& dev, cudaStream_t stream, const splitk::Plan& plan,
                              size_t extra_bytes, SplitkBuffers* out, void** extra, WorkspaceLease* lease);

// Frees the workspace of `stream` under its current key (while it captures,
// its capture's workspace: only for a capture that will be abandoned), so a
// caller that destroys its stream gets the memory back before the budget
// would free it (m3qkv_selftest: its own stream; m3qkv_release_stream). A
// later call on the stream gets a fresh (zeroed) workspace. With
// refuse_capture (the public m3qkv_release_stream) a capturing stream is
// refused instead: its graph keeps its workspace. `fn` names the entry point.
m3qkv_status release_stream_workspace(const char* fn, const DeviceInfo& dev, cudaStream_t stream,
                                      bool refuse_capture = false);

// Frees every workspace of each device's live primary context (runs once at
// process exit; public for the CPU test).
void release_workspaces();

}  // namespace m3qkv::host
