#!/usr/bin/env bash
# The standard sweep on an H200 (one device call): builds the benchmark
# (build-bench/, archs 80;90a), runs the entries bench/README.md tabulates —
# TP1/2/4/8 × M ∈ {1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 16384}:
# fused_sm90 (NVFP4 caches), fused_sm90_fp8, fused_sm90_xbf16_fp8, cublas_bf16,
# cublas_bf16+insert, cublaslt_fp8, cublaslt_fp8+insert, floor_read, plus
# copy_d2d and the peaks — and writes Google Benchmark JSON, then the tables
# and the plot (tools/bench_table.py).
#
#   bash tools/bench_sweep.sh [out.json]     (default bench/results/h200.json)
#
# Env: BENCH_FILTER (a --benchmark_filter replacing the standard one),
#      M3QKV_BENCH_TARGET_S (seconds per entry, default the bench's 0.3),
#      M3QKV_BENCH_BUILD (build directory, default build-bench), SKIP_BUILD=1 (use
#      it as it is, e.g. the GPU suite's build-dev), JOBS (default nproc),
#      BENCH_ARGS (more benchmark arguments, e.g. --benchmark_min_time=0.05s).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT_JSON=${1:-bench/results/h200.json}
BUILD=${M3QKV_BENCH_BUILD:-build-bench}
STANDARD='^(peak_bf16|peak_fp8|copy_d2d|floor_read|fused_sm90|fused_sm90_fp8|fused_sm90_xbf16_fp8|fused_sm90_invariant_fp8|fused_sm90_fast_fp8|gemm_sm90_fast|cublas_bf16|cublas_bf16\+insert|cublaslt_fp8|cublaslt_fp8\+insert)(/|$)'
FILTER=${BENCH_FILTER:-$STANDARD}
if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  cmake -S . -B "$BUILD" -DM3QKV_CUDA_ARCHS="80;90a" -DM3QKV_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$BUILD" -j "${JOBS:-$(nproc)}" --target m3qkv_bench
fi
mkdir -p "$(dirname "$OUT_JSON")"
"$BUILD/bench/m3qkv_bench" --benchmark_filter="$FILTER" --benchmark_out="$OUT_JSON" --benchmark_out_format=json \
  --benchmark_counters_tabular=true ${BENCH_ARGS:-}
python3 tools/bench_table.py --json "$OUT_JSON" || echo "bench_sweep: tools/bench_table.py failed (tables not regenerated)"
