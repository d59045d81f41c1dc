"""Run outputs: metrics.jsonl, summary.json, results tables (markdown/CSV), curves.png.

Files are written atomically (temp file + rename); ``metrics.jsonl`` is appended as each
evaluation completes. Output folders are checked first (``check_out_dir``): an existing
file, or a non-empty folder fedjax-inv did not create, is never written into or deleted.
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


MARKER = ".fedjax-inv-run"  # written into every output folder fedjax-inv creates


def check_out_dir(path, overwrite: bool = False) -> pathlib.Path:
  """Checks that ``path`` may receive a run's outputs, without creating anything.

  Allowed: a path that does not exist, an empty directory, or (``overwrite=True`` only)
  a directory that fedjax-inv itself wrote (it holds the ``MARKER`` file). Nothing else
  is ever replaced or deleted, so a wrong ``--out`` cannot destroy a user's files.

  Raises:
    ValueError: ``path`` is a file; or a non-empty directory without ``overwrite``; or a
      non-empty directory that fedjax-inv did not create (even with ``overwrite``).
  """
  path = pathlib.Path(path)
  if path.exists() and not path.is_dir():
    raise ValueError(f"--out {str(path)!r} is an existing file, not a directory; choose "
                     "a new folder name.")
  if path.is_dir() and any(path.iterdir()):
    if not (path / MARKER).exists():
      raise ValueError(f"--out {str(path)!r} is a non-empty directory that fedjax-inv did "
                       "not create; refusing to write into it (nothing was changed). "
                       "Choose a new or empty folder.")
    if not overwrite:
      raise ValueError(f"--out {str(path)!r} already holds a fedjax-inv run; pass "
                       "--overwrite to replace it, --resume to continue it, or choose "
                       "a new folder.")
  return path


def remove_run_dir(path) -> None:
  """Deletes ``path`` only if it is empty or holds fedjax-inv's ``MARKER`` file.

  Raises:
    ValueError: ``path`` exists and was not created by fedjax-inv (see
      :func:`check_out_dir`).
  """
  path = check_out_dir(path, overwrite=True)
  if path.is_dir():
    shutil.rmtree(path)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, overwrite: bool = True):
  """Yields a temp directory next to ``path``; on success it is moved to ``path``.

  ``path`` must not exist, be an empty directory, or a directory fedjax-inv wrote (it
  holds ``MARKER``; replaced only with ``overwrite=True``, the default here — the CLI
  asks the user for ``--overwrite`` before it gets this far). A directory fedjax-inv did
  not create is never replaced or deleted (:func:`check_out_dir`). On an exception the temp
  directory (ours) is removed and ``path``
  is untouched.

  Raises:
    ValueError: ``path`` is a file or a foreign / non-empty directory (checked before
      and again after the body runs).
  """
  path = pathlib.Path(path)
  check_out_dir(path, overwrite)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
  try:
    (tmp / MARKER).write_text("written by fedjax-inv\n")
    yield tmp
    check_out_dir(path, overwrite)
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


def write_text_atomic(path, text: str) -> None:
  """Writes ``text`` to ``path`` via a temp file + ``os.replace`` (never half-written)."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
  try:
    with os.fdopen(fd, "w") as f:
      f.write(text)
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are ordinary files
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.unlink(tmp)
    raise


def append_jsonl(path, row: dict) -> None:
  """Appends one JSON line to ``path`` and flushes it to the OS (streamed metrics)."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, "a") as f:
    f.write(json.dumps(row, default=_jsonable) + "\n")
    f.flush()


def write_json(path, obj) -> None:
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=False, default=_jsonable)
                    + "\n")


def write_jsonl(path, rows) -> None:
  write_text_atomic(path, "".join(json.dumps(r, default=_jsonable) + "\n" for r in rows))


def _jsonable(o):
  if isinstance(o, (np.floating, np.integer)):
    return o.item()
  if isinstance(o, np.ndarray):
    return o.tolist()
  if isinstance(o, tuple):
    return list(o)
  return str(o)


# The project's one convention for "mean ± std over seeds": the sample standard deviation
# (ddof 1), over the finite values only; the count of finite values is shown beside it
# whenever a seed diverged (format_mean_std), never dropped silently.
DDOF = 1


def final_line(final) -> str:
  """A run's headline metrics on one line, ``'train_accuracy=0.9327 test_accuracy=0.9070'``
  (every ``*_accuracy`` / ``*_mse`` but the per-client ones), or ``'diverged'`` for a run
  without final metrics."""
  if final is None:
    return "diverged"
  return " ".join(f"{k}={v:.4f}" for k, v in final.items()
                  if k.endswith(("_accuracy", "_mse")) and "client" not in k)


def finite(values) -> list[float]:
  """The finite entries of ``values`` (``None``, NaN and ±inf are a diverged run's)."""
  return [float(x) for x in values if x is not None and np.isfinite(x)]


def mean_std(values) -> tuple[float, float]:
  """``(mean, std)`` over the finite entries of ``values`` (shape ``[seeds]``; ``None``
  / NaN / inf mark a diverged seed and are left out; :func:`format_mean_std` shows how
  many). ``std`` is the sample standard deviation (``ddof=1``, :data:`DDOF`), 0.0 for a
  single finite value. Returns ``(nan, nan)`` when no value is finite. Used by ``run``,
  ``tune``, the experiments' tables and the notebooks alike."""
  v = np.asarray(finite(values), np.float64)
  if v.size == 0:
    return math.nan, math.nan
  return float(v.mean()), float(v.std(ddof=DDOF)) if v.size > DDOF else 0.0


def format_mean_std(values, digits: int = 3, scale: float = 1.0) -> str:
  """``'m ± s'`` of :func:`mean_std` over ``values * scale``, with ``' (k/n finite)'``
  appended when only ``k`` of the ``n`` values are finite, and ``'diverged (0/n
  finite)'`` when none is; ``'–'`` for no values at all."""
  values = list(values)
  if not values:
    return "–"
  ok = finite(values)
  if not ok:
    return f"diverged (0/{len(values)} finite)"
  m, sd = mean_std([v * scale for v in ok])
  out = f"{m:.{digits}f} ± {sd:.{digits}f}"
  return out + (f" ({len(ok)}/{len(values)} finite)" if len(ok) < len(values) else "")


def comparison_table(runs: list[dict], metrics: list[str], value) -> list[dict]:
  """One row per algorithm (in first-seen order): ``{metric}_mean`` / ``{metric}_std``
  over seeds, and ``seeds``.

  ``value(run, metric)`` reads one cell (``None``: the run has none); the run layer
  passes ``fedjax_inv.eval.reporting.column_value``, whose column names are: ``'<m>'`` —
  the run's ``final`` (last-round) value; ``'<m>@<rule>'`` — at the round selected by
  ``rule`` (``run['selected']``, e.g. ``'ood_accuracy@min:ood_loss'``); ``'<m>@last<k>'``
  — the mean over the last ``k`` rounds (``run['last_k_mean']``). Runs without the
  value are left out of that cell (no cell if none has it)."""
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
      # a diverged run counts (as not finite); an ok run without the metric does not
      vals = [math.nan if g.get("status", "ok") != "ok" else value(g, m) for g in groups[a]]
      vals = [v for v in vals if v is not None]
      if any(v is not None and np.isfinite(v) for v in vals):
        row[f"{m}_mean"], row[f"{m}_std"] = mean_std(vals)
      if vals:
        row[f"{m}_finite"] = len(finite(vals))
        row[f"{m}_n"] = len(vals)
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
      k, n = r.get(f"{m}_finite", 1), r.get(f"{m}_n", 1)
      if f"{m}_mean" in r:
        cells.append(f"{r[f'{m}_mean']:.3f} ± {r[f'{m}_std']:.3f}"
                     + (f" ({k}/{n} finite)" if k < n else ""))
      elif f"{m}_n" in r:
        cells.append(f"diverged (0/{n} finite)")
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


# Curves with at most this many evaluated rounds get a marker at each point (a run with
# one evaluation is a dot, not an empty plot).
MARKER_MAX_POINTS = 20


def plot_curves(path, runs: list[dict], title: str = "",
                sets: tuple[str, ...] = ("train", "ood"),
                num_classes: int | None = None) -> None:
  """curves.png: :func:`curves_figure` written to ``path`` (PNG).

  Args:
    path: the image file to write.
    runs, title, sets, num_classes: as :func:`curves_figure`.

  Raises:
    IndexError: ``runs`` is empty or its first run has no history.
  """
  fig = curves_figure(runs, title, sets, num_classes)  # selects the Agg backend
  import matplotlib.pyplot as plt
  fig.savefig(path)
  plt.close(fig)


def curves_figure(runs: list[dict], title: str = "",
                  sets: tuple[str, ...] = ("train", "ood"),
                  num_classes: int | None = None):
  """The figure of curves.png: accuracy (or MSE) vs round; one color per algorithm,
  dashed = training clients, solid = the other evaluation sets; mean over seeds with a
  ±1 std band. Curves with at most :data:`MARKER_MAX_POINTS` evaluated rounds get a
  marker at each point (a run evaluated once is a dot, not an empty plot).

  Args:
    runs: run dicts with ``algorithm`` and ``history`` (``RunResult.history`` entries:
      ``round`` and ``<set>_accuracy`` or ``<set>_mse``); the seeds of one algorithm
      must share their evaluated rounds.
    title: the plot's title.
    sets: the evaluation sets drawn (``train`` dashed, the others solid).
    num_classes: the task's number of classes K (2 for binary;
      ``fedjax_inv.runner.experiment.num_classes``): an accuracy plot gets a dotted chance line
      at 1/K; None (regression, or unknown): no chance line.

  Returns:
    a matplotlib ``Figure`` (Agg backend; the caller closes it, ``plt.close(fig)``).

  Raises:
    IndexError: ``runs`` is empty or its first run has no history.
  """
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
      ax.plot(rounds, mu, styles[s], color=c, label=f"{a} ({s})",
              marker="o" if len(rounds) <= MARKER_MAX_POINTS else None, markersize=4)
      if len(rs) > 1:
        ax.fill_between(rounds, mu - sd, mu + sd, color=c, alpha=0.15)
  ax.set_xlabel("round")
  ax.set_ylabel(metric)
  if metric == "accuracy":
    ax.set_ylim(0, 1)
    if num_classes is not None and int(num_classes) >= 2:
      ax.axhline(1.0 / int(num_classes), color="grey", lw=0.6, ls=":", label="_chance")
  ax.set_title(title, fontsize=9)
  ax.legend(fontsize=7, ncol=min(4, 2 * len(algos)), loc="upper center",
            bbox_to_anchor=(0.5, -0.14), frameon=False)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  return fig
