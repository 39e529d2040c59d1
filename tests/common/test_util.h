#pragma once
// Shared test helpers (random data with a fresh seed per run, printed so a
// failure can be replayed with M3QKV_TEST_SEED=<seed>).
#include <cstdint>
#include <cstdlib>
#include <random>

namespace m3qkv_test {
inline uint64_t test_seed() {
  static const uint64_t seed = [] {
    if (const char* s = std::getenv("M3QKV_TEST_SEED")) return static_cast<uint64_t>(std::strtoull(s, nullptr, 0));
    return static_cast<uint64_t>(std::random_device{}()) << 32 ^ std::random_device{}();
  }();
  return seed;
}
}  // namespace m3qkv_test
