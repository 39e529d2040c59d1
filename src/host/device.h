// Device facts the dispatcher and the launchers need, and the call's context.
#pragma once

#include "m3qkv/m3qkv.h"

namespace m3qkv {

namespace host {
struct ContextState;  // host/context.h
}

struct DeviceInfo {
  int device = -1;
  int cc_major = 0, cc_minor = 0;
  int num_sms = 0;
  int l2_bytes = 0;
  int max_smem_optin = 0;
  // The call's context (host/context.h enter_*): its one-time setup and
  // workspaces. NULL in facts from query_device, which names no context.
  host::ContextState* context = nullptr;
};

// Facts of device ordinal `device` (cached per device; no context needed or
// created); `fn` opens the messages.
m3qkv_status query_device(int device, DeviceInfo* out, const char* fn = "m3qkv");
// Facts and context of the calling thread's current context (the NULL
// stream's; host/context.h), for the tests and the benchmark.
m3qkv_status current_device_info(DeviceInfo* out, const char* fn = "m3qkv");

namespace host {
// Test only (host/cuda.h testing_install_cuda): forget the cached facts.
void testing_forget_devices();
}  // namespace host

}  // namespace m3qkv
