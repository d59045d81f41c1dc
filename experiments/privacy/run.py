"""Privacy-utility table: client-level DP-FedAvg (fedjax_inv/privacy/client_dp.py) at
epsilon in {1, 2, 4, 8, inf} (delta 1e-5) for FedAvg, Invariant FedAvg and FedILC's Fishr
(Intra-Arith: Fishr+Inter-Geo's geometric mean is not a mean of the client updates, so DP
cannot cover it; it runs at epsilon = inf only), on 1,000 MNIST clients.

Task: the bundled MNIST sample (4,000 training images, 1,000 held-out test images), i.i.d.
over 1,000 clients of 4 images (seeded by the run's seed); MLP 784-32-10. Poisson client
sampling at q = 0.1 (100 expected clients per round), ROUNDS rounds, clip C = 0.5, sigma
solved for the target epsilon by the PLD accountant (``--dp-target-epsilon``). Every
method runs its registered defaults with the FedAvg recipe of METHODS (Invariant FedAvg's
warm-up is 50 rounds: its default, 100, is the whole run): nobody is tuned (one trial
each, the same budget).

Usage:  python experiments/privacy/run.py OUT [--rounds 100] [--seeds 0,1,2]
Each run writes OUT/raw/<method>/eps<e>-seed<s>.json (skipped when present), then
experiments/privacy/table.py OUT prints the table and writes the plot.
"""
from __future__ import annotations

import argparse
import math
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from fedjax_inv import Task, models  # noqa: E402
from fedjax_inv.runner import outputs, simulation  # noqa: E402
from fedjax_inv.privacy import client_dp as privacy  # noqa: E402
from fedjax_inv.algorithms import make_algorithm  # noqa: E402
from fedjax_inv.core.data import from_client_arrays  # noqa: E402
from fedjax_inv.data import sources  # noqa: E402

EPSILONS = (1.0, 2.0, 4.0, 8.0, math.inf)
METHODS = {  # label -> (registry name, settings)
    "fedavg": ("fedavg", dict(client_lr=0.1, local_steps=5, batch_size=4)),
    # IRMv1 penalty on after half the rounds (its default warm-up, 100, is the whole run)
    "inv_fedavg": ("inv_fedavg", dict(client_lr=0.1, local_steps=5, batch_size=4,
                                      warmup_rounds=50)),
    "fishr_intra_arith": ("fishr_intra_arith", {}),
    "fishr_inter_geo": ("fishr_inter_geo", {}),
}
NUM_CLIENTS, COHORT, CLIP, DELTA = 1000, 100, 0.5, 1e-5


def task(seed: int) -> Task:
  raw = sources.load_dataset("mnist")
  x = raw.x_train.reshape(len(raw.x_train), -1).astype(np.float32) / 255.0
  perm = np.random.default_rng(seed).permutation(len(x))
  parts = np.array_split(perm, NUM_CLIENTS)
  train = from_client_arrays([x[p] for p in parts], [raw.y_train[p].astype(np.int32)
                                                     for p in parts])
  xt = raw.x_test.reshape(len(raw.x_test), -1).astype(np.float32) / 255.0
  test = from_client_arrays([xt], [raw.y_test.astype(np.int32)])
  return Task("mnist_1000", "multiclass", train, {"test": test}, models.mlp(784, (32,), 10),
              {"data_note": "bundled MNIST sample, i.i.d. over 1,000 clients of 4 images"})


def one(out: pathlib.Path, label: str, eps: float, seed: int, rounds: int) -> None:
  path = out / "raw" / label / f"eps{eps:g}-seed{seed}.json"
  if path.exists():
    return
  name, settings = METHODS[label]
  alg = make_algorithm(name, **settings)
  if math.isfinite(eps):
    if alg.aggregator.name != "mean":
      return  # not coverable (see the module docstring)
    s = privacy.resolve(privacy.DPSettings(clip=CLIP, target_epsilon=eps, delta=DELTA,
                                           accountant="pld", sampling="poisson"),
                        NUM_CLIENTS, COHORT, rounds)
    alg = privacy.apply(alg, s, NUM_CLIENTS, COHORT)
  t0 = time.perf_counter()
  try:
    res = simulation.run(task(seed), alg, rounds=rounds, clients_per_round=COHORT,
                         seed=seed, eval_every=max(1, rounds // 10), progress=False,
                         reporting=None, execution="scan")
    rec = dict(status="ok", final=res.final, privacy=res.privacy, history=res.history)
  except simulation.DivergedError as e:
    rec = dict(status="diverged", final=None, privacy=None, history=e.history)
  rec.update(method=label, registry_name=name, epsilon_target=eps, seed=seed,
             rounds=rounds, hparams=alg.hparams, seconds=round(time.perf_counter() - t0, 1))
  outputs.write_json(path, rec)
  print(f"{label:18s} eps={eps:<4g} seed={seed}: "
        + ("diverged" if rec["final"] is None else
           f"train {rec['final']['train_accuracy']:.3f} test {rec['final']['test_accuracy']:.3f}")
        + f" ({rec['seconds']}s)", flush=True)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("out")
  p.add_argument("--rounds", type=int, default=100)
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--methods", default=",".join(METHODS))
  a = p.parse_args(argv)
  out = pathlib.Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / "command.txt").write_text(" ".join(sys.argv) + "\n")
  for label in a.methods.split(","):
    for eps in EPSILONS:
      for seed in (int(s) for s in a.seeds.split(",")):
        one(out, label, eps, seed, a.rounds)
  return 0


if __name__ == "__main__":
  sys.exit(main())
