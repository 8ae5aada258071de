#!/usr/bin/env bash
# The GPU tier in one command, on a bare GPU machine without network, within 10 minutes.
#
#   bash tools/gpu/run_tier.sh [extra arguments of benchmarks/gpu_throughput.py]
#
# Made for the device tool's machines (nvidia-h100-x1, nvidia-h200: Python 3.12 with torch 2.11,
# timm, numpy, opencv, pytest; no mmengine, mmcv or mmpretrain, and nothing to download from).
# First, here (with network): tools/gpu/build_wheels.sh, which writes .whl/ (git-ignored, about
# 3 MiB). Then run this there with the folder carried along: the device tool's
#   run(command="bash tools/gpu/run_tier.sh", carry=[".whl"], timeout_s=600)
#
# Steps, each timed, with a summary at the end:
#   1. install .whl/*.whl into /tmp/site (pip --no-index --no-deps --target) and
#      export PYTHONPATH=/tmp/site:$PWD (mmrepa from this checkout, not installed)
#   2. print nvidia-smi, Python, torch, its CUDA and cuDNN, the GPU torch sees, and the
#      versions of mmengine, mmcv (mmcv-lite: no compiled ops) and mmpretrain
#   3. the tests marked `cuda`: python3 -m pytest FILES -m cuda -q -p no:cacheprovider, where
#      FILES are the test files under tests/ that use the marker (`mark.cuda`). Not the whole
#      tests/ tree: collecting it imports every test module, and several import mmdet, mmseg or
#      pycocotools, which the machine lacks (pytest stops at those collection errors). No file
#      with the marker: the step says so and passes. At most $CUDA_TESTS_TIMEOUT_S (240) s.
#   4. python3 benchmarks/gpu_throughput.py --device "$DEVICE" --out $OUT/gpu_throughput.json
#      (RePaFormer Table 1's rows, batch 128, fp16 and bf16, eager and CUDA graphs) with the
#      time left: it starts no row after --budget-s (the time left less $ROW_RESERVE_S, 75 s,
#      for the row under way) and is stopped at the end of the budget; its JSON is rewritten
#      after every row, so what was measured survives.
# The whole run is held to $TIER_BUDGET_S (540) seconds: a minute of the device tool's 600 s is
# left as margin. With $OUT set (the device tool
# sets it), everything printed also goes to $OUT/log, and the JSON to $OUT; without, the JSON
# goes to /tmp/gpu_throughput.json.
#
# TIER_DEVICE=cpu runs the same steps where there is no GPU (a dry run of the script itself:
# pass --tiny --batch 2 --repeat 1 for a short benchmark).
#
# Exit status: 0 when every step passed (the benchmark passes when every row's folded outputs
# were verified; a ratio below the paper's is reported, not failed), else 1 (also when the
# benchmark was stopped at the end of the budget: some rows are missing).
set -uo pipefail

cd "$(dirname "$0")/../.." || exit 1
PY=${PYTHON:-python3}
BUDGET=${TIER_BUDGET_S:-540}
ROW_RESERVE=${ROW_RESERVE_S:-75}
CUDA_TESTS_TIMEOUT=${CUDA_TESTS_TIMEOUT_S:-240}
SITE=${SITE:-/tmp/site}
RESULTS=${OUT:-/tmp}
DEVICE=${TIER_DEVICE:-cuda}
export PYTHONUNBUFFERED=1
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  exec > >(tee -a "$OUT/log") 2>&1
  TEE_PID=$!
fi

SUMMARY=()
STATUS=0
step() {  # step NAME RC START: one summary line
  local took=$((SECONDS - $3)) verdict=ok
  [ "$2" = 0 ] || { verdict="FAILED (exit status $2)"; STATUS=1; }
  SUMMARY+=("$(printf '%-24s %-28s %4d s' "$1" "$verdict" "$took")")
  printf '=== %s: %s (%d s; %d s of %d used)\n' "$1" "$verdict" "$took" "$SECONDS" "$BUDGET"
}
finish() {
  echo "=== summary (budget $BUDGET s, used $SECONDS s)"
  printf '  %s\n' "${SUMMARY[@]}"
  if [ -n "${TEE_PID:-}" ]; then  # let tee write the last lines of the log before the end
    exec >&- 2>&-
    wait "$TEE_PID" 2>/dev/null
  fi
  exit "$STATUS"
}

echo "=== GPU tier: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(hostname), checkout $(git rev-parse --short HEAD 2>/dev/null || echo '(no git)')"

# 1. the wheels
t=$SECONDS
shopt -s nullglob
wheels=(.whl/*.whl)
if [ ${#wheels[@]} = 0 ]; then
  echo "no wheels in .whl/: build them with tools/gpu/build_wheels.sh where there is network," \
    "and carry the folder along (device tool: carry=[\".whl\"])"
  step install 1 "$t"
  finish
fi
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" "${wheels[@]}"
rc=$?
export PYTHONPATH="$SITE:$PWD"
step "install ${#wheels[@]} wheels" "$rc" "$t"
[ "$rc" = 0 ] || finish

# 2. the machine and the software
t=$SECONDS
nvidia-smi || echo "(nvidia-smi failed)"
"$PY" - "$DEVICE" <<'EOF'
import platform, sys, torch
print(f'python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}, '
      f'cuDNN {torch.backends.cudnn.version()}, GPU available: {torch.cuda.is_available()}')
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f'GPU 0: {p.name}, compute capability {p.major}.{p.minor}, '
          f'{p.total_memory / 2**30:.1f} GiB, {p.multi_processor_count} multiprocessors')
import mmengine, mmcv, mmpretrain, mmrepa
print(f'mmengine {mmengine.__version__}, mmcv {mmcv.__version__} (lite), '
      f'mmpretrain {mmpretrain.__version__}, mmrepa {mmrepa.__version__} ({mmrepa.__file__})')
if sys.argv[1] == 'cuda' and not torch.cuda.is_available():
    raise SystemExit('torch sees no GPU')
EOF
rc=$?
step "machine and versions" "$rc" "$t"
[ "$rc" = 0 ] || finish

# 3. the tests marked cuda
t=$SECONDS
mapfile -t files < <(grep -rlE --include='test_*.py' 'mark\.cuda\b' tests | sort)
if [ ${#files[@]} = 0 ]; then
  echo "no test file under tests/ uses the cuda marker: nothing to run"
  rc=0
else
  echo "tests marked cuda in: ${files[*]}"
  timeout --signal=INT --kill-after=15 "$CUDA_TESTS_TIMEOUT" \
    "$PY" -m pytest "${files[@]}" -m cuda -q -p no:cacheprovider
  rc=$?
  [ "$rc" = 5 ] && { echo "(no test selected by -m cuda)"; rc=0; }
  [ "$rc" = 124 ] && echo "(stopped after $CUDA_TESTS_TIMEOUT s)"
fi
step "pytest -m cuda" "$rc" "$t"

# 4. the throughput benchmark, with the time left
t=$SECONDS
left=$((BUDGET - SECONDS))
if [ "$left" -le "$ROW_RESERVE" ]; then
  echo "only $left s left of $BUDGET: no time for the benchmark"
  step "gpu_throughput.py" 1 "$t"
  finish
fi
timeout --signal=TERM --kill-after=10 "$left" \
  "$PY" benchmarks/gpu_throughput.py --device "$DEVICE" --out "$RESULTS/gpu_throughput.json" \
  --budget-s $((left - ROW_RESERVE)) "$@"
rc=$?
[ "$rc" = 124 ] && echo "(stopped at the end of the budget; the JSON holds the rows finished)"
step "gpu_throughput.py" "$rc" "$t"
finish
