#!/usr/bin/env bash
# The whole GPU suite in one device call (H200: 16 cores, CUDA 13.0, GoogleTest,
# Google Benchmark, compute-sanitizer). Run from the repository root:
#
#   bash tools/device/run_gpu_suite.sh
#
# As one call of the device tool (machine kind nvidia-h200):
#   run(command="bash tools/device/run_gpu_suite.sh", timeout_s=600)
# with knobs as env in front, e.g. "SKIP_BENCH=1 GTEST_FILTER='*Fused*' bash ...".
# A warm machine keeps build-dev/ (ignored by git) between calls: later builds
# are incremental.
#
# Steps, each under its own time limit and the whole under TOTAL_BUDGET seconds
# (a device command may run 10 minutes): build (build-dev/, -j16), nvidia-smi,
# GPU tests, CPU tests, compute-sanitizer memcheck + racecheck + synccheck, demo, benchmark.
# On a build with -DM3QKV_TCGEN05_EMULATION=ON the tcgen05-emulation tests run
# in a separate step, each in its own process (tools/device/run_emu_isolated.sh:
# a trap in the model kills the CUDA context), and the main GPU test step
# leaves them out.
# A failing step never stops the next one; a step whose binary is missing is
# reported as "skip". The last thing printed is the summary table.
#
# Env knobs:
#   ARCHS            M3QKV_CUDA_ARCHS for the build (default "80;90a")
#   EXTRA_CMAKE_ARGS more configure options, e.g. -DM3QKV_TCGEN05_EMULATION=ON
#   GTEST_FILTER     filter for the GPU tests (default "*"; not applied to CPU tests)
#   SANITIZER_FILTER GPU tests run under compute-sanitizer (default "*Sanitizer*")
#   SKIP_BENCH=1     no benchmark;  BENCH_FILTER  --benchmark_filter (default ".")
#   BENCH_ARGS       extra benchmark arguments (e.g. --benchmark_min_time=0.2s)
#   SKIP_CPU_TESTS=1, SKIP_SANITIZER=1, SKIP_DEMO=1   leave out those steps
#   SKIP_BUILD=1     use build-dev/ as it is (a warm machine keeps it between calls)
#   DEMO_M           tokens for the demo (default: the demo's own default)
#   TOTAL_BUDGET     seconds for the whole script (default 540)
#   <STEP>_TIMEOUT   per-step limits: BUILD_TIMEOUT (300), GPU_TESTS_TIMEOUT (240),
#                    CPU_TESTS_TIMEOUT (90), MEMCHECK_TIMEOUT (90),
#                    RACECHECK_TIMEOUT (90), SYNCCHECK_TIMEOUT (90), EMU_TIMEOUT (240),
#                    DEMO_TIMEOUT (60), BENCH_TIMEOUT (150)
#   EMU_FILTER       emulation tests for the isolated step (default "*Sm100Emu*")
#   SMOKE_FILTER     GPU tests run first under SMOKE_TIMEOUT (60); when any of
#                    them fails or hangs, every later GPU step is skipped (a
#                    barrier bug would otherwise spend each step's whole limit)
#
# Files written to $OUT (at most 8 come back from the device machine; names
# only [A-Za-z0-9._-]):
#   build.log  gpu_tests.log  gpu_tests.json  sanitizer.log  bench.json
#   emu_isolated.log (emulation builds only; replaces gpu_tests.json in the 8)
#   misc.log (environment, nvidia-smi, CPU tests, demo, benchmark console)
#   summary.txt
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/.devout}
mkdir -p "$OUT"
BUILD=build-dev
ARCHS=${ARCHS:-80;90a}
GPU_FILTER=${GTEST_FILTER:-*}
unset GTEST_FILTER # gtest reads it from the environment: keep it off the CPU tests
SAN_FILTER=${SANITIZER_FILTER:-*Sanitizer*}
TOTAL_BUDGET=${TOTAL_BUDGET:-540}
JOBS=${JOBS:-16}
export PATH="$PATH:/usr/local/cuda/bin"

T0=$(date +%s)
DEADLINE=$((T0 + TOTAL_BUDGET))
MISC="$OUT/misc.log"
: >"$MISC"

S_NAME=() S_RC=() S_SEC=() S_PASS=() S_FAIL=() S_SKIP=() S_NOTE=()
record() { # name rc secs pass fail skip note
  S_NAME+=("$1") S_RC+=("$2") S_SEC+=("$3") S_PASS+=("$4") S_FAIL+=("$5") S_SKIP+=("$6") S_NOTE+=("$7")
}

# run_step <name> <default timeout> <log file> <command...>
# Appends the command's output to the log; sets STEP_RC and STEP_SECS.
run_step() {
  local name=$1 limit=$2 log=$3
  shift 3
  local now left t
  now=$(date +%s)
  left=$((DEADLINE - now - 5))
  STEP_SECS=0
  if ((left < 5)); then
    STEP_RC=skip
    echo "### $name: skipped, out of time budget (TOTAL_BUDGET=$TOTAL_BUDGET)" | tee -a "$log"
    return
  fi
  ((limit > left)) && limit=$left
  echo "### $name (limit ${limit}s): $*" >>"$log"
  echo "### $name (limit ${limit}s)"
  t=$(date +%s)
  timeout --signal=TERM --kill-after=10 "$limit" "$@" >>"$log" 2>&1
  STEP_RC=$?
  STEP_SECS=$(($(date +%s) - t))
  ((STEP_RC == 124 || STEP_RC == 137)) && echo "### $name: TIMED OUT after ${limit}s" >>"$log"
  echo "### $name: rc=$STEP_RC ${STEP_SECS}s" >>"$log"
  tail -n 3 "$log" | sed 's/^/    /'
}

# gtest counts from a log, robust to a run cut short: "[       OK ]",
# "[  FAILED  ] X (N ms)", "[  SKIPPED ] X (N ms)" lines, one per test. The
# output of child processes (printed between "---- child" and "---- end of
# child ----" by expect_child_passes) is not counted: its test is the parent's.
gtest_counts() { # log [start line] -> "pass fail skip"
  local log=$1 from=${2:-1}
  tail -n +"$from" "$log" | awk '
    /^---- child / {child = 1; next}
    /^---- end of child ----/ {child = 0; next}
    child {next}
    /^\[       OK \]/ {p++}
    /^\[  FAILED  \] .*\([0-9]+ ms\)$/ {f++}
    /^\[  SKIPPED \] .*\([0-9]+ ms\)$/ {s++}
    END {printf "%d %d %d\n", p, f, s}'
}

# find_bin <name>: the executable in the build tree (tests/ and bench/ are subdirectories)
find_bin() {
  local d
  for d in "$BUILD" "$BUILD/tests" "$BUILD/bench" "$BUILD/tools/demo"; do
    [[ -x "$d/$1" && -f "$d/$1" ]] && { echo "$d/$1"; return; }
  done
  echo "$BUILD/$1" # missing: the caller reports "not built"
}

note_timeout() {
  if [[ "$STEP_RC" == 124 || "$STEP_RC" == 137 ]]; then echo "TIMED OUT ${1:-}"; else echo "${1:-}"; fi
}

# ---------------------------------------------------------------------------
{
  echo "=== environment"
  date -u
  uname -a
  nvcc --version 2>&1 | tail -2
  cmake --version | head -1
  echo "ARCHS=$ARCHS GPU_FILTER=$GPU_FILTER SANITIZER_FILTER=$SAN_FILTER BENCH_FILTER=${BENCH_FILTER:-.}"
} >>"$MISC" 2>&1

# --- build ------------------------------------------------------------------
BUILD_LOG="$OUT/build.log"
: >"$BUILD_LOG"
# (timeout runs programs, not shell functions: the build is one bash -c)
BUILD_CMD='cmake -S . -B "$BUILD" -DM3QKV_CUDA_ARCHS="$ARCHS" -DCMAKE_BUILD_TYPE=Release $EXTRA_CMAKE_ARGS || exit $?
# keep going past one broken target so that the others still get built
if [[ -f "$BUILD/build.ninja" ]]; then k=(-k 0); else k=(-k); fi
cmake --build "$BUILD" -j "$JOBS" -- "${k[@]}"'
EXTRA_CMAKE_ARGS=${EXTRA_CMAKE_ARGS:-}
export BUILD ARCHS JOBS EXTRA_CMAKE_ARGS
if [[ "${SKIP_BUILD:-0}" == 1 ]]; then
  record build skip 0 - - - "SKIP_BUILD=1: using $BUILD as it is"
else
  run_step build "${BUILD_TIMEOUT:-300}" "$BUILD_LOG" bash -c "$BUILD_CMD"
  record build "$STEP_RC" "$STEP_SECS" - - - "$(note_timeout "ARCHS=$ARCHS")"
fi

# --- nvidia-smi ---------------------------------------------------------------
run_step nvidia-smi 20 "$MISC" nvidia-smi
record nvidia-smi "$STEP_RC" "$STEP_SECS" - - - "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"

# --- GPU tests ----------------------------------------------------------------
GPU_BIN=$(find_bin m3qkv_gpu_tests)
GPU_LOG="$OUT/gpu_tests.log"
: >"$GPU_LOG"
EMU_BUILD=0
grep -q '^M3QKV_TCGEN05_EMULATION:BOOL=ON' "$BUILD/CMakeCache.txt" 2>/dev/null && EMU_BUILD=1
GPU_JSON=(--gtest_output="json:$OUT/gpu_tests.json")
if ((EMU_BUILD)); then
  # The emulation tests run in the isolated step below; gtest's JSON is left
  # out to keep at most 8 files in $OUT (the log has every result).
  GPU_JSON=()
  if [[ "$GPU_FILTER" == *-* ]]; then GPU_FILTER="$GPU_FILTER:*Sm100Emu*"; else GPU_FILTER="$GPU_FILTER-*Sm100Emu*"; fi
fi
SMOKE_OK=1
if [[ -n "${SMOKE_FILTER:-}" && -x "$GPU_BIN" ]]; then
  run_step smoke "${SMOKE_TIMEOUT:-60}" "$GPU_LOG" "$GPU_BIN" --gtest_filter="$SMOKE_FILTER" --gtest_color=no
  read -r p f s < <(gtest_counts "$GPU_LOG")
  record smoke "$STEP_RC" "$STEP_SECS" "$p" "$f" "$s" "$(note_timeout "filter $SMOKE_FILTER")"
  if [[ "$STEP_RC" != 0 ]]; then
    SMOKE_OK=0
    GPU_BIN="$GPU_BIN.smoke-failed"  # every later step that needs it reports "not built"
  fi
fi
if [[ -x "$GPU_BIN" ]]; then
  run_step gpu_tests "${GPU_TESTS_TIMEOUT:-240}" "$GPU_LOG" \
    "$GPU_BIN" --gtest_filter="$GPU_FILTER" "${GPU_JSON[@]}" --gtest_color=no
  read -r p f s < <(gtest_counts "$GPU_LOG")
  record gpu_tests "$STEP_RC" "$STEP_SECS" "$p" "$f" "$s" "$(note_timeout "filter $GPU_FILTER")"
else
  record gpu_tests skip 0 - - - "not built"
fi

# --- tcgen05 emulation tests, one process each (emulation builds) -------------
if ((EMU_BUILD)) && [[ -x "$GPU_BIN" ]]; then
  run_step emu_isolated "${EMU_TIMEOUT:-240}" "$MISC" \
    env OUT="$OUT" bash tools/device/run_emu_isolated.sh "$BUILD" "${EMU_FILTER:-*Sm100Emu*}" 30
  counts=$(grep -o "emu isolated: .*" "$OUT/emu_isolated.log" 2>/dev/null | tail -1)
  read -r p f t < <(sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed, ([0-9]+) timed out.*/\1 \2 \3/' <<<"${counts:-x}")
  [[ "$p" =~ ^[0-9]+$ ]] || { p=- f=- t=-; }
  record emu_isolated "$STEP_RC" "$STEP_SECS" "$p" "$f" - "$(note_timeout "${counts:-no result line}")"
fi

# --- CPU tests ----------------------------------------------------------------
CPU_BIN=$(find_bin m3qkv_cpu_tests)
if [[ "${SKIP_CPU_TESTS:-0}" == 1 ]]; then
  record cpu_tests skip 0 - - - "SKIP_CPU_TESTS=1"
elif [[ -x "$CPU_BIN" ]]; then
  start=$(($(wc -l <"$MISC") + 1))
  run_step cpu_tests "${CPU_TESTS_TIMEOUT:-90}" "$MISC" "$CPU_BIN" --gtest_color=no
  read -r p f s < <(gtest_counts "$MISC" "$start")
  record cpu_tests "$STEP_RC" "$STEP_SECS" "$p" "$f" "$s" "$(note_timeout)"
else
  record cpu_tests skip 0 - - - "not built"
fi

# --- compute-sanitizer --------------------------------------------------------
SAN_LOG="$OUT/sanitizer.log"
: >"$SAN_LOG"
if [[ "${SKIP_SANITIZER:-0}" == 1 ]]; then
  for tool in memcheck racecheck synccheck; do record "$tool" skip 0 - - - "SKIP_SANITIZER=1"; done
elif ! command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck synccheck; do record "$tool" skip 0 - - - "no compute-sanitizer"; done
elif [[ -x "$GPU_BIN" ]]; then
  for tool in memcheck racecheck synccheck; do
    var=$(echo "$tool" | tr a-z A-Z)_TIMEOUT
    start=$(($(wc -l <"$SAN_LOG") + 1))
    extra=()
    [[ $tool == memcheck ]] && extra=(--leak-check full)
    run_step "$tool" "${!var:-90}" "$SAN_LOG" \
      compute-sanitizer --tool "$tool" "${extra[@]}" --error-exitcode 99 \
      "$GPU_BIN" --gtest_filter="$SAN_FILTER" --gtest_color=no
    read -r p f s < <(gtest_counts "$SAN_LOG" "$start")
    summary_line=$(tail -n +"$start" "$SAN_LOG" | grep -E "ERROR SUMMARY|RACECHECK SUMMARY" | tail -1 | sed 's/^========= //')
    ((p + f + s == 0)) && summary_line="NO TEST MATCHED '$SAN_FILTER'; $summary_line"
    record "$tool" "$STEP_RC" "$STEP_SECS" "$p" "$f" "$s" "$(note_timeout "$summary_line")"
  done
else
  for tool in memcheck racecheck synccheck; do record "$tool" skip 0 - - - "gpu tests not built"; done
fi

# --- demo ---------------------------------------------------------------------
if [[ "${SKIP_DEMO:-0}" == 1 ]]; then
  record demo skip 0 - - - "SKIP_DEMO=1"
elif ((SMOKE_OK == 0)); then
  record demo skip 0 - - - "smoke tests failed"
elif DEMO_BIN=$(find_bin m3qkv_demo) && [[ -x "$DEMO_BIN" ]]; then
  demo_args=()
  [[ -n "${DEMO_M:-}" ]] && demo_args=(--m "$DEMO_M")
  start=$(($(wc -l <"$MISC") + 1))
  run_step demo "${DEMO_TIMEOUT:-60}" "$MISC" "$DEMO_BIN" "${demo_args[@]}"
  verdict=$(tail -n +"$start" "$MISC" | grep -i -m1 "verdict" | cut -c1-70)
  record demo "$STEP_RC" "$STEP_SECS" - - - "$(note_timeout "$verdict")"
else
  record demo skip 0 - - - "not built"
fi

# --- benchmark ----------------------------------------------------------------
if [[ "${SKIP_BENCH:-0}" == 1 ]]; then
  record bench skip 0 - - - "SKIP_BENCH=1"
elif ((SMOKE_OK == 0)); then
  record bench skip 0 - - - "smoke tests failed"
elif BENCH_BIN=$(find_bin m3qkv_bench) && [[ -x "$BENCH_BIN" ]]; then
  # shellcheck disable=SC2206  # BENCH_ARGS is a word list on purpose
  # Each entry is a graph replay of many calls: 0.05 s per entry is plenty and keeps the
  # whole sweep inside the step limit (the default 0.5 s did not, run 3).
  bench_extra=(${BENCH_ARGS:---benchmark_min_time=0.05s})
  run_step bench "${BENCH_TIMEOUT:-150}" "$MISC" "$BENCH_BIN" \
    --benchmark_filter="${BENCH_FILTER:-.}" --benchmark_out="$OUT/bench.json" \
    --benchmark_out_format=json "${bench_extra[@]}"
  nb=$([[ -f "$OUT/bench.json" ]] && python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["benchmarks"]))' \
    "$OUT/bench.json" 2>/dev/null || echo "?")
  record bench "$STEP_RC" "$STEP_SECS" "$nb" - - "$(note_timeout "benchmarks in bench.json: $nb")"
else
  record bench skip 0 - - - "not built"
fi

# --- summary --------------------------------------------------------------------
FAILED=0
for rc in "${S_RC[@]}"; do
  [[ "$rc" != 0 && "$rc" != skip ]] && FAILED=$((FAILED + 1))
done
{
  echo
  echo "=== GPU suite summary ($(($(date +%s) - T0)) s of ${TOTAL_BUDGET} s budget; logs in \$OUT)"
  printf '%-11s %5s %6s %6s %6s %6s  %s\n' step rc secs pass fail skip note
  for i in "${!S_NAME[@]}"; do
    printf '%-11s %5s %6s %6s %6s %6s  %s\n' "${S_NAME[$i]}" "${S_RC[$i]}" "${S_SEC[$i]}" \
      "${S_PASS[$i]}" "${S_FAIL[$i]}" "${S_SKIP[$i]}" "${S_NOTE[$i]}"
  done
  if ((FAILED)); then echo "GPU suite: $FAILED step(s) FAILED"; else echo "GPU suite: all steps run passed"; fi
} | tee "$OUT/summary.txt"
((FAILED == 0))
