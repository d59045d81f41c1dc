"""The generated tables of experiments/fedilc/README.md and the folder's verdict claims.

``python experiments/fair.py tables --only fedilc`` renders ``<!-- table:fedilc/NAME -->``
from ``TABLES[NAME]()``; ``claims()`` feeds ``<!-- table:fedilc/verdicts -->`` and the
top-level verdicts table. Reads the committed per-seed files ``results/<tag>.json`` only
(written by ``run.py run``); the main table, ``<!-- fair:fedilc -->``, is ``run.py``'s
``table_text()``.
"""
from __future__ import annotations

import importlib.util
import json
import pathlib

from fedjax_inv.runner import outputs
from fedjax_inv.eval.verdict import Claim

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results"
FOLDER = "experiments/fedilc"


def _run_module():
  spec = importlib.util.spec_from_file_location("fedilc_run", HERE / "run.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


PAPER = _run_module().PAPER  # (OOD loss, ±, OOD acc, ±, AUROC thr., AUPRC thr.)
NAMES = {"fedsgd": "FedSGD", "fedcurv": "FedCurv", "geometric": "Geometric",
         "fishr_inter_geo": "Fishr+Inter-Geo", "fishr_intra_geo": "Fishr+Intra-Geo",
         "fishr_intra_arith": "Fishr+Intra-Arith"}
# The rows compared with FedSGD: the three Fishr variants run here, then Geometric.
METHODS = ("fedcurv", "fishr_inter_geo", "fishr_intra_geo", "geometric")
SETTING = ("bundled 5,000-image MNIST sample (800 images per client, 1,000 OOD), "
           "3 seeds (paper 5), CPU")
PROTOCOL = "paper settings (no tuning)"
WHERE = "at each seed's lowest-OOD-loss round, the paper's reporting rule"


def runs(tag: str) -> list:
  """The per-seed results of ``results/<tag>.json`` (``[]`` if not run)."""
  f = RESULTS / f"{tag}.json"
  return json.loads(f.read_text())["runs"] if f.is_file() else []


def values(tag: str, key: str) -> list:
  return [r[key] for r in runs(tag)]


def ordering() -> str:
  """The rows ranked by OOD loss (lowest first), the paper's Table 2 against ours."""
  tags = ("fedsgd",) + METHODS
  paper = sorted(tags, key=lambda t: PAPER[t][0])
  ours = sorted((t for t in tags if runs(t)),
                key=lambda t: outputs.mean_std(values(t, "ood_loss"))[0])
  lines = ["| rank | paper (Table 2, 5 seeds) | ours (3 seeds) |", "|---|---|---|"]
  for i in range(len(tags)):
    p = f"{NAMES[paper[i]]} {PAPER[paper[i]][0]:.3f}"
    o = (f"{NAMES[ours[i]]} {outputs.format_mean_std(values(ours[i], 'ood_loss'), 3)}"
         if i < len(ours) else "–")
    lines.append(f"| {i + 1} | {p} | {o} |")
  return ("\n".join(lines) + "\n\nOOD loss " + WHERE + " (lower is better); ± = sample "
          "std over seeds (ddof 1). Generated from `results/*.json`.")


TABLES = {"ordering": ordering}


def claims() -> list:
  out = []
  for key, idx, title, point, higher, table in (
      ("ood_loss", 0, "OOD loss", 0.01, False, "Table 2"),
      ("ood_accuracy", 2, "OOD acc.", 0.01, True, "Table 6")):
    for m in METHODS:
      note = ""
      gap = PAPER[m][idx] - PAPER["fedsgd"][idx]
      if key == "ood_accuracy" and 0 < abs(gap) <= PAPER[m][idx + 1] + 1e-9:
        note = (f"the paper's gap over FedSGD ({gap:+.3f}) is inside its own ± "
                f"({PAPER[m][idx + 1]:.3f}): the paper has no accuracy change, ours is "
                "a drop")
      out.append(Claim(
          paper="FedILC", what=f"Color-MNIST (5 clients), {title} {WHERE} ({table})",
          method=NAMES[m], paper_value=PAPER[m][idx], paper_pm=PAPER[m][idx + 1],
          ours=values(m, key), baseline="FedSGD", paper_baseline=PAPER["fedsgd"][idx],
          ours_baseline=values("fedsgd", key), point=point, higher=higher, digits=3,
          protocol=PROTOCOL, setting=SETTING, folder=FOLDER, note=note,
          reason=f"not run yet: `python experiments/fedilc/run.py run --method {m}`"))
  return out
