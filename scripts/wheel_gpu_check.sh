#!/usr/bin/env bash
# The wheel on a GPU machine: build a wheel of this checkout (or take one given), install it into a
# fresh virtual environment, and run the demo and the whole test suite, GPU tests included,
# against the installed package from outside the checkout.
#   bash scripts/wheel_gpu_check.sh OUT_DIR
#   WHEEL=path/to/gemvx-*.whl bash scripts/wheel_gpu_check.sh OUT_DIR   (test that wheel instead)
# The build is `pip wheel --no-build-isolation` with the machine's own python3 packages (no network;
# sm_90 only, GEMVX_CUDA_ARCHS overrides), so its JAX handlers use the installed jaxlib's FFI
# headers; a wheel built elsewhere with the pinned (oldest) headers can be passed as WHEEL. The
# virtual environment is made with --system-site-packages to reuse the machine's jax, cupy, numpy
# and pytest; gemvx itself must come from the wheel, which the script checks.
# Writes wheel_build.log, wheel_check.log, wheel_demo.log, wheel_tests.log to OUT_DIR. Exit status
# is non-zero if any step failed, or if GPU tests were skipped for want of a GPU, CuPy or JAX.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUTDIR=${1:?usage: bash scripts/wheel_gpu_check.sh OUT_DIR}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
fail=0
step() { echo "== $1"; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ -n "${WHEEL:-}" ]; then
  step "wheel given: $WHEEL"
  wheel=$(cd "$(dirname "$WHEEL")" && pwd)/$(basename "$WHEEL")
  [ -f "$wheel" ] || { echo "no such wheel: $WHEEL"; exit 1; }
  echo "wheel given: $wheel" >"$OUTDIR/wheel_build.log"
else
  step "build the wheel (GEMVX_CUDA_ARCHS=${GEMVX_CUDA_ARCHS:-90})"
  if ! (cd "$REPO" && GEMVX_CUDA_ARCHS=${GEMVX_CUDA_ARCHS:-90} $PY -m pip wheel --no-build-isolation \
        --no-deps -w "$work/dist" . >"$OUTDIR/wheel_build.log" 2>&1); then
    tail -40 "$OUTDIR/wheel_build.log"; exit 1
  fi
  wheel=$(ls "$work"/dist/gemvx-*.whl)
fi
echo "$(basename "$wheel"): $(du -k "$wheel" | cut -f1) KiB"

step "check the wheel (contents, NEEDED libraries, exported symbols)"
{  # (a pipeline's subshell: the outcome is read back from the log below)
  $PY "$REPO/scripts/check_dist.py" wheel "$wheel" 2>&1
  if command -v auditwheel >/dev/null 2>&1; then
    auditwheel show "$wheel" 2>&1
  else
    echo "auditwheel is not installed here: auditwheel show skipped (CI runs it on every change)"
  fi
} | tee "$OUTDIR/wheel_check.log"
grep -q "^wheel check passed" "$OUTDIR/wheel_check.log" || fail=1

step "fresh virtual environment (--system-site-packages), the wheel installed into it"
$PY -m venv --system-site-packages "$work/venv"
VPY=$work/venv/bin/python
if [ "$($PY -c 'import sys; print(sys.prefix != sys.base_prefix)')" = True ]; then
  # $PY runs in a virtual environment itself, whose packages --system-site-packages does not reach:
  # append its site-packages to the new environment's path (after the wheel's own).
  $PY -c 'import site; print("\n".join(site.getsitepackages()))' \
    >"$($VPY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/machine_packages.pth"
fi
# --force-reinstall: a gemvx in the machine's own site-packages must not satisfy the install.
if ! $VPY -m pip install --no-index --no-deps --force-reinstall "$wheel" >>"$OUTDIR/wheel_build.log" 2>&1; then
  tail -20 "$OUTDIR/wheel_build.log"; exit 1
fi
site=$($VPY -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
mkdir "$work/outside"
cd "$work/outside" || exit 1
if ! $VPY -c "import gemvx, pathlib, sys; p = pathlib.Path(gemvx.__file__).parent; print('gemvx from', p, gemvx.build_info()); sys.exit(p != pathlib.Path('$site') / 'gemvx')" \
    | tee -a "$OUTDIR/wheel_check.log"; then
  echo "gemvx is not imported from the wheel installed in $site"; exit 1
fi
$VPY -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())" 2>&1 \
  | tee -a "$OUTDIR/wheel_check.log"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | tee -a "$OUTDIR/wheel_check.log"

step "python -m gemvx.demo (installed wheel)"
$VPY -m gemvx.demo 2>&1 | tee "$OUTDIR/wheel_demo.log" || fail=1

step "test suite, GPU tests included (installed wheel, run outside the checkout)"
$VPY -m pytest -p no:cacheprovider -rs "$REPO/tests" 2>&1 | tee "$OUTDIR/wheel_tests.log" | tail -15 || fail=1
grep -q "^gemvx .* from $site/gemvx " "$OUTDIR/wheel_tests.log" || { echo "pytest did not test the installed wheel"; fail=1; }
# The reasons conftest.py gives when a GPU test cannot run here: on this machine that is a failure.
if grep -E "^SKIPPED .*(not importable|no GPU backend|cannot start a backend|no CUDA GPU visible)" \
    "$OUTDIR/wheel_tests.log" | head -5; then
  echo "GPU tests were skipped on the GPU machine"; fail=1
fi
exit $fail
