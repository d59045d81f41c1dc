"""The robustness README's results tables, generated from the committed raw records in
``results/raw/`` (written by ``fedjax-inv experiment experiments/robustness/spec.yaml``).

``python experiments/fair.py tables --only robustness`` rewrites the README's
``<!-- table:robustness/NAME -->`` blocks from :data:`TABLES`: ``attacks_10``,
``attacks_20``, ``attacks_30`` (final test accuracy by aggregator and attack, at 10 / 20 /
30 % attackers) and ``stragglers``; ``python experiments/robustness/tables.py [RESULTS]``
prints them.

Each attack table's caption states, for every robust rule, the condition its guarantee
needs and whether this table's setting meets it; the rule's parameters (Krum's f,
trimmed mean's β, the bucket size) and the attacker fraction are read from the raw runs'
``hparams``, the number of attackers is ``floor(fraction · clients)`` as in
``fedjax_inv/core/adversary.py``. ± = sample std over seeds
(``fedjax_inv.runner.outputs.format_mean_std``, ddof 1); a run without a final accuracy counts
as diverged ("k/n finite").

Only reads committed files under this folder; runs nothing.
"""
from __future__ import annotations

import json
import math
import pathlib

from fedjax_inv.runner import tuning
from fedjax_inv.runner.outputs import format_mean_std

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results"
ATTACKS = ("sign_flip", "scale", "gaussian", "label_flip", "alie", "ipm")
AGGREGATORS = ("mean", "median", "trimmed_mean", "krum", "geomed", "centered_clip",
               "bucketing2+krum")
STRAGGLER_ALGS = ("fedavg", "fedprox", "fednova")
STRAGGLER_COLS = (("0-keep", "0%"), ("0.5-drop", "50% drop"), ("0.5-keep", "50% keep"),
                  ("0.9-drop", "90% drop"), ("0.9-keep", "90% keep"))
CLIENTS = 20  # every client takes part in every round (the spec's num_clients)


def load(out: pathlib.Path = RESULTS) -> dict:
  """{(group, name): [records]} of ``out/raw/<group>/<name>-seed<s>.json`` (the spec's
  record paths), seeds in order."""
  by = {}
  for p in sorted((out / "raw").glob("*/*.json")):
    r = json.loads(p.read_text())
    by.setdefault((r["key"]["group"], r["key"]["name"]), []).append(r)
  for runs in by.values():
    runs.sort(key=lambda r: r["key"]["seed"])
  return by


def cell(runs: list) -> str:
  """Final test accuracy (%), mean ± sample std over seeds; None (diverged) counted."""
  return format_mean_std([(r["final"] or {}).get("test_accuracy") for r in runs], digits=1,
                         scale=100)


def data_line(by: dict) -> str:
  """``''``, or a line saying the runs' clients come from the partitioner used before
  Flower Datasets' (their data notes do not name Flower)."""
  c = tuning.partitioner_caveat(r["data"]["note"] for rs in by.values() for r in rs)
  return f"**Data:** {c}." if c else ""


def fractions(by: dict) -> list:
  return sorted({float(n.rsplit("-", 1)[1]) for g, n in by if g == "attacks"} - {0.0})


def _params(spec: str) -> dict:
  """``'krum:f=4'`` -> {'f': 4.0}."""
  _, _, args = spec.partition(":")
  return {k: float(v) for k, v in (a.split("=") for a in args.split(",") if a)}


def _one(by: dict, agg: str, frac: float) -> dict:
  """The hparams of the aggregator's runs at ``frac`` (all seeds and attacks agree)."""
  hps = [r["hparams"] for a in ATTACKS
         for r in by.get(("attacks", f"{agg}-{a}-{frac:g}"), [])]
  keys = ("aggregator", "bucketing", "attack_fraction")
  assert hps and all({k: h.get(k) for k in keys} == {k: hps[0].get(k) for k in keys}
                     for h in hps), (agg, frac)
  assert hps[0]["attack_fraction"] == frac, (agg, frac)
  return hps[0]


def assumptions(by: dict, frac: float) -> list:
  """One line per robust rule: the condition of its guarantee, met or not here."""
  m = int(math.floor(frac * CLIENTS))
  n = CLIENTS
  out = []
  hp = _one(by, "trimmed_mean", frac)
  beta = _params(hp["aggregator"])["beta"]
  cut = int(math.floor(beta * n))
  out.append(f"trimmed mean, β = {beta:g} (trims {cut} per side): needs β ≥ the attacker "
             f"fraction, i.e. {cut} ≥ {m} attackers (Yin et al. 2018): "
             + ("met" if cut >= m else "**not met**"))
  hp = _one(by, "krum", frac)
  f = int(_params(hp["aggregator"])["f"])
  ok = n > 2 * f + 2 and f >= m
  out.append(f"Krum, f = {f}: needs n > 2f + 2 ({n} > {2 * f + 2}) and f ≥ the number of "
             f"attackers ({f} ≥ {m}) (Blanchard et al. 2017): "
             + ("met" if ok else "**not met**"))
  hp = _one(by, "bucketing2+krum", frac)
  s, f = int(hp["bucketing"]), int(_params(hp["aggregator"])["f"])
  b = math.ceil(n / s)
  bad = min(m, b)  # each attacker spoils at most one bucket
  ok = b > 2 * f + 2 and f >= bad
  out.append(f"bucketing s = {s} + Krum, f = {f}: Krum sees {b} bucket means, of which up "
             f"to {bad} hold an attacker; it needs {b} > {2 * f + 2} and {f} ≥ {bad} "
             "(Karimireddy et al. 2022): " + ("met" if ok else "**not met**"))
  out.append(f"median and geometric median: need fewer than half the clients to be "
             f"attackers ({m} < {n / 2:g}): " + ("met" if 2 * m < n else "**not met**"))
  hp = _one(by, "centered_clip", frac)
  out.append(f"centered clipping ({hp['aggregator'].partition(':')[2].replace(',', ', ')}): "
             "no attacker-count parameter; its guarantee (Karimireddy et al. 2021) is for "
             "clients with momentum, which these runs do not use: not checked")
  return out


def attacks_table(frac: float, out: pathlib.Path = RESULTS) -> str:
  by = load(out)
  m = int(math.floor(frac * CLIENTS))
  lines = [f"**{100 * frac:g}% attackers** ({m} of {CLIENTS} clients, the same in every "
           "round) — final test accuracy (%), mean ± sample std over seeds; column "
           "'none' = no attack. The robust rules' assumptions, with the runs' settings:",
           ""]
  lines += [f"- {a}" for a in assumptions(by, frac)]
  if data_line(by):
    lines += ["", data_line(by)]
  lines += ["", "| aggregator | none | " + " | ".join(ATTACKS) + " |",
            "|---" * (len(ATTACKS) + 2) + "|"]
  for agg in AGGREGATORS:
    cells = [cell(by.get(("attacks", f"{agg}-none-0"), []))]
    cells += [cell(by.get(("attacks", f"{agg}-{a}-{frac:g}"), [])) for a in ATTACKS]
    lines.append(f"| {agg} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def stragglers_table(out: pathlib.Path = RESULTS) -> str:
  by = load(out)
  lines = ["**Stragglers** (20 local steps; stragglers run Uniform{1..19}) — final test "
           "accuracy (%), mean ± sample std over seeds", "",
           "| algorithm | " + " | ".join(c for _, c in STRAGGLER_COLS) + " |",
           "|---" * (len(STRAGGLER_COLS) + 1) + "|"]
  for method in STRAGGLER_ALGS:  # a table row per method (nothing runs here)
    cells = [cell(by.get(("stragglers", f"{method}-{c}"), [])) for c, _ in STRAGGLER_COLS]
    lines.append(f"| {method} | " + " | ".join(cells) + " |")
  runs = [r for rs in by.values() for r in rs]
  seeds = sorted({r["key"]["seed"] for r in runs})
  lines.append(f"\nSeeds {seeds}; {len(runs)} runs in `results/raw/`. {data_line(by)}".rstrip())
  return "\n".join(lines)


def all_tables(out: pathlib.Path = RESULTS) -> str:
  """Every table of the records under ``out``."""
  by = load(out)
  parts = [attacks_table(f, out) for f in fractions(by)]
  if any(g == "stragglers" for g, _ in by):
    parts.append(stragglers_table(out))
  return "\n\n".join(parts)


TABLES = {"attacks_10": lambda: attacks_table(0.1), "attacks_20": lambda: attacks_table(0.2),
          "attacks_30": lambda: attacks_table(0.3), "stragglers": stragglers_table}


if __name__ == "__main__":
  import sys
  print(all_tables(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS))
