"""Issue 24: the tasks femnist / shakespeare / cifar100_fed on fixture files in the exact
published layouts (written here, never downloaded), the synthetic stand-ins' shapes, the
held-out writers, per-client local epochs' padding accounting, and the FedGMA FEMNIST
command end to end."""
import json
import pathlib

import chex
import jax
import numpy as np
import pytest

from fedjax_inv import cli
from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.core.data import from_client_arrays, padding_overhead
from fedjax_inv.data import federated_files as ff
from fedjax_inv.data import federated_synthetic as syn
from fedjax_inv.tasks import make_task


def _small_femnist(num=6, cap=40, seed=0):
  """Writers of 3..40 examples (a FEMNIST-like spread, small enough for CI)."""
  d = syn.femnist(num, seed)
  rng = np.random.default_rng(seed)
  out = {}
  for split in ("train", "test"):
    out[split] = {}
    for c, (x, y) in d[split].items():
      k = min(len(y), int(rng.integers(3, cap + 1)) if split == "train" else 5)
      out[split][c] = (x[:k], y[:k])
  return out


@pytest.fixture(scope="module")
def femnist_files(tmp_path_factory):
  """The same writers written in TFF's HDF5 layout and in LEAF's JSON layout."""
  d = _small_femnist()
  h5 = tmp_path_factory.mktemp("tff")
  ff.write_tff_emnist(h5 / "fed_emnist_train.h5", d["train"])
  ff.write_tff_emnist(h5 / "fed_emnist_test.h5", d["test"])
  leaf = tmp_path_factory.mktemp("leaf")
  for split in ("train", "test"):
    ff.write_leaf(leaf, "femnist", split, d[split], users_per_file=4)
  return d, h5, leaf


def test_femnist_reads_both_layouts_identically(femnist_files):
  d, h5, leaf = femnist_files
  a = make_task("femnist", data_dir=str(h5), train_eval_clients=None)
  b = make_task("femnist", data_dir=str(leaf), train_eval_clients=None)
  chex.assert_trees_all_equal(a.train.padded(), b.train.padded())
  chex.assert_trees_all_equal(a.eval_sets["test"].padded(), b.eval_sets["test"].padded())
  ids = sorted(d["train"])
  sizes = [len(d["train"][c][1]) for c in ids]
  np.testing.assert_array_equal(np.asarray(a.train.n), sizes)
  # the pixels are the file's, in sorted writer order, as [28, 28, 1]: packed once as
  # 8-bit values (EMNIST's pixels are multiples of 1/255), decoded exactly
  assert a.train.x.dtype == np.uint8 and a.train.total == sum(sizes)
  assert a.train.ids == tuple(ids)
  np.testing.assert_array_equal(a.train.client(2)[0][..., 0], d["train"][ids[2]][0])
  np.testing.assert_array_equal(np.asarray(a.train.padded().x[2, :sizes[2], :, :, 0]),
                                d["train"][ids[2]][0])
  assert a.train.feature_shape == (28, 28, 1) and "ood" not in a.eval_sets
  assert a.defaults["local_epochs"] == 1 and a.defaults["clients_per_round"] == 10


def test_heldout_writers_form_the_ood_set(femnist_files):
  d, h5, _ = femnist_files
  t = make_task("femnist", data_dir=str(h5), heldout_writers=0.34, seed=3,
                train_eval_clients=None)
  held = t.info["heldout_writers"]
  assert t.info["num_heldout_writers"] == len(held) == 2
  ids = sorted(d["train"])
  kept = [c for c in ids if c not in held]
  assert t.train.num_clients == len(kept) and t.eval_sets["ood"].num_clients == 2
  # a held-out writer's training and test examples together, never trained on
  for j, c in enumerate(sorted(held)):
    assert int(t.eval_sets["ood"].n[j]) == len(d["train"][c][1]) + len(d["test"][c][1])
  np.testing.assert_array_equal(np.asarray(t.train.n), [len(d["train"][c][1]) for c in kept])


def test_leaf_user_split_gives_ood(tmp_path):
  """LEAF's ``-t user`` split: test/ holds other writers -> they are the 'ood' set."""
  d = _small_femnist(5)
  ids = sorted(d["train"])
  ff.write_leaf(tmp_path, "femnist", "train", {c: d["train"][c] for c in ids[:3]})
  ff.write_leaf(tmp_path, "femnist", "test", {c: d["test"][c] for c in ids[3:]})
  t = make_task("femnist", data_dir=str(tmp_path))
  assert t.train.num_clients == 3 and t.eval_sets["ood"].num_clients == 2


@pytest.mark.parametrize("layout", ["hdf5", "leaf"])
def test_cli_runs_femnist_on_fixture_files(femnist_files, layout, tmp_path):
  _, h5, leaf = femnist_files
  out = tmp_path / "run"
  rc = cli.main(["run", "--task", "femnist", "--data-dir", str(h5 if layout == "hdf5" else leaf),
                 "--rounds", "2", "--eval-every", "1", "--clients-per-round", "3",
                 "--task-arg", "heldout_writers=0.2", "--out", str(out), "--no-progress"])
  assert rc == 0
  s = json.loads((out / "summary.json").read_text())
  run = s["runs"][0] if "runs" in s else s
  text = json.dumps(s)
  assert "ood_accuracy" in text and "padding" in text
  assert '"local_epochs": 1' in text, run.keys()


def _shakespeare_fixture():
  d = syn.shakespeare(4, seed=0, max_chars=300)
  return {s: {c: v[:3] for c, v in d[s].items()} for s in ("train", "test")}


def test_shakespeare_tff_and_leaf_layouts(tmp_path):
  d = _shakespeare_fixture()
  ff.write_tff_shakespeare(tmp_path / "shakespeare_train.h5", d["train"])
  ff.write_tff_shakespeare(tmp_path / "shakespeare_test.h5", d["test"])
  t = make_task("shakespeare", data_dir=str(tmp_path), max_examples=None)
  c0 = sorted(d["train"])[0]
  x, y = ff.next_char_examples(d["train"][c0])
  assert int(t.train.n[0]) == len(y)
  np.testing.assert_array_equal(np.asarray(t.train.x[0, :len(y)]), x.astype(np.float32))
  np.testing.assert_array_equal(np.asarray(t.train.y[0, :len(y)]), y)
  assert t.train.feature_shape == (80,)
  # LEAF's layout: the same examples as (80-char string, next char) pairs
  leaf = tmp_path / "leaf"
  for split in ("train", "test"):
    conv = {}
    for c, snippets in d[split].items():
      xs, ys = [], []
      for s in snippets:
        for i in range(1, len(s)):
          xs.append(s[max(0, i - 80):i])
          ys.append(s[i])
      conv[c] = (xs, ys)
    ff.write_leaf(leaf, "shakespeare", split, conv)
  u = make_task("shakespeare", data_dir=str(leaf), max_examples=None)
  chex.assert_trees_all_equal(u.train, t.train)


def test_shakespeare_cli_run_caps_examples(tmp_path):
  d = _shakespeare_fixture()
  ff.write_tff_shakespeare(tmp_path / "shakespeare_train.h5", d["train"])
  ff.write_tff_shakespeare(tmp_path / "shakespeare_test.h5", d["test"])
  out = tmp_path / "run"
  rc = cli.main(["run", "--task", "shakespeare", "--data-dir", str(tmp_path), "--rounds", "1",
                 "--task-arg", "max_examples=40", "--batch-size", "8", "--out", str(out),
                 "--no-progress"])
  assert rc == 0
  s = json.loads((out / "summary.json").read_text())
  assert "test_accuracy" in json.dumps(s)


@pytest.mark.slow
def test_cifar100_fed_runs_on_tff_fixture(tmp_path):
  d = syn.cifar100(3, 2, per_client=20, seed=0)
  ff.write_tff_cifar100(tmp_path / "fed_cifar100_train.h5", d["train"])
  ff.write_tff_cifar100(tmp_path / "fed_cifar100_test.h5", d["test"])
  t = make_task("cifar100_fed", data_dir=str(tmp_path))
  assert t.train.feature_shape == (24, 24, 3) and t.eval_sets["test"].num_clients == 2
  x = np.asarray(t.train.x[0, :20])  # per-image standardization
  np.testing.assert_allclose(x.mean(axis=(1, 2, 3)), 0.0, atol=1e-4)
  out = tmp_path / "run"
  assert cli.main(["run", "--task", "cifar100_fed", "--data-dir", str(tmp_path), "--rounds",
                   "1", "--clients-per-round", "2", "--out", str(out), "--no-progress"]) == 0


def test_synthetic_femnist_sizes_follow_the_published_shape():
  s = syn.femnist_sizes()
  assert len(s) == 3400 and s.min() >= 2 and s.max() > 400
  assert abs(int(s.sum()) - 671_585) < 3400  # TFF's training total, up to rounding
  cv = s.std() / s.mean()
  assert 0.35 < cv < 0.43  # LEAF Table 1: 88.94 / 226.83 = 0.392
  assert (s < 10).sum() >= 1  # writers of under 10 examples exist


def test_synthetic_pools_have_the_real_client_counts():
  assert len(syn.shakespeare_sizes()) == 715
  d = syn.cifar100(4, 2, seed=0)
  assert [x.shape for x, _, _ in d["train"].values()] == [(100, 32, 32, 3)] * 4
  t = make_task("femnist", source="synthetic", num_clients=12, train_eval_clients=5)
  assert t.train.num_clients == 12 and len(t.train_eval) == 5
  assert t.train_for_eval().num_clients == 5


def test_padding_overhead_by_hand():
  """Sizes 10, 30, 45 padded to 45; B = 20, one epoch -> steps 1, 2, 3."""
  xs = [np.zeros((n, 2), np.float32) for n in (10, 30, 45)]
  data = from_client_arrays(xs, [np.zeros(n, np.int32) for n in (10, 30, 45)])
  ep = make_algorithm("fedavg", local_epochs=1, batch_size=20)
  real = 85
  got = padding_overhead(data, ep, 3, "scan", samples=3)
  assert got["pool"] == pytest.approx(3 * 45 / real)
  assert got["compute"] == pytest.approx((1 + 2 + 3) * 20 / real)
  got = padding_overhead(data, ep, 3, "vmap", samples=3)
  assert got["compute"] == pytest.approx(3 * 3 * 20 / real)
  fixed = make_algorithm("fedavg", local_steps=4, batch_size=20)
  assert padding_overhead(data, fixed, 3, "vmap", samples=3)["compute"] == 1.0


def test_dropout_model_gets_the_step_key():
  """The FEMNIST CNN's dropout is on in training (a different key, a different loss)
  and off in evaluation (model.apply without a key)."""
  from fedjax_inv.core.client import make_objective
  from fedjax_inv.core.algorithm import Batch, Context
  from fedjax_inv.models.federated import femnist_cnn
  model = femnist_cnn(62)
  params = model.init(0)
  alg = make_algorithm("fedavg", local_epochs=1, batch_size=4)
  obj = make_objective(model, "multiclass", alg)
  rng = np.random.default_rng(0)
  b = Batch(x=rng.random((4, 28, 28, 1), np.float32), y=np.arange(4, dtype=np.int32),
            w=np.ones(4, np.float32))
  ctx = Context(params=params, round=0, extras={}, client={}, num_clients=1.0, cohort=1.0)
  l1, l2 = obj(params, b, ctx, jax.random.key(1)), obj(params, b, ctx, jax.random.key(2))
  assert float(l1) != float(l2)
  assert float(obj(params, b, ctx, jax.random.key(1))) == float(l1)
  np.testing.assert_array_equal(model.apply(params, b.x), model.apply(params, b.x))


@pytest.mark.slow
def test_fedgma_femnist_command_end_to_end(femnist_files):
  """experiments/fedgma/femnist.yaml on fixture files: its runs (AVG and GMA of the five
  bases) are the ten expected, each one's configuration is checked, and three of them
  (FedAvg, and GMA over the adaptive FedAdam server and over SCAFFOLD's control variates:
  the mask after the most involved server sides) go through the spec's executor, 2
  rounds of 2 writers, and report both metrics (FedGMA's last-k mean of the training
  writers' test accuracy and of the held-out writers' accuracy). Every base under the
  mask is trained in tests/test_fedgma.py."""
  from fedjax_inv.runner import spec
  _, h5, _ = femnist_files
  root = pathlib.Path(__file__).resolve().parents[1]
  sp = spec.load_spec(root / "experiments" / "fedgma" / "femnist.yaml")
  bases = ("fedavg", "fedprox", "scaffold", "fedadam", "fedyogi")
  assert sorted(r.name for r in sp.runs) == sorted(bases + tuple(f"fedgma_{b}" for b in bases))
  spec.check_runs(sp.runs)
  for run in (r for r in sp.runs if r.name in ("fedavg", "fedgma_fedadam", "fedgma_scaffold")):
    cfg = {**run.cfg, "rounds": 2, "clients_per_round": 2, "data_dir": str(h5)}
    res, pl = spec.run_one(cfg, 0)
    rec = spec.record(spec.run_key(sp, run, 0), res, pl)
    assert rec["status"] == "ok", run.name
    if run.name.startswith("fedgma_"):  # GMA over the base: its server step masked
      assert rec["registry_name"] == "fedgma" and rec["hparams"]["base"] == run.name[7:]
    else:
      assert rec["registry_name"] == run.name
    assert rec["data"]["eval_sets"]["ood"]["clients"] == 1  # 10 % of 6 writers, at least 1
    assert rec["last_k_mean"]["k"] == 2
    for m in ("test_accuracy", "ood_accuracy"):
      assert 0.0 <= rec["last_k_mean"][m] <= 1.0, (run.name, m)


def test_ragged_evaluation_equals_the_padded_one(monkeypatch):
  """Sets padded more than 1.5x are evaluated on their packed real rows: the same
  per-client sums as the per-client padded blocks (and as a numpy loop)."""
  from fedjax_inv import eval as eval_lib
  from fedjax_inv import models
  rng = np.random.default_rng(0)
  sizes = (3, 40, 7, 1, 25)
  data = from_client_arrays([rng.normal(size=(n, 6)).astype(np.float32) for n in sizes],
                            [rng.integers(0, 4, n).astype(np.int32) for n in sizes])
  assert eval_lib._padding(data) > eval_lib.RAGGED_ABOVE
  model = models.mlp(6, (8,), 4)
  params = model.init(1)
  ragged = eval_lib.build_evaluator(model, "multiclass", eval_batch=16)(params, data)
  monkeypatch.setattr(eval_lib, "RAGGED_ABOVE", float("inf"))
  padded = eval_lib.build_evaluator(model, "multiclass", eval_batch=16)(params, data)
  np.testing.assert_allclose(ragged["loss_sum"], padded["loss_sum"], rtol=1e-5)
  np.testing.assert_array_equal(ragged["correct"], padded["correct"])
  logits = [np.asarray(model.apply(params, data.x[i, :n])) for i, n in enumerate(sizes)]
  want = [int((l.argmax(1) == np.asarray(data.y[i, :n])).sum())
          for i, (l, n) in enumerate(zip(logits, sizes))]
  np.testing.assert_array_equal(ragged["correct"], want)
