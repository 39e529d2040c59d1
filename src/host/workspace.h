// Device workspace per (context, stream), for kernels that need scratch
// memory across CTAs (split-K arrival counters and partial sums).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

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

// *out = a device buffer of at least `bytes` bytes owned by m3qkv for the
// pair (dev.context, stream). A stream is named by its cudaStreamGetId
// (unique in the process, unlike handles, which are reused) when it is not
// capturing, and by its handle while it captures (the runtime refuses
// cudaStreamGetId then): the graphs captured on one stream share that
// stream's capture workspace, so replay them in order, as a serving loop
// does, not concurrently with each other.
//  - Its first min(kWorkspaceZeroBytes, size) bytes were zeroed when it was
//    allocated; the rest holds whatever earlier calls left. A stream's own
//    workspace is zeroed by a cudaMemsetAsync on that stream (only launches
//    on it use the buffer, so stream order suffices): a direct call never
//    waits on the host for device work, as zeroing on a side stream and
//    waiting for it would (a round trip on each new stream's first call, and
//    a wait that the stream tests forbid). A capture workspace is zeroed on
//    m3qkv's own stream and synchronously (a memset captured in the graph
//    would run on every replay; its graphs may be replayed on any stream),
//    so a first call under capture waits for that zeroing.
//  - Grown on demand (to max(bytes, 2 x the old size)). The outgrown buffer
//    is kept, not freed: earlier launches, or a CUDA graph captured earlier,
//    may still use it.
//  - Legal during stream capture: the allocation runs with the thread's
//    capture mode exchanged to relaxed (cudaThreadExchangeStreamCaptureMode,
//    the CUDA-documented way for a library to cudaMalloc while a capture is
//    open), and the zeroing runs on a non-blocking stream of m3qkv's own, so
//    nothing joins the captured stream. (cudaMallocAsync on the stream would
//    make a graph-owned allocation that a later direct call could not use.)
//  - Thread-safe; once a stream's buffer is large enough a call allocates
//    nothing and takes no lock on the thread that used it last (O(1)
//    otherwise): two CUDA queries (cudaStreamIsCapturing, cudaStreamGetId).
//  - Freed at process exit for the primary contexts still alive then (so
//    leak checkers stay quiet); buffers of a context that died went with it;
//    release_stream_workspace frees one stream's before then.
// Call with dev from enter_* (its context current).
m3qkv_status stream_workspace(const DeviceInfo& dev, cudaStream_t stream, size_t bytes, void** out);

// The split-K decode kernels' buffers in the stream workspace
// (common/splitk_plan.h): the arrival counters in the zeroed head
// (plan.counter_bytes of it; the kernels leave them zero) and the partial
// slots from kSplitkPartialsOffset, past the head, so that nothing but
// counters is ever written into the head: partials right after one plan's
// counters would leave a later plan with more counters on the same stream
// (e.g. TP2 at M <= 128, then M 129..256) counters dirty with partial sums,
// and its last-arriver test `arrived == split - 1` would never fire. Both
// null when the plan does not split. `fn` names the launcher in the message of a plan
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
                              SplitkBuffers* out);

// Frees the workspaces of (dev.context, stream), the current one and any it
// outgrew, so that a caller that destroys its stream leaves no device memory
// behind (m3qkv_selftest: its own stream). Only for a stream whose work is
// finished and on which no other thread calls m3qkv; a later call on it gets
// a fresh (zeroed) workspace. Call with dev from enter_*.
// Frees the workspace of `stream` under its current key (while it captures,
// its capture workspace) and the ones that key outgrew. With refuse_capture
// (the public m3qkv_release_stream) a capturing stream is refused instead, so
// no free can invalidate a capture and the graphs keep their workspace.
// `fn` names the entry point.
m3qkv_status release_stream_workspace(const char* fn, const DeviceInfo& dev, cudaStream_t stream,
                                      bool refuse_capture = false);

// Frees every workspace of each device's live primary context (runs once at
// process exit; public for the CPU test).
void release_workspaces();

}  // namespace m3qkv::host
