// Dispatch of src/api/api.cpp in the build configuration M3QKV_CUDA_ARCHS=80 (portable kernels only)
// (fake CUDA runtime and recording launchers: see api_dispatch_harness.h).
#define M3QKV_WITH_PORTABLE 1
#define M3QKV_WITH_SM90 0
#define M3QKV_WITH_SM100 0
#define DISPATCH_PREFIX dispatch_portable_
#define DISPATCH_SUITE ApiDispatchPortableOnly
#include "api_dispatch_harness.h"

namespace {
constexpr bool kBuiltPortable = true;
constexpr bool kBuiltSm90 = false;
constexpr bool kBuiltSm100 = false;
constexpr bool kSm100OnSm90 = false;
}  // namespace

#include "api_dispatch_tests.h"
