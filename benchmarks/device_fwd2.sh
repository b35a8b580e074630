#!/usr/bin/env bash
# Forward round 2 (2026-11-30): sm_margin, variant 6 (tile-boundary overlap), variant 7 (Bn = 176).
# From the repo root with the cutlass wheel in .whl/ (carry [".whl"]); logs under $OUT.
#   bash benchmarks/device_fwd2.sh [build] [test] [sanitize] [time]     (no argument = all four)
# Stages (each time-limited, so a hang in a new variant cannot eat the call; worst case / expected):
#   build    : device_kernel.sh build (9 forward + 4 backward TUs, ptxas/SASS summary)  ~80 s
#              + smoke of variants 6 and 7 (60 s cap each)                              ~20 s
#   test     : GPU tests with variants 2,3,4 (200 s cap), then 6,7 alone (200 s cap)   ~100-250 s
#   sanitize : memcheck + racecheck, small cases, variants 3,6,7, plus 288-tile (d 64) and 144-tile
#              (d 128) cases also on 8 CTAs (sm_margin=124) (240 s cap per tool)        ~100-400 s
#   time     : kernel_timing 3 vs 6 vs 7 + cuDNN, 8K x 7 masks (150 s cap), 32K x full/causal/
#              document (150 s cap), v3 with --sm-margin 8 at 8K (60 s cap)             ~90-150 s
# Device calls of <= 600 s: "build test", then "sanitize", then "time" (the build outputs stay on
# a warm machine; a later stage alone works after "build").
set -u -o pipefail
OUT=${OUT:-/tmp/jfm_out}; mkdir -p "$OUT"
K=benchmarks/device_kernel.sh
STAGES=${*:-build test sanitize time}
t0=$(date +%s); el() { echo "[+$(( $(date +%s) - t0 )) s] $*"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }

if has build; then
  el build;  bash $K build || exit 1
  el smoke;  JFM_SMOKE_VARIANTS="6 7" bash $K smoke
fi
if ! ls jax_flashmask/_flashmask_cuda*.so >/dev/null 2>&1; then
  echo "no built extension in jax_flashmask/: run the build stage first"; exit 1
fi
if has test; then
  el "tests (variants 2,3,4)"
  JFM_TEST_VARIANTS=2,3,4 JFM_TEST_TIMEOUT=200 bash $K test; cp "$OUT/tests.log" "$OUT/tests_v234.log"
  el "tests (variants 6,7)"
  JFM_TEST_VARIANTS=6,7 JFM_TEST_TIMEOUT=200 bash $K test; cp "$OUT/tests.log" "$OUT/tests_v67.log"
fi
if has sanitize; then
  el sanitize; JFM_SAN_VARIANTS=3,6,7 JFM_SAN_TIMEOUT=240 bash $K sanitize
fi
if has time; then
  el timing
  JFM_TIME_TIMEOUT=150 \
  JFM_TIME_ARGS="--seqs 8192 --masks full causal sliding_window causal_document document share_question random_eviction --variants 3 6 7 --cudnn --iters 5" \
    bash $K time
  cp "$OUT/timing.json" "$OUT/timing_8k.json" 2>/dev/null
  JFM_TIME_TIMEOUT=150 \
  JFM_TIME_ARGS="--seqs 32768 --masks full causal document --variants 3 6 7 --cudnn --iters 3" \
    bash $K time
  cp "$OUT/timing.json" "$OUT/timing_32k.json" 2>/dev/null
  PYTHONPATH=.:/tmp/site timeout 60 python3 benchmarks/kernel_timing.py --seqs 8192 --masks full document \
    --variants 3 --sm-margin 8 --iters 5 --json "$OUT/timing_margin8.json" 2>&1 | tail -4
fi
el done
