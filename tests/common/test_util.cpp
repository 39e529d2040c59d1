// Helpers shared by the CPU and GPU test executables (see test_util.h).
#include "common/test_util.h"
