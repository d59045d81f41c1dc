"""Leave-one-domain-out (LODO) sweeps with DomainBed's model-selection methods side by side.

For every held-out domain × algorithm × seed, :func:`run_lodo` builds the domain task with
that ``holdout`` (the shared domain-task contract: training clients = the source domains,
``eval_sets = {'val': one client per source domain (its validation split), 'ood': the
held-out domain}``), trains with ``fedjax_inv.simulation.run`` and reads the OOD
accuracy at the round chosen by each selection method (over the evaluated rounds):

* ``training-domain validation`` — the round with the highest validation accuracy over
  the source domains' validation splits (ties → earliest round). By default
  (``validation='mean'``) the unweighted mean of the per-domain accuracies
  (``val_mean_client_accuracy``: one 'val' client per source domain), as DomainBed's
  ``IIDAccuracySelectionMethod`` (``mean(env_out_acc for env in train_envs)``) and
  FedIIR's code (``train_acc += acc`` per domain, ``/ len(train_data)``) compute it;
  ``validation='pooled'`` uses the accuracy pooled over all validation examples
  (``val_accuracy``), which weights large domains more. FedIIR §5: "We chose the global
  model that maximizes accuracy on the overall validation set"; FedSR §5 and DomainBed
  (Gulrajani & Lopez-Paz 2021) use the same 90/10 training-domain validation.
* ``test-domain oracle`` — the highest ``ood_accuracy`` over the evaluated rounds (an upper
  bound that peeks at the test domain). DomainBed's oracle picks *hyperparameters* by
  test-domain accuracy and reports the last checkpoint; with one hyperparameter setting
  per algorithm, as here, the per-round maximum is the checkpoint-level analogue.
* ``last`` — the final round.

Results are tabulated like the papers' tables: per (selection, algorithm) one row with a
column per held-out domain and ``avg``, each ``mean ± std`` over seeds (population std,
``ddof=0``, as ``fedjax_inv.outputs``); ``avg`` is the mean over held-out domains computed
per seed, then mean ± std over seeds. Accuracies are fractions in [0, 1] in the result
dict and CSV, and percentages in the markdown table.
"""
from __future__ import annotations

import pathlib
import sys
import time
from typing import Sequence

import numpy as np

from fedjax_inv import outputs

__all__ = ["SELECTIONS", "format_lodo_markdown", "lodo_csv", "run_lodo", "select_rounds",
           "write_lodo_outputs"]

SELECTIONS = ("training-domain validation", "test-domain oracle", "last")
VALIDATIONS = ("mean", "pooled")

# Task defaults that are run settings, not algorithm hyperparameters.
_RUN_KEYS = ("rounds", "eval_every")


def select_rounds(history: Sequence[dict], val_key: str | None = None,
                  test_key: str = "ood_accuracy", validation: str = "mean") -> dict:
  """Model selection over one run's evaluated rounds.

  Args:
    history: ``RunResult.history`` — dicts with ``round``, the validation key and
      ``test_key``.
    val_key: the training-domain validation metric (higher is better); default from
      ``validation``.
    test_key: the held-out domain metric (higher is better).
    validation: 'mean' (default; DomainBed / FedIIR) — ``val_mean_client_accuracy``, the
      mean of the per-domain validation accuracies (``val_accuracy`` when no entry has it,
      i.e. the 'val' set has a single client, where both are equal); 'pooled' —
      ``val_accuracy``, pooled over all validation examples.

  Returns:
    ``{selection: {'round', 'ood_accuracy', 'val_accuracy'}}`` for every name in
    :data:`SELECTIONS` (``val_accuracy`` = the validation metric used); ties → the
    earliest round.

  Raises:
    ValueError: empty history, missing keys (e.g. a task without a 'val' set), or an
      unknown ``validation``.

  Source: DomainBed (Gulrajani & Lopez-Paz 2021) §3 model selection and
  ``domainbed/model_selection.py``; FedIIR §5 and its ``main.py``; FedSR §5.
  """
  if validation not in VALIDATIONS:
    raise ValueError(f"validation={validation!r}; choose 'mean' (per-domain average, "
                     "DomainBed/FedIIR) or 'pooled'.")
  if not history:
    raise ValueError("select_rounds: the history is empty; evaluate at least one round.")
  if val_key is None:
    val_key = "val_accuracy"
    if validation == "mean" and any("val_mean_client_accuracy" in h for h in history):
      val_key = "val_mean_client_accuracy"
  for key in (val_key, test_key):
    if any(key not in h for h in history):
      raise ValueError(f"select_rounds: history entries lack {key!r} (keys: "
                       f"{sorted(history[0])}); the task needs eval sets 'val' and 'ood'.")
  val = np.asarray([h[val_key] for h in history], np.float64)
  test = np.asarray([h[test_key] for h in history], np.float64)
  picks = {SELECTIONS[0]: int(np.argmax(val)), SELECTIONS[1]: int(np.argmax(test)),
           SELECTIONS[2]: len(history) - 1}
  return {s: {"round": int(history[i]["round"]), "ood_accuracy": float(test[i]),
              "val_accuracy": float(val[i])} for s, i in picks.items()}


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
  from fedjax_inv.algorithms import make_algorithm, registry
  from fedjax_inv.core.engine import resolve_strategy
  from fedjax_inv.simulation import run
  from fedjax_inv.tasks import make_task, task_registry

  stream = sys.stdout if stream is None else stream
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
  seeds = [int(s) for s in seeds]
  if rounds is not None and (int(rounds) != rounds or rounds < 1):
    raise ValueError(f"rounds={rounds!r}; it must be a positive integer.")
  if eval_every is not None and (int(eval_every) != eval_every or eval_every < 1):
    raise ValueError(f"eval_every={eval_every!r}; it must be a positive integer.")
  task_kwargs = dict(task_kwargs or {})
  if "holdout" in task_kwargs:
    raise ValueError("task_kwargs must not set 'holdout'; choose held-out domains with "
                     "holdouts=... instead.")
  resolve_strategy(execution, 1)  # validates the name
  if replicas not in ("auto", "batched", "sequential"):
    raise ValueError(f"replicas={replicas!r}; choose 'auto', 'batched' or 'sequential'.")
  split_seed = int(task_kwargs.pop("seed", 0))

  tasks: dict = {}

  def get_task(h_name, seed):
    key = (h_name, seed)
    if key not in tasks:
      tasks.clear()  # keep one task in memory (image tasks are large)
      tasks[key] = make_task(task_name, holdout=h_name, seed=seed, **task_kwargs)
    return tasks[key]

  # Build the first task to learn the domains (validates the task and its kwargs).
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
    wanted = list(domains)
  else:
    items = [holdouts] if isinstance(holdouts, (str, int, np.integer)) else list(holdouts)
    if not items:
      raise ValueError("holdouts is empty; pass 'all' or at least one domain.")
    wanted = [_domain_name(h, domains) for h in items]
    if len(set(wanted)) != len(wanted):
      raise ValueError(f"holdouts {items} name a domain twice.")
  tasks[(str(first.info["holdout"]), split_seed)] = first
  rounds = int(rounds or first.defaults.get("rounds", 100))
  eval_every = eval_every or first.defaults.get("eval_every")
  cohort = clients_per_round or first.train.num_clients
  if not 1 <= cohort <= first.train.num_clients:
    raise ValueError(f"clients_per_round={clients_per_round}; the task has "
                     f"{first.train.num_clients} training clients per held-out domain.")
  built = {a: make_algorithm(a, **_algorithm_kwargs(a, first, algorithm_kwargs,
                                                     algorithms))
           for a in algorithms}

  runs, task_info = [], {}
  t0 = time.perf_counter()

  def record(h, a, s, res):
    sel = select_rounds(res.history, validation=validation)
    runs.append({"holdout": h, "algorithm": a, "seed": s, "selected": sel,
                 "final": res.final, "history": res.history,
                 "hparams": built[a].hparams, "execution": res.strategy,
                 "seconds": round(res.seconds, 2)})
    if progress:
      v = sel[SELECTIONS[0]]
      print(f"  holdout {h:>14s}  {a:16s} seed {s}: ood acc (val-selected, round "
            f"{v['round']}) {v['ood_accuracy']:.3f}  oracle "
            f"{sel[SELECTIONS[1]]['ood_accuracy']:.3f}  last "
            f"{sel[SELECTIONS[2]]['ood_accuracy']:.3f}  ({res.seconds:.1f}s)",
            file=stream)

  import jax
  batched = replicas == "batched" or (replicas == "auto" and jax.default_backend() != "cpu")
  if batched:
    from fedjax_inv.replicas import check_same_shapes, run_replicas
    from fedjax_inv.simulation import DivergedError
    pairs = [(h, s) for h in wanted for s in seeds]
    all_tasks = {}
    for h, s in pairs:
      key = (h, s if resplit else split_seed)
      if key not in all_tasks:
        all_tasks[key] = tasks.get(key) or make_task(task_name, holdout=h, seed=key[1],
                                                     **task_kwargs)
    rep_tasks = [all_tasks[(h, s if resplit else split_seed)] for h, s in pairs]
    try:
      check_same_shapes(rep_tasks)
    except ValueError as e:
      batched = False
      print(f"  --replicas batched: running one held-out domain at a time ({e})",
            file=stream)
  if batched:
    for (h, _), t in zip(pairs, rep_tasks):
      if t.info["holdout"] != h:
        raise RuntimeError(f"task {task_name!r} built with holdout={h!r} reports holdout "
                           f"{t.info['holdout']!r}; its builder breaks the contract.")
      task_info.setdefault(h, t.info)
    for a in algorithms:
      print(f"  {a}: {len(pairs)} (held-out domain, seed) runs batched as one program "
            "(--replicas batched)", file=stream)
      results = run_replicas(None, built[a], seeds=[s for _, s in pairs], tasks=rep_tasks,
                             rounds=rounds, clients_per_round=cohort, execution=execution,
                             eval_every=eval_every, progress=progress)
      for (h, s), res in zip(pairs, results):
        if isinstance(res, DivergedError):
          raise res
        record(h, a, s, res)
    all_tasks.clear()
  for h in ([] if batched else wanted):
    for s in seeds:
      task = get_task(h, s if resplit else split_seed)
      if task.info["holdout"] != h:
        raise RuntimeError(f"task {task_name!r} built with holdout={h!r} reports holdout "
                           f"{task.info['holdout']!r}; its builder breaks the contract.")
      task_info.setdefault(h, task.info)
      for a in algorithms:
        res = run(task, built[a], rounds=rounds, clients_per_round=cohort, seed=s,
                  execution=execution, eval_every=eval_every, progress=progress)
        record(h, a, s, res)
  tasks.clear()
  result = {"task": task_name, "domains": domains, "holdouts": wanted,
            "algorithms": algorithms, "seeds": seeds, "rounds": rounds,
            "eval_every": eval_every, "clients_per_round": cohort,
            "validation": validation, "replicas": "batched" if batched else "sequential",
            "split_seed": None if resplit else split_seed, "resplit": bool(resplit),
            "task_kwargs": task_kwargs, "selections": list(SELECTIONS),
            "runs": runs, "task_info": task_info,
            "seconds": round(time.perf_counter() - t0, 2)}
  result["table"] = lodo_table(result)
  return result


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


def lodo_table(result: dict) -> list[dict]:
  """Rows ``{'selection', 'algorithm', 'seeds', 'cells'}`` with ``cells[domain]`` and
  ``cells['avg']`` = ``{'mean', 'std', 'values'}`` (OOD accuracy in [0, 1], over seeds;
  ``avg`` per seed over the held-out domains). Rows are ordered by selection, then
  algorithm."""
  rows = []
  for sel in result["selections"]:
    for a in result["algorithms"]:
      cells = {}
      per_seed = {s: [] for s in result["seeds"]}
      for h in result["holdouts"]:
        vals = []
        for r in result["runs"]:
          if r["algorithm"] == a and r["holdout"] == h:
            v = r["selected"][sel]["ood_accuracy"]
            vals.append(v)
            per_seed[r["seed"]].append(v)
        if vals:
          m, sd = outputs.mean_std(vals)
          cells[h] = {"mean": m, "std": sd, "values": vals}
      avgs = [float(np.mean(v)) for v in per_seed.values()
              if v and len(v) == len(result["holdouts"])]
      if avgs:
        m, sd = outputs.mean_std(avgs)
        cells["avg"] = {"mean": m, "std": sd, "values": avgs}
      rows.append({"selection": sel, "algorithm": a, "seeds": len(result["seeds"]),
                   "cells": cells})
  return rows


def format_lodo_markdown(result: dict) -> str:
  """Markdown: one table per selection method, rows = algorithms, columns = held-out
  domains and ``avg``; cells ``mean ± std`` of OOD accuracy in percent over seeds."""
  table = result.get("table") or lodo_table(result)
  cols = list(result["holdouts"]) + ["avg"]
  n = len(result["seeds"])
  out = [f"## {result['task']}: leave-one-domain-out OOD accuracy (%)",
         "",
         f"Mean ± std over {n} seed(s) {result['seeds']}; {result['rounds']} rounds; "
         "column = held-out (test) domain; training-domain validation accuracy = "
         + ("accuracy pooled over the source domains' validation examples"
            if result.get("validation") == "pooled" else
            "mean of the per-source-domain validation accuracies (DomainBed, FedIIR)")
         + ".", ""]
  for sel in result["selections"]:
    out += [f"### {sel}", "", "| algorithm | " + " | ".join(cols) + " |",
            "|---|" + "|".join("---:" for _ in cols) + "|"]
    for row in table:
      if row["selection"] != sel:
        continue
      cells = []
      for c in cols:
        v = row["cells"].get(c)
        cells.append("–" if v is None else f"{100 * v['mean']:.1f} ± {100 * v['std']:.1f}")
      out.append(f"| {row['algorithm']} | " + " | ".join(cells) + " |")
    out.append("")
  return "\n".join(out)


def lodo_csv(result: dict) -> str:
  """CSV: one row per (selection, algorithm) with ``<domain>_mean``, ``<domain>_std`` for
  each held-out domain and ``avg_mean``, ``avg_std`` (accuracy fractions in [0, 1])."""
  import csv
  import io
  table = result.get("table") or lodo_table(result)
  cols = list(result["holdouts"]) + ["avg"]
  fields = ["selection", "algorithm", "seeds"] + [f"{c}_{s}" for c in cols
                                                  for s in ("mean", "std")]
  buf = io.StringIO()
  w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
  w.writeheader()
  for row in table:
    rec = {"selection": row["selection"], "algorithm": row["algorithm"],
           "seeds": row["seeds"]}
    for c in cols:
      if c in row["cells"]:
        rec[f"{c}_mean"] = f"{row['cells'][c]['mean']:.6f}"
        rec[f"{c}_std"] = f"{row['cells'][c]['std']:.6f}"
    w.writerow(rec)
  return buf.getvalue()


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
