#!/usr/bin/env bash
# Forward round 2 (2026-11-30): sm_margin, variant 6 (tile-boundary overlap), variant 7 (Bn = 176). One device call, from
# the repo root with the cutlass wheel in .whl/ (carry [".whl"]); logs under $OUT. Stages are
# time-limited one by one so that a hang in the new variant cannot eat the whole call:
#   1. build (+ ptxas/SASS summary), 2. smoke of variants 2 3 6 7 (60 s each),
#   3. GPU tests, stable variants (2,3,4) first, then variants 6 and 7,
#   4. compute-sanitizer memcheck + racecheck on small cases for variants 3, 6, 7 (incl. sm_margin),
#   5. timing: variants 3, 6, 7 at 8K (7 masks) and 32K (3 masks) with cuDNN; v3 with sm_margin 8.
set -u -o pipefail
OUT=${OUT:-/tmp/jfm_out}; mkdir -p "$OUT"
K=benchmarks/device_kernel.sh
t0=$(date +%s); el() { echo "[+$(( $(date +%s) - t0 )) s] $*"; }

el build;    bash $K build || exit 1
el smoke;    JFM_SMOKE_VARIANTS="2 3 6 7" bash $K smoke
el "tests (variants 2,3,4)"
JFM_TEST_VARIANTS=2,3,4 JFM_TEST_TIMEOUT=200 bash $K test; cp "$OUT/tests.log" "$OUT/tests_v234.log"
el "tests (variants 6, 7)"
JFM_TEST_VARIANTS=6,7 JFM_TEST_TIMEOUT=180 bash $K test; cp "$OUT/tests.log" "$OUT/tests_v67.log"
el sanitize; JFM_SAN_VARIANTS=3,6,7 JFM_SAN_TIMEOUT=150 bash $K sanitize
el timing
JFM_TIME_TIMEOUT=150 \
JFM_TIME_ARGS="--seqs 8192 --masks full causal sliding_window causal_document document share_question random_eviction --variants 3 6 7 --cudnn --iters 5" \
JFM_TIME_ARGS2="--seqs 32768 --masks full causal document --variants 3 6 7 --cudnn --iters 3" \
  bash $K time
PYTHONPATH=.:/tmp/site timeout 60 python3 benchmarks/kernel_timing.py --seqs 8192 --masks full document \
  --variants 3 --sm-margin 8 --iters 5 --json "$OUT/timing_margin8.json" 2>&1 | tail -4
el done
