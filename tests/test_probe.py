"""Issue 13, a measured `auto`: `execution='probe'` times the candidate strategies on the
run's own task, keeps the fastest, records the timings, and then runs exactly as an
explicit run with the chosen strategy."""
import numpy as np
import pytest

from fedjax_inv import Task
from fedjax_inv.algorithms import make_algorithm
from fedjax_inv import simulation


def _task(tiny_binary):
  data, model = tiny_binary
  return Task("tiny", "binary", data, {"ood": data.take(np.array([0, 3]))}, model, {})


@pytest.mark.slow
def test_probe_keeps_the_fastest_measured_strategy_and_records_it(tiny_binary):
  task = _task(tiny_binary)
  alg = make_algorithm("fedavg", client_lr=0.1, local_steps=2, batch_size=8)
  kw = dict(rounds=4, eval_every=2, seed=1, progress=False, reporting=None)
  res = simulation.run(task, alg, execution="probe", **kw)
  times = res.probe["seconds_per_round"]
  assert set(times) == {"scan", "vmap"}  # 5 clients: no 'chunked' candidate
  assert all(t > 0 for t in times.values())
  assert res.probe["chosen"] == min(times, key=times.get) == res.strategy
  assert res.report()["execution_probe"] == res.probe
  ref = simulation.run(task, alg, execution=res.strategy, **kw)
  assert res.history == ref.history  # the probe's rounds do not leak into the run
  assert ref.probe is None


def test_probe_is_a_valid_cli_choice_and_lands_in_summary(tmp_path):
  import json
  from fedjax_inv import cli
  out = tmp_path / "p"
  assert cli.main(["run", "--task", "linear_regression", "--rounds", "3", "--execution",
                   "probe", "--out", str(out), "--no-progress"]) == 0
  s = json.loads((out / "summary.json").read_text())
  assert s["execution"] == s["execution_probe"]["chosen"]
  assert cli.main(["run", "--task", "linear_regression", "--execution", "fastest"]) == 2
