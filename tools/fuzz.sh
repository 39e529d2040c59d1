#!/usr/bin/env bash
# The CPU sanitizer jobs of the host layer, built with clang outside CMake
# (no nvcc, no GPU; a few seconds of compiling each):
#
#   tools/fuzz.sh fuzz [SECONDS] [MIN_EXECS]
#       libFuzzer target tests/fuzz/fuzz_validate.cpp (-fsanitize=fuzzer,
#       address,undefined) over the validation of the four argument structs,
#       from the checked-in corpus tests/fuzz/corpus with a fixed seed
#       (M3QKV_FUZZ_SEED, default 30): MIN_EXECS inputs (default 0: for
#       SECONDS, default 60), stopped after SECONDS at most. A count, not a
#       time, so the work done does not depend on the machine's speed. Fails
#       when the fuzzer reports a crash / sanitizer error / invariant
#       violation, or when SECONDS ran out before MIN_EXECS inputs. Prints the
#       number of executions.
#   tools/fuzz.sh corpus
#       Regenerates tests/fuzz/corpus: one file per header byte of interest
#       plus the inputs a short fixed-seed run keeps (merged to a minimum).
#   tools/fuzz.sh tsan [SECONDS]
#       ThreadSanitizer stress of the C API on the fake CUDA table
#       (tests/tsan/api_stress.cpp, -fsanitize=thread), SECONDS default 15.
#
# Build directory: M3QKV_SAN_BUILD (default build-san; git-ignored), jobs:
# M3QKV_JOBS (default 2). Needs clang++ with compiler-rt (Debian: clang
# libclang-rt-dev) and the CUDA toolkit's headers and libcudart_static.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
MODE=${1:-fuzz}
BUILD=${M3QKV_SAN_BUILD:-build-san}
JOBS=${M3QKV_JOBS:-2}
CXX=${CXX_SAN:-clang++}
SEED=${M3QKV_FUZZ_SEED:-30}

cuda_root() {
  local nvcc
  nvcc=$(command -v nvcc || true)
  [[ -z "$nvcc" && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
  if [[ -n "$nvcc" ]]; then
    cd "$(dirname "$(readlink -f "$nvcc")")/.." && pwd
  elif [[ -d /usr/local/cuda/include ]]; then
    echo /usr/local/cuda
  else
    echo "tools/fuzz.sh: no CUDA toolkit (nvcc or /usr/local/cuda)" >&2
    return 1
  fi
}
CUDA=$(cuda_root)
command -v "$CXX" >/dev/null || { echo "tools/fuzz.sh: $CXX not found (apt-get install clang libclang-rt-dev)" >&2; exit 1; }

COMMON=(-std=c++17 -g -fno-omit-frame-pointer -Iinclude -Isrc -I. -Itests -isystem "$CUDA/include")
LIBS=(-L"$CUDA/lib64" -lcudart_static -ldl -lrt -lpthread)

# objects <objdir> <cflags (array name)> <sources...>: compiles in parallel
# ($JOBS at a time); OBJS = the objects.
objects() {
  local dir=$1
  local -n oflags=$2
  shift 2
  mkdir -p "$dir"
  OBJS=()
  local src o pids=() rc=0 n=0 p
  for src in "$@"; do
    o="$dir/$(echo "$src" | tr / _).o"
    OBJS+=("$o")
    "$CXX" "${COMMON[@]}" "${oflags[@]}" -c "$src" -o "$o" &
    pids+=($!)
    n=$((n + 1))
    if ((n % JOBS == 0)); then
      for p in "${pids[@]}"; do wait "$p" || rc=1; done
      pids=()
    fi
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  ((rc == 0)) || { echo "tools/fuzz.sh: compiling in $dir failed" >&2; return 1; }
}

HOST_SOURCES=(src/host/*.cpp src/api/status.cpp src/api/validate.cpp src/api/extents.cpp src/api/backend_choice.cpp
              src/api/checked.cpp src/api/fault.cpp src/api/overrides.cpp)

build_fuzz() {
  local t0=$SECONDS objs
  # The code under test with libFuzzer's coverage; the harness without it
  # (its own branches would only slow every execution down).
  # shellcheck disable=SC2034  # passed by name
  local cov=(-O2 -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all)
  # shellcheck disable=SC2034
  local plain=(-O2 -fsanitize=address,undefined -fno-sanitize-recover=all)
  objects "$BUILD/fuzz" cov "${HOST_SOURCES[@]}"
  objs=("${OBJS[@]}")
  objects "$BUILD/fuzz" plain tests/fuzz/fuzz_validate.cpp
  "$CXX" -fsanitize=fuzzer,address,undefined "${objs[@]}" "${OBJS[@]}" "${LIBS[@]}" -o "$BUILD/fuzz_validate"
  echo "built $BUILD/fuzz_validate in $((SECONDS - t0)) s ($CXX, $("$CXX" --version | head -1))"
}

run_fuzz() {
  local secs=${1:-60} min=${2:-0} work log rc execs runs t0
  build_fuzz
  runs=$((min > 0 ? min : -1))  # libFuzzer: -1 = no limit on the count
  work="$BUILD/fuzz-work"
  rm -rf "$work" && mkdir -p "$work/corpus" "$work/artifacts"
  log="$work/fuzz.log"
  t0=$SECONDS
  set +e
  # New inputs go to the scratch corpus (first directory); the checked-in one is read only.
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$BUILD/fuzz_validate" -seed="$SEED" -max_total_time="$secs" -runs="$runs" -print_final_stats=1 \
    -timeout=10 -rss_limit_mb=2048 -max_len=256 -artifact_prefix="$work/artifacts/" \
    "$work/corpus" tests/fuzz/corpus >"$log" 2>&1
  rc=$?
  set -e
  grep -vE '^#[0-9]+\s+(NEW|REDUCE|pulse)' "$log" | tail -40
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  execs=${execs:-0}
  echo "fuzz_validate: $execs executions in $((SECONDS - t0)) s (limit $secs s, seed $SEED), exit $rc"
  if ((rc != 0)) || ls "$work/artifacts/"* >/dev/null 2>&1; then
    echo "fuzz_validate: FAILED: a crash, sanitizer report or invariant violation (inputs in $work/artifacts)" >&2
    return 1
  fi
  if ((execs < min)); then
    echo "fuzz_validate: FAILED: $execs executions < the required $min" >&2
    return 1
  fi
}

make_corpus() {
  local dir=tests/fuzz/corpus work
  build_fuzz
  work="$BUILD/corpus-work"
  rm -rf "$work" && mkdir -p "$work/run" "$work/seeds"
  # Header-only inputs: every entry point x base variant, laid out back to
  # back without gaps and with random gaps (tests/fuzz/fuzz_validate.cpp).
  local h
  for h in $(seq 0 127); do
    (( (h >> 4 & 1) == 0 && (h >> 5 & 3) % 3 == 0 )) || continue
    printf "\\x$(printf %02x "$h")" >"$work/seeds/h$(printf %03d "$h")"
  done
  M3QKV_FUZZ_QUIET=1 "$BUILD/fuzz_validate" -seed="$SEED" -runs="${M3QKV_CORPUS_RUNS:-300}" -max_len=48 \
    "$work/run" "$work/seeds" >"$work/run.log" 2>&1
  # The smallest set of the seeds and the run's inputs that reaches the same edges.
  rm -rf "$dir" && mkdir -p "$dir"
  M3QKV_FUZZ_QUIET=1 "$BUILD/fuzz_validate" -merge=1 -use_counters=0 "$dir" "$work/seeds" "$work/run" >"$work/merge.log" 2>&1
  echo "tests/fuzz/corpus: $(ls "$dir" | wc -l) files, $(du -sb "$dir" | cut -f1) bytes"
}

build_tsan() {
  local t0=$SECONDS objs
  # shellcheck disable=SC2034  # passed by name
  local tsan=(-O1 -fsanitize=thread -Itests/cpu)
  # The golden model (the self-test's, not run here) uninstrumented: its
  # function multiversioning resolvers run before TSan is initialized.
  # shellcheck disable=SC2034
  local plain=(-O1)
  objects "$BUILD/tsan" tsan "${HOST_SOURCES[@]}" src/api/selftest.cpp tests/tsan/api_stress.cpp
  objs=("${OBJS[@]}")
  objects "$BUILD/tsan" plain src/golden/golden.cpp src/golden/problem.cpp
  "$CXX" -fsanitize=thread "${objs[@]}" "${OBJS[@]}" "${LIBS[@]}" -o "$BUILD/api_stress"
  echo "built $BUILD/api_stress in $((SECONDS - t0)) s"
}

run_tsan() {
  local secs=${1:-15}
  build_tsan
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 exitcode=66" "$BUILD/api_stress" "$secs"
}

case $MODE in
  fuzz) run_fuzz "${2:-60}" "${3:-0}" ;;
  corpus) make_corpus ;;
  tsan) run_tsan "${2:-15}" ;;
  build) build_fuzz && build_tsan ;;
  build-fuzz) build_fuzz ;;
  *) echo "usage: tools/fuzz.sh fuzz [SECONDS] [MIN_EXECS] | corpus | tsan [SECONDS] | build | build-fuzz" >&2; exit 2 ;;
esac
