"""Reproduction verdicts: one vocabulary, computed from the numbers.

A *claim* is one comparison a paper makes: a method against a baseline on one metric
(e.g. FedSR Table 1: FedSR 96.7 against FedAvg 94.5 average accuracy). Ours is the same
comparison over our seeds. Its verdict is one of:

* ``reproduced`` — our method's value is within ``max(the paper's ±, 1 point)`` of the
  paper's value, and its effect over the baseline has the paper's sign (or there is no
  baseline). A *point* is the claim's unit of tolerance: 1 for accuracies in percent, 0.01
  for accuracies as fractions; other metrics (an MSE, a loss) state theirs.
* ``direction`` — not reproduced in level, but our effect has the paper's sign and is
  larger than the seed spread (the larger of the two methods' std over seeds).
* ``not reproduced`` — our effect has the opposite sign, or is within the seed spread
  ("no effect").

A paper effect within the paper's own ± is "no effect" in the paper: such a claim is
``reproduced`` when our level is within the tolerance and our effect within the larger of
the seed spread and the tolerance, and ``not reproduced`` otherwise (there is no direction
to follow).
* ``not run`` — no numbers of ours; the claim says why.

The effect is ``method − baseline``, oriented so that positive is better (``higher=False``
for losses and errors). ± over seeds is :func:`fedjax_inv.runner.outputs.mean_std`'s (sample std,
ddof 1, finite values only). Used by every results table of ``experiments/`` and by the
top-level reproductions table, so the two cannot disagree.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from fedjax_inv.runner import outputs

VERDICTS = ("reproduced", "direction", "not reproduced", "not run")


@dataclasses.dataclass(frozen=True)
class Claim:
  """One paper comparison and ours.

  Attributes:
    paper: the paper's short name (``'FedSR'``).
    what: task, metric and where in the paper (``'RotatedMNIST, avg of 6 held-out
      domains, acc. % (Table 1)'``).
    method: the method's name (``'FedSR'``).
    paper_value: the paper's number for the method (``None`` if the paper gives none).
    ours: our values for the method, one per seed (``None`` / NaN: a diverged seed).
    baseline: the baseline's name (``'FedAvg'``), or ``None`` for a level-only claim.
    paper_baseline: the paper's number for the baseline.
    ours_baseline: our values for the baseline, one per seed.
    paper_pm: the paper's ± on ``paper_value`` (0 if none).
    point: the tolerance unit (1.0 for accuracy %, 0.01 for accuracy fractions).
    higher: True if higher is better.
    protocol: how our settings were chosen: ``'paper settings'``, ``'starting values'``,
      ``'selected on validation'``, ``'selected on OOD (seed 0, a reported seed)'``, ...
    setting: our reduction (data size, rounds, machine), shown beside the numbers.
    folder: the ``experiments/`` folder with the command and the raw per-seed files.
    digits: decimals shown.
    reason: for ``not run``: why.
    raw: ``False`` if no per-seed files are behind ``ours`` (aggregates only); the table
      says so.
    ours_agg, ours_baseline_agg: ``(mean, sample std, seeds)`` when only aggregates exist
      (``ours`` / ``ours_baseline`` then empty, and ``raw=False``).
    note: a caveat printed beside the verdict (e.g. why a gain is not attributable to
      the method).
  """
  paper: str
  what: str
  method: str
  paper_value: Optional[float]
  ours: Sequence[Optional[float]]
  baseline: Optional[str] = None
  paper_baseline: Optional[float] = None
  ours_baseline: Sequence[Optional[float]] = ()
  paper_pm: float = 0.0
  point: float = 1.0
  higher: bool = True
  protocol: str = "paper settings"
  setting: str = ""
  folder: str = ""
  digits: int = 1
  reason: str = ""
  raw: bool = True
  note: str = ""
  ours_agg: Optional[tuple] = None
  ours_baseline_agg: Optional[tuple] = None


def verdict(c: Claim) -> str:
  """The verdict of claim ``c`` (module docstring). Raises ValueError for a claim that
  has our numbers but no paper number to compare with."""
  ms = _stats(c.ours, c.ours_agg)
  mbs = _stats(c.ours_baseline, c.ours_baseline_agg) if c.baseline is not None else None
  if ms is None or (c.baseline is not None and mbs is None):
    return "not run"
  if c.paper_value is None:
    raise ValueError(f"claim {c.paper}: {c.what!r} has no paper value for {c.method}")
  sign = 1.0 if c.higher else -1.0
  (m, sd), tol = ms, max(c.paper_pm, c.point)
  level = abs(m - c.paper_value) <= tol
  if c.baseline is None:
    return "reproduced" if level else "not reproduced"
  mb, sdb = mbs
  ours_effect = sign * (m - mb)
  paper_effect = sign * (c.paper_value - c.paper_baseline)
  spread = max(sd, sdb)
  if abs(paper_effect) <= c.paper_pm or paper_effect == 0:  # no effect in the paper
    return ("reproduced" if level and abs(ours_effect) <= max(spread, tol)
            else "not reproduced")
  same_sign = (ours_effect > 0) == (paper_effect > 0)
  if level and same_sign:
    return "reproduced"
  if same_sign and abs(ours_effect) > spread:
    return "direction"
  return "not reproduced"


def _stats(values, agg) -> Optional[tuple]:
  """``(mean, std)`` of per-seed ``values``, else of the aggregate ``agg``; None if
  neither has a finite value."""
  if outputs.finite(values):
    return outputs.mean_std(values)
  if agg is not None:
    return float(agg[0]), float(agg[1])
  return None


def _cell(values, digits: int, agg=None) -> str:
  if not outputs.finite(values) and agg is not None:
    return f"{agg[0]:.{digits}f} ± {agg[1]:.{digits}f}"
  return outputs.format_mean_std(values, digits)


def _num(v, digits: int) -> str:
  return "–" if v is None else f"{v:.{digits}f}"


def row_cells(c: Claim) -> list[str]:
  """``[paper, what, protocol, paper's numbers, ours, verdict]`` of one claim."""
  d = c.digits
  pm = f" ± {c.paper_pm:.{d}f}" if c.paper_pm else ""
  if c.baseline is None:
    paper = f"{c.method} {_num(c.paper_value, d)}{pm}"
  else:
    paper = (f"{c.baseline} {_num(c.paper_baseline, d)} → {c.method} "
             f"{_num(c.paper_value, d)}{pm}")
  v = verdict(c)
  if v == "not run":
    ours = c.reason or "not run"
  else:
    mine = _cell(c.ours, d, c.ours_agg)
    ours = (f"{c.method} {mine}" if c.baseline is None else
            f"{c.baseline} {_cell(c.ours_baseline, d, c.ours_baseline_agg)} → "
            f"{c.method} {mine}")
    n = len(list(c.ours)) or (int(c.ours_agg[2]) if c.ours_agg else 0)
    ours += f" ({n} seed{'s' if n != 1 else ''}"
    ours += (", aggregates only: no per-seed files, not reproducible from this repository)"
             if not c.raw else ")")
    if c.setting:
      ours += f"; {c.setting}"
  return [c.paper, c.what, c.protocol, paper, ours,
          f"**{v}**" + (f" ({c.note})" if c.note else "")]


def table(claims: Sequence[Claim], folder_column: bool = False) -> str:
  """Markdown table of ``claims``, one row each, with its verdict; ``folder_column`` adds
  the ``experiments/`` folder (the top-level table)."""
  head = ["paper", "claim (task, metric)", "our settings chosen by", "paper",
          "ours (mean ± std over seeds)", "verdict"]
  if folder_column:
    head.append("folder")
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for c in claims:
    cells = row_cells(c)
    if folder_column:
      cells.append(f"`{c.folder}`" if c.folder else "–")
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def counts(claims: Sequence[Claim]) -> dict:
  """``{verdict: number of claims}`` for every verdict of :data:`VERDICTS`."""
  out = {v: 0 for v in VERDICTS}
  for c in claims:
    out[verdict(c)] += 1
  return out
