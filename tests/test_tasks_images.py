"""Rotated / colored image tasks (fedjax_inv.data.rotated), offline on small data."""
import functools
import pickle

import numpy as np
import pytest
import scipy.ndimage

from fedjax_inv import tasks
from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.runner.simulation import run
from fedjax_inv.data import rotated
from fedjax_inv.data import sources
from tests import reference as oracle


@pytest.fixture(autouse=True)
def _no_env_data_dir(monkeypatch):
  monkeypatch.delenv(sources.ENV_VAR, raising=False)


def client_arrays(data, i):
  n = int(data.n[i])
  return np.asarray(data.x[i, :n]), np.asarray(data.y[i, :n])


def disk(h, w, margin=1.5):
  rr, cc = np.meshgrid(np.arange(h) - (h - 1) / 2, np.arange(w) - (w - 1) / 2,
                       indexing="ij")
  return rr**2 + cc**2 <= ((min(h, w) - 1) / 2 - margin) ** 2


# ---------------------------------------------------------------- rotation ---


def test_rotation_by_quarter_turns_is_rot90_counter_clockwise():
  rng = np.random.default_rng(0)
  x = rng.integers(0, 256, (4, 9, 9), dtype=np.uint8)
  got = rotated.rotate_images(x, [0.0, 90.0, 180.0, -90.0])
  want = np.stack([x[0], np.rot90(x[1], 1), np.rot90(x[2], 2), np.rot90(x[3], -1)])
  np.testing.assert_allclose(got, want, atol=1e-3)
  # A pixel right of centre moves to the top (counter-clockwise, row 0 on top).
  img = np.zeros((1, 5, 5), np.float32)
  img[0, 2, 4] = 1.0
  assert rotated.rotate_images(img, 90.0)[0, 0, 2] == pytest.approx(1.0, abs=1e-6)


def test_rotation_matches_scipy_bilinear_with_channels():
  rng = np.random.default_rng(1)
  x = rng.random((3, 12, 10, 3)).astype(np.float32)
  angles = np.array([33.0, -71.5, 200.0])
  got = rotated.rotate_images(x, angles, chunk_size=2)
  for i in range(3):
    want = scipy.ndimage.rotate(x[i], angles[i], axes=(1, 0), reshape=False, order=1,
                                mode="grid-constant", cval=0.0)
    np.testing.assert_allclose(got[i], want, atol=1e-4)


def test_rotate_then_rotate_back_is_identity_inside_the_disk():
  yy, xx = np.meshgrid(np.arange(28), np.arange(28), indexing="ij")
  smooth = np.exp(-((yy - 7.0) ** 2 + (xx - 20.0) ** 2) / 40.0)[None]   # [1, 28, 28]
  for a in (15.0, 45.0, 75.0):
    back = rotated.rotate_images(rotated.rotate_images(smooth, a), -a)
    m = disk(28, 28)
    np.testing.assert_allclose(back[0][m], smooth[0][m], atol=0.03)
    # ... while a single rotation really moves the image.
    assert np.abs(rotated.rotate_images(smooth, a)[0][m] - smooth[0][m]).max() > 0.2


def test_rotation_errors():
  with pytest.raises(ValueError, match="images"):
    rotated.rotate_images(np.zeros((4, 4)), 10.0)
  with pytest.raises(ValueError, match="angles"):
    rotated.rotate_images(np.zeros((2, 4, 4)), [1.0, 2.0, 3.0])
  with pytest.raises(ValueError, match="finite"):
    rotated.rotate_images(np.zeros((1, 4, 4)), np.nan)


# ---------------------------------------------------------- rotated_mnist ---


def best_back_angle(x_dom, x_ref, candidates):
  m = disk(28, 28)
  errs = [np.abs(rotated.rotate_images(x_dom[..., 0], -a)[:, m] - x_ref[..., 0][:, m]).mean()
          for a in candidates]
  return candidates[int(np.argmin(errs))]


def test_make_rotated_mnist_fedsr_same_images_rotated():
  d = rotated.make_rotated_mnist("fedsr", n_per_domain=60, seed=1)
  assert d["names"] == ["0", "15", "30", "45", "60", "75"]
  base = d["base_index"][0]
  assert all(np.array_equal(b, base) for b in d["base_index"])
  x0, y0 = d["domains"][0]
  assert x0.shape == (60, 28, 28, 1) and x0.dtype == np.float32
  assert 0.0 <= x0.min() and x0.max() <= 1.0
  np.testing.assert_array_equal(np.bincount(y0, minlength=10), 6)   # class-balanced
  raw = d["raw"]
  np.testing.assert_allclose(x0[..., 0], raw.x_train[base] / 255.0, atol=1e-6)
  for (x, y), a in zip(d["domains"], d["angles"]):
    np.testing.assert_array_equal(y, y0)
    assert best_back_angle(x, x0, d["angles"]) == a


def test_make_rotated_mnist_full_domains_are_disjoint():
  d = rotated.make_rotated_mnist("full", seed=0)
  total = len(d["raw"].y_train) + len(d["raw"].y_test)
  sizes = [len(b) for b in d["base_index"]]
  assert sum(sizes) == total and max(sizes) - min(sizes) <= 1
  assert len(np.unique(np.concatenate(d["base_index"]))) == total
  capped = rotated.make_rotated_mnist("full", n_per_domain=40, seed=0)
  assert [len(y) for _, y in capped["domains"]] == [40] * 6


def test_rotated_mnist_task_fedsr_split():
  task = tasks.make_task("rotated_mnist", n_per_domain=100, holdout="30", seed=2)
  assert task.kind == "multiclass"
  assert task.info["domains"] == ["0", "15", "30", "45", "60", "75"]
  assert task.info["holdout"] == "30"
  assert task.info["client_domains"] == ["0", "15", "45", "60", "75"]
  assert task.train.num_clients == 5 and task.train.feature_shape == (28, 28, 1)
  assert set(task.eval_sets) == {"val", "ood"}
  assert list(map(int, task.train.n)) == [90] * 5
  assert list(map(int, task.eval_sets["val"].n)) == [10] * 5
  assert list(map(int, task.eval_sets["ood"].n)) == [100]
  assert {"paper", "dataset_source", "data_note"} <= set(task.info)
  # Same holdout by index.
  same = tasks.make_task("rotated_mnist", n_per_domain=100, holdout=2, seed=2)
  np.testing.assert_array_equal(np.asarray(same.train.x), np.asarray(task.train.x))


def test_lodo_fedsr_validation_images_are_never_trained_on():
  d = rotated.make_rotated_mnist("fedsr", n_per_domain=80, seed=0)
  lodo = rotated.leave_one_domain_out(d["domains"], d["names"], 0, seed=0,
                                      shared_split=True)
  train_base = np.concatenate(lodo["client_index"])
  val_base = np.concatenate(lodo["val_index"])
  assert len(np.intersect1d(train_base, val_base)) == 0
  assert len(np.unique(val_base)) == 8


def test_lodo_full_val_ood_and_clients_do_not_overlap():
  d = rotated.make_rotated_mnist("full", n_per_domain=120, seed=0)
  lodo = rotated.leave_one_domain_out(d["domains"], d["names"], "75", seed=0,
                                      num_clients=13)
  names = d["names"]
  assert len(lodo["train"]) == 13
  # Map every example to its underlying image id: no image is in two places.
  ids = []
  for dom, idx in zip(lodo["client_domain"], lodo["client_index"]):
    ids.append(d["base_index"][names.index(dom)][idx])
  for dom, idx in zip(lodo["sources"], lodo["val_index"]):
    ids.append(d["base_index"][names.index(dom)][idx])
  ids.append(d["base_index"][names.index("75")])
  allids = np.concatenate(ids)
  assert len(np.unique(allids)) == len(allids) == 6 * 120
  # Clients of one domain hold only that domain's (rotated) images.
  for (x, _), dom, idx in zip(lodo["train"], lodo["client_domain"], lodo["client_index"]):
    np.testing.assert_array_equal(x, d["domains"][names.index(dom)][0][idx])


def test_rotated_mnist_many_clients_per_domain():
  task = tasks.make_task("rotated_mnist", size="full", n_per_domain=60, num_clients=8)
  assert task.train.num_clients == 8
  doms = task.info["client_domains"]
  assert sorted(set(doms)) == ["15", "30", "45", "60", "75"]
  task = tasks.make_task("rotated_mnist", n_per_domain=60, clients_per_domain=3)
  assert task.train.num_clients == 15
  assert task.info["client_domains"] == [d for d in ["15", "30", "45", "60", "75"]
                                         for _ in range(3)]
  assert int(task.train.n.sum()) == 5 * 54


@pytest.mark.parametrize("kw,match", [
    (dict(holdout=15), "holdout"), (dict(holdout="90"), "holdout"),
    (dict(holdout=True), "holdout"), (dict(size="big"), "size"),
    (dict(num_clients=8, clients_per_domain=2), "not both"),
    (dict(val_fraction=1.0), "val_fraction"), (dict(n_per_domain=10**6), "n_per_domain"),
    (dict(num_clients=3), "at least one client per domain"),
])
def test_rotated_mnist_errors(kw, match):
  kw = {"n_per_domain": 40, **kw}
  with pytest.raises(ValueError, match=match):
    tasks.make_task("rotated_mnist", **kw)


@pytest.mark.slow
def test_rotated_mnist_trains_end_to_end():
  task = tasks.make_task("rotated_mnist", n_per_domain=40, channels=(4, 8))
  alg = make_algorithm("fedavg", client_lr=0.05, local_steps=2, batch_size=16)
  res = run(task, alg, rounds=2, eval_every=1, progress=False)
  assert len(res.history) == 2
  # The reported metrics are those of the final model, recomputed here by the oracle.
  sets = {"train": task.train, **task.eval_sets}
  for s in ("train", "val", "ood"):
    model = alg.model_for(task.model)
    want = oracle.pooled_eval(lambda x: model.apply(res.params, x), task.kind, sets[s])
    np.testing.assert_allclose(res.final[f"{s}_loss"], want["loss"], rtol=1e-4)
    np.testing.assert_allclose(res.final[f"{s}_accuracy"], want["accuracy"], atol=1e-9)


# --------------------------------------------------------- rotated_cifar10 ---


def write_fake_cifar(root, n_per_batch=40, seed=0):
  rng = np.random.default_rng(seed)
  d = root / "cifar10" / "cifar-10-batches-py"
  d.mkdir(parents=True)
  for b in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
    data = rng.integers(0, 256, (n_per_batch, 3072), dtype=np.uint8)
    labels = rng.integers(0, 10, n_per_batch).tolist()
    with open(d / b, "wb") as f:
      pickle.dump({b"data": data, b"labels": labels}, f, protocol=2)


@pytest.fixture
def fake_cifar(tmp_path, monkeypatch):
  write_fake_cifar(tmp_path)
  # The fake batches are smaller than CIFAR-10; skip only the size verification.
  monkeypatch.setattr(sources, "load_dataset",
                      functools.partial(sources.load_dataset, verify=False))
  return tmp_path


def test_rotated_cifar10_needs_real_data(tmp_path):
  with pytest.raises(FileNotFoundError, match="cifar-10-batches-py"):
    tasks.make_task("rotated_cifar10", data_dir=tmp_path)


def test_make_rotated_cifar10_sub_environments(fake_cifar):
  d = rotated.make_rotated_cifar10(data_dir=fake_cifar, n_per_env=20, n_ood=30, seed=0)
  raw = d["raw"]
  assert [[e["angle"] for e in envs] for envs in d["sub_envs"]] == [
      [10, 25, 40], [60, 75, 90], [-10, -40, -90]]
  idx_all = np.concatenate([e["index"] for envs in d["sub_envs"] for e in envs])
  assert len(np.unique(idx_all)) == 9 * 20          # disjoint sub-environments
  for envs in d["sub_envs"]:
    for e in envs:
      x_all = np.concatenate([e["train"][0], e["val"][0]])
      assert len(e["val"][1]) == 2 and len(e["train"][1]) == 18
      want = rotated.rotate_images(raw.x_train[e["index"]], e["angle"]) / 255.0
      # train + val are a split of the rotated sub-environment.
      np.testing.assert_allclose(np.sort(x_all.reshape(20, -1).sum(1)),
                                 np.sort(want.reshape(20, -1).sum(1)), rtol=1e-5)
  e90 = d["sub_envs"][1][2]
  full = rotated.rotate_images(raw.x_train[e90["index"]], 90.0) / 255.0
  np.testing.assert_allclose(full, np.rot90(raw.x_train[e90["index"]], 1, axes=(1, 2))
                             / 255.0, atol=1e-5)
  assert np.all((-90 <= d["ood_angles"]) & (d["ood_angles"] <= 90))
  assert d["ood"][0].shape == (30, 32, 32, 3)
  i0 = d["ood_index"][0]
  np.testing.assert_allclose(
      d["ood"][0][0], rotated.rotate_images(raw.x_test[i0:i0 + 1], d["ood_angles"][:1])[0]
      / 255.0, atol=1e-5)


def test_rotated_cifar10_task(fake_cifar):
  task = tasks.make_task("rotated_cifar10", data_dir=fake_cifar, n_per_env=20, n_ood=30)
  names = {f"client{i}_rot{a}" for i, row in enumerate(rotated.CIFAR_ANGLES) for a in row}
  assert names == {"client0_rot10", "client0_rot25", "client0_rot40", "client1_rot60",
                   "client1_rot75", "client1_rot90", "client2_rot-10", "client2_rot-40",
                   "client2_rot-90"}
  assert set(task.eval_sets) == names | {"ood"}
  assert task.train.num_clients == 3 and task.train.feature_shape == (32, 32, 3)
  assert list(map(int, task.train.n)) == [54, 54, 54]
  assert int(task.eval_sets["ood"].n[0]) == 30
  assert task.info["dataset_source"] == "raw"
  with pytest.raises(ValueError, match="n_per_env"):
    tasks.make_task("rotated_cifar10", data_dir=fake_cifar, n_per_env=1000)


# ------------------------------------------------------ FedCMNIST / RotMNIST ---


def test_fed_cmnist_colors_are_per_client_and_unseen_at_test():
  task = tasks.make_task("fed_cmnist", n_train=600, n_test=100, k=2)
  assert task.train.num_clients == 10 and task.train.feature_shape == (28, 28, 3)
  assert task.eval_sets["ood"].num_clients == 2
  train_sp = np.asarray(task.info["train_spurious"])    # [10, 2, 3]
  test_sp = np.asarray(task.info["test_spurious"])      # [2, 2, 3]
  for data, sp in ((task.train, train_sp), (task.eval_sets["ood"], test_sp)):
    for i in range(data.num_clients):
      x, _ = client_arrays(data, i)
      fg, bg = sp[i]
      # Every pixel is a mix d*fg + (1-d)*bg of the client's two colors.
      d = ((x - bg) @ (fg - bg)) / np.sum((fg - bg) ** 2)
      assert d.min() >= -1e-4 and d.max() <= 1 + 1e-4
      np.testing.assert_allclose(x, d[..., None] * fg + (1 - d[..., None]) * bg, atol=1e-4)
      np.testing.assert_allclose(x[:, 0, 0], np.broadcast_to(bg, (len(x), 3)), atol=1e-4)
  colors_train = train_sp.reshape(-1, 3)
  for c in test_sp.reshape(-1, 3):
    assert np.min(np.linalg.norm(colors_train - c, axis=1)) >= task.info["color_min_dist"]
  counts = np.asarray(task.info["client_label_counts"])
  assert np.all((counts > 0).sum(axis=1) == 2)   # quantity-based label imbalance, k=2
  assert int(task.train.n.sum()) == 600


def test_fed_rotmnist_angles_per_client():
  d = rotated.make_fed_shift_mnist("rotation", n_train=300, n_test=60, seed=0)
  assert d["train_spurious"] == pytest.approx(np.linspace(0, 90, 10))
  assert set(d["test_spurious"]).isdisjoint(d["train_spurious"])
  raw = d["raw"]
  for i in (0, 3, 9):
    idx = d["client_indices"][i]
    want = rotated.rotate_images(raw.x_train[idx], d["train_spurious"][i]) / 255.0
    np.testing.assert_allclose(d["train"][i][0][..., 0], want, atol=1e-6)
    np.testing.assert_array_equal(d["train"][i][1], raw.y_train[idx])
  task = tasks.make_task("fed_rotmnist", n_train=300, n_test=60, partition="iid")
  assert task.train.num_clients == 10 and task.eval_sets["ood"].num_clients == 2
  assert task.info["test_spurious"] == [-15.0, 105.0]


@pytest.mark.parametrize("name,kw,match", [
    ("fed_rotmnist", dict(test_angles=(0.0, 105.0)), "also training angles"),
    ("fed_rotmnist", dict(train_angles=(0.0, 10.0)), "one per client"),
    ("fed_rotmnist", dict(test_angles=None), "test_angles"),
    ("fed_cmnist", dict(partition="shards"), "partition"),
    ("fed_cmnist", dict(num_test_clients=0), "num_test_clients"),
    ("fed_cmnist", dict(k=11), "k="),
])
def test_fed_shift_errors(name, kw, match):
  with pytest.raises(ValueError, match=match):
    tasks.make_task(name, n_train=300, n_test=60, **kw)
