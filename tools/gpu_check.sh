#!/usr/bin/env bash
# Build, check and time the CUDA extension on a GPU machine in one go. Run it from the checkout's root:
#   bash tools/gpu_check.sh [OUTDIR]      logs, pytest output and bench JSON go to OUTDIR (default /tmp/minilin_gpu)
# Steps: a capability probe (GPU, nvcc, CuPy + bfloat16, torch SDPA), the build (MINILIN_CUDA=1: a failed
# build stops here), the GPU tests, `minilin bench --json` one mixer at a time (with FLA's rows when FLA
# imports), then `minilin bench --against fla` when FLA imports (SKIP_FLA=1 skips this last step). Each step
# has its own time limit, so a stuck step cannot take the others with it and the logs written so far stay.
# On a machine without network, FLA travels as wheels: elsewhere, `pip download --no-deps fla-core==0.6.0
# einops -d .whl`; this script installs .whl/'s wheels into a temporary directory on PYTHONPATH, never into
# the environment (by hand: `pip install --no-deps --no-index --target /tmp/fla .whl/*.whl`, then
# `PYTHONPATH=/tmp/fla minilin bench --against fla`).
# Knobs: PYTEST_ARGS (e.g. "-n 8"), BENCH_LENGTHS ("8192"), BENCH_MIXERS ("gated_deltanet"), SKIP_BENCH=1,
# SKIP_TESTS=1, SKIP_FLA=1, FLA_LENGTHS, FLA_MIXERS, FLA_GRID ("fla" or "all": the grid of shapes instead of the
# lengths; FLA's first calls at each shape compile and autotune, minutes), and BUILD_ / TEST_ / BENCH_ / FLA_TIMEOUT (seconds;
# BENCH_TIMEOUT is per mixer). With FLA's rows the whole script takes more than 10 minutes; to split it,
# run it once per part with the other parts' SKIP_ set.
set -uo pipefail
OUT="${1:-/tmp/minilin_gpu}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MINILIN_CUDA=1
PY="${PYTHON:-python3}"
if ls .whl/fla_core-*.whl >/dev/null 2>&1; then
  FLA_SITE=$(mktemp -d)
  "$PY" -m pip install -q --no-deps --no-index --target "$FLA_SITE" .whl/fla_core-*.whl .whl/einops-*.whl \
    && export PYTHONPATH="$FLA_SITE${PYTHONPATH:+:$PYTHONPATH}"
fi

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  nvcc --version | tail -2
  "$PY" - <<'PYEOF'
import cupy, numpy as np
print("cupy", cupy.__version__, "numpy", np.__version__, "cupy.bfloat16 attribute:", hasattr(cupy, "bfloat16"))
try:
    import ml_dtypes
    x = cupy.arange(4, dtype=cupy.float32).astype(np.dtype(ml_dtypes.bfloat16))
    print("cupy array of ml_dtypes.bfloat16:", x.dtype, float(x.astype(cupy.float32).sum()), "(expect 6.0)")
except Exception as e:
    print("cupy bfloat16 via ml_dtypes: not supported:", type(e).__name__, e)
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "SDPA",
          hasattr(torch.nn.functional, "scaled_dot_product_attention"))
except Exception as e:
    print("torch: not importable:", e)
try:
    import fla
    print("fla", getattr(fla, "__version__", "?"))
except Exception as e:
    print("fla: not importable (optional)")
PYEOF
} 2>&1 | tee "$OUT/probe.log"

start=$(date +%s)
timeout "${BUILD_TIMEOUT:-300}" "$PY" setup.py build_ext --inplace >"$OUT/build.log" 2>&1
status=$?
echo "build: exit $status in $(( $(date +%s) - start )) s" | tee -a "$OUT/probe.log"
[ $status -eq 0 ] || { tail -40 "$OUT/build.log"; exit 1; }

if [ -z "${SKIP_TESTS:-}" ]; then
  timeout "${TEST_TIMEOUT:-240}" "$PY" -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-} tests/test_cuda*.py tests/test_doctor.py \
    --tb=short -rfE 2>&1 | tee "$OUT/pytest.log" | tail -"${TEST_TAIL:-25}"
fi

"$PY" -m minilin doctor >"$OUT/doctor.log" 2>&1
# BENCH_LENGTHS="8192" limits the lengths (a quick look); default: minilin bench's 2048 8192 32768.
# One bench per mixer, each under its own BENCH_TIMEOUT (with FLA's rows, all mixers in one call ran past it);
# their JSON is merged into bench.json.
if [ -z "${SKIP_BENCH:-}" ]; then
  MIXERS="${BENCH_MIXERS:-$("$PY" -c 'from minilin.bench import gpu; print(*gpu.DEFAULT_MIXERS)')}"
  : >"$OUT/bench.md"; : >"$OUT/bench_progress.log"; rm -f "$OUT/bench.json"
  for mixer in $MIXERS; do
    timeout "${BENCH_TIMEOUT:-300}" "$PY" -m minilin bench --json "$OUT/bench_$mixer.json" \
      ${BENCH_LENGTHS:+--lengths $BENCH_LENGTHS} --mixers "$mixer" 2>>"$OUT/bench_progress.log" | tee -a "$OUT/bench.md"
    echo "bench $mixer: exit ${PIPESTATUS[0]}"
  done
  "$PY" - "$OUT" $MIXERS <<'PYEOF'
import json, os, sys
out, parts = sys.argv[1], [os.path.join(sys.argv[1], f"bench_{m}.json") for m in sys.argv[2:]]
found = [json.load(open(p)) for p in parts if os.path.exists(p)]
if found:
    merged = dict(found[0], rows=[row for part in found for row in part["rows"]])
    json.dump(merged, open(os.path.join(out, "bench.json"), "w"), indent=2)
for p in parts:
    if os.path.exists(p):
        os.remove(p)
print(f"bench.json: {len(found)} of {len(parts)} mixers")
PYEOF
fi
if [ -z "${SKIP_FLA:-}" ] && "$PY" -c "import fla" 2>/dev/null; then
  timeout "${FLA_TIMEOUT:-300}" "$PY" -m minilin bench --against fla --json "$OUT/against_fla.json" \
    ${FLA_GRID:+--grid $FLA_GRID} ${FLA_LENGTHS:+--lengths $FLA_LENGTHS} ${FLA_MIXERS:+--mixers $FLA_MIXERS} \
    2>"$OUT/against_fla_progress.log" \
    | tee "$OUT/against_fla.md"
  echo "against fla: exit ${PIPESTATUS[0]}"
fi
