// One-time setup per CUDA context (shared-memory attributes, occupancy
// numbers belong to a context): computed on the first call in a context that
// needs it, then read with one atomic load. Each user owns one slot; the
// slots live in the context's record (host/context.h), so a new context
// (cuCtxCreate, the primary context after cudaDeviceReset) sets up afresh.
// Runs with the call's context current (enter_* made it so).
#pragma once

#include <type_traits>

#include "host/device.h"
#include "host/status.h"

namespace m3qkv::host {

enum class OnceSlot : int { kPortable = 0, kSm90, kSm100, kCount };

namespace detail {
using OnceThunk = m3qkv_status (*)(void* closure, const void** made);
// The slot's value, or NULL before it was made.
const void* once_peek(const DeviceInfo& dev, OnceSlot slot);
// Makes the slot's value once (under the slot's mutex), via thunk(closure).
m3qkv_status once_make(const char* fn, const DeviceInfo& dev, OnceSlot slot, OnceThunk thunk, void* closure,
                       const void** out);
}  // namespace detail

// *out = the value of `slot` for dev's context, made by init(T*) -> status on
// first use. The value is never freed (it is small and lives as long as its
// context could). A failing init stores nothing: the next call tries again.
// Concurrent first calls run init once; the others wait for it.
template <class T, class Init>
m3qkv_status once(const char* fn, const DeviceInfo& dev, OnceSlot slot, Init&& init, const T** out) {
  if (const void* p = detail::once_peek(dev, slot)) {
    *out = static_cast<const T*>(p);
    return M3QKV_SUCCESS;
  }
  using InitT = std::remove_reference_t<Init>;
  const detail::OnceThunk thunk = [](void* closure, const void** made) -> m3qkv_status {
    T* v = new T();
    const m3qkv_status st = (*static_cast<InitT*>(closure))(v);
    if (st != M3QKV_SUCCESS) {
      delete v;
      return st;
    }
    *made = v;
    return M3QKV_SUCCESS;
  };
  const void* p = nullptr;
  M3QKV_TRY(detail::once_make(fn, dev, slot, thunk, const_cast<void*>(static_cast<const void*>(&init)), &p));
  *out = static_cast<const T*>(p);
  return M3QKV_SUCCESS;
}

}  // namespace m3qkv::host
