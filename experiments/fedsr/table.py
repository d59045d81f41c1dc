"""Paper-vs-ours table for FedSR Table 1 (RotatedMNIST) from run_full.sh outputs.

Usage: python experiments/fedsr/table.py OUT_DIR [selection]
Reads OUT_DIR/<algorithm>/results.csv (written by `fedjax-inv run --holdout ...`) and
prints a markdown table of the accuracy (%) per held-out domain, mean ± std over seeds,
for the given model selection ('last' by default: FedSR §4.2 reports the last epoch),
next to the paper's Table 1 numbers (FedSR, Nguyen et al. 2022).
"""
import csv
import pathlib
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


def main(argv):
  if len(argv) < 2:
    raise SystemExit(__doc__)
  out = pathlib.Path(argv[1])
  selection = argv[2] if len(argv) > 2 else "last"
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
