r"""Clients of very different sizes: the cost of padding on a FEMNIST-shaped pool.

Part ``cohort`` — one 10-client FEMNIST cohort (the synthetic pool's first draw, sizes
after TFF's totals and LEAF's spread), its data padded to the pool's largest client as
the engine stores it, 1 local epoch of batch 20 (Reddi et al.'s EMNIST protocol), timed
``--repeats`` times interleaved, medians compared:

* ``padded`` (before): every client runs the steps of the largest client,
  ``local_steps = ceil(n_max / 20)`` — the only way to run epochs before
  ``Algorithm.local_epochs``;
* ``epochs`` (after): ``local_epochs=1``, each client its own ``ceil(n_i / 20)`` steps;
* ``unpadded`` (the target's reference): the same cohort's real work at the per-step cost
  of a fixed-step round, ``sum_i ceil(n_i / 20) * t_step`` (``t_step`` measured on the
  same 10 clients running equal fixed steps, so no step is padded).

Part ``pool`` — rounds per second on the whole pool (``--clients`` writers, default the
real 3,400) at 10, 50 and 500 clients per round, ``local_epochs=1``, ``auto``.

  python benchmarks/federated_padding.py --part cohort \
    --json benchmarks/results_federated_padding.json
  python benchmarks/federated_padding.py --part pool --json benchmarks/results_federated_pool.json
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import jax
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from fedjax_inv.runner import outputs  # noqa: E402
from fedjax_inv.algorithms import make_algorithm  # noqa: E402
from fedjax_inv.core.data import from_client_arrays, padding_overhead  # noqa: E402
from fedjax_inv.core.engine import build_round, init_state  # noqa: E402
from fedjax_inv.data import federated_synthetic as syn  # noqa: E402
from fedjax_inv.models.federated import femnist_cnn  # noqa: E402

B = 20
ALG = dict(client_lr=0.1, batch_size=B, weighting="num_examples")


def _time(variants: dict, repeats: int, rounds: int) -> None:
  """Compiles each variant, then times ``rounds`` rounds ``repeats`` times, interleaved."""
  for v in variants.values():
    v["state"] = v["fn"](*v["state"], v["data"], jax.random.key(0))[:2]
    jax.block_until_ready(v["state"])
    v["times"] = []
  for _ in range(repeats):
    for v in variants.values():
      st, t = v["state"], time.perf_counter()
      for _ in range(rounds):
        st = v["fn"](*st, v["data"], jax.random.key(1))[:2]
      jax.block_until_ready(st)
      v["times"].append((time.perf_counter() - t) / rounds)
      v["state"] = st


def cohort_part(a) -> dict:
  d = syn.femnist(a.clients, seed=0)["train"]
  ids = sorted(d)
  n_max = max(len(d[c][1]) for c in ids)
  rng = np.random.default_rng(a.seed)
  pick = [ids[i] for i in sorted(rng.choice(len(ids), 10, replace=False))]
  xs = [d[c][0].reshape(-1, 28, 28, 1) for c in pick]
  data = from_client_arrays(xs, [d[c][1] for c in pick], n_max=n_max)
  sizes = [len(d[c][1]) for c in pick]
  steps = [-(-n // B) for n in sizes]
  k_eq = max(1, round(float(np.mean(steps))))
  model = femnist_cnn(62)
  algs = {"padded": make_algorithm("fedavg", local_steps=-(-n_max // B), **ALG),
          "epochs": make_algorithm("fedavg", local_epochs=1, **ALG),
          "equal_steps": make_algorithm("fedavg", local_steps=k_eq, **ALG)}
  variants = {}
  for name, alg in algs.items():
    fn = build_round(model, "multiclass", alg, 10, 10, execution=a.execution)
    variants[name] = dict(fn=fn, data=data, state=init_state(alg, model.init(0), 10))
  _time(variants, a.repeats, a.rounds)
  med = {k: statistics.median(v["times"]) for k, v in variants.items()}
  t_step = med["equal_steps"] / (10 * k_eq)
  unpadded = t_step * sum(steps)
  out = {"sizes": sizes, "steps": steps, "n_max": n_max, "k_equal": k_eq,
         "t_step_s": t_step, "unpadded_s": unpadded,
         "strategy": variants["epochs"]["fn"].strategy,
         "median_s_per_round": med, "times": {k: v["times"] for k, v in variants.items()},
         "ratio_to_unpadded": {k: med[k] / unpadded for k in ("padded", "epochs")},
         "padding_overhead": {
             "padded": padding_overhead(data, algs["padded"], 10, "vmap"),
             "epochs": padding_overhead(data, algs["epochs"], 10,
                                        variants["epochs"]["fn"].strategy)}}
  print(f"cohort sizes {sizes} (n_max {n_max}), steps {steps} = {sum(steps)} "
        f"({out['strategy']})")
  for k in ("padded", "epochs"):
    print(f"  {k:8s} {med[k]:.3f} s/round  {out['ratio_to_unpadded'][k]:.2f}x unpadded "
          f"({unpadded:.3f} s = {sum(steps)} steps x {t_step * 1e3:.1f} ms)")
  return out


def pool_part(a) -> dict:
  from fedjax_inv.tasks import make_task
  t0 = time.perf_counter()
  task = make_task("femnist", source="synthetic", num_clients=a.clients, seed=0)
  build_s = time.perf_counter() - t0
  model, N = task.model, task.train.num_clients
  alg = make_algorithm("fedavg", local_epochs=1, **ALG)
  rows = {}
  for C in a.cohorts:
    fn = build_round(model, "multiclass", alg, N, C, execution=a.execution)
    v = {"x": dict(fn=fn, data=task.train, state=init_state(alg, model.init(0), N))}
    _time(v, a.repeats, a.rounds)
    s = statistics.median(v["x"]["times"])
    rows[str(C)] = {"median_s_per_round": s, "rounds_per_s": 1.0 / s, "strategy": fn.strategy,
                    "times": v["x"]["times"],
                    "padding_overhead": padding_overhead(task.train, alg, C, fn.strategy,
                                                         getattr(fn, "chunk_size", None))}
    print(f"  C={C:4d}: {s:.3f} s/round = {1 / s:.3f} rounds/s ({fn.strategy}); padding "
          f"{rows[str(C)]['padding_overhead']}")
  return {"num_clients": N, "n_max": task.train.n_max, "build_s": build_s,
          "client_sizes": task.info["client_sizes"], "rows": rows}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--part", choices=("cohort", "pool"), default="cohort")
  p.add_argument("--clients", type=int, default=syn.FEMNIST_CLIENTS)
  p.add_argument("--cohorts", type=int, nargs="+", default=[10, 50, 500])
  p.add_argument("--execution", default="auto")
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--json", default=None)
  a = p.parse_args(argv)
  out = cohort_part(a) if a.part == "cohort" else pool_part(a)
  if a.json:
    from fedjax_inv.runner.experiment import provenance
    outputs.write_json(a.json, {**out, "part": a.part, "rounds": a.rounds,
                                "repeats": a.repeats, "machine": provenance(),
                                "command": " ".join(sys.argv)})
  return 0


if __name__ == "__main__":
  sys.exit(main())
