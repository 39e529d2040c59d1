#!/usr/bin/env bash
# The test command: configure + build everything + run ctest.
#
#   bash tools/run_tests.sh [extra ctest arguments...]
#
# Env: M3QKV_CUDA_ARCHS (default "80;90a;100f"), M3QKV_BUILD_DIR (default build),
#      M3QKV_JOBS (default nproc), CTEST_PARALLEL_LEVEL (default nproc).
# Exit status: ctest's (configure or build failures exit non-zero before it).
# GPU tests skip themselves with a message when no GPU is present.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/configure_build.sh" run_tests
echo "run_tests: configured $BUILD (M3QKV_CUDA_ARCHS=$ARCHS)"
cmake --build "$BUILD" -j "$JOBS"
set +e
ctest --test-dir "$BUILD" --output-on-failure -j "${CTEST_PARALLEL_LEVEL:-$(nproc)}" "$@"
rc=$?
set -e
exit "$rc"
