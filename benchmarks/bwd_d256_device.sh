#!/usr/bin/env bash
# One device call for the head-dim-256 backward kernel (cc/sm90/bwd_d256_kernel.cuh, never run on a
# GPU before this script): load (or build) the extension, smoke-run the small sanitizer cases
# (default form = variant 5 and the EarlySdP form = variant 4; a hang is cut by the timeout), the
# d=256 GPU tests, the timing at 8K (H = 16, d = 256: the FLOPs of the d = 128 protocol) against
# the portable XLA backward (the d = 256 path before this kernel) and cuDNN, then compute-sanitizer
# memcheck + racecheck on the small cases. Logs under $OUT. Run from the repo root.
#   JFM_D256_STAGES: subset of "smoke tests time san" (default all); JFM_D256_TIME_ARGS: arguments
#   of bwd_timing.py.
set -u -o pipefail
OUT=${OUT:-/tmp/jfm_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$(pwd)
PY=${PY:-python3}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
if ! $PY -c "from jax_flashmask import _cuda; assert _cuda.is_available(), _cuda.unavailable_reason(); c = _cuda._bwd_compiled_configs(); assert 'bf16_d256' in c, c; print('prebuilt ok', c)" > "$OUT/setup.log" 2>&1; then
  echo "prebuilt extension does not load or lacks d=256: $(tail -1 "$OUT/setup.log"); building"
  rm -f jax_flashmask/_flashmask_cuda*.so
  bash benchmarks/device_kernel.sh build 2>&1 | tail -12
fi
tail -1 "$OUT/setup.log"; el
STAGES=${JFM_D256_STAGES:-smoke tests time san}
# the default form (variant 5) and, where variant number 4 is still compiled, the EarlySdP form
VS=$($PY -c "from jax_flashmask import _cuda; print(' '.join(str(v) for v in (5, 4) if v in _cuda.BWD_VARIANTS))")
TIME_ARGS=${JFM_D256_TIME_ARGS:---seqs 8192 --d 256 --heads 16 --masks full causal document sliding_window --variants $VS --det 0 1 --portable --cudnn --iters 4}
for st in $STAGES; do
  case $st in
  smoke)
    timeout ${JFM_T_SMOKE:-40} $PY benchmarks/bwd_timing.py --small --variants $VS > "$OUT/smoke_d256.log" 2>&1
    echo "smoke (d 64/128/256, variants $VS) rc=$?: $(tail -1 "$OUT/smoke_d256.log")"; el ;;
  tests)
    timeout ${JFM_T_TESTS:-300} $PY -m pytest tests/gpu/test_cuda_backward.py -q -rs -x \
      -k "d256 or head_dims or fallback or check_supported" > "$OUT/tests_d256.log" 2>&1
    echo "tests (d=256) rc=$?: $(tail -1 "$OUT/tests_d256.log")"; el
    grep -E "^(FAILED|ERROR)" "$OUT/tests_d256.log" | head -8 ;;
  time)
    timeout ${JFM_T_TIME:-300} $PY benchmarks/bwd_timing.py $TIME_ARGS \
      --json "$OUT/timing_d256.json" > "$OUT/timing_d256.log" 2>&1
    echo "timing rc=$?"; grep -E '^\{' "$OUT/timing_d256.log" | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); c = r.get('check')
    cs = '' if not c else f\"  vs {c['vs']}: dq {c['dq_relerr']:.1e} dk/dv bitwise {c['dk_bitwise'] and c['dv_bitwise']} dq bitwise {c['dq_bitwise']}\"
    print(f\"{r['impl']:30s} {r['mask']:15s} {r['ms']:8.2f} ms {r['tflops_fm']:7.1f}{cs}\")"
    grep FAILED "$OUT/timing_d256.log"; el ;;
  san)
    for tool in memcheck racecheck; do
      timeout ${JFM_T_SAN:-60} compute-sanitizer --tool $tool $PY benchmarks/bwd_timing.py --small --variants $VS > "$OUT/san_d256_$tool.log" 2>&1
      echo "compute-sanitizer $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|sanitize case done' "$OUT/san_d256_$tool.log" | tr '\n' ' ')"; el
    done ;;
  esac
done
