"""fedjax_inv `auto` and pfl-research on the ConvNet, alternated (the ConvNet speed target).

This 2-core workplace shares its host: the same round was measured 10-20 % slower or
faster from one quarter hour to the next (RESULTS.md, "ConvNets on CPU, third pass"). One system
after the other, as ``side_by_side.sh`` runs them, then folds that drift into the ratio.
This script alternates short runs of the two (ours, pfl, ours, pfl, ...) at one cohort
size. It reports each adjacent pair's ratio of client updates per second and the median
over pairs. Every run's JSON is kept in OUT.

Usage (after ``bash benchmarks/peers/setup_pfl.sh``):
  python benchmarks/peers/interleaved.py OUT --clients 100 --pairs 3 [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _ups(path: pathlib.Path) -> float:
  """Client updates per second of the one ConvNet row in a bench / bench_pfl JSON."""
  rows = [r for r in json.loads(path.read_text())["rows"]
          if r.get("workload") == "cnn_fedavg" and r.get("client_updates_per_s")]
  if len(rows) != 1:
    raise ValueError(f"{path}: expected one timed cnn_fedavg row, found {len(rows)}.")
  return float(rows[0]["client_updates_per_s"])


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("out")
  p.add_argument("--clients", type=int, default=100)
  p.add_argument("--pairs", type=int, default=3)
  p.add_argument("--rounds", type=int, default=3)
  a = p.parse_args(argv)
  out = pathlib.Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  pfl_py = ROOT / "benchmarks/peers/.venv-pfl/bin/python"
  if not pfl_py.exists():
    print(f"{pfl_py} is missing: run bash benchmarks/peers/setup_pfl.sh first.",
          file=sys.stderr)
    return 2
  c, r = str(a.clients), str(a.rounds)
  cmds = {
      "ours": [sys.executable, "-m", "fedjax_inv.cli", "bench", "--workloads", "cnn",
               "--clients", c, "--impls", "auto", "--rounds", r, "--max-impl-s", "2000",
               "--no-matmul-peak", "--json"],
      "pfl": [str(pfl_py), "benchmarks/peers/bench_pfl.py", "--clients", c, "--models",
              "cnn", "--configs", "2x1", "--rounds", r, "--warmup", "1", "--json"]}
  pairs = []
  for i in range(a.pairs):
    ups = {}
    for name, cmd in cmds.items():
      f = out / f"{name}_C{c}_{i}.json"
      subprocess.run(cmd + [str(f)], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
      ups[name] = _ups(f)
    pairs.append(dict(pair=i, ours=ups["ours"], pfl=ups["pfl"],
                      ratio=ups["ours"] / ups["pfl"]))
    print(f"pair {i}: ours {ups['ours']:.2f} upd/s, pfl {ups['pfl']:.2f} upd/s, "
          f"ratio {ups['ours'] / ups['pfl']:.3f}", flush=True)
  med = statistics.median(q["ratio"] for q in pairs)
  print(f"C={c}: median ratio over {len(pairs)} pairs {med:.3f}")
  sys.path.insert(0, str(ROOT))
  from fedjax_inv import outputs  # atomic write
  outputs.write_json(out / f"pairs_C{c}.json", dict(
      clients=a.clients, rounds=a.rounds, pairs=pairs, median_ratio=med))
  return 0


if __name__ == "__main__":
  sys.exit(main())
