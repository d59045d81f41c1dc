"""FedGMA README tables and verdict claims, from the raw results of this folder.

``python experiments/fair.py tables --only fedgma`` renders every ``<!-- table:fedgma/NAME
-->`` block of ``experiments/fedgma/README.md`` from :data:`TABLES`; ``claims()`` gives the
paper comparisons of those tables to the verdicts table (``<!-- table:fedgma/verdicts -->``
and the top-level one). The fair row ``fedgma_mnist`` is ``experiments/fair.py``'s own.

Every table reads its runs through :func:`load`, one entry of :data:`SOURCES` each: the
raw records of a part of ``spec.yaml`` / ``tune.yaml`` (``fedjax-inv experiment``, one
record per run and seed under ``results/<group>/``) when any exist, else the file the
former script ``reproduce.py`` wrote for the same settings (one JSON per command; per
algorithm and seed the last-L mean, the final metrics and the per-round curve):

* ``results_gpu_h100/{mnist,fed_cmnist,fed_rotmnist}.json``: group ``full``, on one H100,
  on the clients of the label partitioner used before Flower Datasets' (also shown as
  they are, table ``h100_former``).
* ``results_cpu_r150/mnist.json``, ``results_cpu_r150_prox/mnist.json``: group
  ``mnist_r150`` (MNIST, 150 rounds), FedAvg / FedGMA and FedProx / FedGMA + FedProx.
* ``results_cpu_r150/tune_mnist.json``: ``tune.yaml`` (the unequal tuning, selected on
  test accuracy).
* ``results_cpu/{mnist,fed_cmnist}.json``: groups ``mnist_r30`` (30-round MNIST) and
  ``cmnist_r20`` (20-round FedCMNIST).

± everywhere: :func:`fedjax_inv.runner.outputs.format_mean_std` (sample std over seeds, ddof 1).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
from typing import NamedTuple

import numpy as np

from fedjax_inv.eval.verdict import Claim
from fedjax_inv.runner import outputs, spec, tuning

HERE = pathlib.Path(__file__).resolve().parent
FOLDER = "experiments/fedgma"

# Paper numbers (% accuracy, average over the last 20 rounds): FedGMA Table 1 (MNIST,
# non-i.i.d. over 10 clients) and Table 2 (non-i.i.d. rows).
PAPER = {
    "mnist": {"fedavg": 95.73, "fedgma": 97.1, "fedprox": 94.08, "fedgma_fedprox": 95.49},
    "fed_cmnist": {"fedavg": 55.2, "fedgma": 60.77, "fedprox": 53.35,
                   "fedgma_fedprox": 56.33},
    "fed_rotmnist": {"fedavg": 71.17, "fedgma": 73.68, "fedprox": 77.48,
                     "fedgma_fedprox": 78.35},
}
ALGS = ("fedavg", "fedgma", "fedprox", "fedgma_fedprox")
# The test-client accuracy of each task: the test split for MNIST (FedGMA §5.1 "client
# sample test"), the test clients with unseen colors / angles for FedCMNIST / FedRotMNIST
# (FedGMA §5.2).
METRIC = {"mnist_noniid": "test_accuracy", "fed_cmnist": "ood_accuracy",
          "fed_rotmnist": "ood_accuracy"}
NAME = {"fedavg": "FedAvg", "fedgma": "FedGMA (τ = 0.4)", "fedprox": "FedProx (μ = 0.01)",
        "fedgma_fedprox": "FedGMA + FedProx"}
SHORT = {"fedavg": "FedAvg", "fedgma": "FedGMA", "fedprox": "FedProx",
         "fedgma_fedprox": "FedGMA+FedProx"}
ROW_NAME = {"mnist": "MNIST non-i.i.d.", "fed_cmnist": "FedCMNIST non-i.i.d.",
            "fed_rotmnist": "FedRotMNIST non-i.i.d."}
WHERE = {"mnist": "Table 1", "fed_cmnist": "Table 2", "fed_rotmnist": "Table 2"}
ROWS = ("mnist", "fed_cmnist", "fed_rotmnist")  # spec group ``full``'s row axis
H100_FILES = "results_gpu_h100/{mnist,fed_cmnist,fed_rotmnist}.json"


class Source(NamedTuple):
  """A part of a spec (its ``group``, the option of its ``row`` axis, the columns) and the
  file the former script wrote for the same settings."""
  spec: str
  group: str
  row: str | None
  methods: tuple
  former: str


SOURCES = {
    "full_mnist": Source("spec.yaml", "full", "mnist", ALGS, "results_gpu_h100/mnist.json"),
    "full_fed_cmnist": Source("spec.yaml", "full", "fed_cmnist", ALGS,
                              "results_gpu_h100/fed_cmnist.json"),
    "full_fed_rotmnist": Source("spec.yaml", "full", "fed_rotmnist", ALGS,
                                "results_gpu_h100/fed_rotmnist.json"),
    "mnist_r150": Source("spec.yaml", "mnist_r150", None, ("fedavg", "fedgma"),
                         "results_cpu_r150/mnist.json"),
    "mnist_r150_prox": Source("spec.yaml", "mnist_r150", None, ("fedprox", "fedgma_fedprox"),
                              "results_cpu_r150_prox/mnist.json"),
    "mnist_r30": Source("spec.yaml", "mnist_r30", None, ("fedavg", "fedgma"),
                        "results_cpu/mnist.json"),
    "cmnist_r20": Source("spec.yaml", "cmnist_r20", None, ("fedavg", "fedgma"),
                         "results_cpu/fed_cmnist.json"),
    "tune_mnist": Source("tune.yaml", "tune", None, ("fedavg", "fedgma"),
                         "results_cpu_r150/tune_mnist.json"),
}


def last_mean(history, metric: str, last: int) -> float:
  """Mean of ``metric`` over the last ``last`` history entries (FedGMA's "average test
  performance over the last 20 rounds" when every round is evaluated, as in every run
  of the specs here)."""
  vals = [h[metric] for h in history if metric in h]
  if not vals:
    raise ValueError(f"metric {metric!r} not in the run's history.")
  return float(np.mean(vals[-last:]))


def column(rec: dict) -> str:
  """A record's table column: its algorithm, ``fedgma_<base>`` for FedGMA over another
  base than FedAvg."""
  name, base = rec["registry_name"], rec["hparams"].get("base", "fedavg")
  return name if name != "fedgma" or base == "fedavg" else f"fedgma_{base}"


def _run_of(rec: dict) -> dict:
  """A record as the former script's per-run dict (the keys the tables read)."""
  cfg = rec["key"]["config"]
  ok = rec["status"] == "ok"
  return {"label": column(rec), "seed": rec["key"]["seed"], "algorithm": rec["registry_name"],
          "hparams": rec["hparams"],
          "last_mean": (last_mean(rec["history"], METRIC[cfg["task"]], int(cfg["last_k"]))
                        if ok else None),
          "final": rec["final"] or {}, "seconds": rec.get("seconds"),
          "data_note": rec["data"]["note"]}


def records(src: Source) -> dict:
  """``{path relative to this folder: record}``: the raw records of ``src``'s runs that
  are on disk for the spec's current settings (a record of a changed configuration does
  not count), run by run, seeds in order."""
  sp = spec.load_spec(HERE / src.spec)
  where = {"group": [src.group], **({"row": [src.row]} if src.row else {})}
  return {sp.record_path(HERE, run, s).relative_to(HERE).as_posix(): rec
          for run, s, rec in spec.kept_records(sp, HERE, where)
          if column(rec) in src.methods}


def former(name: str) -> dict:
  """The file the former script wrote for ``SOURCES[name]``'s settings, as :func:`load`
  returns it (``from``: ``'former'``, ``machine``: None, as those files do not name it)."""
  src = SOURCES[name]
  res = json.loads((HERE / src.former).read_text())
  return {**res, "seed": res.get("seed", res.get("seeds", [None])[0]),
          "runs": res.get("runs", res.get("trials")), "raw": src.former, "from": "former",
          "machine": None}


@functools.lru_cache(maxsize=None)
def load(name: str) -> dict:
  """The runs of ``SOURCES[name]`` as the former script's results dict: ``rounds``,
  ``last``, ``seed`` (the first seed), ``runs`` (per run: ``label``, ``seed``,
  ``last_mean``, ``final``, ``hparams``, ``data_note``, ...), ``raw`` (where they are,
  relative to this folder), ``from``: the spec's raw records (``'records'``) when any
  exist, else the file the former script wrote for the same settings (``'former'``), and
  ``machine``: the records' backends from their provenance ('CPU', 'GPU'; None for a
  former file)."""
  src = SOURCES[name]
  recs = records(src)
  if not recs:
    return former(name)
  cfg = next(iter(recs.values()))["key"]["config"]
  folders = sorted({str(pathlib.PurePosixPath(p).parent) + "/" for p in recs})
  return {"rounds": cfg["rounds"], "last": cfg["last_k"],
          "seed": min(r["key"]["seed"] for r in recs.values()),
          "runs": [_run_of(r) for r in recs.values()], "raw": ", ".join(folders),
          "from": "records", "machine": spec.machines(recs.values())}


def _raw(former: str, *res: dict, fmt: str | None = None) -> str:
  """Where a table's runs are, for its caption: ``former`` (the former files' wording)
  while every part comes from them, else each part's place (``fmt`` formatted with
  them, default joined by commas)."""
  if all(r["from"] == "former" for r in res):
    return former
  places = [f"`{r['raw']}`" for r in res]
  return fmt.format(*places) if fmt else ", ".join(dict.fromkeys(places))


def data_caveat(*results: dict) -> str:
  """``''``, or the caveat that these results' clients come from the partitioner used
  before Flower Datasets' (their runs' data notes do not name Flower)."""
  return tuning.partitioner_caveat(r.get("data_note") for res in results
                                   for r in res["runs"])


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

def _full_table(res: dict, raw: str, machine: str = "H100") -> str:
  head = ["accuracy % (last 20 rounds)", "MNIST paper", "MNIST ours", "FedCMNIST paper",
          "FedCMNIST ours (OOD)", "FedRotMNIST paper", "FedRotMNIST ours (OOD)"]
  rows = []
  for a in ALGS:
    cells = [NAME[a]]
    for r in ROWS:
      cells += [f"{PAPER[r][a]:g}", ms(seeds_of(res[r], a))]
    rows.append(cells)
  return ("Mean ± sample std over seeds 0, 1, 2 (ddof 1). Machine: " + machine + ". Raw: "
          + raw + "." + _data(*res.values()) + "\n\n" + _table(head, rows))


def full() -> str:
  """Spec group ``full``: its records when there are any, else the former H100 files."""
  res = {r: load(f"full_{r}") for r in ROWS}
  machine = ", ".join(dict.fromkeys(x["machine"] or "H100" for x in res.values()))
  return _full_table(res, _raw(f"`{H100_FILES}`", *res.values()), machine)


def h100_former() -> str:
  """The former script's H100 run of group ``full``, as it was (the former clients)."""
  return _full_table({r: former(f"full_{r}") for r in ROWS}, f"`{H100_FILES}`")


def mnist_cpu() -> str:
  r150 = load("mnist_r150")
  r30 = load("mnist_r30")
  head = ["MNIST non-i.i.d., test accuracy %", "paper (full MNIST)",
          f"ours, {r150['rounds']} rounds, last-{r150['last']} mean (seeds 0,1,2)",
          f"ours, {r30['rounds']} rounds, last-{r30['last']} mean (`{r30['raw']}`)"]
  rows = [[NAME[a], f"{PAPER['mnist'][a]:g}", with_seeds(seeds_of(r150, a)),
           ms(seeds_of(r30, a))] for a in ("fedavg", "fedgma")]
  return (f"Raw: `{r150['raw']}`, `{r30['raw']}`." + _data(r150, r30)
          + "\n\n" + _table(head, rows))


def tune_mnist() -> str:
  t = load("tune_mnist")
  fa = sorted((x for x in t["runs"] if x["label"] == "fedavg"),
              key=lambda x: x["hparams"]["client_lr"])
  fg = sorted((x for x in t["runs"] if x["label"] == "fedgma"),
              key=lambda x: x["hparams"]["tau"])
  cap = (f"Tuning seed {t['seed']} (not a reported seed), {t['rounds']} rounds; every cell is "
         f"a last-20 mean of the **test** accuracy, the score this tuning selected on "
         f"(test data, not validation). Raw: `{t['raw']}`." + _data(t) + "\n\n")
  a = _table(["FedAvg client lr"] + [f"{x['hparams']['client_lr']:g}" for x in fa],
             [["last-20 test acc."] + [f"{100 * x['last_mean']:.1f}" for x in fa]])
  lr = {x["hparams"]["client_lr"] for x in fg}
  g = _table([f"FedGMA τ (lr {', '.join(f'{v:g}' for v in sorted(lr))})"]
             + [f"{x['hparams']['tau']:g}" for x in fg],
             [["last-20 test acc."] + [f"{100 * x['last_mean']:.1f}" for x in fg]])
  return cap + a + "\n\n" + g


def prox_cpu() -> str:
  res = load("mnist_r150_prox")
  head = ["MNIST non-i.i.d., test accuracy %", "paper (full MNIST)",
          f"ours, {res['rounds']} rounds, last-{res['last']} mean (seeds 0,1,2)"]
  rows = [[NAME[a], f"{PAPER['mnist'][a]:g}", with_seeds(seeds_of(res, a))]
          for a in ("fedprox", "fedgma_fedprox")]
  return f"Raw: `{res['raw']}`." + _data(res) + "\n\n" + _table(head, rows)


def cmnist_cpu() -> str:
  res = load("cmnist_r20")
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
  return f"Raw: `{res['raw']}`." + _data(res) + "\n\n" + _table(head, rows)


TABLES = {"full": full, "h100_former": h100_former, "mnist_cpu": mnist_cpu,
          "tune_mnist": tune_mnist,
          "prox_cpu": prox_cpu, "cmnist_cpu": cmnist_cpu}


# ---- claims -------------------------------------------------------------------------

FULL = ("{machine}, all images of the bundled 5,000-image MNIST sample (not the full "
        "60,000), 100 rounds, CNN 32-64")
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
  r150 = load("mnist_r150")
  prox = load("mnist_r150_prox")
  r30 = load("mnist_r30")
  cm = load("cmnist_r20")
  cpu150 = "CPU, 2,000 sample images, 150 rounds, CNN 16-32"
  out.append(_claim("mnist", "fedgma", "fedavg", r150, cpu150))
  out.append(_claim("mnist", "fedgma_fedprox", "fedprox", prox, cpu150))
  # FedAvg and FedProx: the same spec group (data, model, schedule, seeds); the former
  # script wrote them by two commands into two files.
  c = _claim("mnist", "fedprox", "fedavg", r150, cpu150)
  where = (f"FedAvg and FedProx from `{r150['raw']}`" if r150["raw"] == prox["raw"] else
           _raw("FedAvg from `results_cpu_r150`, FedProx from `results_cpu_r150_prox`",
                r150, prox, fmt="FedAvg from {}, FedProx from {}"))
  out.append(dataclasses.replace(
      c, ours=seeds_of(prox, "fedprox"),
      note="; ".join(filter(None, [where + ": same settings and seeds",
                                   data_caveat(r150, prox)]))))
  out.append(_claim("mnist", "fedgma", "fedavg", r30,
                    "CPU, 2,000 sample images, 30 rounds, CNN 16-32", " of 30"))
  out.append(_claim("fed_cmnist", "fedgma", "fedavg", cm,
                    "CPU, 600 sample images, 20 rounds, 5 local steps, CNN 16-32", " of 20"))
  for row in ("mnist", "fed_cmnist", "fed_rotmnist"):
    res = load(f"full_{row}")  # the former files ran on one H100
    setting = FULL.format(machine=res["machine"] or "H100")
    for m, b in (("fedgma", "fedavg"), ("fedgma_fedprox", "fedprox"), ("fedprox", "fedavg")):
      out.append(_claim(row, m, b, res, setting))
  return out
