// Test-only kernel timelines (the SM90 kernels' `set_trace` hooks): one
// %globaltimer stamp (ns) per (CTA, event) into p.trace[cta · P::kTraceEvents
// + event] for CTAs below p.trace_ctas. One predictable branch per event when
// tracing is off (p.trace null). `P`: a kernel's parameter struct with
// `uint64_t* trace`, `int32_t trace_ctas` and `static constexpr int kTraceEvents`.
#pragma once

#include <stdint.h>

#include "ptx/globaltimer.cuh"

namespace m3qkv {

template <class P>
__device__ __forceinline__ void trace_value(const P& p, int ev, uint64_t v) {
  if (p.trace != nullptr && static_cast<int>(blockIdx.x) < p.trace_ctas)
    p.trace[static_cast<int64_t>(blockIdx.x) * P::kTraceEvents + ev] = v;
}
template <class P>
__device__ __forceinline__ void trace_event(const P& p, int ev) {
  if (p.trace != nullptr) trace_value(p, ev, ptx::globaltimer());
}

}  // namespace m3qkv
