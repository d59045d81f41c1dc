"""Leave-one-domain-out runs, the Python front end: every held-out domain × algorithm ×
seed of a domain task is one run of the planner / executor of ``fedjax-inv run``
(``experiment.plan_experiment``, ``executor.execute``: the held-out domain is one more
axis of the runs, batched with the seeds when the domains' data have equal shapes), each
run's rounds picked by the selection methods of :mod:`fedjax_inv.eval.lodo`
(training-domain validation, test-domain oracle, last), tabulated like the papers'
tables (:func:`result_from_runs`) and written atomically (:func:`write_lodo_outputs`).

Source: DomainBed (Gulrajani & Lopez-Paz 2021) model selection; FedIIR §5, FedSR §4.2.
"""
from __future__ import annotations

import pathlib
import sys
import time

import numpy as np

from fedjax_inv.runner import outputs
from fedjax_inv.eval.lodo import (SELECTIONS, VALIDATIONS, format_lodo_markdown, lodo_csv,
                                  lodo_table, result_from_runs, select_rounds)
from fedjax_inv.runner.experiment import resolve_holdouts

__all__ = ["run_lodo", "result_from_runs", "resolve_holdouts", "write_lodo_outputs",
           "SELECTIONS", "format_lodo_markdown", "lodo_csv", "lodo_table", "select_rounds"]


def _as_list(x, what: str) -> list:
  if isinstance(x, str):
    x = [a.strip() for a in x.split(",") if a.strip()]
  x = list(x)
  if not x:
    raise ValueError(f"{what} is empty; give at least one.")
  return x


def run_lodo(task_name: str, algorithms, *, seeds=(0,), rounds: int | None = None,
             holdouts="all", task_kwargs: dict | None = None,
             algorithm_kwargs: dict | None = None, execution: str = "auto",
             eval_every: int | None = None, progress: bool = True,
             clients_per_round: int | None = None, resplit: bool = False,
             stream=None, validation: str = "mean", replicas: str | None = None) -> dict:
  """Leave-one-domain-out sweep: every held-out domain × algorithm × seed.

  Args:
    task_name: a registered domain task (its builder takes ``holdout`` and sets
      ``info['domains']``), e.g. 'rotated_mnist', 'pacs'.
    algorithms: algorithm names (list, or a comma-separated string).
    seeds: training seeds (model init, client sampling, minibatches); non-empty.
    rounds: rounds per run (default: ``task.defaults['rounds']``).
    holdouts: 'all' (every domain in ``task.info['domains']``), or one / a list of domain
      names or indices.
    task_kwargs: extra builder arguments (``data_dir``, ``image_size``, ``seed`` = the data
      split seed, ...); must not contain ``holdout``.
    algorithm_kwargs: hyperparameters overriding the task defaults' client settings, for
      every algorithm; an entry whose key is one of ``algorithms`` and whose value is a
      dict applies to that algorithm only, e.g. ``{'client_lr': 0.01, 'fedprox':
      {'mu': 0.1}}``.
    execution: engine strategy ('auto' | 'vmap' | 'scan' | 'chunked').
    eval_every: evaluate every this many rounds (default: ``task.defaults['eval_every']``);
      model selection only sees evaluated rounds (the last is always evaluated).
    progress: per-run progress bars and a one-line summary per run on ``stream``.
    clients_per_round: cohort size (default: all training clients).
    resplit: False (default) keeps the data split of ``task_kwargs['seed']`` (default 0)
      for all seeds, so seeds vary only training randomness; True rebuilds the task with
      ``seed=s`` for each seed (DomainBed's per-trial split).
    stream: where summary lines go (default ``sys.stdout``).
    validation: training-domain validation accuracy: 'mean' (default) of the per-domain
      accuracies, as DomainBed and FedIIR's code, or 'pooled' over all validation
      examples (:func:`select_rounds`).
    replicas: 'sequential' (one run at a time, one task in memory), 'batched' (every
      held-out domain × seed of an algorithm as ONE vmapped program,
      ``replicas.run_replicas(tasks=...)``; all tasks are held in memory and must have
      equal shapes, e.g. RotatedMNIST's equal-sized domains, else the runs go one after
      another and the reason is printed) or 'auto' (batched on GPU/TPU, sequential on
      CPU); None (default): ``fedjax-inv run --replicas``'s default, 'auto'.

  Returns:
    dict with ``task``, ``domains``, ``holdouts`` (names, in order), ``algorithms``,
    ``seeds``, ``rounds``, ``validation``, ``selections`` (:data:`SELECTIONS`), ``runs``
    (one dict per run: ``holdout``, ``algorithm``, ``seed``, ``selected`` = :func:`select_rounds`,
    ``final``, ``history``, ``hparams``, ``execution``, ``seconds``), ``table`` (rows
    ``{'selection', 'algorithm', 'seeds', 'cells': {domain | 'avg': {'mean', 'std',
    'values'}}}``), ``task_info`` (holdout → ``Task.info``).

  Raises:
    ValueError: unknown task / algorithm / holdout, a task that is not a domain task,
      empty ``seeds`` or ``algorithms``, duplicates, ``rounds < 1``, ``holdout`` in
      ``task_kwargs``, a bad hyperparameter, execution strategy or ``validation`` — all
      before any training.
    RuntimeError: a run's train objective became non-finite (after every run ended;
      ``fedjax-inv run --holdout`` records such runs instead).
  """
  from fedjax_inv.runner import executor, experiment
  stream = sys.stdout if stream is None else stream
  algorithms, seeds = _check_args(task_name, algorithms, seeds, rounds, eval_every,
                                  task_kwargs, execution, replicas, validation)
  if not (isinstance(holdouts, str) and holdouts == "all"):
    holdouts = ([holdouts] if isinstance(holdouts, (str, int, np.integer))
                else list(holdouts))
  overrides = {}
  for k, v in dict(algorithm_kwargs or {}).items():
    if k in algorithms and isinstance(v, dict):  # {'fedprox': {'mu': 0.1}}: scoped
      overrides.update({f"{k}.{n}": x for n, x in v.items()})
    else:
      overrides[k] = v
  cfg = {"task": task_name, "algorithm": ",".join(algorithms), "rounds": rounds,
         "holdout": "all" if holdouts == "all" else ",".join(map(str, holdouts)),
         "execution": execution, "eval_every": eval_every,
         "clients_per_round": clients_per_round, "validation": validation,
         "replicas": replicas, "seed": seeds[0]}
  t0 = time.perf_counter()
  # the data split seed is task_kwargs['seed'] (default 0), not the first training seed
  task_kwargs = {"seed": 0, **(task_kwargs or {})}
  pl = experiment.plan_experiment(cfg, overrides, task_kwargs=task_kwargs, seeds=seeds,
                                  resplit=resplit, holdouts=holdouts)
  rec = executor.Recorder(pl, None, stream)
  ex = executor.execute(pl, None, {}, rec, progress, stream)
  bad = [r for r in rec.runs if r.get("status") == "diverged"]
  if bad:
    raise RuntimeError(f"{len(bad)} run(s) diverged, e.g. {bad[0]['algorithm']} seed "
                       f"{bad[0]['seed']} holdout {bad[0]['holdout']}: "
                       f"{bad[0]['error']}")
  result = result_from_runs(pl, rec.runs, batched=ex.ran_batched)
  result["seconds"] = round(time.perf_counter() - t0, 2)
  return result


def _check_args(task_name, algorithms, seeds, rounds, eval_every, task_kwargs, execution,
                replicas, validation):
  """``(algorithms, seeds)`` as lists, after every argument check of :func:`run_lodo`
  that needs no data (ValueError naming the value and the fix)."""
  from fedjax_inv.algorithms import registry
  from fedjax_inv.core.engine import resolve_strategy
  from fedjax_inv.runner import config
  from fedjax_inv.tasks import task_registry
  if validation not in VALIDATIONS:
    raise ValueError(f"validation={validation!r}; choose 'mean' (per-domain average, "
                     "DomainBed/FedIIR) or 'pooled'.")
  if task_name not in task_registry():
    raise ValueError(f"unknown task {task_name!r}; available: {sorted(task_registry())}.")
  algorithms = _as_list(algorithms, "algorithms")
  unknown = [a for a in algorithms if a not in registry()]
  if unknown:
    raise ValueError(f"unknown algorithm(s) {unknown}; available: {sorted(registry())}.")
  if len(set(algorithms)) != len(algorithms):
    raise ValueError(f"algorithms {algorithms} contain duplicates.")
  if isinstance(seeds, (int, np.integer)):
    seeds = [int(seeds)]
  seeds = list(seeds)
  if not seeds:
    raise ValueError("seeds is empty; pass at least one seed, e.g. seeds=(0, 1, 2).")
  if any(int(s) != s for s in seeds) or len(set(seeds)) != len(seeds):
    raise ValueError(f"seeds={seeds}; use distinct integers.")
  if rounds is not None and (int(rounds) != rounds or rounds < 1):
    raise ValueError(f"rounds={rounds!r}; it must be a positive integer.")
  if eval_every is not None and (int(eval_every) != eval_every or eval_every < 1):
    raise ValueError(f"eval_every={eval_every!r}; it must be a positive integer.")
  if "holdout" in (task_kwargs or {}):
    raise ValueError("task_kwargs must not set 'holdout'; choose held-out domains with "
                     "holdouts=... instead.")
  resolve_strategy(execution, 1)  # validates the name
  config.check_replicas(replicas)
  return algorithms, [int(s) for s in seeds]


def write_lodo_outputs(out_dir, result: dict) -> pathlib.Path:
  """Writes ``results.md``, ``results.csv``, ``summary.json`` (everything in ``result``
  but the per-round histories: per-domain numbers, selection methods, seeds, task info)
  and ``metrics.jsonl`` (one line per evaluated round with ``holdout``, ``algorithm``,
  ``seed``) into ``out_dir`` atomically (``fedjax_inv.runner.outputs.atomic_dir``: a half-written
  folder never replaces an existing one). Returns ``out_dir`` as a ``pathlib.Path``."""
  import jax

  summary = {k: v for k, v in result.items() if k != "runs"}
  summary["runs"] = [{k: v for k, v in r.items() if k != "history"}
                     for r in result["runs"]]
  summary["jax"] = {"version": jax.__version__, "backend": jax.default_backend(),
                    "devices": jax.device_count()}
  summary["command"] = " ".join(sys.argv)
  rows = [{"holdout": r["holdout"], "algorithm": r["algorithm"], "seed": r["seed"], **h}
          for r in result["runs"] for h in r.get("history", [])]
  out = pathlib.Path(out_dir)
  with outputs.atomic_dir(out) as tmp:
    (tmp / "results.md").write_text(format_lodo_markdown(result) + "\n")
    (tmp / "results.csv").write_text(lodo_csv(result))
    outputs.write_json(tmp / "summary.json", summary)
    outputs.write_jsonl(tmp / "metrics.jsonl", rows)
  return out
