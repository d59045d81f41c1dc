"""A run's progress on stderr, wherever it runs.

* In a terminal (stderr is a tty): a tqdm bar over rounds, as before.
* Anywhere else (``nohup``, CI, ``> log 2>&1``, a pipe, a notebook): one plain line per
  evaluated round, and at least one line every :data:`INTERVAL_S` seconds of wall time
  even when no round is evaluated (checked at the end of each device call), each flushed::

    fedavg seed 0: round 20/100, 0.12 s/round, ETA 9.6 s; train_acc 0.812 ood_acc 0.640 ...

* ``progress=False`` (``fedjax-inv run --no-progress``): nothing.

Either way the first line of a run says how long its data loading and its compilation
took (``fedavg seed 0: data 3.1 s, compile 4.2 s``), and :meth:`RunProgress.timing` keeps
those numbers for the run's ``summary.json`` (``timing``).

The bar is ``tqdm.std``; ``tqdm.auto`` only when ``ipywidgets`` is importable (without it
``tqdm.auto`` in Jupyter warns ``IProgress not found``).
"""
from __future__ import annotations

import statistics
import sys
import time

# At least one plain line per this many seconds of wall time (not in a terminal).
INTERVAL_S = 60.0
# s/round and the ETA are the mean over the last this many timed stretches of rounds.
WINDOW = 20
# The evaluation sets shown first on a line (then the others), and at most this many.
MAIN_SETS = ("train", "ood", "test", "val")
MAX_SETS = 3


def clock() -> float:
  """Wall-clock seconds (``time.perf_counter``); every time in this module is read here,
  so tests can replace it."""
  return time.perf_counter()


def is_terminal(stream) -> bool:
  """Whether ``stream`` is a terminal (``isatty()``; False when it has none or raises)."""
  try:
    return bool(stream.isatty())
  except (AttributeError, ValueError, OSError):
    return False


def bar_class():
  """The tqdm class of the bar: ``tqdm.auto.tqdm`` when ``ipywidgets`` is importable,
  else ``tqdm.std.tqdm`` (never a notebook bar that cannot draw)."""
  try:
    import ipywidgets  # noqa: F401
  except ImportError:
    from tqdm.std import tqdm
    return tqdm
  from tqdm.auto import tqdm
  return tqdm


def format_seconds(s: float | None) -> str:
  """``s`` seconds for a progress line: '0.12 s', '9.6 s', '4 min 03 s', '2 h 05 min';
  '?' for None."""
  if s is None:
    return "?"
  if s <= 0:
    return "0 s"
  if s < 1:
    return f"{s:.2f} s"
  if s < 60:
    return f"{s:.1f} s"
  s = int(round(s))
  if s < 3600:
    return f"{s // 60} min {s % 60:02d} s"
  return f"{s // 3600} h {s % 3600 // 60:02d} min"


def main_metrics(entry: dict | None) -> dict:
  """The few metrics a progress line shows from an evaluation ``entry`` (a
  ``RunResult.history`` item): for up to :data:`MAX_SETS` evaluation sets (``train``,
  ``ood``, ``test``, ``val`` first) their accuracy and loss as ``<set>_acc`` and
  ``<set>_loss``, or their ``<set>_mse`` (a regression's loss). Returns ``{short name:
  float}`` (empty for None)."""
  if not entry:
    return {}
  sets = []
  for k in entry:
    for end in ("_accuracy", "_mse"):
      s = k[: -len(end)]
      if (k.endswith(end) and s and not s.startswith("personal_") and "client" not in s
          and s not in sets):
        sets.append(s)
  sets.sort(key=lambda s: (MAIN_SETS.index(s) if s in MAIN_SETS else len(MAIN_SETS)))
  out = {}
  for s in sets[:MAX_SETS]:
    names = (((f"{s}_accuracy", f"{s}_acc"), (f"{s}_loss", f"{s}_loss"))
             if f"{s}_accuracy" in entry else ((f"{s}_mse", f"{s}_mse"),))
    for k, short in names:
      if isinstance(entry.get(k), (int, float)):
        out[short] = float(entry[k])
  return out


def mean_entry(entries: list) -> dict | None:
  """The mean of the numeric values of several replicas' entries of one round (the keys
  of the first), or None for no entries."""
  entries = [e for e in entries if e]
  if not entries:
    return None
  return {k: sum(float(e[k]) for e in entries) / len(entries) for k, v in entries[0].items()
          if isinstance(v, (int, float)) and all(isinstance(e.get(k), (int, float))
                                                 for e in entries)}


class RunProgress:
  """The progress of one run (or one batch of replicas) over its rounds; a context
  manager (the bar, if any, is closed on exit).

  Args:
    label: the run's name on every line, e.g. ``'fedavg seed 0'``.
    total: rounds of the run (>= 1).
    enabled: False: prints nothing (the timings are still kept).
    initial: rounds already done (a resumed run).
    desc: the bar's description (terminal only; default ``label``).
    load_s: seconds spent loading the run's data (building its task), or None when
      unknown (a task built by the caller); shown on the first line and in
      :meth:`timing`.
    started: :func:`clock` value when the run's setup began (checks, building and
      compiling its program, its initial states); default now. ``compile_s`` is
      measured from there.
    stream: where lines go (default ``sys.stderr``, read when constructed).
    terminal: draw a tqdm bar (True) or print plain lines (False); default
      :func:`is_terminal` of ``stream``.
    interval_s: the longest wall time between two plain lines (seconds, > 0).

  Raises:
    ValueError: ``total < 1`` or ``interval_s <= 0``.
  """

  def __init__(self, label: str, total: int, *, enabled: bool = True, initial: int = 0,
               desc: str = "", load_s: float | None = None, started: float | None = None,
               stream=None, terminal: bool | None = None, interval_s: float = INTERVAL_S):
    if int(total) < 1 or interval_s <= 0:
      raise ValueError(f"total={total}, interval_s={interval_s}; need total >= 1 and "
                       "interval_s > 0.")
    self.label, self.total, self.enabled = label, int(total), bool(enabled)
    self.load_s = None if load_s is None else float(load_s)
    self.started = clock() if started is None else float(started)
    self.stream = sys.stderr if stream is None else stream
    self.terminal = is_terminal(self.stream) if terminal is None else bool(terminal)
    self.interval_s = float(interval_s)
    self.round = self.initial = int(initial)
    self.compile_s = self.first_round_at_s = None
    self.per_round: list = []  # (rounds, seconds) per timed stretch after the first call
    self._mark = None  # (clock, round) at the last synchronized call boundary
    self._last_line = self.started
    self._metrics, self._metrics_round = {}, None
    self.bar = None
    if self.enabled and self.terminal:
      self.bar = bar_class()(total=self.total, initial=int(initial), desc=desc or label,
                             unit="round", leave=False, file=self.stream)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
    return False

  def close(self) -> None:
    """Closes the bar (if any)."""
    if self.bar is not None:
      self.bar.close()
      self.bar = None

  def due(self) -> bool:
    """Whether the next boundary prints a plain line because :data:`INTERVAL_S` passed
    (the loop then waits for the device first, so the line reports finished rounds)."""
    return (self.enabled and not self.terminal and
            clock() - self._last_line >= self.interval_s)

  def seconds_per_round(self) -> float | None:
    """Mean wall seconds per round over the last :data:`WINDOW` timed stretches (device
    calls that ended synchronized, evaluation included); None before any."""
    recent = self.per_round[-WINDOW:]
    n = sum(r for r, _ in recent)
    return sum(s for _, s in recent) / n if n else None

  def update(self, round_: int, rounds: int, metrics: dict | None = None,
             synced: bool = True) -> None:
    """After a device call that ran ``rounds`` rounds and ended at round ``round_``.

    Args:
      round_: the last round done (1-based).
      rounds: rounds that call ran (>= 1).
      metrics: the evaluation entry of ``round_`` (:func:`main_metrics` picks what is
        shown), or None when it was not evaluated.
      synced: the device finished the call before this (its results were read); only
        then does the call's wall time count towards s/round. Without a
        :meth:`first_call_done` before the first update, the first update's time
        defines ``compile_s``.
    """
    now = clock()
    self.round = int(round_)
    if self.compile_s is None:
      self.first_call_done(now)
    if self._mark is None:  # the first call: its evaluation counts in no stretch
      self._mark = (now, self.round)
    elif synced and self.round > self._mark[1]:
      self.per_round.append((self.round - self._mark[1], now - self._mark[0]))
      self._mark = (now, self.round)
    if metrics is not None:
      self._metrics, self._metrics_round = main_metrics(metrics), self.round
    if self.bar is not None:
      if metrics is not None and self._metrics:
        self.bar.set_postfix({k: f"{v:.3f}" for k, v in self._metrics.items()
                              if k.endswith(("_acc", "_mse"))}, refresh=False)
      self.bar.update(rounds)
    elif self.enabled and (metrics is not None or now - self._last_line >= self.interval_s):
      self._emit(self.line())
      self._last_line = now

  def first_call_done(self, now: float | None = None) -> None:
    """Records the end of the run's first device call (the caller waited for it):
    ``compile_s`` and ``first_round_at_s``; prints the first line. ``now``: a
    :func:`clock` value (default: now)."""
    now = clock() if now is None else float(now)
    self.compile_s = now - self.started
    self.first_round_at_s = now - self.started + (self.load_s or 0.0)
    self._emit(self.first_line())
    self._last_line = now  # the next plain line within INTERVAL_S of this one

  def first_line(self) -> str:
    """'<label>: data 3.1 s, compile 4.2 s' (no 'data' part when ``load_s`` is None)."""
    parts = ([] if self.load_s is None else [f"data {self.load_s:.1f} s"])
    parts.append(f"compile {self.compile_s:.1f} s")
    resumed = f" (resumed after round {self.initial})" if self.initial else ""
    return f"{self.label}: {', '.join(parts)}{resumed}"

  def line(self) -> str:
    """The plain progress line: label, round/total, s/round, ETA and the metrics of the
    last evaluation (marked with its round when it is not the current one)."""
    spr = self.seconds_per_round()
    eta = None if spr is None else spr * (self.total - self.round)
    text = (f"{self.label}: round {self.round}/{self.total}, "
            f"{'?' if spr is None else f'{spr:.3g}'} s/round, ETA {format_seconds(eta)}")
    if self._metrics:
      at = "" if self._metrics_round == self.round else f"at round {self._metrics_round}: "
      text += "; " + at + " ".join(f"{k} {v:.4g}" for k, v in self._metrics.items())
    return text

  def _emit(self, text: str) -> None:
    if not self.enabled:
      return
    if self.bar is not None:
      self.bar.write(text, file=self.stream)
    else:
      print(text, file=self.stream, flush=True)

  def timing(self) -> dict:
    """``summary.json``'s ``timing``: ``load_s`` (data loading, None when unknown),
    ``compile_s`` (from the start of the run's setup to the end of its first device
    call: tracing and XLA compilation of the round, the strategy choice, the initial
    states and that call's execution), ``first_round_at_s`` (from the start of the run,
    its data loading included, to the end of its first round; of this attempt when
    resumed), ``round_s`` (median wall seconds per round after the first call,
    evaluation included; None with no timed stretch), all rounded to 3 decimals."""
    def r3(x):
      return None if x is None else round(float(x), 3)
    med = (statistics.median(s / r for r, s in self.per_round) if self.per_round
           else None)
    return {"load_s": r3(self.load_s), "compile_s": r3(self.compile_s),
            "first_round_at_s": r3(self.first_round_at_s), "round_s": r3(med)}
