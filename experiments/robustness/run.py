"""Robust aggregation under attack, and stragglers, on MNIST non-i.i.d.

Task: ``mnist_noniid`` (the bundled MNIST sample offline: 4,000 training images over 20
clients by a Dirichlet(0.5) label skew, 1,000 test images), an MLP 784-100-10 (the
Byzantine-robustness literature's MNIST model; the task's CNN would make the grid 10×
slower on this CPU). Every client takes part in every round (C = 20), 5 local SGD steps of
batch 32 at lr 0.1, ROUNDS rounds. Nobody is tuned: every aggregator and every
algorithm runs the same fixed settings (the same budget, zero).

Two grids, each run written to ``OUT/raw/<grid>/<name>.json`` (skipped when present):

* ``attacks``: attack ∈ {sign_flip, scale, gaussian, label_flip, alie, ipm} by
  FRACTIONS of the 20 clients (fixed per seed) × aggregator ∈ AGGREGATORS (Krum and
  bucketing tolerate f = 4 / 3); the 0% column once per aggregator.
* ``stragglers``: FedProx's systems-heterogeneity protocol (Li et al. 2020, §5.2): 20
  local steps, 0 / 50 / 90% stragglers running Uniform{1..19} of them, dropped (FedAvg's
  way) or kept; FedAvg, FedProx (μ = 0.1) and FedNova.

Usage:  python experiments/robustness/run.py OUT [--grid attacks|stragglers|all]
        [--rounds 40] [--seeds 0,1,2] [--fractions 0,0.2];
then    python experiments/robustness/run.py OUT --table   (markdown from the raw runs)

The tables are ``tables.py``'s (which also renders the README's generated blocks:
``python experiments/fair.py tables --only robustness``).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from fedjax_inv import models  # noqa: E402
from fedjax_inv.runner import outputs, simulation  # noqa: E402
from fedjax_inv.aggregation import robust  # noqa: E402
from fedjax_inv.algorithms import make_algorithm  # noqa: E402
from fedjax_inv.core.adversary import Attack, Participation  # noqa: E402
from fedjax_inv.tasks import make_task  # noqa: E402

ATTACKS = ("sign_flip", "scale", "gaussian", "label_flip", "alie", "ipm")
AGGREGATORS = {"mean": ("mean", None), "median": ("median", None),
               "trimmed_mean": ("trimmed_mean:beta=0.2", None), "krum": ("krum:f=4", None),
               "geomed": ("geomed", None), "centered_clip": ("centered_clip:tau=1,iters=3",
                                                             None),
               "bucketing2+krum": ("krum:f=3", 2)}
CLIENTS, LOCAL = 20, dict(client_lr=0.1, local_steps=5, batch_size=32)


def task(seed: int):
  t = make_task("mnist_noniid", seed=seed, num_clients=CLIENTS, partition="dirichlet",
                alpha=0.5)
  import dataclasses
  return dataclasses.replace(t, model=models.mlp(784, (100,), 10))


def one(grid: str, name: str, seed: int, rounds: int, alg, out: pathlib.Path, t) -> dict:
  path = out / "raw" / grid / f"{name}-seed{seed}.json"
  if path.exists():
    return json.loads(path.read_text())
  t0 = time.time()
  try:
    res = simulation.run(t, alg, rounds=rounds, seed=seed, eval_every=5, progress=False)
    hist = [{k: h[k] for k in ("round", "test_accuracy", "train_loss")} for h in res.history]
    rec = {"final_test_accuracy": res.final["test_accuracy"], "history": hist}
  except FloatingPointError as e:  # diverged: recorded, not dropped
    rec = {"final_test_accuracy": None, "diverged": str(e)}
  rec.update(grid=grid, name=name, seed=seed, rounds=rounds, hparams=alg.hparams,
             seconds=round(time.time() - t0, 1), command=" ".join(sys.argv),
             data_note=t.info.get("data_note"))
  outputs.write_json(path, rec)
  return rec


def attack_runs(a, out):
  for seed in a.seeds:
    t = task(seed)
    for agg_label, (spec, bucket) in AGGREGATORS.items():
      for frac in a.fractions:
        for attack in (ATTACKS if frac > 0 else (None,)):
          alg = robust.configure(make_algorithm("fedavg", aggregator=spec, **LOCAL),
                                 attack=None if attack is None else Attack(attack, frac),
                                 bucket=bucket, cohort=CLIENTS, num_classes=10)
          name = f"{agg_label}-{attack or 'none'}-{frac:g}"
          r = one("attacks", name, seed, a.rounds, alg, out, t)
          print(f"{name} seed {seed}: {r['final_test_accuracy']}", flush=True)


def straggler_runs(a, out):
  algs = {"fedavg": ("fedavg", {}), "fedprox": ("fedprox", dict(mu=0.1)),
          "fednova": ("fednova", {})}
  for seed in a.seeds:
    t = task(seed)
    for label, (reg, hp) in algs.items():
      for frac in (0.0, 0.5, 0.9):
        for mode in (("keep",) if frac == 0 else ("drop", "keep")):
          alg = make_algorithm(reg, **{**LOCAL, "local_steps": 20}, **hp)
          alg = robust.configure(alg, participation=Participation(
              stragglers=frac, straggler_mode=mode), cohort=CLIENTS)
          name = f"{label}-{frac:g}-{mode}"
          r = one("stragglers", name, seed, a.rounds, alg, out, t)
          print(f"{name} seed {seed}: {r['final_test_accuracy']}", flush=True)


def table(out: pathlib.Path) -> str:
  """Every results table of the raw runs under ``out`` (``tables.py``'s)."""
  import importlib.util
  spec = importlib.util.spec_from_file_location(
      "robustness_tables", pathlib.Path(__file__).resolve().parent / "tables.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.all_tables(pathlib.Path(out))


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("out")
  p.add_argument("--grid", default="all", choices=("attacks", "stragglers", "all"))
  p.add_argument("--rounds", type=int, default=40)
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--fractions", default="0,0.2")
  p.add_argument("--table", action="store_true")
  a = p.parse_args(argv)
  out = pathlib.Path(a.out)
  if a.table:
    print(table(out))
    return 0
  a.seeds = [int(s) for s in a.seeds.split(",")]
  a.fractions = [float(f) for f in a.fractions.split(",")]
  if a.grid in ("attacks", "all"):
    attack_runs(a, out)
  if a.grid in ("stragglers", "all"):
    straggler_runs(a, out)
  print(table(out))
  return 0


if __name__ == "__main__":
  sys.exit(main())
