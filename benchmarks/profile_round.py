"""Per-op profile of one benchmark round: the top XLA ops by time.

Builds the round of a ``benchmarks/workloads.py`` workload (default ``cnn_fedavg``: FedAvg,
``models.cnn(1)``, 64 examples per client, 5 local SGD steps of 32) at cohort ``C``
(default 100) for one strategy, compiles it, runs a warm-up round, then traces ``--rounds``
rounds with ``jax.profiler.trace`` and sums the trace events by name and by kind (the
name without its ``.N`` suffix)
(``jax.profiler.ProfileData``; on XLA:CPU an event is one thunk: a fusion, a convolution, a
custom call, a copy, ...). Prints the top ops with their share of the traced time.

Usage (one line):
  python benchmarks/profile_round.py --workload cnn --clients 100 --strategy scan --top 25
"""
from __future__ import annotations

import argparse
import collections
import glob
import os
import pathlib
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--workload", default="cnn",
                 help="harness workload (cnn, mlp, mlp_fishr_inter_geo, ...)")
  p.add_argument("--clients", type=int, default=100)
  p.add_argument("--strategy", default="scan", choices=("vmap", "scan", "chunked"))
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument("--top", type=int, default=25)
  a = p.parse_args(argv)
  sys.path.insert(0, str(HERE.parent))
  import jax
  from jax.profiler import ProfileData

  from benchmarks import harness
  from fedjax_inv.core import engine

  (w,) = harness.workloads([a.workload])
  algorithm, _ = w.make_algorithm()
  model = algorithm.model_for(w.make_model())
  C = a.clients
  data = harness.synthetic_pool(C)
  server, cstates = engine.init_state(algorithm, model.init(0), C)
  key = jax.random.key(0)
  rf = engine.build_round(model, "multiclass", algorithm, C, C, execution=a.strategy)
  compiled = rf.jitted.lower(server, cstates, data, key).compile()
  state = compiled(server, cstates, data, key)[:2]
  jax.block_until_ready(state)
  with tempfile.TemporaryDirectory() as d:
    t0 = time.perf_counter()
    with jax.profiler.trace(d):
      for _ in range(a.rounds):
        state = compiled(*state, data, key)[:2]
      jax.block_until_ready(state)
    wall = time.perf_counter() - t0
    (path,) = glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True)
    prof = ProfileData.from_file(path)
  totals: dict = collections.Counter()
  counts: dict = collections.Counter()
  for plane in prof.planes:
    if not plane.name.startswith("/host:CPU") and not plane.name.startswith("/device:"):
      continue
    for line in plane.lines:
      if line.name in ("Python", "python"):  # Python-level trace annotations
        continue
      for ev in line.events:
        totals[ev.name] += ev.duration_ns
        counts[ev.name] += 1
  # Outermost events (the executable, the program run) contain the ops: drop any event
  # whose total reaches the whole traced time, so the table lists the ops themselves.
  whole = max(totals.values()) if totals else 0
  ops = [(n, t) for n, t in totals.items() if t < 0.5 * whole]
  op_total = sum(t for _, t in ops)
  print(f"{w.name} C={C} {a.strategy}: {a.rounds} traced rounds, wall {wall:.3f} s "
        f"({wall / a.rounds:.3f} s/round); JAX {jax.__version__}, {jax.devices()[0]}")
  kinds: dict = collections.Counter()
  for n, t in ops:
    base, _, suffix = n.rpartition(".")
    kinds[base if suffix.isdigit() and base else n] += t
  print(f"{'op kind':60s} {'':>7s} {'ms/round':>9s} {'share':>6s}")
  for name, t in kinds.most_common(12):
    print(f"{name[:60]:60s} {'':>7s} {t / 1e6 / a.rounds:>9.2f} "
          f"{100.0 * t / max(op_total, 1):>5.1f}%")
  print()
  print(f"{'op':60s} {'calls':>7s} {'ms/round':>9s} {'share':>6s}")
  for name, t in sorted(ops, key=lambda x: -x[1])[:a.top]:
    print(f"{name[:60]:60s} {counts[name] // a.rounds:>7d} {t / 1e6 / a.rounds:>9.2f} "
          f"{100.0 * t / max(op_total, 1):>5.1f}%")
  return 0


if __name__ == "__main__":
  sys.exit(main())
