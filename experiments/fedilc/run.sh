#!/usr/bin/env bash
# FedILC Color-MNIST reproduction: one command per table row, then the table.
#   bash experiments/fedilc/run.sh                 # 6 rows x seeds 0 1 2, 301 rounds
#   SEEDS="0" bash experiments/fedilc/run.sh       # fewer seeds
# Results: experiments/fedilc/results/<row>.json and table.md (or $FEDILC_RESULTS).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
for m in fedsgd geometric fedcurv fishr_inter_geo fishr_intra_arith fishr_intra_geo; do
  $PY experiments/fedilc/run.py run --method "$m" --seeds ${SEEDS:-0 1 2}
done
$PY experiments/fedilc/run.py table
