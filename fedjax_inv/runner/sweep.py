"""Hyperparameter sweeps from Python (:func:`run_sweep`, a front end over the planner and
executor of ``fedjax-inv run``): a grid of settings × seeds, batched as one program when the
swept values can be traced.

A research table is seeds × settings. ``fedjax-inv run --sweep client_lr=0.1,0.03
--sweep mu=0,0.01`` (or :func:`run_sweep`) runs every point of the grid (the cartesian
product, in the order given) for every seed:

* **batched** (one ``vmap``ped program, :func:`fedjax_inv.runner.replicas.run_replicas`)
  when every swept name is *traceable* (``Algorithm.traced``): the optimizers'
  ``client_lr`` / ``server_lr`` (``core.algorithm.learning_rate_in_round``: each round
  builds the optimizer from its rate, the built constant in an ordinary run and the
  replica's value in a sweep) and the coefficients the algorithm's components read with
  ``core.algorithm.hparam`` (``Component.traced``: FedProx ``mu``, Fishr
  ``fishr_lambda``, FedIIR ``gamma``) and the aggregator's
  (``core.aggregator.traced_names``: FedGMA's / the AND-mask's ``tau``). The values live
  as float32 scalars in each replica's server state, as ``optax.inject_hyperparams`` keeps
  them in the optimizer state;
* **one after another** otherwise (e.g. ``local_steps``, ``batch_size``: they change the
  program), with the reason printed and recorded.

Batched results equal the sequential ones up to float32 rounding (``tests/test_sweep.py``,
rtol 2e-6: vmapped matmuls may sum in another order).
"""
from __future__ import annotations

# The grid's grammar and batching plan live in grid.py (the planner and executor read
# them); re-exported here, where users look for them.
from fedjax_inv.runner.grid import (PLACEHOLDER, Plan, label, parse_sweep, plan,  # noqa: F401
                             points, replica_hparams, spec_for)
from fedjax_inv.algorithms.schema import canonical

__all__ = ["run_sweep", "PLACEHOLDER", "Plan", "label", "parse_sweep", "plan", "points",
           "replica_hparams", "spec_for"]


def run_sweep(task, algorithm: str, spec: dict, *, seeds, rounds: int,
              overrides: dict | None = None, replicas: str | None = None,
              **run_kw) -> list:
  """Runs every point of ``spec`` × every seed of ``algorithm`` on ``task``.

  Args:
    task: a ``Task``.
    algorithm: registered algorithm name.
    spec: ``{name: [values]}`` (hyperparameter names of the algorithm's factory;
      ``lr`` = ``client_lr``).
    seeds: seeds of every point.
    rounds: rounds of every run.
    overrides: further fixed hyperparameters (the task's defaults are applied first).
    replicas: 'auto' (batched on GPU/TPU when the plan allows it, else one after
      another), 'batched' (batched when the plan allows it) or 'sequential'; None
      (default): ``fedjax-inv run --replicas``'s default, 'auto'.
    **run_kw: as :func:`fedjax_inv.runner.simulation.run` (clients_per_round, execution,
      eval_every, progress, reporting, ...).

  Returns:
    ``[{'point': {name: value}, 'seed': s, 'label': str, 'hparams': dict, 'result':
    RunResult | DivergedError, 'batched': bool}]`` in grid order, seeds innermost.

  Raises:
    ValueError: a bad spec or point (before any compile).
  """
  import io
  import sys

  from fedjax_inv.runner import config, executor, experiment
  spec = {canonical(k): (list(v) if isinstance(v, (list, tuple)) else [v])
          for k, v in spec.items()}
  replicas = config.check_replicas(replicas)
  overrides = dict(overrides or {})
  clash = sorted(set(spec) & set(overrides))
  if clash:
    raise ValueError(f"{clash} both swept and fixed; give each name once.")
  progress = run_kw.pop("progress", True)
  reporting = run_kw.pop("reporting", "auto")
  unknown = sorted(set(run_kw) - {"clients_per_round", "execution", "eval_every",
                                  "chunk_size", "rounds_per_call", "precision"})
  if unknown:
    raise TypeError(f"run_sweep got unknown keyword arguments {unknown}.")
  seeds = [int(s) for s in seeds]
  cfg = {"task": task.name, "algorithm": algorithm, "rounds": rounds, "seed": seeds[0],
         "replicas": replicas, "sweep": {k: list(v) for k, v in spec.items()}, **run_kw}
  stream = sys.stdout if progress else io.StringIO()
  # the planner and executor of `fedjax-inv run`, on this Task object, nothing written
  pl = experiment.plan_experiment(cfg, {f"{algorithm}.{k}": v for k, v in overrides.items()},
                                  seeds=seeds, task=task, reporting=reporting)
  rec = executor.Recorder(pl, None, stream)
  executor.execute(pl, None, {}, rec, progress, stream)
  plan_ = pl.plans[algorithm]
  return [dict(point=p, seed=s, label=lab, hparams=pl.built[lab].hparams,
               result=rec.results[(lab, s, None)],
               batched=rec.batched[(lab, s, None)])
          for p, lab in zip(plan_.points, pl.labels[algorithm]) for s in seeds]

