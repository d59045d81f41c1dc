"""One experiment = task × algorithms × seeds, written to ``runs/<name>/``.

Layout of the output directory:
  summary.json      single run: {task, algorithm, seed, rounds, num_clients, final,
                    selected, last_k_mean, reporting, ...}; several: the same keys per run
                    under ``runs`` plus ``table``
  metrics.jsonl     one line per evaluated round (with ``algorithm`` and ``seed``)
  results.md/.csv   mean ± std over seeds per algorithm: last round, and (when the run's
                    reporting asks) at each selected round (``<metric>@<rule>``) and the
                    last-k mean (``<metric>@last<k>``)
  curves.png        train (dashed) vs OOD (solid) accuracy over rounds
"""
from __future__ import annotations

import datetime
import pathlib
import sys
import time

import jax

from fedjax_inv import report


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


def run_experiment(cfg: dict, progress: bool = True, overrides=None,
                   stream=None) -> dict:
  """Runs every (algorithm, seed) of ``cfg`` and writes the results directory.

  ``cfg`` keys: see ``fedjax_inv.cli.RUN_KEYS``; also ``reporting`` ('auto' | 'none'),
  ``select`` and ``last_k`` (:func:`run_reporting`). ``overrides``: algorithm
  hyperparameters set by the user (they win over the task's defaults). Validation (names, sizes) happens for
  every algorithm before the first compile. Returns the summary dict.
  """
  from fedjax_inv.algorithms import make_algorithm
  from fedjax_inv.core.engine import resolve_strategy
  from fedjax_inv.core.simulation import run
  from fedjax_inv.tasks import make_task
  stream = stream or sys.stdout

  algos = [a.strip() for a in str(cfg.get("algorithm", "fedavg")).split(",") if a.strip()]
  seed0 = int(cfg.get("seed") or 0)
  nseeds = int(cfg.get("seeds") or 1)
  if nseeds < 1:
    raise ValueError(f"--seeds {nseeds}: must be >= 1.")
  seeds = list(range(seed0, seed0 + nseeds))
  resolve_strategy(cfg.get("execution") or "auto", 1)
  task = make_task(cfg["task"], data_dir=cfg.get("data_dir"),
                   source=cfg.get("source") or "auto",
                   download=bool(cfg.get("download")), seed=seed0)
  rounds = int(cfg.get("rounds") or task.defaults.get("rounds", 100))
  eval_every = cfg.get("eval_every") or task.defaults.get("eval_every")
  cohort = cfg.get("clients_per_round") or task.train.num_clients
  if not 1 <= cohort <= task.train.num_clients:
    raise ValueError(f"--clients-per-round {cohort}: the task has "
                     f"{task.train.num_clients} training clients.")
  built = {a: make_algorithm(a, **task.algorithm_settings(a, overrides)) for a in algos}
  rep = run_reporting(cfg, task)
  from fedjax_inv.eval import reporting as rlib
  rlib.check(rep, task)
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  out = pathlib.Path(cfg.get("out") or f"runs/{task.name}-{'+'.join(algos)}-{stamp}")
  print(f"task {task.name}: {task.train.num_clients} training clients "
        f"(sizes {list(map(int, task.train.n))}), eval sets {list(task.eval_sets)}; "
        f"data: {task.info.get('data_note', task.info.get('dataset_source', 'generated'))}",
        file=stream)
  runs, all_rows = [], []
  t0 = time.perf_counter()
  for a in algos:
    for s in seeds:
      res = run(task, built[a], rounds=rounds, clients_per_round=cohort, seed=s,
                execution=cfg.get("execution") or "auto", chunk_size=cfg.get("chunk_size"),
                eval_every=eval_every, progress=progress, reporting=rep)
      summary = {"task": task.name, "algorithm": a, "seed": s, "rounds": rounds,
                 "num_clients": task.train.num_clients, "clients_per_round": cohort,
                 "final": res.final, **res.report(), "hparams": built[a].hparams,
                 "execution": res.strategy, "seconds": round(res.seconds, 2),
                 "data": task.info, "history": res.history}
      runs.append(summary)
      all_rows += [{"algorithm": a, "seed": s, **h} for h in res.history]
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
        print(f"  {'':18s}   mean of rounds {w['first_round']}-{w['last_round']}: {vals}",
              file=stream)
  extra, printed_extra = report_columns(task, rep, rounds)
  metrics = _final_metrics(task) + extra
  table = report.comparison_table(runs, metrics)
  with report.atomic_dir(out) as tmp:
    report.write_jsonl(tmp / "metrics.jsonl", all_rows)
    for r in runs:
      if len(runs) > 1:
        d = tmp / r["algorithm"] / f"seed{r['seed']}"
        report.write_json(d / "summary.json", {k: v for k, v in r.items() if k != "history"})
    if len(runs) == 1:
      summary = {k: v for k, v in runs[0].items() if k != "history"}
    else:
      summary = {"task": task.name, "algorithm": algos, "seed": seeds, "rounds": rounds,
                 "num_clients": task.train.num_clients, "clients_per_round": cohort,
                 "table": table,
                 "runs": [{k: v for k, v in r.items() if k not in ("history", "data")}
                          for r in runs],
                 "data": task.info}
    summary["jax"] = {"version": jax.__version__, "backend": jax.default_backend(),
                      "devices": jax.device_count()}
    summary["command"] = " ".join(sys.argv)
    report.write_json(tmp / "summary.json", summary)
    (tmp / "results.md").write_text(report.format_table(table, metrics) + "\n")
    (tmp / "results.csv").write_text(report.table_csv(table, metrics))
    report.plot_curves(tmp / "curves.png", runs,
                       title=f"{task.name}: {', '.join(algos)} ({len(seeds)} seed(s), "
                             f"{rounds} rounds)",
                       sets=("train",) + tuple(task.eval_sets))
  printed = metrics[: 1 + len(task.eval_sets)] + printed_extra
  print("\n" + report.format_table(table, printed, markdown=False), file=stream)
  print(f"\nwrote {out}/ (summary.json, metrics.jsonl, results.md, curves.png) in "
        f"{time.perf_counter() - t0:.0f}s", file=stream)
  return summary


def run_holdout_experiment(cfg: dict, progress: bool = True, overrides=None,
                           stream=None) -> dict:
  """Leave-one-domain-out (``--holdout all`` or a comma-separated list of domains) for a
  domain task: every held-out domain × algorithm × seed, model selection by
  training-domain validation, test-domain oracle and last round, written as paper-style
  tables to ``runs/<name>/`` (see ``fedjax_inv.eval.lodo``). ``cfg['validation']``:
  'mean' (default, DomainBed/FedIIR per-domain average) or 'pooled'."""
  from fedjax_inv.eval import lodo
  stream = stream or sys.stdout
  holdout = str(cfg["holdout"])
  holdouts = "all" if holdout == "all" else [
      int(h) if h.strip().isdigit() else h.strip() for h in holdout.split(",")]
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
      validation=cfg.get("validation") or "mean")
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  out = pathlib.Path(cfg.get("out") or f"runs/{cfg['task']}-lodo-{stamp}")
  lodo.write_lodo_outputs(out, result)
  print("\n" + lodo.format_lodo_markdown(result), file=stream)
  print(f"\nwrote {out}/ (results.md, results.csv, summary.json, metrics.jsonl)",
        file=stream)
  return result
