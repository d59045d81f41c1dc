"""The planner's plan is an immutable record and the executor keeps its own state."""
import dataclasses
import io

import pytest

from fedjax_inv.runner import config, executor, experiment


def test_the_plan_is_frozen_and_the_executor_returns_its_state():
  pl = experiment.plan_experiment({"task": "linear_regression", "seed": 0, "seeds": 2,
                                   "rounds": 2, "algorithm": "fedavg,fedprox"})
  assert isinstance(pl, experiment.Plan)
  with pytest.raises(dataclasses.FrozenInstanceError):
    pl.rounds = 3
  before = {f.name: repr(getattr(pl, f.name)) for f in dataclasses.fields(pl)
            if f.name not in ("task", "plans", "built", "rep")}
  rec = executor.Recorder(pl, None, io.StringIO())
  ex = executor.execute(pl, None, {}, rec, False, io.StringIO())
  assert isinstance(ex, executor.Execution)
  assert ex.ran_batched is False  # CPU, --replicas auto: one run after another
  assert sorted(rec.results) == [("fedavg", 0, None), ("fedavg", 1, None),
                                 ("fedprox", 0, None), ("fedprox", 1, None)]
  assert all(isinstance(k, executor.RunKey) for k in rec.results)
  assert not any(rec.batched.values())
  after = {f.name: repr(getattr(pl, f.name)) for f in dataclasses.fields(pl)
           if f.name in before}
  assert after == before


def test_one_batching_choice_with_one_default():
  assert config.check_replicas(None) == config.DEFAULT_REPLICAS == "auto"
  for mode in config.REPLICA_MODES:
    assert config.check_replicas(mode) == mode
  with pytest.raises(ValueError, match="replicas='many'"):
    config.check_replicas("many")
  pl = experiment.plan_experiment({"task": "linear_regression", "rounds": 1})
  assert pl.replicas == config.DEFAULT_REPLICAS


def test_a_setting_is_checked_once_where_it_enters(monkeypatch, capsys):
  """The command line checks its configuration once (a CheckedConfig the planner keeps);
  a Python caller's plain dict is checked by the planner."""
  from fedjax_inv import cli
  calls = []
  real = config.check_run_config
  monkeypatch.setattr(config, "check_run_config",
                      lambda cfg: calls.append(dict(cfg)) or real(cfg))
  monkeypatch.setattr(cli, "check_run_config", config.check_run_config)
  assert cli.main(["run", "--task", "linear_regression", "--rounds", "2", "--lr", "0.05",
                   "--dry-run"]) == 0
  assert len(calls) == 1 and float(calls[0]["lr"]) == 0.05
  capsys.readouterr()
  calls.clear()
  pl = experiment.plan_experiment({"task": "linear_regression", "rounds": 2, "lr": "0.05"})
  assert len(calls) == 1 and pl.built["fedavg"].hparams["client_lr"] == 0.05
  calls.clear()
  checked = real({"task": "linear_regression", "rounds": 2, "lr": 0.05})
  assert isinstance(checked, config.CheckedConfig)
  experiment.plan_experiment(checked)
  assert calls == []
