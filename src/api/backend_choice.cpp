// Backend-choice settings (see backend_choice.h).
#include "api/backend_choice.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace m3qkv::api {
namespace {

void copy_text(char (&dst)[40], const char* v) {
  std::strncpy(dst, v, sizeof(dst) - 1);
  dst[sizeof(dst) - 1] = '\0';
}

// The environment as read once, and the tests' replacement (a pointer, so the
// per-call read is one load).
struct Env {
  BackendEnv backend;
  FlagEnv selftest_on_warmup;
};
const Env& real_env() {
  static const Env e{parse_backend_env(std::getenv("M3QKV_BACKEND")),
                     parse_flag_env(std::getenv("M3QKV_SELFTEST_ON_WARMUP"))};
  return e;
}
Env g_test_env;
std::atomic<const Env*> g_env_override{nullptr};
const Env& env() {
  const Env* t = g_env_override.load(std::memory_order_acquire);
  return t != nullptr ? *t : real_env();
}

// kind in the low byte, origin in the next.
std::atomic<int> g_choice[kChoiceDevices];

}  // namespace

BackendEnv parse_backend_env(const char* value) {
  BackendEnv e;
  if (value == nullptr || value[0] == '\0') return e;
  e.set = true;
  copy_text(e.text, value);
  if (std::strcmp(value, "auto") == 0) e.kind = M3QKV_BACKEND_NONE;
  else if (std::strcmp(value, "portable") == 0) e.kind = M3QKV_BACKEND_PORTABLE;
  else if (std::strcmp(value, "sm90") == 0) e.kind = M3QKV_BACKEND_SM90;
  else if (std::strcmp(value, "sm100") == 0) e.kind = M3QKV_BACKEND_SM100;
  else e.valid = false;
  return e;
}

FlagEnv parse_flag_env(const char* value) {
  FlagEnv f;
  if (value == nullptr) return f;
  copy_text(f.text, value);
  if (std::strcmp(value, "1") == 0) f.on = true;
  else if (value[0] != '\0' && std::strcmp(value, "0") != 0) f.valid = false;
  return f;
}

const BackendEnv& backend_env() { return env().backend; }
const FlagEnv& selftest_on_warmup_env() { return env().selftest_on_warmup; }

DeviceChoice device_choice(int device) {
  DeviceChoice c;
  if (device < 0 || device >= kChoiceDevices) return c;
  const int v = g_choice[device].load(std::memory_order_relaxed);
  c.kind = static_cast<m3qkv_backend_kind>(v & 0xff);
  c.origin = static_cast<ChoiceOrigin>(v >> 8);
  return c;
}

bool set_device_choice(int device, DeviceChoice c) {
  if (device < 0 || device >= kChoiceDevices) return false;
  g_choice[device].store(static_cast<int>(c.kind) | (static_cast<int>(c.origin) << 8), std::memory_order_relaxed);
  return true;
}

void testing_set_env(const char* backend, const char* selftest_on_warmup) {
  g_env_override.store(nullptr, std::memory_order_release);
  g_test_env.backend = parse_backend_env(backend);
  g_test_env.selftest_on_warmup = parse_flag_env(selftest_on_warmup);
  g_env_override.store(&g_test_env, std::memory_order_release);
}

void testing_use_real_env() { g_env_override.store(nullptr, std::memory_order_release); }

void testing_forget_choices() {
  for (auto& c : g_choice) c.store(0, std::memory_order_relaxed);
}

}  // namespace m3qkv::api
