#include "api/overrides.h"

namespace m3qkv::api {

std::atomic<int> g_insert_layout{0};

}  // namespace m3qkv::api
