#!/usr/bin/env bash
# One side-by-side table: fedjax_inv (`auto` and the per-client loop),
# pfl-research (2 worker processes x 1 torch thread) and Flower (Ray, 1 CPU per client),
# FedAvg on the MLP and the ConvNet, C = 10, 100, 1000, one after another on one machine.
# Needs the peers' environments: bash benchmarks/peers/setup_pfl.sh; bash
# benchmarks/peers/setup_flower.sh. Writes OUT/{ours,pfl,flower}.json and OUT/env.txt.
#   bash benchmarks/peers/side_by_side.sh OUT [CLIENTS]     (CLIENTS default 10,100,1000)
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: side_by_side.sh OUT [CLIENTS]}; cs=${2:-10,100,1000}
mkdir -p "$out"
{ date -u; uname -m; nproc; grep -m1 "model name" /proc/cpuinfo; uptime; } > "$out/env.txt"
.venv/bin/python -m fedjax_inv.cli bench --workloads mlp,cnn --clients "$cs" \
  --impls loop,auto --rounds 3 --max-impl-s 150 --no-matmul-peak --json "$out/ours.json"
benchmarks/peers/.venv-pfl/bin/python benchmarks/peers/bench_pfl.py --clients "$cs" \
  --models mlp,cnn --configs 2x1 --rounds 3 --warmup 1 --json "$out/pfl.json"
benchmarks/peers/.venv-flower/bin/python benchmarks/peers/bench_flower.py --clients "$cs" \
  --models mlp,cnn --client-cpus 1 --rounds 3 --warmup 1 --json "$out/flower.json"
uptime >> "$out/env.txt"
