"""One experiment = task × algorithms × seeds, written to ``runs/<name>/``.

Layout of the output directory (issue 11: nothing is lost when a run dies):
  .fedjax-inv-run   marker: this folder was written by fedjax-inv (only such a folder is
                    ever replaced, and only with --overwrite)
  config.json       the resolved config (written first; ``--resume`` reads it)
  summary.json      single run: {task, algorithm, seed, rounds, num_clients, status,
                    final, selected, last_k_mean, reporting, ...}; several: the same keys
                    per run under ``runs`` plus ``table``; both with ``status`` ('ok' |
                    'diverged' | 'interrupted'), ``provenance`` (versions, git commit,
                    device, command) and ``config`` (``--config summary.json`` reruns it)
  <algorithm>/seed<s>/summary.json   written as soon as that run ends (``status``,
                    ``diverged_round`` for a diverged run)
  <algorithm>/seed<s>/checkpoint/    the current run's state (``--checkpoint-every``)
  metrics.jsonl     one line per evaluated round (with ``algorithm`` and ``seed``),
                    appended as each evaluation completes
  results.md/.csv   mean ± std over seeds per algorithm: last round, and (when the run's
                    reporting asks) at each selected round (``<metric>@<rule>``) and the
                    last-k mean (``<metric>@last<k>``)
  curves.png        train (dashed) vs OOD (solid) accuracy over rounds
"""
from __future__ import annotations

import datetime
import os
import pathlib
import shutil
import sys
import time

import jax

from fedjax_inv import outputs, xla_cpu


def _final_metrics(task) -> list[str]:
  metric = "mse" if task.kind == "regression" else "accuracy"
  names = [f"train_{metric}"] + [f"{s}_{metric}" for s in task.eval_sets]
  return names + ["train_loss"] + [f"{s}_loss" for s in task.eval_sets]


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


_POSITIVE = ("client_lr", "server_lr", "lr", "eps", "sigma_min")


def check_hparams(name: str, values: dict, scoped: bool = False, flag: str = "--hp") -> None:
  """Checks user-set hyperparameters of algorithm ``name`` against the types of its
  defaults (``make_algorithm(name).hparams``): numbers must be finite numbers, >= 0
  (> 0 for learning rates, ``eps`` and ``sigma_min``), integers integral, booleans
  booleans, strings strings. Unknown names are left to ``make_algorithm``. Before any
  compile.

  Raises:
    ValueError: names the algorithm, the hyperparameter, the value and what is allowed.
  """
  import math
  from fedjax_inv.algorithms import make_algorithm
  defaults = make_algorithm(name).hparams
  for k, v in values.items():
    if k not in defaults or defaults[k] is None:
      continue
    d = defaults[k]
    where = f"{flag} {name + '.' if scoped else ''}{k}={v!r} ({name})"
    if isinstance(d, bool):
      if not isinstance(v, bool):
        raise ValueError(f"{where}: must be true or false.")
    elif isinstance(d, (int, float)):
      if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{where}: must be a number (default {d!r}).")
      if not math.isfinite(v):
        raise ValueError(f"{where}: must be a finite number (default {d!r}).")
      if isinstance(d, int) and int(v) != v:
        raise ValueError(f"{where}: must be an integer (default {d!r}).")
      if k in _POSITIVE and v <= 0:
        raise ValueError(f"{where}: must be > 0 (default {d!r}).")
      if v < 0:
        raise ValueError(f"{where}: must be >= 0 (default {d!r}).")
    elif isinstance(d, str) and not isinstance(v, str):
      raise ValueError(f"{where}: must be a string (default {d!r}).")


def _run_dir(out: pathlib.Path, a: str, s: int) -> pathlib.Path:
  return out / a / f"seed{s}"


def _batch_dir(out: pathlib.Path, algo: str, todo) -> pathlib.Path:
  """The checkpoint folder of one batched group of runs (``--replicas batched``): named by
  a hash of its (label, seed) list, so a resume with the same runs finds it."""
  import hashlib
  tag = hashlib.sha1(repr([(str(a), int(s)) for a, s in todo]).encode()).hexdigest()[:12]
  return out / algo / f"batch-{tag}" / "checkpoint"


def _load_finished(out: pathlib.Path, algos, seeds) -> dict:
  """Runs of a previous attempt that completed (their per-run summary.json exists),
  with their history from metrics.jsonl: ``{(algorithm, seed): run dict}``."""
  import json
  done = {}
  rows = []
  if (out / "metrics.jsonl").exists():
    for line in (out / "metrics.jsonl").read_text().splitlines():
      try:
        rows.append(json.loads(line))
      except ValueError:
        pass  # a line cut by a kill
  for a in algos:
    for s in seeds:
      f = _run_dir(out, a, s) / "summary.json"
      if f.exists():
        r = json.loads(f.read_text())
        r["history"] = [{k: v for k, v in h.items() if k not in ("algorithm", "seed")}
                        for h in rows if h.get("algorithm") == a and h.get("seed") == s]
        done[(a, s)] = r
  return done


def run_experiment(cfg: dict, progress: bool = True, overrides=None,
                   stream=None) -> dict:
  """Runs every (algorithm, seed) of ``cfg`` and writes the results directory.

  ``cfg`` keys: see ``fedjax_inv.config.RUN_KEYS`` (checked by
  ``fedjax_inv.config.check_run_config``); also ``reporting`` ('auto' | 'none'), ``select``
  and ``last_k`` (:func:`run_reporting`), ``overwrite``, ``checkpoint_every`` (save the
  current run's state every N rounds in ``<algorithm>/seed<s>/checkpoint/``, or a
  batch's in ``<algorithm>/batch-<hash>/checkpoint/``) and ``resume`` (a folder of an
  earlier, interrupted run of the same config: finished runs are kept, the current one
  continues from its checkpoint, the others run).
  ``overrides``: algorithm hyperparameters set by the user (they win over the task's
  defaults; ``ALGORITHM.NAME`` keys apply to one algorithm, :func:`split_overrides`).

  Three steps: :func:`plan_experiment` (every check, the runs; nothing written or
  compiled), :func:`open_output` (the folder, ``config.json``, the finished runs of a
  resumed attempt), :func:`execute` (each group of runs batched as one program or one
  after another, with the reason), then the summary files. Outputs are streamed:
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
  pl = plan_experiment(cfg, overrides)
  out, done = open_output(pl, stream)
  rec = _Recorder(pl, out, stream)
  t0 = time.perf_counter()
  try:
    execute(pl, out, done, rec, progress, stream)
  except KeyboardInterrupt:
    rec.status = "interrupted"
  summary = write_summary(pl, out, rec, stream)
  print(f"\nwrote {out}/ (summary.json, metrics.jsonl, results.md, curves.png) in "
        f"{time.perf_counter() - t0:.0f}s" + ("" if rec.status == "ok" else
                                              f"; status: {rec.status}"), file=stream)
  if rec.status == "interrupted":
    raise KeyboardInterrupt(str(out))
  return summary


def _sweep_points(cfg: dict, algos, per_algo: dict):
  """``(specs, points, search_info)`` of ``--sweep`` / ``--search`` per algorithm (one
  point ``{}`` without either), every point checked (:func:`check_hparams`)."""
  from fedjax_inv import sweep as sweep_lib
  parsed = sweep_lib.parse_sweep(cfg.get("sweep"))
  for scope in parsed:
    if scope is not None and scope not in algos:
      raise ValueError(f"--sweep {scope}.…: {scope!r} is not an algorithm of this run "
                       f"({', '.join(algos)}).")
  specs = {a: sweep_lib.spec_for(parsed, a) for a in algos}
  pts = {a: sweep_lib.points(specs[a]) for a in algos}
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


def _build_algorithms(algos, per_algo: dict, pts: dict, task):
  """``(plans, labels, built)``: per algorithm its ``sweep.Plan`` and run labels (the
  algorithm, or 'algorithm@name=value,...'), and every label's ``Algorithm``."""
  from fedjax_inv import sweep as sweep_lib
  from fedjax_inv.algorithms import make_algorithm
  plans, labels, built = {}, {}, {}
  for a in algos:
    make = lambda p, a=a: make_algorithm(a, **task.algorithm_settings(  # noqa: E731
        a, {**per_algo[a], **p}))
    try:
      plans[a] = sweep_lib.plan(a, make, pts[a])
    except ValueError as e:
      if len(algos) > 1 and "unknown hyperparameters" in str(e):
        raise ValueError(f"{e} (with several algorithms, scope a value to one: "
                         f"--hp {a}.NAME=VALUE is ignored by the others)") from None
      raise
    labels[a] = [sweep_lib.label(a, p) for p in plans[a].points]
    built.update(zip(labels[a], plans[a].concrete))
  return plans, labels, built


def plan_experiment(cfg: dict, overrides=None):
  """The planner of :func:`run_experiment`: checks everything (config, names, sizes,
  hyperparameters, sweep / search points, reporting) and builds the task and every run's
  ``Algorithm``, before any compile and before anything is written.

  Returns:
    a namespace: ``cfg`` (checked), ``algos``, ``seeds``, ``task``, ``rounds``,
    ``eval_every``, ``cohort``, ``plans`` / ``labels`` / ``built`` (per algorithm: its
    ``sweep.Plan``, its run labels; per label: its ``Algorithm``), ``names`` (every
    label), ``rep`` (the ``Reporting``), ``resolved`` (the config written to
    ``config.json``), ``search_info``, ``replicas`` and ``batched`` (seeds / traced
    points run as one vmapped program), ``out`` / ``resume`` / ``overwrite``.

  Raises:
    ValueError: anything :func:`run_experiment` refuses.
  """
  import types
  from fedjax_inv import config
  from fedjax_inv.core.engine import resolve_strategy
  from fedjax_inv.eval import reporting as rlib
  from fedjax_inv.tasks import make_task
  cfg = config.check_run_config(cfg)
  algos = [a.strip() for a in str(cfg.get("algorithm", "fedavg")).split(",") if a.strip()]
  seed0 = int(cfg.get("seed") or 0)
  nseeds = int(cfg["seeds"]) if cfg.get("seeds") is not None else 1
  resume = cfg.get("resume")
  if resume and not (pathlib.Path(resume) / "config.json").is_file():
    raise ValueError(f"--resume {str(resume)!r}: no config.json there; give the folder "
                     "of an earlier `fedjax-inv run`.")
  out = pathlib.Path(resume or cfg.get("out")) if resume or cfg.get("out") else None
  if (cfg.get("execution") or "auto") != "probe":
    resolve_strategy(cfg.get("execution") or "auto", 1)
  # cfg's own lr / hp / ... keys count (API calls with a config dict), then ``overrides``
  derived = config.algorithm_overrides(cfg)
  extra_hp = [f"{k}={__import__('json').dumps(v)}" for k, v in (overrides or {}).items()
              if k not in derived or derived[k] != v]
  per_algo = split_overrides({**derived, **(overrides or {})}, algos)
  for a in algos:
    check_hparams(a, dict(per_algo[a]))
  _, pts, search_info = _sweep_points(cfg, algos, per_algo)
  task = make_task(cfg["task"], data_dir=cfg.get("data_dir"),
                   source=cfg.get("source") or "auto",
                   download=bool(cfg.get("download")), seed=seed0)

  def given(key, default):  # None = not given; 0 was refused by check_run_config
    return default if cfg.get(key) is None else cfg[key]
  rounds = int(given("rounds", task.defaults.get("rounds", 100)))
  eval_every = given("eval_every", task.defaults.get("eval_every"))
  cohort = int(given("clients_per_round", task.train.num_clients))
  if not 1 <= cohort <= task.train.num_clients:
    raise ValueError(f"--clients-per-round {cohort}: the task has "
                     f"{task.train.num_clients} training clients.")
  plans, labels, built = _build_algorithms(algos, per_algo, pts, task)
  rep = run_reporting(cfg, task)
  rlib.check(rep, task)
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
  replicas = cfg.get("replicas") or "auto"
  return types.SimpleNamespace(
      cfg=cfg, algos=algos, seeds=list(range(seed0, seed0 + nseeds)), task=task,
      rounds=rounds, eval_every=eval_every, cohort=cohort, plans=plans, labels=labels,
      built=built, names=[lab for a in algos for lab in labels[a]], rep=rep,
      resolved=resolved, search_info=search_info, replicas=replicas,
      batched=replicas == "batched" or (replicas == "auto"
                                        and jax.default_backend() != "cpu"),
      out=out, resume=resume, overwrite=bool(cfg.get("overwrite")), sweep_notes={},
      ran_batched=False)


def open_output(pl, stream):
  """Creates (or, with ``--resume``, reopens) the output folder — never someone else's —
  writes the marker and ``config.json``, and rewrites ``metrics.jsonl`` with the rows of
  the runs a resumed attempt finished.

  Returns:
    ``(out, done)``: the folder and ``{(label, seed): run dict}`` of finished runs.

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
  done = _load_finished(out, pl.names, pl.seeds) if pl.resume else {}
  outputs.write_jsonl(out / "metrics.jsonl", [
      {"algorithm": a, "seed": s, **h} for (a, s), r in done.items() for h in r["history"]])
  task = pl.task
  print(f"task {task.name}: {task.train.num_clients} training clients "
        f"(sizes {list(map(int, task.train.n))}), eval sets {list(task.eval_sets)}; "
        f"data: {task.info.get('data_note', task.info.get('dataset_source', 'generated'))}"
        f"; writing {out}/", file=stream)
  return out, done


class _Recorder:
  """Collects the finished runs of :func:`execute` (``runs``, ``status``), writes each
  run's ``summary.json`` as it ends, removes its checkpoint and prints its line."""

  def __init__(self, pl, out, stream):
    self.pl, self.out, self.stream = pl, out, stream
    self.runs, self.status = [], "ok"

  def base(self, s: int, a: str, algo: str) -> dict:
    pl = self.pl
    b = {"task": pl.task.name, "algorithm": a, "seed": s, "rounds": pl.rounds,
         "num_clients": pl.task.train.num_clients, "clients_per_round": pl.cohort}
    point = dict(zip(pl.labels[algo], pl.plans[algo].points))[a]
    if point:
      b.update(base_algorithm=algo, sweep=point)
    return b

  def __call__(self, a, s, res, base, ckpt):
    from fedjax_inv.simulation import DivergedError
    pl, stream = self.pl, self.stream
    shutil.rmtree(ckpt, ignore_errors=True)  # ours; the run is over
    if isinstance(res, DivergedError):
      summary = {**base, "status": "diverged", "diverged_round": res.round,
                 "error": str(res), "hparams": pl.built[a].hparams, "data": pl.task.info,
                 "history": res.history}
      self._keep(a, s, summary)
      self.status = "diverged"
      print(f"  {a:18s} seed {s}: DIVERGED at round {res.round} (train objective not "
            "finite); recorded, going on", file=stream)
      return
    self._keep(a, s, {**base, "status": "ok", "final": res.final, **res.report(),
                      "hparams": pl.built[a].hparams, "execution": res.strategy,
                      "seconds": round(res.seconds, 2), "data": pl.task.info,
                      "history": res.history})
    _print_run(a, s, res, stream)

  def _keep(self, a, s, summary):
    self.runs.append(summary)
    outputs.write_json(_run_dir(self.out, a, s) / "summary.json",
                       {k: v for k, v in summary.items() if k != "history"})


def _print_run(a: str, s: int, res, stream) -> None:
  f = res.final
  acc = " ".join(f"{k}={v:.3f}" for k, v in f.items()
                 if k.endswith(("_accuracy", "_mse")) and "client" not in k)
  print(f"  {a:18s} seed {s}: {acc}  ({res.seconds:.1f}s, {res.strategy})", file=stream)
  for rule, e in res.selected.items():
    vals = " ".join(f"{k}={v:.3f}" for k, v in e.items()
                    if k.endswith(("_accuracy", "_mse", "_auroc", "_auprc"))
                    and "client" not in k and isinstance(v, float))
    print(f"  {'':18s}   at {rule} (round {e['round']}): {vals}", file=stream)
  if res.last_k_mean is not None:
    w = res.last_k_mean
    vals = " ".join(f"{k}={v:.3f}" for k, v in w.items()
                    if k.endswith(("_accuracy", "_mse")) and "client" not in k)
    print(f"  {'':18s}   mean of rounds {w['first_round']}-{w['last_round']}: "
          f"{vals}", file=stream)


def execute(pl, out, done, rec, progress, stream) -> None:
  """The executor of :func:`run_experiment`: for each algorithm, its sweep points and
  seeds not in ``done``: traced sweep points × seeds as one ``run_replicas`` program, or
  an algorithm's seeds as one (``pl.batched``), else one ``simulation.run`` after
  another; the choice and its reason are printed and kept in ``pl.sweep_notes``. Each
  finished run goes to ``rec``; checkpoints (``--checkpoint-every``) per run or per batch.
  """
  from fedjax_inv import simulation, sweep as sweep_lib
  cfg, metrics_path = pl.cfg, out / "metrics.jsonl"
  common = dict(rounds=pl.rounds, clients_per_round=pl.cohort,
                execution=cfg.get("execution") or "auto", chunk_size=cfg.get("chunk_size"),
                eval_every=pl.eval_every, progress=progress, reporting=pl.rep,
                rounds_per_call=cfg.get("rounds_per_call") or 1)

  def checkpointing(path):  # --checkpoint-every: the run's (or batch's) checkpoint folder
    every = cfg.get("checkpoint_every")
    return dict(checkpoint_dir=path if every else None, checkpoint_every=every)

  def row_writer(keyed):  # callback(key, entry) -> metrics.jsonl; keyed[key] = (label, seed)
    return lambda k, entry: outputs.append_jsonl(
        metrics_path, {"algorithm": keyed[k][0], "seed": keyed[k][1], **entry})

  def batch(algo, folder, structure, todo, hparams=None):
    # run_replicas calls back with the replica index when it traces hparams, else the seed
    from fedjax_inv import replicas
    pl.ran_batched = True
    bdir = _batch_dir(out, folder, todo)
    keyed = dict(enumerate(todo)) if hparams is not None else {p[1]: p for p in todo}
    kw = dict(seeds=[s for _, s in todo], callback=row_writer(keyed), **common,
              **checkpointing(bdir))
    if hparams is not None:
      kw.update(seeds=hparams[0], hparams=hparams[1])
    results = replicas.run_replicas(pl.task, structure, **kw)
    for (lab, s), res in zip(todo, results):
      rec(lab, s, res, dict(rec.base(s, lab, algo), replicas=f"batched x{len(todo)}"),
          _run_dir(out, lab, s) / "checkpoint")
    shutil.rmtree(bdir.parent, ignore_errors=True)  # ours; the batch is over

  for algo in pl.algos:
    plan = pl.plans[algo]
    point_of = dict(zip(pl.labels[algo], plan.points))
    for a in pl.labels[algo]:
      for s in pl.seeds:
        if (a, s) in done:
          rec.runs.append(done[(a, s)])
          print(f"  {a:18s} seed {s}: finished earlier (resumed), kept", file=stream)
    if len(plan.points) > 1:
      pl.sweep_notes[algo] = _sweep_note(plan, pl.batched, pl.replicas)
      print(f"  {algo}: {len(plan.points)} sweep points × {len(pl.seeds)} seed(s), "
            f"{pl.sweep_notes[algo]}", file=stream)
    if plan.batched and pl.batched and len(plan.points) > 1:
      todo = [(lab, s) for lab in pl.labels[algo] for s in pl.seeds if (lab, s) not in done]
      if todo:
        batch(algo, algo, plan.structure, todo, sweep_lib.replica_hparams(
            plan, [(point_of[lab], s) for lab, s in todo]))
      continue
    for a in pl.labels[algo]:
      todo = [s for s in pl.seeds if (a, s) not in done]
      if pl.batched and len(todo) > 1:
        print(f"  {a:18s} seeds {todo}: batched as one program (--replicas "
              f"{pl.replicas})", file=stream)
        batch(algo, a, pl.built[a], [(a, s) for s in todo])
        continue
      for s in todo:
        ckpt = _run_dir(out, a, s) / "checkpoint"
        try:
          res = simulation.run(pl.task, pl.built[a], seed=s, **common,
                               callback=lambda e, a=a, s=s: row_writer({0: (a, s)})(0, e),
                               **checkpointing(ckpt))
        except simulation.DivergedError as e:
          res = e
        rec(a, s, res, rec.base(s, a, algo), ckpt)


def _sweep_note(plan, batched: bool, replicas: str) -> str:
  """How a sweep's points run, and why (summary.json['sweep'][algorithm]['runs'])."""
  if plan.batched and batched:
    return "batched: " + ", ".join(plan.traced) + " traced"
  return "one after another: " + (
      plan.reason if not plan.batched else
      f"--replicas {replicas}" + (" (sequential on CPU; --replicas batched traces "
                                  + ", ".join(plan.traced) + ")"
                                  if replicas == "auto" else ""))


def write_summary(pl, out, rec, stream) -> dict:
  """Writes ``summary.json`` (with the table, status, failed / unfinished runs,
  provenance and the resolved config) and, when a run finished, ``results.md/.csv`` and
  ``curves.png``; prints the table. Returns the summary."""
  from fedjax_inv.eval import reporting as rlib
  task, seeds, runs, status = pl.task, pl.seeds, rec.runs, rec.status
  ok = [r for r in runs if r.get("status", "ok") == "ok"]
  extra, printed_extra = report_columns(task, pl.rep, pl.rounds)
  metrics = _final_metrics(task) + extra
  table = outputs.comparison_table(ok, metrics, rlib.column_value)
  if len(pl.names) * len(seeds) == 1 and runs:
    summary = {k: v for k, v in runs[0].items() if k != "history"}
  else:
    summary = {"task": task.name, "algorithm": pl.algos, "seed": seeds,
               "rounds": pl.rounds, "num_clients": task.train.num_clients,
               "clients_per_round": pl.cohort, "table": table,
               "runs": [{k: v for k, v in r.items() if k not in ("history", "data")}
                        for r in runs],
               "data": task.info}
  summary["status"] = status
  summary["replicas"] = ("batched (seeds of an algorithm as one vmapped program)"
                         if pl.ran_batched else "sequential")
  if pl.sweep_notes:
    summary["sweep"] = {a: {"points": pl.plans[a].points, "runs": pl.sweep_notes[a]}
                        for a in pl.sweep_notes}
  if pl.search_info:
    summary["search"] = pl.search_info
  if status != "ok":
    summary["failed_runs"] = [{"algorithm": r["algorithm"], "seed": r["seed"],
                               "status": r["status"],
                               "diverged_round": r.get("diverged_round")}
                              for r in runs if r.get("status") == "diverged"]
    if status == "interrupted":
      summary["not_finished"] = [{"algorithm": a, "seed": s} for a in pl.names
                                 for s in seeds if not any(
                                     r["algorithm"] == a and r["seed"] == s for r in runs)]
  summary["jax"] = {"version": jax.__version__, "backend": jax.default_backend(),
                    "devices": jax.device_count(), "cpu_flags": xla_cpu.status()}
  summary["command"] = " ".join(sys.argv)
  summary["provenance"] = provenance()
  summary["config"] = pl.resolved
  outputs.write_json(out / "summary.json", summary)
  if ok:
    _write_tables(pl, out, runs, ok, table, metrics, printed_extra, stream)
  return summary


def _write_tables(pl, out, runs, ok, table, metrics, printed_extra, stream) -> None:
  failed = "".join(f"\n{r['algorithm']} seed {r['seed']}: diverged at round "
                   f"{r['diverged_round']} (left out of the table)\n"
                   for r in runs if r.get("status") == "diverged")
  outputs.write_text_atomic(out / "results.md",
                            outputs.format_table(table, metrics) + "\n" + failed)
  outputs.write_text_atomic(out / "results.csv", outputs.table_csv(table, metrics))
  task = pl.task
  outputs.plot_curves(out / "curves.png", [r for r in ok if r["history"]],
                      title=f"{task.name}: {', '.join(pl.algos)} ({len(pl.seeds)} seed(s), "
                            f"{pl.rounds} rounds)",
                      sets=("train",) + tuple(task.eval_sets))
  printed = metrics[: 1 + len(task.eval_sets)] + printed_extra
  print("\n" + outputs.format_table(table, printed, markdown=False), file=stream)


def run_holdout_experiment(cfg: dict, progress: bool = True, overrides=None,
                           stream=None) -> dict:
  """Leave-one-domain-out (``--holdout all`` or a comma-separated list of domains) for a
  domain task: every held-out domain × algorithm × seed, model selection by
  training-domain validation, test-domain oracle and last round, written as paper-style
  tables to ``runs/<name>/`` (see ``fedjax_inv.lodo``). ``cfg['validation']``:
  'mean' (default, DomainBed/FedIIR per-domain average) or 'pooled'."""
  from fedjax_inv import config
  from fedjax_inv import lodo
  stream = stream or sys.stdout
  cfg = config.check_run_config(cfg)
  if cfg.get("resume"):
    raise ValueError("--resume is not supported with --holdout; rerun with a new --out.")
  for key in ("rounds_per_call", "checkpoint_every"):
    if cfg.get(key) not in (None, "auto", 1) or (key == "checkpoint_every" and cfg.get(key)):
      raise ValueError(f"{config.flag(key)} {cfg[key]}: not supported with --holdout yet "
                       "(leave-one-domain-out runs one held-out domain at a time); leave "
                       "it out.")
  if cfg.get("sweep") or cfg.get("search"):
    which = "--sweep" if cfg.get("sweep") else "--search"
    raise ValueError(f"{which} is not supported with --holdout yet (leave-one-domain-out "
                     "runs one held-out domain at a time); run one --holdout run per "
                     "setting (--hp NAME=VALUE).")
  scoped = [k for k in (overrides or {}) if "." in k]
  if scoped:
    raise ValueError(f"--hp {scoped[0]}=...: ALGORITHM.NAME scoping is not supported with "
                     "--holdout; run one algorithm per --holdout run, with plain NAME=VALUE.")
  overwrite = bool(cfg.get("overwrite"))
  if cfg.get("out"):
    outputs.check_out_dir(cfg["out"], overwrite)
  holdout = str(cfg["holdout"])
  # Strings: a domain name wins over an index ('75' is RotatedMNIST's 75° domain, not
  # index 75); a digit string that names no domain is an index (lodo._domain_name).
  holdouts = "all" if holdout == "all" else [h.strip() for h in holdout.split(",")]
  seed0 = int(cfg.get("seed") or 0)
  nseeds = int(cfg.get("seeds") or 1)
  if nseeds < 1:
    raise ValueError(f"--seeds {nseeds}: must be >= 1.")
  task_kwargs = {"data_dir": cfg.get("data_dir"), "source": cfg.get("source") or "auto",
                 "download": bool(cfg.get("download")), "seed": seed0}
  result = lodo.run_lodo(
      cfg["task"], str(cfg.get("algorithm", "fedavg")),
      seeds=tuple(range(seed0, seed0 + nseeds)), rounds=cfg.get("rounds"),
      holdouts=holdouts, task_kwargs=task_kwargs, algorithm_kwargs=overrides or {},
      execution=cfg.get("execution") or "auto", eval_every=cfg.get("eval_every"),
      progress=progress, clients_per_round=cfg.get("clients_per_round"), stream=stream,
      validation=cfg.get("validation") or "mean", replicas=cfg.get("replicas") or "auto")
  if cfg.get("out"):
    out = pathlib.Path(cfg["out"])
    if overwrite:
      outputs.remove_run_dir(out)  # only a folder fedjax-inv wrote (checked above)
  else:
    out = default_out(str(cfg["task"]), ["lodo"])
  lodo.write_lodo_outputs(out, result)
  print("\n" + lodo.format_lodo_markdown(result), file=stream)
  print(f"\nwrote {out}/ (results.md, results.csv, summary.json, metrics.jsonl)",
        file=stream)
  return result
