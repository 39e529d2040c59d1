// Test-only overrides of plan choices, set by m3qkv_testing_* (api/internal.h)
// so that tests reach every kernel form at any shape and the bench can price
// each against the other. The entry point reads one once per call (a relaxed
// load) and hands it to the backend's plan as an input; 0 = the plan decides.
#pragma once

#include <atomic>

namespace m3qkv::api {

// The standalone insert's lane layout: portable::InsertLayout (0 automatic,
// 1 quad rows, 2 warp rows, 3 8-lane rows, 4 split c32q8, 5 split c16q8,
// 6 split c16q8 + guess; testing.cpp static-asserts the largest).
extern std::atomic<int> g_insert_layout;
constexpr int kInsertLayoutMax = 6;

}  // namespace m3qkv::api
