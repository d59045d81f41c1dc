"""Tables of the default run, `fedjax-inv run` with no arguments (README's first command),
generated from its committed output folder ``run/`` (``summary.json``: one record per
algorithm and seed, with the final-round metrics and the settings used).

* ``default``: train and OOD accuracy per algorithm, mean ± sample std over the seeds
  (``fedjax_inv.runner.outputs.format_mean_std``), with each method's settings and where they
  came from.
* ``seeds``: the OOD accuracy of every seed.
"""
from __future__ import annotations

import json
import pathlib

from fedjax_inv.runner import outputs

HERE = pathlib.Path(__file__).resolve().parent
RUN = HERE / "run"

# Where each method's settings on this task come from (the task's starting values).
ORIGIN = {
    "fedavg": "the task's lr 1.0, full-batch gradient descent (the IRM protocol)",
    "inv_fedavg": "λ = 1e4 after a 100-round warm-up, weight decay 0: **picked on OOD "
                  "accuracy of seed 0, a reported seed**",
    "fediir": "γ = 3e4, client lr 0.01: **picked on OOD accuracy of seed 0, a reported "
              "seed**",
    "fishr_inter_geo": "λ = 1e4, server Adam lr 3e-4, weight decay 0.01: **picked on OOD "
                       "accuracy of seed 0, a reported seed**",
}


def _summary() -> dict:
  return json.loads((RUN / "summary.json").read_text())


def _by_algorithm(runs: list) -> dict:
  out = {}
  for r in runs:
    out.setdefault(r["algorithm"], []).append(r)
  return out


def _value(r: dict, key: str):
  return None if r.get("status", "ok") != "ok" or r.get("final") is None else \
      r["final"].get(key)


def default_table() -> str:
  s = _summary()
  groups = _by_algorithm(s["runs"])
  lines = [f"Command `{s['command']}`; task `{s['task']}`, {s['rounds']} rounds, seeds "
           f"{s['seed']}; JAX {s['provenance']['versions']['jax']} on the CPU; ± = sample "
           f"std over seeds (ddof 1). Raw: `experiments/default_run/run/summary.json`.", "",
           "| algorithm | train accuracy | OOD accuracy | settings, and where they came from |",
           "|---|---|---|---|"]
  for a, runs in groups.items():
    tr = outputs.format_mean_std([_value(r, "train_accuracy") for r in runs], 3)
    ood = outputs.format_mean_std([_value(r, "ood_accuracy") for r in runs], 3)
    lines.append(f"| {a} | {tr} | {ood} | {ORIGIN.get(a, '–')} |")
  return "\n".join(lines)


def seeds_table() -> str:
  s = _summary()
  groups = _by_algorithm(s["runs"])
  seeds = s["seed"]
  lines = ["| algorithm | " + " | ".join(f"seed {x}" for x in seeds) + " |",
           "|---|" + "---|" * len(seeds)]
  for a, runs in groups.items():
    by_seed = {r["seed"]: _value(r, "ood_accuracy") for r in runs}
    lines.append(f"| {a} | " + " | ".join(
        "diverged" if by_seed.get(x) is None else f"{by_seed[x]:.3f}" for x in seeds) + " |")
  return "\n".join(lines)


TABLES = {"default": default_table, "seeds": seeds_table}
