"""FedGMA README tables and verdict claims, from the committed raw results of this folder.

``python experiments/fair.py tables --only fedgma`` renders every ``<!-- table:fedgma/NAME
-->`` block of ``experiments/fedgma/README.md`` from :data:`TABLES`; ``claims()`` gives the
paper comparisons of those tables to the verdicts table (``<!-- table:fedgma/verdicts -->``
and the top-level one). The fair row ``fedgma_mnist`` is ``experiments/fair.py``'s own.

Raw files (one JSON per command of ``reproduce.py``; per algorithm and seed the last-L mean,
the final metrics and the per-round curve):

* ``results_gpu_h100/{mnist,fed_cmnist,fed_rotmnist}.json``: ``run_full.sh`` on one H100.
* ``results_cpu_r150/mnist.json``, ``results_cpu_r150_prox/mnist.json``: MNIST, 150 rounds.
* ``results_cpu_r150/tune_mnist.json``: the unequal tuning (selected on test accuracy).
* ``results_cpu/{mnist,fed_cmnist}.json``: 30-round MNIST and 20-round FedCMNIST.

± everywhere: :func:`fedjax_inv.runner.outputs.format_mean_std` (sample std over seeds, ddof 1).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import pathlib

from fedjax_inv.runner import outputs, tuning
from fedjax_inv.eval.verdict import Claim

HERE = pathlib.Path(__file__).resolve().parent
FOLDER = "experiments/fedgma"


def _reproduce():
  spec = importlib.util.spec_from_file_location("fedgma_reproduce_for_tables",
                                                HERE / "reproduce.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


_REPRO = _reproduce()
PAPER = _REPRO.PAPER  # FedGMA Tables 1-2 (% accuracy, mean over the last 20 rounds)
NAME = {"fedavg": "FedAvg", "fedgma": "FedGMA (τ = 0.4)", "fedprox": "FedProx (μ = 0.01)",
        "fedgma_fedprox": "FedGMA + FedProx"}
SHORT = {"fedavg": "FedAvg", "fedgma": "FedGMA", "fedprox": "FedProx",
         "fedgma_fedprox": "FedGMA+FedProx"}
ROW_NAME = {"mnist": "MNIST non-i.i.d.", "fed_cmnist": "FedCMNIST non-i.i.d.",
            "fed_rotmnist": "FedRotMNIST non-i.i.d."}
WHERE = {"mnist": "Table 1", "fed_cmnist": "Table 2", "fed_rotmnist": "Table 2"}


@functools.lru_cache(maxsize=None)
def load(rel: str) -> dict:
  return json.loads((HERE / rel).read_text())


def data_caveat(*results: dict) -> str:
  """``''``, or the caveat that these results' clients come from the partitioner used
  before Flower Datasets' (their runs' data notes do not name Flower)."""
  return tuning.partitioner_caveat(r.get("data_note") for res in results
                                   for r in res.get("runs", res.get("trials", [])))


def _data(*results: dict) -> str:
  c = data_caveat(*results)
  return f" **Data:** {c}." if c else ""


def seeds_of(res: dict, label: str, key: str = "last_mean", scale: float = 100.0) -> list:
  """Per-seed values of one column (seed order), ``key`` of the run (``'last_mean'``) or
  ``'final:METRIC'``; ``[]`` if the column was not run."""
  runs = sorted((r for r in res["runs"] if r["label"] == label), key=lambda r: r["seed"])
  if key.startswith("final:"):
    vals = [r["final"].get(key[6:]) for r in runs]
  else:
    vals = [r[key] for r in runs]
  return [None if v is None else v * scale for v in vals]


def ms(vals, digits: int = 1) -> str:
  return outputs.format_mean_std(vals, digits) if vals else "not run"


def with_seeds(vals, digits: int = 1) -> str:
  """``'m ± s (v0, v1, v2)'``."""
  if not vals:
    return "not run"
  return f"{ms(vals, digits)} ({', '.join(f'{v:.{digits}f}' for v in vals)})"


def _table(head, rows) -> str:
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  lines += ["| " + " | ".join(r) + " |" for r in rows]
  return "\n".join(lines)


# ---- tables -------------------------------------------------------------------------

def h100() -> str:
  res = {r: load(f"results_gpu_h100/{r}.json") for r in ("mnist", "fed_cmnist",
                                                            "fed_rotmnist")}
  head = ["accuracy % (last 20 rounds)", "MNIST paper", "MNIST ours", "FedCMNIST paper",
          "FedCMNIST ours (OOD)", "FedRotMNIST paper", "FedRotMNIST ours (OOD)"]
  rows = []
  for a in _REPRO.ALGS:
    cells = [NAME[a]]
    for r in ("mnist", "fed_cmnist", "fed_rotmnist"):
      cells += [f"{PAPER[r][a]:g}", ms(seeds_of(res[r], a))]
    rows.append(cells)
  return ("Mean ± sample std over seeds 0, 1, 2 (ddof 1). Raw: "
          "`results_gpu_h100/{mnist,fed_cmnist,fed_rotmnist}.json`." + _data(*res.values())
          + "\n\n" + _table(head, rows))


def mnist_cpu() -> str:
  r150 = load("results_cpu_r150/mnist.json")
  r30 = load("results_cpu/mnist.json")
  head = ["MNIST non-i.i.d., test accuracy %", "paper (full MNIST)",
          f"ours, {r150['rounds']} rounds, last-{r150['last']} mean (seeds 0,1,2)",
          f"ours, {r30['rounds']} rounds, last-{r30['last']} mean (`results_cpu/mnist.json`)"]
  rows = [[NAME[a], f"{PAPER['mnist'][a]:g}", with_seeds(seeds_of(r150, a)),
           ms(seeds_of(r30, a))] for a in ("fedavg", "fedgma")]
  return ("Raw: `results_cpu_r150/mnist.json`, `results_cpu/mnist.json`." + _data(r150, r30)
          + "\n\n" + _table(head, rows))


def tune_mnist() -> str:
  t = load("results_cpu_r150/tune_mnist.json")
  fa = [x for x in t["trials"] if x["label"] == "fedavg"]
  fg = [x for x in t["trials"] if x["label"] == "fedgma"]
  cap = (f"Tuning seed {t['seed']} (not a reported seed), {t['rounds']} rounds; every cell is "
         f"a last-20 mean of the **test** accuracy, the score this tuning selected on "
         f"(test data, not validation). Raw: `results_cpu_r150/tune_mnist.json`."
         + _data(t) + "\n\n")
  a = _table(["FedAvg client lr"] + [f"{x['overrides']['client_lr']:g}" for x in fa],
             [["last-20 test acc."] + [f"{100 * x['last_mean']:.1f}" for x in fa]])
  lr = {x["overrides"]["client_lr"] for x in fg}
  g = _table([f"FedGMA τ (lr {', '.join(f'{v:g}' for v in sorted(lr))})"]
             + [f"{x['overrides']['tau']:g}" for x in fg],
             [["last-20 test acc."] + [f"{100 * x['last_mean']:.1f}" for x in fg]])
  return cap + a + "\n\n" + g


def prox_cpu() -> str:
  res = load("results_cpu_r150_prox/mnist.json")
  head = ["MNIST non-i.i.d., test accuracy %", "paper (full MNIST)",
          f"ours, {res['rounds']} rounds, last-{res['last']} mean (seeds 0,1,2)"]
  rows = [[NAME[a], f"{PAPER['mnist'][a]:g}", with_seeds(seeds_of(res, a))]
          for a in ("fedprox", "fedgma_fedprox")]
  return "Raw: `results_cpu_r150_prox/mnist.json`." + _data(res) + "\n\n" + _table(head, rows)


def cmnist_cpu() -> str:
  res = load("results_cpu/fed_cmnist.json")
  head = [f"FedCMNIST (non-i.i.d.), last-{res['last']} OOD accuracy %",
          "paper (full size, last 20 rounds)", "ours (reduced, mean ± std, seeds 0,1,2)",
          "final train accuracy"]
  rows = []
  for a in ("fedavg", "fedgma"):
    v = seeds_of(res, a)
    tr = seeds_of(res, a, "final:train_accuracy", scale=1.0)
    rows.append([NAME[a], f"{PAPER['fed_cmnist'][a]:g}",
                 f"{ms(v, 1)} ({', '.join(f'{x:.2f}' for x in v)})",
                 ", ".join(f"{x:.3f}" for x in tr)])
  rows.append([f"{SHORT['fedprox']} / {SHORT['fedgma_fedprox']}",
               f"{PAPER['fed_cmnist']['fedprox']:g} / "
               f"{PAPER['fed_cmnist']['fedgma_fedprox']:g}", "not run", ""])
  return "Raw: `results_cpu/fed_cmnist.json`." + _data(res) + "\n\n" + _table(head, rows)


TABLES = {"h100": h100, "mnist_cpu": mnist_cpu, "tune_mnist": tune_mnist,
          "prox_cpu": prox_cpu, "cmnist_cpu": cmnist_cpu}


# ---- claims -------------------------------------------------------------------------

H100 = ("H100, all images of the bundled 5,000-image MNIST sample (not the full 60,000), "
        "100 rounds, CNN 32-64")
PAPER_SETTINGS = ("one configuration each: τ 0.4, μ 0.01; the task's lr 0.1, picked on the "
                  "test accuracy of tuning seed 100 (not a reported seed)")


def _claim(row, method, base, res, setting, what_extra="") -> Claim:
  metric = "test acc." if row == "mnist" else "OOD test-client acc."
  last = res["last"]
  return Claim(
      paper="FedGMA",
      what=(f"{ROW_NAME[row]}, {metric} % (mean of the last {last} rounds{what_extra}; "
            f"{WHERE[row]})"),
      method=SHORT[method], paper_value=PAPER[row][method], ours=seeds_of(res, method),
      baseline=SHORT[base], paper_baseline=PAPER[row][base],
      ours_baseline=seeds_of(res, base), protocol=PAPER_SETTINGS, setting=setting,
      folder=FOLDER, digits=1, note=data_caveat(res))


def claims() -> list:
  out = []
  r150 = load("results_cpu_r150/mnist.json")
  prox = load("results_cpu_r150_prox/mnist.json")
  r30 = load("results_cpu/mnist.json")
  cm = load("results_cpu/fed_cmnist.json")
  cpu150 = "CPU, 2,000 sample images, 150 rounds, CNN 16-32"
  out.append(_claim("mnist", "fedgma", "fedavg", r150, cpu150))
  out.append(_claim("mnist", "fedgma_fedprox", "fedprox", prox, cpu150))
  # FedAvg and FedProx come from two commands with the same data, model, schedule, seeds.
  c = _claim("mnist", "fedprox", "fedavg", r150, cpu150)
  out.append(dataclasses.replace(
      c, ours=seeds_of(prox, "fedprox"),
      note="; ".join(filter(None, [
          "FedAvg from `results_cpu_r150`, FedProx from `results_cpu_r150_prox`: same "
          "settings and seeds", data_caveat(r150, prox)]))))
  out.append(_claim("mnist", "fedgma", "fedavg", r30,
                    "CPU, 2,000 sample images, 30 rounds, CNN 16-32", " of 30"))
  out.append(_claim("fed_cmnist", "fedgma", "fedavg", cm,
                    "CPU, 600 sample images, 20 rounds, 5 local steps, CNN 16-32", " of 20"))
  for row in ("mnist", "fed_cmnist", "fed_rotmnist"):
    res = load(f"results_gpu_h100/{row}.json")
    for m, b in (("fedgma", "fedavg"), ("fedgma_fedprox", "fedprox"), ("fedprox", "fedavg")):
      out.append(_claim(row, m, b, res, H100))
  return out
