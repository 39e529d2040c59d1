#!/usr/bin/env bash
# The main job: build m3qkv_demo and run it.
#
#   bash tools/run_demo.sh [M] [demo options]   (M = tokens; the demo's default
#                                               when omitted; --help lists options)
#
# With a GPU the demo quantizes random activations, runs m3qkv_fused_qkv on a
# MiniMax-M3 TP4 problem (K = 6144) and checks every output against the CPU
# golden model; without one it runs the golden model alone and says so.
# Env: M3QKV_CUDA_ARCHS (default "80;90a;100f"), M3QKV_BUILD_DIR (default build),
#      M3QKV_JOBS (default nproc).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD=${M3QKV_BUILD_DIR:-build}
ARCHS=${M3QKV_CUDA_ARCHS:-80;90a;100f}
JOBS=${M3QKV_JOBS:-$(nproc)}

mkdir -p "$BUILD"
cmake -S . -B "$BUILD" -DM3QKV_CUDA_ARCHS="$ARCHS" >"$BUILD/m3qkv_configure.log" 2>&1 || {
  cat "$BUILD/m3qkv_configure.log"
  echo "run_demo: cmake configure failed" >&2
  exit 1
}
cmake --build "$BUILD" -j "$JOBS" --target m3qkv_demo
args=()
if (($# > 0)) && [[ "$1" != -* ]]; then
  args=(--m "$1")
  shift
fi
exec "$BUILD/m3qkv_demo" "${args[@]}" "$@"
