"""The fair tuning protocol (fedjax_inv/runner/tuning.py) and the validation split.

What must hold: every method gets the same number of trials (trial 0 = its starting
values); selection follows the validation score, never the OOD set; tuning and report
seeds are disjoint; the validation split partitions each client's examples; a row folder
resumes without re-running; the README tables equal the ones regenerated from the raw
results (experiments/fair.py tables --check).
"""
import json
import pathlib
import sys

import numpy as np
import pytest

from fedjax_inv.runner import tuning
from fedjax_inv.algorithms import hparams as hp
from fedjax_inv.tasks import make_task, with_validation

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _rows(data):
  x, y, n = (np.asarray(a) for a in (data.x, data.y, data.n))
  return [(x[i, :n[i]], y[i, :n[i]]) for i in range(len(n))]


def test_validation_split_partitions_every_client():
  task = make_task("synthetic_hospital", n_per_client=200, n_ood=50, seed=3)
  split = with_validation(task, 0.1, seed=7)
  assert list(split.eval_sets) == ["val", "ood"]
  before, tr, va = _rows(task.train), _rows(split.train), _rows(split.eval_sets["val"])
  assert len(tr) == len(va) == len(before) == 2
  for (x0, y0), (xt, yt), (xv, yv) in zip(before, tr, va):
    assert len(xv) == 20 and len(xt) == 180
    # every example lands in exactly one of train / val (rows are distinct floats)
    key = lambda x: {tuple(r) for r in x.round(6)}  # noqa: E731
    assert key(xt) | key(xv) == key(x0) and not key(xt) & key(xv)
    assert sorted(y0.tolist()) == sorted(yt.tolist() + yv.tolist())
  assert split.info["validation"] == {"fraction": 0.1, "seed": 7, "train_sizes": [180, 180],
                                      "val_sizes": [20, 20]}
  # the same seed gives the same split; another seed another one
  again = with_validation(task, 0.1, seed=7).eval_sets["val"]
  np.testing.assert_array_equal(np.asarray(again.x), np.asarray(split.eval_sets["val"].x))
  other = with_validation(task, 0.1, seed=8).eval_sets["val"]
  assert not np.array_equal(np.asarray(other.x), np.asarray(split.eval_sets["val"].x))


def test_validation_split_keeps_a_task_own_val_and_checks_fraction():
  task = make_task("synthetic_hospital", n_per_client=40, n_ood=10)
  split = with_validation(task, 0.2)
  assert with_validation(split, 0.3) is split  # already has 'val': unchanged
  for bad in (0.0, 0.6, -0.1, True):
    with pytest.raises(ValueError, match=r"validation fraction=.*\(0, 0\.5\]"):
      with_validation(task, bad)


def test_make_task_val_fraction_holds_out_part_of_every_client():
  kw = dict(seed=1, n_per_client=20, n_ood=10)
  base = make_task("synthetic_hospital", **kw)
  t = make_task("synthetic_hospital", val_fraction=0.2, **kw)
  val = t.eval_sets["val"]
  assert val.num_clients == t.train.num_clients == base.train.num_clients
  np.testing.assert_array_equal(np.asarray(t.train.n) + np.asarray(val.n),
                                np.asarray(base.train.n))
  assert np.all(np.asarray(val.n) == 4)  # 20 % of 20
  for bad in (0.9, 0.0, True):
    with pytest.raises(ValueError, match=f"val_fraction={bad!r}"):
      make_task("synthetic_hospital", val_fraction=bad, **kw)


def test_protocol_refuses_overlapping_seeds_and_bad_trials():
  with pytest.raises(ValueError, match=r"seeds \[1\] are both tuning and report seeds"):
    tuning.Protocol(trials=2, tuning_seeds=(1, 5), report_seeds=(0, 1)).check()
  with pytest.raises(ValueError, match=r"trials=0"):
    tuning.Protocol(trials=0, tuning_seeds=(5,), report_seeds=(0,)).check()
  with pytest.raises(ValueError, match=r"report_seeds=\(\)"):
    tuning.Protocol(trials=1, tuning_seeds=(5,), report_seeds=()).check()


def test_trial_points_same_budget_start_first_and_space_override():
  p = tuning.Protocol(trials=5, tuning_seeds=(9,), report_seeds=(0,), exclude=("client_lr",),
                      space={"server_lr": hp.Range("log10", -3, -1)})
  for name in ("fedavg", "inv_fedavg", "fedprox"):
    pts = tuning.trial_points(name, p)
    assert len(pts) == 5 and pts[0] == {}
    assert all("client_lr" not in q and 1e-3 <= q["server_lr"] <= 1e-1 for q in pts[1:])
  assert set(tuning.trial_points("fedprox", p)[1]) == {"mu", "server_lr"}


def _fake_records(scores):
  """(val score, OOD accuracy) per trial: the OOD ranking is the reverse of val's."""
  calls = []

  def fake(path, key, task, algorithm, settings, run_kw, label=None):
    calls.append((label, key["trial"], key["seed"], str(path.name)))
    v, o = scores[key["trial"]]
    final = {"train_accuracy": 0.9, "val_mean_client_accuracy": v, "ood_accuracy": o}
    if v is None:
      final = None
    rec = {"key": key, "algorithm": label, "hparams": dict(settings), "status": "ok",
           "final": final, "history": []}
    from fedjax_inv.runner import outputs
    outputs.write_json(path, rec)
    return rec
  return fake, calls


def test_selection_uses_validation_never_ood(tmp_path, monkeypatch):
  # trial 2 is best on validation, trial 0 best on OOD; trial 1 diverged
  scores = {0: (0.60, 0.90), 1: (None, None), 2: (0.80, 0.10), 3: (0.70, 0.50)}
  fake, calls = _fake_records(scores)
  monkeypatch.setattr(tuning, "_run_one", fake)
  p = tuning.Protocol(trials=4, tuning_seeds=(100, 101), report_seeds=(0, 1, 2))
  row = tuning.tune_row(tmp_path / "row", task="synthetic_hospital",
                        task_kwargs=dict(n_per_client=20, n_ood=10),
                        algorithms=["fedavg", "fedprox"], rounds=3, protocol=p,
                        stream=open("/dev/null", "w"))
  for a in ("fedavg", "fedprox"):
    assert row["selected"][a]["trial"] == 2
    assert row["selected"][a]["scores"][1] == -np.inf  # diverged: worst, never selected
    tuned = [c for c in calls if c[0] == a and c[3].startswith("tune")]
    assert sorted((t, s) for _, t, s, _ in tuned) == [(t, s) for t in range(4)
                                                      for s in (100, 101)]
    reported = [c for c in calls if c[0] == a and c[3].startswith("report-seed")]
    assert [(t, s) for _, t, s, _ in reported] == [(2, 0), (2, 1), (2, 2)]
    start = [c for c in calls if c[0] == a and c[3].startswith("report-starting")]
    assert [(t, s) for _, t, s, _ in start] == [(0, 0), (0, 1), (0, 2)]
  assert [r["final"]["ood_accuracy"] for r in row["report"]["fedavg"]] == [0.1] * 3
  assert [r["final"]["ood_accuracy"] for r in row["starting"]["fedavg"]] == [0.9] * 3
  proto = json.loads((tmp_path / "row" / "protocol.json").read_text())
  assert proto["protocol"]["trials"] == 4 and "never the OOD" in proto["selection"]


def test_regression_selection_minimizes_val_mse(tmp_path, monkeypatch):
  def fake(path, key, task, algorithm, settings, run_kw, label=None):
    mse = {0: 3.0, 1: 1.0, 2: 2.0}[key["trial"]]
    return {"key": key, "final": {"val_mse": mse, "ood_mse": 10 - mse}, "hparams": {}}
  monkeypatch.setattr(tuning, "_run_one", fake)
  p = tuning.Protocol(trials=3, tuning_seeds=(100,), report_seeds=(0,))
  monkeypatch.setattr(tuning, "load_row", lambda out: None)
  tuning.tune_row(tmp_path / "r", task="linear_regression", algorithms=["fedavg"], rounds=2,
                  protocol=p, stream=open("/dev/null", "w"))
  sel = json.loads((tmp_path / "r" / "selected.json").read_text())["fedavg"]
  assert sel["trial"] == 1 and sel["score"] == 1.0


def test_a_personalized_method_is_selected_on_its_personal_models(tmp_path, monkeypatch):
  """Ditto's trials differ in their personal score only (the global model is FedAvg's):
  selection reads personal_val_mean_client_accuracy, and the table's 'a|b' column falls
  back to the global model's score for a method without personal models."""
  personal = {0: 0.70, 1: 0.90, 2: 0.80}

  def fake(path, key, task, algorithm, settings, run_kw, label=None):
    final = {"val_mean_client_accuracy": 0.5, "ood_accuracy": 0.1}
    if label == "ditto":
      final["personal_val_mean_client_accuracy"] = personal[key["trial"]]
    return {"key": key, "final": final, "hparams": {}}
  monkeypatch.setattr(tuning, "_run_one", fake)
  p = tuning.Protocol(trials=3, tuning_seeds=(100,), report_seeds=(0,))
  monkeypatch.setattr(tuning, "load_row", lambda out: None)
  tuning.tune_row(tmp_path / "r", task="synthetic_hospital",
                  task_kwargs=dict(n_per_client=20, n_ood=10),
                  algorithms=["fedavg", "ditto"], rounds=2, protocol=p,
                  stream=open("/dev/null", "w"))
  sel = json.loads((tmp_path / "r" / "selected.json").read_text())
  assert sel["ditto"]["trial"] == 1 and sel["ditto"]["score"] == 0.90
  assert sel["fedavg"]["trial"] == 0  # ties on the global score: the first trial
  runs = [{"final": {"val_mean_client_accuracy": 0.5}},
          {"final": {"val_mean_client_accuracy": 0.5,
                     "personal_val_mean_client_accuracy": 0.9}}]
  key = "personal_val_mean_client_accuracy|val_mean_client_accuracy"
  assert tuning.metric_values(runs, key) == [0.5, 0.9]


@pytest.mark.slow
def test_real_row_runs_resumes_and_tables(tmp_path):
  p = tuning.Protocol(trials=2, tuning_seeds=(100,), report_seeds=(0, 1))
  kw = dict(task="synthetic_hospital", task_kwargs=dict(n_per_client=60, n_ood=30),
            algorithms={"fedavg": "fedavg", "prox": "fedprox"}, rounds=4, protocol=p,
            eval_every=2, stream=open("/dev/null", "w"))
  row = tuning.tune_row(tmp_path / "row", **kw)
  files = sorted((tmp_path / "row" / "runs").rglob("*.json"))
  stamps = {f: f.stat().st_mtime_ns for f in files}
  for a in ("fedavg", "prox"):
    assert len(row["tune"][a]) == 2 and len(row["report"][a]) == 2
    assert all(r["final"]["val_mean_client_accuracy"] >= 0.0 for r in row["tune"][a])
  assert row["report"]["prox"][0]["registry_name"] == "fedprox"
  scores = [np.mean([r["final"]["val_mean_client_accuracy"] for r in row["tune"]["fedavg"]
                     if r["key"]["trial"] == t]) for t in (0, 1)]
  assert row["selected"]["fedavg"]["trial"] == int(np.argmax(scores))
  tuning.tune_row(tmp_path / "row", **kw)  # resumed: nothing re-run
  assert {f: f.stat().st_mtime_ns for f in files} == stamps
  table = tuning.markdown_table(row, {"OOD": "ood_accuracy"}, variants=("report",))
  vals = [r["final"]["ood_accuracy"] for r in row["report"]["fedavg"]]
  assert f"{np.mean(vals):.3f} ± {np.std(vals, ddof=1):.3f}" in table.splitlines()[2]


def test_refuses_a_foreign_folder(tmp_path):
  (tmp_path / "mine.txt").write_text("user data")
  p = tuning.Protocol(trials=1, tuning_seeds=(100,), report_seeds=(0,))
  with pytest.raises(ValueError, match="did not write"):
    tuning.tune_row(tmp_path, task="linear_regression", algorithms=["fedavg"], rounds=2,
                    protocol=p)
  assert sorted(x.name for x in tmp_path.iterdir()) == ["mine.txt"]


def test_every_fair_view_has_a_block():
  # (the blocks' contents are checked by tests/test_tables.py)
  sys.path.insert(0, str(ROOT / "experiments"))
  try:
    import fair
  finally:
    sys.path.pop(0)
  # every view is used by a block (experiments READMEs, docs/reproductions.md), and every
  # block names a view
  text = "".join(p.read_text() for p in [*ROOT.glob("experiments/*/README.md"),
                                          ROOT / "experiments/colored_mnist_invariance.md",
                                          ROOT / "docs" / "reproductions.md"])
  blocks = {m[1] for m in fair.BLOCK.findall(text)}
  assert blocks == set(fair.VIEWS) | {"summary"}
  # every folder with experiments has at least one generated table
  folders = {fair.VIEWS[v][0] for v in blocks if v != "summary"}
  assert folders >= {"invariant_fedavg", "fedgma", "fediir", "fedsr", "fedilc"}


def test_one_trial_runs_nothing_on_the_tuning_seeds(tmp_path, monkeypatch):
  fake, calls = _fake_records({0: (0.5, 0.5)})
  monkeypatch.setattr(tuning, "_run_one", fake)
  p = tuning.Protocol(trials=1, tuning_seeds=(100,), report_seeds=(0, 1))
  row = tuning.tune_row(tmp_path / "r", task="linear_regression", algorithms=["fedavg"],
                        rounds=2, protocol=p, stream=open("/dev/null", "w"))
  assert [c[3] for c in calls] == ["report-seed0.json", "report-seed1.json"]
  assert row["selected"]["fedavg"]["trial"] == 0 and row["starting"] == row["report"]


def test_bad_setting_fails_before_any_run_or_file(tmp_path, monkeypatch):
  monkeypatch.setattr(tuning, "_run_one", lambda *a, **k: pytest.fail("ran"))
  p = tuning.Protocol(trials=2, tuning_seeds=(100,), report_seeds=(0,))
  with pytest.raises(ValueError, match="mu"):
    tuning.tune_row(tmp_path / "r", task="linear_regression", algorithms=["fedprox"],
                    rounds=2, protocol=p, fixed={"fedprox": {"mu": -1.0}})
  with pytest.raises(ValueError, match="unknown task"):
    tuning.tune_row(tmp_path / "r", task="no_such_task", algorithms=["fedavg"], rounds=2,
                    protocol=p)
  assert not (tmp_path / "r").exists()


def test_a_pinned_execution_is_every_run_s_strategy(tmp_path, monkeypatch):
  """``execution=`` reaches every run of the row (and protocol.json); a strategy that does
  not exist is refused before any run or file."""
  p = tuning.Protocol(trials=1, tuning_seeds=(100,), report_seeds=(0,))
  kw = dict(task="linear_regression", algorithms=["fedavg"], rounds=2, protocol=p,
            stream=open("/dev/null", "w"))
  row = tuning.tune_row(tmp_path / "r", execution="vmap", **kw)
  assert row["report"]["fedavg"][0]["execution"] == "vmap"
  assert json.loads((tmp_path / "r" / "protocol.json").read_text())["execution"] == "vmap"
  monkeypatch.setattr(tuning, "_run_one", lambda *a, **k: pytest.fail("ran"))
  with pytest.raises(ValueError, match="execution"):
    tuning.tune_row(tmp_path / "bad", execution="warp", **kw)
  assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_cli_tune_end_to_end_and_bad_input(tmp_path, capsys):
  from fedjax_inv.cli import main
  out = tmp_path / "row"
  assert main(["tune", "--task", "linear_regression", "--algorithm", "fedavg", "--trials",
               "2", "--rounds", "3", "--seeds", "0,1", "--hp", "local_steps=2",
               "--out", str(out)]) == 0
  text = capsys.readouterr().out
  assert "fedavg, starting values" in text and "ood_mse (ours)" in text
  rec = json.loads((out / "runs/fedavg/report-seed1.json").read_text())
  assert rec["hparams"]["local_steps"] == 2 and rec["key"]["seed"] == 1
  assert main(["tune", "--task", "linear_regression", "--algorithm", "fedavg", "--rounds",
               "3", "--tuning-seeds", "0", "--seeds", "0,1", "--out",
               str(tmp_path / "x")]) == 2
  assert "both tuning and report seeds" in capsys.readouterr().err
  assert not (tmp_path / "x").exists()
