"""A 100,000-client ragged pool: FedAvg and SCAFFOLD on the packed host pool, built and
trained in one process each, timed from the process's start.

Pool (``fedjax_inv.data.federated_synthetic.ragged_pool``): 100,000 clients of
MNIST-shaped 8-bit images, log-normal sizes of median 20 and mean 35 clipped to
1..2,000 (3.5 M images, 2.7 GB as 8-bit). As a padded float32 ``[N, n_max, 784]`` pool
it would take 628 GB. Model: the 784-128-10 MLP (101,770 parameters). Training: 5
rounds of 100 clients, 1 local epoch of batch 20 (each client its own
``ceil(n_i / 20)`` steps), client SGD lr 0.1; evaluation after round 5 on 100 training
clients. SCAFFOLD keeps a control variate per client that took part (0.4 MB each).

Reported per algorithm: ``build_s`` (generating the pool), ``total_s`` (process start to
the end of the run, imports, build, compile, rounds and evaluation included),
``round_s`` (median of rounds 2..5), ``rss_peak_mb`` (``ru_maxrss``) and the pool
record (cohort widths, clients with state and their memory).

Usage:
  python benchmarks/pool_scale.py --json benchmarks/results_pool_scale.json
  python benchmarks/pool_scale.py --clients 2000 --algorithms fedavg     (a quick look)
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time


def child(algorithm: str, clients: int, rounds: int, cohort: int, t0: float) -> dict:
  import resource
  import numpy as np
  from fedjax_inv import models
  from fedjax_inv.runner import simulation
  from fedjax_inv.algorithms import make_algorithm
  from fedjax_inv.data import federated_synthetic as syn
  from fedjax_inv.tasks import Task
  t = time.time()
  pool = syn.ragged_pool(clients, seed=0)
  build_s = time.time() - t
  sample = tuple(np.sort(np.random.default_rng(1).choice(clients, min(100, clients),
                                                         replace=False)).tolist())
  task = Task("ragged_pool", "multiclass", pool, {}, models.mlp(784, (128,), 10),
              {"data_note": "ragged_pool(seed=0)"}, train_eval=sample)
  alg = make_algorithm(algorithm, client_lr=0.1, local_epochs=1, batch_size=20)
  stamps = []
  res = simulation.run(task, alg, rounds=rounds, clients_per_round=cohort, seed=0,
                       eval_every=1, progress=False, reporting=None, pool="host",
                       execution="rule", callback=lambda e: stamps.append(time.time()))
  steps = [b - a for a, b in zip(stamps, stamps[1:])]
  return {"algorithm": algorithm, "clients": clients, "examples": pool.total,
          "packed_mb": round(pool.stored_bytes() / 2**20, 1),
          "padded_gb": round(pool.padded_bytes() / 2**30, 1), "rounds": rounds,
          "C": cohort, "strategy": res.strategy, "build_s": round(build_s, 2),
          "total_s": round(time.time() - t0, 2),
          "first_round_at_s": round(stamps[0] - t0, 2),
          "round_s": round(statistics.median(steps), 3) if steps else None,
          "rss_peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
          "pool": res.pool, "final": {k: res.final[k] for k in
                                       ("train_objective", "train_accuracy")}}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--clients", type=int, default=100_000)
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--cohort", type=int, default=100)
  p.add_argument("--algorithms", default="fedavg,scaffold")
  p.add_argument("--json", default=None, help="write the rows here (atomically)")
  p.add_argument("--child", default=None, help=argparse.SUPPRESS)
  p.add_argument("--t0", type=float, default=None, help=argparse.SUPPRESS)
  a = p.parse_args(argv)
  if a.child:
    print("ROW " + json.dumps(child(a.child, a.clients, a.rounds, a.cohort, a.t0)),
          flush=True)
    return 0
  rows = []
  for alg in a.algorithms.split(","):
    cmd = [sys.executable, __file__, "--child", alg, "--clients", str(a.clients),
           "--rounds", str(a.rounds), "--cohort", str(a.cohort), "--t0", repr(time.time())]
    out = subprocess.run(cmd, capture_output=True, text=True)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("ROW ")]
    if out.returncode or not line:
      print(out.stdout[-2000:], out.stderr[-4000:], file=sys.stderr)
      raise SystemExit(f"{alg}: failed (exit {out.returncode})")
    r = json.loads(line[0][4:])
    rows.append(r)
    print(f"{alg:9s} {r['clients']} clients, {r['examples']} images: build "
          f"{r['build_s']:.1f} s, total {r['total_s']:.1f} s, {r['round_s']} s/round, "
          f"RSS {r['rss_peak_mb']:.0f} MB, state {r['pool']['client_state_mb']} MB", flush=True)
  meta = {"machine": {"cpu": platform.processor() or platform.machine(),
                      "cores": os.cpu_count(), "python": platform.python_version()},
          "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv)}
  if a.json:
    path = pathlib.Path(a.json)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    os.replace(tmp, path)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
