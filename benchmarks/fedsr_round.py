"""A RotatedMNIST FedSR round on the CPU before and after the ConvNet CPU work.

Runs FedSR (the ``fedsr_cpu`` row of ``experiments/fair.py``: RotatedMNIST with 0° held
out, 5 training clients, SGD-momentum lr 1e-3 kept across rounds, 5 local steps of 64,
α_L2R = 1e-2, α_CMI = 5e-4) for ``--rounds`` rounds in a fresh process per variant:

* ``before``: ``nnx.max_pool`` (``lax.reduce_window``) and no package XLA flags;
* ``pool``: ``fedjax_inv.models.pool.max_pool``, no package XLA flags;
* ``pool+flags``: the pooling and ``fedjax_inv.core.xla_cpu.FLAGS``.

Each child compiles the engine's round (``core.engine.build_round``, the strategy ``auto``
picks), runs one untimed round, then times ``--rounds`` rounds (training only: no
evaluation). The parent prints the speed-up over ``before`` and the largest difference of
the final parameters (float32 rounding and max-pool ties aside, the variants compute the
same function).

Usage:  python benchmarks/fedsr_round.py --rounds 10 --json benchmarks/results_fedsr_round.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

FIXED = dict(client_optimizer="momentum", client_lr=1e-3, weight_decay=5e-4, local_steps=5,
             batch_size=64, weighting="uniform", client_optimizer_state="persistent",
             alpha_l2r=1e-2, alpha_cmi=5e-4)
VARIANTS = {"before": ("nnx", "0"), "pool": ("ours", "0"), "pool+flags": ("ours", "1")}


def child(pool: str, rounds: int) -> dict:
  import jax
  import numpy as np
  from flax import nnx
  import fedjax_inv
  from fedjax_inv import models
  from fedjax_inv.core import xla_cpu
  from fedjax_inv.core import engine
  if pool == "nnx":
    models.max_pool = lambda x, w, strides=None, padding="VALID": nnx.max_pool(
        x, w, strides=strides, padding=padding)
  task = fedjax_inv.make_task("rotated_mnist", size="fedsr", holdout="0")
  alg = fedjax_inv.make_algorithm("fedsr", **task.algorithm_settings("fedsr", FIXED))
  model = alg.model_for(task.model)
  N = task.train.num_clients
  rf = engine.build_round(model, task.kind, alg, N, N, execution="auto")
  execution = rf.strategy
  state = engine.init_state(alg, model.init(0), N)
  compiled = rf.jitted.lower(*state, task.train, jax.random.key(0)).compile()
  key = jax.random.key(1)
  state = compiled(*state, task.train, key)[:2]  # one untimed round
  jax.block_until_ready(state)
  t0 = time.perf_counter()
  for r in range(rounds):
    state = compiled(*state, task.train, jax.random.fold_in(key, r))[:2]
  jax.block_until_ready(state)
  secs = time.perf_counter() - t0
  leaves = [np.asarray(l, np.float64).ravel() for l in jax.tree.leaves(state[0].params)]
  return dict(round_s=secs / rounds, execution=execution, clients=N,
              params=np.concatenate(leaves).tolist(), cpu_flags=xla_cpu.status()["added"])


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--rounds", type=int, default=10)
  p.add_argument("--json", help="also write the result here (atomically)")
  p.add_argument("--child", choices=("nnx", "ours"), help=argparse.SUPPRESS)
  a = p.parse_args(argv)
  if a.child:
    print(json.dumps(child(a.child, a.rounds)))
    return 0
  out = {}
  for name, (pool, flags) in VARIANTS.items():
    env = dict(os.environ, FEDJAX_INV_CPU_FLAGS=flags, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    r = subprocess.run([sys.executable, __file__, "--child", pool, "--rounds", str(a.rounds)],
                       env=env, capture_output=True, text=True)
    if r.returncode:
      sys.exit(f"{name} failed:\n{r.stderr[-2000:]}")
    out[name] = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"{name:11s} {out[name]['round_s']:.3f} s/round  flags {out[name]['cpu_flags']}",
          file=sys.stderr, flush=True)
  import numpy as np
  base = out["before"]
  scale = float(np.max(np.abs(base["params"])))
  for _name, r in out.items():
    r["speedup_vs_before"] = base["round_s"] / r["round_s"]
    r["max_param_diff_vs_before"] = float(np.max(np.abs(np.subtract(r["params"],
                                                                    base["params"]))))
    r["max_abs_param"] = scale
  for r in out.values():
    del r["params"]
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
  from benchmarks.harness import machine_info
  text = json.dumps(dict(rounds=a.rounds, variants=out,
                         meta=dict(machine_info(), command="python benchmarks/fedsr_round.py "
                                   + " ".join(argv if argv is not None else sys.argv[1:]))),
                    indent=1, default=str)
  print(text)
  if a.json:
    tmp = a.json + ".tmp"
    with open(tmp, "w") as f:
      f.write(text)
    os.replace(tmp, a.json)
  return 0


if __name__ == "__main__":
  sys.exit(main())
