"""Issue 22: one hyperparameter schema (fedjax_inv/algorithms/schema.py). Every knob of
every registered algorithm is in it, every name an algorithm traces is in it, the search
spaces draw valid values, and every entry point (run flags, config files, --hp, --sweep,
make_algorithm) applies the schema's rule: changing the rule in the schema changes what
all of them accept."""
import dataclasses
import re

import pytest

from fedjax_inv import cli
from fedjax_inv.runner import config, experiment, sweep
from fedjax_inv.algorithms import hparams, make_algorithm, registry, schema
from fedjax_inv.tasks import make_task


def test_every_knob_of_every_algorithm_is_in_the_schema_and_its_default_passes():
  missing = {}
  for name in registry():
    hp = make_algorithm(name).hparams
    unknown = sorted(set(hp) - set(schema.SCHEMA))
    if unknown:
      missing[name] = unknown
    for k, v in hp.items():
      if k in schema.SCHEMA:
        schema.check(k, v)  # the factory's own default is valid
  assert missing == {}


def test_every_name_an_algorithm_traces_is_a_schema_name():
  """A sweep names what it traces by its schema name (checked there before compiling)."""
  read = set()
  for name in registry():
    read |= set(make_algorithm(name).traced)
  assert read >= {"client_lr", "server_lr", "mu", "tau", "gamma", "fishr_lambda",
                  "ditto_lambda"}
  assert read <= set(schema.SCHEMA)


def test_search_spaces_draw_valid_values():
  for name in registry():
    for k in hparams.search_space(name):
      assert k in schema.SCHEMA, (name, k)
    for point in hparams.random_points(name, 3, seed=1):
      schema.check_values(point, algorithm=name)


@pytest.mark.parametrize("name,value,msg", [
    ("client_lr", 0.0, "client_lr=0.0: must be > 0"),
    ("lr", float("nan"), "lr=nan: must be a finite number"),
    ("mu", -1, "mu=-1: must be >= 0"),
    ("tau", 1.5, "tau=1.5: must be in [0, 1]"),
    ("ema", 1.0, "ema=1.0: must be in [0, 1)"),
    ("local_steps", 2.5, "local_steps=2.5: must be an integer >= 1"),
    ("warmup_rounds", -1, "warmup_rounds=-1: must be an integer >= 0"),
    ("batch_size", 0, "batch_size=0: must be an integer >= 1 or None"),
    ("probabilistic", 1, "probabilistic=1: must be true or false"),
    ("client_optimizer", "rmsprop", "must be one of sgd, momentum, adam"),
    ("aggregator", 3, "aggregator=3: must be a string"),
    ("gamma", True, "gamma=True: must be a finite number"),
])
def test_check_refuses_with_the_rule(name, value, msg):
  with pytest.raises(ValueError, match=re.escape(msg)):
    schema.check(name, value)


def test_check_accepts_and_converts():
  assert schema.check("local_steps", 3.0) == 3 and isinstance(
      schema.check("local_steps", 3.0), int)
  assert schema.check("batch_size", None) is None
  assert schema.check("warmup_rounds", 0) == 0
  assert schema.check("unknown_name", object) is object  # left to the factory
  assert schema.check_values({"lr": 0.1}) == {"client_lr": 0.1}
  with pytest.raises(ValueError, match="both given"):
    schema.check_values({"lr": 0.1, "client_lr": 0.2})


def test_every_entry_applies_the_schema_rule(monkeypatch, tmp_path):
  """Tighten FedProx's mu to [0, 1] in the schema only: every entry refuses mu=2."""
  monkeypatch.setitem(schema.SCHEMA, "mu", dataclasses.replace(schema.SCHEMA["mu"],
                                                               kind="unit"))
  with pytest.raises(ValueError, match=r"mu=2 \(fedprox\): must be in \[0, 1\]"):
    make_algorithm("fedprox", mu=2)
  with pytest.raises(ValueError, match=r"--hp mu=2 \(fedprox\): must be in \[0, 1\]"):
    experiment.plan_experiment({"task": "linear_regression", "algorithm": "fedprox"},
                               {"mu": 2})
  with pytest.raises(ValueError, match=r"--sweep mu=2 \(fedprox\): must be in \[0, 1\]"):
    experiment.plan_experiment({"task": "linear_regression", "algorithm": "fedprox",
                                "sweep": ["mu=0.5,2"]})
  with pytest.raises(ValueError, match=r"--sweep mu=2 \(fedprox\): must be in \[0, 1\]"):
    sweep.run_sweep(make_task("linear_regression"), "fedprox", {"mu": [0.5, 2]},
                    seeds=[0], rounds=1, progress=False)
  cfg = tmp_path / "c.yaml"
  cfg.write_text("task: linear_regression\nalgorithm: fedprox\nhparams: {mu: 2}\n")
  assert cli.main(["run", "--config", str(cfg), "--no-progress",
                   "--out", str(tmp_path / "o")]) == 2
  assert not (tmp_path / "o").exists()


def test_run_flags_use_the_schema_rule(monkeypatch):
  """--lr and --tau are checked by the schema (the run flag's spelling in the message)."""
  monkeypatch.setitem(schema.SCHEMA, "client_lr", dataclasses.replace(
      schema.SCHEMA["client_lr"], kind="unit"))
  with pytest.raises(ValueError, match=r"--lr 2.0: must be in \[0, 1\]"):
    config.check_run_config({"lr": "2"})
  assert config.check_run_config({"lr": "0.5"})["lr"] == 0.5
  assert config.algorithm_overrides({"lr": 0.5, "tau": 0.3}) == {"client_lr": 0.5,
                                                                 "tau": 0.3}


@pytest.mark.slow
@pytest.mark.parametrize("task", ["colored_mnist", "colored_mnist_fedilc"])
def test_the_tasks_per_algorithm_values_pass_the_schema(task):
  """A task's `per_algorithm` block (task data, e.g. FedILC's server AdamW on
  ColoredMNIST) passes the schema and builds, so `fedjax-inv run --task T` never refuses a
  task's own values (the bundled-data tasks that have such a block)."""
  t = make_task(task)
  block = t.defaults["per_algorithm"]
  assert block
  for name in block:
    alg = make_algorithm(name, **t.algorithm_settings(name))  # the schema, the factory
    assert all(alg.hparams[k] == v for k, v in block[name].items() if k in alg.hparams)
