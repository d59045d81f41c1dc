"""One tuning protocol for every comparison (DomainBed's, Gulrajani & Lopez-Paz 2021 §4).

Every method of a comparison, baselines included, gets **the same number of trials**:
the first trial is the method's starting values (the task's / paper's settings), trials
``1 .. trials-1`` are random points of its registered search space
(``fedjax_inv.algorithms.hparams``, learning rates included), drawn from ``search_seed``.
Each trial runs on the **tuning seeds**; the trial with the best mean **validation** score
(a held-out split of the training clients, :func:`fedjax_inv.tasks.with_validation`;
never the OOD / test sets) is selected, and only then run on the **report seeds**, which
must be disjoint from the tuning seeds. Everything is written as raw per-run JSON files,
so a table can be regenerated from them (:func:`load_row`, :func:`markdown_table`).

Layout of a row folder (``out``)::

    protocol.json                 task, rounds, budget, seeds, selection rule, spaces
    runs/<algorithm>/tune-<i>-seed<s>.json     one tuning run (point, final, history)
    runs/<algorithm>/report-seed<s>.json       one reported run of the selected point
    selected.json                 {algorithm: {trial, point, score}}

A row folder is resumable: a run whose file exists with the same settings is not run
again (a killed background job picks up where it stopped).
"""
from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import platform
import sys
import time
from typing import Any, Optional

import numpy as np

from fedjax_inv.runner import outputs

SELECTION = {"binary": ("val_mean_client_accuracy", "max"),
             "multiclass": ("val_mean_client_accuracy", "max"),
             "regression": ("val_mse", "min")}


@dataclasses.dataclass(frozen=True)
class Protocol:
  """The tuning budget and seeds of one comparison; the same for every method in it.

  Attributes:
    trials: trials per method (the first at its starting values, the rest random), >= 1;
      with 1 nothing is tuned and nothing runs on the tuning seeds.
    tuning_seeds: seeds the trials run on (data draw, split, init, sampling).
    report_seeds: seeds of the reported runs; disjoint from ``tuning_seeds``.
    search_seed: seeds the random points (DomainBed's ``hparams_seed``).
    val_fraction: validation share of each training client (:func:`with_validation`).
    exclude: names never searched (they keep the starting value), for every method.
    space: ``{name: hparams.Range}`` added to / replacing every method's space.
  """
  trials: int
  tuning_seeds: tuple
  report_seeds: tuple
  search_seed: int = 0
  val_fraction: float = 0.1
  exclude: tuple = ()
  space: dict = dataclasses.field(default_factory=dict)

  def check(self) -> None:
    """Raises ValueError naming the bad field and the fix."""
    if isinstance(self.trials, bool) or not isinstance(self.trials, int) or self.trials < 1:
      raise ValueError(f"trials={self.trials!r}; use an int >= 1 (the same for every "
                       "method of the comparison).")
    for name in ("tuning_seeds", "report_seeds"):
      seeds = getattr(self, name)
      if not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0
                          for s in seeds):
        raise ValueError(f"{name}={seeds!r}; give a non-empty tuple of ints >= 0.")
    both = sorted(set(self.tuning_seeds) & set(self.report_seeds))
    if both:
      raise ValueError(f"seeds {both} are both tuning and report seeds; selection must not "
                       "see a reported seed (e.g. tune on 100, 101 and report 0, 1, 2).")

  def describe(self) -> dict:
    return {"trials": self.trials, "tuning_seeds": list(self.tuning_seeds),
            "report_seeds": list(self.report_seeds), "search_seed": self.search_seed,
            "val_fraction": self.val_fraction, "exclude": list(self.exclude),
            "space": {k: f"{r.describe()} ({r.source})" for k, r in self.space.items()}}


def trial_points(algorithm: str, protocol: Protocol, fixed=()) -> list:
  """The ``protocol.trials`` points of ``algorithm``: ``{}`` (its starting values) then
  ``trials - 1`` random points of its search space (without ``protocol.exclude`` and
  ``fixed``). Raises ValueError from :func:`hparams.random_points`."""
  from fedjax_inv.algorithms import hparams as hp
  if protocol.trials == 1:
    return [{}]
  return [{}] + hp.random_points(algorithm, protocol.trials - 1, protocol.search_seed,
                                 exclude=tuple(protocol.exclude) + tuple(fixed),
                                 space=protocol.space)


def _score(final: Optional[dict], kind: str) -> float:
  """Selection score (higher is better); -inf for a diverged run. A personalized method
  (Ditto) is scored on the models it deploys: ``personal_val_mean_client_accuracy``,
  each client's personal model on its own validation rows
  (``fedjax_inv.runner.simulation.personal_metrics``), where a global-model method is scored on
  ``val_mean_client_accuracy``, the global model on the same rows."""
  key, sense = SELECTION[kind]
  if final is None:
    return -math.inf
  if kind != "regression" and "personal_val_mean_client_accuracy" in final:
    key = "personal_val_mean_client_accuracy"
  if key not in final and key == "val_mean_client_accuracy":
    key = "val_accuracy"  # one training client: its validation accuracy
  v = float(final[key])
  return v if sense == "max" else -v


def _task(name, seed, task_kwargs, val_fraction):
  from fedjax_inv.tasks import make_task, with_validation
  return with_validation(make_task(name, seed=seed, **task_kwargs), val_fraction, seed)


def data_record(task) -> dict:
  """Where a run's data came from, for its raw record: ``spec.data_record``."""
  from fedjax_inv.runner import spec
  return spec.data_record(task)


# The label-skew tasks, whose clients come from Flower Datasets' partitioners since the
# commit after 080cef5; raw results from before say nothing of Flower in their data note.
LABEL_SKEW_TASKS = ("mnist_noniid", "fmnist_noniid", "cifar10_noniid", "fed_cmnist",
                    "fed_rotmnist")
FORMER_PARTITIONER = ("clients from the label partitioner used before Flower Datasets' "
                      "(commit 080cef5 rebuilds them; today's code draws other clients from "
                      "the same seeds)")


def partitioner_caveat(notes) -> str:
  """``''`` when every data note in ``notes`` (raw runs of a label-skew task) names Flower
  Datasets' partitioners, else :data:`FORMER_PARTITIONER`: results made before the switch
  are labelled, never silently mixed with today's clients. Missing notes count as before."""
  notes = list(notes)
  if notes and all(isinstance(n, str) and "Flower Datasets" in n for n in notes):
    return ""
  return FORMER_PARTITIONER


def _run_one(path: pathlib.Path, key: dict, task, algorithm: str, settings: dict,
             run_kw: dict, label: Optional[str] = None) -> dict:
  """Runs (or reloads, when ``path`` holds the same ``key``) one run through the executor
  of ``fedjax-inv run`` (``spec.run_record``); writes it atomically."""
  from fedjax_inv.runner import spec
  cfg = {"task": task.name, "algorithm": algorithm, "rounds": run_kw["rounds"],
         "eval_every": run_kw.get("eval_every"),
         "clients_per_round": run_kw.get("clients_per_round"),
         "execution": run_kw.get("execution")}
  return spec.run_record(path, key, {k: v for k, v in cfg.items() if v is not None},
                         key["seed"], task=task, overrides=settings, label=label)


def tune_row(out, *, task: str, algorithms, rounds: int, protocol: Protocol,
             base: Optional[dict] = None, fixed: Optional[dict] = None,
             task_kwargs: Optional[dict] = None, eval_every: Optional[int] = None,
             clients_per_round: Optional[int] = None, paper: Optional[dict] = None,
             notes: str = "", report_start: bool = True,
             extra_space: Optional[dict] = None, execution: str = "auto",
             stream=None) -> dict:
  """Tunes every algorithm of one comparison under ``protocol`` and runs the selected
  points on the report seeds; writes the row folder ``out`` (module docstring).

  Args:
    out: the row folder; new, empty, or one this function wrote before (resumed).
    task: task name (``fedjax-inv list``); built per seed with ``make_task(seed=s,
      **task_kwargs)`` plus a validation split (:func:`with_validation`).
    algorithms: names (``fedjax-inv list``), or ``{label: name}`` for a column that is a
      registered algorithm with other settings (``{'fedgma_fedprox': 'fedgma'}`` with
      ``fixed={'fedgma_fedprox': {'base': 'fedprox'}}``).
    rounds: rounds of every run.
    protocol: the :class:`Protocol` (budget, seeds), the same for every algorithm.
    base: ``{algorithm: {name: value}}`` starting values (the first trial; the random trials
      override the names they search); ``'*'`` applies to every algorithm.
    fixed: ``{algorithm: {name: value}}`` values never searched (``'*'``: every
      algorithm): part of the row's definition (e.g. the model's local steps).
    task_kwargs: extra ``make_task`` keywords.
    eval_every, clients_per_round: as ``simulation.run`` (reporting = the task's
      paper protocol).
    paper: the paper's numbers for the table, stored in ``protocol.json``.
    notes: free text stored in ``protocol.json``.
    extra_space: ``{label: {name: Range}}`` added to one column's space (FedGMA on
      FedProx also searches FedProx's μ).
    execution: the execution strategy of every run (``fedjax-inv run --execution``;
      default 'auto', the one measured fastest): pin one (e.g. 'scan') so that a re-run
      computes with the same arithmetic whatever the machine measures.
    report_start: also run the first trial (the starting values: the paper's settings, tuned by
      nobody here) on the report seeds when another trial was selected, so a table can
      show both (``runs/<algorithm>/report-starting-seed<s>.json``).

  Returns:
    :func:`load_row` of ``out``.

  Raises:
    ValueError: a bad protocol (overlapping seeds, trials < 1), an unknown algorithm or
      task, or ``out`` a non-empty folder that this function did not write; nothing is run
      then.
  """
  stream = stream or sys.stdout
  protocol.check()
  from fedjax_inv.runner import config
  config.check_run_config({"execution": execution})
  names = _column_names(algorithms)
  algos = list(names)
  task_kwargs = dict(task_kwargs or {})
  out, points, spaces, first = _checked_plan(out, task, names, protocol, base, fixed,
                                             task_kwargs, extra_space)
  kind = first.kind
  sel_key, sense = SELECTION[kind]
  _write_protocol(out, {
      "task": task, "task_kwargs": task_kwargs, "algorithms": algos,
      "registry_names": names, "rounds": rounds,
      "eval_every": eval_every, "clients_per_round": clients_per_round,
      "execution": execution, "protocol": protocol.describe(), "kind": kind,
      "selection": f"{sense} {sel_key} at the final round, mean over the tuning seeds "
                   "(held-out split of the training clients; never the OOD/test sets)",
      "base": {a: _pick(base, a) for a in algos},
      "fixed": {a: _pick(fixed, a) for a in algos},
      "points": points, "spaces": spaces, "paper": paper or {}, "notes": notes})
  row = _Row(out, rounds, dict(rounds=rounds, eval_every=eval_every,
                               clients_per_round=clients_per_round, execution=execution,
                               progress=False),
             task, task_kwargs, protocol.val_fraction, {protocol.tuning_seeds[0]: first},
             kind, stream)
  _run_columns(row, names, points, base, fixed, protocol, report_start)
  return load_row(out)


def _pick(d: Optional[dict], a: str) -> dict:
  """``d['*']`` updated with ``d[a]`` (``{}`` where absent): a column's base / fixed values."""
  return {**(d or {}).get("*", {}), **(d or {}).get(a, {})}


def _column_names(algorithms) -> dict:
  """``{label: registry name}`` from names, a comma-separated string, or such a dict."""
  if isinstance(algorithms, str):
    algorithms = [a.strip() for a in algorithms.split(",")]
  return dict(algorithms) if isinstance(algorithms, dict) else {a: a for a in algorithms}


def _checked_plan(out, task: str, names: dict, protocol: Protocol, base, fixed,
                  task_kwargs: dict, extra_space) -> tuple:
  """Every check before a row writes anything; ``(out, points, spaces, first seed's task)``."""
  from fedjax_inv.algorithms import hparams as hp
  own = {a: dataclasses.replace(protocol, space={**protocol.space,
                                                 **(extra_space or {}).get(a, {})})
         for a in names}
  points = {a: trial_points(names[a], own[a], fixed=_pick(fixed, a)) for a in names}
  spaces = {a: {k: f"{r.describe()} ({r.source})"
                for k, r in {**hp.search_space(names[a]), **own[a].space}.items()
                if k not in set(protocol.exclude) | set(_pick(fixed, a))} for a in names}
  out = pathlib.Path(out)
  if out.exists() and any(out.iterdir()) and not (out / outputs.MARKER).exists():
    raise ValueError(f"{str(out)!r} is a non-empty folder that fedjax-inv did not write; "
                     "choose a new or empty folder (nothing was changed).")
  first = _task(task, protocol.tuning_seeds[0], task_kwargs, protocol.val_fraction)
  from fedjax_inv.algorithms import make_algorithm
  for a in names:  # every setting builds (bad names / values fail here, before any run)
    for p in points[a]:
      make_algorithm(names[a], **first.algorithm_settings(
          names[a], {**_pick(base, a), **_pick(fixed, a), **p}))
  return out, points, spaces, first


def _write_protocol(out: pathlib.Path, record: dict) -> None:
  """Marks ``out`` as a row folder; writes ``protocol.json``: ``record``, machine, command."""
  out.mkdir(parents=True, exist_ok=True)
  (out / outputs.MARKER).write_text("written by fedjax-inv tuning\n")
  outputs.write_json(out / "protocol.json", {
      **record,
      "machine": {"platform": platform.platform(), "processor": platform.processor(),
                  "python": platform.python_version()},
      "command": " ".join(sys.argv)})


@dataclasses.dataclass
class _Row:
  """What every run of a row shares: folder, rounds, run keywords, tasks per seed, stream."""
  out: pathlib.Path
  rounds: int
  run_kw: dict
  task: str
  task_kwargs: dict
  val_fraction: float
  tasks: dict
  kind: str
  stream: Any

  def task_for(self, seed: int):
    """The task of ``seed`` with its validation split, built once."""
    if seed not in self.tasks:
      self.tasks[seed] = _task(self.task, seed, self.task_kwargs, self.val_fraction)
    return self.tasks[seed]

  def run(self, a: str, name: str, file: str, trial: int, point: dict, settings: dict,
          seed: int) -> dict:
    """Runs (or reloads) one run of column ``a`` into ``runs/<a>/<file>``."""
    return _run_one(self.out / "runs" / a / file,
                    {"trial": trial, "point": point, "seed": seed, "settings": settings,
                     "rounds": self.rounds}, self.task_for(seed), name, settings,
                    self.run_kw, a)


def _run_columns(row: _Row, names: dict, points: dict, base, fixed, protocol: Protocol,
                 report_start: bool) -> None:
  """Tunes, selects (``selected.json``) and reports every column, one after another."""
  sense = SELECTION[row.kind][1]
  selected = {}
  for a in names:
    start = {**_pick(base, a), **_pick(fixed, a)}
    scores = _tune_column(row, a, names[a], points[a] if protocol.trials > 1 else [],
                          start, protocol.tuning_seeds)
    best, selected[a] = _selected_entry(scores, points[a], sense)
    outputs.write_json(row.out / "selected.json", selected)
    reported = [("", best)] + ([("starting-", 0)] if report_start and best != 0 else [])
    _report_column(row, a, names[a], points[a], start, reported, protocol.report_seeds)


def _tune_column(row: _Row, a: str, name: str, points: list, start: dict,
                 seeds: tuple) -> list:
  """Runs each point on the tuning ``seeds``; the mean score of each (higher is better)."""
  sel_key = SELECTION[row.kind][0]
  scores = []
  for i, p in enumerate(points):
    settings = {**start, **p}
    per_seed = []
    for s in seeds:
      t0 = time.perf_counter()
      rec = row.run(a, name, f"tune-{i:02d}-seed{s}.json", i, p, settings, s)
      per_seed.append(_score(rec["final"], row.kind))
      final = rec["final"]
      shown = ("diverged" if final is None
               else round(final.get(sel_key, final.get("val_accuracy", float("nan"))), 4))
      print(f"  {a:16s} trial {i:2d} seed {s}: {sel_key}={shown}"
            f" {json.dumps(p)} ({time.perf_counter() - t0:.0f}s)", file=row.stream, flush=True)
    scores.append(float(np.mean(per_seed)))
  return scores


def _selected_entry(scores: list, points: list, sense: str) -> tuple:
  """``(best trial, its selected.json entry)`` from a column's mean tuning scores."""
  if scores:
    best = int(np.argmax(scores))  # ties: the lowest trial index
    return best, {"trial": best, "point": points[best],
                  "score": scores[best] if sense == "max" else -scores[best],
                  "scores": [s if sense == "max" else -s for s in scores]}
  # one trial: nothing to select, so nothing runs on the tuning seeds
  return 0, {"trial": 0, "point": {}, "score": None, "scores": []}


def _report_column(row: _Row, a: str, name: str, points: list, start: dict,
                   reported: list, seeds: tuple) -> None:
  """Runs each ``(file prefix, trial)`` of ``reported`` on the report ``seeds``."""
  for prefix, trial in reported:
    settings = {**start, **points[trial]}
    for s in seeds:
      t0 = time.perf_counter()
      rec = row.run(a, name, f"report-{prefix}seed{s}.json", trial, points[trial], settings,
                    s)
      print(f"  {a:16s} report {prefix}seed {s}: {outputs.final_line(rec['final'])}"
            f" ({time.perf_counter() - t0:.0f}s)", file=row.stream, flush=True)


def load_row(out) -> dict:
  """A row folder as ``{'protocol': ..., 'selected': ..., 'report': {algorithm: [run
  records of the selected trial, in report-seed order]}, 'starting': {algorithm: [the
  same for the first trial, the starting values]}, 'tune': {algorithm: [records]}}``.

  Raises:
    FileNotFoundError: ``out`` has no ``protocol.json`` / ``selected.json``.
  """
  out = pathlib.Path(out)
  proto = json.loads((out / "protocol.json").read_text())
  selected = json.loads((out / "selected.json").read_text())
  rep, start, tune = {}, {}, {}
  for a in proto["algorithms"]:
    d = out / "runs" / a
    seeds = proto["protocol"]["report_seeds"]
    rep[a] = [json.loads((d / f"report-seed{s}.json").read_text()) for s in seeds
              if (d / f"report-seed{s}.json").is_file()]
    start[a] = rep[a] if selected.get(a, {}).get("trial") == 0 else [
        json.loads((d / f"report-starting-seed{s}.json").read_text()) for s in seeds
        if (d / f"report-starting-seed{s}.json").is_file()]
    tune[a] = [json.loads(f.read_text()) for f in sorted(d.glob("tune-*.json"))]
  return {"protocol": proto, "selected": selected, "report": rep, "starting": start,
          "tune": tune}


def mean_std(values) -> tuple:
  """``(mean, std)`` over seeds: :func:`fedjax_inv.runner.outputs.mean_std` (the project's one
  convention: sample std, ddof 1, over the finite values)."""
  return outputs.mean_std(values)


def metric_values(runs: list, metric: str) -> list:
  """The ``metric`` of each run: a key of ``final``, ``'<key>|<fallback>'`` (the first of
  the keys that ``final`` has: e.g. a personalized method's
  ``personal_val_mean_client_accuracy``, else the global model's), or
  ``'last_k_mean:<key>'`` / ``'selected:<rule>:<key>'`` for the paper-protocol records;
  None for a diverged run."""
  out = []
  for r in runs:
    if r.get("final") is None:
      out.append(None)
    elif metric.startswith("last_k_mean:"):
      out.append(r["last_k_mean"][metric.split(":", 1)[1]])
    elif metric.startswith("selected:"):
      rule, key = metric.split(":", 1)[1].rsplit(":", 1)  # a rule may hold a colon
      out.append(r["selected"][rule][key])
    elif "|" in metric:
      out.append(next(r["final"][k] for k in metric.split("|") if k in r["final"]))
    else:
      out.append(r["final"][metric])
  return out


def markdown_table(row: dict, metrics: dict, *, digits: int = 3, scale: float = 1.0,
                   show: Optional[list] = None,
                   variants=("report",)) -> str:
  """Paper-vs-ours markdown table of a row (:func:`load_row`).

  Args:
    metrics: ``{column title: metric}`` (see :func:`metric_values`); the paper's value
      is ``protocol['paper'][algorithm][column title]`` when present.
    scale: multiplies our values (100 for percent).
    show: the hyperparameter names to print for each point (default: the searched ones).
    variants: which reported runs, one table row each: ``'report'`` (the trial selected
      on validation) and/or ``'starting'`` (the first trial, the starting values).
  """
  proto = row["protocol"]
  paper = proto.get("paper", {})
  head = ["algorithm", "hyperparameters (trial)"]
  for title in metrics:
    head += [f"{title} (paper)", f"{title} (ours)"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  label = {"report": "selected on validation", "starting": "starting values"}
  for a in proto["algorithms"]:
    for var in variants:
      runs = row[var][a]
      trial = row["selected"][a]["trial"] if var == "report" else 0
      names = show if show is not None else list(proto["spaces"][a])
      hp = runs[0]["hparams"] if runs else {}
      cells = [a if len(variants) == 1 else f"{a}, {label[var]}",
               ", ".join(f"{k}={_fmt(hp[k])}" for k in names if k in hp) + f" ({trial})"]
      for title, metric in metrics.items():
        pv = paper.get(a, {}).get(title)
        cells.append("–" if pv is None else str(pv))
        vals = metric_values(runs, metric)
        cells.append("not run" if not vals else
                     outputs.format_mean_std(vals, digits, scale))
      lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def _fmt(v) -> str:
  if isinstance(v, float):
    return f"{v:.3g}"
  return str(v)


def per_seed_table(row: dict, metric: str, digits: int = 3, scale: float = 1.0,
                   variant: str = "report") -> str:
  """``| algorithm | seed s ... |`` of one metric: the raw numbers behind a table."""
  seeds = row["protocol"]["protocol"]["report_seeds"]
  lines = ["| algorithm | " + " | ".join(f"seed {s}" for s in seeds) + " |",
           "|---|" + "---|" * len(seeds)]
  for a in row["protocol"]["algorithms"]:
    vals = metric_values(row[variant][a], metric)
    lines.append(f"| {a} | " + " | ".join("diverged" if v is None else
                                          f"{v * scale:.{digits}f}" for v in vals) + " |")
  return "\n".join(lines)
