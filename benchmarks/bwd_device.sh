#!/usr/bin/env bash
# One device call for the backward: use the extension built on the dev machine when it loads here
# (jax_flashmask/_flashmask_cuda*.so, built against the device's jax), else build it; then the
# backward GPU tests, the timing (variants x default/deterministic, cuDNN in the same run) and
# compute-sanitizer on small cases. Logs under $OUT. Run from the repo root.
#   JFM_BWD_TIME_ARGS: arguments of bwd_timing.py; JFM_BWD_STAGES: subset of
#   "smoke tests_det time tests_rest san"; JFM_BWD_TEST_VARIANTS: kernel variants the tests run
#   (default $BASE,$NEW = 5,6); JFM_BWD_SAN_ARGS: extra arguments of `bwd_timing.py --small` under
#   the sanitizers (default --variants $NEW). The smoke stage runs the small cases of the new
#   variant ($JFM_BWD_NEW, default 6: the persistent scheduler) alone under a short timeout; if it
#   fails or hangs, it is dropped from the later stages (no budget lost to it) and they run the
#   base variant ($JFM_BWD_BASE, default 5: the default) alone.
#   JFM_BWD_TIME_EXTRA: further variants timed (not tested) after base and new (default none).
#   JFM_BWD_SMOKE_VARIANTS: the variants of the smoke run (default $JFM_BWD_NEW; e.g. "10 11").
#   The timing validates too: every configuration of a mask against the first one (bwd_timing.py
#   `check`, `CHECK FAILED` lines: variant 6 vs 5, dK/dV bitwise).
set -u -o pipefail
OUT=${OUT:-/tmp/jfm_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$(pwd)
PY=${PY:-python3}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
if ! $PY -c "from jax_flashmask import _cuda; assert _cuda.is_available(), _cuda.unavailable_reason(); print('prebuilt ok', _cuda._bwd_compiled_configs())" > "$OUT/setup.log" 2>&1; then
  echo "prebuilt extension does not load: $(tail -1 "$OUT/setup.log"); building"
  rm -f jax_flashmask/_flashmask_cuda*.so
  bash benchmarks/device_kernel.sh build 2>&1 | tail -12
fi
tail -1 "$OUT/setup.log"; el
STAGES=${JFM_BWD_STAGES:-smoke tests_det time tests_rest san}
NEW=${JFM_BWD_NEW:-6}
BASE=${JFM_BWD_BASE:-5}
export JFM_BWD_TEST_VARIANTS=${JFM_BWD_TEST_VARIANTS:-$BASE,$NEW}
TIME_ARGS=${JFM_BWD_TIME_ARGS:---seqs 8192 --masks sliding_window causal_document share_question full causal document --variants $BASE $NEW ${JFM_BWD_TIME_EXTRA-} --det 0 1 --cudnn --iters 4}
SAN_ARGS=${JFM_BWD_SAN_ARGS:---variants $NEW}
for st in $STAGES; do
  case $st in
  smoke)
    SMOKE=${JFM_BWD_SMOKE_VARIANTS:-$NEW}
    timeout ${JFM_T_SMOKE:-30} $PY benchmarks/bwd_timing.py --small --variants $SMOKE > "$OUT/smoke_v$NEW.log" 2>&1
    rc=$?; echo "variants $SMOKE smoke rc=$rc: $(tail -1 "$OUT/smoke_v$NEW.log")"; el
    if [ $rc -ne 0 ]; then
      echo "variant $NEW FAILED its smoke run: dropped from tests, timing and sanitizers"
      export JFM_BWD_TEST_VARIANTS=$BASE
      TIME_ARGS=$(echo "$TIME_ARGS" | sed -E "s/--variants $BASE $NEW( [0-9]+)*/--variants $BASE/")
      SAN_ARGS="--variants $BASE"
    fi ;;
  tests_det)
    timeout ${JFM_T_TESTS1:-60} $PY -m pytest tests/gpu/test_cuda_backward.py -q -rs -k "deterministic or variants_agree" > "$OUT/tests_det.log" 2>&1
    echo "tests (deterministic) rc=$?: $(tail -1 "$OUT/tests_det.log")"; el
    grep -E "^(FAILED|ERROR)" "$OUT/tests_det.log" | head -8 ;;
  tests_rest)
    timeout ${JFM_T_TESTS2:-120} $PY -m pytest tests/gpu/test_cuda_backward.py -q -rs -k "not deterministic and not variants_agree" > "$OUT/tests_rest.log" 2>&1
    echo "tests (rest) rc=$?: $(tail -1 "$OUT/tests_rest.log")"; el
    grep -E "^(FAILED|ERROR)" "$OUT/tests_rest.log" | head -8 ;;
  time)
    timeout ${JFM_T_TIME:-150} $PY benchmarks/bwd_timing.py $TIME_ARGS \
      --json "$OUT/timing.json" > "$OUT/timing.log" 2>&1
    echo "timing rc=$?"; grep -E '^\{' "$OUT/timing.log" | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); c = r.get('check')
    cs = '' if not c else f\"  vs {c['vs']}: dq {c['dq_relerr']:.1e} dk/dv bitwise {c['dk_bitwise'] and c['dv_bitwise']} dq bitwise {c['dq_bitwise']}\"
    print(f\"{r['impl']:30s} {r['mask']:15s} {r['ms']:8.2f} ms {r['tflops_fm']:7.1f}{cs}\")"
    grep FAILED "$OUT/timing.log"; el ;;
  san)
    for tool in memcheck racecheck; do
      timeout ${JFM_T_SAN:-20} compute-sanitizer --tool $tool $PY benchmarks/bwd_timing.py --small $SAN_ARGS > "$OUT/san_$tool.log" 2>&1
      echo "compute-sanitizer $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|sanitize case done' "$OUT/san_$tool.log" | tr '\n' ' ')"; el
    done ;;
  esac
done
