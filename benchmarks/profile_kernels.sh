#!/usr/bin/env bash
# Nsight Compute profiles of the Hopper kernels on small benchmark problems (S = 8K, B = 2, H = 32,
# d = 128, bf16): where a kernel's time goes (tensor-pipe and issue utilisation, warp stall
# reasons). One launch per case, the third (after jit + warm-up). Run from the repo root on the
# device; one text report per case under $OUT (ncu_<case>.txt).
#   JFM_PROF_CASES: subset of "fwd_full fwd_sliding bwd_full bwd_sliding" (default all);
#   JFM_PROF_FWD_VARIANT / JFM_PROF_BWD_VARIANT (default: the library's d = 128 default);
#   JFM_PROF_TIMEOUT per case (default 60 s).
set -u -o pipefail
OUT=${OUT:-/tmp/jfm_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$(pwd)${PYTHONPATH:+:$PYTHONPATH}
PY=${PY:-python3}
NCU=${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)}
# the library's d = 128 forward default unless set (kernel_timing.py itself defaults to variant 2)
FV="--variants ${JFM_PROF_FWD_VARIANT:-$($PY -c 'from jax_flashmask import _cuda; print(_cuda.resolve_variant(None))')}"
BV=${JFM_PROF_BWD_VARIANT:+--variants $JFM_PROF_BWD_VARIANT}
SECTIONS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section InstructionStats --section SchedulerStats --section MemoryWorkloadAnalysis"
prof() {  # prof NAME KERNEL_REGEX COMMAND...
  local name=$1 kre=$2; shift 2
  local args=(--clock-control none -k "regex:$kre" --launch-skip 2 --launch-count 1 $SECTIONS)
  timeout "${JFM_PROF_TIMEOUT:-60}" "$NCU" "${args[@]}" --print-details all "$@" > "$OUT/ncu_$name.txt" 2>&1 \
    || timeout "${JFM_PROF_TIMEOUT:-60}" "$NCU" "${args[@]}" "$@" > "$OUT/ncu_$name.txt" 2>&1
  echo "ncu $name rc=$?: $(grep -E 'Duration|Compute \(SM\) Throughput|Issue Slots Busy' "$OUT/ncu_$name.txt" | tr -s ' ' | tr '\n' ';')"
}
for c in ${JFM_PROF_CASES:-fwd_full fwd_sliding bwd_full bwd_sliding}; do
  case $c in
  fwd_full)    prof $c 'flashmask_fwd' $PY benchmarks/kernel_timing.py --tokens 16384 --masks full $FV --iters 1 ;;
  fwd_sliding) prof $c 'flashmask_fwd' $PY benchmarks/kernel_timing.py --tokens 16384 --masks sliding_window $FV --iters 1 ;;
  bwd_full)    prof $c 'flashmask_bwd' $PY benchmarks/bwd_timing.py --tokens 16384 --masks full $BV --iters 1 --no-check ;;
  bwd_sliding) prof $c 'flashmask_bwd' $PY benchmarks/bwd_timing.py --tokens 16384 --masks sliding_window $BV --iters 1 --no-check ;;
  esac
done
