#!/usr/bin/env bash
# FedSR Table 1 on the CPU, resumable: the protocol of run_full.sh (paper settings: 500
# rounds, lr 1e-3, momentum 0.9 kept across rounds, wd 5e-4, E = 5 steps of 64, uniform
# mean, 3 seeds), one `fedjax-inv run --holdout D` per (algorithm, held-out domain), each
# into its own folder OUT/<alg>/h<D>/. A folder that already holds summary.json is
# skipped, and a domain killed mid-way continues with `fedjax-inv run --resume` (its finished
# seeds kept, the current one from its last checkpoint: CHECKPOINT_EVERY=25 rounds by
# default), so a killed job continues where it stopped. Table:
#   python experiments/fedsr/table.py OUT          (reads OUT/<alg>/h*/summary.json too)
# Usage:  experiments/fedsr/run_cpu.sh OUT [ALG ...]   (default ALGS: fedavg fedsr)
# Environment: as run_full.sh (ROUNDS, LR, WD, SEEDS, EVAL_EVERY, ALPHA_L2R, ALPHA_CMI,
#   MOMENTUM, PY), and DOMAINS="0 75 15 30 45 60" (the order they run in).
set -euo pipefail
OUT=${1:?usage: run_cpu.sh OUT [ALG ...]}
shift
ALGS=${*:-fedavg fedsr}
cd "$(dirname "$0")/../.."
DOMAINS=${DOMAINS:-"0 75 15 30 45 60"}
for d in $DOMAINS; do
  for alg in $ALGS; do
    dir="$OUT/$alg/h$d"
    if [ -f "$dir/summary.json" ]; then
      echo "skip $dir (done)"; continue
    fi
    if [ -f "$dir.tmp/$alg/config.json" ]; then  # an earlier attempt: resume it
      echo "resume $dir"
      "${PY:-.venv/bin/python}" -m fedjax_inv.cli run --resume "$dir.tmp/$alg" \
        >> "$dir.tmp/$alg.log" 2>&1 || true
    else
      CHECKPOINT_EVERY=${CHECKPOINT_EVERY:-25} ALGS=$alg HOLDOUT=$d \
        experiments/fedsr/run_full.sh "$dir.tmp" > /dev/null 2>&1 || true
    fi
    if [ -f "$dir.tmp/$alg/summary.json" ]; then
      mkdir -p "$(dirname "$dir")"
      mv "$dir.tmp/$alg" "$dir" && mv "$dir.tmp/$alg.log" "$dir/run.log" && rm -rf "$dir.tmp"
      echo "done $dir"
    else
      echo "FAILED $dir (log: $dir.tmp/$alg.log)"; exit 1
    fi
  done
done
