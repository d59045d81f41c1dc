"""Experiment logs besides ``metrics.jsonl`` and ``summary.json``: TensorBoard event files,
Weights & Biases runs and a CSV file, written through maintained libraries (tensorboardX,
wandb, the csv module).

A logger receives every evaluation of every run as it completes:
``log(run, config, entry)``, where ``run`` names the run (its folder under ``--out``),
``config`` holds its hyperparameters, seed and held-out domain, and ``entry`` is the
history entry that also goes to ``metrics.jsonl`` (``round`` plus one number per metric:
train loss, each evaluation set's accuracy / AUROC / MSE, wall time, ...). ``close()``
ends every run. The CLI builds them from ``--log tensorboard,wandb,csv``
(:func:`make_loggers`); the Python API takes the same objects:
``run(task, alg, rounds=..., loggers=[TensorBoardLogger("runs/tb")])``.

* :class:`TensorBoardLogger`: one event folder per run, ``DIR/<run>/``, one scalar per
  metric per round (``global_step`` = round).
* :class:`WandbLogger`: one W&B run per run, hyperparameters in its config, metrics
  logged at ``step`` = round. Offline (``DIR/wandb/offline-run-*``, sync later with
  ``wandb sync``) unless ``WANDB_MODE`` is set or ``WANDB_API_KEY`` is present: it never
  prompts for a login.
* :class:`CsvLogger`: ``DIR/metrics.csv`` in long form: ``run, round, metric, value,
  wall_time``.

Wall time: TensorBoard stores it with every scalar, W&B with every step (``_runtime``),
the CSV in its own column.

Install: ``pip install 'fedjax_inv[log]'`` (tensorboardX, wandb).
"""
from __future__ import annotations

import csv
import importlib.util
import math
import numbers
import os
import pathlib
import time
from typing import Any, Iterable

LOGGERS = ("tensorboard", "wandb", "csv")
_NEEDS = {"tensorboard": "tensorboardX", "wandb": "wandb"}


def _scalars(entry: dict) -> dict:
  """The finite real numbers of ``entry`` except ``round``."""
  out = {}
  for k, v in entry.items():
    if k == "round" or isinstance(v, bool) or not isinstance(v, numbers.Real):
      continue
    if math.isfinite(float(v)):
      out[k] = float(v)
  return out


def check_loggers(value, where: str = "--log") -> list[str]:
  """``'tensorboard,csv'`` (or a list) → ``['tensorboard', 'csv']``; ``''``/None → [].

  Raises:
    ValueError: an unknown or repeated name, or a logger whose library is not installed
      (the message names the value and the fix).
  """
  if value is None:
    return []
  names = [n.strip().lower() for n in (value.split(",") if isinstance(value, str) else value)]
  names = [n for n in names if n and n != "none"]
  bad = [n for n in names if n not in LOGGERS]
  if bad:
    raise ValueError(f"{where} {value!r}: unknown logger {bad}; choose from "
                     f"{', '.join(LOGGERS)} (comma-separated).")
  if len(set(names)) != len(names):
    raise ValueError(f"{where} {value!r}: a logger is named twice.")
  for n in names:
    mod = _NEEDS.get(n)
    if mod and importlib.util.find_spec(mod) is None:
      raise ValueError(f"{where} {n}: the {mod} package is not installed; run "
                       "`pip install 'fedjax_inv[log]'` (or leave it out of "
                       f"{where}).")
  return names


class TensorBoardLogger:
  """TensorBoard event files, ``dir/<run>/events.out.tfevents.*`` (tensorboardX)."""

  def __init__(self, dir):
    self.dir = pathlib.Path(dir)
    self._writers: dict = {}

  def log(self, run: str, config: dict, entry: dict) -> None:
    from tensorboardX import SummaryWriter
    w = self._writers.get(run)
    if w is None:
      w = self._writers[run] = SummaryWriter(logdir=str(self.dir / run))
      w.add_text("config", "\n".join(f"{k}: {v}" for k, v in sorted(config.items())), 0)
    step = int(entry["round"])
    for k, v in _scalars(entry).items():
      w.add_scalar(k, v, global_step=step)
    w.flush()

  def close(self) -> None:
    for w in self._writers.values():
      w.close()
    self._writers.clear()


class WandbLogger:
  """One Weights & Biases run per run (offline unless ``WANDB_MODE``/``WANDB_API_KEY``)."""

  def __init__(self, dir, project: str = "fedjax_inv"):
    self.dir = pathlib.Path(dir)
    self.project = project
    self._runs: dict = {}

  def _mode(self) -> str:
    if os.environ.get("WANDB_MODE"):
      return os.environ["WANDB_MODE"]
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"

  def log(self, run: str, config: dict, entry: dict) -> None:
    import wandb
    r = self._runs.get(run)
    if r is None:
      self.dir.mkdir(parents=True, exist_ok=True)
      # quiet: no banner per run on the console (the run's own progress stays readable);
      # console="off": W&B does not capture the process's stdout/stderr.
      r = self._runs[run] = wandb.init(
          project=self.project, name=run, config=_plain(config), dir=str(self.dir),
          mode=self._mode(), reinit="create_new",
          settings=wandb.Settings(quiet=True, console="off", disable_git=True))
    r.log(_scalars(entry), step=int(entry["round"]))

  def close(self) -> None:
    for r in self._runs.values():
      r.finish()
    self._runs.clear()


class CsvLogger:
  """``dir/metrics.csv``: one row per run, round and metric (long form), with the wall
  time (Unix seconds) at which the evaluation was logged."""

  def __init__(self, dir):
    self.path = pathlib.Path(dir) / "metrics.csv"

  def log(self, run: str, config: dict, entry: dict) -> None:
    new = not self.path.exists()
    self.path.parent.mkdir(parents=True, exist_ok=True)
    with open(self.path, "a", newline="") as f:
      w = csv.writer(f)
      if new:
        w.writerow(["run", "round", "metric", "value", "wall_time"])
      now = round(time.time(), 3)
      for k, v in _scalars(entry).items():
        w.writerow([run, int(entry["round"]), k, repr(v), now])

  def close(self) -> None:
    pass


def _plain(config: dict) -> dict:
  """JSON-like values for a W&B config (anything else as its string)."""
  out = {}
  for k, v in config.items():
    out[k] = v if isinstance(v, (str, int, float, bool, type(None), list, dict)) else str(v)
  return out


def make_loggers(names: Iterable[str], out) -> list[Any]:
  """Loggers writing under the run folder ``out``: ``tensorboard`` → ``out/tensorboard/``,
  ``wandb`` → ``out/wandb/``, ``csv`` → ``out/metrics.csv``.

  Raises:
    ValueError: as :func:`check_loggers`.
  """
  names = check_loggers(list(names))
  out = pathlib.Path(out)
  make = {"tensorboard": lambda: TensorBoardLogger(out / "tensorboard"),
          "wandb": lambda: WandbLogger(out), "csv": lambda: CsvLogger(out)}
  return [make[n]() for n in names]


def close_all(loggers) -> None:
  """Closes every logger (each one even when another fails; the first error is raised)."""
  err = None
  for lg in loggers or ():
    try:
      lg.close()
    except Exception as e:  # noqa: BLE001
      err = err or e
  if err is not None:
    raise err
