// Checked mode (opt-in: M3QKV_CHECKED=1 in the environment, read once at the
// first call): every buffer of a call is checked to be device memory of the
// call's device and to lie, as the call touches it (api/extents.h), inside
// its allocation, so that a host pointer, a freed pointer, another device's
// buffer or a buffer that is too small gets a status and a message instead
// of a fault that kills the caller's context.
//
// One driver query (cuPointerGetAttributes) for the first byte of each buffer
// and one for its last byte: the first gives the memory type, the device and
// the allocation's range (for memory of the VMM API, the reserved range), the
// second that the last byte is mapped too (a VMM buffer may run past its
// mapping inside its reservation). What it cannot see: memory freed back to
// a stream-ordered pool (cudaFreeAsync) stays mapped in the pool, and
// sub-allocations of a caching allocator (PyTorch's) lie inside one large
// allocation, so a tensor too small for the call is only caught when the
// call runs past the allocation's end.
#pragma once

#include "host/device.h"
#include "api/extents.h"

namespace m3qkv::api {

// Whether checked mode is on (M3QKV_CHECKED=1 when first asked).
bool checked_mode();

// M3QKV_ERROR_INVALID_ARGUMENT naming the buffer when one of `e` is not
// device memory of dev's device or does not fit its allocation.
m3qkv_status check_pointers(const char* fn, const DeviceInfo& dev, const Extents& e);

}  // namespace m3qkv::api
