"""The privacy-utility table and plot from the raw records of experiments/privacy/dp_fedavg.yaml.

The table code (and the divergence criterion) lives in ``tables.py``, which also renders
the README's generated blocks (``python experiments/fair.py tables --only privacy``).

Usage:  python experiments/privacy/table.py OUT
        (prints markdown; writes OUT/privacy_utility.png)
"""
from __future__ import annotations

import importlib.util
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))


def _tables():
  spec = importlib.util.spec_from_file_location("privacy_tables", HERE / "tables.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def table(out: pathlib.Path) -> str:
  return _tables().dp_fedavg_table(pathlib.Path(out).resolve())


def plot(out: pathlib.Path) -> pathlib.Path:
  return _tables().plot(pathlib.Path(out))


if __name__ == "__main__":
  out = pathlib.Path(sys.argv[1])
  print(table(out))
  print(f"\nplot: {plot(out)}")
