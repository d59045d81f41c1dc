#!/usr/bin/env bash
# One device call: fedjax_inv (`fedjax-inv bench`) and pfl-research 0.6.0 (PyTorch backend,
# benchmarks/peers/bench_pfl.py) side by side on the same GPU, FedAvg on the MLP, the
# ConvNet and pfl-research's own CIFAR10 setting (its simple CNN, 50 images a client, 1
# epoch of batch 10), C = 10, 100, 1000 (pool = C), float32-exact on both sides (ours
# --precision highest; pfl --tf32 off: torch.backends.cuda.matmul.allow_tf32 =
# torch.backends.cudnn.allow_tf32 = False), peak device memory on both sides.
#
# Needs: the checkout, and pfl's wheels in .whl/ (bash benchmarks/gpu/fetch_pfl_wheels.sh
# here; the call names `.whl` in `carry`). fedjax_inv runs from the checkout
# (PYTHONPATH=$PWD). Outputs in OUT ($OUT on the device machine, or $1), 6 files:
#   env.txt     GPU (nvidia-smi name, memory, driver, compute mode), torch / CUDA / cuDNN /
#               jax / pfl versions, CPU, the settings of this call
#   steps.log   each step: exit code, seconds, its time limit (or why it was skipped)
#   ours.json   every fedjax-inv bench row of the call (side_by_side_table.py --merge)
#   pfl.json    every bench_pfl.py row of the call
#   table.md    python benchmarks/side_by_side_table.py --gpu OUT (rewritten after each step)
#   logs.tgz    every step's log and raw JSON, every pfl worker's output
# Device call:
#   run(command="bash benchmarks/gpu/side_by_side_call.sh", carry=[".whl"], timeout_s=500)
# Ran on an H200 on 2026-11-28 (benchmarks/results_side_by_side_h200/): the C=1000 steps
# took 111 s (ours) and 160 s (pfl, its limit: 1 and 2 processes only; pfl does 3.7-14 ms
# per client update there, so its C=1000 rows cost 10-70 s each). The cells that did not
# run then, in two calls (the second picks pfl's layout from the first's C=100 rows):
#   run(command="STEPS=ours_cifar,ours_small,pfl_100,pfl_10 PFL_CONFIGS_REST=2,4,8
#     OURS_CIFAR_IMPLS=auto,scan,vmap+patches,chunked+patches LIMIT_ours_small=100
#     LIMIT_pfl_100=200 LIMIT_pfl_10=60 BUDGET_S=460 bash
#     benchmarks/gpu/side_by_side_call.sh", carry=[".whl"], timeout_s=500)
#   run(command="STEPS=pfl_1000,pfl_cifar PFL_CONFIGS=4,8 PFL_CONFIGS_REST=<best> ...")
# Dry run on a CPU (tiny settings: device cpu, clients 10, 1 timed round, configs 1,2):
#   DRY=1 PYTHON=/tmp/pfl/bin/python OURS_PY=.venv/bin/python PFL_PY=/tmp/pfl/bin/python \
#     SITE=/tmp/site_dry bash benchmarks/gpu/side_by_side_call.sh /tmp/sbs_dry
#   (/tmp/pfl: a Python 3.12 venv with torch 2.11.0 from PyPI, numpy, scipy, absl-py,
#   attrs, mpmath, packaging and the wheels of .whl/; DRY passes --dist-backend gloo so
#   that bench_pfl's override of pfl's process-group backend runs too)
# Env: BUDGET_S (whole call, default 440 s; every step's `timeout` is cut to what is left
#   of it, a step with under 20 s left is skipped), OURS_IMPLS (default
#   auto,vmap,scan,chunked,vmap+patches,chunked+patches; the two patches forms are timed
#   for the convolutional models only, skipped with a note for the MLP),
#   OURS_EXTRA_IMPLS (a last step on cnn,cifar10 at C = 100, 1000: default 'detect' =
#   the engine's strategies beyond OURS_IMPLS; 'none' skips it), PFL_CONFIGS (MLP and
#   ConvNet at C=1000: default 1,2,4,8 processes per GPU, as pfl's docs advise trying
#   1, 2, 3, ... for small models), STEPS (comma list of the step names below to run; default
#   all), LIMIT_<step> (that step's time limit in s, e.g. LIMIT_pfl_100=200),
#   OURS_CIFAR_IMPLS (step 3's; default OURS_IMPLS),
#   PFL_CONFIGS_REST (CIFAR10 at C=1000 and every model at C=100: default
#   adaptive, '1,B' with B the process count of pfl's fastest ConvNet (else MLP) layout at
#   C=1000, '1' when that is 1), PFL_CONFIGS_10 (default 1), PFL_BUDGET_S (bench_pfl's
#   --budget-s, default 15: 3 timed rounds, 2 when the first round takes over 5 s),
#   PYTHON / OURS_PY / PFL_PY, SITE.
#
# Steps, most important first, with the time each is expected to take on an H200 (from
# benchmarks/RESULTS.md "GPU: H200, every strategy beside `auto`", measured under TF32:
# ConvNet C=1000 round vmap 2.7 s, scan 0.83 s, chunked 0.50 s, loop 1.0 s; MLP C=1000
# vmap 3.6 ms, scan 0.11 s; float32-exact convolutions may take up to ~2x; compiles ~2-5 s
# each; jax's start on the GPU ~10 s. pfl on a GPU was never measured here: ~5-7 ms per
# client update per process is assumed from its 2.4-4.8 ms on the CPU plus ~30 kernel
# launches per step; ~6-8 s per worker start (torch import, CUDA context); bench_pfl runs
# 1 untimed round (with pfl's iteration-0 evaluation) + 2 timed ones):
#   0 setup       wheels into $SITE, env.txt                                  ~10 s
#   1 ours_1000   mlp,cnn  C=1000  OURS_IMPLS                 ~90 s  (limit 150; the
#                 patches forms of the ConvNet at C=1000 never ran on a GPU: unknown)
#   2 pfl_1000    mlp,cnn  C=1000  PFL_CONFIGS (8 launches)   ~140 s  (limit 160)
#   3 ours_cifar  cifar10  C=10,100,1000  OURS_IMPLS          ~60 s  (limit 90)
#   4 pfl_cifar   cifar10  C=1000  PFL_CONFIGS_REST           ~45 s  (limit 70)
#   5 ours_small  mlp,cnn  C=10,100  OURS_IMPLS (+ matmul peak) ~40 s  (limit 60)
#   6 pfl_100     mlp,cnn,cifar10  C=100  PFL_CONFIGS_REST    ~55 s  (limit 70)
#   7 pfl_10      mlp,cnn,cifar10  C=10   PFL_CONFIGS_10      ~25 s  (limit 40)
#   8 ours_extra  cnn,cifar10  C=100,1000  OURS_EXTRA_IMPLS   ~40 s  (limit 90; only
#                 with time left)
# Sum of the estimates ~465 s > BUDGET_S: the deadline cuts the last steps first; every
# step writes its JSON as it goes (both benches rewrite theirs after each row), so a step
# stopped by its limit keeps its finished rows.
source "$(dirname "$0")/common.sh" "$@"
budget=${BUDGET_S:-$([ "$DRY" = 1 ] && echo 1500 || echo 440)}
w=$(mktemp -d /tmp/sbs.XXXXXX)
OURS_PY=${OURS_PY:-$PY}
PFL_PY=${PFL_PY:-$PY}
impls=${OURS_IMPLS:-auto,vmap,scan,chunked,vmap+patches,chunked+patches}
if [ "$DRY" = 1 ]; then
  dev=cpu; big=10; mid=10; small=10; rounds=(--rounds 1 --warmup 1)
  cfg_big=${PFL_CONFIGS:-1,2}; cfg_small=${PFL_CONFIGS_10:-1}
  dist=${PFL_DIST_BACKEND:-gloo}  # exercises bench_pfl's backend override on the CPU
else
  dev=cuda; big=1000; mid=100; small=10; rounds=(--rounds 3 --warmup 1)
  cfg_big=${PFL_CONFIGS:-1,2,4,8}; cfg_small=${PFL_CONFIGS_10:-1}
  dist=${PFL_DIST_BACKEND:-auto}
fi
cap() { [ "$DRY" = 1 ] && echo $(( $1 * 4 )) || echo "$1"; }
csv() { echo "$@" | tr ' ' '\n' | awk '!seen[$0]++' | paste -sd, -; }  # deduplicated

# 0. pfl's wheels (pfl, dp-accounting, prv-accountant, multiprocess, dill, mlxtend) into $SITE
install_wheels "$w/pip.log"

{
  echo "date $(date -u +%FT%TZ)  DRY=$DRY  budget ${budget} s  device $dev"
  echo "ours impls $impls; pfl configs mlp,cnn C=$big: $cfg_big, C=$small: $cfg_small, else"\
       "${PFL_CONFIGS_REST:-adaptive}; pfl dist backend $dist; pfl --tf32 off; ours"\
       "--precision highest"
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_mode --format=csv 2>&1 | head -3
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
  "$PFL_PY" - <<'PY' 2>&1
import platform
import torch
print("pfl python", platform.python_version(), "torch", torch.__version__, "cuda",
      torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "gpu",
      torch.cuda.get_device_name() if torch.cuda.is_available() else None)
print("torch defaults: matmul.allow_tf32", torch.backends.cuda.matmul.allow_tf32,
      "cudnn.allow_tf32", torch.backends.cudnn.allow_tf32)
try:
  import pfl
  print("pfl", pfl.__version__, pfl.__file__)
except Exception as e:  # noqa: BLE001
  print("pfl IMPORT-ERROR", type(e).__name__, e)
PY
  "$OURS_PY" -c "import jax, flax, optax, platform; print('ours python', platform.python_version(), 'jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())" 2>&1 | tail -1
  cat "$w/pip.log" 2>/dev/null
  git log -1 --format='commit %H %s' 2>/dev/null; git status --short 2>/dev/null | head -20
} > "$dest/env.txt"

collect() {  # merge every step's JSON into $dest, render the table, pack the logs
  local f
  f=$(for j in "${ours_json[@]}"; do [ -f "$j" ] && echo "$j"; done)
  [ -n "$f" ] && "$PY" benchmarks/side_by_side_table.py --merge "$dest/ours.json" $f
  f=$(for j in "${pfl_json[@]}"; do [ -f "$j" ] && echo "$j"; done)
  [ -n "$f" ] && "$PY" benchmarks/side_by_side_table.py --merge "$dest/pfl.json" $f
  "$PY" benchmarks/side_by_side_table.py --gpu "$dest" > "$dest/table.md" 2>&1
  cp "$w/steps.log" "$dest/steps.log" 2>/dev/null
  tar czf "$dest/logs.tgz" -C "$w" . 2>/dev/null
}

step_limit() { cap "$1"; }  # for common.sh's step: a dry run's limits are 4x
after_step() { collect; }

ours_json=(); pfl_json=()  # in the order of the steps (the table takes the first `auto`)
ours() {  # ours NAME LIMIT WORKLOADS CLIENTS IMPLS [extra args]
  local name=$1 limit=$2 wl=$3 cs=$4 im=$5; shift 5
  ours_json+=("$w/$name.json")
  step "$name" "$limit" "$OURS_PY" -m fedjax_inv.cli bench --workloads "$wl" --clients "$cs" \
    --impls "$im" "${rounds[@]}" --precision highest --json "$w/$name.json" "$@"
}

pfl() {  # pfl NAME LIMIT MODELS CLIENTS CONFIGS
  local name=$1 limit=$2 models=$3 cs=$4 cfgs=$5
  pfl_json+=("$w/$name.json")
  step "$name" "$limit" "$PFL_PY" benchmarks/peers/bench_pfl.py --device "$dev" --tf32 off \
    --dist-backend "$dist" --models "$models" --clients "$cs" --configs "$cfgs" \
    "${rounds[@]}" --budget-s "${PFL_BUDGET_S:-15}" --timeout-s "$(cap 90)" \
    --logs "$w/pfl_workers" --json "$w/$name.json"
}

: > "$w/steps.log"
mp=$([ "$DRY" = 1 ] && echo --no-matmul-peak)
ours ours_1000 150 mlp,cnn "$big" "$impls" --no-matmul-peak
pfl pfl_1000 160 mlp,cnn "$big" "$cfg_big"
ours ours_cifar 90 cifar10 "$(csv $small $mid $big)" "${OURS_CIFAR_IMPLS:-$impls}" \
  --no-matmul-peak
# pfl's fastest layout at C=1000 (ConvNet, else MLP) for the remaining pfl steps
bestp=$("$PY" - "$w/pfl_1000.json" <<'PY' 2>/dev/null
import json, sys
best = {}
for r in json.load(open(sys.argv[1]))["rows"]:
  b = best.get(r["workload"])
  if b is None or r["client_updates_per_s"] > b["client_updates_per_s"]:
    best[r["workload"]] = r
r = best.get("cnn_fedavg") or best.get("mlp_fedavg")
print(r["processes"] if r else "")
PY
)
cfg_rest=${PFL_CONFIGS_REST:-$(csv 1 ${bestp:-})}
echo "pfl layouts for cifar10 C=$big and C=$mid: $cfg_rest (fastest at C=$big: ${bestp:-none})" \
  | tee -a "$w/steps.log"
pfl pfl_cifar 70 cifar10 "$big" "$cfg_rest"
ours ours_small 60 mlp,cnn "$(csv $small $mid)" "$impls" $mp
pfl pfl_100 70 mlp,cnn,cifar10 "$mid" "$cfg_rest"
pfl pfl_10 40 mlp,cnn,cifar10 "$small" "$cfg_small"
extra=${OURS_EXTRA_IMPLS:-detect}
if [ "$extra" = detect ]; then
  extra=$("$OURS_PY" -c "
from fedjax_inv.core import engine
base = set('$impls'.split(',')) | {'auto', 'loop', 'sharded'}
print(','.join(s for s in getattr(engine, 'STRATEGIES', ()) if s not in base))" 2>/dev/null)
fi
if [ -n "$extra" ] && [ "$extra" != none ]; then
  ours ours_extra 90 cnn,cifar10 "$(csv $mid $big)" "$extra" --no-matmul-peak
else
  echo "ours_extra: no extra impls" | tee -a "$w/steps.log"
fi
echo "wall $(( $(date +%s) - start )) s" | tee -a "$w/steps.log" >> "$dest/env.txt"
collect
cat "$dest/steps.log"; cat "$dest/table.md"
