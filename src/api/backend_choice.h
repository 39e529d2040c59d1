// The settings that choose m3qkv_fused_qkv's backend besides the device's
// compute capability (the rule is in include/m3qkv/m3qkv.h, "Backend
// choice"; the dispatcher in src/api/api.cpp applies it): the environment
// variables M3QKV_BACKEND and M3QKV_SELFTEST_ON_WARMUP, read once per
// process, and the per-device choice of m3qkv_set_backend or of the warmup's
// self-test fallback. Parsing is pure (CPU-tested); the per-device choice is
// one atomic word per ordinal, read with one relaxed load per call.
#pragma once

#include "m3qkv/m3qkv.h"

namespace m3qkv::api {

// M3QKV_BACKEND as parsed: `set` when the variable exists and is not empty;
// `valid` when it is one of auto, portable, sm90, sm100 (exact, lower case);
// `kind` the backend (M3QKV_BACKEND_NONE for auto, or when not valid);
// `text` the value as given (truncated), for the messages.
struct BackendEnv {
  bool set = false;
  bool valid = true;
  m3qkv_backend_kind kind = M3QKV_BACKEND_NONE;
  char text[40] = {};
};
BackendEnv parse_backend_env(const char* value);  // NULL = unset
// M3QKV_SELFTEST_ON_WARMUP as parsed: "1" on, "0" / "" / unset off, anything
// else not valid (the warmup then fails rather than guess).
struct FlagEnv {
  bool on = false;
  bool valid = true;
  char text[40] = {};
};
FlagEnv parse_flag_env(const char* value);

// The process's values, read at the first call that asks.
const BackendEnv& backend_env();
const FlagEnv& selftest_on_warmup_env();

// The per-device choice: by m3qkv_set_backend (kApi) or by m3qkv_warmup's
// self-test fallback (kFallback); kind NONE with kNone = nothing chosen.
enum class ChoiceOrigin : int { kNone = 0, kApi = 1, kFallback = 2 };
struct DeviceChoice {
  m3qkv_backend_kind kind = M3QKV_BACKEND_NONE;
  ChoiceOrigin origin = ChoiceOrigin::kNone;
};
// Ordinals with a slot (a process with more devices cannot choose for the rest).
constexpr int kChoiceDevices = 256;
DeviceChoice device_choice(int device);  // kNone for an ordinal without a slot
// False when `device` has no slot (nothing stored).
bool set_device_choice(int device, DeviceChoice c);

// Test only: parse `backend` / `selftest_on_warmup` as if the environment held
// them (NULL = unset), instead of the real environment; and forget every
// per-device choice. Not thread-safe: call while no other thread is in m3qkv.
void testing_set_env(const char* backend, const char* selftest_on_warmup);
void testing_use_real_env();
void testing_forget_choices();

}  // namespace m3qkv::api
