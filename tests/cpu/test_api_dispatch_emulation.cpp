// Dispatch of src/api/api.cpp in the build configuration 80;90a;100f with M3QKV_TCGEN05_EMULATION (sm100 kernel forceable on CC 9.0)
// (fake CUDA runtime and recording launchers: see api_dispatch_harness.h).
#define M3QKV_WITH_PORTABLE 1
#define M3QKV_WITH_SM90 1
#define M3QKV_WITH_SM100 1
#define M3QKV_TCGEN05_EMULATION 1
#define DISPATCH_PREFIX dispatch_emulation_
#define DISPATCH_SUITE ApiDispatchTcgen05Emulation
#include "api_dispatch_harness.h"

namespace {
constexpr bool kBuiltPortable = true;
constexpr bool kBuiltSm90 = false;
constexpr bool kBuiltSm100 = true;
constexpr bool kSm100OnSm90 = true;
}  // namespace

#include "api_dispatch_tests.h"
