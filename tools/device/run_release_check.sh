#!/usr/bin/env bash
# Everything a release candidate needs from the H200, in one device call:
#   1. the GPU suite (tools/device/run_gpu_suite.sh: build-dev, GPU tests,
#      sanitizers; no bench) while the tcgen05-emulation build (build-emu/)
#      compiles beside it at nice 19 (it soaks the cores the GPU tests leave idle);
#   2. the emulation tests, each in its own process (run_emu_isolated.sh);
#   3. the Python package: pip install, its tests against the C golden model,
#      the demo, the host-overhead table;
#   4. the benchmark last, with nothing else running on the machine.
# Run from the repository root:  bash tools/device/run_release_check.sh
# Env: EMU=0 / PY=0 / BENCH=0 leave a part out; EMU_FILTER (*Sm100Emu*),
# EMU_LIMIT (seconds per emulation test, 60), EMU_TIMEOUT (all of them, 240);
# PY_INSTALL=1 (pip-install the package first); BENCH_FILTER (.), BENCH_TIMEOUT
# (150); SUITE_BUDGET (300 s for step 1); the suite's own knobs pass through.
# $OUT gets the suite's files (gpu_tests.json dropped: 8 files come back at
# most), emu_isolated.log, bench.json and extra.log (emulation build, Python,
# bench console, the sanitizer and misc logs folded in at the end).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
OUT=${OUT:-$PWD/.devout}
mkdir -p "$OUT"
EXTRA="$OUT/extra.log"
: >"$EXTRA"
t0=$SECONDS
note() { echo "### $* (t=$((SECONDS - t0)) s)" | tee -a "$EXTRA"; }

emu_pid=
if [[ ${EMU:-1} == 1 ]]; then
  (nice -n 19 cmake -S . -B build-emu -DM3QKV_CUDA_ARCHS="80;90a" -DM3QKV_TCGEN05_EMULATION=ON \
     -DM3QKV_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Release &&
   nice -n 19 cmake --build build-emu -j16 --target m3qkv_gpu_tests) >build-emu.log 2>&1 &
  emu_pid=$!
fi

note "suite"
SKIP_BENCH=1 SKIP_CPU_TESTS=1 TOTAL_BUDGET=${SUITE_BUDGET:-300} OUT="$OUT" \
  bash tools/device/run_gpu_suite.sh >>"$EXTRA" 2>&1
suite_rc=$?
rm -f "$OUT/gpu_tests.json"
note "suite rc=$suite_rc"

if [[ -n $emu_pid ]]; then
  wait "$emu_pid"
  emu_build_rc=$?
  tail -5 build-emu.log >>"$EXTRA"
  note "emulation build rc=$emu_build_rc"
  if ((emu_build_rc == 0)); then
    OUT="$OUT" timeout "${EMU_TIMEOUT:-240}" bash tools/device/run_emu_isolated.sh build-emu \
      "${EMU_FILTER:-*Sm100Emu*}" "${EMU_LIMIT:-60}" >>"$EXTRA" 2>&1
    note "emulation tests: $(tail -1 "$OUT/emu_isolated.log")"
  fi
fi

if [[ ${PY:-1} == 1 ]]; then
  # PY_INSTALL=1: pip-install the package (its own CMake build, ~45 s here);
  # else the source tree on build-dev's library (CI covers the install).
  note "python"
  py_env=(M3QKV_GOLDEN_LIBRARY="$PWD/build-dev/libm3qkv_golden_capi.so" M3QKV_REQUIRE_GOLDEN=1)
  if [[ ${PY_INSTALL:-0} == 1 ]]; then
    CMAKE_BUILD_PARALLEL_LEVEL=16 M3QKV_CUDA_ARCHS='80;90a' timeout 200 python3 -m pip install -q \
      --no-build-isolation --no-deps ./python >>"$EXTRA" 2>&1
    py_env+=(M3QKV_EXPECT_INSTALLED=1)
  else
    py_env+=(M3QKV_LIBRARY="$PWD/build-dev/libm3qkv.so" PYTHONPATH="$PWD/python")
  fi
  cmake --build build-dev --target m3qkv_golden_capi -j16 >/dev/null 2>&1
  env "${py_env[@]}" timeout 150 python3 -m pytest -q -rs -p no:cacheprovider python/tests >"$OUT/py.tmp" 2>&1
  py_rc=$?
  tail -60 "$OUT/py.tmp" >>"$EXTRA"
  rm -f "$OUT/py.tmp"
  env "${py_env[@]}" timeout 30 python3 -m m3qkv.demo --m 256 >>"$EXTRA" 2>&1
  demo_rc=$?
  env "${py_env[@]}" timeout 60 python3 python/tools/measure_overhead.py --m 1,64,256 >>"$EXTRA" 2>&1
  note "python tests rc=$py_rc, python demo rc=$demo_rc, overhead rc=$?"
fi

if [[ ${BENCH:-1} == 1 ]]; then
  note "bench"
  timeout "${BENCH_TIMEOUT:-150}" build-dev/bench/m3qkv_bench --benchmark_filter="${BENCH_FILTER:-.}" \
    --benchmark_out="$OUT/bench.json" --benchmark_out_format=json --benchmark_min_time=0.05s >>"$EXTRA" 2>&1
  note "bench rc=$?"
fi

for f in sanitizer.log misc.log; do
  [[ -f "$OUT/$f" ]] && { echo "===== $f" >>"$EXTRA"; cat "$OUT/$f" >>"$EXTRA"; rm -f "$OUT/$f"; }
done
cat "$OUT/summary.txt" 2>/dev/null
note "done"
