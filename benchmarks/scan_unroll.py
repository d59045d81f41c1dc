"""One cell of the `SCAN_UNROLL` sweep in RESULTS.md: MLP FedAvg round time, one process.

Usage (one process per cell, as measured):
  for C in 10 100 1000; do for m in loop scan1 scan2 scan4; do
    .venv/bin/python benchmarks/scan_unroll.py $m $C 7; done; done

``mode`` is ``loop`` (``fedjax_inv.benchmarks.loop_round.LoopRound``) or ``scan<u>``
(``build_round(execution='scan', unroll=u)``). Prints the median and min of ``reps`` rounds
after one warm-up round (``time.perf_counter`` + ``jax.block_until_ready``).
"""
import statistics
import sys
import time

import jax

from fedjax_inv import models
from fedjax_inv.benchmarks.loop_round import LoopRound
from fedjax_inv.benchmarks.workloads import synthetic_pool
from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.core import engine


def main(mode: str, C: int, reps: int) -> None:
  """Prints the median and min round seconds of ``mode`` at cohort ``C`` over ``reps``
  rounds. ValueError: a ``mode`` other than ``loop`` or ``scan<unroll>``."""
  model = models.mlp(784, (128,), 10)
  alg = make_algorithm("fedavg", client_lr=0.1, local_steps=5, batch_size=32)
  data = synthetic_pool(C)
  key = jax.random.key(0)
  server, cs = engine.init_state(alg, model.init(0), C)
  if mode == "loop":
    rf = LoopRound(model, "multiclass", alg, C, C)
    rf.compile(server, cs, data, key)
    call = lambda: rf(server, cs, data, key)  # noqa: E731
  elif mode.startswith("scan"):
    rf = engine.build_round(model, "multiclass", alg, C, C, execution="scan",
                            unroll=int(mode[4:]))
    compiled = rf.jitted.lower(server, cs, data, key).compile()
    call = lambda: compiled(server, cs, data, key)  # noqa: E731
  else:
    raise ValueError(f"mode={mode!r}; use 'loop' or 'scan<unroll>', e.g. scan4.")
  jax.block_until_ready(call())
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(call())
    times.append(time.perf_counter() - t0)
  print(f"C={C} {mode:8s} median {statistics.median(times):.4f} min {min(times):.4f}")


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 7)
