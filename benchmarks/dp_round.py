"""A DP-FedAvg round against a plain round, interleaved in one process (the
performance target: a DP round <= 1.15x a plain round at C = 1,000 on this CPU).

The bench workload ``mlp_fedavg`` (MLP 784-128-10, 64 MNIST-shaped synthetic examples per
client, 5 local SGD steps of batch 32; uniform client weights on both sides) at C clients
per round out of N = C (fixed) or q = C/N of N = 2C (Poisson), ``auto`` (= ``scan`` on one
CPU). Variants: ``plain``; ``dp_fixed`` (clip 1, sigma 1, fixed cohort); ``dp_poisson``
(the same with Poisson sampling: a padded buffer of ``poisson_slots`` slots). Each is
compiled, then timed ``--repeats`` times x ``--rounds`` rounds, interleaved
(plain, dp_fixed, dp_poisson, plain, ...); medians are compared.

  python benchmarks/dp_round.py --clients 1000 --json benchmarks/results_dp_round.json
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import jax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.workloads import LOCAL, synthetic_pool  # noqa: E402
from fedjax_inv import models  # noqa: E402
from fedjax_inv.runner import outputs  # noqa: E402
from fedjax_inv.privacy import client_dp as privacy  # noqa: E402
from fedjax_inv.algorithms import make_algorithm  # noqa: E402
from fedjax_inv.core import strategy  # noqa: E402
from fedjax_inv.core.engine import build_round, init_state  # noqa: E402


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--clients", type=int, default=1000)
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--json", default=None)
  a = p.parse_args(argv)
  C = a.clients
  model = models.mlp(784, (128,), 10)
  plain = make_algorithm("fedavg", weighting="uniform", **LOCAL)
  variants = {}
  for name, sampling, n in (("plain", None, C), ("dp_fixed", "fixed", C),
                            ("dp_poisson", "poisson", 2 * C)):
    alg = plain if sampling is None else privacy.apply(
        plain, privacy.DPSettings(clip=1.0, noise_multiplier=1.0, sampling=sampling).check(),
        n, C)
    data = synthetic_pool(n)
    rf = build_round(model, "multiclass", alg, n, C, execution="auto")
    state = init_state(alg, model.init(0), n)
    st = rf(*state, data, jax.random.key(0))[:2]  # compiles
    jax.block_until_ready(st)
    variants[name] = dict(fn=rf, state=st, data=data, times=[], slots=(
        strategy.poisson_slots(n, C) if sampling == "poisson" else C))
  for _ in range(a.repeats):
    for v in variants.values():
      st = v["state"]
      t = time.perf_counter()
      for _ in range(a.rounds):
        st = v["fn"](*st, v["data"], jax.random.key(1))[:2]
      jax.block_until_ready(st)
      v["times"].append((time.perf_counter() - t) / a.rounds)
      v["state"] = st
  base = statistics.median(variants["plain"]["times"])
  rows = {k: {"median_s_per_round": statistics.median(v["times"]),
              "ratio_to_plain": statistics.median(v["times"]) / base,
              "client_slots": v["slots"], "times": v["times"]} for k, v in variants.items()}
  for k, r in rows.items():
    print(f"{k:11s} {r['median_s_per_round']:.4f} s/round  x{r['ratio_to_plain']:.3f} plain  "
          f"({r['client_slots']} client slots)")
  if a.json:
    from fedjax_inv.runner.experiment import provenance
    outputs.write_json(a.json, {"clients_per_round": C, "rounds": a.rounds,
                                "repeats": a.repeats, "strategy": variants["plain"]["fn"].strategy,
                                "rows": rows, "machine": provenance(),
                                "command": " ".join(sys.argv)})
  return 0


if __name__ == "__main__":
  sys.exit(main())
