// Host phase timing (see timing.h).
#include "host/timing.h"

#include <chrono>

namespace m3qkv::host {
namespace {

struct Record {
  uint64_t ns[kPhases] = {};
  std::chrono::steady_clock::time_point last;
};
thread_local Record t_record;

}  // namespace

std::atomic<bool> g_timing_on{false};

const char* phase_name(int phase) {
  static const char* const kNames[kPhases] = {"validate", "context", "checked", "setup", "plan", "tensor_maps",
                                              "launch"};
  return phase >= 0 && phase < kPhases ? kNames[phase] : "unknown";
}

void timing_begin() {
  if (!g_timing_on.load(std::memory_order_relaxed)) return;
  t_record = Record{};
  t_record.last = std::chrono::steady_clock::now();
}

void timing_mark_slow(Phase p) {
  const auto now = std::chrono::steady_clock::now();
  t_record.ns[static_cast<int>(p)] +=
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now - t_record.last).count());
  t_record.last = now;
}

const uint64_t* last_call_phases() { return t_record.ns; }

}  // namespace m3qkv::host
