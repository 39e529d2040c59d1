// Storage of the one-time setup (see once.h), one slot set per device ordinal.
#include "host/once.h"

#include <atomic>
#include <mutex>

namespace m3qkv::host::detail {
namespace {

constexpr int kMaxDevices = 64;
constexpr int kSlots = static_cast<int>(OnceSlot::kCount);

struct Slot {
  std::atomic<const void*> value{nullptr};
  std::mutex mu;
};
Slot g_slots[kMaxDevices][kSlots];

Slot* slot_of(const DeviceInfo& dev, OnceSlot slot) {
  if (dev.device < 0 || dev.device >= kMaxDevices) return nullptr;
  return &g_slots[dev.device][static_cast<int>(slot)];
}

}  // namespace

const void* once_peek(const DeviceInfo& dev, OnceSlot slot) {
  Slot* s = slot_of(dev, slot);
  return s != nullptr ? s->value.load(std::memory_order_acquire) : nullptr;
}

m3qkv_status once_make(const char* fn, const DeviceInfo& dev, OnceSlot slot, OnceThunk thunk, void* closure,
                       const void** out) {
  Slot* s = slot_of(dev, slot);
  if (s == nullptr) {
    return fail(M3QKV_ERROR_UNSUPPORTED_DEVICE, "%s: device %d: m3qkv supports device ordinals below %d", fn,
                dev.device, kMaxDevices);
  }
  std::lock_guard<std::mutex> lock(s->mu);
  const void* v = s->value.load(std::memory_order_acquire);
  if (v == nullptr) {
    M3QKV_TRY(thunk(closure, &v));
    s->value.store(v, std::memory_order_release);
  }
  *out = v;
  return M3QKV_SUCCESS;
}

}  // namespace m3qkv::host::detail
