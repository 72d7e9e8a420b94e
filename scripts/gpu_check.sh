#!/usr/bin/env bash
# Build + GPU tests + compute-sanitizer (beside the tests) + quick benchmark, in one run on the GPU
# machine.
#   bash scripts/gpu_check.sh [OUT_DIR]      (default: $OUT, else ./gpu_check_out)
# Builds for sm_90 only (GEMVX_CUDA_ARCHS overrides) with the machine's own python3 packages.
# Writes build.log, gpu_tests.log (it lists the 20 slowest tests), sass.log, memcheck.log,
# racecheck.log, bench.log (both benchmarks' output), bench.json, bench_quant.json: eight files.
# GEMVX_SKIP_BENCH=1 skips the benchmark. GEMVX_CHECK_PART=tests (build, tests, SASS check) or
# sanitizers (build, SASS check, sanitizers) runs half of it, where the whole does not fit one
# 10-minute run; either half skips the benchmark. GEMVX_TESTS="test_gpu.py test_tune.py" runs
# only these files (or pytest node ids) of tests/. The suite needs more than one 10-minute run,
# so run it in parts: on an H200 a cold build takes about 1.5 minutes, test_gpu.py 2,
# test_jax_gpu.py 3, test_quant_gpu.py about 6 (on an H100 about 9).
# Exit status is non-zero if any step failed.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUTDIR=${1:-${OUT:-$REPO/gpu_check_out}}
mkdir -p "$OUTDIR"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
fail=0
step() { echo "== $1"; }

step "build (GEMVX_CUDA_ARCHS=${GEMVX_CUDA_ARCHS:-90})"
if ! (cd "$REPO" && GEMVX_CUDA_ARCHS=${GEMVX_CUDA_ARCHS:-90} $PY -m pip install --no-build-isolation --no-deps . >"$OUTDIR/build.log" 2>&1); then
  tail -40 "$OUTDIR/build.log"; exit 1
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUTDIR/build.log"

# Run from outside the checkout so the installed package is what gets imported.
cd /tmp || exit 1
# The sanitizers run beside the tests (nothing here is timed); their results are collected after
# the SASS check.
PART=${GEMVX_CHECK_PART:-all}
case $PART in all|tests|sanitizers) ;; *) echo "GEMVX_CHECK_PART: all, tests or sanitizers, not $PART"; exit 2;; esac
SANITIZERS="memcheck racecheck"
[ "$PART" = tests ] && SANITIZERS=""
declare -A san_pid
step "compute-sanitizer $SANITIZERS: started in the background"
for tool in $SANITIZERS; do
  compute-sanitizer --tool "$tool" --error-exitcode 99 $PY "$REPO/scripts/sanitize_cases.py" >"$OUTDIR/$tool.log" 2>&1 &
  san_pid[$tool]=$!
done

if [ "$PART" != sanitizers ]; then
  step "GPU tests"
  tests=("$REPO/tests")
  if [ -n "${GEMVX_TESTS:-}" ]; then
    tests=(); for f in $GEMVX_TESTS; do tests+=("$REPO/tests/$f"); done
  fi
  $PY -m pytest -q -p no:cacheprovider -rs --durations=20 "${tests[@]}" 2>&1 | tee "$OUTDIR/gpu_tests.log" | tail -15 || fail=1
fi

step "SASS check (128-bit stream loads, loads ahead of math)"
$PY "$REPO/scripts/check_sass.py" 2>&1 | tee "$OUTDIR/sass.log" | tail -3 || fail=1

for tool in $SANITIZERS; do
  step "compute-sanitizer $tool"
  wait "${san_pid[$tool]}" || fail=1
  tail -3 "$OUTDIR/$tool.log"
done

if [ -z "${GEMVX_SKIP_BENCH:-}" ] && [ "$PART" = all ]; then
  step "quick benchmark"
  $PY "$REPO/benchmarks/bench.py" --quick --json "$OUTDIR/bench.json" 2>&1 | tee "$OUTDIR/bench.log" | tail -30 || fail=1
  step "quick quantised benchmark"
  $PY "$REPO/benchmarks/bench_quant.py" --quick --json "$OUTDIR/bench_quant.json" 2>&1 | tee -a "$OUTDIR/bench.log" | tail -16 || fail=1
fi
exit $fail
