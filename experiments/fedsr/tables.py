"""The generated tables of experiments/fedsr/README.md and the folder's verdict claims.

``python experiments/fair.py tables --only fedsr`` renders every ``<!-- table:fedsr/NAME -->``
block from ``TABLES[NAME]()`` and the ``<!-- fair:fedsr_cpu_r500 -->`` block from
:func:`raw_table`; ``claims()`` feeds ``<!-- table:fedsr/verdicts -->`` and the top-level
verdicts table. Runs nothing. ``python experiments/fedsr/tables.py [GROUP ...]`` prints
each spec group's table.

Every table reads its numbers through :func:`load`, one (spec group, method) at a time:
the raw records of that part of ``spec.yaml`` (``fedjax-inv experiment``, one record per
held-out domain and seed under ``results/raw/<group>/``) when any exist for the spec's
current settings, else the folder the former scripts wrote with the same settings
(:data:`FORMER`):

* ``cpu_r500_persistent/<method>/h<D>/summary.json`` (group ``persistent_lr1e-3``): the CPU
  six-domain runs, per seed.
* ``h100_r500/*.csv|*.log`` (group ``restart_lr1e-3``) and ``h100_r500_lr1e-2/*.csv``
  (group ``restart_lr1e-2``): the H100 runs, of which only per-domain means and stds
  survive (no per-seed files). The CSVs hold the population std over the 3 seeds (ddof
  0, the convention when they were written); FedAvg's and FedSR's lr 1e-3 rows exist only
  as the aggregate table printed at the end of ``h100_r500/fedavg.log`` / ``fedsr.log``
  (percent, one decimal). Both are shown here as mean ± sample std (ddof 1): std ×
  √(n/(n−1)) with n = 3 seeds.

The reported number is the held-out domain's accuracy at the last round (FedSR §4.2).
"""
from __future__ import annotations

import csv
import functools
import json
import math
import pathlib
import re
import statistics

from fedjax_inv.eval.verdict import Claim
from fedjax_inv.runner import outputs, spec

HERE = pathlib.Path(__file__).resolve().parent
FOLDER = "experiments/fedsr"
DOMAINS = ["0", "15", "30", "45", "60", "75"]
COLS = DOMAINS + ["avg"]
# FedSR Table 1 (3 runs): per-domain mean, and the paper's average column.
PAPER = {
    "fedavg": ([85.9, 98.7, 98.8, 98.9, 98.7, 86.2], 94.5),
    "fedcmi": ([91.5, 99.2, 99.3, 99.2, 99.2, 91.0], 96.5),
    "fedl2r": ([90.5, 99.1, 99.2, 99.1, 99.2, 90.7], 96.3),
    "fedsr": ([91.6, 99.3, 99.3, 99.2, 99.3, 91.5], 96.7),
}
ORDER = ["fedavg", "fedl2r", "fedcmi", "fedsr"]
NAMES = {"fedavg": "FedAvg", "fedl2r": "FedL2R", "fedcmi": "FedCMI", "fedsr": "FedSR"}
# spec group -> the folder the former scripts wrote its rows into, with the same settings
FORMER = {"persistent_lr1e-3": "cpu_r500_persistent", "restart_lr1e-3": "h100_r500",
          "restart_lr1e-2": "h100_r500_lr1e-2"}
CPU = "persistent_lr1e-3"
N_SEEDS = 3  # every H100 row: seeds 0, 1, 2 (the command line at the top of each log)


def records(group: str, method: str) -> list:
  """The raw records of ``method`` in spec group ``group`` that are on disk for the spec's
  current settings (a record of a changed configuration does not count), run by run,
  seeds in order."""
  sp = spec.load_spec(HERE / "spec.yaml")
  where = {"group": [group], "method": [method]}
  return [rec for _, _, rec in spec.kept_records(sp, HERE, where)]


def _per_seed_former(folder: pathlib.Path, method: str) -> dict:
  """``{domain: {seed: accuracy}}`` of the last round, from the former per-domain folders
  ``folder/<method>/h<D>/summary.json`` (missing domains absent)."""
  res = {}
  for d in DOMAINS:
    f = folder / method / f"h{d}" / "summary.json"
    if f.is_file():
      runs = json.loads(f.read_text())["runs"]
      res[d] = {r["seed"]: r["selected"]["last"]["ood_accuracy"] for r in runs
                if str(r["holdout"]) == d}
  return res


def _from_csv(path: pathlib.Path, method: str) -> dict:
  """``{column: (mean %, population std %)}`` of the 'last' row of a results.csv."""
  with open(path) as f:
    for row in csv.DictReader(f):
      if row["selection"] == "last" and row["algorithm"] == method:
        return {c: (100 * float(row[f"{c}_mean"]), 100 * float(row[f"{c}_std"]))
                for c in COLS}
  raise ValueError(f"{path}: no 'last' row for {method}")


def _from_log(path: pathlib.Path, method: str) -> dict:
  """``{column: (mean %, population std %)}`` from the '### last' table of a run log."""
  text = path.read_text().split("### last", 1)[1]
  m = re.search(rf"^\| {method} \|(.*)\|$", text, re.M)
  cells = [c.strip() for c in m.group(1).split("|")]
  out = {}
  for c, cell in zip(COLS, cells):
    a, b = cell.split("±")
    out[c] = (float(a), float(b))
  return out


def _seed_avg(seeds: dict) -> list | None:
  """The six-domain average per seed (seeds in order), or None unless every domain has
  every seed."""
  have = sorted({s for r in seeds.values() for s in r})
  if len(seeds) == len(DOMAINS) and have and all(set(r) == set(have)
                                                 for r in seeds.values()):
    return [statistics.mean(seeds[d][s] for d in DOMAINS) for s in have]
  return None


def _cells(seeds: dict) -> dict:
  """``{column: (mean %, sample std %)}`` from per-seed accuracies ('avg' only when every
  domain has every seed)."""
  out = {d: outputs.mean_std([100 * v for v in seeds[d].values()]) for d in seeds}
  avg = _seed_avg(seeds)
  if avg is not None:
    out["avg"] = outputs.mean_std([100 * v for v in avg])
  return out


@functools.lru_cache(maxsize=None)
def load(group: str, method: str) -> dict:
  """What the tables show of ``method`` in spec group ``group``: the held-out domain's
  accuracy at the last round, from the group's raw records when any exist for the
  spec's current settings, else from the former folder (:data:`FORMER`).

  Returns:
    ``{'from': 'records' | 'former', 'kind': 'records' | 'summary' | 'CSV' | 'log',
    'source': the file or folder read, relative to this folder, 'seeds': {domain:
    {seed: accuracy (fraction)}} (empty when only aggregates exist), 'cells': {column:
    (mean %, sample std %)} (columns with values; 'avg' only when complete), 'n': the
    number of seeds}``.
  """
  recs = records(group, method)
  if recs:
    seeds: dict = {}
    for r in recs:
      acc = (r.get("final") or {}).get("ood_accuracy")
      seeds.setdefault(str(r["key"]["config"]["holdout"]), {})[r["key"]["seed"]] = (
          math.nan if acc is None else acc)
    seeds = {d: dict(sorted(seeds[d].items())) for d in DOMAINS if d in seeds}
    return {"from": "records", "kind": "records", "source": f"results/raw/{group}/",
            "seeds": seeds, "cells": _cells(seeds),
            "n": len({s for r in seeds.values() for s in r})}
  return load_former(group, method)


def load_former(group: str, method: str) -> dict:
  """:func:`load`'s answer from the former folder of ``group`` (:data:`FORMER`), whether
  or not the group has records."""
  folder = HERE / FORMER[group]
  if group == CPU:
    seeds = _per_seed_former(folder, method)
    return {"from": "former", "kind": "summary", "source": f"{FORMER[group]}/{method}/",
            "seeds": seeds, "cells": _cells(seeds),
            "n": len({s for r in seeds.values() for s in r})}
  prefix = "lr1e-2_" if group == "restart_lr1e-2" else ""
  f = folder / f"{prefix}{method}.csv"
  raw = _from_csv(f, method) if f.is_file() else None
  if raw is None:
    f = folder / f"{prefix}{method}.log"
    raw = _from_log(f, method)
  k = math.sqrt(N_SEEDS / (N_SEEDS - 1))  # population std -> sample std
  return {"from": "former", "kind": "CSV" if f.suffix == ".csv" else "log",
          "source": f.relative_to(HERE).as_posix(), "seeds": {},
          "cells": {c: (m, s * k) for c, (m, s) in raw.items()}, "n": N_SEEDS}


def _paper_row(method: str) -> str:
  dom, avg = PAPER[method]
  return (f"| {method} | paper | " + " | ".join(f"{v:.1f}" for v in dom)
          + f" | {avg:.1f} |")


def _seed_rows(method: str, res: dict, avg: bool = False) -> list:
  """One markdown row per seed of ``res`` (``{domain: {seed: accuracy in [0, 1]}}``):
  accuracy % per held-out domain ('–' where a domain lacks the seed), then, with
  ``avg=True``, the six domains' mean ('–' unless every domain has every seed)."""
  seeds = sorted({s for r in res.values() for s in r})
  means = (_seed_avg(res) or []) if avg else None
  rows = []
  for i, s in enumerate(seeds):
    cells = [f"{100 * res[d][s]:.1f}" if s in res.get(d, {}) else "–" for d in DOMAINS]
    if means is not None:
      cells.append(f"{100 * means[i]:.1f}" if means else "–")
    rows.append(f"| {method} | {s} | " + " | ".join(cells) + " |")
  return rows


def raw_table(group: str = CPU, methods=("fedavg", "fedsr")) -> str:
  """The paper-vs-ours markdown table of a group from per-seed results (:func:`load`):
  accuracy (%) per held-out domain, mean ± sample std (ddof 1) over seeds; ``avg`` is
  the mean over the six domains per seed, then mean ± std over seeds (only when every
  domain has every seed); a domain not run yet shows '(not run)'. Then one row per seed."""
  def cell(values) -> str:
    return outputs.format_mean_std(list(values), 1, scale=100.0)
  lines = [f"| algorithm | source | {' | '.join(DOMAINS)} | avg |",
           "|---|---|" + "---:|" * (len(DOMAINS) + 1)]
  seed_lines = [f"| algorithm | seed | {' | '.join(DOMAINS)} |",
                "|---|---|" + "---:|" * len(DOMAINS)]
  for method in methods:
    lines.append(_paper_row(method))
    res = load(group, method)["seeds"]
    cells = [cell(res[d].values()) if d in res else "(not run)" for d in DOMAINS]
    seeds = sorted({s for r in res.values() for s in r})
    avg = _seed_avg(res)
    cells.append(cell(avg) if avg is not None else "—")
    lines.append(f"| {method} | ours ({len(seeds)} seeds, last) | "
                 + " | ".join(cells) + " |")
    seed_lines += _seed_rows(method, res)
  return "\n".join(lines) + "\n\nPer seed (test accuracy %, last round):\n\n" + \
      "\n".join(seed_lines)


RESTART = {"1e-3": "restart_lr1e-3", "1e-2": "restart_lr1e-2"}  # lr -> spec group


def restart(lr: str, method: str, former: bool = False) -> dict:
  """:func:`load` of one row of the momentum-restarted table at learning rate ``lr``
  (``former=True``: always the former H100 folder, :func:`load_former`)."""
  return (load_former if former else load)(RESTART[lr], method)


def restart_table(lr: str, former: bool = False) -> str:
  """The momentum-restarted table at learning rate ``lr`` (spec group ``restart_lr<lr>``):
  paper and ours per method and held-out domain, mean ± sample std (ddof 1) over seeds,
  each method from the group's records when it has any (with one row per seed below the
  table), else from the former H100 aggregates; ``former=True`` shows only the
  aggregates."""
  group = RESTART[lr]
  lines = [f"| algorithm | source | {' | '.join(DOMAINS)} | avg |",
           "|---|---|" + "---:|" * len(COLS)]
  seed_lines = [f"| algorithm | seed | {' | '.join(DOMAINS)} | avg |",
                "|---|---|" + "---:|" * len(COLS)]
  former_files, recorded = [], []
  for method in ORDER:
    lines.append(_paper_row(method))
    row = restart(lr, method, former)
    if row["from"] == "former":
      former_files.append(f"`{row['source']}`")
      label = f"ours ({row['n']} seeds, last; {row['kind']})"
    else:
      recorded.append(method)
      label = f"ours ({row['n']} seeds, last)"
      seed_lines += _seed_rows(method, row["seeds"], avg=True)
    lines.append(f"| {method} | {label} | " + " | ".join(
        f"{row['cells'][c][0]:.1f} ± {row['cells'][c][1]:.1f}" if c in row["cells"]
        else "—" for c in COLS) + " |")
  notes = []
  if former_files:
    notes.append("Aggregates only, not reproducible from this repository (no per-seed "
                 "files): generated from " + ", ".join(former_files) + ", run on an H100. "
                 "± = sample std over the 3 seeds (ddof 1), converted from the files' "
                 "population std (× √(3/2); the logs' std is rounded to 0.1 before that).")
  if recorded:
    where = spec.machines([r for m in recorded for r in records(group, m)])
    notes.append(f"{', '.join(NAMES[m] for m in recorded)}: from the per-seed records in "
                 f"`results/raw/{group}/`, run on: {where}; ± = sample std over seeds "
                 "(ddof 1).")
  text = "\n".join(lines) + "\n\n" + " ".join(notes)
  if recorded:
    text += ("\n\nPer seed (test accuracy %, last round; avg: the six domains' mean):\n\n"
             + "\n".join(seed_lines))
  return text


def cpu_per_seed(method: str) -> dict:
  """``{domain or 'avg': [accuracy % per seed]}`` of the six-domain runs with the client
  momentum kept (seeds in order; 'avg' only when every domain has every seed)."""
  res = load(CPU, method)["seeds"]
  seeds = sorted({s for r in res.values() for s in r})
  out = {d: [100 * res[d][s] for s in seeds if s in res[d]] for d in res}
  if len(res) == len(DOMAINS) and all(set(r) == set(seeds) for r in res.values()):
    out["avg"] = [sum(100 * res[d][s] for d in DOMAINS) / len(DOMAINS) for s in seeds]
  return out


TABLES = {
    "restart_lr1e-3": lambda: restart_table("1e-3"),
    "restart_lr1e-2": lambda: restart_table("1e-2"),
    "h100_former_lr1e-3": lambda: restart_table("1e-3", former=True),
    "h100_former_lr1e-2": lambda: restart_table("1e-2", former=True),
}

_AVG = "RotatedMNIST (FedSR), avg of the 6 held-out domains, test acc. % (Table 1)"
_DOM = "RotatedMNIST (FedSR), {d}° held out, test acc. % (Table 1)"
_IMAGES = "1,000 images per domain from the 5,000-image MNIST sample"


def claims() -> list:
  out = []
  # 500 rounds, the paper's settings, client momentum kept: per-seed files.
  fa, fs = cpu_per_seed("fedavg"), cpu_per_seed("fedsr")
  # the machine: the former files ran on the CPU; records name theirs in their provenance
  recs = records(CPU, "fedavg") + records(CPU, "fedsr")
  where = (spec.machines(recs) or "CPU") + ", "
  for col, what in (("avg", _AVG), ("0", _DOM.format(d=0)), ("75", _DOM.format(d=75))):
    i = COLS.index(col)
    out.append(Claim(
        paper="FedSR", what=what, method="FedSR",
        paper_value=PAPER["fedsr"][0][i] if col != "avg" else PAPER["fedsr"][1],
        ours=fs.get(col, []), baseline="FedAvg",
        paper_baseline=PAPER["fedavg"][0][i] if col != "avg" else PAPER["fedavg"][1],
        ours_baseline=fa.get(col, []), point=1.0, digits=1,
        protocol="paper settings (no tuning)",
        setting=f"{where}500 rounds, client momentum kept; {_IMAGES}", folder=FOLDER,
        reason="not run yet: `fedjax-inv experiment experiments/fedsr/spec.yaml --where "
               f"group={CPU}`"))
  # 500 rounds, client momentum restarted every round: the H100 aggregates, or records.
  for lr, protocol in (("1e-3", "paper settings (no tuning)"),
                       ("1e-2", "lr 1e-2 instead of the paper's 1e-3 (run after lr 1e-3 "
                                "under-trained every method), the same for every method")):
    base = restart(lr, "fedavg")
    for method in ("fedl2r", "fedcmi", "fedsr"):
      row = restart(lr, method)
      if base["from"] == row["from"] == "records":
        avg_b, avg_m = _seed_avg(base["seeds"]) or [], _seed_avg(row["seeds"]) or []
        kw = dict(ours=[100 * v for v in avg_m], ours_baseline=[100 * v for v in avg_b])
        group = RESTART[lr]
        where = spec.machines(records(group, "fedavg") + records(group, method)) + ", "
      else:  # the former aggregates (or a mix): mean ± sample std, as in the tables
        kw = dict(ours=[], ours_baseline=[], raw=False,
                  ours_agg=(*row["cells"].get("avg", (math.nan, math.nan)), row["n"]),
                  ours_baseline_agg=(*base["cells"].get("avg", (math.nan, math.nan)),
                                     base["n"]))
        where = "H100, "
      out.append(Claim(
          paper="FedSR", what=_AVG, method=NAMES[method], paper_value=PAPER[method][1],
          baseline="FedAvg", paper_baseline=PAPER["fedavg"][1], point=1.0, digits=1,
          protocol=protocol, **kw,
          setting=f"{where}lr {lr}, 500 rounds, client momentum restarted every round; "
                  f"{_IMAGES}", folder=FOLDER))
  return out


def main(argv) -> None:
  """``python experiments/fedsr/tables.py [GROUP ...]``: prints each spec group's
  paper-vs-ours table (default: every group of spec.yaml)."""
  groups = argv[1:] or list(FORMER)
  for group in groups:
    if group not in FORMER:
      raise SystemExit(f"{group}: not a group of spec.yaml; its groups are "
                       f"{', '.join(FORMER)}.")
    print(f"## {group}\n")
    print((raw_table(group) if group == CPU else restart_table(group.rsplit("lr", 1)[1]))
          + "\n")


if __name__ == "__main__":
  import sys
  main(sys.argv)
