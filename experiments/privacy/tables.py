"""The privacy README's results tables, generated from the committed raw per-run files.

``python experiments/fair.py tables --only privacy`` rewrites the README's
``<!-- table:privacy/NAME -->`` blocks from :data:`TABLES`:

* ``dp_fedavg``: client-level DP-FedAvg (the spec ``dp_fedavg.yaml``, run by
  ``fedjax-inv experiment``), from ``results_r100/raw/``;
* ``dp_sgd``: sample-level DP-SGD on the client (the spec ``dp_sgd.yaml``, run by
  ``fedjax-inv experiment``), from ``results_dp_sgd_r30/raw/``.

Divergence (:func:`diverged`): a run counts as diverged, not "ok", when the simulator
stopped it (``status`` "diverged": a non-finite value), when it has no final metrics, or
when its final training loss is non-finite or above ``DIVERGED_LOSS_FACTOR × ln K``
(K = 10 classes: ln K ≈ 2.30 is the loss of the uniform prediction, the initial loss;
the threshold is ≈ 23). Its accuracies are then left out of the mean and the cell says
"(k/n finite)". ± = sample std over seeds (``fedjax_inv.runner.outputs.format_mean_std``,
ddof 1).

Only reads committed files under this folder; runs nothing. ``python
experiments/privacy/tables.py [RESULTS]`` prints the DP-FedAvg table and writes its plot,
``RESULTS/privacy_utility.png``.
"""
from __future__ import annotations

import json
import math
import pathlib

from fedjax_inv.runner.outputs import format_mean_std, mean_std

HERE = pathlib.Path(__file__).resolve().parent
NUM_CLASSES = 10
DIVERGED_LOSS_FACTOR = 10.0
LOSS_LIMIT = DIVERGED_LOSS_FACTOR * math.log(NUM_CLASSES)
ORDER = ["fedavg", "inv_fedavg", "fishr_intra_arith", "fishr_inter_geo"]


def diverged(r: dict) -> bool:
  """The divergence criterion of the module docstring."""
  if r.get("status", "ok") != "ok" or not r.get("final"):
    return True
  loss = r["final"].get("train_loss")
  return loss is None or not math.isfinite(loss) or loss > LOSS_LIMIT


def _vals(runs: list, key: str) -> list:
  """One value per run; NaN for a diverged run (counted, not dropped)."""
  return [math.nan if diverged(r) else r["final"][key] for r in runs]


# --- client-level DP-FedAvg (dp_fedavg.yaml) -------------------------------------------

def load(out: pathlib.Path) -> dict:
  """{(method, target ε): [records]} of ``out/raw/<method>/eps<ε>-seed<s>.json`` (the
  spec's run names are ``<method>/eps<ε>``), seeds in order."""
  runs = {}
  for f in sorted(out.glob("raw/*/*.json")):
    r = json.loads(f.read_text())
    method, eps = r["key"]["name"].split("/eps")
    runs.setdefault((method, float(eps)), []).append(r)
  for rs in runs.values():
    rs.sort(key=lambda r: r["key"]["seed"])
  return runs


def dp_fedavg_table(out: pathlib.Path = HERE / "results_r100") -> str:
  runs = load(out)
  methods = sorted({m for m, _ in runs}, key=ORDER.index)
  epss = sorted({e for _, e in runs}, key=lambda e: (math.isinf(e), e))
  lines = ["| method | ε (target) | σ | ε spent | seeds ok / run | train accuracy | "
           "held-out test accuracy |", "|---|---:|---:|---:|---:|---:|---:|"]
  for m in methods:
    for e in epss:
      every = runs.get((m, e), [])
      if not every:
        continue
      ok = [r for r in every if not diverged(r)]
      hp = every[0]["hparams"]
      dp = "dp_clip" in hp
      sigma = f"{hp['dp_noise_multiplier']:.3f}" if dp else "0 (no DP)"
      spent = ("∞" if not dp else
               f"{max(r['privacy']['epsilon'] for r in ok):.3f}" if ok else "—")
      lines.append(f"| {m} | {e:g} | {sigma} | {spent} | {len(ok)} / {len(every)} | "
                   f"{format_mean_std(_vals(every, 'train_accuracy'))} | "
                   f"{format_mean_std(_vals(every, 'test_accuracy'))} |")
  rounds = sorted({r["key"]["config"]["rounds"] for rs in runs.values() for r in rs})
  caption = (f"Final round ({', '.join(map(str, rounds))}). A run counts as ok unless it "
             "diverged: stopped on a "
             f"non-finite value, or a final training loss above {DIVERGED_LOSS_FACTOR:g} × "
             f"ln {NUM_CLASSES} = {LOSS_LIMIT:.1f}; diverged seeds are left out of the "
             'mean ("k/n finite"). ± = sample std over seeds (ddof 1). Raw: '
             f"`{out.relative_to(HERE)}/raw/`.")
  return caption + "\n\n" + "\n".join(lines)


def plot(out: pathlib.Path) -> pathlib.Path:
  """``out/privacy_utility.png``: held-out accuracy against ε (non-diverged seeds)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  runs = load(out)
  fig, ax = plt.subplots(figsize=(6, 3.5))
  for m in sorted({m for m, _ in runs}, key=ORDER.index):
    pts = sorted((e, mean_std(_vals(rs, "test_accuracy")))
                 for (mm, e), rs in runs.items() if mm == m)
    pts = [(e, ms) for e, ms in pts if math.isfinite(ms[0])]
    ax.errorbar([e if math.isfinite(e) else 16.0 for e, _ in pts],
                [ms[0] for _, ms in pts], yerr=[ms[1] for _, ms in pts], marker="o",
                capsize=3, label=m)
  ax.set_xscale("log", base=2)
  ax.set_xticks([1, 2, 4, 8, 16], ["1", "2", "4", "8", "∞"])
  ax.set_xlabel("ε (δ = 1e-5)")
  ax.set_ylabel("held-out test accuracy")
  ax.legend(fontsize=8)
  fig.tight_layout()
  path = out / "privacy_utility.png"
  fig.savefig(path, dpi=120)
  return path


# --- sample-level DP-SGD (dp_sgd.yaml) -------------------------------------------------

# (label, run name, clip C, σ), in dp_sgd.yaml's order
DP_SGD_SETTINGS = (("no DP", "nodp", None, 0.0), ("clip only", "clip1-sigma0", 1.0, 0.0),
                   ("DP-SGD", "clip1-sigma0.6", 1.0, 0.6), ("DP-SGD", "clip1-sigma1", 1.0, 1.0),
                   ("DP-SGD", "clip1-sigma2", 1.0, 2.0))


def dp_sgd_table(out: pathlib.Path = HERE / "results_dp_sgd_r30") -> str:
  rows = ["| setting | clip C | σ | ε per example (δ = 1e-5) | seeds ok / run | "
          "train accuracy | held-out test accuracy |", "|---|---:|---:|---:|---:|---:|---:|"]
  for label, name, clip, sigma in DP_SGD_SETTINGS:
    recs = [json.loads(p.read_text())
            for p in sorted((out / "raw").glob(f"{name}-seed*.json"))]
    if not recs:
      continue
    assert all(r["key"]["config"].get("dp_sgd_clip") == clip and
               r["key"]["config"].get("dp_sgd_noise_multiplier", 0.0) == sigma
               for r in recs), name
    eps = recs[0]["privacy"]["sample_level"]["epsilon"] if clip is not None else math.inf
    ok = [r for r in recs if not diverged(r)]
    rows.append(f"| {label} | {'–' if clip is None else f'{clip:g}'} | {sigma:g} | "
                f"{'∞' if math.isinf(eps) else f'{eps:.2f}'} | {len(ok)} / {len(recs)} | "
                f"{format_mean_std(_vals(recs, 'train_accuracy'))} | "
                f"{format_mean_std(_vals(recs, 'test_accuracy'))} |")
  rounds = sorted({json.loads(p.read_text())["key"]["config"]["rounds"]
                   for p in (out / "raw").glob("*.json")})
  caption = (f"Final round ({', '.join(map(str, rounds))}); ± = sample std over seeds "
             f"(ddof 1); divergence as in the table above. Raw: `{out.relative_to(HERE)}/raw/`.")
  return caption + "\n\n" + "\n".join(rows)


TABLES = {"dp_fedavg": dp_fedavg_table, "dp_sgd": dp_sgd_table}


if __name__ == "__main__":  # the DP-FedAvg table and its plot, from the raw records
  import sys
  results = pathlib.Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else HERE / "results_r100"
  print(dp_fedavg_table(results))
  print(f"\nplot: {plot(results)}")
