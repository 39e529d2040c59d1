// Storage of the one-time setup (see once.h): the slots of the call's context
// record (host/context.h).
#include "host/once.h"

#include "host/context.h"

namespace m3qkv::host::detail {

const void* once_peek(const DeviceInfo& dev, OnceSlot slot) {
  if (dev.context == nullptr) return nullptr;
  return dev.context->once[static_cast<int>(slot)].value.load(std::memory_order_acquire);
}

m3qkv_status once_make(const char* fn, const DeviceInfo& dev, OnceSlot slot, OnceThunk thunk, void* closure,
                       const void** out) {
  if (dev.context == nullptr) {
    return fail(M3QKV_ERROR_INTERNAL, "%s: one-time setup asked without a context (DeviceInfo from query_device)", fn);
  }
  ContextState::Slot& s = dev.context->once[static_cast<int>(slot)];
  std::lock_guard<std::mutex> lock(s.mu);
  const void* v = s.value.load(std::memory_order_acquire);
  if (v == nullptr) {
    M3QKV_TRY(thunk(closure, &v));
    s.value.store(v, std::memory_order_release);
  }
  *out = v;
  return M3QKV_SUCCESS;
}

}  // namespace m3qkv::host::detail
