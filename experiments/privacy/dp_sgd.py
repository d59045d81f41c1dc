"""Sample-level DP-SGD on the client (fedjax_inv/privacy/dp_sgd.py): FedAvg's
held-out accuracy against the per-example epsilon.

Task: the bundled MNIST sample (4,000 training images, 1,000 held-out test images), i.i.d.
over 10 clients of 400 images (seeded by the run's seed); MLP 784-32-10. Every client
takes part in every round and runs 1 local epoch of shuffled batches of 32 (13 steps) at
client lr 0.1; ROUNDS rounds. DP-SGD: per-example clip C = 1, noise multiplier sigma in
{0.6, 1, 2}; two baselines: no DP (no clipping, no noise) and the clip alone (sigma = 0);
epsilon at delta = 1e-5 per
example, from the RDP accountant with every round counted (``privacy.sample_level``).
Nothing is tuned: one configuration, the same for every sigma.

Usage:  python experiments/privacy/dp_sgd.py OUT [--rounds 30] [--seeds 0,1,2]
        python experiments/privacy/dp_sgd.py OUT --table
Each run writes OUT/raw/sigma<s>-seed<k>.json (skipped when present).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from fedjax_inv import Task, models  # noqa: E402
from fedjax_inv.privacy import dp_sgd  # noqa: E402
from fedjax_inv.runner import outputs, simulation  # noqa: E402
from fedjax_inv.algorithms import make_algorithm  # noqa: E402
from fedjax_inv.core.data import from_client_arrays  # noqa: E402
from fedjax_inv.data import sources  # noqa: E402

# (label, clip C, noise multiplier sigma): no DP, clipping alone (its cost without noise),
# then DP-SGD at three noise levels.
SETTINGS = (("no DP", None, 0.0), ("clip only", 1.0, 0.0), ("DP-SGD", 1.0, 0.6),
            ("DP-SGD", 1.0, 1.0), ("DP-SGD", 1.0, 2.0))
NUM_CLIENTS, DELTA = 10, 1e-5
RECIPE = dict(client_lr=0.1, batch_size=32, local_epochs=1)


def task(seed: int) -> Task:
  raw = sources.load_dataset("mnist")
  x = raw.x_train.reshape(len(raw.x_train), -1).astype(np.float32) / 255.0
  parts = np.array_split(np.random.default_rng(seed).permutation(len(x)), NUM_CLIENTS)
  train = from_client_arrays([x[p] for p in parts],
                             [raw.y_train[p].astype(np.int32) for p in parts])
  xt = raw.x_test.reshape(len(raw.x_test), -1).astype(np.float32) / 255.0
  test = from_client_arrays([xt], [raw.y_test.astype(np.int32)])
  return Task("mnist_10x400", "multiclass", train, {"test": test},
              models.mlp(784, (32,), 10),
              {"data_note": "bundled MNIST sample, i.i.d. over 10 clients of 400 images"})


def _name(clip, sigma) -> str:
  return "nodp" if clip is None else f"clip{clip:g}-sigma{sigma:g}"


def run_one(out: pathlib.Path, clip, sigma: float, seed: int, rounds: int) -> dict:
  path = out / "raw" / f"{_name(clip, sigma)}-seed{seed}.json"
  if path.is_file():
    return json.loads(path.read_text())
  alg = make_algorithm("fedavg", **RECIPE)
  if clip is not None:
    alg = dp_sgd.apply(alg, dp_sgd.DPSGDSettings(clip, sigma, DELTA))
  t0 = time.time()
  res = simulation.run(task(seed), alg, rounds=rounds, seed=seed, eval_every=rounds,
                       progress=False)
  rec = {"clip": clip, "sigma": sigma, "seed": seed, "rounds": rounds, "final": res.final,
         "privacy": res.privacy, "hparams": alg.hparams,
         "seconds": round(time.time() - t0, 1),
         "command": " ".join(sys.argv)}
  outputs.write_json(path, rec)
  return rec


def table(out: pathlib.Path) -> str:
  """The README's table (``tables.py``'s ``dp_sgd_table``, the one generator)."""
  import importlib.util
  spec = importlib.util.spec_from_file_location(
      "privacy_tables", pathlib.Path(__file__).resolve().parent / "tables.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.dp_sgd_table(out.resolve())


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("out")
  ap.add_argument("--rounds", type=int, default=30)
  ap.add_argument("--seeds", default="0,1,2")
  ap.add_argument("--table", action="store_true", help="print the table and exit")
  args = ap.parse_args(argv)
  out = pathlib.Path(args.out)
  if not args.table:
    for seed in (int(s) for s in args.seeds.split(",")):
      for _, clip, sigma in SETTINGS:
        r = run_one(out, clip, sigma, seed, args.rounds)
        print(f"{_name(clip, sigma)} seed {seed}: test {r['final']['test_accuracy']:.3f} "
              f"({r['seconds']} s)", flush=True)
  print(table(out))
  return 0


if __name__ == "__main__":
  sys.exit(main())
