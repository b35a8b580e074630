#!/usr/bin/env bash
# Build the sm_90a extension on the H200 machine, run the GPU tests, sanitizers and a quick timing.
# Logs go under $OUT. Run from the repo root, with the nvidia-cutlass wheel carried in .whl/:
#   bash benchmarks/device_kernel.sh [all|build|test|sanitize|time]   (default: all)
# Env: JFM_TIME_ARGS (extra args for kernel_timing.py), JFM_PYTEST_ARGS.
set -u -o pipefail
STAGE=${1:-all}
OUT=${OUT:-/tmp/jfm_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
PY=${PY:-python3}
ROOT=$(pwd)

if [ ! -d /tmp/site/cutlass_library ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export JAX_FLASHMASK_CUTLASS_INCLUDE=/tmp/site/cutlass_library/source/include
export PYTHONPATH=$ROOT:/tmp/site

if [ "$STAGE" = all ] || [ "$STAGE" = build ]; then
  t0=$(date +%s)
  { cmake -S . -B build/dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE=$(command -v $PY) \
        -DJAX_FLASHMASK_PTXAS_VERBOSE=ON -DJAX_FLASHMASK_CUDA=ON -DCMAKE_CUDA_COMPILER=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc) && cmake --build build/dev -j16; } > "$OUT/build.log" 2>&1
  rc=$?
  echo "build rc=$rc in $(( $(date +%s) - t0 )) s"
  [ $rc -eq 0 ] || { tail -60 "$OUT/build.log"; exit 1; }
  cp build/dev/cc/_flashmask_cuda*.so jax_flashmask/
  grep -E "registers|spill" "$OUT/build.log" | sort | uniq -c | sort -rn | head -20
  so=$(ls jax_flashmask/_flashmask_cuda*.so)
  echo "HGMMA instructions in SASS: $(cuobjdump -sass "$so" | grep -c HGMMA)"
  echo "SETMAXNREG (USETMAXREG) in SASS: $(cuobjdump -sass "$so" | grep -c USETMAXREG)"
  echo "local memory (LDL/STL) in SASS: $(cuobjdump -sass "$so" | grep -cE '\b(LDL|STL)\b')"
  # forward bf16 d128 kernel: where the local-memory accesses sit relative to setmaxnreg
  cuobjdump -sass "$so" | awk '/Function : .*flashmask_fwd_kernel.*bfloat16_tELi128ELi128ELi2/{f=1} f&&/Function : /&&!/bfloat16_tELi128ELi128ELi2/{f=0} f' > "$OUT/sass_fwd_bf16_d128.txt"
  grep -nE 'USETMAXREG|\b(LDL|STL)\b|HGMMA.*gsb|EXIT' "$OUT/sass_fwd_bf16_d128.txt" | awk '{print $1, $3, $4}' | head -40
fi

if [ "$STAGE" = all ] || [ "$STAGE" = smoke ]; then
  cat > /tmp/jfm_smoke.py <<'PY'
import sys, numpy as np, jax, jax.numpy as jnp
from jax_flashmask import _cuda
print("available:", _cuda.is_available(), _cuda.unavailable_reason())
var = int(sys.argv[1])
rng = np.random.default_rng(0)
B, S, N, d = 1, 300, 2, 128
q, k, v = (jnp.asarray(rng.standard_normal((B, S, N, d)), jnp.bfloat16) for _ in range(3))
b = np.zeros((B, 1, 4, S), np.int32); b[:, :, 0] = S; b[:, :, 1] = S
b[:, :, 3] = np.arange(S)  # causal
o, l = _cuda.forward(q, k, v, jnp.asarray(b), scale=d ** -0.5, variant=var)
o = np.asarray(o.astype(jnp.float32)); l = np.asarray(l)
qf, kf, vf = (np.asarray(x.astype(jnp.float32), np.float64) for x in (q, k, v))
s = np.einsum("bqhd,bkhd->bhqk", qf, kf) * d ** -0.5
s = np.where(np.arange(S)[None, :] > np.arange(S)[:, None], -np.inf, s)
m = s.max(-1, keepdims=True); p = np.exp(s - m); ls = p.sum(-1, keepdims=True)
ro = np.einsum("bhqk,bkhd->bqhd", p / ls, vf); rl = (m + np.log(ls))[..., 0].transpose(0, 2, 1)
print(f"smoke variant={var}: max|dO|={np.abs(o - ro).max():.3e} max|dLSE|={np.abs(l - rl).max():.3e} nan={np.isnan(o).any()}")
PY
  for var in ${JFM_SMOKE_VARIANTS:-2 3 6}; do timeout 60 $PY /tmp/jfm_smoke.py $var 2>&1 | tail -3 | tee -a /tmp/jfm_smoke.log; done
  if [ "$STAGE" = all ] && ! grep -q "smoke variant=2" /tmp/jfm_smoke.log; then echo "smoke failed; stopping"; exit 1; fi
fi

if [ "$STAGE" = all ] || [ "$STAGE" = test ]; then
  timeout ${JFM_TEST_TIMEOUT:-240} $PY -m pytest tests/gpu/test_cuda_forward.py -q -rs ${JFM_PYTEST_ARGS:-} 2>&1 | tee "$OUT/tests.log" | tail -40
fi

if [ "$STAGE" = all ] || [ "$STAGE" = time ]; then
  timeout ${JFM_TIME_TIMEOUT:-150} $PY benchmarks/kernel_timing.py ${JFM_TIME_ARGS:---seqs 8192 --masks full causal document --cudnn} \
    --json "$OUT/timing.json" 2>&1 | tail -60
  if [ -n "${JFM_TIME_ARGS2:-}" ]; then
    timeout 200 $PY benchmarks/kernel_timing.py $JFM_TIME_ARGS2 --json "$OUT/timing2.json" 2>&1 | tail -30
  fi
fi

if [ "$STAGE" = all ] || [ "$STAGE" = sanitize ]; then
  cat > /tmp/jfm_san.py <<'PY'
import os, numpy as np, jax, jax.numpy as jnp
from jax_flashmask import _cuda
rng = np.random.default_rng(0)
variants = [int(x) for x in os.environ.get("JFM_SAN_VARIANTS", "2,3,4").split(",")]
cases = [(129, 200, 2, 128, jnp.bfloat16), (65, 70, 2, 256, jnp.float16), (1, 130, 2, 64, jnp.bfloat16),
         (1100, 1100, 32, 64, jnp.bfloat16),   # 9 x 32 = 288 tiles > 132 SMs (persistent loop)
         (1100, 1100, 16, 128, jnp.bfloat16),  # 144 tiles, d = 128 (variant 6)
         (300, 12400, 2, 128, jnp.bfloat16),   # 97 key blocks = 4 groups: variant 7's group walk
         (200, 9000, 2, 256, jnp.float16)]     # 141 blocks of 64 = 5 groups at d = 256
for (Sq, Sk, N, d, dt) in cases:
    q = jnp.asarray(rng.standard_normal((1, Sq, N, d)), dt)
    k = jnp.asarray(rng.standard_normal((1, Sk, 1, d)), dt)
    b = np.zeros((1, 1, 4, Sk), np.int32); b[:, :, 0] = rng.integers(0, Sq + 1, Sk); b[:, :, 1] = Sq
    if Sk > 8192:  # whole groups of fully masked columns, so the group walk skips some
        b[:, :, 0, 2000:Sk - 3000] = 0
    for var in variants:
        if not getattr(_cuda, "variant_supported", lambda *a: True)(var, dt, d):
            continue
        o, l = _cuda.forward(q, k, k, jnp.asarray(b), scale=0.1, variant=var)
        jax.block_until_ready((o, l))
        print(f"ran Sq={Sq} d={d} variant={var}", flush=True)
        if var in (3, 5, 6, 7) and Sq > 1000:  # few persistent CTAs: many tiles per CTA, both Q slots
            o, l = _cuda.forward(q, k, k, jnp.asarray(b), scale=0.1, variant=var, sm_margin=124)
            jax.block_until_ready((o, l))
            print(f"ran Sq={Sq} d={d} variant={var} sm_margin=124", flush=True)
print("sanitize case done")
PY
  for tool in ${JFM_SAN_TOOLS:-memcheck racecheck}; do
    timeout ${JFM_SAN_TIMEOUT:-90} compute-sanitizer --tool $tool \
      $PY /tmp/jfm_san.py > "$OUT/sanitizer_$tool.log" 2>&1
    echo "compute-sanitizer $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|sanitize case done' "$OUT/sanitizer_$tool.log" | tr '\n' ' ') (last run: $(grep '^ran ' "$OUT/sanitizer_$tool.log" | tail -1))"
  done
fi
