#!/usr/bin/env bash
# One device call: the paper-size rows of FedGMA (experiments/fedgma/spec.yaml, group
# full: 3 rows) and FedIIR (experiments/fediir/spec.yaml, groups gpu_c5 and gpu_c50) as 15
# `fedjax-inv experiment` processes sharing the GPU (one per FedGMA row, one per FedIIR
# group x held-out domain), each under `timeout $LIMIT`. Every (run, seed) record is written
# as it finishes, so a process stopped by the limit leaves complete records, and calling
# this again with the same OUT resumes. Records go to $OUT/results.tgz (device tool) or $1.
#   bash benchmarks/gpu/run_full_call.sh [OUT]      Env: LIMIT=470 HOLDOUTS= PYTHON=
set -uo pipefail
cd "$(dirname "$0")/../.."
dest=${1:-${OUT:?set OUT or pass a folder}}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHON=${PYTHON:-python3}
limit=${LIMIT:-470}
r=$(mktemp -d /tmp/run_full.XXXXXX)
$PYTHON -c "import jax, platform; print('jax', jax.__version__, 'python', platform.python_version(), jax.devices())" > "$r/env.txt" 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$r/env.txt" 2>/dev/null
start=$(date +%s)
exp() { $PYTHON -m fedjax_inv.cli experiment "$@"; }
for row in fed_cmnist mnist fed_rotmnist; do
  timeout "$limit" exp experiments/fedgma/spec.yaml --out "$r/fedgma" --where group=full \
    --where row=$row > "$r/fedgma_$row.out" 2>&1 &
done
for h in ${HOLDOUTS:-0 15 30 45 60 75}; do
  for g in gpu_c5 gpu_c50; do
    timeout "$limit" exp experiments/fediir/spec.yaml --out "$r/fediir" --where group=$g \
      --where holdout=$h > "$r/fediir_${g}_h$h.out" 2>&1 &
  done
done
wait
echo "wall $(( $(date +%s) - start )) s" >> "$r/env.txt"
tar czf "$r.tgz" -C "$r" . && mkdir -p "$dest" && mv "$r.tgz" "$dest/results.tgz"
cat "$r/env.txt"; grep -h "seed " "$r"/*.out | tail -n 40
