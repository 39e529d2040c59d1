// Test-only entry points: the host-cost breakdown and the fault (api/internal.h).
#include <cstring>

#include "api/internal.h"
#include "api/fault.h"
#include "api/overrides.h"
#include "host/status.h"
#include "host/timing.h"
#include "portable/plan.h"

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

static_assert(api::kInsertLayoutMax == static_cast<int>(portable::InsertLayout::kSplitC16Q8Guess),
              "the testing hook accepts every layout");

m3qkv_status m3qkv_testing_insert_layout(int layout) {
  clear_error();
  if (layout < 0 || layout > api::kInsertLayoutMax)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT, "m3qkv_testing_insert_layout: layout = %d is not in 0 .. %d", layout,
                api::kInsertLayoutMax);
  api::g_insert_layout.store(layout, std::memory_order_relaxed);
  return M3QKV_SUCCESS;
}

m3qkv_status m3qkv_testing_inject_fault(m3qkv_backend_kind backend, const char* output, long long offset,
                                        unsigned xor_mask) {
  const char* fn = "m3qkv_testing_inject_fault";
  clear_error();
  const int b = static_cast<int>(backend);
  if (b < M3QKV_BACKEND_NONE || b > M3QKV_BACKEND_SM100)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT, "%s: backend = %d is not an m3qkv_backend_kind", fn, b);
  if (backend == M3QKV_BACKEND_NONE) {
    api::set_fault(M3QKV_BACKEND_NONE, api::FaultOutput::kNone, 0, 0);
    return M3QKV_SUCCESS;
  }
  api::FaultOutput o = api::FaultOutput::kNone;
  if (output != nullptr && std::strcmp(output, "q_out") == 0) o = api::FaultOutput::kQOut;
  else if (output != nullptr && std::strcmp(output, "q_fp8_out") == 0) o = api::FaultOutput::kQFp8Out;
  else if (output != nullptr && std::strcmp(output, "index_q_out") == 0) o = api::FaultOutput::kIndexQOut;
  else
    return fail(M3QKV_ERROR_INVALID_ARGUMENT, "%s: output = \"%s\" is not q_out, q_fp8_out or index_q_out", fn,
                output != nullptr ? output : "(null)");
  if (offset < 0) return fail(M3QKV_ERROR_INVALID_ARGUMENT, "%s: offset = %lld must be >= 0", fn, offset);
  if (xor_mask < 1 || xor_mask > 255)
    return fail(M3QKV_ERROR_INVALID_ARGUMENT, "%s: xor_mask = %u must be in [1, 255]", fn, xor_mask);
  api::set_fault(backend, o, offset, static_cast<uint8_t>(xor_mask));
  return M3QKV_SUCCESS;
}

}  // extern "C"
