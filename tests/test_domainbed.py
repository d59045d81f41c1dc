"""DomainBed folder loaders (on a tiny generated image folder) and the GroupNorm ResNet
featurizers (shapes, pretrained-weights round trip, clear errors)."""
import math

import jax
import numpy as np
import pytest
from flax import nnx
from PIL import Image

from fedjax_inv.data import domainbed
from fedjax_inv.models import resnet as R
from fedjax_inv.tasks import make_task, task_registry

PACS_DOMAINS = ["art_painting", "cartoon", "photo", "sketch"]
CLASSES = ["dog", "elephant"]


def _color(d, c, i):
  # One constant color per image, distinct per (domain, class, index).
  return (20 + 60 * d, 30 + 100 * c, 10 + 40 * i)


@pytest.fixture(scope="module")
def pacs_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("data")
  for d, dom in enumerate(PACS_DOMAINS):
    for _c, cls in enumerate(CLASSES[::-1]):  # created in reverse: labels must be sorted
      folder = root / "PACS" / dom / cls
      folder.mkdir(parents=True)
      ci = CLASSES.index(cls)
      for i in range(3 + d):  # domain sizes 6, 8, 10, 12
        ext = "png" if i % 2 else "jpg"
        Image.new("RGB", (8, 8) if i else (10, 6), _color(d, ci, i)).save(
            folder / f"img{i}.{ext}")
      (folder / "notes.txt").write_text("not an image")
  return root


def test_loader_reads_layout_sorted_classes_and_resizes(pacs_dir):
  doms, classes, note = domainbed.load_domainbed("pacs", pacs_dir, image_size=4)
  assert classes == CLASSES
  assert str(pacs_dir) in note
  assert [len(y) for _, y in doms] == [6, 8, 10, 12]
  for d, (x, y) in enumerate(doms):
    assert x.shape == (len(y), 4, 4, 3) and x.dtype == np.uint8
    assert sorted(set(y.tolist())) == [0, 1]
    # PNG images keep their exact constant color; labels follow the sorted class names
    # (folders were created in reverse order).
    for c in (0, 1):
      got = {tuple(int(v) for v in img[0, 0]) for img in x[y == c]}
      want = {_color(d, c, i) for i in range(3 + d) if i % 2}  # the PNGs (lossless)
      assert want <= got


@pytest.mark.slow
def test_task_follows_domain_contract(pacs_dir):
  task = make_task("pacs", data_dir=pacs_dir, holdout="photo", image_size=8, seed=3,
                   val_fraction=0.25, arch="resnet18", base_width=8)
  assert task.kind == "multiclass"
  assert task.info["domains"] == PACS_DOMAINS and task.info["holdout"] == "photo"
  assert set(task.eval_sets) == {"val", "ood"}
  assert task.train.num_clients == 3 and task.eval_sets["val"].num_clients == 3
  assert task.eval_sets["ood"].num_clients == 1
  assert int(task.eval_sets["ood"].n[0]) == 10
  # Each source domain is split 75/25 (round(0.25 n) validation examples).
  np.testing.assert_array_equal(np.asarray(task.train.n) + np.asarray(
      task.eval_sets["val"].n), [6, 8, 12])
  np.testing.assert_array_equal(task.eval_sets["val"].n, [2, 2, 3])
  x = np.asarray(task.train.x)
  assert x.shape[2:] == (8, 8, 3) and x.dtype == np.float32 and 0 <= x.min() <= x.max() <= 1
  for k in ("paper", "dataset_source", "data_note"):
    assert k in task.info
  # Same seed, same split; different seed, different split.
  again = make_task("pacs", data_dir=pacs_dir, holdout=2, image_size=8, seed=3,
                    val_fraction=0.25, base_width=8)
  np.testing.assert_array_equal(again.train.x, task.train.x)
  other = make_task("pacs", data_dir=pacs_dir, holdout=2, image_size=8, seed=4,
                    val_fraction=0.25, base_width=8)
  assert not np.array_equal(other.eval_sets["val"].x, task.eval_sets["val"].x)
  out = jax.eval_shape(task.model.apply, task.model.init(0), x[0, :2])
  assert out.shape == (2, 2)  # 2 classes


@pytest.mark.slow
def test_many_clients_per_domain(pacs_dir):
  task = make_task("pacs", data_dir=pacs_dir, holdout=0, image_size=4,
                   clients_per_domain=2, base_width=8)
  assert task.train.num_clients == 6
  assert task.info["client_domains"] == ["cartoon"] * 2 + ["photo"] * 2 + ["sketch"] * 2
  assert task.eval_sets["val"].num_clients == 3
  t2 = make_task("pacs", data_dir=pacs_dir, holdout=0, image_size=4, num_clients=4,
                 base_width=8)
  assert t2.train.num_clients == 4
  # FedIIR Alg. 2: the extra client goes to the largest domain (sketch).
  assert t2.info["client_domains"] == ["cartoon", "photo", "sketch", "sketch"]


def test_missing_data_and_bad_arguments(tmp_path, pacs_dir):
  with pytest.raises(FileNotFoundError, match=r"PACS/<domain>/<class>"):
    make_task("pacs", data_dir=tmp_path)
  with pytest.raises(FileNotFoundError, match=r"office_home/<domain>/<class>"):
    make_task("office_home", data_dir=tmp_path / "nowhere")
  (tmp_path / "VLCS" / "Caltech101" / "bird").mkdir(parents=True)
  with pytest.raises(FileNotFoundError, match="missing"):
    make_task("vlcs", data_dir=tmp_path)
  with pytest.raises(ValueError, match="not a domain"):
    make_task("pacs", data_dir=pacs_dir, holdout="mars", image_size=4)
  with pytest.raises(ValueError, match="index in 0..3"):
    make_task("pacs", data_dir=pacs_dir, holdout=7, image_size=4)
  with pytest.raises(ValueError, match="download"):
    make_task("pacs", data_dir=pacs_dir, download=True)
  with pytest.raises(ValueError, match="arch"):
    make_task("pacs", data_dir=pacs_dir, image_size=4, arch="vgg")
  with pytest.raises(ValueError, match="only supported for domainnet"):
    make_task("pacs", data_dir=pacs_dir, source="tfds")
  # DomainNet: neither the folders nor a prepared tfds dataset (never downloaded).
  with pytest.raises(FileNotFoundError, match=r"domain_net/<domain>.*Also no prepared tfds"):
    make_task("domainnet", data_dir=tmp_path)
  assert not (tmp_path / "domainnet").exists()  # nothing written into the data dir
  assert {"pacs", "vlcs", "office_home", "domainnet"} <= set(task_registry())


@pytest.mark.parametrize("depth,torchvision_total", [(18, 11_689_512), (50, 25_557_032)])
def test_full_resnet_trunk_matches_torchvision_size(depth, torchvision_total):
  # torchvision's resnet18/50 parameter counts minus their 1000-way fc; GroupNorm has the
  # same scale/bias per channel as BatchNorm's weight/bias. Shapes only (no init).
  m = nnx.eval_shape(lambda: R.ResNet(depth, 10, rngs=nnx.Rngs(0)))
  n = sum(math.prod(v.shape) for v in jax.tree.leaves(nnx.state(m.featurizer, nnx.Param)))
  d, t = m.feature_dim, m.featurizer.trunk_dim
  assert (d, t) == ((512, 512) if depth == 18 else (2048, 2048))
  assert n - (t * d + d) == torchvision_total - (t * 1000 + 1000)


@pytest.fixture(scope="module")
def r18():
  # Full ResNet-18 depth and 512-d features; thin stages (8 channels, the same trunk as
  # the tasks above, so eager initializers are compiled once) keep CI fast.
  model = R.resnet18(5, small_input=True, base_width=8)
  return model, model.init(0)


def test_resnet_shapes(r18):
  model, params = r18
  x = np.random.default_rng(0).random((2, 32, 32, 3), np.float32)
  assert jax.eval_shape(model.features, params, x).shape == (2, 512)
  assert jax.eval_shape(model.apply, params, x).shape == (2, 5)
  assert model.feature_dim == 512
  # ImageNet stem (7x7/2 + max-pool) on 64x64, ResNet-50 with FedIIR's 2-layer classifier.
  m50 = nnx.eval_shape(lambda: R.ResNet(50, 3, classifier_hidden=16, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(m50)
  x64 = jax.ShapeDtypeStruct((2, 64, 64, 3), np.float32)
  z = jax.eval_shape(lambda s, x: nnx.merge(graphdef, s).featurizer(x), state, x64)
  out = jax.eval_shape(lambda s, x: nnx.merge(graphdef, s)(x), state, x64)
  assert z.shape == (2, 2048) and out.shape == (2, 3)
  # Only Params, and no BatchNorm statistics: GroupNorm scale/bias.
  assert any(k.endswith("norm1/scale") for k in R.param_paths(params))
  with pytest.raises(ValueError, match="depth"):
    R.resnet(20, 3)


def test_pretrained_round_trip_and_errors(tmp_path, r18):
  model, params = r18
  other = model.init(7)
  path = R.save_params(other, tmp_path / "w.npz")
  loaded = R.load_pretrained(params, path)
  for k, v in R.param_paths(loaded).items():
    assert v == R.param_paths(params)[k]
  x = np.random.default_rng(2).random((2, 32, 32, 3), np.float32)
  apply = jax.jit(model.apply)
  np.testing.assert_allclose(apply(loaded, x), apply(other, x), rtol=1e-6)
  assert not np.allclose(apply(params, x), apply(other, x))
  # Only the featurizer: the classifier keeps its fresh values.
  feat_only = R.load_pretrained(params, path, prefix="featurizer")
  np.testing.assert_array_equal(feat_only["classifier"]["kernel"],
                                params["classifier"]["kernel"])
  np.testing.assert_array_equal(feat_only["featurizer"]["projection"]["kernel"],
                                other["featurizer"]["projection"]["kernel"])
  # A model whose init() loads the file.
  pm = R.with_pretrained(model, path)
  np.testing.assert_array_equal(pm.init(3)["featurizer"]["stem_conv"]["kernel"],
                                other["featurizer"]["stem_conv"]["kernel"])
  # Mismatched file: the same keys, one array of another shape.
  flat = {k: np.zeros(s, np.float32) for k, s in R.param_paths(params).items()}
  flat["featurizer/projection/kernel"] = np.zeros((3, 512), np.float32)
  np.savez(tmp_path / "bad.npz", **flat)
  bad = tmp_path / "bad.npz"
  with pytest.raises(ValueError, match=r"featurizer/projection/kernel: file \(3, 512\)"):
    R.load_pretrained(params, bad)
  with pytest.raises(ValueError, match="shape mismatch"):
    R.with_pretrained(model, bad)
  flat = {k: np.zeros(s, np.float32) for k, s in R.param_paths(params).items()}
  flat.pop("classifier/bias")
  flat["featurizer/extra"] = np.zeros(3, np.float32)
  np.savez(tmp_path / "partial.npz", **flat)
  with pytest.raises(ValueError, match=r"missing key\(s\): \['classifier/bias'\]"):
    R.load_pretrained(params, tmp_path / "partial.npz")
  with pytest.raises(ValueError, match="unexpected key"):
    R.load_pretrained(params, tmp_path / "partial.npz", prefix="featurizer")
  lenient = R.load_pretrained(params, tmp_path / "partial.npz", strict=False)
  np.testing.assert_array_equal(lenient["classifier"]["bias"], params["classifier"]["bias"])
  assert float(np.abs(lenient["classifier"]["kernel"]).sum()) == 0.0
  with pytest.raises(FileNotFoundError, match="never downloaded"):
    R.load_pretrained(params, tmp_path / "absent.npz")
  (tmp_path / "junk.npz").write_bytes(b"not a zip")
  with pytest.raises(ValueError, match="not a readable"):
    R.load_pretrained(params, tmp_path / "junk.npz")
