"""Paper-vs-ours table for FedSR Table 1 (RotatedMNIST) from run_full.sh outputs.

Usage: python experiments/fedsr/table.py OUT_DIR [selection]
Reads OUT_DIR/<algorithm>/results.csv (written by `fedjax-inv run --holdout ...`, run_full.sh)
or, for run_cpu.sh's layout, the per-seed runs of OUT_DIR/<algorithm>/h<D>/summary.json
(:func:`raw_table`), and prints a markdown table of the accuracy (%) per held-out domain,
mean ± std over seeds,
for the given model selection ('last' by default: FedSR §4.2 reports the last epoch),
next to the paper's Table 1 numbers (FedSR, Nguyen et al. 2022).
"""
import csv
import json
import pathlib
import statistics
import sys

DOMAINS = ["0", "15", "30", "45", "60", "75"]
# FedSR Table 1 (3 runs): per-domain mean, and the paper's average column.
PAPER = {
    "fedavg": ([85.9, 98.7, 98.8, 98.9, 98.7, 86.2], 94.5),
    "fedcmi": ([91.5, 99.2, 99.3, 99.2, 99.2, 91.0], 96.5),
    "fedl2r": ([90.5, 99.1, 99.2, 99.1, 99.2, 90.7], 96.3),
    "fedsr": ([91.6, 99.3, 99.3, 99.2, 99.3, 91.5], 96.7),
}
ORDER = ["fedavg", "fedl2r", "fedcmi", "fedsr"]


def read(out: pathlib.Path, alg: str, selection: str):
  path = out / alg / "results.csv"
  if not path.exists():
    return None
  with open(path) as f:
    for row in csv.DictReader(f):
      if row["selection"] == selection and row["algorithm"] == alg:
        return row
  return None


def per_seed(out: pathlib.Path, alg: str, selection: str = "last") -> dict:
  """``{domain: {seed: test accuracy (fraction)}}`` from run_cpu.sh's per-domain folders
  ``out/<alg>/h<D>/summary.json`` (the raw per-seed results; missing domains absent)."""
  res = {}
  for d in DOMAINS:
    f = out / alg / f"h{d}" / "summary.json"
    if f.is_file():
      runs = json.loads(f.read_text())["runs"]
      res[d] = {r["seed"]: r["selected"][selection]["ood_accuracy"] for r in runs
                if str(r["holdout"]) == d}
  return res


def _cell(values) -> str:
  from fedjax_inv.runner.outputs import format_mean_std  # sample std (ddof 1), the one convention
  return format_mean_std(list(values), 1, scale=100.0)


def raw_table(out: pathlib.Path, algs=("fedavg", "fedsr"), selection: str = "last") -> str:
  """The paper-vs-ours markdown table from the raw per-seed results (:func:`per_seed`):
  accuracy (%) per held-out domain, mean ± sample std (ddof 1) over seeds; ``avg`` is
  the mean over the six domains per seed, then mean ± std over seeds (only when every
  domain has every seed); a domain not run yet shows '(not run)'. Then one row per seed."""
  lines = [f"| algorithm | source | {' | '.join(DOMAINS)} | avg |",
           "|---|---|" + "---:|" * (len(DOMAINS) + 1)]
  seed_lines = [f"| algorithm | seed | {' | '.join(DOMAINS)} |",
                "|---|---|" + "---:|" * len(DOMAINS)]
  for alg in algs:
    dom, avg = PAPER[alg]
    lines.append(f"| {alg} | paper | " + " | ".join(f"{v:.1f}" for v in dom)
                 + f" | {avg:.1f} |")
    res = per_seed(out, alg, selection)
    cells = [_cell(res[d].values()) if d in res else "(not run)" for d in DOMAINS]
    seeds = sorted({s for r in res.values() for s in r})
    full = len(res) == len(DOMAINS) and all(set(r) == set(seeds) for r in res.values())
    cells.append(_cell([statistics.mean(res[d][s] for d in DOMAINS) for s in seeds])
                 if full and seeds else "—")
    lines.append(f"| {alg} | ours ({len(seeds)} seeds, {selection}) | "
                 + " | ".join(cells) + " |")
    for s in seeds:
      seed_lines.append(f"| {alg} | {s} | " + " | ".join(
          f"{100 * res[d][s]:.1f}" if s in res.get(d, {}) else "–" for d in DOMAINS) + " |")
  return "\n".join(lines) + "\n\nPer seed (test accuracy %, last round):\n\n" + \
      "\n".join(seed_lines)


def main(argv):
  if len(argv) < 2:
    raise SystemExit(__doc__)
  out = pathlib.Path(argv[1])
  selection = argv[2] if len(argv) > 2 else "last"
  if not any((out / a / "results.csv").exists() for a in ORDER):  # run_cpu.sh's layout
    print(raw_table(out, [a for a in ORDER if (out / a).is_dir()], selection))
    return
  print(f"| algorithm | source | {' | '.join(DOMAINS)} | avg |")
  print("|---|---|" + "---:|" * (len(DOMAINS) + 1))
  for alg in ORDER:
    dom, avg = PAPER[alg]
    print(f"| {alg} | paper | " + " | ".join(f"{v:.1f}" for v in dom) + f" | {avg:.1f} |")
    row = read(out, alg, selection)
    if row is None:
      continue
    cells = []
    for d in DOMAINS + ["avg"]:
      m = row.get(f"{d}_mean")
      cells.append("—" if m in (None, "") else
                   f"{100 * float(m):.1f} ± {100 * float(row[f'{d}_std']):.1f}")
    print(f"| {alg} | ours ({row['seeds']} seeds, {selection}) | " + " | ".join(cells)
          + " |")


if __name__ == "__main__":
  main(sys.argv)
