// Test-only fault injection (m3qkv_testing_inject_fault, api/internal.h): one
// output byte of every m3qkv_fused_qkv launch of one backend is flipped, so a
// test can show that the self-test names exactly that backend and byte, and
// that the warmup's self-test mode then falls back.
//
// The flip is made in device memory right after the backend's launch, on the
// call's stream (copy the byte out, XOR, copy it back: the stream is
// synchronized, so not for use under stream capture). It stands for a wrong
// accumulator bit or epilogue step inside a kernel: flipping inside the
// kernels would put a test branch into every backend's hot loop, and what the
// self-test has to catch is the wrong byte it leads to, which it reads back
// through the same path either way.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "m3qkv/m3qkv.h"

namespace m3qkv::api {

// The outputs a fault can hit (fixed-size buffers of the call's shape).
enum class FaultOutput : int { kNone = 0, kQOut, kQFp8Out, kIndexQOut };

// Arms (backend != NONE) or clears (NONE) the fault: byte `offset` of
// `output` gets XOR `mask` after every fused launch of `backend`. A call whose
// output is NULL or shorter than offset + 1 bytes is left alone.
void set_fault(m3qkv_backend_kind backend, FaultOutput output, int64_t offset, uint8_t mask);

// After a successful fused launch of `backend` on `stream` with the call's
// context current: applies the fault when it is armed for that backend (one
// relaxed atomic load otherwise).
m3qkv_status apply_fault(const char* fn, m3qkv_backend_kind backend, const m3qkv_fused_args& a, cudaStream_t stream);

}  // namespace m3qkv::api
