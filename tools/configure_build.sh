# Sourced by tools/run_demo.sh and tools/run_tests.sh: the shared set-up of the
# two README commands. Sets ROOT (and cd's there), BUILD, ARCHS, JOBS from
#   M3QKV_BUILD_DIR (default build), M3QKV_CUDA_ARCHS (default "80;90a;100f"),
#   M3QKV_JOBS (default nproc)
# and configures $BUILD. Re-running configure on an existing build directory
# is quick and keeps the arch list in sync with M3QKV_CUDA_ARCHS; the build is
# incremental. On a configure failure it prints the log and exits 1, naming
# the caller ($1).
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD=${M3QKV_BUILD_DIR:-build}
ARCHS=${M3QKV_CUDA_ARCHS:-80;90a;100f}
JOBS=${M3QKV_JOBS:-$(nproc)}
# The caller's targets exist whatever an earlier configure of $BUILD chose
# (e.g. a library-only build: -DM3QKV_BUILD_TESTS=OFF turns the demo off too).
case $1 in
  run_tests) M3QKV_TARGET_ARGS=(-DM3QKV_BUILD_TESTS=ON -DM3QKV_BUILD_DEMO=ON) ;;
  run_demo) M3QKV_TARGET_ARGS=(-DM3QKV_BUILD_DEMO=ON) ;;
  *) M3QKV_TARGET_ARGS=() ;;
esac
mkdir -p "$BUILD"
cmake -S . -B "$BUILD" -DM3QKV_CUDA_ARCHS="$ARCHS" "${M3QKV_TARGET_ARGS[@]}" >"$BUILD/m3qkv_configure.log" 2>&1 || {
  cat "$BUILD/m3qkv_configure.log"
  echo "$1: cmake configure failed" >&2
  exit 1
}
