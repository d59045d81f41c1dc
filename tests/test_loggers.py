"""--log tensorboard,wandb,csv (fedjax_inv/runner/loggers.py): what the event files, the CSV and
the offline W&B runs hold equals metrics.jsonl; bad names are refused before anything runs."""
import csv
import json
import os
import subprocess
import sys

import pytest

from fedjax_inv.runner import loggers


def test_bad_logger_names_are_refused():
  assert loggers.check_loggers("tensorboard, CSV") == ["tensorboard", "csv"]
  assert loggers.check_loggers(None) == [] and loggers.check_loggers("none") == []
  with pytest.raises(ValueError, match="unknown logger \\['mlflow'\\]"):
    loggers.check_loggers("csv,mlflow")
  with pytest.raises(ValueError, match="named twice"):
    loggers.check_loggers("csv,csv")


def test_missing_library_names_the_extra(monkeypatch):
  import importlib.util
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda n, *a: None if n == "wandb" else real(n, *a))
  with pytest.raises(ValueError, match=r"wandb package is not installed.*fedjax_inv\[log\]"):
    loggers.check_loggers("wandb")


def test_cli_refuses_bad_log_before_running(tmp_path):
  out = tmp_path / "o"
  r = subprocess.run([sys.executable, "-m", "fedjax_inv.cli", "run", "--log", "tensorbord",
                      "--out", str(out)], capture_output=True, text=True, timeout=300)
  assert r.returncode == 2 and "tensorbord" in r.stderr and "tensorboard" in r.stderr
  assert not out.exists()


def _jsonl(out):
  return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.multiprocess  # W&B starts its service process
def test_log_writes_tensorboard_csv_and_offline_wandb_equal_to_metrics_jsonl(tmp_path):
  pytest.importorskip("tensorboardX")
  pytest.importorskip("wandb")
  ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
  out = tmp_path / "run"
  env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
  env["WANDB_MODE"] = "offline"
  r = subprocess.run([sys.executable, "-m", "fedjax_inv.cli", "run", "--task",
                      "synthetic_hospital", "--algorithm", "fedavg", "--rounds", "4",
                      "--eval-every", "2", "--seeds", "2", "--log", "tensorboard,csv,wandb",
                      "--out", str(out)], capture_output=True, text=True, env=env,
                     timeout=900)
  assert r.returncode == 0, r.stderr[-3000:]
  rows = _jsonl(out)
  rows_csv = list(csv.DictReader(open(out / "metrics.csv")))
  for seed in (0, 1):
    mine = [row for row in rows if row["seed"] == seed]
    assert [row["round"] for row in mine] == [2, 4]
    ea = ea_mod.EventAccumulator(str(out / "tensorboard" / "fedavg" / f"seed{seed}"))
    ea.Reload()
    acc = ea.Scalars("ood_accuracy")
    assert [e.step for e in acc] == [2, 4]  # one scalar per evaluated round
    for e, row in zip(acc, mine):
      assert e.value == pytest.approx(row["ood_accuracy"], rel=1e-6)
    assert set(ea.Tags()["scalars"]) >= {"train_loss", "ood_accuracy", "train_accuracy"}
    got = {(int(c["round"]), c["metric"]): float(c["value"]) for c in rows_csv
           if c["run"] == f"fedavg/seed{seed}"}
    for row in mine:
      assert got[(row["round"], "ood_accuracy")] == row["ood_accuracy"]
      assert got[(row["round"], "train_loss")] == row["train_loss"]
  runs = sorted((out / "wandb").glob("offline-run-*"))
  assert len(runs) == 2 and all(list(p.glob("*.wandb")) for p in runs)


def test_python_api_takes_the_same_loggers(tmp_path):
  import numpy as np
  from fedjax_inv import Task, from_client_arrays, make_algorithm, models, run
  rng = np.random.default_rng(0)
  xs = [rng.normal(size=(20, 4)).astype(np.float32) for _ in range(2)]
  ys = [rng.integers(0, 2, 20).astype(np.int32) for _ in range(2)]
  task = Task("toy", "multiclass", from_client_arrays(xs, ys),
              {"test": from_client_arrays(xs[:1], ys[:1])}, models.mlp(4, (8,), 2), {})
  seen = []

  class Spy:
    closed = False

    def log(self, run, config, entry):
      seen.append((run, config["seed"], config["client_lr"], entry["round"]))

    def close(self):
      Spy.closed = True

  res = run(task, make_algorithm("fedavg", client_lr=0.1), rounds=3, eval_every=1, seed=5,
            progress=False, loggers=[Spy(), loggers.CsvLogger(tmp_path)])
  assert seen == [("fedavg-seed5", 5, 0.1, r) for r in (1, 2, 3)] and Spy.closed
  rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
  final = {r["metric"]: float(r["value"]) for r in rows if r["round"] == "3"}
  assert final["test_accuracy"] == res.final["test_accuracy"]
