"""Issue 11: a corpus of bad inputs. Each must end with exit code 2 and a one-line
``fedjax-inv: error: ...`` message naming the field, with no traceback, before anything
is compiled (``build_round`` is made to fail if reached), leaving no files behind."""
import json
import os

import pytest

from fedjax_inv import cli
from fedjax_inv.runner import outputs

T = ["run", "--task", "linear_regression", "--rounds", "2", "--no-progress"]
P = ["run", "--task", "linear_regression", "--algorithm", "fedprox", "--rounds", "2",
     "--no-progress"]

CASES = [  # (argv, text the one-line message must contain)
    (T + ["--rounds", "0"], "--rounds 0"),
    (T + ["--rounds", "-1"], "--rounds -1"),
    (T + ["--rounds", "abc"], "--rounds 'abc'"),
    (T + ["--rounds", "1.5"], "--rounds '1.5'"),
    (T + ["--clients-per-round", "0"], "--clients-per-round 0"),
    (T + ["--clients-per-round", "99"], "--clients-per-round 99"),
    (T + ["--seeds", "0"], "--seeds 0"),
    (T + ["--eval-every", "0"], "--eval-every 0"),
    (T + ["--chunk-size", "0"], "--chunk-size 0"),
    (T + ["--local-steps", "0"], "--local-steps 0"),
    (T + ["--seed", "-1"], "--seed -1"),
    (T + ["--last-k", "-1"], "--last-k -1"),
    (T + ["--checkpoint-every", "0"], "--checkpoint-every 0"),
    (T + ["--rounds-per-call", "0"], "--rounds-per-call 0"),
    (T + ["--replicas", "many"], "--replicas many: unknown replica mode"),
    (T + ["--execution", "fastest"], "--execution fastest: unknown execution strategy"),
    (T + ["--holdout", "all"], "'linear_regression' is not a domain task"),
    (["run", "--task", "rotated_mnist", "--holdout", "0,90", "--rounds", "1"],
     "holdout index 90 out of range"),
    (P + ["--sweep", "mu"], "--sweep 'mu': expected NAME=V1,V2"),
    (P + ["--sweep", "mu=0.1,0.1"], "a value is repeated"),
    (P + ["--sweep", "mu=0.1,-1"], "--sweep mu=-1 (fedprox): must be >= 0"),
    (P + ["--sweep", "mu=0.1,0.2", "--hp", "mu=0.3"], "given both in --sweep"),
    (P + ["--sweep", "fedsr.alpha_l2r=0,1"], "'fedsr' is not an algorithm of this run"),
    (T + ["--sweep", "mu=0,1"], "got unknown hyperparameters ['mu']"),
    (["run", "--task", "rotated_mnist", "--holdout", "0,0", "--rounds", "1"],
     "name a domain twice"),
    (T + ["--lr", "nan"], "--lr nan"),
    (T + ["--lr", "inf"], "--lr inf"),
    (T + ["--lr", "-0.1"], "--lr -0.1"),
    (T + ["--lr", "0"], "--lr 0.0"),
    (T + ["--lr", "abc"], "--lr 'abc'"),
    (T + ["--server-lr", "nan"], "--server-lr nan"),
    (T + ["--tau", "2"], "--tau 2.0"),
    (T + ["--batch-size", "0"], "--batch-size '0'"),
    (T + ["--batch-size", "lots"], "--batch-size 'lots'"),
    (T + ["--batch-size", "-3"], "--batch-size '-3'"),
    (T + ["--execution", "turbo"], "--execution turbo: unknown execution strategy"),
    (T + ["--source", "web"], "--source web: unknown data source"),
    (T + ["--reporting", "maybe"], "--reporting maybe: unknown reporting mode"),
    (T + ["--validation", "median"], "--validation median: unknown validation rule"),
    (T + ["--client-optimizer", "rmsprop"], "--client-optimizer 'rmsprop'"),
    (T + ["--select", "min:nothing"], "min:nothing"),
    (["run", "--algorithm", ""], "--algorithm ''"),
    (["run", "--algorithm", "fedavg,,fedprox"], "empty entries"),
    (["run", "--algorithm", "fedavg,fedavg"], "listed twice"),
    (["run", "--algorithm", "fedfoo"], "--algorithm fedfoo: unknown algorithm"),
    (["run", "--task", "imagenet"], "--task imagenet: unknown task"),
    (P + ["--hp", "mu=abc"], "--hp mu='abc' (fedprox): must be a finite number"),
    (P + ["--hp", "mu"], "--hp 'mu'"),
    (P + ["--hp", "=3"], "--hp '=3'"),
    (P + ["--hp", "fedsr.mu=0.1"], "'fedsr' is not an algorithm of this run"),
    (P + ["--hp", "mu=NaN"], "--hp mu=nan (fedprox): must be a finite number"),
    (P + ["--hp", "mu=-1"], "--hp mu=-1 (fedprox): must be >= 0"),
    (P + ["--hp", "local_steps=2.5"], "must be an integer"),
    (P + ["--hp", "client_lr=0"], "must be > 0"),
    (P + ["--hp", "muu=1"], "--hp muu: unknown hyperparameter; did you mean mu?"),
    (["run", "--task", "linear_regression", "--algorithm", "fedavg,fedprox", "--hp",
      "mu=0.1"], "scope a value to one"),
    (T + ["--hp", "fedavg.client_lr=true"],
     "--hp client_lr=True (fedavg): must be a finite number"),
    (["run", "--source", "raw", "--data-dir", "/nonexistent/dir"], "/nonexistent/dir"),
    (T + ["--resume", "nowhere"], "--resume 'nowhere'"),
    (["run", "--resume", "nowhere", "--rounds", "3"], "drop the other settings"),
    (T + ["--out", "a_file.txt"], "is an existing file"),
    (T + ["--out", "thesis"], "did not create"),
    (T + ["--out", "thesis", "--overwrite"], "did not create"),
    (T + ["--out", "old_run"], "--overwrite"),
    (T + ["--config", "missing.yaml"], "no such file"),
    (["run", "--config", "lr_abc.yaml"], "--lr 'abc'"),
    (["run", "--config", "rounds0.yaml"], "--rounds 0"),
    (["run", "--config", "rounds_true.yaml"], "--rounds True"),
    (["run", "--config", "unknown.yaml"], "unknown keys ['learning_rate']"),
    (["run", "--config", "hp_abc.yaml"], "--hp mu='abc'"),
    (["run", "--unknown-flag"], "unrecognized arguments: --unknown-flag"),
    # issue 24: per-client local epochs, task arguments and damaged published files
    (T + ["--local-epochs", "0"], "--local-epochs 0"),
    (T + ["--local-epochs", "1", "--batch-size", "full"], "local_epochs needs a batch_size"),
    (T + ["--task-arg", "num_clients"], "--task-arg 'num_clients': use NAME=VALUE"),
    (T + ["--task-arg", "seed=3"], "set it with --seed"),
    (["run", "--task", "femnist", "--task-arg", "writers=3"],
     "task 'femnist' takes no argument(s) ['writers']"),
    (["run", "--task", "femnist", "--task-arg", "heldout_writers=1.5", "--source",
      "synthetic"], "heldout_writers=1.5"),
    (["run", "--task", "femnist", "--data-dir", "empty_dir"], "empty_dir"),
    (["run", "--task", "femnist", "--data-dir", "trunc_h5"], "fed_emnist_train.h5"),
    (["run", "--task", "femnist", "--data-dir", "nogroup_h5"], "examples"),
    (["run", "--task", "femnist", "--data-dir", "shape_h5"], "pixels"),
    (["run", "--task", "femnist", "--data-dir", "leaf_count"], "num_samples"),
    (["run", "--task", "femnist", "--data-dir", "leaf_trunc"], ".json"),
    # issue 25: sample-level DP-SGD
    (T + ["--dp-sgd-clip", "1.0"], "DP-SGD needs both --dp-sgd-clip"),
    (T + ["--dp-sgd-clip", "0", "--dp-sgd-noise-multiplier", "1"], "--dp-sgd-clip 0.0"),
    (T + ["--dp-sgd-clip", "1", "--dp-sgd-noise-multiplier", "-1"],
     "--dp-sgd-noise-multiplier -1.0"),
    (["run", "--task", "mnist_noniid", "--dp-sgd-clip", "1", "--dp-sgd-noise-multiplier",
      "1"], "drawn with replacement"),
    (["run", "--task", "colored_mnist", "--algorithm", "inv_fedavg", "--dp-sgd-clip", "1",
      "--dp-sgd-noise-multiplier", "1"], "not a sum over examples"),
    # issue 26: attacks, participation, robust aggregators
    (T + ["--task-arg", "val_fraction=0.9"], "val_fraction=0.9"),
    (["run", "--task", "mnist_noniid", "--algorithm", "ditto", "--hp",
      "ditto.ditto_lambda=-1"], "ditto_lambda=-1"),
    (["run", "--task", "mnist_noniid", "--algorithm", "ditto", "--local-epochs", "1"],
     "local_epochs is not supported"),
    (T + ["--attack", "backdoor"], "--attack backdoor: unknown attack"),
    (T + ["--attack", "sign_flip", "--attack-fraction", "1.0"], "--attack-fraction 1.0"),
    (T + ["--attack-fraction", "0.2"], "need --attack NAME"),
    (T + ["--attack", "label_flip"], "needs a classification task"),
    (T + ["--dropout", "1"], "--dropout 1.0"),
    (T + ["--stragglers", "-0.5"], "--stragglers -0.5"),
    (T + ["--availability", "0"], "--availability 0.0"),
    (T + ["--straggler-mode", "slow"], "--straggler-mode slow: unknown straggler mode"),
    (T + ["--bucketing", "2"], "bucketing wraps a robust"),
    (T + ["--aggregator", "median:x=1"], "median takes no argument"),
    (T + ["--aggregator", "krum:f=9"], "Krum tolerating f=9"),
    (["run", "--rounds"], "expected one argument"),
]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "a_file.txt").write_text("keep me\n")
  (tmp_path / "thesis").mkdir()
  (tmp_path / "thesis" / "thesis.tex").write_text("\\chapter{keep me}\n")
  (tmp_path / "old_run").mkdir()
  (tmp_path / "old_run" / outputs.MARKER).write_text("x\n")
  (tmp_path / "old_run" / "summary.json").write_text("{}\n")
  cfgs = {"lr_abc.yaml": 'task: linear_regression\nlr: "abc"\n',
          "rounds0.yaml": "task: linear_regression\nrounds: 0\n",
          "rounds_true.yaml": "task: linear_regression\nrounds: true\n",
          "unknown.yaml": "rounds: 1\nlearning_rate: 0.1\n",
          "hp_abc.yaml": 'task: linear_regression\nalgorithm: fedprox\nhparams:\n  mu: "abc"\n'}
  for name, text in cfgs.items():
    (tmp_path / name).write_text(text)

  _damaged_federated_files(tmp_path)

  def fail_compile(*a, **k):
    raise AssertionError("bad input reached build_round (compile)")

  from fedjax_inv.runner import simulation
  monkeypatch.setattr(simulation, "build_round", fail_compile)
  return tmp_path


def _damaged_federated_files(root):
  """Published-layout FEMNIST folders, each damaged one way (issue 24)."""
  import h5py
  import numpy as np
  from fedjax_inv.data import federated_files as ff
  good = {"w0": (np.zeros((3, 28, 28), np.float32), np.arange(3))}
  (root / "empty_dir").mkdir()
  for name in ("trunc_h5", "nogroup_h5", "shape_h5"):
    (root / name).mkdir()
    ff.write_tff_emnist(root / name / "fed_emnist_test.h5", good)
  ff.write_tff_emnist(root / "trunc_h5" / "fed_emnist_train.h5", good)
  blob = (root / "trunc_h5" / "fed_emnist_train.h5").read_bytes()
  (root / "trunc_h5" / "fed_emnist_train.h5").write_bytes(blob[: len(blob) // 3])
  with h5py.File(root / "nogroup_h5" / "fed_emnist_train.h5", "w") as f:
    f.create_group("clients")
  with h5py.File(root / "shape_h5" / "fed_emnist_train.h5", "w") as f:
    g = f.create_group("examples").create_group("w0")
    g["pixels"] = np.zeros((3, 28, 27), np.float32)
    g["label"] = np.arange(3)
  for name in ("leaf_count", "leaf_trunc"):
    for split in ("train", "test"):
      ff.write_leaf(root / name, "femnist", split, good)
  bad = next((root / "leaf_count" / "train").glob("*.json"))
  doc = json.loads(bad.read_text())
  doc["num_samples"] = [5]
  bad.write_text(json.dumps(doc))
  bad = next((root / "leaf_trunc" / "train").glob("*.json"))
  bad.write_text(bad.read_text()[:50])


def _snapshot(root):
  out = {}
  for dirpath, dirs, files in os.walk(root):
    for f in files + dirs:
      p = os.path.join(dirpath, f)
      out[os.path.relpath(p, root)] = None if os.path.isdir(p) else open(p, "rb").read()
  return out


def test_corpus_is_large_enough():
  assert len(CASES) >= 40


@pytest.mark.parametrize("argv,msg", CASES, ids=[" ".join(c[0][1:])[:60] for c in CASES])
def test_bad_input_exit_2_one_line_no_files(argv, msg, workdir, capsys):
  before = _snapshot(workdir)
  try:
    rc = cli.main(argv)
  except SystemExit as e:  # argparse's own errors (unknown flag, missing value)
    rc = e.code
  err = capsys.readouterr().err
  assert rc == 2, err
  lines = err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("fedjax-inv: error: "), err
  assert "Traceback" not in err
  assert msg in lines[0], lines[0]
  assert _snapshot(workdir) == before  # nothing created, nothing changed or deleted
