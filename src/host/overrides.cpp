#include "host/overrides.h"

namespace m3qkv::host {

std::atomic<int> g_insert_layout{0};

}  // namespace m3qkv::host
