"""``--source hf`` and the generic ``hf`` task (fedjax_inv/data/hf.py, fedjax_inv/tasks/hf.py).

Offline: every dataset here is a tiny local copy in the hub's own schema (FEMNIST's
``image``/``character``/``writer_id`` as the hub's parquet files, Shakespeare's
``x``/``y``/``character_id`` as its csv, an image/label set with train and test splits),
read through the same ``flwr_datasets.FederatedDataset`` path as the hub; the clients are
checked against Flower's partitioners called directly.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

os.environ["HF_DATASETS_OFFLINE"] = "1"  # never the network, whatever is imported
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["FLWR_TELEMETRY_ENABLED"] = "0"

datasets = pytest.importorskip("datasets")
pytest.importorskip("flwr_datasets")
from flwr_datasets import FederatedDataset  # noqa: E402
from flwr_datasets.partitioner import DirichletPartitioner, NaturalIdPartitioner  # noqa: E402
from PIL import Image  # noqa: E402

from fedjax_inv.data import federated_files as ff  # noqa: E402
from fedjax_inv.data import hf as hub  # noqa: E402
from fedjax_inv.tasks import make_task  # noqa: E402

WRITERS = [12, 25, 7, 30, 15, 11]   # FEMNIST writers' sizes
ROLES = [40, 9, 23]                 # Shakespeare roles' lines
TEXT = "To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer"


def _femnist_rows(seed=0):
  rng = np.random.default_rng(seed)
  rows = {"image": [], "writer_id": [], "hsf_id": [], "character": []}
  for w, s in enumerate(WRITERS):
    for _ in range(s):
      rows["image"].append(rng.integers(0, 256, (28, 28), dtype=np.uint8))
      rows["writer_id"].append(f"f{w:04d}_{(w * 37) % 100:02d}")
      rows["hsf_id"].append(w % 8)
      rows["character"].append(int(rng.integers(0, 62)))
  return rows


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory):
  """A private, empty Hugging Face cache (the parquet files' arrow copies land here)."""
  home = tmp_path_factory.mktemp("hf_home")
  old = datasets.config.HF_DATASETS_CACHE
  datasets.config.HF_DATASETS_CACHE = str(home / "datasets")
  yield home
  datasets.config.HF_DATASETS_CACHE = old


@pytest.fixture(scope="module")
def local(tmp_path_factory, hf_home):
  """``DIR`` with ``femnist/`` (the hub repository's parquet layout), ``femnist_disk/``
  (save_to_disk), ``shakespeare/`` (the hub's csv) and ``tiny/`` (an image/label set
  with train and test splits); returns ``(DIR, femnist rows)``."""
  root = tmp_path_factory.mktemp("hf_local")
  rows = _femnist_rows()
  feats = datasets.Features({"image": datasets.Image(), "writer_id": datasets.Value("string"),
                             "hsf_id": datasets.Value("int64"),
                             "character": datasets.ClassLabel(num_classes=62)})
  d = datasets.Dataset.from_dict(
      {**rows, "image": [Image.fromarray(a) for a in rows["image"]]}, features=feats)
  d = d.shuffle(seed=3)  # writers interleaved, as in a real table
  (root / "femnist" / "data").mkdir(parents=True)
  d.to_parquet(str(root / "femnist" / "data" / "train-00000-of-00001.parquet"))
  datasets.DatasetDict({"train": d}).save_to_disk(str(root / "femnist_disk"))
  # Shakespeare: x = 80 characters, y = the next one, one role per character_id
  sh = {"character_id": [], "x": [], "y": []}
  for r, s in enumerate(ROLES):
    for j in range(s):
      k = (7 * r + j) % (len(TEXT) - 1)
      ctx = (TEXT * 2)[k:k + 80]
      sh["character_id"].append(f"PLAY_{r}_ROLE")
      sh["x"].append(ctx)
      sh["y"].append((TEXT * 2)[k + 80])
  (root / "shakespeare").mkdir()
  datasets.Dataset.from_dict(sh).to_csv(str(root / "shakespeare" / "shakespeare.csv"),
                                        index=False)
  # a generic image/label set: 8x8 grayscale, 4 classes, train + test splits
  rng = np.random.default_rng(1)
  tf = datasets.Features({"img": datasets.Image(),
                          "label": datasets.ClassLabel(num_classes=4)})
  (root / "tiny" / "data").mkdir(parents=True)
  for split, n in (("train", 160), ("test", 40)):
    datasets.Dataset.from_dict(
        {"img": [Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8))
                 for _ in range(n)],
         "label": rng.integers(0, 4, n).tolist()}, features=tf).to_parquet(
             str(root / "tiny" / "data" / f"{split}-00000-of-00001.parquet"))
  return root, rows


def _flower_partitions(path, column):
  """The hub path: FederatedDataset on the local copy, Flower's natural-id partitioner."""
  fds = FederatedDataset(dataset=str(path), shuffle=False,
                         partitioners={"train": NaturalIdPartitioner(partition_by=column)})
  p = fds.partitioners["train"]
  return {p.partition_id_to_natural_id[i]: fds.load_partition(i)
          for i in range(p.num_partitions)}


def test_importing_fedjax_inv_imports_neither_datasets_nor_flwr_datasets():
  code = ("import sys, fedjax_inv, fedjax_inv.tasks, fedjax_inv.cli, fedjax_inv.data.hf\n"
          "bad = [m for m in sys.modules if m.split('.')[0] in "
          "('datasets', 'flwr_datasets', 'huggingface_hub', 'pyarrow')]\n"
          "assert not bad, bad\n")
  subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("copy", ["femnist", "femnist_disk"])
def test_femnist_clients_equal_flowers_writer_partitions(local, copy, tmp_path):
  root, rows = local
  data_dir = tmp_path / "d"
  data_dir.mkdir()
  (data_dir / "femnist").symlink_to(root / copy)  # DIR/femnist: parquet or save_to_disk
  task = make_task("femnist", source="hf", data_dir=str(data_dir), seed=0)
  flower = _flower_partitions(root / "femnist", "writer_id")
  ids = sorted(set(rows["writer_id"]))
  assert task.train.ids == tuple(ids) == tuple(flower)
  assert task.info["dataset_source"].startswith(
      "hf files" if copy == "femnist" else "hf save_to_disk")
  train, test = task.train, task.eval_sets["test"]
  assert train.x.dtype == np.uint8 and train.divisor == 255.0  # 8-bit, stored once
  assert train.feature_shape == (28, 28, 1)
  tests = dict(zip(test.ids, test.n))
  for i, c in enumerate(ids):
    n = len(flower[c])
    t = int(0.1 * n)
    assert train.n[i] == n - t and tests.get(c, 0) == t
    got = np.concatenate([train.client(i)[1]] + (
        [test.client(test.ids.index(c))[1]] if t else []))
    assert sorted(got.tolist()) == sorted(flower[c]["character"])  # the writer's labels
  assert train.total + test.total == len(rows["character"])  # every example once
  # pixels: a writer's images, as stored in the hub's table (set equality of images)
  i = ids.index(ids[1])
  want = {a.tobytes() for a, w in zip(rows["image"], rows["writer_id"]) if w == ids[1]}
  have = {a.tobytes() for a in np.asarray(train.x[train.offsets[i]:train.offsets[i + 1]])
          .reshape(-1, 28, 28)}
  assert have <= want and len(have) == train.n[i]


def test_femnist_num_clients_and_heldout_writers(local):
  root, _ = local
  task = make_task("femnist", source="hf", data_dir=str(root), seed=0, num_clients=4,
                   heldout_writers=0.25)
  assert task.train.num_clients == 3 and task.info["num_heldout_writers"] == 1
  assert "ood" in task.eval_sets


def test_shakespeare_clients_equal_flowers_role_partitions(local):
  root, _ = local
  task = make_task("shakespeare", source="hf", data_dir=str(root), seed=0,
                   max_examples=None)
  flower = _flower_partitions(root / "shakespeare", "character_id")
  assert task.train.ids == tuple(flower) == tuple(sorted(flower))
  assert task.train.x.dtype == np.uint8 and task.train.divisor == 1.0
  test = task.eval_sets["test"]
  for i, (c, part) in enumerate(flower.items()):
    n = len(part)
    t = int(round(0.2 * n))
    x, y = ff.leaf_shakespeare_examples(part["x"], part["y"])
    tx, ty = task.train.client(i)
    assert len(ty) == n - t  # the role's first 80% of lines, in order
    np.testing.assert_array_equal(ty, y[:n - t])
    np.testing.assert_array_equal(tx, x[:n - t].astype(np.float32))
    j = test.ids.index(c)
    np.testing.assert_array_equal(test.client(j)[1], y[n - t:])
  capped = make_task("shakespeare", source="hf", data_dir=str(root), seed=0,
                     max_examples=5)
  assert int(np.max(capped.train.n)) == 5


def test_without_a_copy_the_error_is_one_line_naming_dataset_cache_and_fix(tmp_path):
  for data_dir in (str(tmp_path), None):
    with pytest.raises(FileNotFoundError) as e:
      make_task("femnist", source="hf", data_dir=data_dir)
    msg = str(e.value)
    assert "\n" not in msg
    assert "flwrlabs/femnist" in msg and datasets.config.HF_DATASETS_CACHE in msg
    assert "hf download flwrlabs/femnist --repo-type dataset" in msg
    assert "--data-dir" in msg and "--download" in msg and "save_to_disk" in msg


def _cli(argv):
  from fedjax_inv import cli
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    rc = cli.main(argv)
  return rc, out.getvalue(), err.getvalue()


def test_cli_offline_without_a_copy_prints_one_line_and_exits_2(tmp_path):
  rc, _, err = _cli(["run", "--task", "femnist", "--source", "hf", "--rounds", "1",
                     "--data-dir", str(tmp_path), "--out", str(tmp_path / "out"),
                     "--no-progress"])
  lines = [l for l in err.splitlines() if l.startswith("fedjax-inv: error:")]
  assert rc == 2 and len(lines) == 1 and "flwrlabs/femnist" in lines[0], err
  assert not (tmp_path / "out").exists()


@pytest.mark.slow  # ~10 s: compiles Reddi et al.'s FEMNIST CNN
def test_cli_runs_femnist_from_a_local_hub_copy(local, tmp_path):
  root, _ = local
  rc, out, err = _cli(["run", "--task", "femnist", "--source", "hf", "--data-dir",
                       str(root), "--rounds", "1", "--clients-per-round", "2",
                       "--local-steps", "1", "--batch-size", "4", "--no-progress",
                       "--out", str(tmp_path / "run")])
  assert rc == 0, err
  s = json.loads((tmp_path / "run" / "summary.json").read_text())
  assert s["data"]["num_clients"] == len(WRITERS)
  assert s["data"]["dataset_source"].startswith("hf files")


def test_cli_generic_task_dirichlet_sizes_equal_flowers_partitioner(local, tmp_path):
  root, _ = local
  spec = "dirichlet:alpha=0.3,num_partitions=5,by=label,min_partition_size=5"
  rc, out, err = _cli(["run", "--task", "hf", "--data-dir", str(root),
                       "--task-arg", "dataset=tiny", "--task-arg", f"partitioner={spec}",
                       "--rounds", "1", "--clients-per-round", "2", "--local-steps", "1",
                       "--seeds", "1", "--no-progress", "--out", str(tmp_path / "run")])
  assert rc == 0, err
  s = json.loads((tmp_path / "run" / "summary.json").read_text())
  train = datasets.load_dataset(str(root / "tiny"))["train"]
  p = DirichletPartitioner(num_partitions=5, partition_by="label", alpha=0.3,
                           min_partition_size=5, seed=0)  # the run's seed
  p.dataset = train
  want = [len(p.load_partition(i)) for i in range(5)]
  assert s["data"]["client_sizes"] == want and sum(want) == len(train)
  assert s["data"]["stored_dtype"] == "uint8" and s["data"]["num_classes"] == 4


def test_generic_task_labels_equal_federated_dataset_partitions(local):
  root, _ = local
  spec = "dirichlet:alpha=0.5,num_partitions=4,by=label,min_partition_size=3"
  task = make_task("hf", data_dir=str(root), dataset="tiny", partitioner=spec, seed=7)
  fds = FederatedDataset(dataset=str(root / "tiny"), seed=7, partitioners={
      "train": hub.make_partitioner(spec, seed=7)})
  for i in range(4):
    np.testing.assert_array_equal(task.train.client(i)[1],
                                  np.asarray(fds.load_partition(i)["label"]))
  assert task.eval_sets["test"].num_clients == 1 and task.eval_sets["test"].total == 40
  assert task.info["x_column"] == "img" and task.train.feature_shape == (8, 8, 1)


def test_generic_task_partition_by_a_column_and_bad_arguments(local):
  root, rows = local
  task = make_task("hf", data_dir=str(root), dataset="femnist", partition_by="writer_id",
                   y_column="character", seed=0)
  assert task.train.ids == tuple(sorted(set(rows["writer_id"])))
  assert set(task.eval_sets) == {"test"}  # no test split: 10% of each writer
  with pytest.raises(ValueError, match="needs --task-arg dataset"):
    make_task("hf")
  with pytest.raises(ValueError, match="no column 'label'"):
    make_task("hf", data_dir=str(root), dataset="femnist", partition_by="writer_id")
  with pytest.raises(ValueError, match="unknown name 'zipf'"):
    hub.make_partitioner("zipf:num_partitions=3")
  with pytest.raises(ValueError, match="takes no"):
    hub.make_partitioner("iid:num_partitions=3,alpha=1")


def test_mnist_noniid_takes_flowers_partitioners_opt_in():
  kw = dict(seed=3, n_train=400, n_test=50, num_clients=5)
  flwr_iid = make_task("mnist_noniid", partition="flwr:iid", **kw)
  ours_iid = make_task("mnist_noniid", partition="iid", **kw)  # identical clients
  np.testing.assert_array_equal(np.asarray(flwr_iid.train.n), np.asarray(ours_iid.train.n))
  np.testing.assert_array_equal(np.asarray(flwr_iid.train.y), np.asarray(ours_iid.train.y))
  task = make_task("mnist_noniid", partition="flwr:dirichlet:alpha=0.3", min_size=5, **kw)
  y, n = np.asarray(task.train.y), np.asarray(task.train.n)
  labels = np.concatenate([y[i, :n[i]] for i in range(5)])
  p = DirichletPartitioner(num_partitions=5, partition_by="label", alpha=0.3,
                           min_partition_size=5, seed=3)
  p.dataset = datasets.Dataset.from_dict({"label": labels.tolist()})
  assert task.info["client_sizes"] == [len(p.load_partition(i)) for i in range(5)]
  with pytest.raises(ValueError, match="flwr:NAME"):
    make_task("mnist_noniid", partition="dirichlet2", **kw)


# -- DomainBed on the hub: flwrlabs/pacs's schema (image, domain, label) ----------------

PACS_SIZES = {"art_painting": 5, "cartoon": 7, "photo": 4, "sketch": 6}
# the hub's class names in an order other than sorted, so that the remapping shows
PACS_NAMES = ["person", "dog", "house", "giraffe", "guitar", "horse", "elephant"]


@pytest.fixture(scope="module")
def pacs_copy(tmp_path_factory, hf_home):
  """``DIR`` with ``pacs/data/train-00000-of-00001.parquet``: RGB images of several sizes,
  ``domain`` strings, ``label`` a ClassLabel; rows of the domains interleaved."""
  root = tmp_path_factory.mktemp("hf_pacs")
  rng = np.random.default_rng(5)
  rows = {"image": [], "domain": [], "label": []}
  for d, n in PACS_SIZES.items():
    for j in range(n):
      h, w = 9 + j % 3, 11 + j % 2
      rows["image"].append(Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)))
      rows["domain"].append(d)
      rows["label"].append(int(rng.integers(0, len(PACS_NAMES))))
  feats = datasets.Features({"image": datasets.Image(), "domain": datasets.Value("string"),
                             "label": datasets.ClassLabel(names=PACS_NAMES)})
  table = datasets.Dataset.from_dict(rows, features=feats).shuffle(seed=2)
  (root / "pacs" / "data").mkdir(parents=True)
  table.to_parquet(str(root / "pacs" / "data" / "train-00000-of-00001.parquet"))
  return root


def test_pacs_domains_equal_flowers_domain_partitions(pacs_copy):
  """Each DomainBed domain is Flower's natural-id partition of ``domain``: its size, its
  labels (the hub's class names, re-indexed in sorted order like the image folders'),
  and its images as PIL converts them (RGB, bilinear to the size)."""
  from fedjax_inv.data import domainbed
  domainbed._CACHE.clear()
  domains, classes, note = domainbed.load_domainbed("pacs", str(pacs_copy), source="hf",
                                                    image_size=8)
  assert classes == sorted(PACS_NAMES) and note.startswith("hf files")
  flower = _flower_partitions(pacs_copy / "pacs", "domain")
  assert sorted(flower) == sorted(PACS_SIZES)
  for name, (x, y) in zip(domainbed.DATASETS["pacs"][1], domains):
    part = flower[name].with_format(None)
    assert x.shape == (PACS_SIZES[name], 8, 8, 3) and x.dtype == np.uint8
    want_y = [sorted(PACS_NAMES).index(PACS_NAMES[i]) for i in part["label"]]
    assert y.tolist() == want_y
    want_x = np.stack([np.asarray(im.convert("RGB").resize((8, 8), Image.BILINEAR))
                       for im in part["image"]])
    np.testing.assert_array_equal(x, want_x)
  small, _, _ = domainbed.load_domainbed("pacs", str(pacs_copy), source="hf", image_size=8,
                                         max_images_per_domain=3, seed=1)
  assert [len(y) for _, y in small] == [3, 3, 3, 3]
  domainbed._CACHE.clear()


def test_pacs_task_from_the_hub_copy_holds_out_a_domain(pacs_copy):
  from fedjax_inv.data import domainbed
  domainbed._CACHE.clear()
  task = make_task("pacs", source="hf", data_dir=str(pacs_copy), holdout="sketch",
                   image_size=8, val_fraction=0.25, base_width=4)
  assert task.train.num_clients == 3  # one client per source domain
  assert int(np.sum(task.eval_sets["ood"].n)) == PACS_SIZES["sketch"]
  assert task.info["dataset_source"].startswith("hf files")
  domainbed._CACHE.clear()


def test_domainbed_hub_errors_are_clear(tmp_path):
  from fedjax_inv.data import domainbed
  domainbed._CACHE.clear()
  with pytest.raises(FileNotFoundError) as e:
    make_task("office_home", source="hf", data_dir=str(tmp_path), image_size=8)
  msg = str(e.value)
  assert "\n" not in msg and "flwrlabs/office-home" in msg and "--download" in msg
  with pytest.raises(ValueError, match="no copy of 'vlcs'.*source='raw'"):
    make_task("vlcs", source="hf", data_dir=str(tmp_path))
  with pytest.raises(ValueError, match="download=True needs source='hf'"):
    make_task("pacs", source="raw", data_dir=str(tmp_path), download=True)
