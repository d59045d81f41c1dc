"""One experiment = task × algorithms × seeds, written to ``runs/<name>/``.

Layout of the output directory (nothing is lost when a run dies):
  .fedjax-inv-run   marker: this folder was written by fedjax-inv (only such a folder is
                    ever replaced, and only with --overwrite)
  config.json       the resolved config (written first; ``--resume`` reads it)
  summary.json      single run: {task, algorithm, seed, rounds, num_clients, status,
                    final, selected, last_k_mean, reporting, ...}; several: the same keys
                    per run under ``runs`` plus ``table``; both with ``status`` ('ok' |
                    'diverged' | 'interrupted'), ``provenance`` (versions, git commit,
                    device, command) and ``config`` (``--config summary.json`` reruns it)
  <algorithm>/seed<s>/summary.json   written as soon as that run ends (``status``,
                    ``diverged_round`` for a diverged run, ``timing``: data loading,
                    compile, first round and per-round seconds); with ``--holdout``:
                    ``<algorithm>/h<domain>/seed<s>/`` (and ``lodo_selected``)
  <algorithm>/seed<s>/checkpoint/    the current run's state (``--checkpoint-every``)
  metrics.jsonl     one line per evaluated round (with ``algorithm``, ``seed`` and, with
                    ``--holdout``, ``holdout``), appended as each evaluation completes
  --holdout:        summary.json / results.md / results.csv hold the leave-one-domain-out
                    tables (``fedjax_inv.runner.lodo.result_from_runs``: a column per held-out
                    domain, a table per selection method); no curves.png
  results.md/.csv   mean ± std over seeds per algorithm: last round, and (when the run's
                    reporting asks) at each selected round (``<metric>@<rule>``) and the
                    last-k mean (``<metric>@last<k>``)
  curves.png        train (dashed) vs OOD (solid) accuracy over rounds
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import pathlib
import sys
import time
from typing import Any, Optional

import jax

from fedjax_inv.runner import outputs
from fedjax_inv.core import xla_cpu


def _final_metrics(task) -> list[str]:
  metric = "mse" if task.kind == "regression" else "accuracy"
  names = [f"train_{metric}"] + [f"{s}_{metric}" for s in task.eval_sets]
  return names + ["train_loss"] + [f"{s}_loss" for s in task.eval_sets]


def _personal_columns(runs: list) -> list[str]:
  """With a personalized algorithm (Ditto) among ``runs``: its personal models' mean
  per-client accuracy on their own validation rows and training data, beside the global
  model's mean per-client validation accuracy (Ditto's reported metric, averaged over
  clients). Empty otherwise."""
  names = ("val_mean_client_accuracy", "personal_val_mean_client_accuracy",
           "personal_train_mean_client_accuracy")
  if not any(k.startswith("personal_") for r in runs for k in (r.get("final") or {})):
    return []
  return [k for k in names if any(k in (r.get("final") or {}) for r in runs)]


def run_reporting(cfg: dict, task):
  """The ``Reporting`` of a run (``fedjax_inv.eval.reporting``): the task's default
  (``for_task``) unless ``cfg['reporting']`` is 'none', then ``cfg['select']``
  (comma-separated rules such as 'min:ood_loss', or 'none') and ``cfg['last_k']``
  (rounds to average at the end; 0 = off) override it.

  Raises:
    ValueError: a bad rule, ``last_k`` or ``reporting`` value (before any compile).
  """
  import dataclasses
  from fedjax_inv.eval import reporting as rlib
  mode = str(cfg.get("reporting") or "auto").lower()
  if mode not in ("auto", "none"):
    raise ValueError(f"reporting={cfg.get('reporting')!r}; use 'auto' (the task's paper "
                     "protocol) or 'none'.")
  rep = rlib.resolve(mode, task)
  changes = {}
  if cfg.get("select") is not None:
    sel = str(cfg["select"]).strip()
    changes["select"] = () if sel.lower() in ("", "none") else sel
  if cfg.get("last_k") is not None:
    changes["last_k"] = cfg["last_k"]
  return dataclasses.replace(rep, **changes) if changes else rep


def report_columns(task, rep, rounds: int) -> tuple[list[str], list[str]]:
  """Table columns for the run's reporting: (all, printed). Per selection rule the
  evaluation sets' accuracy (or MSE), the rule's own metric, the ranking metrics
  (continuous and FedILC's thresholded variant) and the fairness metrics at that round;
  for ``last_k`` every set's accuracy over the last ``min(last_k, rounds)`` rounds. The
  printed subset keeps the 'ood' (or first evaluation) set's numbers.

  Args:
    task: the ``Task``; rep: its ``Reporting``; rounds: rounds per run.

  Returns:
    ``(columns, printed)``: lists of ``fedjax_inv.eval.reporting.column_value`` names.
  """
  metric = "mse" if task.kind == "regression" else "accuracy"
  sets = list(task.eval_sets)
  main = "ood" if "ood" in sets else (sets[0] if sets else "train")
  cols, printed = [], []
  for rule in rep.select:
    target = rule.split(":", 1)[1]
    extra = [f"{s}_{m}" for s in rep.ranking
             for m in ("auroc", "auprc", "auroc_thresholded", "auprc_thresholded")]
    extra += [f"{s}_accuracy_{m}" for s in list(rep.fairness) + list(rep.fairness_groups)
              for m in ("variance", "entropy")]
    here = [f"{s}_{metric}" for s in sets] + [target] + extra
    cols += [f"{m}@{rule}" for m in dict.fromkeys(here)]
    printed += [f"{main}_{metric}@{rule}"] + [f"{main}_{m}@{rule}" for m in ("auroc",)
                                              if main in rep.ranking]
  if rep.last_k:
    k = min(rep.last_k, rounds)
    cols += [f"{s}_{metric}@last{k}" for s in ["train"] + sets]
    printed += [f"{main}_{metric}@last{k}"]
  return cols, printed


def provenance() -> dict:
  """What produced a result: package / jax / flax / optax / numpy versions, the git
  commit of the source tree when it is a git checkout (``None`` otherwise), the Python
  version, the devices and the command line. Never raises."""
  import importlib.metadata as md
  import platform
  import subprocess
  import fedjax_inv
  versions = {"fedjax_inv": getattr(fedjax_inv, "__version__", None)}
  for name in ("jax", "jaxlib", "flax", "optax", "numpy"):
    try:
      versions[name] = md.version(name)
    except md.PackageNotFoundError:
      versions[name] = None
  commit = dirty = None
  src = pathlib.Path(fedjax_inv.__file__).resolve().parent
  try:
    commit = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True,
                            text=True, timeout=5).stdout.strip() or None
    if commit:
      dirty = bool(subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--",
                                   "."], capture_output=True, text=True,
                                  timeout=5).stdout.strip())
  except (OSError, subprocess.SubprocessError):
    pass
  devs = jax.devices()
  return {"versions": versions, "git_commit": commit, "git_dirty": dirty,
          "python": platform.python_version(),
          "device": {"backend": jax.default_backend(), "count": len(devs),
                     "kind": getattr(devs[0], "device_kind", str(devs[0]))},
          "command": " ".join(sys.argv)}


def default_out(task_name: str, algos) -> pathlib.Path:
  """``runs/<task>-<algorithms>-<YYYYmmdd-HHMMSS>-<pid>-<8 random hex digits>``: unique
  even for two runs started in the same second (2**32 suffixes: a clash among 50 names
  has probability ~3e-7; the folder is then created with ``exist_ok=False``, so a clash
  is an error, never an overwrite)."""
  import secrets
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  return pathlib.Path("runs") / (f"{task_name}-{'+'.join(algos)}-{stamp}-"
                                 f"{os.getpid() % 100000}-{secrets.token_hex(4)}")


def split_overrides(overrides: dict | None, algos) -> dict:
  """Per-algorithm hyperparameters from the user's ``overrides``: a plain key (``mu``)
  applies to every algorithm, a scoped key (``fedprox.mu``) only to that algorithm and
  wins over the plain one. Returns ``{algorithm: {name: value}}``.

  Raises:
    ValueError: a scope that names no algorithm of this run.
  """
  plain = {k: v for k, v in (overrides or {}).items() if "." not in k}
  out = {a: dict(plain) for a in algos}
  for k, v in (overrides or {}).items():
    if "." in k:
      scope, name = k.split(".", 1)
      if scope not in out or not name:
        raise ValueError(f"--hp {k}={v!r}: {scope!r} is not an algorithm of this run "
                         f"({', '.join(algos)}); use ALGORITHM.NAME=VALUE with one of "
                         "them, or NAME=VALUE for all.")
      out[scope][name] = v
  return out


def check_hparams(name: str, values: dict, scoped: bool = False, flag: str = "--hp") -> None:
  """Checks user-set hyperparameters of algorithm ``name`` against the hyperparameter
  schema (``fedjax_inv.algorithms.schema.check_values``: kind and range of every name;
  names it does not know are left to ``make_algorithm``), before any data is loaded.

  Raises:
    ValueError: names the flag, the hyperparameter, the value, the algorithm and what
      is allowed, e.g. ``--sweep mu=-1 (fedprox): must be >= 0 ...``.
  """
  from fedjax_inv.algorithms.schema import check_values
  check_values(values, f"{flag} {name + '.' if scoped else ''}", algorithm=name)


def run_experiment(cfg: dict, progress: bool = True, overrides=None,
                   stream=None, write: bool = True) -> dict:
  """Runs every (algorithm, seed[, held-out domain]) of ``cfg`` and writes the results
  directory.

  ``cfg`` keys: see ``fedjax_inv.runner.config.RUN_KEYS`` (checked by
  ``fedjax_inv.runner.config.check_run_config``); also ``reporting`` ('auto' | 'none'), ``select``
  and ``last_k`` (:func:`run_reporting`), ``overwrite``, ``checkpoint_every`` (save the
  current run's state every N rounds in ``<algorithm>/seed<s>/checkpoint/``, or a
  batch's in ``<algorithm>/batch-<hash>/checkpoint/``) and ``resume`` (a folder of an
  earlier, interrupted run of the same config: finished runs are kept, the current one
  continues from its checkpoint, the others run), ``holdout`` ('all' or comma-separated
  domains: leave-one-domain-out, one more axis of the runs; every other key works with
  it) and ``validation`` (its training-domain validation: 'mean' | 'pooled').
  ``overrides``: algorithm hyperparameters set by the user (they win over the task's
  defaults; ``ALGORITHM.NAME`` keys apply to one algorithm, :func:`split_overrides`).
  ``write=False``: a process other than 0 of a run over several processes (``fedjax-inv
  run --coordinator``): it computes every run with process 0 but writes nothing, except
  its part of the checkpoints in ``out``, a folder every process shares; with ``resume``
  it reads the finished runs from there (every process must see the same ones).

  Three steps: :func:`plan_experiment` (every check, the runs; nothing written or
  compiled), :func:`open_output` (the folder, ``config.json``, the finished runs of a
  resumed attempt), ``fedjax_inv.runner.executor.execute`` (each group of runs batched as one
  program or one after another, with the reason), then the summary files. Outputs are streamed:
  ``metrics.jsonl`` gets a line per evaluation, ``<algorithm>/seed<s>/summary.json`` is
  written when a run ends, the aggregate files when all end (or on Ctrl-C). A run whose
  train objective becomes non-finite is recorded with ``status: 'diverged'`` and its
  first bad round; the others go on.

  Returns:
    the summary dict; ``summary['status']`` is 'ok', or 'diverged' when a run diverged.

  Raises:
    ValueError: bad config / output folder (nothing written).
    KeyboardInterrupt: re-raised after the finished runs were written
      (``summary['status'] == 'interrupted'``).
  """
  stream = stream or sys.stdout
  from fedjax_inv.runner import executor
  pl = plan_experiment(cfg, overrides)
  if cfg.get("dry_run"):
    return dry_run(pl, stream)
  if not write:
    return _follow(pl, progress, stream)
  out, done = open_output(pl, stream)
  from fedjax_inv.runner import loggers
  logs = loggers.make_loggers(cfg.get("log") or [], out)
  rec = executor.Recorder(pl, out, stream)
  ex = executor.Execution.start(pl)  # kept when interrupted: its notes go in the summary
  t0 = time.perf_counter()
  try:
    executor.execute(pl, out, done, rec, progress, stream, ex=ex, loggers=logs)
  except KeyboardInterrupt:
    rec.status = "interrupted"
  finally:
    loggers.close_all(logs)
  summary = write_summary(pl, out, rec, stream, ex)
  print(f"\nwrote {out}/ (summary.json, metrics.jsonl, results.md"
        f"{'' if pl.has_holdouts else ', curves.png'}) in "
        f"{time.perf_counter() - t0:.0f}s" + ("" if rec.status == "ok" else
                                              f"; status: {rec.status}"), file=stream)
  if rec.status == "interrupted":
    raise KeyboardInterrupt(str(out))
  return summary


def task_line(pl) -> str:
  """The line describing the run's task: clients, sizes, evaluation sets, data, where
  its training pool lives (``simulation.pool_plan``) and the held-out domains."""
  from fedjax_inv.runner import simulation
  task = pl.task
  sizes = [int(v) for v in task.train.n]
  sizes_txt = (f"sizes {sizes}" if len(sizes) <= 20 else
               f"sizes {min(sizes)}..{max(sizes)}, median {sorted(sizes)[len(sizes) // 2]}")
  plan = simulation.pool_plan(task, pl.cfg.get("pool") or "auto")
  return (f"task {task.name}: {task.train.num_clients} training clients "
          f"({sizes_txt}), eval sets {list(task.eval_sets)}; "
          f"data: {task.info.get('data_note', task.info.get('dataset_source', 'generated'))}"
          f"; pool on the {plan['residency']} (packed {plan['packed_mb']:,.0f} MB, padded "
          f"{plan['padded_mb']:,.0f} MB: {plan['reason']})"
          + (f"; held-out domains {pl.holdouts} of {pl.domains}" if pl.domains else ""))


def dry_run(pl, stream) -> dict:
  """``fedjax-inv run --dry-run``: the plan, checked and printed (the task line with
  both pool layouts' memory, and the runs); nothing trained, compiled or written.
  Returns ``{'status': 'dry-run', 'runs': N, 'pool': pool_plan(...)}``."""
  from fedjax_inv.runner import simulation
  runs = sum(len(pl.labels[a]) for a in pl.algos) * len(pl.seeds) * len(pl.holdouts)
  print(task_line(pl), file=stream)
  print(f"{runs} run(s): {', '.join(pl.algos)} x {len(pl.seeds)} seed(s), "
        f"{pl.rounds} rounds of {pl.cohort} clients; nothing run (--dry-run)", file=stream)
  return {"status": "dry-run", "runs": runs,
          "pool": simulation.pool_plan(pl.task, pl.cfg.get("pool") or "auto")}


def _follow(pl, progress, stream) -> dict:
  """:func:`run_experiment` with ``write=False``: the runs of ``pl`` not finished in
  ``pl.out`` (read with ``--resume``), computed with the other processes; checkpoints in
  ``pl.out``, nothing else written. Returns ``{'status': ...}``.

  Raises:
    ValueError: the processes see different finished runs in ``pl.out`` (not one shared
      folder).
  """
  from fedjax_inv.runner import executor
  done = _finished(pl, pl.out)
  rec = executor.Recorder(pl, None, stream)
  executor.execute(pl, None, done, rec, progress, stream, checkpoint_root=pl.out)
  return {"status": rec.status}


def _finished(pl, folder) -> dict:
  """The runs of ``pl`` a resumed attempt finished in ``folder`` (``{}`` without
  ``--resume``; ``executor.load_finished``). Over several processes every process calls
  this (process 0 from :func:`open_output`, the others from :func:`_follow`) and they
  check with one all-gather that they found the same number.

  Raises:
    ValueError: the processes found different numbers (``folder`` is not shared).
  """
  from fedjax_inv.runner import executor
  from fedjax_inv.core import multihost
  done = executor.load_finished(folder, [(a, s, h) for a in pl.names for h in pl.holdouts
                                         for s in pl.seeds]) if pl.resume else {}
  multihost.agree(len(done), f"the number of finished runs in {folder}",
                  "give --out a folder on a file system every process shares")
  return done


def _sweep_points(cfg: dict, algos, per_algo: dict):
  """``(specs, points, search_info)`` of ``--sweep`` / ``--search`` per algorithm (one
  point ``{}`` without either), every point checked (:func:`check_hparams`)."""
  from fedjax_inv.runner import grid
  parsed = grid.parse_sweep(cfg.get("sweep"))
  for scope in parsed:
    if scope is not None and scope not in algos:
      raise ValueError(f"--sweep {scope}.…: {scope!r} is not an algorithm of this run "
                       f"({', '.join(algos)}).")
  specs = {a: grid.spec_for(parsed, a) for a in algos}
  pts = {a: grid.points(specs[a]) for a in algos}
  search_info = None
  if cfg.get("search"):  # random search from the registry (algorithms/hparams.py)
    if cfg.get("sweep"):
      raise ValueError("--search and --sweep both given; use one (--search draws its "
                       "points from `fedjax-inv hparams ALGORITHM`'s search space).")
    from fedjax_inv.algorithms import hparams as hparams_lib
    n, sseed = int(cfg["search"]), int(cfg.get("search_seed") or 0)
    pts = {a: hparams_lib.random_points(a, n, sseed, exclude=per_algo[a]) for a in algos}
    search_info = {a: {"points": n, "seed": sseed, "space": {
        k: f"{r.describe()} ({r.source})" for k, r in hparams_lib.search_space(a).items()
        if k not in per_algo[a]}} for a in algos}
  for a in algos:
    clash = sorted(set(specs[a]) & set(per_algo[a]))
    if clash:
      raise ValueError(f"{clash} ({a}) given both in --sweep and as a fixed value (--hp, "
                       "--lr, ...); give each name once.")
    for p in pts[a]:
      check_hparams(a, p, flag="--search" if cfg.get("search") else "--sweep")
  return specs, pts, search_info


def run_transform(cfg: dict, task, cohort: int, rounds: int):
  """``Algorithm -> Algorithm`` for the run-level settings that change every algorithm of
  the run the same way: client-level DP (``--dp-*``: ``fedjax_inv.privacy.client_dp.apply``, with
  sigma solved from ``--dp-target-epsilon``), sample-level DP-SGD (``--dp-sgd-*``:
  ``fedjax_inv.privacy.dp_sgd.apply``), ``--client-sampling``, and attacks,
  participation and bucketing (``--attack``, ``--dropout``, ...:
  ``fedjax_inv.aggregation.robust.configure``).

  Raises:
    ValueError: an unreachable ``--dp-target-epsilon`` (before any compile)."""
  from fedjax_inv.runner import config
  from fedjax_inv.privacy import dp_sgd, client_dp as privacy
  from fedjax_inv.aggregation import robust
  dp = config.dp_settings(cfg)
  sgd = config.dp_sgd_settings(cfg)
  n = task.train.num_clients
  rb = config.robustness_settings(cfg)
  num_classes = int(task.train.y.max()) + 1 if task.kind != "regression" else 0
  for k in ("attack", "participation"):  # checked once, before any algorithm is built
    if rb[k] is not None:
      rb[k] = rb[k].check()
  if rb["attack"] is not None and rb["attack"].name == "label_flip" and \
      task.kind == "regression":
    raise ValueError(f"--attack label_flip needs a classification task; {task.name!r} is "
                     "regression.")

  def robustness(alg):  # attacks, participation, bucketing; DP-SGD
    if sgd is not None:
      alg = dp_sgd.apply(alg, sgd)
    if rb["attack"] is None and rb["participation"] is None and rb["bucket"] is None:
      robust.check_cohort(alg.aggregator, cohort)  # Krum's C > 2f + 2
      return alg
    return robust.configure(alg, **rb, cohort=cohort, num_classes=num_classes,
                            kind=task.kind)
  if dp is not None:
    dp = privacy.resolve(dp, n, cohort, rounds)
    return lambda alg: robustness(privacy.apply(alg, dp, n, cohort))
  sampling = (cfg.get("client_sampling") or "fixed").lower()
  if sampling == "fixed":
    return robustness
  return lambda alg: robustness(alg.replace(
      client_sampling=sampling, hparams={**alg.hparams, "client_sampling": sampling}))


def _build_algorithms(algos, per_algo: dict, pts: dict, task, transform=lambda a: a):
  """``(plans, labels, built)``: per algorithm its ``sweep.Plan`` and run labels (the
  algorithm, or 'algorithm@name=value,...'), and every label's ``Algorithm``
  (``transform``, :func:`run_transform`, applied to each)."""
  from fedjax_inv.runner import grid
  from fedjax_inv.algorithms import make_algorithm
  plans, labels, built = {}, {}, {}
  for a in algos:
    make = lambda p, a=a: transform(make_algorithm(a, **task.algorithm_settings(  # noqa: E731
        a, {**per_algo[a], **p})))
    try:
      plans[a] = grid.plan(a, make, pts[a])
    except ValueError as e:
      if len(algos) > 1 and "unknown hyperparameters" in str(e):
        raise ValueError(f"{e} (with several algorithms, scope a value to one: "
                         f"--hp {a}.NAME=VALUE is ignored by the others)") from None
      raise
    labels[a] = [grid.label(a, p) for p in plans[a].points]
    built.update(zip(labels[a], plans[a].concrete))
  return plans, labels, built


@dataclasses.dataclass(frozen=True)
class Plan:
  """Every run of an experiment, checked (:func:`plan_experiment`); immutable.

  Attributes:
    cfg: the checked run configuration.
    algos: the algorithm names; ``labels[a]`` its run labels (one per sweep point),
      ``plans[a]`` its ``grid.Plan`` (the points, traced or one after another),
      ``built[label]`` the ``Algorithm`` of each label; ``names``: every label.
    seeds: the training seeds.
    task: the first task (built from ``cfg['task']``, or the ``Task`` object given);
      ``task_kwargs`` builds the others, ``task_load_seconds`` is how long it took
      (None for a given ``Task``).
    holdouts: the held-out domain names, or ``[None]``; ``domains``: all of the task's.
    validation: the leave-one-domain-out validation rule.
    split_seed / resplit: the data split of every seed, or one split per seed.
    rounds, eval_every, cohort: the schedule (cohort = clients per round).
    rep: the ``Reporting`` (selection rules, last-k means).
    resolved: the configuration written to ``config.json`` / ``summary.json``.
    search_info: ``--search``'s record, or None.
    replicas / batched: the ``--replicas`` mode and whether runs that can share one
      program are batched into it.
    devices_used: devices the client axis is sharded over.
    out / resume / overwrite: the output folder and its handling.
  """
  cfg: dict
  algos: list
  seeds: list
  task: Any
  holdouts: list
  domains: Any
  validation: str
  split_seed: int
  resplit: bool
  task_kwargs: dict
  task_load_seconds: Optional[float]
  rounds: int
  eval_every: Any
  cohort: int
  plans: dict
  labels: dict
  built: dict
  names: list
  rep: Any
  resolved: dict
  search_info: Any
  replicas: str
  batched: bool
  devices_used: int
  out: Optional[pathlib.Path]
  resume: Any
  overwrite: bool

  @property
  def has_holdouts(self) -> bool:
    """Whether the runs hold out domains (leave-one-domain-out)."""
    return self.holdouts != [None]


def plan_experiment(cfg: dict, overrides=None, *, task_kwargs=None, seeds=None,
                    resplit: bool = False, holdouts=None, task=None, reporting="auto"):
  """The planner of :func:`run_experiment` (and of ``fedjax_inv.runner.lodo.run_lodo``): checks
  everything (config, names, sizes, hyperparameters, sweep / search points, held-out
  domains, reporting) and builds the task and every run's ``Algorithm``, before any
  compile and before anything is written. The runs are every (label, seed, holdout):
  labels = algorithms or their sweep / search points, holdout = each ``--holdout``
  domain (``[None]`` without one).

  Args:
    cfg: the run config (``fedjax_inv.runner.config.RUN_KEYS``).
    overrides: algorithm hyperparameters (``NAME`` or ``ALGORITHM.NAME`` keys).
    task_kwargs: extra task-builder arguments (``n_per_domain``, ``image_size``, ...;
      ``seed`` = the data split seed, default ``cfg['seed']``); not ``holdout``.
    seeds: the training seeds (default ``cfg['seed']`` .. ``+ cfg['seeds'] - 1``).
    resplit: build each seed's task with ``seed = that seed`` (DomainBed's per-trial
      split) instead of one split for all seeds.
    holdouts: the held-out domains as a list of names or indices, or 'all' (default:
      parsed from ``cfg['holdout']``, where a domain name wins over an index).
    task: a ``Task`` object to run instead of building ``cfg['task']`` by name
      (``sweep.run_sweep``; not with held-out domains).
    reporting: 'auto' (from ``cfg``: :func:`run_reporting`), or the ``reporting``
      argument of ``simulation.run`` to use as given (a ``Reporting``, dict or None).

  Returns:
    the :class:`Plan` (immutable; the executor keeps its own state in an
    ``executor.Execution`` and never writes into the plan).

  Raises:
    ValueError: anything :func:`run_experiment` refuses.
  """
  from fedjax_inv.runner import config
  from fedjax_inv.core.engine import resolve_strategy
  from fedjax_inv.eval import reporting as rlib
  if not isinstance(cfg, config.CheckedConfig):  # the Python API: checked here, once
    cfg = config.check_run_config(cfg)
  algos = [a.strip() for a in str(cfg.get("algorithm", "fedavg")).split(",") if a.strip()]
  seed0 = int(cfg.get("seed") or 0)
  nseeds = int(cfg["seeds"]) if cfg.get("seeds") is not None else 1
  seeds = list(range(seed0, seed0 + nseeds)) if seeds is None else _check_seeds(seeds)
  resume = cfg.get("resume")
  if resume and not (pathlib.Path(resume) / "config.json").is_file():
    raise ValueError(f"--resume {str(resume)!r}: no config.json there; give the folder "
                     "of an earlier `fedjax-inv run`.")
  out = pathlib.Path(resume or cfg.get("out")) if resume or cfg.get("out") else None
  if (cfg.get("execution") or "auto") not in ("probe", "rule"):
    resolve_strategy(cfg.get("execution") or "auto", 1)
  # cfg's own lr / hp / ... keys count (API calls with a config dict), then ``overrides``
  derived = config.algorithm_overrides(cfg)
  extra_hp = [f"{k}={__import__('json').dumps(v)}" for k, v in (overrides or {}).items()
              if k not in derived or derived[k] != v]
  per_algo = split_overrides({**derived, **(overrides or {})}, algos)
  for a in algos:
    check_hparams(a, dict(per_algo[a]))
  _, pts, search_info = _sweep_points(cfg, algos, per_algo)
  tkw = {"data_dir": cfg.get("data_dir"), "source": cfg.get("source") or "auto",
         "download": bool(cfg.get("download")), **config.task_arguments(cfg),
         **(task_kwargs or {})}
  if "holdout" in tkw:
    raise ValueError("task_kwargs must not set 'holdout'; choose held-out domains with "
                     "--holdout (holdouts=...) instead.")
  split_seed = int(tkw.pop("seed", seed0))
  if task is not None and (holdouts is not None or cfg.get("holdout")):
    raise ValueError("a Task object and held-out domains: give the task by name to run "
                     "leave-one-domain-out.")
  given_task, t_load = task is not None, time.perf_counter()
  task, domains, holdouts = ((task, None, [None]) if task is not None else
                             _plan_task(cfg, tkw, split_seed, holdouts))
  t_load = time.perf_counter() - t_load

  def given(key, default):  # None = not given; 0 was refused by check_run_config
    return default if cfg.get(key) is None else cfg[key]
  rounds = int(given("rounds", task.defaults.get("rounds", 100)))
  eval_every = given("eval_every", task.defaults.get("eval_every"))
  cohort = _cohort(cfg, task, domains)
  from fedjax_inv.runner import executor, simulation
  if jax.process_count() > 1:
    _check_multiprocess(cfg)
  mesh = simulation.device_mesh(executor.shard_of(cfg), cohort)  # checked before compiling
  plans, labels, built = _build_algorithms(algos, per_algo, pts, task,
                                           run_transform(cfg, task, cohort, rounds))
  if isinstance(reporting, str) and reporting == "auto":
    rep = run_reporting(cfg, task)
    rlib.check(rep, task)
  else:
    rep = reporting  # as given to simulation.run, which checks it
  # The resolved config (summary.json['config']; `fedjax-inv run --config summary.json`).
  resolved = {k: v for k, v in cfg.items()
              if k in config.RUN_KEYS and v is not None and k not in ("out", "overwrite",
                                                                   "resume")}
  resolved.update(task=task.name, algorithm=",".join(algos), seed=seed0, seeds=nseeds,
                  rounds=rounds, clients_per_round=int(cohort))
  if eval_every:
    resolved["eval_every"] = int(eval_every)
  if extra_hp:  # API overrides: recorded so that the config reproduces the run
    resolved["hp"] = list(resolved.get("hp") or []) + extra_hp
  replicas = cfg.get("replicas") or config.DEFAULT_REPLICAS
  _check_host_checkpoints(cfg, task, built)
  return Plan(
      cfg=cfg, algos=list(algos), seeds=list(seeds), task=task, holdouts=list(holdouts),
      domains=domains, validation=cfg.get("validation") or "mean", split_seed=split_seed,
      resplit=bool(resplit), task_kwargs=tkw, task_load_seconds=None if given_task else t_load,
      rounds=rounds, eval_every=eval_every, cohort=cohort, plans=plans, labels=labels,
      built=built, names=[lab for a in algos for lab in labels[a]], rep=rep,
      resolved=resolved, search_info=search_info, replicas=replicas,
      batched=jax.process_count() == 1 and (
          replicas == "batched" or (replicas == "auto" and jax.default_backend() != "cpu")),
      devices_used=(1 if mesh is None or cohort % mesh.devices.size
                    else int(mesh.devices.size)),
      out=out, resume=resume, overwrite=bool(cfg.get("overwrite")))


def _cohort(cfg: dict, task, domains) -> int:
  """Clients per round: ``--clients-per-round``, else the task's default (e.g. 10 of
  FEMNIST's 3,400), else every client. Raises ValueError outside ``1..N``."""
  n = task.train.num_clients
  given = cfg.get("clients_per_round")
  cohort = int(given if given is not None else min(task.defaults.get("clients_per_round",
                                                                     n), n))
  if not 1 <= cohort <= n:
    raise ValueError(f"--clients-per-round {cohort}: the task has {n} training clients"
                     + (" per held-out domain." if domains else "."))
  return cohort


def _check_host_checkpoints(cfg: dict, task, built: dict) -> None:
  """ValueError (before anything is written) for ``--checkpoint-every`` on a host pool
  (``simulation.pool_plan``) with an algorithm that keeps per-client state, which a
  host pool does not checkpoint yet."""
  from fedjax_inv.runner import simulation
  if not cfg.get("checkpoint_every"):
    return
  if simulation.pool_plan(task, cfg.get("pool") or "auto")["residency"] != "host":
    return
  for label, alg in built.items():
    if any(c.init_client is not None for c in alg.components) or \
        alg.client_optimizer_state == "persistent":
      raise ValueError(f"--checkpoint-every: {label} keeps per-client state, which a "
                       "host pool (--pool host, or auto for this task) does not "
                       "checkpoint yet; add --pool device, or drop --checkpoint-every.")


def _check_multiprocess(cfg: dict) -> None:
  """What a run over several processes (``--coordinator``) does not support yet, and
  what its checkpoints need.

  Raises:
    ValueError: ``--execution probe``, ``--devices N``, ``--replicas batched`` or
      ``--pool host``, or
      ``--checkpoint-every`` without ``--out`` (one line naming the flag).
  """
  for key, bad in (("execution", cfg.get("execution") == "probe"),
                   ("devices", cfg.get("devices") not in (None, "all")),
                   ("replicas", cfg.get("replicas") == "batched"),
                   ("pool", cfg.get("pool") == "host")):
    if bad:
      raise ValueError(f"--{key.replace('_', '-')}: not supported yet in a run over "
                       f"{jax.process_count()} processes (every device of every process "
                       "is used; runs go one after another); drop the flag.")
  if cfg.get("checkpoint_every") and not (cfg.get("out") or cfg.get("resume")):
    raise ValueError(f"--checkpoint-every over {jax.process_count()} processes needs "
                     "--out FOLDER on a file system every process shares (the processes "
                     "write one checkpoint there together).")


def _check_seeds(seeds) -> list:
  """``seeds`` as a list of distinct ints >= 0 (ValueError naming the value otherwise)."""
  import numbers
  seeds = [seeds] if isinstance(seeds, numbers.Integral) else list(seeds)
  if not seeds:
    raise ValueError("seeds is empty; pass at least one seed, e.g. seeds=(0, 1, 2).")
  if (any(isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 0
          for s in seeds) or len(set(seeds)) != len(seeds)):
    raise ValueError(f"seeds={seeds}; use distinct integers >= 0.")
  return [int(s) for s in seeds]


def _plan_task(cfg: dict, task_kwargs: dict, split_seed: int, holdouts=None):
  """``(first task, domains, holdouts)``: without ``--holdout`` the task, ``None`` and
  ``[None]``; with it the task built with its default held-out domain (the defaults and
  shapes every domain shares; ``executor.task_for`` builds each domain's), every domain
  name and the held-out domains to run (:func:`resolve_holdouts`: a domain task with 'val'
  and 'ood' sets; names or indices, 'all')."""
  from fedjax_inv.tasks import make_task
  if holdouts is None and not cfg.get("holdout"):
    return make_task(cfg["task"], seed=split_seed, **task_kwargs), None, [None]
  if holdouts is None:
    holdout = str(cfg["holdout"])
    # Strings: a domain name wins over an index ('75' is RotatedMNIST's 75° domain, not
    # index 75); a digit string that names no domain is an index (lodo._domain_name).
    holdouts = "all" if holdout == "all" else [h.strip() for h in holdout.split(",")]
  return resolve_holdouts(cfg["task"], task_kwargs, split_seed, holdouts)


def open_output(pl, stream):
  """Creates (or, with ``--resume``, reopens) the output folder — never someone else's —
  writes the marker and ``config.json``, and rewrites ``metrics.jsonl`` with the rows of
  the runs a resumed attempt finished.

  Returns:
    ``(out, done)``: the folder and ``{(label, seed, holdout): run dict}`` of finished
    runs.

  Raises:
    ValueError: the folder may not be written (not ours, not empty) or, with
      ``--resume``, holds a different config — nothing written.
  """
  import json
  out = pl.out
  if out is not None and not pl.resume:
    outputs.check_out_dir(out, pl.overwrite)
  if out is None:
    out = default_out(pl.task.name, pl.algos)
    out.mkdir(parents=True, exist_ok=False)
  elif pl.resume:
    saved = json.loads((out / "config.json").read_text())
    if {k: v for k, v in saved.items() if k != "out"} != pl.resolved:
      raise ValueError(f"--resume {str(out)!r}: the folder holds a different config; "
                       f"resume it with `fedjax-inv run --resume {out}` alone.")
  else:
    if pl.overwrite:
      outputs.remove_run_dir(out)
    out.mkdir(parents=True, exist_ok=True)
  (out / outputs.MARKER).write_text("written by fedjax-inv\n")
  outputs.write_json(out / "config.json", pl.resolved)
  from fedjax_inv.runner import executor
  done = _finished(pl, out)
  outputs.write_jsonl(out / "metrics.jsonl", [
      executor.metrics_row(k, e) for k, r in done.items() for e in r["history"]])
  print(task_line(pl) + f"; writing {out}/", file=stream)
  return out, done


def write_summary(pl, out, rec, stream, ex) -> dict:
  """Writes ``summary.json`` (with the table, status, failed / unfinished runs,
  provenance and the resolved config) and, when a run finished, ``results.md/.csv`` and
  ``curves.png``; prints the table. With held-out domains, the leave-one-domain-out
  summary and tables instead (:func:`_write_lodo_summary`). Returns the summary."""
  from fedjax_inv.eval import reporting as rlib
  if pl.has_holdouts:
    return _write_lodo_summary(pl, out, rec, stream, ex)
  task, seeds, runs = pl.task, pl.seeds, rec.runs
  ok = [r for r in runs if r.get("status", "ok") == "ok"]
  extra, printed_extra = report_columns(task, pl.rep, pl.rounds)
  metrics = _final_metrics(task) + extra + _personal_columns(ok)
  table = outputs.comparison_table(runs, metrics, rlib.column_value)
  if len(pl.names) * len(seeds) == 1 and runs:
    summary = {k: v for k, v in runs[0].items() if k != "history"}
  else:
    summary = {"task": task.name, "algorithm": pl.algos, "seed": seeds,
               "rounds": pl.rounds, "num_clients": task.train.num_clients,
               "clients_per_round": pl.cohort, "table": table,
               "runs": [{k: v for k, v in r.items() if k not in ("history", "data")}
                        for r in runs],
               "data": task.info}
  _stamp(summary, pl, rec, ex)
  summary["replicas"] = ("batched (seeds of an algorithm as one vmapped program)"
                         if ex.ran_batched else "sequential")
  outputs.write_json(out / "summary.json", summary)
  if ok:
    _write_tables(pl, out, runs, ok, table, metrics, printed_extra, stream)
  return summary


def _stamp(summary: dict, pl, rec, ex) -> None:
  """Adds what every summary.json carries: status, sweep / search notes, failed and
  unfinished runs, the JAX setup, the command, provenance and the resolved config."""
  status, runs = rec.status, rec.runs
  summary["status"] = status
  if ex.sweep_notes:
    summary["sweep"] = {a: {"points": pl.plans[a].points, "runs": ex.sweep_notes[a]}
                        for a in ex.sweep_notes}
  if pl.search_info:
    summary["search"] = pl.search_info
  if status != "ok":
    summary["failed_runs"] = [
        {k: r.get(k) for k in ("algorithm", "seed", "holdout", "status", "diverged_round")
         if k != "holdout" or "holdout" in r}
        for r in runs if r.get("status") == "diverged"]
    if status == "interrupted":
      have = {(r["algorithm"], r["seed"], r.get("holdout")) for r in runs}
      summary["not_finished"] = [
          {"algorithm": a, "seed": s, **({} if h is None else {"holdout": h})}
          for a in pl.names for h in pl.holdouts for s in pl.seeds
          if (a, s, h) not in have]
  summary["jax"] = {"version": jax.__version__, "backend": jax.default_backend(),
                    "devices": jax.device_count(), "cpu_flags": xla_cpu.status(),
                    # the client axis is sharded over this many (--devices)
                    "devices_used": pl.devices_used}
  summary["command"] = " ".join(sys.argv)
  summary["provenance"] = provenance()
  summary["config"] = pl.resolved


def _write_lodo_summary(pl, out, rec, stream, ex) -> dict:
  """Leave-one-domain-out outputs: ``summary.json`` = ``fedjax_inv.runner.lodo.result_from_runs``
  without the histories (per-domain cells, selections, seeds, task info) plus the common
  keys (:func:`_stamp`, ``holdouts_run``: how the domains ran); ``results.md`` /
  ``results.csv`` = the paper-style tables (one per selection method)."""
  from fedjax_inv.eval import lodo
  result = lodo.result_from_runs(pl, rec.runs, batched=ex.ran_batched)
  summary = {k: v for k, v in result.items() if k != "runs"}
  summary["runs"] = [{k: v for k, v in r.items() if k != "history"}
                     for r in result["runs"]]
  if ex.holdout_note:
    summary["holdouts_run"] = ex.holdout_note
  _stamp(summary, pl, rec, ex)
  outputs.write_json(out / "summary.json", summary)
  if result["runs"]:
    failed = "".join(f"\n{r['algorithm']} seed {r['seed']} holdout {r['holdout']}: "
                     f"diverged at round {r['diverged_round']} (left out of the table)\n"
                     for r in rec.runs if r.get("status") == "diverged")
    md = lodo.format_lodo_markdown(result)
    outputs.write_text_atomic(out / "results.md", md + "\n" + failed)
    outputs.write_text_atomic(out / "results.csv", lodo.lodo_csv(result))
    print("\n" + md, file=stream)
  return summary


def _write_tables(pl, out, runs, ok, table, metrics, printed_extra, stream) -> None:
  failed = "".join(f"\n{r['algorithm']} seed {r['seed']}: diverged at round "
                   f"{r['diverged_round']} (counted in the table as not finite)\n"
                   for r in runs if r.get("status") == "diverged")
  outputs.write_text_atomic(out / "results.md",
                            outputs.format_table(table, metrics) + "\n" + failed)
  outputs.write_text_atomic(out / "results.csv", outputs.table_csv(table, metrics))
  task = pl.task
  outputs.plot_curves(out / "curves.png", [r for r in ok if r["history"]],
                      title=f"{task.name}: {', '.join(pl.algos)} ({len(pl.seeds)} seed(s), "
                            f"{pl.rounds} rounds)",
                      sets=("train",) + tuple(task.eval_sets),
                      num_classes=num_classes(task))
  printed = (metrics[: 1 + len(task.eval_sets)] + printed_extra +
             [m for m in metrics if m.startswith("personal_val")])
  print("\n" + outputs.format_table(table, printed, markdown=False), file=stream)


def num_classes(task) -> int | None:
  """The number of classes K of ``task``: None for a regression task, 2 for a binary
  one, else the model's number of outputs (its logits, as ``Task`` checks them; shapes
  only, nothing computed), or the largest label + 1 when the model cannot be traced."""
  if task.kind == "regression":
    return None
  if task.kind == "binary":
    return 2
  from fedjax_inv.tasks.base import _output_dim
  try:
    return _output_dim(task.model, task.train.feature_shape)
  except Exception:  # an object that only looks like a Task: count the labels
    import numpy as np
    return int(max(np.max(np.asarray(d.y))
                   for d in [task.train, *task.eval_sets.values()])) + 1


def resolve_holdouts(task_name, task_kwargs, split_seed, holdouts):
  """Builds the first task (checks the task and its kwargs) and resolves ``holdouts``
  (names or indices, or 'all') of a domain task (leave-one-domain-out).

  Returns:
    ``(first task, all domain names, the held-out domain names to run, in order)``.

  Raises:
    ValueError: not a domain task, a regression task, no 'val' / 'ood' set, an unknown
      or repeated held-out domain, an empty list.
  """
  import numbers
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
  items = [holdouts] if isinstance(holdouts, (str, int, numbers.Integral)) else list(holdouts)
  if not items:
    raise ValueError("holdouts is empty; pass 'all' or at least one domain.")
  wanted = [_domain_name(h, domains) for h in items]
  if len(set(wanted)) != len(wanted):
    raise ValueError(f"holdouts {items} name a domain twice.")
  return first, domains, wanted


def _domain_name(h, domains: list) -> str:
  import numbers
  if isinstance(h, (int, numbers.Integral)) and not isinstance(h, bool):
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
