"""experiments/fedgma/reproduce.py: FedGMA's metric and the table columns (pure Python)."""
from __future__ import annotations

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load(rel, name):
  spec = importlib.util.spec_from_file_location(name, ROOT / rel)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


repro = _load("experiments/fedgma/reproduce.py", "fedgma_reproduce")


def test_last_mean_is_the_mean_of_the_last_rounds():
  hist = [{"round": r, "ood_accuracy": a} for r, a in enumerate([0.1, 0.2, 0.5, 0.7], 1)]
  assert repro.last_mean(hist, "ood_accuracy", 2) == pytest.approx(0.6)
  assert repro.last_mean(hist, "ood_accuracy", 20) == pytest.approx(0.375)  # all 4
  with pytest.raises(ValueError, match="test_accuracy"):
    repro.last_mean(hist, "test_accuracy", 2)


def test_columns_are_the_papers_pairs():
  assert repro.alg_spec("fedavg", 0.4, 0.01) == ("fedavg", {})
  assert repro.alg_spec("fedgma", 0.3, 0.01) == ("fedgma", {"base": "fedavg", "tau": 0.3})
  assert repro.alg_spec("fedgma_fedprox", 0.4, 0.1) == (
      "fedgma", {"base": "fedprox", "tau": 0.4, "mu": 0.1})
  # Every column of every row has a paper number (FedGMA Tables 1-2).
  assert all(set(v) == set(repro.ALGS) for v in repro.PAPER.values())
  assert set(repro.PAPER) == set(repro.ROWS)
