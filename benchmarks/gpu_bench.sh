#!/usr/bin/env bash
# One-command GPU benchmark: run on a machine with a CUDA GPU and JAX
# installed. Writes JSON tables and a log into the folder given as $1 (default
# benchmarks/gpu_out). Needs no network. On a machine without this package installed, it
# runs from the source tree (PYTHONPATH=.).
#   bash benchmarks/gpu_bench.sh OUT [quick|short|full]
# quick: `bench --quick`. short: fits one 10-minute device call (about 8.5 min, each part
# under its own `timeout`, JSON rows written as they come): MLP C = 10 .. 10000 and ConvNet
# C = 10 .. 1000 with every fixed strategy beside `auto` (is the fixed rule right?), the
# ConvNet again with nnx.max_pool (the pooling before/after its rewrite) and the heavy
# algorithms. full: the whole plan below (about an hour).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/gpu_out}; plan=${2:-full}
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
$py - <<'PY' | tee "$out/env.txt"
import jax, flax, optax, platform
print("jax", jax.__version__, "flax", flax.__version__, "optax", optax.__version__,
      "python", platform.python_version())
print("backend", jax.default_backend(), "devices", jax.devices())
PY
if [ "$plan" = quick ]; then
  $py -m fedjax_inv.cli bench --quick --json "$out/quick.json" 2>&1 | tee "$out/quick.log"
  exit 0
fi
if [ "$plan" = short ]; then
  all=loop,auto,vmap,scan,chunked
  b() { local t=$1 name=$2; shift 2
    timeout "$t" "$@" --rounds 3 --max-impl-s 20 --no-matmul-peak --json "$out/$name.json" \
      2>&1 | tee -a "$out/short.log"; }
  b 150 mlp $py -m fedjax_inv.cli bench --workloads mlp --clients 10,100,1000,10000 --impls $all
  b 120 cnn $py -m fedjax_inv.cli bench --workloads cnn --clients 10,100,1000 --impls $all
  b 80 cnn_nnxpool $py benchmarks/pool_ab.py --workloads cnn --clients 10,100,1000 \
    --impls vmap,scan,chunked
  b 130 heavy $py -m fedjax_inv.cli bench --workloads mlp_fishr_inter_geo,mlp_fedsr,mlp_fediir \
    --clients 10,100,1000 --impls loop,auto,vmap,scan,chunked
  exit 0
fi
# MLP FedAvg: per-client loop vs the engine's strategies, C = 10 .. 10000.
$py -m fedjax_inv.cli bench --workloads mlp --clients 10,100,1000,10000 \
  --impls loop,auto,vmap,scan --rounds 5 --max-impl-s 120 --json "$out/mlp.json" \
  2>&1 | tee "$out/mlp.log"
# ConvNet FedAvg and the heavy algorithms (fishr_inter_geo, fedsr) at C = 10 .. 1000.
$py -m fedjax_inv.cli bench --workloads cnn,mlp_fishr_inter_geo,mlp_fedsr \
  --clients 10,100,1000 --impls loop,auto --rounds 3 --max-impl-s 120 \
  --json "$out/heavy.json" 2>&1 | tee "$out/heavy.log"
# Many runs as one program (8 seeds batched vs sequential) and fused rounds (10 rounds per
# device call vs one call per round), MLP and ConvNet FedAvg, C = 10 .. 1000.
$py -m fedjax_inv.cli bench --workloads mlp,cnn --clients 10,100,1000 --replicas 8 \
  --fused 10 --rounds 5 --no-matmul-peak --json "$out/replicas_fused.json" \
  2>&1 | tee "$out/replicas_fused.log"
