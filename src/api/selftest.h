// The self-test engine behind m3qkv_selftest and m3qkv_warmup's self-test
// mode (the entry points are in api.cpp, which decides which kernels this
// build and device can run and launches each one: this file only sees them
// through a callback, so the CPU tests can drive it with recording
// launchers on a scripted CUDA).
//
// What one run does, in the caller's context (enter_primary):
//  1. builds the built-in problems (problem_configs(): exact data, fixed
//     seeds, golden/problem.h) and their expected output bytes: every output
//     buffer and a guard zone on each side poisoned (golden::poison_byte),
//     then the golden epilogue on the golden accumulator (exact on any
//     hardware for this data) written into the same image;
//  2. one device allocation for every input and output, one stream of its own;
//  3. per kernel: the poisoned image up, every problem it takes launched,
//     the image down, every byte compared with the expected image and with
//     the portable kernel's image;
//  4. frees the allocation and the stream's workspace, destroys the stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "golden/problem.h"
#include "host/device.h"
#include "m3qkv/m3qkv.h"

namespace m3qkv::selftest {

// The kernels, in report order (portable first: the others are compared with it).
enum Path : int { kPortable = 0, kSm90Tile, kSm90Decode, kSm100Cta1, kSm100Cta2, kPaths };
struct PathInfo {
  m3qkv_backend_kind backend;
  int variant;  // m3qkv_selftest_entry.variant
  const char* name;
};
const PathInfo& path_info(int path);
// Whether `path` runs a problem of m tokens (the decode kernel takes m <= 256).
bool path_takes(int path, int64_t m);

// One built-in problem: a name for the messages and its configuration.
struct NamedProblem {
  const char* name;
  golden::ProblemConfig cfg;
};
const std::vector<NamedProblem>& problems();

// What to run: run[p] for the kernels to test. note[p] is the report's
// message of kernel p: for one not run, why (empty: "not requested"); for
// one run, a remark kept when it passes (replaced when it does not).
struct Request {
  bool run[kPaths] = {};
  char note[kPaths][160] = {};
};

// Launches the validated args `a` on `path` (stream s, dev's context current).
using Launch = m3qkv_status (*)(int path, const m3qkv_fused_args& a, const DeviceInfo& dev, cudaStream_t s);

// Runs `req` on dev (its context current) and fills every field of *out
// (struct_size = sizeof). Returns M3QKV_SUCCESS (every kernel run passed),
// M3QKV_ERROR_SELFTEST_FAILED (one failed or could not run: the report and
// the message name it) or the error that stopped the run (a CUDA error of the
// self-test's own allocations and copies); out->status is the same.
m3qkv_status run(const char* fn, const DeviceInfo& dev, const Request& req, Launch launch,
                 m3qkv_selftest_report* out);

// Fills out for a call that could not start: status st, the current message.
void fill_failed(m3qkv_status st, int device, m3qkv_selftest_report* out);

}  // namespace m3qkv::selftest
