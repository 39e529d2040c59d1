// bf16 -> MXFP8 activation quantizer (m3qkv_mxfp8_quantize), OCP MX rule of
// common/numerics.h (mx_shared_exponent, mx_quantize_value). One thread per
// (row, 32-value block); rows M .. ceil(M/128)·128 - 1 only get their scale
// bytes set to 0x7F (scale 1.0), as the public header documents.
#include "portable/kernels.cuh"
#include "ptx/griddepcontrol.cuh"

using namespace m3qkv;
using namespace m3qkv::portable;

// mx_quantize_value with a NaN element passed to the encoder as it is: the
// device multiply returns the canonical +NaN while the host's (x86) keeps the
// operand's sign, so -NaN would give 0x7F here and 0xFF in the golden model.
// Encoding x itself keeps its sign (the encoder maps any NaN to sign|0x7F).
__device__ __forceinline__ uint8_t mx_quantize_value_dev(float x, int e) {
  return is_nan_f32(x) ? f32_to_e4m3_satfinite_rn_soft(x) : mx_quantize_value(x, e);
}

__global__ void __launch_bounds__(kQuantizeThreads) m3qkv_portable_quantize_kernel(const QuantizeParams p) {
  griddepcontrol_wait();
  griddepcontrol_launch_dependents();

  const int64_t cols = p.k / kMxBlock;  // scale columns (a multiple of 4: K % 128 == 0)
  const int64_t rows = f8_128x4_padded_rows(p.m);
  const int64_t items = rows * cols;
  for (int64_t it = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; it < items;
       it += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = it / cols;
    const int64_t c = it - r * cols;
    uint8_t sbyte = 0x7f;
    if (r < p.m) {
      const int64_t off = r * p.k + c * kMxBlock;
      const uint4* src = reinterpret_cast<const uint4*>(p.x + off);
      float v[kMxBlock];
#pragma unroll
      for (int j = 0; j < kMxBlock / 8; ++j) {
        const uint4 q = src[j];
        const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          v[8 * j + 2 * i] = bf16_to_f32(static_cast<uint16_t>(w[i] & 0xffffu));
          v[8 * j + 2 * i + 1] = bf16_to_f32(static_cast<uint16_t>(w[i] >> 16));
        }
      }
      float amax = 0.0f;  // max_num fold of |x| from +0 (NaN ignored)
#pragma unroll
      for (int i = 0; i < kMxBlock; ++i) amax = max_num(amax, abs_f32(v[i]));
      const int e = mx_shared_exponent(amax);
      sbyte = static_cast<uint8_t>(e + 127);
      uint4* dst = reinterpret_cast<uint4*>(p.xq + off);
#pragma unroll
      for (int j = 0; j < kMxBlock / 16; ++j) {
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float* q = v + 16 * j + 4 * i;
          w[i] = static_cast<uint32_t>(mx_quantize_value_dev(q[0], e)) | (static_cast<uint32_t>(mx_quantize_value_dev(q[1], e)) << 8) |
                 (static_cast<uint32_t>(mx_quantize_value_dev(q[2], e)) << 16) |
                 (static_cast<uint32_t>(mx_quantize_value_dev(q[3], e)) << 24);
        }
        dst[j] = make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
    p.xsf[f8_128x4_offset(r, c, cols)] = sbyte;
  }
}
