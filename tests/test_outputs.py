"""Issue 11: outputs never destroy anything; streamed results; divergence in a multi-run
experiment; provenance and `--config summary.json`; scoped --hp."""
import json

import pytest

from fedjax_inv import cli
from fedjax_inv.runner import experiment, outputs


def test_check_out_dir_refuses_files_and_foreign_folders(tmp_path):
  f = tmp_path / "notes.txt"
  f.write_text("x")
  with pytest.raises(ValueError, match="existing file"):
    outputs.check_out_dir(f)
  mine = tmp_path / "thesis"
  mine.mkdir()
  (mine / "thesis.tex").write_text("keep")
  for overwrite in (False, True):
    with pytest.raises(ValueError, match="did not create"):
      outputs.check_out_dir(mine, overwrite=overwrite)
  with pytest.raises(ValueError, match="did not create"):
    outputs.remove_run_dir(mine)
  assert (mine / "thesis.tex").read_text() == "keep"
  (tmp_path / "empty").mkdir()
  outputs.check_out_dir(tmp_path / "empty")  # empty: fine
  outputs.check_out_dir(tmp_path / "new")  # absent: fine, and not created
  assert not (tmp_path / "new").exists()


def test_atomic_dir_never_replaces_a_folder_it_did_not_create(tmp_path):
  # Before issue 11 atomic_dir moved any existing folder aside and deleted it.
  user = tmp_path / "out"
  user.mkdir()
  (user / "data.csv").write_text("precious")
  with pytest.raises(ValueError, match="did not create"):
    with outputs.atomic_dir(user, overwrite=True) as tmp:
      (tmp / "a.txt").write_text("new")
  assert (user / "data.csv").read_text() == "precious"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temp folder left
  fresh = tmp_path / "fresh"
  with outputs.atomic_dir(fresh) as tmp:
    (tmp / "a.txt").write_text("1")
  assert (fresh / outputs.MARKER).exists()
  with pytest.raises(ValueError, match="--overwrite"):
    with outputs.atomic_dir(fresh, overwrite=False) as tmp:
      pass
  with outputs.atomic_dir(fresh, overwrite=True) as tmp:  # ours: may be replaced
    (tmp / "a.txt").write_text("2")
  assert (fresh / "a.txt").read_text() == "2"


def test_default_run_folders_are_unique_within_a_second():
  names = {experiment.default_out("t", ["fedavg"]) for _ in range(50)}
  assert len(names) == 50


def test_scoped_hyperparameters():
  per = experiment.split_overrides({"client_lr": 0.1, "fedprox.mu": 0.5,
                                    "fedprox.client_lr": 0.2}, ["fedavg", "fedprox"])
  assert per == {"fedavg": {"client_lr": 0.1}, "fedprox": {"client_lr": 0.2, "mu": 0.5}}
  with pytest.raises(ValueError, match="'fedsr' is not an algorithm of this run"):
    experiment.split_overrides({"fedsr.mu": 1.0}, ["fedavg"])


def test_run_help_shows_every_default(capsys):
  with pytest.raises(SystemExit) as exit_:
    cli.main(["run", "--help"])
  assert exit_.value.code == 0  # --help exits cleanly
  out = " ".join(capsys.readouterr().out.split())
  for key, (_, help_) in cli.RUN_KEYS.items():
    assert "default" in help_, key
  for flag in ("--overwrite", "--resume", "--select", "--last-k", "--reporting",
               "--validation"):
    assert flag in out


def test_diverged_run_is_recorded_and_the_others_go_on(tmp_path, capsys):
  # --lr 1e6 on one algorithm used to throw away the whole experiment with a traceback.
  out = tmp_path / "div"
  rc = cli.main(["run", "--task", "linear_regression", "--algorithm", "fedavg,fedprox",
                 "--hp", "fedprox.client_lr=1e6", "--hp", "fedprox.mu=0.3", "--rounds",
                 "4", "--eval-every", "2", "--out", str(out), "--no-progress"])
  err = capsys.readouterr().err
  assert rc == 3 and "fedprox seed 0" in err and "Traceback" not in err
  s = json.loads((out / "summary.json").read_text())
  assert s["status"] == "diverged"
  by = {r["algorithm"]: r for r in s["runs"]}
  assert by["fedavg"]["status"] == "ok" and by["fedprox"]["status"] == "diverged"
  assert by["fedprox"]["diverged_round"] >= 1 and by["fedprox"]["hparams"]["mu"] == 0.3
  assert by["fedprox"]["hparams"]["client_lr"] == 1e6
  assert by["fedavg"]["hparams"]["client_lr"] != 1e6  # the scoped value stayed scoped
  # the diverged algorithm stays in the table, counted: 0 of its 1 seed finite
  table = {r["algorithm"]: r for r in s["table"]}
  assert table["fedprox"]["seeds"] == 1 and table["fedprox"]["train_mse_finite"] == 0
  assert "train_mse_mean" not in table["fedprox"] and table["fedavg"]["train_mse_finite"] == 1
  md = (out / "results.md").read_text()
  assert "fedprox seed 0: diverged at round" in md and "diverged (0/1 finite)" in md
  rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
  assert [(r["algorithm"], r["round"]) for r in rows if r["algorithm"] == "fedavg"] == [
      ("fedavg", 2), ("fedavg", 4)]
  per = json.loads((out / "fedprox" / "seed0" / "summary.json").read_text())
  assert per["status"] == "diverged"
  # provenance and the resolved config
  prov = s["provenance"]
  for k in ("fedjax_inv", "jax", "flax", "optax"):
    assert prov["versions"][k]
  assert prov["device"]["backend"] and "git_commit" in prov
  assert s["config"]["rounds"] == 4 and s["config"]["hp"] == [
      "fedprox.client_lr=1e6", "fedprox.mu=0.3"]


def test_summary_json_is_a_config_that_reproduces_the_run(tmp_path):
  a, b = tmp_path / "a", tmp_path / "b"
  assert cli.main(["run", "--task", "linear_regression", "--rounds", "3", "--lr", "0.005",
                   "--seed", "5", "--out", str(a), "--no-progress"]) == 0
  assert cli.main(["run", "--config", str(a / "summary.json"), "--out", str(b),
                   "--no-progress"]) == 0
  sa = json.loads((a / "summary.json").read_text())
  sb = json.loads((b / "summary.json").read_text())
  assert sb["seed"] == 5 and sb["hparams"]["client_lr"] == 0.005
  assert sa["final"] == sb["final"]  # bit-identical on the same machine
  assert sa["config"] == sb["config"]


def test_api_config_hp_and_overrides_are_used_and_recorded(tmp_path):
  # cfg['hp'] / cfg['lr'] were ignored by run_experiment unless passed as overrides.
  import io
  out = tmp_path / "api"
  s = experiment.run_experiment(
      dict(task="linear_regression", algorithm="fedavg", rounds=2, lr=0.004,
           hp=["local_steps=2"], out=str(out)), progress=False, overrides={"weight_decay": 0.001},
      stream=io.StringIO())
  assert s["hparams"]["client_lr"] == 0.004 and s["hparams"]["local_steps"] == 2
  assert s["hparams"]["weight_decay"] == 0.001
  assert s["config"]["hp"] == ["local_steps=2", "weight_decay=0.001"]


def _history(rounds, acc=True):
  key = "{}_accuracy" if acc else "{}_mse"
  return [{"round": r, key.format("train"): 0.6, key.format("ood"): 0.4} for r in rounds]


def test_curves_with_one_evaluation_show_markers_and_chance_is_one_over_classes(tmp_path):
  import matplotlib.pyplot as plt
  runs = [{"algorithm": "fedavg", "history": _history([5])}]
  fig = outputs.curves_figure(runs, sets=("train", "ood"), num_classes=10)
  try:
    lines = fig.axes[0].get_lines()
    data = [l for l in lines if not l.get_label().startswith("_")]
    assert len(data) == 2
    for l in data:  # one evaluated round: a visible dot, not an empty line
      assert l.get_marker() == "o" and l.get_markersize() > 0
      assert list(l.get_xdata()) == [5] and l.get_visible()
    chance = [l for l in lines if l.get_label() == "_chance"]
    assert len(chance) == 1 and list(chance[0].get_ydata()) == [0.1, 0.1]
  finally:
    plt.close(fig)
  fig = outputs.curves_figure(runs, num_classes=2)  # binary: 0.5
  assert [list(l.get_ydata()) for l in fig.axes[0].get_lines()
          if l.get_label() == "_chance"] == [[0.5, 0.5]]
  plt.close(fig)
  long = [{"algorithm": "fedavg", "history": _history(range(1, 31))}]
  fig = outputs.curves_figure(long, num_classes=None)  # many points: lines only
  lines = fig.axes[0].get_lines()
  assert all(l.get_marker() in (None, "None", "") for l in lines)
  assert not [l for l in lines if l.get_label() == "_chance"]  # unknown K: no line
  plt.close(fig)
  fig = outputs.curves_figure([{"algorithm": "a", "history": _history([1], acc=False)}],
                              num_classes=None)  # regression: MSE, no chance line
  assert fig.axes[0].get_ylabel() == "mse"
  assert not [l for l in fig.axes[0].get_lines() if l.get_label() == "_chance"]
  plt.close(fig)
  outputs.plot_curves(tmp_path / "c.png", runs, num_classes=10)
  assert (tmp_path / "c.png").stat().st_size > 0


def test_num_classes_of_a_task(tiny_binary):
  import numpy as np
  from fedjax_inv import models
  from fedjax_inv.tasks import Task
  data, model = tiny_binary
  assert experiment.num_classes(Task("b", "binary", data, {}, model, {})) == 2
  multi = Task("m", "multiclass", data, {}, models.mlp(6, (8,), 10), {})
  assert int(np.max(data.y)) == 1
  assert experiment.num_classes(multi) == 10  # the model's logits, not the labels seen
  reg = Task("r", "regression", data.replace(y=np.asarray(data.y, np.float32)), {},
             models.mlp(6, (8,), 1), {})
  assert experiment.num_classes(reg) is None
