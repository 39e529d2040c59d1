#!/usr/bin/env bash
# SASS / resource rules of the project, checked on the built library.
#
#   bash tools/sass_checks.sh <build-dir>      (default: build)
#
# Inspects <build-dir>/libm3qkv.so once (tools/inspect_sass.py, cuobjdump from
# the PyPI wheel nvidia-cuda-cuobjdump), prints the per-kernel table, writes
# <build-dir>/sass_report.json, then checks the rule groups below against that
# report. Exit status: 0 when every group passes or is skipped, 1 when one
# fails, 2 when the library cannot be inspected.
#
# Adding rules: append a `check "<title>" --rule '<rule>' ...` line to the
# section of your backend (syntax: python3 tools/inspect_sass.py --help). A kernel
# glob that matches nothing fails, so rules for kernels that do not exist yet
# must be guarded with `source_defines` (see the portable section).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:-build}
[[ "$BUILD" = /* ]] || BUILD="$PWD/$BUILD"
LIB="$BUILD/libm3qkv.so"
REPORT="$BUILD/sass_report.json"
PY=${PYTHON:-python3}
INSPECT=("$PY" "$ROOT/tools/inspect_sass.py")

PASSED=0
FAILED=0
SKIPPED=0
FAILED_TITLES=()

finish() {
  local rc=$?
  echo
  echo "sass_checks: ${PASSED} passed, ${FAILED} failed, ${SKIPPED} skipped (rule groups)"
  if ((FAILED > 0)); then
    printf 'sass_checks: FAILED: %s\n' "${FAILED_TITLES[@]}"
    exit 1
  fi
  if ((rc != 0)); then
    # An early `exit 2` (cannot inspect), or a script error (set -u, or a
    # last line like `[[ cond ]] && check ...` whose condition is false: use if).
    echo "sass_checks: stopped with status $rc"
  fi
  exit "$rc"
}
trap finish EXIT

if [[ ! -f "$LIB" ]]; then
  echo "sass_checks: $LIB not found: build first (bash tools/run_tests.sh)" >&2
  exit 2
fi

# Archs the build was configured for (CMake cache), as SASS arch names.
CONFIGURED=$(sed -n 's/^M3QKV_CUDA_ARCHS:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
CONFIGURED=${CONFIGURED:-80;90a;100f}
declare -A HAS_ARCH=()
for a in ${CONFIGURED//;/ }; do HAS_ARCH[sm_$a]=1; done
echo "sass_checks: $LIB (configured archs: $CONFIGURED)"

# Which kernel sources exist (CMake globs the same folders).
shopt -s nullglob
PORTABLE_SRCS=("$ROOT"/src/portable/*.cu)
SM90_SRCS=("$ROOT"/src/sm90/*.cu)
SM100_SRCS=("$ROOT"/src/sm100/*.cu)
shopt -u nullglob

# Expected SASS archs: a backend's arch is expected when its sources exist and
# the build was configured for it. Portable kernels get SASS for every
# configured arch (CMakeLists.txt: M3QKV_PORTABLE_GENCODE) when 80 is configured.
EXPECTED=()
if ((${#PORTABLE_SRCS[@]})) && [[ -n "${HAS_ARCH[sm_80]:-}" ]]; then
  for a in sm_80 sm_90a sm_100f; do [[ -n "${HAS_ARCH[$a]:-}" ]] && EXPECTED+=("$a"); done
fi
if ((${#SM90_SRCS[@]})) && [[ -n "${HAS_ARCH[sm_90a]:-}" ]]; then EXPECTED+=(sm_90a); fi
if ((${#SM100_SRCS[@]})) && [[ -n "${HAS_ARCH[sm_100f]:-}" ]]; then EXPECTED+=(sm_100f); fi
EXPECTED_CSV=$(printf '%s\n' "${EXPECTED[@]}" | sort -u | paste -sd, -)

# One inspection; every check below reads the JSON report.
"${INSPECT[@]}" "$LIB" --json-out "$REPORT" --count 'HMMA,.GMMA,UTC.*MMA,LDL,STL'
rc=$?
if ((rc == 2)); then
  echo "sass_checks: cannot inspect $LIB" >&2
  exit 2
fi

# check "<title>" <inspect_sass.py rule arguments...>
check() {
  local title=$1
  shift
  echo
  echo "--- $title"
  if "${INSPECT[@]}" --load-json "$REPORT" --quiet "$@"; then
    PASSED=$((PASSED + 1))
  else
    FAILED=$((FAILED + 1))
    FAILED_TITLES+=("$title")
  fi
}

skip() {
  echo
  echo "--- $1"
  echo "SKIPPED (kernel not in build): $2"
  SKIPPED=$((SKIPPED + 1))
}

# fail "<title>" "<why>"
fail() {
  echo
  echo "--- $1"
  echo "FAIL: $2"
  FAILED=$((FAILED + 1))
  FAILED_TITLES+=("$1")
}

# source_defines <kernel-name> <sources...>: true when a source names the kernel.
source_defines() {
  local name=$1
  shift
  (($# > 0)) && grep -qw -- "$name" "$@"
}

# Comma list of the configured archs among the arguments.
archs_of() {
  local out=() a
  for a in "$@"; do [[ -n "${HAS_ARCH[$a]:-}" ]] && out+=("$a"); done
  (IFS=,; echo "${out[*]}")
}

# --- all backends -------------------------------------------------------------
if [[ -z "$EXPECTED_CSV" ]]; then
  skip "SASS archs and no-local:* (every kernel)" \
    "no kernel sources in src/portable, src/sm90, src/sm100 for the configured archs"
else
  # Every expected arch has SASS in the library (a missing gencode fails here).
  check "SASS present for $EXPECTED_CSV" --arch "$EXPECTED_CSV" --rule 'present:*'
  # No kernel of any arch touches local memory: no stack frame, no LOCAL, no LDL/STL.
  check "no local memory in any kernel (all archs)" --rule 'no-local:*'
fi

# --- portable rules -------------------------------------------------------------
# Kernel names fixed with the PORTABLE engineer. Rules for a kernel are skipped
# only while no source in src/portable names it; once one does, a missing or
# renamed kernel fails.
if [[ -z "${HAS_ARCH[sm_80]:-}" ]]; then
  skip "portable kernels" "80 not in M3QKV_CUDA_ARCHS=$CONFIGURED (portable path not built)"
else
  PORTABLE_ARCHS=$(archs_of sm_80 sm_90a sm_100f)
  for k in m3qkv_portable_fused_kernel m3qkv_portable_gemm_kernel \
           m3qkv_portable_insert_kernel m3qkv_portable_insert_warp_kernel m3qkv_portable_insert_lanes8_kernel \
           m3qkv_portable_insert_split_c32q8_kernel m3qkv_portable_insert_split_c16q8_kernel \
           m3qkv_portable_insert_split_c16q8_guess_kernel \
           m3qkv_portable_quantize_kernel m3qkv_prepare_fp8_kernel; do
    if ! source_defines "$k" "${PORTABLE_SRCS[@]}"; then
      skip "portable: $k" "no source in src/portable names $k"
      continue
    fi
    rules=(--rule "present@$PORTABLE_ARCHS:*${k}*")
    case $k in
      # The GEMM mainloop is mma.sync bf16 -> f32: HMMA must be in the SASS.
      *fused_kernel | *gemm_kernel) rules+=(--rule "min@$PORTABLE_ARCHS:*${k}*:HMMA:1") ;;
    esac
    check "portable: $k ($PORTABLE_ARCHS)" "${rules[@]}"
  done
fi

# --- SM90 rules ---
# Kernels of src/sm90 (engineer SM90):
#   fused_bf16dq_kernel    variant A (BM = 64 / 128, split-K, the pre-converted-
#                          activations instance), bf16 wgmma m64n128k16 -> HGMMA.64x128x16.F32.BF16
#   fused_prefill_kernel   the prefill kernel (prefill_sm90.cu), the same wgmma
#   m3qkv_sm90_decode_kernel  the swap-AB kernel (decode_sm90.cu), NT = 16/32/64/128
#                          x {e4m3, bf16} activations: bf16 wgmma m64nNTk16 with A from
#                          registers -> HGMMA.64xNTx16.F32.BF16 (8 per 128-K stage: two
#                          unrolled 64-K steps of 4)
#   fused_fast_kernel      the fp8 fast mode (fast_sm90.cu): fp8 wgmma m64n128k32 ->
#                          QGMMA.64x128x32.F32.E4M3.E4M3, 4 per 128-K stage, no HGMMA
#   fold_x_kernel          its activation fold (no wgmma; present, no local memory)
#   m3qkv_sm90_convert_x_kernel  the swap-AB kernel's once-per-call activation
#                          conversion (decode_sm90.cu; the same rules as fold_x)
# Each: present, no local memory, its wgmma kind at least once per k-step of a
# stage (4, the unrolled loop), not the other kind nor mma.sync (HMMA), and
# setmaxnreg kept by ptxas (USETMAXREG; ptxas drops it with warning C7508 when
# the kernel has no register cap at entry).
if [[ -z "${HAS_ARCH[sm_90a]:-}" ]]; then
  skip "sm90 kernels" "90a not in M3QKV_CUDA_ARCHS=$CONFIGURED (SM90 path not built)"
else
  for k in fused_bf16dq_kernel fused_prefill_kernel m3qkv_sm90_decode_kernel fused_fast_kernel fold_x_kernel \
           m3qkv_sm90_convert_x_kernel; do
    if ! source_defines "$k" "${SM90_SRCS[@]}"; then
      skip "sm90: $k" "no source in src/sm90 names $k"
      continue
    fi
    rules=(--rule "present@sm_90a:*${k}*" --rule "no-local@sm_90a:*${k}*")
    case $k in
      fold_x_kernel | m3qkv_sm90_convert_x_kernel) rules+=(--rule "max@sm_90a:*${k}*:HGMMA|QGMMA|HMMA:0") ;;
      fused_fast_kernel) rules+=(--rule "min@sm_90a:*${k}*:USETMAXREG:2" --rule "min@sm_90a:*${k}*:QGMMA:4"
                                 --rule "max@sm_90a:*${k}*:HGMMA|HMMA:0") ;;
      *) rules+=(--rule "min@sm_90a:*${k}*:USETMAXREG:2" --rule "min@sm_90a:*${k}*:HGMMA:4"
                 --rule "max@sm_90a:*${k}*:QGMMA|HMMA:0") ;;
    esac
    check "sm90: $k (sm_90a)" "${rules[@]}"
  done
fi

# --- SM100 rules (engineer SM100 appends here) ---
# Owner: engineer SM100. Kernel m3qkv_sm100_fused_kernel<CG> (src/sm100/fused_sm100.cu),
# CG = cta_group 1 and 2, SASS arch sm_100f.
#
# Opcode names cuobjdump/nvdisasm 13.x print for the instructions of
# ptx/tcgen05.cuh and ptx/tma_sm100.cuh (seen in this build, sm_100f):
#   tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale.block32
#       -> UTCQMMA gdesc[a], gdesc[b], tmem[d], tmem[sfa], idesc[..], tmem[sfb], UP
#   ...cta_group::2                      -> UTCQMMA.2CTA (same operands)
#   tcgen05.cp.cta_group::{1,2}.32x128b.warpx4
#                                        -> UTCCP.T.S.4x32dp128bit / UTCCP.T.S.2CTA.4x32dp128bit
#   tcgen05.ld.sync.aligned.32x32b.x32   -> LDTM.x32
#   tcgen05.commit (cta_group::1)        -> UTCBAR; cta_group::2 + multicast -> UTCBAR.2CTA.MULTICAST
#   tcgen05.alloc / relinquish / dealloc -> UTCATOMSWS.* (3 per kernel)
#   cp.async.bulk.tensor.2d              -> UTMALDG.2D; .cta_group::2 -> UTMALDG.2D.2CTA;
#                                           .multicast::cluster.cta_group::2 -> UTMALDG.2D.MULTICAST.2CTA
#   prefetch.tensormap -> UTMACCTL.PF;  setmaxnreg -> USETMAXREG.{DEALLOC,TRY_ALLOC}.CTAPOOL
#   barrier.cluster -> UCGABAR_ARV / UCGABAR_WAIT;  mbarrier.* -> SYNCS.*;  elect.sync -> ELECT
# Counts are static instruction counts. The k-block loop is not unrolled, so
# one k-step (BK = 128) is: 4 UTCQMMA (K = 32 each), 1 + CG UTCCP (SFA + SFB
# chunks), 4 UTMALDG (A, B, SFA, SFB), 1 UTCBAR (stage release) plus 1 per
# tile (accumulator full).
if [[ -z "${HAS_ARCH[sm_100f]:-}" ]]; then
  skip "sm100 kernels" "100f not in M3QKV_CUDA_ARCHS=$CONFIGURED"
elif ! source_defines m3qkv_sm100_fused_kernel "${SM100_SRCS[@]}"; then
  skip "sm100 kernels" "no source in src/sm100 names m3qkv_sm100_fused_kernel"
else
  K1='*m3qkv_sm100_fused_kernel<1>*'
  K2='*m3qkv_sm100_fused_kernel<2>*'
  check "sm100: m3qkv_sm100_fused_kernel<1> (cta_group 1, m128n128)" --arch sm_100f \
    --rule "present:$K1" --rule "no-local:$K1" --rule "max:$K1:LDL|STL:0" \
    --rule "min:$K1:UTCQMMA:4" --rule "max:$K1:UTCQMMA:4" --rule "max:$K1:UTCQMMA\.2CTA:0" \
    --rule "min:$K1:UTCCP\.T\.S\.4x32dp128bit:2" --rule "max:$K1:UTCCP.*:2" \
    --rule "min:$K1:LDTM\.x32:4" \
    --rule "min:$K1:UTMALDG\.2D:4" --rule "max:$K1:UTMALDG.*:4" \
    --rule "min:$K1:UTCBAR:2" --rule "max:$K1:UTCBAR.*:2" \
    --rule "min:$K1:UTCATOMSWS.*:3" --rule "max:$K1:USETMAXREG.*:0" \
    --rule "max-regs:$K1:255"
  check "sm100: m3qkv_sm100_fused_kernel<2> (cta_group 2, m256n256 pair)" --arch sm_100f \
    --rule "present:$K2" --rule "no-local:$K2" --rule "max:$K2:LDL|STL:0" \
    --rule "min:$K2:UTCQMMA\.2CTA:4" --rule "max:$K2:UTCQMMA:4" \
    --rule "min:$K2:UTCCP\.T\.S\.2CTA\.4x32dp128bit:3" --rule "max:$K2:UTCCP.*:3" \
    --rule "min:$K2:LDTM\.x32:12" \
    --rule "min:$K2:UTMALDG\.2D\.2CTA:3" --rule "min:$K2:UTMALDG\.2D\.MULTICAST\.2CTA:1" \
    --rule "max:$K2:UTMALDG.*:4" \
    --rule "min:$K2:UTCBAR\.2CTA\.MULTICAST:2" --rule "max:$K2:UTCBAR.*:2" \
    --rule "min:$K2:UTCATOMSWS\.2CTA.*:1" --rule "min:$K2:USETMAXREG.*:2" --rule "max:$K2:USETMAXREG.*:2" \
    --rule "max-regs:$K2:168"
  # Registers fit the setmaxnreg split (src/sm100/config.h: producer
  # warpgroup 24, epilogue warpgroups 240; 24·128 + 240·256 = 64512 = the
  # launch-time pool 168·384): the launch allocation is 168 (checked above),
  # no instruction of the cta_group 2 kernel names a register >= 240, and the
  # producer code (laid out between USETMAXREG.DEALLOC and the epilogue's
  # USETMAXREG.TRY_ALLOC) names none >= 24. ptxas allocates each setmaxnreg
  # region within its limit; this checks the result.
  echo
  echo "--- sm100: m3qkv_sm100_fused_kernel<2> register indices fit the setmaxnreg split (24 / 240)"
  CUOBJDUMP_BIN=$("$PY" -c "import sys; sys.path.insert(0, '$ROOT/tools'); import inspect_sass as i; print(i.find_tool('cuobjdump', 'CUOBJDUMP') or '')" 2>/dev/null)
  if [[ -z "$CUOBJDUMP_BIN" ]]; then
    fail "sm100: register split" "cuobjdump not found"
  else
    read -r MAXR MAXP < <("$CUOBJDUMP_BIN" -sass -arch sm_100f "$LIB" 2>/dev/null | awk '
      /Function :/ { f = ($0 ~ /m3qkv_sm100_fused_kernelILi2E/); p = 0 }
      f && /USETMAXREG\.DEALLOC/ { p = 1 }
      f && /USETMAXREG\.TRY_ALLOC/ { p = 0 }
      f { s = $0; while (match(s, /[^U]R[0-9]+/)) { v = substr(s, RSTART + 2, RLENGTH - 2) + 0;
            if (v > m) m = v; if (p && v > mp) mp = v; s = substr(s, RSTART + RLENGTH) } }
      END { print m + 0, mp + 0 }')
    if [[ -n "${MAXR:-}" ]] && ((MAXR > 0 && MAXR < 240 && MAXP > 0 && MAXP < 24)); then
      echo "OK: highest register R$MAXR < 240; producer region R$MAXP < 24"
      PASSED=$((PASSED + 1))
    else
      fail "sm100: register split" "highest register R${MAXR:-?} (want < 240), producer region R${MAXP:-?} (want < 24)"
    fi
  fi
fi

# --- SM100 decode variant (issue 15) ---
# Kernel m3qkv_sm100_decode_kernel<NT> (src/sm100/decode_sm100.cu), NT = token
# block = MMA N (32, 64, 128), SASS arch sm_100f, cta_group 1 only. Static
# counts per kernel (the k-block loop is not unrolled): 4 UTCQMMA (m128nNTk32,
# one per K = 32 slice of a stage), 2 UTCCP (weight and token scale chunks),
# 4 UTMALDG.2D (W, X, SFW, SFX) plus 1 UTMAPF.L2.2D (the pre-wait L2 prefetch
# of the first unit's weights), 2 UTCBAR (stage release, accumulator full),
# the epilogue's TMEM read: NT/2 columns per warp (LDTM.x16 at NT 32, one
# LDTM.x32 at 64, two at 128), alloc / relinquish / dealloc (3 UTCATOMSWS), no
# setmaxnreg (320 threads at 200 registers: __launch_bounds__(320, 1)), no
# local memory.
if [[ -z "${HAS_ARCH[sm_100f]:-}" ]]; then
  skip "sm100 decode kernels" "100f not in M3QKV_CUDA_ARCHS=$CONFIGURED"
elif ! source_defines m3qkv_sm100_decode_kernel "${SM100_SRCS[@]}"; then
  skip "sm100 decode kernels" "no source in src/sm100 names m3qkv_sm100_decode_kernel"
else
  for nt in 32 64 128; do
    KD="*m3qkv_sm100_decode_kernel<${nt}>*"
    case $nt in
      32) ldtm=(--rule "min:$KD:LDTM\.x16:1" --rule "max:$KD:LDTM.*:1") ;;
      64) ldtm=(--rule "min:$KD:LDTM\.x32:1" --rule "max:$KD:LDTM.*:1") ;;
      128) ldtm=(--rule "min:$KD:LDTM\.x32:2" --rule "max:$KD:LDTM.*:2") ;;
    esac
    check "sm100: m3qkv_sm100_decode_kernel<${nt}> (decode, m128n${nt}, cta_group 1)" --arch sm_100f \
      --rule "present:$KD" --rule "no-local:$KD" --rule "max:$KD:LDL|STL:0" \
      --rule "min:$KD:UTCQMMA:4" --rule "max:$KD:UTCQMMA.*:4" --rule "max:$KD:UTCQMMA\.2CTA:0" \
      --rule "min:$KD:UTCCP\.T\.S\.4x32dp128bit:2" --rule "max:$KD:UTCCP.*:2" \
      --rule "min:$KD:UTMALDG\.2D:4" --rule "max:$KD:UTMALDG.*:4" --rule "max:$KD:UTMALDG.*2CTA.*:0" \
      --rule "min:$KD:UTMAPF\.L2\.2D:1" --rule "max:$KD:UTMAPF.*:1" \
      --rule "min:$KD:UTCBAR:2" --rule "max:$KD:UTCBAR.*:2" \
      "${ldtm[@]}" \
      --rule "min:$KD:UTCATOMSWS.*:3" --rule "max:$KD:USETMAXREG.*:0" \
      --rule "max-regs:$KD:200"
  done
fi
