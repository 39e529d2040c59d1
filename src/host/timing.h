// Test-only breakdown of the host cost of one call (issue 12: where the
// microseconds of a call go). Off unless a test or the benchmark turns it on
// with m3qkv_testing_host_timing (api/internal.h); when off each mark is one
// relaxed load and a predictable branch.
#pragma once

#include <atomic>
#include <cstdint>

namespace m3qkv::host {

// Phases in call order; a mark ends its phase (the time since the previous mark).
enum class Phase : int {
  kValidate = 0,  // argument validation (incl. the overlap rule)
  kContext,       // the stream's context, its record and device facts
  kChecked,       // checked mode's pointer queries (0 when off)
  kSetup,         // the backend's once-per-context setup lookup
  kPlan,          // the launch plan
  kTensorMaps,    // TMA tensor maps (cache lookups, encodes on a miss)
  kLaunch,        // building the params and cudaLaunchKernelEx
  kCount
};
constexpr int kPhases = static_cast<int>(Phase::kCount);
const char* phase_name(int phase);

extern std::atomic<bool> g_timing_on;

// Starts this thread's record of a call (all phases 0).
void timing_begin();
void timing_mark_slow(Phase p);
inline void timing_mark(Phase p) {
  if (g_timing_on.load(std::memory_order_relaxed)) timing_mark_slow(p);
}
// Phases of this thread's last call, ns.
const uint64_t* last_call_phases();

}  // namespace m3qkv::host
