"""experiments/fediir/reproduce.py: model selection and the per-seed averages."""
from __future__ import annotations

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location(
    "fediir_reproduce", ROOT / "experiments/fediir/reproduce.py")
repro = importlib.util.module_from_spec(spec)
spec.loader.exec_module(repro)


def test_select_by_val_takes_best_validation_round_first_on_ties():
  hist = [{"round": 5, "val_accuracy": 0.5, "ood_accuracy": 0.4},
          {"round": 10, "val_accuracy": 0.8, "ood_accuracy": 0.3},
          {"round": 15, "val_accuracy": 0.8, "ood_accuracy": 0.9}]
  assert repro.select_by_val(hist) == {"round": 10, "val": 0.8, "test": 0.3}


def test_summarize_averages_holdouts_per_seed_and_drops_incomplete_seeds():
  def r(label, seed, h, acc):
    return {"label": label, "penalty_code": 0.0, "seed": seed, "holdout": h,
            "selected": {"test": acc}}
  res = {"holdouts": ["0", "75"],
         "runs": [r("fedavg", 0, "0", 0.6), r("fedavg", 0, "75", 0.8),
                  r("fedavg", 1, "0", 0.5)]}                 # seed 1 lacks holdout 75
  assert repro.summarize(res) == {("fedavg", 0.0): [pytest.approx(0.7)]}
