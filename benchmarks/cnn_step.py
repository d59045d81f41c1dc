"""One client's local update of the ConvNet, timed per variant.

Times 5 SGD steps (batch 32, lr 0.1) of ``models.cnn(1)`` (56,394 parameters) on one
client's 64 MNIST-shaped examples inside ``lax.scan``: the unit of work of ``cnn_fedavg``
in ``benchmarks/workloads.py``. Variants alternate in one process (A, B, A, B, ...) so that
load on the machine hits each alike; the median of each is reported with the ratio to the
first. XLA flags apply per process, so ``--xla-flags`` runs a child per flag setting.

Usage:
  python benchmarks/cnn_step.py                         # pooling: nnx.max_pool vs ours
  python benchmarks/cnn_step.py --xla-flags "" "--xla_cpu_experimental_ynn_fusion_type="
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def _time_pools(repeats: int) -> dict:
  import jax
  import optax
  from flax import nnx

  from fedjax_inv import models
  from fedjax_inv.models import pool

  x = jax.random.uniform(jax.random.key(0), (64, 28, 28, 1))
  y = jax.random.randint(jax.random.key(1), (64,), 0, 10)
  variants = {"nnx.max_pool": lambda x, w, strides: nnx.max_pool(x, w, strides=strides),
              "models.pool.max_pool": pool.max_pool}
  fns = {}
  for name, fn in variants.items():
    models.max_pool = fn  # the CNN's pooling layer looks the name up at trace time
    m = models.cnn(1)
    params = m.init(jax.random.key(2))
    opt = optax.sgd(0.1)

    def step(carry, idx, m=m):
      p, s = carry
      def loss(p):
        logits = m.apply(p, x[idx])
        return optax.softmax_cross_entropy_with_integer_labels(logits, y[idx]).mean()
      g = jax.grad(loss)(p)
      u, s = opt.update(g, s, p)
      return (optax.apply_updates(p, u), s), None

    idx = jax.random.randint(jax.random.key(3), (5, 32), 0, 64)
    f = jax.jit(lambda p, idx=idx, step=step: jax.lax.scan(step, (p, opt.init(p)), idx)[0][0])
    jax.block_until_ready(f(params))
    fns[name] = (f, params)
  models.max_pool = pool.max_pool
  times = {k: [] for k in fns}
  for _ in range(repeats):
    for k, (f, p) in fns.items():
      t = time.perf_counter()
      jax.block_until_ready(f(p))
      times[k].append(time.perf_counter() - t)
  first = statistics.median(next(iter(times.values())))
  return {k: dict(ms=1e3 * statistics.median(v), ratio_vs_first=first / statistics.median(v))
          for k, v in times.items()}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--repeats", type=int, default=30)
  p.add_argument("--xla-flags", nargs="*", default=None,
                 help="time each XLA_FLAGS setting in its own process (ours pooling)")
  a = p.parse_args(argv)
  if a.xla_flags is None:
    print(json.dumps(dict(jax_platforms="cpu", **_time_pools(a.repeats)), indent=1))
    return 0
  rows = {}
  for flags in a.xla_flags:
    env = dict(os.environ, XLA_FLAGS=flags)
    out = subprocess.run([sys.executable, __file__, "--repeats", str(a.repeats)], env=env,
                         capture_output=True, text=True, check=True).stdout
    rows[flags or "(none)"] = json.loads(out)
  print(json.dumps(rows, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
