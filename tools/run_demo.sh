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
source "$(dirname "${BASH_SOURCE[0]}")/configure_build.sh" run_demo
cmake --build "$BUILD" -j "$JOBS" --target m3qkv_demo
args=()
if (($# > 0)) && [[ "$1" != -* ]]; then
  args=(--m "$1")
  shift
fi
exec "$BUILD/m3qkv_demo" "${args[@]}" "$@"
