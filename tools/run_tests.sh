#!/usr/bin/env bash
# The test command: configure + build everything + run ctest.
#
#   bash tools/run_tests.sh [extra ctest arguments...]
#
# Env: M3QKV_CUDA_ARCHS (default "80;90a;100f"), M3QKV_BUILD_DIR (default build),
#      M3QKV_JOBS (default nproc), CTEST_PARALLEL_LEVEL (default nproc).
# Then the Python tests (python/tests) when torch and pytest are importable.
# Exit status: ctest's, else pytest's (configure or build failures exit
# non-zero before either).
# GPU tests skip themselves when no GPU is present; the reason is printed once
# at the end.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/configure_build.sh" run_tests
echo "run_tests: configured $BUILD (M3QKV_CUDA_ARCHS=$ARCHS)"
cmake --build "$BUILD" -j "$JOBS"
log="$BUILD/m3qkv_ctest.log"
set +e
ctest --test-dir "$BUILD" --output-on-failure -j "${CTEST_PARALLEL_LEVEL:-$(nproc)}" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
# ctest lists skipped tests without their output: say once why the GPU tests
# were skipped, from the skip message of the first one (run again alone).
skipped=$(grep -cE '^[[:space:]]*[0-9]+ - gpu\..*\(Skipped\)' "$log" || true)
if ((skipped > 0)); then
  first=$(grep -m1 -E '^[[:space:]]*[0-9]+ - gpu\..*\(Skipped\)' "$log" | sed -E 's/^[[:space:]]*[0-9]+ - gpu\.([^ ]+).*/\1/')
  why=$("$BUILD/tests/m3qkv_gpu_tests" --gtest_filter="$first" 2>&1 | grep -A1 ': Skipped$' | tail -1 || true)
  echo "run_tests: $skipped GPU tests skipped: ${why:-(no skip message from $first)}"
fi
# The Python package's tests (python/tests) against this build, from the
# source tree, when torch and pytest are importable (CPU-only machines run the
# CPU tests; the gpu-marked ones need a GPU). .ci/run also runs them on a
# pip-installed copy.
py=${PYTHON:-python3}
if "$py" -c "import torch, pytest" >/dev/null 2>&1; then
  echo "run_tests: Python tests (python/tests, $("$py" -c 'import torch; print("torch", torch.__version__)'))"
  set +e
  bdir=$(cd "$BUILD" && pwd)
  M3QKV_LIBRARY="$bdir/libm3qkv.so" M3QKV_GOLDEN_LIBRARY="$bdir/libm3qkv_golden_capi.so" \
    M3QKV_REPO_ROOT="$ROOT" PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" \
    "$py" -m pytest -q -p no:cacheprovider "$ROOT/python/tests"
  prc=$?
  set -e
  ((rc == 0)) && rc=$prc
else
  echo "run_tests: Python tests not run: $py cannot import torch and pytest (pip install torch pytest)"
fi
exit "$rc"
