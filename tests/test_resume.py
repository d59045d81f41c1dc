"""Issue 11: Ctrl-C or `kill -9` after some runs keeps every finished run and the history
of the current one; `fedjax-inv run --resume DIR` runs only what is missing and gives the
same results as an uninterrupted experiment."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from fedjax_inv import cli
from fedjax_inv.runner import checkpoint, simulation

ARGS = ["run", "--task", "linear_regression", "--algorithm", "fedavg", "--seeds", "2",
        "--rounds", "4", "--eval-every", "2", "--no-progress"]


def _rows(out):
  return [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  out = tmp_path_factory.mktemp("ref") / "ref"
  assert cli.main(ARGS + ["--out", str(out)]) == 0
  return json.loads((out / "summary.json").read_text()), _rows(out)


def _same_results(summary, rows, reference):
  ref_summary, ref_rows = reference
  assert summary["status"] == "ok"
  assert [r["final"] for r in summary["runs"]] == [r["final"] for r in ref_summary["runs"]]
  assert summary["table"] == ref_summary["table"]
  def key(r):
    return (r["seed"], r["round"])
  assert sorted(rows, key=key) == sorted(ref_rows, key=key)  # no duplicated rounds


@pytest.mark.slow
def test_ctrl_c_writes_finished_runs_exits_130_and_resumes(tmp_path, monkeypatch, capsys,
                                                           reference):
  out = tmp_path / "exp"
  real_run = simulation.run
  calls = []

  def interrupted_run(*a, callback=None, **k):
    calls.append(k["seed"])

    def cb(entry):
      callback(entry)
      if k["seed"] == 1:  # Ctrl-C in the 2nd run, after its first evaluation
        raise KeyboardInterrupt
    return real_run(*a, callback=cb, **k)

  monkeypatch.setattr(simulation, "run", interrupted_run)
  assert cli.main(ARGS + ["--out", str(out)]) == 130
  err = capsys.readouterr().err
  assert "interrupted" in err and "Traceback" not in err and "--resume" in err
  s = json.loads((out / "summary.json").read_text())
  assert s["status"] == "interrupted"
  assert s["not_finished"] == [{"algorithm": "fedavg", "seed": 1}]
  assert (out / "fedavg" / "seed0" / "summary.json").exists()
  assert not (out / "fedavg" / "seed1" / "summary.json").exists()
  # the finished run's history and the current run's first evaluation are on disk
  assert [(r["seed"], r["round"]) for r in _rows(out)] == [(0, 2), (0, 4), (1, 2)]

  calls.clear()
  monkeypatch.setattr(simulation, "run", lambda *a, **k: calls.append(k["seed"])
                      or real_run(*a, **k))
  assert cli.main(["run", "--resume", str(out), "--no-progress"]) == 0
  assert calls == [1]  # only the unfinished run ran again
  _same_results(json.loads((out / "summary.json").read_text()), _rows(out), reference)


# The child process runs the CLI with seed 1's run held at its start: it writes a marker
# and blocks, so the test kills it at a known point (seed 0 recorded, seed 1 started,
# nothing of seed 1 written) however loaded the machine is. No timing decides the outcome.
_HELD_CHILD = """
import pathlib, sys, time
from fedjax_inv import cli
from fedjax_inv.runner import simulation
real = simulation.run
def run(*a, **k):
  if k.get("seed") == 1:
    pathlib.Path(sys.argv[1]).write_text("seed 1 started")
    while True:
      time.sleep(1)
  return real(*a, **k)
simulation.run = run
sys.exit(cli.main(sys.argv[2:]))
"""


@pytest.mark.multiprocess
def test_kill_9_keeps_finished_runs_and_resume_completes(tmp_path, reference):
  out = tmp_path / "killed"
  held = tmp_path / "seed1_started"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.Popen([sys.executable, "-c", _HELD_CHILD, str(held)] + ARGS +
                          ["--out", str(out)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, env=env)
  first = out / "fedavg" / "seed0" / "summary.json"
  try:
    deadline = time.time() + 600  # a bound for a broken child, not a race
    while not held.exists() and proc.poll() is None and time.time() < deadline:
      time.sleep(0.05)
    assert held.exists(), f"seed 1 never started (child exit code {proc.poll()})"
    assert first.exists(), "seed 1 started before seed 0 was recorded"
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == -signal.SIGKILL
  assert not (out / "fedavg" / "seed1" / "summary.json").exists()
  assert [r["round"] for r in _rows(out) if r["seed"] == 0] == [2, 4]
  assert cli.main(["run", "--resume", str(out), "--no-progress"]) == 0
  _same_results(json.loads((out / "summary.json").read_text()), _rows(out), reference)


def test_resume_refuses_a_different_config(tmp_path):
  out = tmp_path / "exp"
  out.mkdir()
  (out / "config.json").write_text(json.dumps({"task": "linear_regression"}))
  cfg = dict(task="linear_regression", algorithm="fedavg", rounds=3, resume=str(out))
  from fedjax_inv.runner.experiment import run_experiment
  with pytest.raises(ValueError, match="different config"):
    run_experiment(cfg, progress=False)
  assert sorted(p.name for p in out.iterdir()) == ["config.json"]


@pytest.mark.slow
def test_checkpoint_resume_is_bit_identical(tiny_binary, tmp_path):
  import chex
  import numpy as np
  from fedjax_inv.algorithms import make_algorithm
  from fedjax_inv.tasks import Task
  data, model = tiny_binary
  task = Task("tiny", "binary", data, {"ood": data.take(np.array([0]))}, model, {})
  alg = make_algorithm("fedavg", client_lr=0.1, local_steps=2, batch_size=8)
  kw = dict(rounds=6, clients_per_round=3, eval_every=1, seed=3, progress=False,
            reporting={"select": ["min:ood_loss"]})
  ref = simulation.run(task, alg, **kw)
  ckpt = tmp_path / "ckpt"

  def stop_at_5(entry):
    if entry["round"] == 5:
      raise KeyboardInterrupt
  with pytest.raises(KeyboardInterrupt):
    simulation.run(task, alg, checkpoint_dir=ckpt, checkpoint_every=2, callback=stop_at_5,
                   **kw)
  seen = []
  res = simulation.run(task, alg, checkpoint_dir=ckpt, checkpoint_every=2,
                       callback=seen.append, **kw)
  assert res.history == ref.history  # exact floats, every round
  assert seen == ref.history  # the restored rounds 1-4 are replayed to the callback
  chex.assert_trees_all_equal(res.params, ref.params)
  assert res.selected == ref.selected
  chex.assert_trees_all_equal(res.selected_params, ref.selected_params)
  # restored from round 4: a fresh start with a bad checkpoint would be refused
  other = make_algorithm("fedavg", client_lr=0.1, local_steps=2, batch_size=8)
  bad_model_task = Task("tiny", "binary", data, {}, __import__("fedjax_inv").models.mlp(
      6, (4,), 1), {})
  with pytest.raises(ValueError, match="does not match this run"):
    simulation.run(bad_model_task, other, checkpoint_dir=ckpt, checkpoint_every=2,
                   rounds=6, progress=False, reporting=None)


@pytest.mark.slow
def test_cli_resume_continues_the_current_run_from_its_checkpoint(tmp_path, monkeypatch,
                                                                   capsys, reference):
  out = tmp_path / "exp"
  real_run = simulation.run

  def interrupted_run(*a, callback=None, **k):
    def cb(entry):
      callback(entry)
      if k["seed"] == 1 and entry["round"] == 2:
        raise KeyboardInterrupt
    return real_run(*a, callback=cb, **k)

  monkeypatch.setattr(simulation, "run", interrupted_run)
  assert cli.main(ARGS + ["--checkpoint-every", "1", "--out", str(out)]) == 130
  assert checkpoint.latest_checkpoint(out / "fedavg" / "seed1" / "checkpoint") == 2
  starts = []

  def counting_run(*a, **k):
    starts.append((k["seed"], checkpoint.latest_checkpoint(k["checkpoint_dir"])))
    return real_run(*a, **k)
  monkeypatch.setattr(simulation, "run", counting_run)
  assert cli.main(["run", "--resume", str(out), "--no-progress"]) == 0
  assert starts == [(1, 2)]  # only seed 1 ran, and from its round-2 checkpoint
  assert not (out / "fedavg" / "seed1" / "checkpoint").exists()  # removed when done
  s = json.loads((out / "summary.json").read_text())
  assert s["config"]["checkpoint_every"] == 1
  _same_results(s, _rows(out), reference)


MID = ["run", "--task", "linear_regression", "--algorithm", "fedavg", "--seeds", "1",
       "--rounds", "60", "--eval-every", "5", "--checkpoint-every", "1", "--no-progress"]


def _steps(ckpt):
  # orbax step folders (digits); the temporary folder of a save in flight is not one
  return sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit()) \
      if ckpt.is_dir() else []


@pytest.mark.multiprocess
def test_sigkill_mid_run_then_resume_is_bit_identical(tmp_path, monkeypatch):
  """SIGKILL lands while the (only) run is between rounds 10 and 60 — possibly during an
  orbax save; `--resume` continues from the newest complete checkpoint and ends with the
  same metrics, bit for bit, as an uninterrupted run."""
  ref = tmp_path / "ref"
  assert cli.main(MID + ["--out", str(ref)]) == 0
  out = tmp_path / "killed"
  ckpt = out / "fedavg" / "seed0" / "checkpoint"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.Popen([sys.executable, "-m", "fedjax_inv.cli"] + MID +
                          ["--out", str(out)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, env=env)
  try:
    deadline = time.time() + 240
    while (not _steps(ckpt) or _steps(ckpt)[-1] < 10) and proc.poll() is None \
        and time.time() < deadline:
      time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
  assert not (out / "fedavg" / "seed0" / "summary.json").exists()
  at = checkpoint.latest_checkpoint(ckpt)
  assert at is not None and 10 <= at < 60
  real_run = simulation.run
  starts = []

  def counting_run(*a, **k):
    starts.append(checkpoint.latest_checkpoint(k["checkpoint_dir"]))
    return real_run(*a, **k)
  monkeypatch.setattr(simulation, "run", counting_run)
  assert cli.main(["run", "--resume", str(out), "--no-progress"]) == 0
  assert starts == [at]  # continued from the checkpoint, not from round 1
  a = json.loads((out / "summary.json").read_text())
  b = json.loads((ref / "summary.json").read_text())
  assert a["status"] == "ok" and a["final"] == b["final"]
  def key(r):
    return (r["seed"], r["round"])
  assert sorted(_rows(out), key=key) == sorted(_rows(ref), key=key)  # every evaluation


@pytest.mark.slow
def test_cli_resume_of_batched_replicas_from_their_checkpoint(tmp_path, monkeypatch):
  """Issue 22: `--replicas batched` no longer turns checkpoints off: the batch (both seeds
  in one program) saves one checkpoint, an interrupted batch resumes from it, and the
  results equal an uninterrupted batched run exactly."""
  from fedjax_inv.runner import replicas
  args = ARGS + ["--replicas", "batched", "--checkpoint-every", "1", "--rounds", "5"]
  ref = tmp_path / "ref"
  assert cli.main(args + ["--out", str(ref)]) == 0
  real = replicas.run_replicas

  def interrupted(*a, callback=None, **k):
    def cb(s, entry):
      callback(s, entry)
      if entry["round"] == 2:
        raise KeyboardInterrupt
    return real(*a, callback=cb, **k)
  monkeypatch.setattr(replicas, "run_replicas", interrupted)
  out = tmp_path / "exp"
  assert cli.main(args + ["--out", str(out)]) == 130
  batch = [p for p in (out / "fedavg").iterdir() if p.name.startswith("batch-")]
  assert len(batch) == 1 and checkpoint.latest_checkpoint(batch[0] / "checkpoint") == 2
  starts = []

  def counting(*a, **k):
    starts.append(checkpoint.latest_checkpoint(k["checkpoint_dir"]))
    return real(*a, **k)
  monkeypatch.setattr(replicas, "run_replicas", counting)
  assert cli.main(["run", "--resume", str(out), "--no-progress"]) == 0
  assert starts == [2]  # the batch continued from its round-2 checkpoint
  assert not batch[0].exists()  # ours, removed when the batch is over
  a = json.loads((out / "summary.json").read_text())
  b = json.loads((ref / "summary.json").read_text())
  assert a["status"] == "ok" and a["table"] == b["table"]
  assert [r["final"] for r in a["runs"]] == [r["final"] for r in b["runs"]]
  def key(r):
    return (r["seed"], r["round"])
  assert sorted(_rows(out), key=key) == sorted(_rows(ref), key=key)
