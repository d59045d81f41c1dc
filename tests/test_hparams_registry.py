"""The hyperparameter registry (issue 14, DomainBed-style): defaults come from the
factories, search spaces from algorithms/hparams.py, and `run --search N` runs random
points from them, recorded in summary.json."""
import json
import math

import pytest

from fedjax_inv.algorithms import hparams as hp
from fedjax_inv.algorithms import make_algorithm, registry
from fedjax_inv.cli import main


def test_defaults_are_the_factorys_resolved_hparams():
  for name in ("fedavg", "fedprox", "fishr_inter_geo", "fedgma", "fedsr"):
    assert hp.defaults(name) == make_algorithm(name).hparams
  assert hp.defaults("fedprox")["mu"] == 0.01


def test_every_algorithm_has_a_space_whose_points_build():
  for name, entry in registry().items():
    space = hp.search_space(name)
    assert space, name
    for p in hp.random_points(name, 3, seed=1):
      assert set(p) == set(space)
      make_algorithm(name, **p)  # every drawn point is a valid setting
    # a knob the algorithm fixes is never searched (FedSGD-type: server_lr instead)
    assert not set(space) & set(entry.fixed), name
  assert "server_lr" in hp.search_space("fishr_inter_geo")
  assert "client_lr" not in hp.search_space("fishr_inter_geo")


def test_random_points_reproducible_in_range_distinct_and_excluding():
  a = hp.random_points("fedprox", 8, seed=3)
  assert a == hp.random_points("fedprox", 8, seed=3)
  assert a != hp.random_points("fedprox", 8, seed=4)
  assert hp.random_points("fedprox", 1, seed=3) == a[:1]
  assert len({json.dumps(p, sort_keys=True) for p in a}) == 8
  for p in a:
    assert -3.0 - 1e-3 <= math.log10(p["mu"]) <= 0.0 + 1e-3
    assert -3.0 - 1e-3 <= math.log10(p["client_lr"]) <= -0.5 + 1e-3
    assert p["mu"] == float(f"{p['mu']:.3g}")  # 3 significant digits: readable labels
  assert all(set(p) == {"mu"} for p in hp.random_points("fedprox", 4, 0,
                                                        exclude={"client_lr": 0.1}))
  # a choice range alone has as many distinct points as choices (more: refused, below)
  fedavgm = hp.random_points("fedavgm", 4, seed=0, exclude=("client_lr",))
  assert sorted(p["server_momentum"] for p in fedavgm) == [0.0, 0.9, 0.97, 0.99]


@pytest.mark.parametrize("call,match", [
    (lambda: hp.random_points("fedprox", 0), "positive int"),
    (lambda: hp.random_points("fedprox", 2, seed=-1), "seed"),
    (lambda: hp.search_space("fedfoo"), "unknown algorithm"),
    (lambda: hp.defaults("fedfoo"), "unknown algorithm"),
    (lambda: hp.random_points("fedavgm", 5, exclude=("client_lr",)), "distinct"),
])
def test_bad_input(call, match):
  with pytest.raises(ValueError, match=match):
    call()


def test_run_search_records_points_and_space(tmp_path, capsys):
  out = tmp_path / "s"
  rc = main(["run", "--task", "colored_mnist", "--algorithm", "fedprox", "--search", "2",
             "--search-seed", "5", "--hp", "client_lr=0.1", "--rounds", "1",
             "--out", str(out), "--no-progress"])
  assert rc == 0
  summary = json.loads((out / "summary.json").read_text())
  want = hp.random_points("fedprox", 2, seed=5, exclude={"client_lr": 0.1})
  assert [r["algorithm"] for r in summary["runs"]] == [
      f"fedprox@mu={p['mu']:g}" for p in want]
  assert summary["search"]["fedprox"]["seed"] == 5
  assert set(summary["search"]["fedprox"]["space"]) == {"mu"}  # client_lr was fixed


@pytest.mark.parametrize("argv,match", [
    (["--search", "2", "--sweep", "mu=0.1,0.2"], "--search and --sweep"),
    (["--search", "0"], "--search"),
    (["--search-seed", "-1", "--search", "2"], "--search-seed"),
])
def test_run_search_bad_input(tmp_path, capsys, argv, match):
  rc = main(["run", "--task", "colored_mnist", "--algorithm", "fedprox", "--rounds", "1",
             "--out", str(tmp_path / "x"), "--no-progress"] + argv)
  assert rc == 2
  assert match in capsys.readouterr().err
  assert not (tmp_path / "x").exists()


def test_cli_hparams_prints_defaults_task_values_and_space(capsys):
  assert main(["hparams", "fishr_inter_geo", "--task", "colored_mnist"]) == 0
  text = capsys.readouterr().out
  assert "fishr_lambda" in text and "DomainBed Fishr" in text
  assert "on task 'colored_mnist'" in text
