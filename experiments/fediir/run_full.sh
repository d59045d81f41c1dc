#!/usr/bin/env bash
# FedIIR RotatedMNIST at the paper's protocol: DomainBed's RotatedMNIST (size='full': all
# images of the source, disjoint across the six domains 0..75 deg; real MNIST's 70,000 when
# $FEDJAX_INV_DATA_DIR / DATA_DIR holds the IDX files, else the bundled 5,000-image sample),
# leave-one-domain-out over all six domains, 100 rounds, 1 local epoch, SGD-momentum lr 1e-2,
# batch 64, gamma (code convention) 1e-2, EMA 0.95, seeds 0,1,2, a 4-layer 3x3 ConvNet
# (64,128,128,128) as the featurizer.
#
# Usage: experiments/fediir/run_full.sh OUT_DIR [ROW ...]       (ROW: c5 c50 gamma)
# Env:   SIZE=tiny (2 rounds, 60 images per domain, holdout 0, 1 seed: an
#        end-to-end check), SEEDS=0,1,2, HOLDOUTS=0,15,30,45,60,75, ROUNDS=100,
#        CHANNELS=64,128,128,128, DATA_DIR=<raw MNIST dir>, PYTHON=<interpreter>.
# Writes OUT_DIR/<row>.json, OUT_DIR/<row>.log and OUT_DIR/table.md.
set -euo pipefail
OUT=${1:?usage: run_full.sh OUT_DIR [ROW ...]}
shift
ROWS=("$@")
[ ${#ROWS[@]} -eq 0 ] && ROWS=(c50 c5 gamma)
cd "$(dirname "$0")/../.."
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python; fi
mkdir -p "$OUT"
if [ "${SIZE:-full}" = tiny ]; then
  ARGS=(--rounds 2 --eval-every 1 --n-per-domain 60 --holdouts 0 --seeds 0
        --num-clients 10 --sampled 5 --channels 8,16)
else
  ARGS=(--rounds "${ROUNDS:-100}" --eval-every 5 --seeds "${SEEDS:-0,1,2}"
        --holdouts "${HOLDOUTS:-0,15,30,45,60,75}" --channels "${CHANNELS:-64,128,128,128}")
fi
[ -n "${DATA_DIR:-}" ] && ARGS+=(--data-dir "$DATA_DIR")
for row in "${ROWS[@]}"; do
  "$PY" experiments/fediir/reproduce.py "$row" "${ARGS[@]}" --out "$OUT" 2>&1 \
    | grep -v -i "warning" | tee "$OUT/$row.log"
done
"$PY" experiments/fediir/reproduce.py table --out "$OUT" | tee "$OUT/table.md"
