#!/usr/bin/env bash
# One device call, after side_by_side_call.sh: FEMNIST at its real size on the GPU, and
# what `--precision tf32` changes.
#   1 femnist    benchmarks/pool_femnist.py, 3,400 synthetic writers, FedAvg, C=100: the
#                streamed host pool (first run: generated, cached, memory-mapped) against
#                the resident device pool, same strategy ($EXEC), float32-exact
#   2 pfl_femnist bench_pfl.py --models femnist, the same workload, C=100, pfl-research on
#                the GPU (--tf32 off), process layouts $PFL_CONFIGS
#   3 tf32       fedjax-inv bench, MLP and ConvNet at C=1000, $TF32_IMPLS, --precision tf32
#                (the float32-exact rows are the side-by-side call's)
#   4 row        FedGMA's FedRotMNIST row with FedAvg (spec group `full`, 100 rounds, vmap),
#                seeds $SEEDS, under highest and under tf32, two processes sharing the GPU
# Every step runs under `timeout`, cut to what is left of BUDGET_S (default 230 s); a step
# with under 20 s left is skipped; STEPS (a comma list of the names above) runs only those;
# ROW_LIMIT is step 4's limit (default 150 s; its records are written as each seed ends).
# Outputs in OUT ($OUT or $1): env.txt, steps.log, pool_femnist.json, pfl_femnist.json,
# bench_tf32.json, rows.tgz (records + logs).
# Device call: run(command="EXEC=vmap+patches bash benchmarks/gpu/femnist_precision_call.sh",
#   carry=[".whl"], timeout_s=260)
# Ran on an H200 on 2026-11-28 (benchmarks/results_side_by_side_h200/): steps 1-3 took 75,
# 52 and 55 s; step 4 failed at once for want of mlxtend on the device image, which
# fetch_pfl_wheels.sh now fetches too. The row alone:
#   run(command="STEPS=row ROW_LIMIT=240 BUDGET_S=260 bash
#     benchmarks/gpu/femnist_precision_call.sh", carry=[".whl"], timeout_s=290)
# Dry run on a CPU:
#   DRY=1 PFL_PY=/tmp/pfl/bin/python bash benchmarks/gpu/femnist_precision_call.sh /tmp/fp
source "$(dirname "$0")/common.sh" "$@"
budget=${BUDGET_S:-230}
w=$(mktemp -d /tmp/fp.XXXXXX)
PFL_PY=${PFL_PY:-$PY}
EXEC=${EXEC:-vmap+patches}
SEEDS=${SEEDS:-0,1,2}
if [ "$DRY" = 1 ]; then
  dev=cpu; C=10; big=10; rounds=3; row_rounds=2; row_k=1; row_exec=scan; budget=${BUDGET_S:-900}
  cfgs=${PFL_CONFIGS:-1}; impls=${TF32_IMPLS:-vmap}
else
  dev=cuda; C=100; big=1000; rounds=8; row_rounds=100; row_k=20; row_exec=vmap
  cfgs=${PFL_CONFIGS:-1,2}; impls=${TF32_IMPLS:-vmap,chunked,vmap+patches}
fi
install_wheels "$w/pip.log"
{
  echo "date $(date -u +%FT%TZ) DRY=$DRY budget $budget s device $dev EXEC=$EXEC"\
       "pfl configs $cfgs tf32 impls $impls seeds $SEEDS"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -2
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
  "$PY" -c "import jax, platform; print('python', platform.python_version(), 'jax',
    jax.__version__, jax.devices())" 2>&1 | tail -1
  git log -1 --format='commit %H %s' 2>/dev/null; git status --short 2>/dev/null | head
} > "$dest/env.txt"
: > "$w/steps.log"

after_step() { cp "$w/steps.log" "$dest/steps.log"; }  # for common.sh's step

step femnist 120 "$PY" benchmarks/pool_femnist.py --layouts host_first,device --clients "$C" \
  --execution "$EXEC" --rounds "$rounds" --json "$dest/pool_femnist.json"
step pfl_femnist 70 "$PFL_PY" benchmarks/peers/bench_pfl.py --models femnist --device "$dev" \
  --tf32 off --femnist-cohort "$C" --configs "$cfgs" --rounds 3 --warmup 1 --budget-s 15 \
  --timeout-s 60 --logs "$w/pfl_workers" --json "$dest/pfl_femnist.json"
step tf32 60 "$PY" -m fedjax_inv.cli bench --workloads mlp,cnn --clients "$big" \
  --impls "$impls" --rounds 3 --precision tf32 --no-matmul-peak --json "$dest/bench_tf32.json"
# The row under both precisions: a copy of the spec with the precision (DRY: 2 rounds) in
# its base settings, beside the original so that its relative paths hold.
row() {
  local p
  for p in highest tf32; do
    sed -e "s/^base:$/base:\n  precision: $p/" \
        -e "s/config: {rounds: 100, last_k: 20, execution: scan}/config: {rounds: $row_rounds, last_k: $row_k, execution: $row_exec}/" \
        experiments/fedgma/spec.yaml > "experiments/fedgma/.precision_$p.yaml"
    "$PY" -m fedjax_inv.cli experiment "experiments/fedgma/.precision_$p.yaml" \
      --out "$w/row_$p" --where group=full --where row=fed_rotmnist --where method=fedavg \
      --seeds "$SEEDS" > "$w/row_$p.out" 2>&1 &
  done
  wait
  rm -f experiments/fedgma/.precision_highest.yaml experiments/fedgma/.precision_tf32.yaml
}
export -f row; export PY SEEDS row_rounds row_k row_exec w
step row "${ROW_LIMIT:-150}" bash -c row
rm -f experiments/fedgma/.precision_highest.yaml experiments/fedgma/.precision_tf32.yaml
echo "wall $(( $(date +%s) - start )) s" | tee -a "$w/steps.log" >> "$dest/env.txt"
cp "$w/steps.log" "$dest/steps.log"
tar czf "$dest/rows.tgz" -C "$w" . 2>/dev/null
cat "$dest/steps.log"
for f in "$dest"/*.json; do [ -f "$f" ] || continue; echo "== $f"; "$PY" - "$f" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"] if isinstance(d, dict) else d:
  print({k: r.get(k) for k in ("layout", "workload", "impl", "C", "processes", "round_s",
                               "client_updates_per_s", "first_round_at_s", "rss_peak_mb",
                               "device_peak_mb", "strategy", "precision") if k in r})
PY
done
tail -n 2 "$w"/row_*.out 2>/dev/null
