// Checked mode (see checked.h).
#include "api/checked.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "host/cuda.h"
#include "host/status.h"

namespace m3qkv::api {
namespace {

using ull = unsigned long long;

m3qkv_status not_device_memory(const char* fn, const Extent& x, const char* what, const DeviceInfo& dev) {
  return fail(M3QKV_ERROR_INVALID_ARGUMENT, "%s: %s = 0x%llx is %s; m3qkv needs device memory of device %d", fn,
              x.name, static_cast<ull>(x.lo), what, dev.device);
}

m3qkv_status check_one(const char* fn, const host::Cuda& c, const DeviceInfo& dev, const Extent& x) {
  CUpointer_attribute first[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                 CU_POINTER_ATTRIBUTE_IS_MANAGED, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                 CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_MAPPED};
  unsigned type = 0;
  int ordinal = -1, managed = 0, mapped = 0;
  CUdeviceptr start = 0;
  size_t size = 0;
  void* first_data[] = {&type, &ordinal, &managed, &start, &size, &mapped};
  char call[96];
  std::snprintf(call, sizeof(call), "cuPointerGetAttributes(%s)", x.name);
  // Unknown pointers are not an error: the attributes keep their zero values.
  M3QKV_CUDA_TRY(fn, c.pointer_get_attributes(6, first, first_data, static_cast<CUdeviceptr>(x.lo)));
  if (type == 0) {
    return not_device_memory(fn, x, "not memory CUDA knows (host memory from malloc or new, freed device memory, or "
                             "a stray pointer)", dev);
  }
  if (type == CU_MEMORYTYPE_HOST) return not_device_memory(fn, x, "host memory (pinned or registered)", dev);
  if (!mapped) return not_device_memory(fn, x, "not mapped (freed or unmapped device memory)", dev);
  if (!managed && ordinal != dev.device) {
    return fail(M3QKV_ERROR_INVALID_ARGUMENT, "%s: %s = 0x%llx is memory of device %d; the call runs on device %d",
                fn, x.name, static_cast<ull>(x.lo), ordinal, dev.device);
  }
  const ull end = static_cast<ull>(start) + size;
  if (x.hi() > end) {
    return fail(M3QKV_ERROR_INVALID_ARGUMENT,
                "%s: %s = 0x%llx: the call touches [0x%llx, 0x%llx) (%llu bytes), but its allocation [0x%llx, 0x%llx) "
                "ends %llu bytes earlier",
                fn, x.name, static_cast<ull>(x.lo), static_cast<ull>(x.lo), static_cast<ull>(x.hi()),
                static_cast<ull>(x.hi() - x.lo), static_cast<ull>(start), end, static_cast<ull>(x.hi() - end));
  }
  if (x.hi() - x.lo == 1) return M3QKV_SUCCESS;
  CUpointer_attribute last[] = {CU_POINTER_ATTRIBUTE_MAPPED, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR};
  int last_mapped = 0;
  CUdeviceptr last_start = 0;
  void* last_data[] = {&last_mapped, &last_start};
  M3QKV_CUDA_TRY(fn, c.pointer_get_attributes(2, last, last_data, static_cast<CUdeviceptr>(x.hi() - 1)));
  if (!last_mapped || last_start != start) {
    return fail(M3QKV_ERROR_INVALID_ARGUMENT,
                "%s: %s = 0x%llx: the call touches [0x%llx, 0x%llx), but its last byte is not mapped memory of the "
                "same allocation",
                fn, x.name, static_cast<ull>(x.lo), static_cast<ull>(x.lo), static_cast<ull>(x.hi()));
  }
  return M3QKV_SUCCESS;
}

}  // namespace

bool checked_mode() {
  static const bool on = [] {
    const char* v = std::getenv("M3QKV_CHECKED");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}

m3qkv_status check_pointers(const char* fn, const DeviceInfo& dev, const Extents& e) {
  const host::Cuda* c = nullptr;
  M3QKV_TRY(host::cuda(fn, &c));
  for (int i = 0; i < e.count; ++i) M3QKV_TRY(check_one(fn, *c, dev, e.items[i]));
  return M3QKV_SUCCESS;
}

}  // namespace m3qkv::api
