// Tensor-map encoding (see tensor_map.h), with a per-thread cache.
//
// cuTensorMapEncodeTiled is a pure CPU function of its arguments (no context,
// no device access) that costs microseconds per call, and a serving loop
// encodes the same maps over and over: the weights of every layer, the same
// activation buffer at the same M across the layers of a step. The encoded
// bytes are cached per thread (no lock), keyed by every argument that
// reaches the encoder; an entry stays correct whatever happens to the memory
// at that address, since the map holds nothing but these numbers.
#include "host/tensor_map.h"

#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <memory>

#include "host/cuda.h"
#include "host/status.h"

namespace m3qkv::host {
namespace {

struct Key {
  uint64_t base, inner, outer, pitch;
  uint32_t box_inner, box_outer, swizzle, pad;
  bool operator==(const Key& o) const { return std::memcmp(this, &o, sizeof(Key)) == 0; }
};

// Direct-mapped, 512 entries (~100 KiB per calling thread): room for the
// weight maps of ~100 layers x 2 backends plus the activations.
constexpr int kEntries = 512;
struct Cache {
  struct Entry {
    Key key;
    bool valid = false;
    CUtensorMap map;
  } entries[kEntries];
};
thread_local std::unique_ptr<Cache> t_cache;

size_t slot_of(const Key& k) {
  uint64_t h = k.base * 0x9E3779B97F4A7C15ull;
  for (uint64_t v : {k.inner, k.outer, k.pitch, (uint64_t{k.box_inner} << 32) | k.box_outer, uint64_t{k.swizzle}}) {
    h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
  }
  return static_cast<size_t>(h >> 40) % kEntries;
}

}  // namespace

m3qkv_status make_tensor_map_2d_u8(const char* fn, CUtensorMap* out, const char* what, const void* base,
                                   uint64_t inner, uint64_t outer, uint64_t outer_stride_bytes, uint32_t box_inner,
                                   uint32_t box_outer, CUtensorMapSwizzle swizzle) {
  const Key key{reinterpret_cast<uintptr_t>(base), inner, outer, outer_stride_bytes, box_inner, box_outer,
                static_cast<uint32_t>(swizzle), 0};
  if (!t_cache) t_cache = std::make_unique<Cache>();
  Cache::Entry& e = t_cache->entries[slot_of(key)];
  if (e.valid && e.key == key) {
    *out = e.map;
    return M3QKV_SUCCESS;
  }
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0)
    return fail(M3QKV_ERROR_MISALIGNED, "%s: tensor map of %s: base %p is not 16-byte aligned", fn, what, base);
  if (outer_stride_bytes % 16 != 0 || outer_stride_bytes >= (uint64_t{1} << 40))
    return fail(M3QKV_ERROR_MISALIGNED, "%s: tensor map of %s: row pitch %llu is not a multiple of 16 below 2^40", fn,
                what, static_cast<unsigned long long>(outer_stride_bytes));
  if (inner == 0 || outer == 0 || inner > (uint64_t{1} << 32) || outer > (uint64_t{1} << 32))
    return fail(M3QKV_ERROR_TOO_LARGE, "%s: tensor map of %s: dims %llu x %llu out of range", fn, what,
                static_cast<unsigned long long>(inner), static_cast<unsigned long long>(outer));
  if (box_inner < 1 || box_inner > 256 || box_outer < 1 || box_outer > 256 || box_inner % 16 != 0 ||
      (swizzle == CU_TENSOR_MAP_SWIZZLE_128B && box_inner > 128))
    return fail(M3QKV_ERROR_INTERNAL, "%s: tensor map of %s: invalid TMA box %u x %u", fn, what, box_inner, box_outer);
  const Cuda* c = nullptr;
  M3QKV_TRY(cuda(fn, &c));
  const cuuint64_t dims[2] = {inner, outer};
  const cuuint64_t strides[1] = {outer_stride_bytes};
  const cuuint32_t box[2] = {box_inner, box_outer};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = c->tensor_map_encode_tiled(out, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims,
                                                strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                                                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    char call[96];
    std::snprintf(call, sizeof(call), "cuTensorMapEncodeTiled(%s)", what);
    return cuda_fail(fn, call, r);
  }
  e.key = key;
  e.map = *out;
  e.valid = true;
  return M3QKV_SUCCESS;
}

}  // namespace m3qkv::host
