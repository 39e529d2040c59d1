// Dispatch of src/api/api.cpp in the build configuration with every backend (80;90a;100f and the Hopper kernel source)
// (fake CUDA runtime and recording launchers: see api_dispatch_harness.h).
#define M3QKV_WITH_PORTABLE 1
#define M3QKV_WITH_SM90 1
#define M3QKV_HAVE_SM90_KERNEL 1
#define M3QKV_WITH_SM100 1
#define DISPATCH_PREFIX dispatch_all_
#define DISPATCH_SUITE ApiDispatchAllBackends
#include "api_dispatch_harness.h"

namespace {
constexpr bool kBuiltPortable = true;
constexpr bool kBuiltSm90 = true;
constexpr bool kBuiltSm100 = true;
constexpr bool kSm100OnSm90 = false;
}  // namespace

#include "api_dispatch_tests.h"
