// Test-only entry points of the host-cost breakdown (api/internal.h).
#include "api/internal.h"
#include "host/timing.h"

using namespace m3qkv;

extern "C" {

void m3qkv_testing_host_timing(int enable) { host::g_timing_on.store(enable != 0, std::memory_order_relaxed); }

int m3qkv_testing_host_phases(unsigned long long* ns, int capacity) {
  const uint64_t* p = host::last_call_phases();
  int n = 0;
  for (; n < host::kPhases && n < capacity; ++n) ns[n] = p[n];
  return n;
}

const char* m3qkv_testing_host_phase_name(int phase) { return host::phase_name(phase); }

}  // extern "C"
