"""--precision: the arithmetic of a run's float32 matrix products and convolutions.

On a CPU all three settings compute float32, so these tests check where the setting is in
force (while every program of the run is traced and compiled), what is recorded, and the
refusals; its effect on speed and accuracy is a GPU measurement (benchmarks/)."""
import jax
import numpy as np
import pytest

from fedjax_inv import Task
from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.runner import config, replicas, simulation


@pytest.fixture
def task(tiny_binary):
  data, model = tiny_binary
  return Task("tiny", "binary", data, {"test": data.take(np.arange(2))}, model, {})


def _spy(monkeypatch):
  """Records the matmul precision in force each time a run builds or trains."""
  seen = []
  for name in ("prepare", "train_loop"):
    real = getattr(simulation, name)

    def wrapped(*a, _real=real, _name=name, **k):
      seen.append((_name, jax.config.jax_default_matmul_precision))
      return _real(*a, **k)
    monkeypatch.setattr(simulation, name, wrapped)
  return seen


@pytest.mark.parametrize("precision, jax_name", [("highest", "highest"),
                                                 ("tf32", "tensorfloat32"),
                                                 ("bf16", "bfloat16")])
def test_a_run_builds_and_trains_under_its_precision_and_records_it(task, monkeypatch,
                                                                   precision, jax_name):
  seen = _spy(monkeypatch)
  alg = make_algorithm("fedavg", local_steps=1, batch_size=8)
  res = simulation.run(task, alg, rounds=1, seed=0, progress=False, execution="vmap",
                       precision=precision)
  assert seen == [("prepare", jax_name), ("train_loop", jax_name)]
  assert res.precision == precision and res.report()["precision"] == precision
  # the setting does not leak out of the run
  assert jax.config.jax_default_matmul_precision is None
  seen.clear()
  out = replicas.run_replicas(task, alg, seeds=[0, 1], rounds=1, progress=False,
                              execution="vmap", precision=precision)
  assert seen == [("prepare", jax_name), ("train_loop", jax_name)]
  assert [r.precision for r in out] == [precision] * 2


def test_the_default_is_float32_on_every_device(task, monkeypatch):
  seen = _spy(monkeypatch)
  res = simulation.run(task, make_algorithm("fedavg", local_steps=1, batch_size=8),
                       rounds=1, progress=False, execution="vmap")
  assert {p for _, p in seen} == {"highest"} and res.report()["precision"] == "highest"


def test_an_unknown_precision_is_refused_before_anything_runs(task, monkeypatch):
  monkeypatch.setattr(simulation, "prepare", lambda *a, **k: pytest.fail("built"))
  with pytest.raises(ValueError, match=r"precision='fp8'; choose one of \('highest', "
                     r"'tf32', 'bf16'\)"):
    simulation.run(task, make_algorithm("fedavg"), rounds=1, progress=False,
                   precision="fp8")
  with pytest.raises(ValueError, match="precision"):
    config.check_run_config({"precision": "fp8"})
  assert config.check_run_config({"precision": "tf32"})["precision"] == "tf32"
