#pragma once
// The test-problem builder of the tests: the library's one definition of the
// problems (src/golden/problem.h, which the self-test m3qkv_selftest runs
// too) under the tests' names, with the tests' seed rule and the byte-exact
// comparison that reports where two output sets differ.
#include <cstdint>
#include <string>
#include <vector>

#include "golden/problem.h"

namespace m3qkv_test {

using m3qkv::golden::golden_outputs;
using m3qkv::golden::HostBuffer;
using m3qkv::golden::HostOutputs;
using m3qkv::golden::kExactBf16Log2Bound;
using m3qkv::golden::kExactBf16MaxJ;
using m3qkv::golden::kExactLog2Ratio;
using m3qkv::golden::kExactMaxNonzero;
using m3qkv::golden::OutputPtrs;
using m3qkv::golden::Problem;
using m3qkv::golden::problem_acc;
using m3qkv::golden::ProblemConfig;
using m3qkv::golden::with_dequantized_x_bf16;

// m3qkv::golden::build_problem with cfg.seed = 0 replaced by test_seed() (a
// fresh seed per run, printed; M3QKV_TEST_SEED replays one). Throws
// std::invalid_argument on a bad config.
Problem make_problem(const ProblemConfig& cfg);

// Byte-exact comparison of two output sets of problem p. Returns "" when every
// byte is equal, else a report of the first `max_report` differences with their
// location decoded (token / head / column, or page / slot / token / data or
// scale byte / group) and the total count per buffer.
std::string compare_outputs(const Problem& p, const HostOutputs& want, const HostOutputs& got, int max_report = 10);

// f32 -> bf16 bits (RN), handy for building qkv inputs.
std::vector<uint16_t> to_bf16(const std::vector<float>& v);

}  // namespace m3qkv_test
