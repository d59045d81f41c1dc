"""Progress everywhere: a tqdm bar in a terminal, plain flushed lines elsewhere (logs, CI,
nohup, pipes), nothing with progress=False; the first line of a run names its data loading
and compile seconds, which summary.json keeps under ``timing``."""
import io
import json
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from fedjax_inv.runner import progress, simulation
from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.tasks import Task

LINE = re.compile(r"^(?P<label>.+): round (?P<r>\d+)/(?P<total>\d+), \S+ s/round, "
                  r"ETA [^;]+(; .*)?$")


def _task(tiny_binary):
  data, model = tiny_binary
  return Task("tiny", "binary", data, {"ood": data.take(np.array([0]))}, model, {})


def _alg():
  return make_algorithm("fedavg", client_lr=0.1, local_steps=1, batch_size=8)


def _rounds(text, label="fedavg seed 0"):
  """The round numbers of the plain progress lines of ``label`` in ``text``."""
  out = []
  for line in text.splitlines():
    m = LINE.match(line)
    if m and m["label"] == label:
      out.append(int(m["r"]))
  return out


class _FakeClock:
  """progress.clock, advancing ``step`` seconds at every read."""

  def __init__(self, step):
    self.t, self.step = 1000.0, step

  def __call__(self):
    self.t += self.step
    return self.t


def test_plain_lines_one_per_evaluated_round_when_stderr_is_not_a_terminal(tiny_binary,
                                                                          capsys):
  res = simulation.run(_task(tiny_binary), _alg(), rounds=4, eval_every=2, seed=0,
                       reporting=None, execution="scan", load_seconds=1.5)
  err = capsys.readouterr().err
  lines = err.splitlines()
  first = [l for l in lines if l.startswith("fedavg seed 0:")][0]
  assert re.fullmatch(r"fedavg seed 0: data 1\.5 s, compile \d+\.\d s", first), first
  assert _rounds(err) == [2, 4]  # one line per evaluated round, nothing in between
  last = [l for l in lines if LINE.match(l)][-1]
  assert "round 4/4" in last and "ETA 0 s" in last
  assert "train_acc " in last and "ood_acc " in last and "train_loss " in last
  t = res.timing
  assert set(t) == {"load_s", "compile_s", "first_round_at_s", "round_s"}
  assert t["load_s"] == 1.5 and t["compile_s"] > 0 and t["round_s"] > 0
  assert t["first_round_at_s"] == pytest.approx(t["compile_s"] + 1.5, abs=2e-3)
  assert res.report()["timing"] == t


def test_a_line_at_least_every_minute_without_evaluations(tiny_binary, capsys,
                                                           monkeypatch):
  kw = dict(rounds=5, eval_every=5, seed=0, reporting=None, execution="scan")
  simulation.run(_task(tiny_binary), _alg(), **kw)
  assert _rounds(capsys.readouterr().err) == [5]  # real clock: only the evaluation
  monkeypatch.setattr(progress, "clock", _FakeClock(61.0))  # > a minute per boundary
  simulation.run(_task(tiny_binary), _alg(), **kw)
  err = capsys.readouterr().err
  assert _rounds(err) == [1, 2, 3, 4, 5], err
  minute = [l for l in err.splitlines() if "round 3/5" in l][0]
  assert ";" not in minute  # no evaluation yet: no metrics on the line


def test_the_minute_rule_on_its_own():
  now = [0.0]
  out = io.StringIO()
  orig = progress.clock
  progress.clock = lambda: now[0]
  try:
    p = progress.RunProgress("x", 1000, stream=out, terminal=False, started=0.0)
    now[0] = 5.0
    p.first_call_done()
    for r in range(1, 31):  # 10 s per round, 300 s, no evaluation
      now[0] = 5.0 + 10 * r
      p.update(r, 1)
  finally:
    progress.clock = orig
  rounds = [int(m["r"]) for m in map(LINE.match, out.getvalue().splitlines()) if m]
  assert rounds == [6, 12, 18, 24, 30]  # every 60 s of wall time
  assert "10 s/round, ETA 2 h 41 min" in out.getvalue().splitlines()[-1]
  assert out.getvalue().splitlines()[0] == "x: compile 5.0 s"


def test_progress_false_prints_nothing(tiny_binary, capsys):
  res = simulation.run(_task(tiny_binary), _alg(), rounds=3, eval_every=1, seed=0,
                       reporting=None, execution="scan", progress=False)
  err = capsys.readouterr().err
  assert "round" not in err and "compile" not in err, err
  assert res.timing["compile_s"] > 0 and res.timing["load_s"] is None


def test_terminal_gets_the_bar_and_the_first_line(tiny_binary, monkeypatch):
  class Tty(io.StringIO):
    def isatty(self):
      return True
  tty = Tty()
  monkeypatch.setattr(sys, "stderr", tty)
  simulation.run(_task(tiny_binary), _alg(), rounds=3, eval_every=1, seed=0,
                 reporting=None, execution="scan", label="mine")
  text = tty.getvalue()
  assert re.search(r"mine: compile \d+\.\d s\n", text), text
  assert "/3 [" in text and "round/s" in text  # tqdm's bar
  assert not _rounds(text, "mine")  # no plain lines in a terminal


def test_bar_is_tqdm_std_without_ipywidgets(monkeypatch):
  import tqdm.std
  monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import fails
  assert progress.bar_class() is tqdm.std.tqdm


def test_batched_replicas_print_one_line_per_evaluated_round(tiny_binary, capsys):
  from fedjax_inv.runner.replicas import run_replicas
  out = run_replicas(_task(tiny_binary), _alg(), seeds=[0, 1], rounds=2, eval_every=1,
                     reporting=None, execution="scan")
  err = capsys.readouterr().err
  assert _rounds(err, "fedavg seeds 0,1") == [1, 2]
  assert re.search(r"^fedavg seeds 0,1: compile \d+\.\d s$", err, re.M), err
  assert out[0].timing == out[1].timing and out[0].timing["compile_s"] > 0


def test_main_metrics_and_formats():
  e = {"round": 3, "train_accuracy": 0.5, "train_loss": 0.7, "ood_accuracy": 0.25,
       "ood_loss": 1.0, "ood_worst_client_accuracy": 0.1, "val_accuracy": 0.4,
       "val_loss": 0.9, "test_env0_accuracy": 0.3, "personal_val_mean_client_accuracy": 1}
  assert list(progress.main_metrics(e)) == ["train_acc", "train_loss", "ood_acc",
                                            "ood_loss", "val_acc", "val_loss"]
  assert progress.main_metrics({"train_mse": 2.0, "train_loss": 2.0}) == {"train_mse": 2.0}
  assert progress.mean_entry([{"a": 1.0, "round": 2}, {"a": 3.0, "round": 2}]) == {
      "a": 2.0, "round": 2.0}
  assert [progress.format_seconds(s) for s in (None, 0, 0.123, 9.61, 243, 7500)] == [
      "?", "0 s", "0.12 s", "9.6 s", "4 min 03 s", "2 h 05 min"]


def test_experiment_names_load_and_compile_and_writes_timing(tmp_path, capsys):
  from fedjax_inv import cli
  out = tmp_path / "o"
  assert cli.main(["run", "--task", "linear_regression", "--rounds", "2", "--eval-every",
                   "1", "--seeds", "2", "--replicas", "sequential", "--out", str(out)]) == 0
  err = capsys.readouterr().err
  assert re.search(r"^fedavg seed 0: data \d+\.\d s, compile \d+\.\d s$", err, re.M), err
  assert re.search(r"^fedavg seed 1: data 0\.0 s, compile", err, re.M)  # data built once
  assert _rounds(err, "fedavg seed 1") == [1, 2]
  assert "train_mse " in err and "ood_mse " in err
  run = json.loads((out / "fedavg" / "seed0" / "summary.json").read_text())
  assert run["timing"]["load_s"] > 0 and run["timing"]["first_round_at_s"] >= \
      run["timing"]["compile_s"]
  s = json.loads((out / "summary.json").read_text())
  assert [r["timing"]["load_s"] > 0 for r in s["runs"]] == [True, False]


def test_no_progress_flag_silences_the_lines(tmp_path, capsys):
  from fedjax_inv import cli
  out = tmp_path / "o"
  assert cli.main(["run", "--task", "linear_regression", "--rounds", "2", "--out",
                   str(out), "--no-progress"]) == 0
  err = capsys.readouterr().err
  assert "compile" not in err and not _rounds(err), err
  assert json.loads((out / "summary.json").read_text())["timing"]["compile_s"] > 0


@pytest.mark.multiprocess
def test_cli_redirected_to_a_file_writes_progress_lines(tmp_path):
  exe = pathlib.Path(sys.executable).with_name("fedjax-inv")
  if not exe.exists():
    pytest.skip("the fedjax-inv command is not installed next to this Python")
  log, out = tmp_path / "log", tmp_path / "o"
  r = subprocess.run(f"'{exe}' run --task linear_regression --rounds 3 --eval-every 1 "
                     f"--out '{out}' > '{log}' 2>&1", shell=True, timeout=600)
  text = log.read_text()
  assert r.returncode == 0, text[-3000:]
  assert re.search(r"^fedavg seed 0: data \d+\.\d s, compile \d+\.\d s$", text, re.M), text
  assert _rounds(text) == [1, 2, 3], text
  assert "round 3/3" in text and "ETA" in text
  timing = json.loads((out / "summary.json").read_text())["timing"]
  assert set(timing) == {"load_s", "compile_s", "first_round_at_s", "round_s"}
