"""The privacy-utility table and plot from experiments/privacy/run.py's raw per-run files.

Usage:  python experiments/privacy/table.py OUT     (prints markdown; writes OUT/privacy_utility.png)
"""
from __future__ import annotations

import json
import math
import pathlib
import sys

import numpy as np


def load(out: pathlib.Path) -> dict:
  runs = {}
  for f in sorted(out.glob("raw/*/*.json")):
    r = json.loads(f.read_text())
    runs.setdefault((r["method"], r["epsilon_target"]), []).append(r)
  return runs


def fmt(vals) -> str:
  if not vals:
    return "—"
  if len(vals) == 1:
    return f"{vals[0]:.3f} (1 seed)"
  return f"{np.mean(vals):.3f} ± {np.std(vals, ddof=1):.3f}"


def table(out: pathlib.Path) -> str:
  runs = load(out)
  methods = sorted({m for m, _ in runs}, key=["fedavg", "inv_fedavg", "fishr_intra_arith",
                                              "fishr_inter_geo"].index)
  epss = sorted({e for _, e in runs}, key=lambda e: (math.isinf(e), e))
  lines = ["| method | ε (target) | σ | ε spent | seeds ok / run | train accuracy | "
           "held-out test accuracy |", "|---|---:|---:|---:|---:|---:|---:|"]
  for m in methods:
    for e in epss:
      every = runs.get((m, e), [])
      rs = [r for r in every if r["status"] == "ok"]
      if not every:
        continue
      hp = every[0]["hparams"]
      sigma = f"{hp['dp_noise_multiplier']:.3f}" if "dp_clip" in hp else "0 (no DP)"
      spent = (f"{max(r['privacy']['epsilon'] for r in rs):.3f}" if rs and rs[0]["privacy"]
               else "∞" if "dp_clip" not in hp else "—")
      lines.append(f"| {m} | {e:g} | {sigma} | {spent} | {len(rs)} / {len(every)} | "
                   f"{fmt([r['final']['train_accuracy'] for r in rs])} | "
                   f"{fmt([r['final']['test_accuracy'] for r in rs])} |")
  return "\n".join(lines)


def plot(out: pathlib.Path) -> pathlib.Path:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  runs = load(out)
  fig, ax = plt.subplots(figsize=(6, 3.5))
  for m in sorted({m for m, _ in runs}):
    pts = sorted((e, [r["final"]["test_accuracy"] for r in rs if r["status"] == "ok"])
                 for (mm, e), rs in runs.items() if mm == m)
    xs = [e if math.isfinite(e) else 16.0 for e, v in pts if v]
    ys = [np.mean(v) for _, v in pts if v]
    es = [np.std(v, ddof=1) if len(v) > 1 else 0 for _, v in pts if v]
    ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=m)
  ax.set_xscale("log", base=2)
  ax.set_xticks([1, 2, 4, 8, 16], ["1", "2", "4", "8", "∞"])
  ax.set_xlabel("ε (δ = 1e-5)")
  ax.set_ylabel("held-out test accuracy")
  ax.legend(fontsize=8)
  fig.tight_layout()
  path = out / "privacy_utility.png"
  fig.savefig(path, dpi=120)
  return path


if __name__ == "__main__":
  out = pathlib.Path(sys.argv[1])
  print(table(out))
  print(f"\nplot: {plot(out)}")
