// Device facts the dispatcher and the launchers need.
#pragma once

#include "m3qkv/m3qkv.h"

namespace m3qkv {

struct DeviceInfo {
  int device = -1;
  int cc_major = 0, cc_minor = 0;
  int num_sms = 0;
  int l2_bytes = 0;
  int max_smem_optin = 0;
};

// Facts of device ordinal `device` (cached per device); `fn` opens the messages.
m3qkv_status query_device(int device, DeviceInfo* out, const char* fn = "m3qkv");
// Facts of the current device.
m3qkv_status current_device_info(DeviceInfo* out, const char* fn = "m3qkv");

}  // namespace m3qkv
