"""The generated tables of experiments/fedsr/README.md and the folder's verdict claims.

``python experiments/fair.py tables --only fedsr`` renders every ``<!-- table:fedsr/NAME -->``
block from ``TABLES[NAME]()``; ``claims()`` feeds ``<!-- table:fedsr/verdicts -->`` and the
top-level verdicts table. Reads committed files only:

* ``cpu_r500_persistent/<alg>/h<D>/summary.json``: the CPU six-domain runs, per seed (raw).
* ``h100_r500/*.csv|*.log`` (lr 1e-3) and ``h100_r500_lr1e-2/*.csv`` (lr 1e-2): the H100
  runs, of which only per-domain means and stds survive (no per-seed files). The CSVs
  hold the population std over the 3 seeds (ddof 0, the convention when they were
  written); FedAvg's and FedSR's lr 1e-3 rows exist only as the aggregate table printed
  at the end of ``h100_r500/fedavg.log`` / ``fedsr.log`` (percent, one decimal). Both are
  shown here as mean ± sample std (ddof 1): std × √(n/(n−1)) with n = 3 seeds.
"""
from __future__ import annotations

import csv
import importlib.util
import math
import pathlib
import re

from fedjax_inv.eval.verdict import Claim

HERE = pathlib.Path(__file__).resolve().parent
FOLDER = "experiments/fedsr"


def _table_module():
  spec = importlib.util.spec_from_file_location("fedsr_table", HERE / "table.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


_T = _table_module()
DOMAINS, PAPER, ORDER = _T.DOMAINS, _T.PAPER, _T.ORDER
COLS = DOMAINS + ["avg"]
NAMES = {"fedavg": "FedAvg", "fedl2r": "FedL2R", "fedcmi": "FedCMI", "fedsr": "FedSR"}
H100 = {"1e-3": (HERE / "h100_r500", ""), "1e-2": (HERE / "h100_r500_lr1e-2", "lr1e-2_")}
N_SEEDS = 3  # every H100 row: seeds 0, 1, 2 (the command line at the top of each log)


def _from_csv(path: pathlib.Path, alg: str) -> dict:
  """``{column: (mean %, population std %)}`` of the 'last' row of a results.csv."""
  with open(path) as f:
    for row in csv.DictReader(f):
      if row["selection"] == "last" and row["algorithm"] == alg:
        return {c: (100 * float(row[f"{c}_mean"]), 100 * float(row[f"{c}_std"]))
                for c in COLS}
  raise ValueError(f"{path}: no 'last' row for {alg}")


def _from_log(path: pathlib.Path, alg: str) -> dict:
  """``{column: (mean %, population std %)}`` from the '### last' table of a run log."""
  text = path.read_text().split("### last", 1)[1]
  m = re.search(rf"^\| {alg} \|(.*)\|$", text, re.M)
  cells = [c.strip() for c in m.group(1).split("|")]
  out = {}
  for c, cell in zip(COLS, cells):
    a, b = cell.split("±")
    out[c] = (float(a), float(b))
  return out


def h100(lr: str, alg: str):
  """``({column: (mean %, sample std %)}, source file)`` of one H100 row."""
  folder, prefix = H100[lr]
  f = folder / f"{prefix}{alg}.csv"
  if f.is_file():
    raw = _from_csv(f, alg)
  else:
    f = folder / f"{prefix}{alg}.log"
    raw = _from_log(f, alg)
  k = math.sqrt(N_SEEDS / (N_SEEDS - 1))  # population std -> sample std
  return {c: (m, s * k) for c, (m, s) in raw.items()}, f


def h100_table(lr: str) -> str:
  lines = [f"| algorithm | source | {' | '.join(DOMAINS)} | avg |",
           "|---|---|" + "---:|" * len(COLS)]
  sources = []
  for alg in ORDER:
    dom, avg = PAPER[alg]
    lines.append(f"| {alg} | paper | " + " | ".join(f"{v:.1f}" for v in dom)
                 + f" | {avg:.1f} |")
    vals, f = h100(lr, alg)
    kind = "CSV" if f.suffix == ".csv" else "log"
    sources.append(f"`{f.relative_to(HERE)}`")
    lines.append(f"| {alg} | ours ({N_SEEDS} seeds, last; {kind}) | " + " | ".join(
        f"{vals[c][0]:.1f} ± {vals[c][1]:.1f}" for c in COLS) + " |")
  return ("\n".join(lines) + "\n\nAggregates only, not reproducible from this repository "
          "(no per-seed files): generated from " + ", ".join(sources) + ". "
          "± = sample std over the 3 seeds (ddof 1), converted from the files' "
          "population std (× √(3/2); the logs' std is rounded to 0.1 before that).")


def cpu_per_seed(alg: str) -> dict:
  """``{domain or 'avg': [accuracy % per seed]}`` of the CPU six-domain runs (seeds in
  order; 'avg' only when every domain has every seed)."""
  res = _T.per_seed(HERE / "cpu_r500_persistent", alg)
  seeds = sorted({s for r in res.values() for s in r})
  out = {d: [100 * res[d][s] for s in seeds if s in res[d]] for d in res}
  if len(res) == len(DOMAINS) and all(set(r) == set(seeds) for r in res.values()):
    out["avg"] = [sum(100 * res[d][s] for d in DOMAINS) / len(DOMAINS) for s in seeds]
  return out


TABLES = {
    "h100_lr1e-3": lambda: h100_table("1e-3"),
    "h100_lr1e-2": lambda: h100_table("1e-2"),
}

_AVG = "RotatedMNIST (FedSR), avg of the 6 held-out domains, test acc. % (Table 1)"
_DOM = "RotatedMNIST (FedSR), {d}° held out, test acc. % (Table 1)"
_IMAGES = "1,000 images per domain from the 5,000-image MNIST sample"


def claims() -> list:
  out = []
  # CPU, 500 rounds, the paper's settings, client momentum kept: per-seed files.
  fa, fs = cpu_per_seed("fedavg"), cpu_per_seed("fedsr")
  for col, what in (("avg", _AVG), ("0", _DOM.format(d=0)), ("75", _DOM.format(d=75))):
    i = COLS.index(col)
    out.append(Claim(
        paper="FedSR", what=what, method="FedSR",
        paper_value=PAPER["fedsr"][0][i] if col != "avg" else PAPER["fedsr"][1],
        ours=fs.get(col, []), baseline="FedAvg",
        paper_baseline=PAPER["fedavg"][0][i] if col != "avg" else PAPER["fedavg"][1],
        ours_baseline=fa.get(col, []), point=1.0, digits=1,
        protocol="paper settings (no tuning)",
        setting=f"CPU, 500 rounds, client momentum kept; {_IMAGES}", folder=FOLDER,
        reason="not run yet: `experiments/fedsr/run_cpu.sh "
               "experiments/fedsr/cpu_r500_persistent`"))
  # H100, 500 rounds, client momentum restarted every round: aggregates only.
  for lr, protocol in (("1e-3", "paper settings (no tuning)"),
                       ("1e-2", "lr 1e-2 instead of the paper's 1e-3 (run after lr 1e-3 "
                                "under-trained every method), the same for every method")):
    base, _ = h100(lr, "fedavg")
    for alg in ("fedl2r", "fedcmi", "fedsr"):
      vals, _ = h100(lr, alg)
      out.append(Claim(
          paper="FedSR", what=_AVG, method=NAMES[alg], paper_value=PAPER[alg][1],
          ours=[], ours_agg=(*vals["avg"], N_SEEDS), baseline="FedAvg",
          paper_baseline=PAPER["fedavg"][1], ours_baseline=[],
          ours_baseline_agg=(*base["avg"], N_SEEDS),
          point=1.0, digits=1, protocol=protocol, raw=False,
          setting=f"H100, lr {lr}, 500 rounds, client momentum restarted every round; "
                  f"{_IMAGES}", folder=FOLDER))
  return out
