"""Leave-one-domain-out runs (the run layer over ``fedjax_inv.eval.lodo``): every held-out
domain × algorithm × seed of a domain task, trained with ``fedjax_inv.simulation.run`` (or
batched with ``fedjax_inv.replicas.run_replicas``), each run's rounds picked by the
selection methods of :mod:`fedjax_inv.eval.lodo` (training-domain validation, test-domain
oracle, last), tabulated like the papers' tables and written atomically.

Source: DomainBed (Gulrajani & Lopez-Paz 2021) model selection; FedIIR §5, FedSR §4.2.
"""
from __future__ import annotations

import pathlib
import sys
import time
from typing import Sequence

import numpy as np

from fedjax_inv import outputs
from fedjax_inv.eval.lodo import (SELECTIONS, VALIDATIONS, format_lodo_markdown, lodo_csv,
                                  lodo_table, select_rounds)

__all__ = ["run_lodo", "write_lodo_outputs", "SELECTIONS", "format_lodo_markdown",
           "lodo_csv", "lodo_table", "select_rounds"]


def _as_list(x, what: str) -> list:
  if isinstance(x, str):
    x = [a.strip() for a in x.split(",") if a.strip()]
  x = list(x)
  if not x:
    raise ValueError(f"{what} is empty; give at least one.")
  return x


def _algorithm_kwargs(name: str, task, algorithm_kwargs: dict | None,
                      algorithms: Sequence[str]) -> dict:
  """``task.algorithm_settings`` (task defaults, its per-algorithm settings), overridden
  by the common entries of ``algorithm_kwargs``, then by ``algorithm_kwargs[name]``."""
  ak = dict(algorithm_kwargs or {})
  per = {a: ak.pop(a) for a in list(ak) if a in algorithms and isinstance(ak[a], dict)}
  return task.algorithm_settings(name, {**ak, **per.get(name, {})})


def run_lodo(task_name: str, algorithms, *, seeds=(0,), rounds: int | None = None,
             holdouts="all", task_kwargs: dict | None = None,
             algorithm_kwargs: dict | None = None, execution: str = "auto",
             eval_every: int | None = None, progress: bool = True,
             clients_per_round: int | None = None, resplit: bool = False,
             stream=None, validation: str = "mean", replicas: str = "sequential") -> dict:
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
    replicas: 'sequential' (default: one run at a time, one task in memory), 'batched'
      (every held-out domain × seed of an algorithm as ONE vmapped program,
      ``replicas.run_replicas(tasks=...)``; all tasks are held in memory and must have
      equal shapes, e.g. RotatedMNIST's equal-sized domains, else the runs go one after
      another and the reason is printed) or 'auto' (batched on GPU/TPU).

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
  """
  import types
  stream = sys.stdout if stream is None else stream
  algorithms, seeds = _check_args(task_name, algorithms, seeds, rounds, eval_every,
                                  task_kwargs, execution, replicas, validation)
  task_kwargs = dict(task_kwargs or {})
  split_seed = int(task_kwargs.pop("seed", 0))
  first, domains, wanted = _domains(task_name, task_kwargs, split_seed, holdouts)
  rounds = int(rounds or first.defaults.get("rounds", 100))
  eval_every = eval_every or first.defaults.get("eval_every")
  cohort = clients_per_round or first.train.num_clients
  if not 1 <= cohort <= first.train.num_clients:
    raise ValueError(f"clients_per_round={clients_per_round}; the task has "
                     f"{first.train.num_clients} training clients per held-out domain.")
  from fedjax_inv.algorithms import make_algorithm
  built = {a: make_algorithm(a, **_algorithm_kwargs(a, first, algorithm_kwargs,
                                                     algorithms))
           for a in algorithms}
  pl = types.SimpleNamespace(
      task_name=task_name, task_kwargs=task_kwargs, split_seed=split_seed, resplit=resplit,
      first=first, wanted=wanted, seeds=seeds, algorithms=algorithms, built=built,
      run_kw=dict(rounds=rounds, clients_per_round=cohort, execution=execution,
                  eval_every=eval_every, progress=progress),
      validation=validation, progress=progress, stream=stream, runs=[], task_info={})
  t0 = time.perf_counter()
  import jax
  batched = replicas == "batched" or (replicas == "auto" and jax.default_backend() != "cpu")
  batched = batched and _run_batched(pl)
  if not batched:
    _run_sequential(pl)
  result = {"task": task_name, "domains": domains, "holdouts": wanted,
            "algorithms": algorithms, "seeds": seeds, "rounds": rounds,
            "eval_every": eval_every, "clients_per_round": cohort,
            "validation": validation, "replicas": "batched" if batched else "sequential",
            "split_seed": None if resplit else split_seed, "resplit": bool(resplit),
            "task_kwargs": task_kwargs, "selections": list(SELECTIONS),
            "runs": pl.runs, "task_info": pl.task_info,
            "seconds": round(time.perf_counter() - t0, 2)}
  result["table"] = lodo_table(result)
  return result


def _check_args(task_name, algorithms, seeds, rounds, eval_every, task_kwargs, execution,
                replicas, validation):
  """``(algorithms, seeds)`` as lists, after every argument check of :func:`run_lodo`
  that needs no data (ValueError naming the value and the fix)."""
  from fedjax_inv.algorithms import registry
  from fedjax_inv.core.engine import resolve_strategy
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
  if replicas not in ("auto", "batched", "sequential"):
    raise ValueError(f"replicas={replicas!r}; choose 'auto', 'batched' or 'sequential'.")
  return algorithms, [int(s) for s in seeds]


def _domains(task_name, task_kwargs, split_seed, holdouts):
  """Builds the first task (checks the task and its kwargs) and resolves ``holdouts``.

  Returns:
    ``(first task, all domain names, the held-out domain names to run, in order)``.

  Raises:
    ValueError: not a domain task, a regression task, no 'val' / 'ood' set, an unknown
      or repeated held-out domain, an empty list.
  """
  from fedjax_inv.tasks import make_task
  first = make_task(task_name, seed=split_seed, **task_kwargs)
  domains = first.info.get("domains")
  if not domains or "holdout" not in first.info:
    raise ValueError(f"task {task_name!r} is not a domain task (its info has no 'domains' "
                     "/ 'holdout'); leave-one-domain-out needs one.")
  domains = [str(d) for d in domains]
  if first.kind == "regression":
    raise ValueError(f"task {task_name!r} is a regression task; LODO selects by accuracy.")
  for s in ("val", "ood"):
    if s not in first.eval_sets:
      raise ValueError(f"task {task_name!r} has no {s!r} evaluation set (it has "
                       f"{sorted(first.eval_sets)}); the LODO contract needs 'val' and "
                       "'ood' (val_fraction > 0).")
  if isinstance(holdouts, str) and holdouts == "all":
    return first, domains, list(domains)
  items = [holdouts] if isinstance(holdouts, (str, int, np.integer)) else list(holdouts)
  if not items:
    raise ValueError("holdouts is empty; pass 'all' or at least one domain.")
  wanted = [_domain_name(h, domains) for h in items]
  if len(set(wanted)) != len(wanted):
    raise ValueError(f"holdouts {items} name a domain twice.")
  return first, domains, wanted


def _task_for(pl, h: str, seed: int, cache: dict):
  """The task with held-out domain ``h`` (data split ``seed``), from ``cache`` or built;
  refuses a builder that reports another holdout; records its info."""
  from fedjax_inv.tasks import make_task
  key = (h, seed)
  if key not in cache:
    cache[key] = make_task(pl.task_name, holdout=h, seed=seed, **pl.task_kwargs)
  task = cache[key]
  if task.info["holdout"] != h:
    raise RuntimeError(f"task {pl.task_name!r} built with holdout={h!r} reports holdout "
                       f"{task.info['holdout']!r}; its builder breaks the contract.")
  pl.task_info.setdefault(h, task.info)
  return task


def _record(pl, h, a, s, res) -> None:
  sel = select_rounds(res.history, validation=pl.validation)
  pl.runs.append({"holdout": h, "algorithm": a, "seed": s, "selected": sel,
                  "final": res.final, "history": res.history,
                  "hparams": pl.built[a].hparams, "execution": res.strategy,
                  "seconds": round(res.seconds, 2)})
  if pl.progress:
    v = sel[SELECTIONS[0]]
    print(f"  holdout {h:>14s}  {a:16s} seed {s}: ood acc (val-selected, round "
          f"{v['round']}) {v['ood_accuracy']:.3f}  oracle "
          f"{sel[SELECTIONS[1]]['ood_accuracy']:.3f}  last "
          f"{sel[SELECTIONS[2]]['ood_accuracy']:.3f}  ({res.seconds:.1f}s)",
          file=pl.stream)


def _run_batched(pl) -> bool:
  """Every (held-out domain, seed) of an algorithm as ONE vmapped program
  (``replicas.run_replicas(tasks=...)``); False (nothing run, the reason printed) when
  the domains' data shapes differ."""
  from fedjax_inv.replicas import check_same_shapes, run_replicas
  from fedjax_inv.simulation import DivergedError
  pairs = [(h, s) for h in pl.wanted for s in pl.seeds]
  cache = {(str(pl.first.info["holdout"]), pl.split_seed): pl.first}
  split = lambda s: s if pl.resplit else pl.split_seed  # noqa: E731
  try:
    check_same_shapes([_task_for(pl, h, split(s), cache) for h, s in pairs])
  except ValueError as e:
    pl.task_info.clear()
    print(f"  --replicas batched: running one held-out domain at a time ({e})",
          file=pl.stream)
    return False
  tasks = [cache[(h, split(s))] for h, s in pairs]
  for a in pl.algorithms:
    print(f"  {a}: {len(pairs)} (held-out domain, seed) runs batched as one program "
          "(--replicas batched)", file=pl.stream)
    results = run_replicas(None, pl.built[a], seeds=[s for _, s in pairs], tasks=tasks,
                           **pl.run_kw)
    for (h, s), res in zip(pairs, results):
      if isinstance(res, DivergedError):
        raise res
      _record(pl, h, a, s, res)
  return True


def _run_sequential(pl) -> None:
  """One run after another, one task in memory at a time (image tasks are large)."""
  from fedjax_inv.simulation import run
  cache = {(str(pl.first.info["holdout"]), pl.split_seed): pl.first}
  for h in pl.wanted:
    for s in pl.seeds:
      key = (h, s if pl.resplit else pl.split_seed)
      if key not in cache:
        cache.clear()  # keep one task in memory
      task = _task_for(pl, h, key[1], cache)
      for a in pl.algorithms:
        _record(pl, h, a, s, run(task, pl.built[a], seed=s, **pl.run_kw))


def _domain_name(h, domains: list) -> str:
  if isinstance(h, (int, np.integer)) and not isinstance(h, bool):
    if not 0 <= int(h) < len(domains):
      raise ValueError(f"holdout index {h} out of range; domains are {domains} "
                       f"(indices 0..{len(domains) - 1}).")
    return domains[int(h)]
  if isinstance(h, str):
    if h in domains:
      return h
    low = [d.lower() for d in domains]
    if h.lower() in low:
      return domains[low.index(h.lower())]
    if h.isdigit():
      return _domain_name(int(h), domains)
  raise ValueError(f"unknown holdout domain {h!r}; domains are {domains} (names or "
                   "indices).")


def write_lodo_outputs(out_dir, result: dict) -> pathlib.Path:
  """Writes ``results.md``, ``results.csv``, ``summary.json`` (everything in ``result``
  but the per-round histories: per-domain numbers, selection methods, seeds, task info)
  and ``metrics.jsonl`` (one line per evaluated round with ``holdout``, ``algorithm``,
  ``seed``) into ``out_dir`` atomically (``fedjax_inv.outputs.atomic_dir``: a half-written
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
