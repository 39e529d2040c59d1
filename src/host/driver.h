// The CUDA driver API entry points the host layer uses, resolved once per
// process through cudaGetDriverEntryPointByVersion (SPEC §1: no link-time
// dependency on libcuda). Each member is the ABI of the version in its type
// name, requested explicitly so that a newer driver cannot hand us a
// different signature.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include "m3qkv/m3qkv.h"

namespace m3qkv::host {

struct Driver {
  PFN_cuGetErrorName_v6000 get_error_name;
  PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encode_tiled;
};

// The table (stable for the process) or a status naming the missing entry
// point. A failed resolution is not remembered: the next call tries again.
m3qkv_status driver(const char* fn, const Driver** out);

// The table if an earlier driver() call resolved it, else NULL. Never
// resolves (the error path uses it to name a CUresult).
const Driver* driver_if_resolved();

}  // namespace m3qkv::host
