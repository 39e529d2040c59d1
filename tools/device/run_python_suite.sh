#!/usr/bin/env bash
# The Python package's tests and its overhead measurement on a GPU machine, in
# one device call, after tools/device/run_gpu_suite.sh built build-dev/ with
# EXTRA_CMAKE_ARGS=-DM3QKV_BUILD_TORCH_OPS=ON (so libm3qkv_torch_ops.so exists).
# Run from the repository root:
#
#   bash tools/device/run_python_suite.sh
#
# Steps (each logged to $OUT/python_*.log): pytest with the C++ torch ops
# (M3QKV_TORCH_OPS=cpp), pytest with the ctypes kernels (the fallback), the
# vLLM example, and python/tools/measure_overhead.py --json $OUT/h200_python.json.
# Env: BUILD (default build-dev), PYTHON (python3), PYTEST_ARGS (more pytest options),
# SKIP_CTYPES=1 leaves out the ctypes run, SKIP_OVERHEAD=1 the measurement.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/.devout}
mkdir -p "$OUT"
BUILD=${BUILD:-build-dev}
PY=${PYTHON:-python3}
LIB=$(ls "$ROOT/$BUILD"/libm3qkv.so 2>/dev/null)
OPS=$(find "$ROOT/$BUILD" -name libm3qkv_torch_ops.so -type f 2>/dev/null | head -1)
export M3QKV_LIBRARY="$LIB"
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
echo "library: ${LIB:-missing}; torch ops: ${OPS:-missing}"
summary=()
step() {  # step NAME TIMEOUT command...
  local name=$1 t=$2
  shift 2
  local t0=$SECONDS
  timeout "$t" "$@" >"$OUT/python_$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-10s rc=%-3d %4ds  %s' "$name" "$rc" $((SECONDS - t0)) "$(tail -1 "$OUT/python_$name.log")")")
}
if [ -n "$OPS" ]; then
  M3QKV_TORCH_OPS=cpp M3QKV_TORCH_OPS_LIBRARY="$OPS" step cpp_ops "${CPP_TIMEOUT:-240}" \
    "$PY" -m pytest -q -rs python/tests ${PYTEST_ARGS:-}
else
  summary+=("cpp_ops    skip: no libm3qkv_torch_ops.so in $BUILD")
fi
[ "${SKIP_CTYPES:-0}" = 1 ] || M3QKV_TORCH_OPS=ctypes step ctypes "${CTYPES_TIMEOUT:-240}" \
  "$PY" -m pytest -q -rs python/tests ${PYTEST_ARGS:-}
[ -f python/examples/vllm_minimax_m3.py ] && M3QKV_TORCH_OPS=${OPS:+cpp} M3QKV_TORCH_OPS_LIBRARY="$OPS" \
  step example 120 "$PY" python/examples/vllm_minimax_m3.py
[ "${SKIP_OVERHEAD:-0}" = 1 ] || M3QKV_TORCH_OPS=${OPS:+cpp} M3QKV_TORCH_OPS_LIBRARY="$OPS" \
  step overhead "${OVERHEAD_TIMEOUT:-180}" "$PY" python/tools/measure_overhead.py --json "$OUT/h200_python.json"
printf '%s\n' "${summary[@]}" | tee "$OUT/python_summary.txt"
