#!/usr/bin/env bash
# One device call (issue 23 item 4): experiments/fedgma/run_full.sh (3 rows) and
# experiments/fediir/run_full.sh (rows c50 and c5) at the paper's protocol, as 15 processes
# sharing the GPU (one per FedGMA row, one per FedIIR row x held-out domain), each under
# `timeout $LIMIT`; every run's JSON is written as it finishes, so a process stopped by the
# limit leaves complete seeds. Results go to $OUT/results.tgz (device tool) or $1.
#   bash benchmarks/gpu/run_full_call.sh [OUT]      Env: LIMIT=470 SIZE= HOLDOUTS= PYTHON=
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
for row in fed_cmnist mnist fed_rotmnist; do
  timeout "$limit" bash experiments/fedgma/run_full.sh "$r/fedgma" "$row" > "$r/fedgma_$row.out" 2>&1 &
done
for h in ${HOLDOUTS:-0 15 30 45 60 75}; do
  for row in c5 c50; do
    HOLDOUTS=$h timeout "$limit" bash experiments/fediir/run_full.sh "$r/fediir_${row}_h$h" "$row" \
      > "$r/fediir_${row}_h$h.out" 2>&1 &
  done
done
wait
echo "wall $(( $(date +%s) - start )) s" >> "$r/env.txt"
tar czf "$r.tgz" -C "$r" . && mkdir -p "$dest" && mv "$r.tgz" "$dest/results.tgz"
cat "$r/env.txt"; grep -h "seed=" "$r"/*.out | tail -n 40
