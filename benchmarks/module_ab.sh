#!/usr/bin/env bash
# Same-machine A/B of backward builds: one bwd_timing.py process per module, in the given order
# (e.g. ABBA), each against its own Python tree and compiled extension.
#
# Stage (build machine): bash benchmarks/module_ab.sh stage NAME REV SO DIR
#   writes DIR/tree_NAME.tgz (git archive of REV: jax_flashmask, tests, benchmarks/*.py) and
#   DIR/NAME.so.gz (the built _flashmask_cuda extension of that tree).
# Run (GPU machine): bash benchmarks/module_ab.sh run DIR OUTDIR NAME... -- BWD_TIMING_ARGS
#   unpacks each module under $JFM_AB_ROOT/NAME (default /tmp/jfm_mod) once, then runs
#   `python3 benchmarks/bwd_timing.py BWD_TIMING_ARGS --json OUTDIR/t_NAME_I.json` in that tree for
#   the I-th NAME of the list (every process's output appended to OUTDIR/ab.log).
#   NAME=X@VAR=VALUE runs module X with that environment variable set (e.g.
#   FC@JFM_BWD_FUSED_CONVERT=0). JFM_AB_END=S: start no process after S seconds.
# Table (any machine): python benchmarks/bwd_ab_table.py --a t_A_*.json --b t_B_*.json ...
set -u -o pipefail
mode=${1:?stage or run}; shift
if [ "$mode" = stage ]; then
  name=$1 rev=$2 so=$3 dir=$4
  mkdir -p "$dir"
  git archive "$rev" jax_flashmask tests $(git ls-tree --name-only "$rev" benchmarks/ | grep '\.py$') \
    | gzip > "$dir/tree_$name.tgz"
  gzip -c "$so" > "$dir/$name.so.gz"
  exit 0
fi
dir=$(cd "$1" && pwd) out=$2; shift 2
mkdir -p "$out"; out=$(cd "$out" && pwd)
names=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do names+=("$1"); shift; done
[ $# -gt 0 ] && shift
base=${JFM_AB_ROOT:-/tmp/jfm_mod}; mkdir -p "$base"
t0=$(date +%s); i=0
for spec in "${names[@]}"; do
  i=$((i + 1)); mod=${spec%%@*}; env=(); [ "$spec" != "$mod" ] && env=("${spec#*@}")
  if [ -n "${JFM_AB_END:-}" ] && [ $(( $(date +%s) - t0 )) -gt "$JFM_AB_END" ]; then
    echo "time limit: $spec (#$i) not run"; continue
  fi
  root=$base/$mod
  if [ ! -d "$root/jax_flashmask" ]; then
    mkdir -p "$root" && tar xzf "$dir/tree_$mod.tgz" -C "$root" &&
      gunzip -c "$dir/$mod.so.gz" > "$root/jax_flashmask/_flashmask_cuda$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')" || exit 1
  fi
  tag=$(echo "$spec" | tr -c 'A-Za-z0-9_\n' '_')
  (cd "$root" && env PYTHONPATH="$root" "${env[@]}" python3 benchmarks/bwd_timing.py "$@" \
     --json "$out/t_${tag}_$i.json" > "$base/last.log" 2>&1)
  rc=$?; { echo "== $spec (#$i) rc=$rc"; cat "$base/last.log"; } >> "$out/ab.log"
  echo "[$(( $(date +%s) - t0 )) s] $spec (#$i) rc=$rc rows=$(grep -c '^flashmask_bwd' "$base/last.log")"
done
