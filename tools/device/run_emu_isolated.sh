#!/usr/bin/env bash
# Runs every tcgen05-emulation GPU test in its own process (a trap in the
# emulation kills the CUDA context, which would fail every later test of the
# same process), on a build made with -DM3QKV_TCGEN05_EMULATION=ON.
#   bash tools/device/run_emu_isolated.sh [build-dir] [filter] [per-test seconds]
# Writes one line per test (PASS / FAIL / TIMEOUT) and, for failures, the test's
# output to $OUT/emu_isolated.log; prints the counts last.
set -uo pipefail
BUILD=${1:-build-dev}
FILTER=${2:-*Sm100Emu*}
LIMIT=${3:-30}
OUT=${OUT:-.}
BIN="$BUILD/tests/m3qkv_gpu_tests"
LOG="$OUT/emu_isolated.log"
: >"$LOG"
mapfile -t tests < <("$BIN" --gtest_list_tests --gtest_filter="$FILTER" | awk '
  /^[^ ]/ {suite=$1; next}
  /^  / {print suite $1}')
pass=0 fail=0 tout=0
for t in "${tests[@]}"; do
  out=$(timeout "$LIMIT" "$BIN" --gtest_filter="$t" --gtest_color=no 2>&1)
  rc=$?
  if ((rc == 0)) && grep -q "^\[  PASSED  \] 1 test" <<<"$out"; then
    echo "PASS    $t" >>"$LOG"; ((pass++))
  elif ((rc == 124 || rc == 137)); then
    echo "TIMEOUT $t" >>"$LOG"; ((tout++))
  else
    echo "FAIL    $t" >>"$LOG"; ((fail++))
    grep -v "^\[m3qkv tcgen05 emulation\] block" <<<"$out" | head -c 3000 | sed 's/^/        /' >>"$LOG"
    grep -o "\[m3qkv tcgen05 emulation\][^[]*" <<<"$out" | sort | uniq -c | sort -rn | head -5 | sed 's/^/        /' >>"$LOG"
  fi
done
echo "emu isolated: $pass passed, $fail failed, $tout timed out (of ${#tests[@]})" | tee -a "$LOG"
