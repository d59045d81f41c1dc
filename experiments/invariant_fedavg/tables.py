"""The generated tables and figures of experiments/invariant_fedavg/README.md (and of
experiments/colored_mnist_invariance.md's ``invariant_fedavg/...`` blocks).

``python experiments/fair.py tables --only invariant_fedavg`` renders every
``<!-- table:invariant_fedavg/NAME -->`` block from ``TABLES[NAME]()`` and the Fig. 3
sweeps (``<!-- fair:fig3_epochs -->``, ``<!-- fair:fig3_clients -->``) from
:func:`sweep`; the fair rows' tables and claims (``fair/<row>/``) are rendered by
``experiments/fair.py`` itself. No ``claims()`` here: Fig. 3 is a plot with no number to
compare with (the paper only states that the accuracy is "consistent" across E and K),
and the runs at the starting values are a record, not a comparison. Reads the committed
raw records of ``spec.yaml`` only (``results/raw/<group>/<run>-seed<s>.json``).

``python experiments/invariant_fedavg/tables.py`` draws ``results/fig3.png`` (the E and K
sweeps) and ``results/curves_<group>.png`` (Fig. 1-2 style curves, ±2 std bands).
"""
from __future__ import annotations

import json
import pathlib

import numpy as np

from fedjax_inv.runner import outputs

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results"
RAW = RESULTS / "raw"
METHODS = ("fedavg", "inv_fedavg")
# The spec's groups -> (task name, metric, the axis swept or None)
GROUPS = {"cmnist": ("ColoredMNIST", "accuracy", None),
          "classification": ("synthetic classification", "accuracy", None),
          "epochs": ("synthetic classification", "accuracy", "epochs"),
          "clients": ("synthetic classification", "accuracy", "clients"),
          "regression": ("linear regression", "mse", None)}
# How each group's settings were chosen (README.md): the label stays beside the numbers.
CHOSEN = {
    "cmnist": "Invariant FedAvg's warm-up 100, λ 1e4, weight decay 0 picked from a grid "
              "scored on seed 0's OOD accuracy (seed 0 is a reported seed); FedAvg's from 2 "
              "configurations the same way",
    "classification": "ColoredMNIST's λ 1e4 and warm-up 100 (picked there on seed 0's OOD "
                      "accuracy)",
    "regression": "both methods' settings (server lr 1e-2 included) chosen on OOD MSE of "
                  "the reported seeds",
}


def load(group: str) -> list:
  """The ``ok`` records of ``group`` (``[]`` if not run), each with ``method`` (the spec's
  method label) and ``value`` (the label of the group's swept axis, or None) added."""
  sweep = GROUPS[group][2]
  out = []
  for f in sorted((RAW / group).glob("*.json")):
    rec = json.loads(f.read_text())
    if rec.get("status") != "ok":
      continue
    method, _, value = rec["key"]["name"].partition("-")  # e.g. 'inv_fedavg-E5'
    out.append({**rec, "method": method, "value": int(value[1:]) if sweep else None})
  return sorted(out, key=lambda r: (r["value"] or 0, r["method"], r["key"]["seed"]))


def records() -> str:
  """The 3-seed runs of ``spec.yaml`` at the starting values: final-round train and OOD
  metric per method, with how their settings were chosen."""
  lines = ["| task (spec group) | metric | FedAvg train / OOD | Invariant FedAvg train / OOD "
           "| settings chosen by |", "|---|---|---|---|---|"]
  for group, how in CHOSEN.items():
    name, m, _ = GROUPS[group]
    recs = load(group)
    digits = 2 if m == "mse" else 3

    def cell(method):
      sel = [r["final"] for r in recs if r["method"] == method]
      if not sel:
        return "not run"
      return " / ".join(outputs.format_mean_std([s[f"{k}_{m}"] for s in sel], digits)
                        for k in ("train", "ood"))
    lines.append(f"| {name} (`{group}`) | {m} | {cell('fedavg')} | {cell('inv_fedavg')} | "
                 f"{how} |")
  return ("\n".join(lines) + "\n\nFinal round, seeds 0, 1, 2; ± = sample std over seeds "
          "(ddof 1). Settings chosen on OOD data of a reported seed: a record, not a "
          "comparison (the fair rows above are the comparison).")


def sweep(group: str) -> str:
  """Fig. 3's table for ``group`` (``epochs`` or ``clients``): final-round train and OOD
  accuracy of both methods at every value of the swept axis, mean ± std over seeds."""
  recs = load(group)
  axis = {"epochs": "E", "clients": "K"}[group]
  lines = [f"| algorithm | {axis} | train accuracy (ours) | OOD accuracy (ours) |",
           "|---|---|---|---|"]
  for v in sorted({r["value"] for r in recs}):
    for method in METHODS:
      sel = [r["final"] for r in recs if r["method"] == method and r["value"] == v]
      if sel:
        lines.append(f"| {method} | {v} | "
                     + " | ".join(outputs.format_mean_std([f[f"{k}_accuracy"] for f in sel], 3)
                                  for k in ("train", "ood")) + " |")
  return "\n".join(lines) if len(lines) > 2 else f"(group `{group}` not run yet)"


TABLES = {"records": records}


def plot(out: pathlib.Path = RESULTS) -> None:
  """Fig. 3 (the E and K sweeps) as ``out/fig3.png`` and Fig. 1-2 style curves as
  ``out/curves_<group>.png`` (mean ±2 std over seeds), from the raw records."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  out = pathlib.Path(out)
  fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
  for ax, group, label in ((axes[0], "epochs", "local epochs E"),
                           (axes[1], "clients", "clients K")):
    recs = load(group)
    if not recs:
      ax.set_title(f"{group}: not run")
      continue
    vals = sorted({r["value"] for r in recs})
    for method, color in zip(METHODS, ("tab:blue", "tab:orange")):
      for split, ls in (("train", "--"), ("ood", "-")):
        ys = [[r["final"][f"{split}_accuracy"] for r in recs
               if r["method"] == method and r["value"] == v] for v in vals]
        ax.errorbar(range(len(vals)), [np.mean(y) for y in ys],
                    yerr=[np.std(y, ddof=1) if len(y) > 1 else 0 for y in ys], color=color,
                    ls=ls, marker="o", capsize=3, label=f"{method} {split}")
    ax.set_xticks(range(len(vals)), [str(v) for v in vals])
    ax.set_xlabel(label)
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.set_title(f"synthetic classification, {recs[0]['key']['config']['rounds']} rounds")
  axes[0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(out / "fig3.png", dpi=110)
  plt.close(fig)
  for group in ("cmnist", "classification", "regression"):
    recs = load(group)
    if not recs:
      continue
    name, m, _ = GROUPS[group]
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for method, color in zip(METHODS, ("tab:blue", "tab:orange")):
      runs = [r for r in recs if r["method"] == method]
      rounds = [h["round"] for h in runs[0]["history"]]
      for split, ls in (("train", "--"), ("ood", "-")):
        ys = np.array([[h[f"{split}_{m}"] for h in r["history"]] for r in runs])
        mu, sd = ys.mean(0), ys.std(0, ddof=1) if len(ys) > 1 else 0 * ys[0]
        ax.plot(rounds, mu, color=color, ls=ls, label=f"{method} {split}")
        ax.fill_between(rounds, mu - 2 * sd, mu + 2 * sd, color=color, alpha=0.15)
    inv = [r for r in recs if r["method"] == "inv_fedavg"]
    if inv and inv[0]["hparams"].get("warmup_rounds"):
      ax.axvline(inv[0]["hparams"]["warmup_rounds"], color="grey", ls=":",
                 label="penalty on")
    ax.set_xlabel("round")
    ax.set_ylabel(m)
    ax.set_title(f"{name} ({len({r['key']['seed'] for r in recs})} seeds, ±2 std)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / f"curves_{group}.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
  plot()
  for g in ("epochs", "clients"):
    print(f"\n### {g}\n\n{sweep(g)}")
  print("\n" + records())
