#!/usr/bin/env bash
# Build, test and time the decode steps (csrc/decode/, minilin/cuda/decode.py, steps.py) and test the recurrent
# backward kernels (csrc/linear_bwd/, csrc/delta_bwd/, minilin/cuda/backward.py) on a GPU machine.
#   bash tools/gpu_decode_check.sh [OUTDIR]      logs, pytest output and bench JSON go to OUTDIR (default /tmp/minilin_decode)
# Steps, each under its own time limit so that the logs written so far always come back:
#   1. probe: GPU, driver, nvcc, CuPy, torch, FLA (probe.log)
#   2. ptxas's register / spill report of the decode and backward kernels, sm_90a (ptxas_*.log; about 1 minute)
#   3. the build, MINILIN_CUDA=1 (build.log; about 1-2 minutes; a failed build stops here)
#   4. the decode and backward tests: tests/test_cuda_decode.py, test_cuda_decode_front.py, test_cuda_backward.py
#      (pytest_decode.log; about 1-2 minutes)
#   5. `minilin bench --decode --json` (decode.md, decode.json; about 1-2 minutes, with FLA's rows when FLA imports)
#   6. unless SKIP_FULL_TESTS=1: the other CUDA tests, tests/test_cuda*.py (pytest_cuda.log; several minutes)
# Expected runtime on an H200: about 5 minutes for steps 1-5, 10 or more with step 6. Inside 10-minute calls:
#   SKIP_FULL_TESTS=1 bash tools/gpu_decode_check.sh "$OUT"                                 (steps 1-5)
#   SKIP_PTXAS=1 SKIP_BUILD=1 SKIP_TESTS=1 SKIP_BENCH=1 bash tools/gpu_decode_check.sh "$OUT"   (step 6, same machine)
# SKIP_BUILD=1 keeps a module built before on that machine (it builds anyway when there is none).
# FLA travels as wheels (no network there): put fla-core and einops wheels in .whl/
#   (pip download --no-deps fla-core==0.6.0 einops==0.8.2 -d .whl); they go to a temporary directory on PYTHONPATH.
# Knobs: PYTEST_ARGS (e.g. "-n 4"), SKIP_PTXAS=1, SKIP_BUILD=1, SKIP_TESTS=1, SKIP_BENCH=1, SKIP_FULL_TESTS=1,
# BUILD_TIMEOUT, TEST_TIMEOUT, BENCH_TIMEOUT, FULL_TEST_TIMEOUT (seconds).
set -uo pipefail
OUT="${1:-/tmp/minilin_decode}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MINILIN_CUDA=1
PY="${PYTHON:-python3}"
if ls .whl/fla_core-*.whl >/dev/null 2>&1; then
  FLA_SITE=$(mktemp -d)
  "$PY" -m pip install -q --no-deps --no-index --target "$FLA_SITE" .whl/fla_core-*.whl .whl/einops-*.whl \
    && export PYTHONPATH="$FLA_SITE${PYTHONPATH:+:$PYTHONPATH}"
fi

{
  date -u
  git log -1 --oneline 2>/dev/null || echo "(not a git checkout)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  nvcc --version | tail -2
  "$PY" - <<'PYEOF'
import cupy, numpy as np
print("python", __import__("sys").version.split()[0], "cupy", cupy.__version__, "numpy", np.__version__)
for name in ("torch", "fla", "xdist"):
    try:
        module = __import__(name)
        print(name, getattr(module, "__version__", "?"))
    except Exception as e:
        print(name, "not importable:", type(e).__name__)
PYEOF
} 2>&1 | tee "$OUT/probe.log"

# The new kernels' resources as ptxas reports them (registers, spills), for the sm_90a build.
[ -n "${SKIP_PTXAS:-}" ] || for source in csrc/decode/v1_register_tiles.cu csrc/linear_bwd/v1_recurrent.cu csrc/delta_bwd/v1_recurrent.cu; do
  log="$OUT/ptxas_$(basename "$(dirname "$source")").log"
  nvcc -std=c++17 -O3 -lineinfo -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a -DMINILIN_SM90A=1 -Xptxas -v \
    -c "$source" -o "$(mktemp -d)/kernel.o" >"$log" 2>&1
  "$PY" - "$log" <<'PYEOF'
import re, sys
text = open(sys.argv[1]).read()
# one line per kernel instance: its name and template arguments (element type, rows per thread, ...), registers, spills
pattern = r"Compiling entry function '(\S+)' for '\w+'\n[^\n]*\n\s*(\d+ bytes stack frame[^\n]*)\n[^\n]*Used (\d+) registers"
for name, spill, regs in re.findall(pattern, text):
    m = re.search(r"\d+((?:decode|linear_bwd|delta_bwd)_v1_[a-z_]+?|sum_value_blocks)I(.*?)E[EvN]", name)
    print(f"{m.group(1)} <{m.group(2)}>: {regs} registers; {spill}" if m else f"{name}: {regs} registers; {spill}")
PYEOF
done

if [ -n "${SKIP_BUILD:-}" ] && ls minilin/_cuda*.so >/dev/null 2>&1; then
  echo "build: skipped (SKIP_BUILD=1, $(ls minilin/_cuda*.so))" | tee -a "$OUT/probe.log"
else
  start=$(date +%s)
  timeout "${BUILD_TIMEOUT:-420}" "$PY" setup.py build_ext --inplace >"$OUT/build.log" 2>&1
  status=$?
  echo "build: exit $status in $(( $(date +%s) - start )) s" | tee -a "$OUT/probe.log"
  [ $status -eq 0 ] || { tail -40 "$OUT/build.log"; exit 1; }
fi

if [ -z "${SKIP_TESTS:-}" ]; then
start=$(date +%s)
timeout "${TEST_TIMEOUT:-300}" "$PY" -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-} tests/test_cuda_decode.py \
  tests/test_cuda_decode_front.py tests/test_cuda_backward.py --tb=short -rfEs 2>&1 | tee "$OUT/pytest_decode.log" \
  | tail -"${TEST_TAIL:-30}"
echo "decode and backward tests: exit ${PIPESTATUS[0]} in $(( $(date +%s) - start )) s" | tee -a "$OUT/probe.log"
fi

if [ -z "${SKIP_BENCH:-}" ]; then
  start=$(date +%s)
  timeout "${BENCH_TIMEOUT:-300}" "$PY" -m minilin bench --decode --json "$OUT/decode.json" \
    2>"$OUT/decode_progress.log" | tee "$OUT/decode.md"
  echo "bench --decode: exit ${PIPESTATUS[0]} in $(( $(date +%s) - start )) s" | tee -a "$OUT/probe.log"
fi

if [ -z "${SKIP_FULL_TESTS:-}" ]; then
  start=$(date +%s)
  timeout "${FULL_TEST_TIMEOUT:-480}" "$PY" -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-} tests/test_cuda.py \
    tests/test_cuda_front.py tests/test_cuda_build.py tests/test_cuda_bench.py --tb=short -rfE 2>&1 \
    | tee "$OUT/pytest_cuda.log" | tail -"${TEST_TAIL:-30}"
  echo "other CUDA tests: exit ${PIPESTATUS[0]} in $(( $(date +%s) - start )) s" | tee -a "$OUT/probe.log"
fi
