// The call's CUDA context and the state m3qkv keeps per context.
//
// Which context a call runs in: the context of its stream (cuStreamGetCtx);
// for NULL, cudaStreamLegacy and cudaStreamPerThread, the context current to
// the calling thread, and when the thread has none yet, the current device's
// primary context (made current with cudaSetDevice of the current device, as
// the runtime itself would on the launch). A stream of a context that is not
// current (another device, or a cuCtxCreate'd context) is handled by making
// its context current for the call only (ContextScope): the caller's current
// context and device are as they were when the call returns.
//
// State per context, keyed by the context's unique id (cuCtxGetId: never
// reused in a process, unlike CUcontext handles, so the new primary context
// after cudaDeviceReset, or a new context at a destroyed one's address, gets
// fresh state): the device facts, the one-time setup slots (host/once.h) and
// the stream workspaces (host/workspace.h). A state is never freed: a context
// that dies (cudaDeviceReset, cuCtxDestroy) leaves a few hundred bytes behind
// and its device allocations are gone with it, never freed twice.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "host/device.h"
#include "host/once.h"

namespace m3qkv::host {

// One workspace (host/workspace.h): the buffer in use and, for a capture,
// the buffers it outgrew during the capture (nodes captured earlier use them).
struct Workspace {
  void* ptr = nullptr;
  size_t bytes = 0;
  std::vector<void*> outgrown;
  cudaEvent_t fence = nullptr;  // a stream's: recorded after each launch that used it (WorkspaceLease)
  std::atomic<unsigned long long> last_use{0};  // the context's workspace tick at its last lookup (LRU)
};

struct ContextState {
  unsigned long long id = 0;
  DeviceInfo facts;  // facts.context == this
  struct Slot {
    std::atomic<const void*> value{nullptr};
    std::mutex mu;
  } once[static_cast<int>(OnceSlot::kCount)];
  // Stream and capture workspaces (host/workspace.cpp). The map and the
  // buffers change under workspace_mu held exclusively; a call holds it
  // shared from its lookup through its launch (host::WorkspaceLease), so no
  // buffer is freed between the two.
  std::shared_mutex workspace_mu;
  std::unordered_map<unsigned long long, Workspace> workspaces;  // by key (workspace.cpp)
  size_t stream_bytes = 0;                          // the stream (not capture) workspaces' bytes
  std::atomic<unsigned long long> workspace_tick{0};
  std::atomic<unsigned long long> workspace_epoch{0};  // bumped by every free: thread-local caches compare it
  cudaStream_t zero_stream = nullptr;  // non-blocking stream of this context: capture workspaces are zeroed on it
  // Keys of capture workspaces whose graph was destroyed (queued by the
  // graph's user object, freed by the next call that is not capturing).
  std::mutex dead_mu;
  std::vector<unsigned long long> dead_captures;
};

// Undoes what enter_* did to the thread's current context when it goes out
// of scope (pops the context it pushed; nothing when it pushed none).
class ContextScope {
 public:
  ContextScope() = default;
  ~ContextScope();
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;
  void set_pushed() { pushed_ = true; }

 private:
  bool pushed_ = false;
};

// The call's context for `stream` (rule at the top), current while `scope`
// lives; *dev = its facts, dev->context its state.
m3qkv_status enter_stream(const char* fn, cudaStream_t stream, ContextScope* scope, DeviceInfo* dev);
// The primary context of device ordinal `device` (retained: created when it
// does not exist yet), current while `scope` lives. Touches no other device
// and leaves the runtime's current device of the thread as it was.
m3qkv_status enter_primary(const char* fn, int device, ContextScope* scope, DeviceInfo* dev);

// The record of context `id`, or NULL when no call has run in it.
ContextState* find_context(unsigned long long id);

// Test only (host/cuda.h testing_install_cuda): forget every context state.
void testing_forget_contexts();
// The generation of the context records: thread-local caches of a record
// (workspace.cpp) are valid only while it is unchanged.
unsigned long long context_generation();

}  // namespace m3qkv::host
