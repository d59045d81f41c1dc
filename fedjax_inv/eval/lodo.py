"""Leave-one-domain-out (LODO) evaluation: DomainBed's model-selection methods side by side
over a run's history, and the paper-style tables (pure functions of result dicts; the
runner is ``fedjax_inv.runner.lodo.run_lodo``).

For every held-out domain × algorithm × seed, ``fedjax_inv.runner.lodo.run_lodo`` builds the
domain task with that ``holdout`` (the shared domain-task contract: training clients = the
source domains,
``eval_sets = {'val': one client per source domain (its validation split), 'ood': the
held-out domain}``), trains with ``fedjax_inv.runner.simulation.run`` and reads the OOD
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
column per held-out domain and ``avg``, each ``mean ± std`` over seeds
(:func:`fedjax_inv.runner.outputs.mean_std`: the sample std, ddof 1); ``avg`` is the mean over
held-out domains computed per seed, then mean ± std over seeds. Accuracies are fractions
in [0, 1] in the result dict and CSV, and percentages in the markdown table.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from fedjax_inv.runner import outputs

__all__ = ["SELECTIONS", "format_lodo_markdown", "lodo_csv", "lodo_table", "result_from_runs",
           "select_rounds"]

SELECTIONS = ("training-domain validation", "test-domain oracle", "last")
VALIDATIONS = ("mean", "pooled")

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


def result_from_runs(pl, runs, batched: bool = False) -> dict:
  """The leave-one-domain-out result of a plan's finished runs (the executor's run
  dicts, ``lodo_selected`` among their keys): ``task``, ``domains``, ``holdouts``,
  ``algorithms`` (run labels), ``seeds``, ``rounds``, ``eval_every``,
  ``clients_per_round``, ``validation``, ``replicas``, ``split_seed``, ``resplit``,
  ``task_kwargs``, ``selections``, ``runs`` (``holdout``, ``algorithm``, ``seed``,
  ``selected`` = :func:`select_rounds`, ``final``, ``history``, ``hparams``,
  ``execution``, ``seconds``), ``task_info`` (holdout → ``Task.info``), ``table``
  (:func:`lodo_table`). Diverged runs are left out (the executor records them).
  ``batched``: whether the executor ran any of them as one batched program."""
  ok = [r for r in runs if r.get("status", "ok") == "ok"]
  keep = ("holdout", "algorithm", "seed", "final", "history", "hparams", "execution",
          "seconds")
  result = {"task": pl.task.name, "domains": pl.domains, "holdouts": list(pl.holdouts),
            "algorithms": list(pl.names), "seeds": list(pl.seeds), "rounds": pl.rounds,
            "eval_every": pl.eval_every, "clients_per_round": pl.cohort,
            "validation": pl.validation,
            "replicas": "batched" if batched else "sequential",
            "split_seed": None if pl.resplit else pl.split_seed,
            "resplit": bool(pl.resplit),
            "task_kwargs": dict(pl.task_kwargs),
            "selections": list(SELECTIONS),
            "runs": [{**{k: r.get(k) for k in keep}, "selected": r["lodo_selected"]}
                     for r in ok],
            "task_info": {}}
  for h in pl.holdouts:
    r = next((r for r in ok if r["holdout"] == h), None)
    if r is not None:
      result["task_info"][h] = r.get("data")
  result["table"] = lodo_table(result)
  return result
