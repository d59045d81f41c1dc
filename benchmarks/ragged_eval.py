"""Evaluation of a padded client pool: per-client padded blocks vs the packed real rows.
One process, interleaved repeats, medians; prints the ratio.

  python benchmarks/ragged_eval.py --clients 1000
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import jax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from fedjax_inv import eval as eval_lib  # noqa: E402
from fedjax_inv.tasks import make_task  # noqa: E402


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--clients", type=int, default=1000)
  p.add_argument("--repeats", type=int, default=3)
  a = p.parse_args(argv)
  task = make_task("femnist", source="synthetic", num_clients=a.clients)
  params = task.model.init(0)
  times = {"padded": [], "packed": []}
  sets = {"test": task.eval_sets["test"], "train_eval": task.train_for_eval()}
  for name, data in sets.items():
    print(f"{name}: {data.num_clients} clients, padding {eval_lib._padding(data):.2f}x")
  ev = eval_lib.build_evaluator(task.model, task.kind)  # both paths, compiled once each
  for r in range(a.repeats + 1):
    for mode in times:
      eval_lib.RAGGED_ABOVE = float("inf") if mode == "padded" else 1.5
      t = time.perf_counter()
      for data in sets.values():
        jax.block_until_ready(ev(params, data)["loss_sum"])
      if r:  # the first pass compiles
        times[mode].append(time.perf_counter() - t)
  med = {k: statistics.median(v) for k, v in times.items()}
  print(f"padded {med['padded']:.2f} s, packed {med['packed']:.2f} s: "
        f"{med['padded'] / med['packed']:.2f}x faster")
  return 0


if __name__ == "__main__":
  sys.exit(main())
