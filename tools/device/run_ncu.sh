#!/usr/bin/env bash
# Nsight Compute on chosen benchmark entries, in one device call. Run from the
# repository root:
#
#   NCU_CASES='name@filter@kernel_regex;...' bash tools/device/run_ncu.sh
#
# e.g. NCU_CASES='fp8w@^insert_fp8_warp/TP:1/M:1/@insert_warp' ('@' separates:
# the filters hold ':'). For each case
# the bench runs with --benchmark_filter=<filter> under ncu, which profiles
# one launch (after NCU_SKIP, default 8, warm-up launches) of the kernels
# matching <kernel_regex> with --set full (base clocks, ncu's default). Output
# in $OUT (at most 8 files come back):
#   ncu_details.txt  every case's details page (speed of light, memory,
#                    launch, occupancy, warp state, instruction statistics)
#   ncu_top.txt      every case's top SASS instructions by stall samples
#                    (tools/device/ncu_top.py) and the totals per reason
#   ncu.log          build and console output
#   ncu_<name>.csv.gz  with NCU_CSV=1: the whole SASS source page (every
#                    instruction's samples), for reading a kernel's waits
# Env: ARCHS (default "80;90a": the portable kernels need the 80 target), BUILD (default build-ncu), JOBS (16), NCU_SKIP,
# M3QKV_BENCH_TARGET_S (default 0.001: a profile needs few iterations).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/.devout}
mkdir -p "$OUT"
BUILD=${BUILD:-build-ncu}
ARCHS=${ARCHS:-80;90a}
JOBS=${JOBS:-16}
SKIP=${NCU_SKIP:-8}
export PATH="$PATH:/usr/local/cuda/bin"
export M3QKV_BENCH_TARGET_S=${M3QKV_BENCH_TARGET_S:-0.001}
LOG="$OUT/ncu.log"
: >"$LOG"
: >"$OUT/ncu_details.txt"
: >"$OUT/ncu_top.txt"

{ cmake -S . -B "$BUILD" -DM3QKV_CUDA_ARCHS="$ARCHS" -DCMAKE_BUILD_TYPE=Release &&
  cmake --build "$BUILD" -j "$JOBS" --target m3qkv_bench; } >>"$LOG" 2>&1 || {
  echo "build failed" | tee -a "$LOG"
  exit 1
}
BIN=$(find "$BUILD" -name m3qkv_bench -type f -perm -u+x | head -1)
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)

IFS=';' read -r -a CASES <<<"${NCU_CASES:?set NCU_CASES}"
for c in "${CASES[@]}"; do
  IFS='@' read -r name filter kern <<<"$c"
  rep="/tmp/ncu_$name"
  echo "=== $name: filter $filter kernel $kern" | tee -a "$LOG" "$OUT/ncu_details.txt" "$OUT/ncu_top.txt" >/dev/null
  timeout 240 "$NCU" --set full --import-source no -k "regex:$kern" --launch-skip "$SKIP" -c 1 -f -o "$rep" \
    "$BIN" --benchmark_filter="$filter" >>"$LOG" 2>&1 || echo "ncu rc=$? for $name" | tee -a "$LOG"
  [[ -f "$rep.ncu-rep" ]] || continue
  "$NCU" -i "$rep.ncu-rep" --page details >>"$OUT/ncu_details.txt" 2>&1
  "$NCU" -i "$rep.ncu-rep" --page source --csv --print-source sass >"/tmp/ncu_$name.csv" 2>>"$LOG"
  python3 tools/device/ncu_top.py "/tmp/ncu_$name.csv" 60 >>"$OUT/ncu_top.txt" 2>&1
  [[ -n "${NCU_CSV:-}" ]] && gzip -c "/tmp/ncu_$name.csv" >"$OUT/ncu_$name.csv.gz"
done
echo "done" >>"$LOG"
