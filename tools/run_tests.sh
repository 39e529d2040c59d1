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
# Output: the build, ctest's failures and closing lines (the full ctest output
# is in $BUILD/m3qkv_ctest.log), pytest's, then a summary: the ctest counts
# and each skip reason once (GPU tests skip themselves when no GPU is
# present), the same for pytest and, as the last line, the two together:
#   N passed, N failed, N skipped
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/configure_build.sh" run_tests
echo "run_tests: configured $BUILD (M3QKV_CUDA_ARCHS=$ARCHS)"
cmake --build "$BUILD" -j "$JOBS"
log="$BUILD/m3qkv_ctest.log"
junit="$BUILD/m3qkv_ctest.xml"
rm -f "$junit"
# ctest's full output goes to $log; the terminal gets the failures (with their
# output) and ctest's closing lines, not a line per passed / skipped / disabled
# test nor the list of skipped ones.
set +e
ctest --test-dir "$BUILD" --output-on-failure --output-junit "$(cd "$BUILD" && pwd)/m3qkv_ctest.xml" \
  -j "${CTEST_PARALLEL_LEVEL:-$(nproc)}" "$@" 2>&1 | tee "$log" | awk '
  /^The following tests did not run:/ { in_list = 1; next }
  in_list && /^\t/ { next }
  { in_list = 0 }
  /^ +Start +[0-9]+: / || /^Internal ctest changing into directory/ { next }
  / Test +#[0-9]+: .*(   Passed|\*\*\*Skipped|\*\*\*Not Run \(Disabled\)) +[0-9.]+ sec$/ { next }
  { print; fflush() }'
rc=${PIPESTATUS[0]}
set -e
# Counts from ctest's own closing lines: "P% tests passed, F tests failed out
# of T" (T counts skipped tests, not disabled ones) and the "did not run" list.
ct_total=$(sed -nE 's/^[0-9]+% tests passed, [0-9]+ tests? failed out of ([0-9]+)$/\1/p' "$log" | tail -1)
ct_failed=$(sed -nE 's/^[0-9]+% tests passed, ([0-9]+) tests? failed out of [0-9]+$/\1/p' "$log" | tail -1)
ct_skipped=$(grep -cE '^[[:space:]]+[0-9]+ - .* \(Skipped\)$' "$log" || true)
ct_disabled=$(grep -cE '^[[:space:]]+[0-9]+ - .* \(Disabled\)$' "$log" || true)
ct_total=${ct_total:-0}
ct_failed=${ct_failed:-0}
ct_passed=$((ct_total - ct_failed - ct_skipped))
if ((rc != 0 && ct_failed == 0)); then
  # ctest failed without a failed test (no tests found, a bad argument):
  # count it as one failure so that the closing line says so.
  ct_failed=1
fi

# The Python package's tests (python/tests) against this build, from the
# source tree, when torch and pytest are importable (CPU-only machines run the
# CPU tests; the gpu-marked ones need a GPU). .ci/run also runs them on a
# pip-installed copy.
py=${PYTHON:-python3}
py_line="pytest: not run: $py cannot import torch and pytest (pip install torch pytest)"
py_passed=0 py_failed=0 py_skipped=0
if "$py" -c "import torch, pytest" >/dev/null 2>&1; then
  echo
  echo "run_tests: Python tests (python/tests, $("$py" -c 'import torch; print("torch", torch.__version__)'))"
  bdir=$(cd "$BUILD" && pwd)
  pyjunit="$bdir/m3qkv_pytest.xml"
  rm -f "$pyjunit"
  # The C++ torch ops of this build when CMake built them (torch importable
  # by $PYTHON at configure time; opted in: the default is ctypes), else the ctypes ops.
  tops=()
  [[ -f "$bdir/libm3qkv_torch_ops.so" ]] && tops=(M3QKV_TORCH_OPS=auto M3QKV_TORCH_OPS_LIBRARY="$bdir/libm3qkv_torch_ops.so")
  set +e
  env M3QKV_LIBRARY="$bdir/libm3qkv.so" M3QKV_GOLDEN_LIBRARY="$bdir/libm3qkv_golden_capi.so" "${tops[@]}" \
    M3QKV_REPO_ROOT="$ROOT" PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" \
    "$py" -m pytest -q -p no:cacheprovider --junitxml="$pyjunit" "$ROOT/python/tests"
  prc=$?
  set -e
  # passed failed skipped, from pytest's JUnit file (errors count as failures).
  read -r py_passed py_failed py_skipped < <("$py" - "$pyjunit" <<'PY' 2>/dev/null || echo "0 1 0"
import sys, xml.etree.ElementTree as ET
r = ET.parse(sys.argv[1]).getroot()
s = r if r.tag == "testsuite" else r.find("testsuite")
t, f, e, k = (int(s.get(x, 0)) for x in ("tests", "failures", "errors", "skipped"))
print(t - f - e - k, f + e, k)
PY
  )
  if ((prc != 0 && py_failed == 0)); then py_failed=1; fi
  ((rc == 0)) && rc=$prc
  py_line="pytest: $py_passed passed, $py_failed failed, $py_skipped skipped"
fi

echo
echo "run_tests: ctest: $ct_passed passed, $ct_failed failed, $ct_skipped skipped" \
  "($ct_disabled DISABLED_ tests not run; full output: $log)"
if ((ct_skipped > 0)); then
  # Why, once per distinct GTEST_SKIP message (from ctest's JUnit file).
  if [[ -f "$junit" ]] && command -v python3 >/dev/null 2>&1; then
    python3 "$ROOT/tools/skip_reasons.py" "$junit" | sed 's/^/run_tests: ctest: /'
  else
    echo "run_tests: ctest: skip reasons: see $log"
  fi
fi
echo "run_tests: $py_line"
if ((py_skipped > 0)) && [[ -f "${pyjunit:-}" ]]; then
  "$py" "$ROOT/tools/skip_reasons.py" "$pyjunit" | sed 's/^/run_tests: pytest: /'
fi
# The closing line (CI reads it): ctest and pytest together.
echo "$((ct_passed + py_passed)) passed, $((ct_failed + py_failed)) failed, $((ct_skipped + py_skipped)) skipped"
exit "$rc"
