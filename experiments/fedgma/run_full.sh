#!/usr/bin/env bash
# FedGMA Tables 1-2 (the offline rows) at the paper's size: all training images of the data
# source (real MNIST when $FEDJAX_INV_DATA_DIR / DATA_DIR holds the IDX files, else the
# bundled 5,000-image sample), 10 clients, 100 rounds evaluated every round, FedGMA's metric
# = mean accuracy over the last 20 rounds, seeds 0,1,2; FedAvg, FedGMA, FedProx, FedGMA+FedProx.
#
# Usage: experiments/fedgma/run_full.sh OUT_DIR [ROW ...]      (ROW: mnist fed_cmnist fed_rotmnist)
# Env:   SIZE=tiny (2 rounds on 200 images, 1 seed: an end-to-end check), SEEDS=0,1,2,
#        ROUNDS=100, DATA_DIR=<raw MNIST dir>, PYTHON=<interpreter>.
# Writes OUT_DIR/<row>.json, OUT_DIR/<row>.log and OUT_DIR/table.md.
set -euo pipefail
OUT=${1:?usage: run_full.sh OUT_DIR [ROW ...]}
shift
ROWS=("$@")
[ ${#ROWS[@]} -eq 0 ] && ROWS=(fed_cmnist mnist fed_rotmnist)
cd "$(dirname "$0")/../.."
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python; fi
mkdir -p "$OUT"
if [ "${SIZE:-full}" = tiny ]; then
  ARGS=(--rounds 2 --last 2 --n-train 200 --n-test 50 --seeds 0)
else
  ARGS=(--rounds "${ROUNDS:-100}" --last 20 --seeds "${SEEDS:-0,1,2}")
fi
[ -n "${DATA_DIR:-}" ] && ARGS+=(--data-dir "$DATA_DIR")
for row in "${ROWS[@]}"; do
  "$PY" experiments/fedgma/reproduce.py "$row" "${ARGS[@]}" --out "$OUT" 2>&1 \
    | grep -v -i "warning" | tee "$OUT/$row.log"
done
"$PY" experiments/fedgma/reproduce.py table --out "$OUT" | tee "$OUT/table.md"
