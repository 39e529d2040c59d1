// Dispatch of src/api/api.cpp in the build configuration M3QKV_CUDA_ARCHS=90a without the Hopper kernel (no backend at all)
// (fake CUDA runtime and recording launchers: see api_dispatch_harness.h).
#define M3QKV_WITH_PORTABLE 0
#define M3QKV_WITH_SM90 1
#define M3QKV_WITH_SM100 0
#define DISPATCH_PREFIX dispatch_none_
#define DISPATCH_SUITE ApiDispatchNoBackend
#define DISPATCH_NO_BACKEND 1
#include "api_dispatch_harness.h"

namespace {
constexpr bool kBuiltPortable = false;
constexpr bool kBuiltSm90 = false;
constexpr bool kBuiltSm100 = false;
constexpr bool kSm100OnSm90 = false;
}  // namespace

#include "api_dispatch_tests.h"
