"""Run outputs: metrics.jsonl, summary.json, results tables (markdown/CSV), curves.png.

Everything is written into a temporary sibling directory and moved into place at the end,
so an interrupted run never leaves a half-written results folder.
"""
from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import pathlib
import shutil
import tempfile

import numpy as np


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike):
  """Yields a temp directory next to ``path``; on success it replaces ``path``."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
  try:
    yield tmp
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  old = None
  if path.exists():
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    os.replace(path, old)
  os.replace(tmp, path)
  if old is not None:
    shutil.rmtree(old, ignore_errors=True)


def write_json(path, obj) -> None:
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(obj, indent=2, sort_keys=False, default=_jsonable) + "\n")


def write_jsonl(path, rows) -> None:
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, "w") as f:
    for r in rows:
      f.write(json.dumps(r, default=_jsonable) + "\n")


def _jsonable(o):
  if isinstance(o, (np.floating, np.integer)):
    return o.item()
  if isinstance(o, np.ndarray):
    return o.tolist()
  if isinstance(o, tuple):
    return list(o)
  return str(o)


def mean_std(values) -> tuple[float, float]:
  v = np.asarray(values, np.float64)
  return float(v.mean()), float(v.std(ddof=0)) if len(v) > 1 else 0.0


def comparison_table(runs: list[dict], metrics: list[str]) -> list[dict]:
  """One row per algorithm (in first-seen order): ``{metric}_mean`` / ``{metric}_std``
  over seeds, and ``seeds``.

  A metric is a column name of ``fedjax_inv.eval.reporting.column_value``: ``'<m>'`` —
  the run's ``final`` (last-round) value; ``'<m>@<rule>'`` — at the round selected by
  ``rule`` (``run['selected']``, e.g. ``'ood_accuracy@min:ood_loss'``); ``'<m>@last<k>'``
  — the mean over the last ``k`` rounds (``run['last_k_mean']``). Runs without the
  value are left out of that cell (no cell if none has it)."""
  from fedjax_inv.eval.reporting import column_value
  order, groups = [], {}
  for r in runs:
    a = r["algorithm"]
    if a not in groups:
      order.append(a)
      groups[a] = []
    groups[a].append(r)
  rows = []
  for a in order:
    row = {"algorithm": a, "seeds": len(groups[a])}
    for m in metrics:
      vals = [v for v in (column_value(g, m) for g in groups[a]) if v is not None]
      if vals:
        row[f"{m}_mean"], row[f"{m}_std"] = mean_std(vals)
    rows.append(row)
  return rows


def format_table(rows: list[dict], metrics: list[str], markdown: bool = True) -> str:
  """Paper-style table: ``mean ± std`` per metric."""
  header = ["algorithm", "seeds"] + metrics
  lines = []
  body = []
  for r in rows:
    cells = [r["algorithm"], str(r["seeds"])]
    for m in metrics:
      if f"{m}_mean" in r:
        cells.append(f"{r[f'{m}_mean']:.3f} ± {r[f'{m}_std']:.3f}")
      else:
        cells.append("–")
    body.append(cells)
  if markdown:
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join("---" for _ in header) + "|")
    lines += ["| " + " | ".join(c) + " |" for c in body]
  else:
    widths = [max(len(h), *(len(c[i]) for c in body)) for i, h in enumerate(header)]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c[i].ljust(w) for i, w in enumerate(widths)) for c in body]
  return "\n".join(lines)


def table_csv(rows: list[dict], metrics: list[str]) -> str:
  buf = io.StringIO()
  fields = ["algorithm", "seeds"] + [f"{m}_{s}" for m in metrics for s in ("mean", "std")]
  w = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore")
  w.writeheader()
  for r in rows:
    w.writerow(r)
  return buf.getvalue()


def plot_curves(path, runs: list[dict], title: str = "",
                sets: tuple[str, ...] = ("train", "ood")) -> None:
  """curves.png: accuracy (or MSE) vs round; one color per algorithm, dashed = training
  clients, solid = the other evaluation sets; mean over seeds with a ±1 std band."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(7, 4.8), dpi=120)
  algos = list(dict.fromkeys(r["algorithm"] for r in runs))
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  first = runs[0]["history"][0]
  metric = "accuracy" if any(k.endswith("_accuracy") for k in first) else "mse"
  styles = {s: ("--" if s == "train" else "-") for s in sets}
  for i, a in enumerate(algos):
    rs = [r for r in runs if r["algorithm"] == a]
    rounds = [h["round"] for h in rs[0]["history"]]
    for s in sets:
      key = f"{s}_{metric}"
      if key not in rs[0]["history"][0]:
        continue
      ys = np.array([[h[key] for h in r["history"]] for r in rs])
      mu, sd = ys.mean(0), ys.std(0)
      c = colors[i % len(colors)]
      ax.plot(rounds, mu, styles[s], color=c, label=f"{a} ({s})")
      if len(rs) > 1:
        ax.fill_between(rounds, mu - sd, mu + sd, color=c, alpha=0.15)
  ax.set_xlabel("round")
  ax.set_ylabel(metric)
  if metric == "accuracy":
    ax.set_ylim(0, 1)
    ax.axhline(0.5, color="grey", lw=0.6, ls=":")
  ax.set_title(title, fontsize=9)
  ax.legend(fontsize=7, ncol=min(4, 2 * len(algos)), loc="upper center",
            bbox_to_anchor=(0.5, -0.14), frameon=False)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
