#pragma once
// First-principles OCP E4M3FN reference for the CPU tests, independent of
// src/common/numerics.h (one definition for test_numerics and test_golden).
#include <cmath>
#include <cstdint>

namespace m3qkv_test {

// The value of an e4m3 code from the definition: bias 7, e = 0 subnormal
// m/8·2^-6, e = 15 & m = 7 is NaN, no infinities.
inline double ref_e4m3_value(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::nan("");
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

// cvt.rn.satfinite.e4m3 by search: nearest of the 127 non-negative finite
// codes (0x00..0x7E), ties to the even code, |x| beyond 448 -> 448, NaN -> 0x7F.
inline uint8_t ref_e4m3_encode(double x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return 0x7f;  // sign dropped (cuda_fp8.hpp canonical NaN)
  const double a = std::fabs(x);
  if (a >= 448.0) return sign | 0x7e;
  int best = 0;
  double bd = a;
  for (int c = 1; c <= 0x7e; ++c) {
    const double d = std::fabs(a - ref_e4m3_value(c));
    if (d < bd || (d == bd && (c & 1) == 0)) {
      best = c;
      bd = d;
    }
  }
  return uint8_t(sign | best);
}

}  // namespace m3qkv_test
