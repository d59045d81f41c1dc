"""Offline readers (and fixture writers) for the published federated datasets.

Three standard federated benchmarks, read from their *published* files, never
downloaded:

* **TFF HDF5** (TensorFlow Federated ``tff.simulation.datasets`` before the
  move to SQLite; read there by ``tff.simulation.HDF5ClientData``): one file
  per split with a top-level group ``examples`` holding one sub-group per
  client, named by the client id, whose datasets are zipped example-wise.

  =====================================  =========================================
  file                                   ``examples/<client_id>/`` datasets
  =====================================  =========================================
  ``fed_emnist_{train,test}.h5``         ``pixels`` float32 [n, 28, 28] (1.0 is the
  (or ``fed_emnist_digitsonly_*.h5``)    background), ``label`` int [n] in 0..61
  ``shakespeare_{train,test}.h5``        ``snippets`` [n] variable-length byte
                                         strings (UTF-8), one speech of one role
  ``fed_cifar100_{train,test}.h5``       ``image`` uint8 [n, 32, 32, 3], ``label``
                                         int [n] in 0..99, ``coarse_label`` int [n]
                                         in 0..19
  =====================================  =========================================

  Archives: ``https://storage.googleapis.com/tff-datasets-public/``
  ``fed_emnist.tar.bz2`` (``fed_emnist_digitsonly.tar.bz2``),
  ``shakespeare.tar.bz2``, ``fed_cifar100.tar.bz2``.

* **LEAF JSON** (Caldas et al. 2019, "LEAF: A Benchmark for Federated
  Settings", https://github.com/TalwalkarLab/leaf): a folder ``train/`` and a
  folder ``test/`` of ``*.json`` files, each
  ``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...],
  "y": [...]}}}``.  FEMNIST ``x`` rows are flat lists of 784 floats (pixel / 255),
  ``y`` ints 0..61; Shakespeare ``x`` are 80-character strings and ``y`` the
  single next character.  A user may appear in several files (merged in file
  name order).  CIFAR-100 has no LEAF version.

Every reader returns a dict whose keys (client ids) are sorted, and raises
`DataFileError` -- a one-line ``<path>: <what is wrong>; <how to fix>``
message -- for damaged files.  h5py is imported lazily (only the HDF5 functions
need it); this module imports numpy only.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

PathLike = Union[str, os.PathLike]

FEDERATED_DATASETS = ("femnist", "shakespeare", "cifar100")

TFF_URL = "https://storage.googleapis.com/tff-datasets-public/"
TFF_ARCHIVES = {
    "femnist": "fed_emnist.tar.bz2",
    "femnist_digitsonly": "fed_emnist_digitsonly.tar.bz2",
    "shakespeare": "shakespeare.tar.bz2",
    "cifar100": "fed_cifar100.tar.bz2",
}
# Published file names, in order of preference.
TFF_FILES = {
    "femnist": (("fed_emnist_train.h5", "fed_emnist_test.h5"),
                ("fed_emnist_digitsonly_train.h5", "fed_emnist_digitsonly_test.h5")),
    "shakespeare": (("shakespeare_train.h5", "shakespeare_test.h5"),),
    "cifar100": (("fed_cifar100_train.h5", "fed_cifar100_test.h5"),),
}
# Sub-folders of data_dir also searched for the TFF files.
_TFF_SUBDIRS = {
    "femnist": ("fed_emnist", "femnist", "emnist"),
    "shakespeare": ("shakespeare", "fed_shakespeare"),
    "cifar100": ("fed_cifar100", "cifar100"),
}
LEAF_REPO = "https://github.com/TalwalkarLab/leaf"

EMNIST_NUM_CLASSES = 62
CIFAR100_NUM_CLASSES = 100
CIFAR100_NUM_COARSE = 20
FEMNIST_PIXELS = 784

# LEAF's character set, verbatim from ALL_LETTERS in
# leaf/models/utils/language_utils.py (TalwalkarLab/leaf): 80 characters; a
# character's id is its index here.
SHAKESPEARE_VOCAB = ("\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]"
                     "abcdefghijklmnopqrstuvwxyz}")
SHAKESPEARE_OOV_ID = len(SHAKESPEARE_VOCAB)       # 80: any other character
SHAKESPEARE_PAD_ID = len(SHAKESPEARE_VOCAB) + 1   # 81: left padding
SHAKESPEARE_VOCAB_SIZE = len(SHAKESPEARE_VOCAB) + 2  # 82 model classes
SHAKESPEARE_SEQ_LEN = 80

_CHAR_TABLE = np.full(128, SHAKESPEARE_OOV_ID, dtype=np.int32)
for _i, _c in enumerate(SHAKESPEARE_VOCAB):
  _CHAR_TABLE[ord(_c)] = _i
del _i, _c


class DataFileError(ValueError):
  """A federated data file is damaged or not in the published layout.

  ``str(err)`` is one line: ``<path>: <what is wrong>; <how to fix>``.  The
  parts are kept as ``err.path``, ``err.problem`` and ``err.fix``.
  """

  def __init__(self, path: PathLike, problem: str, fix: str = ""):
    self.path = os.fspath(path)
    self.problem = _one_line(problem)
    self.fix = _one_line(fix)
    msg = f"{self.path}: {self.problem}"
    if self.fix:
      msg += f"; {self.fix}"
    super().__init__(msg)

  def __reduce__(self):
    return (type(self), (self.path, self.problem, self.fix))


def _one_line(text: str) -> str:
  return " ".join(str(text).split())


# ----------------------------------------------------------------------------
# Locating files.


def _check_dataset(dataset: str) -> str:
  if dataset not in FEDERATED_DATASETS:
    raise ValueError(f"dataset must be one of {FEDERATED_DATASETS}, got {dataset!r}")
  return dataset


def _leaf_candidates(data_dir: str, dataset: str, split: str) -> list[str]:
  return [os.path.join(data_dir, dataset, "data", split),
          os.path.join(data_dir, dataset, split),
          os.path.join(data_dir, "data", split),
          os.path.join(data_dir, split)]


def _has_json(folder: str) -> bool:
  return os.path.isdir(folder) and any(
      n.endswith(".json") for n in os.listdir(folder))


def _tff_fix(dataset: str, path: Optional[PathLike] = None) -> str:
  archive = TFF_ARCHIVES[dataset]
  if path is not None and "digitsonly" in os.path.basename(os.fspath(path)):
    archive = TFF_ARCHIVES["femnist_digitsonly"]
  return f"re-download and extract {TFF_URL}{archive}"


def _leaf_fix(dataset: str) -> str:
  return (f"regenerate it with LEAF's data/{dataset}/preprocess.sh "
          f"({LEAF_REPO})")


def find_files(data_dir: PathLike, dataset: str) -> tuple[str, dict[str, str]]:
  """Locates the published train/test files of a federated dataset.

  Looks (in this order) for the TFF HDF5 files in ``data_dir`` and its
  sub-folders named after the archive (e.g. ``data_dir/fed_emnist/``), then
  for a LEAF ``train``/``test`` folder pair holding ``*.json`` files at
  ``data_dir/<dataset>/data/``, ``data_dir/<dataset>/``, ``data_dir/data/`` or
  ``data_dir/``.  For FEMNIST the 62-class ``fed_emnist_*.h5`` files are
  preferred over ``fed_emnist_digitsonly_*.h5``.  Never downloads.

  Sources: TFF ``tff.simulation.datasets.{emnist,shakespeare,cifar100}.load_data``
  (archive and file names); LEAF (Caldas et al. 2019) ``data/utils/split_data.py``
  (``<dataset>/data/{train,test}``).

  Args:
    data_dir: folder to search.
    dataset: ``'femnist'``, ``'shakespeare'`` or ``'cifar100'`` (TFF only).

  Returns:
    ``(layout, paths)``: layout ``'hdf5'`` (paths are the two ``.h5`` files)
    or ``'leaf'`` (paths are the two split folders), paths
    ``{'train': str, 'test': str}``.

  Raises:
    ValueError: unknown ``dataset``.
    FileNotFoundError: nothing found; the one-line message names ``data_dir``,
      every file/folder name looked for and where to get the files.
  """
  _check_dataset(dataset)
  data_dir = os.fspath(data_dir)
  dirs = [data_dir] + [os.path.join(data_dir, s) for s in _TFF_SUBDIRS[dataset]]
  for train_name, test_name in TFF_FILES[dataset]:
    for d in dirs:
      train, test = os.path.join(d, train_name), os.path.join(d, test_name)
      if os.path.isfile(train) and os.path.isfile(test):
        return "hdf5", {"train": train, "test": test}
  if dataset != "cifar100":
    for train, test in zip(_leaf_candidates(data_dir, dataset, "train"),
                           _leaf_candidates(data_dir, dataset, "test")):
      if _has_json(train) and _has_json(test):
        return "leaf", {"train": train, "test": test}
  names = ", ".join(n for pair in TFF_FILES[dataset] for n in pair)
  subdirs = ", ".join(s + "/" for s in _TFF_SUBDIRS[dataset])
  msg = (f"{data_dir}: no {dataset} data files found; looked for the TFF HDF5 "
         f"files {names} in {data_dir} and its sub-folders {subdirs}")
  where = f"get them from {TFF_URL}{TFF_ARCHIVES[dataset]}"
  if dataset == "femnist":
    where += f' (or {TFF_URL}{TFF_ARCHIVES["femnist_digitsonly"]})'
  where += " and extract into data_dir"
  if dataset != "cifar100":
    leaf = ", ".join(os.path.relpath(os.path.dirname(c), data_dir) + "/{train,test}/"
                     for c in _leaf_candidates(data_dir, dataset, "train"))
    msg += f", and for LEAF JSON folders (*.json) {leaf}"
    where += (f", or run LEAF's data/{dataset}/preprocess.sh ({LEAF_REPO}) "
              "and point data_dir at its output")
  raise FileNotFoundError(f"{msg}; {where}; nothing is downloaded automatically")


# ----------------------------------------------------------------------------
# TFF HDF5 readers.


def _h5py():
  try:
    import h5py  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("reading or writing TFF HDF5 files needs h5py: "
                      "pip install h5py (or fedjax_inv[federated])") from e
  return h5py


def _read_h5_clients(path: PathLike, dataset: str, names: Sequence[str],
                     convert: Callable[[str, dict[str, np.ndarray], Callable], Any]
                     ) -> dict[str, Any]:
  """Opens a TFF ClientData file and converts each client's named datasets.

  ``convert(cid, arrays, fail)`` gets the raw arrays and ``fail(problem)``,
  which raises the `DataFileError` for this file.
  """
  h5py = _h5py()
  path = os.fspath(path)
  fix = _tff_fix(dataset, path)

  def fail(problem):
    raise DataFileError(path, problem, fix)

  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path}: no such file; {fix}")
  out = {}
  try:
    with h5py.File(path, "r") as f:
      group = f.get("examples")
      if not isinstance(group, h5py.Group):
        fail("no 'examples' group at the top level (not a TFF ClientData HDF5 file)")
      cids = sorted(group.keys())
      if not cids:
        fail("the 'examples' group has no clients (empty dataset)")
      for cid in cids:
        client = group[cid]
        if not isinstance(client, h5py.Group):
          fail(f"examples/{cid} is not a group (one group per client expected)")
        arrays = {}
        for name in names:
          ds = client.get(name)
          if not isinstance(ds, h5py.Dataset):
            fail(f"client {cid!r} has no {name!r} dataset")
          arrays[name] = ds[()]
        out[cid] = convert(cid, arrays, fail)
  except (OSError, RuntimeError, KeyError) as e:
    fail(f"not a readable HDF5 file, truncated or damaged ({_one_line(e)})")
  return out


def _check_labels(cid: str, name: str, labels: np.ndarray, n: int, k: int,
                  fail: Callable) -> np.ndarray:
  """[n] integer labels in [0, k) -> int32, else ``fail``."""
  labels = np.asarray(labels)
  if labels.shape != (n,):
    fail(f"client {cid!r}: {name!r} has shape {labels.shape}, expected ({n},) "
         "(one label per example)")
  if n and not np.issubdtype(labels.dtype, np.integer):
    fail(f"client {cid!r}: {name!r} has dtype {labels.dtype}, expected integers")
  if n and (labels.min() < 0 or labels.max() >= k):
    fail(f"client {cid!r}: {name!r} out of range [{labels.min()}, {labels.max()}], "
         f"expected 0..{k - 1}")
  return labels.astype(np.int32)


def _check_images(cid: str, name: str, x: np.ndarray, shape: tuple[int, ...],
                  fail: Callable) -> None:
  x = np.asarray(x)
  if x.ndim != len(shape) + 1 or x.shape[1:] != shape:
    want = ", ".join(("n",) + tuple(str(s) for s in shape))
    fail(f"client {cid!r}: {name!r} has shape {x.shape}, expected [{want}]")


def read_tff_emnist(path: PathLike) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """Reads ``fed_emnist_{train,test}.h5`` (or the ``_digitsonly`` files).

  Source: TFF ``tff.simulation.datasets.emnist.load_data`` (HDF5 era): writers
  of LEAF's FEMNIST, ``examples/<writer id>/pixels`` float32 [n, 28, 28] with
  1.0 the background and ``examples/<writer id>/label`` int [n] (0-9 digits,
  10-35 upper case, 36-61 lower case).

  Args:
    path: the ``.h5`` file.

  Returns:
    client id -> ``(x, y)``: x float32 [n, 28, 28], y int32 [n]; ids sorted.

  Raises:
    FileNotFoundError: ``path`` does not exist.
    DataFileError: not HDF5 / truncated, no ``examples`` group, no clients, a
      client without ``pixels`` or ``label``, pixels not [n, 28, 28] or not
      floating point, ``label`` not [n] or outside 0..61.
    ImportError: h5py is not installed.
  """
  def convert(cid, a, fail):
    _check_images(cid, "pixels", a["pixels"], (28, 28), fail)
    if not np.issubdtype(a["pixels"].dtype, np.floating):
      fail(f"client {cid!r}: 'pixels' has dtype {a['pixels'].dtype}, expected float32")
    n = a["pixels"].shape[0]
    y = _check_labels(cid, "label", a["label"], n, EMNIST_NUM_CLASSES, fail)
    return a["pixels"].astype(np.float32), y

  return _read_h5_clients(path, "femnist", ("pixels", "label"), convert)


def read_tff_cifar100(path: PathLike
                      ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
  """Reads ``fed_cifar100_{train,test}.h5``.

  Source: TFF ``tff.simulation.datasets.cifar100.load_data`` (500 train / 100
  test clients of 100 images, partitioned by Pachinko allocation): per client
  ``image`` uint8 [n, 32, 32, 3], ``label`` int [n] (fine, 0..99) and
  ``coarse_label`` int [n] (0..19).

  Args:
    path: the ``.h5`` file.

  Returns:
    client id -> ``(x, y, coarse)``: x uint8 [n, 32, 32, 3], y int32 [n],
    coarse int32 [n]; ids sorted.

  Raises:
    FileNotFoundError: ``path`` does not exist.
    DataFileError: not HDF5 / truncated, no ``examples`` group, no clients, a
      client without ``image``/``label``/``coarse_label``, image not
      [n, 32, 32, 3] or not integers in 0..255, labels not [n] or out of range.
    ImportError: h5py is not installed.
  """
  def convert(cid, a, fail):
    x = a["image"]
    _check_images(cid, "image", x, (32, 32, 3), fail)
    if x.dtype != np.uint8:
      if not np.issubdtype(x.dtype, np.integer):
        fail(f"client {cid!r}: 'image' has dtype {x.dtype}, expected uint8")
      if x.size and (x.min() < 0 or x.max() > 255):
        fail(f"client {cid!r}: 'image' values outside 0..255")
    n = x.shape[0]
    y = _check_labels(cid, "label", a["label"], n, CIFAR100_NUM_CLASSES, fail)
    c = _check_labels(cid, "coarse_label", a["coarse_label"], n,
                      CIFAR100_NUM_COARSE, fail)
    return x.astype(np.uint8), y, c

  return _read_h5_clients(path, "cifar100", ("image", "label", "coarse_label"),
                          convert)


def _decode_snippet(s: Any) -> str:
  if isinstance(s, (bytes, np.bytes_)):
    return bytes(s).decode("utf-8")
  if isinstance(s, str):
    return s
  raise TypeError(type(s).__name__)


def read_tff_shakespeare(path: PathLike) -> dict[str, list[str]]:
  """Reads ``shakespeare_{train,test}.h5``.

  Source: TFF ``tff.simulation.datasets.shakespeare.load_data``: 715 clients,
  one per speaking role of a play (id ``<PLAY>_<ROLE>``), each
  ``examples/<id>/snippets`` [n] variable-length byte strings, one snippet
  being the lines of one contiguous speech (lines joined by ``\\n``).

  Args:
    path: the ``.h5`` file.

  Returns:
    client id -> list of n snippets (``str``, decoded as UTF-8); ids sorted.

  Raises:
    FileNotFoundError: ``path`` does not exist.
    DataFileError: not HDF5 / truncated, no ``examples`` group, no clients, a
      client without ``snippets``, snippets not a 1-D array of strings or not
      valid UTF-8.
    ImportError: h5py is not installed.
  """
  def convert(cid, a, fail):
    s = np.asarray(a["snippets"])
    if s.ndim != 1:
      fail(f"client {cid!r}: 'snippets' has shape {s.shape}, expected [n]")
    try:
      return [_decode_snippet(v) for v in s.tolist()]
    except UnicodeDecodeError as e:
      fail(f"client {cid!r}: a snippet is not valid UTF-8 ({e.reason})")
    except TypeError as e:
      fail(f"client {cid!r}: 'snippets' holds {e} values (dtype {s.dtype}), "
           "expected variable-length strings")

  return _read_h5_clients(path, "shakespeare", ("snippets",), convert)


# ----------------------------------------------------------------------------
# LEAF JSON reader.


def _leaf_split_dir(folder: str, dataset: str, split: str) -> str:
  for cand in _leaf_candidates(folder, dataset, split):
    if _has_json(cand):
      return cand
  if os.path.basename(os.path.normpath(folder)) == split and _has_json(folder):
    return folder  # the split folder itself (as find_files returns it)
  raise FileNotFoundError(
      f"{folder}: no LEAF {split} *.json files in {folder} or its "
      f"{dataset}/data/{split}, {dataset}/{split}, data/{split}, {split} "
      f"sub-folders; {_leaf_fix(dataset)}")


def _load_leaf_json(path: str, dataset: str) -> tuple[list, list, dict]:
  fix = _leaf_fix(dataset)
  try:
    with open(path, "rb") as f:
      data = json.loads(f.read().decode("utf-8"))
  except json.JSONDecodeError as e:
    raise DataFileError(path, f"invalid or truncated JSON ({e.msg} at line "
                        f"{e.lineno} column {e.colno})", fix) from None
  except UnicodeDecodeError as e:
    raise DataFileError(path, f"not UTF-8 text ({e.reason})", fix) from None
  if not isinstance(data, dict):
    raise DataFileError(path, f"top level is a {type(data).__name__}, expected "
                        "an object with users/num_samples/user_data", fix)
  for key, typ in (("users", list), ("num_samples", list), ("user_data", dict)):
    if key not in data:
      raise DataFileError(path, f"missing the {key!r} key", fix)
    if not isinstance(data[key], typ):
      raise DataFileError(path, f"{key!r} is a {type(data[key]).__name__}, "
                          f"expected a {typ.__name__}", fix)
  users, counts = data["users"], data["num_samples"]
  if len(users) != len(counts):
    raise DataFileError(path, f"'users' has {len(users)} entries but "
                        f"'num_samples' has {len(counts)}", fix)
  bad = next((u for u in users if not isinstance(u, str)), None)
  if bad is not None:
    raise DataFileError(path, f"'users' holds {bad!r}, expected string ids", fix)
  bad = next((c for c in counts
              if not isinstance(c, int) or isinstance(c, bool) or c < 0), None)
  if bad is not None:
    raise DataFileError(path, f"'num_samples' holds {bad!r}, expected counts", fix)
  if len(set(users)) != len(users):
    raise DataFileError(path, "a user is listed twice in 'users'", fix)
  return users, counts, data["user_data"]


def _leaf_femnist_user(x: list, y: list, fail: Callable):
  bad = next((j for j, r in enumerate(x)
              if not isinstance(r, list) or len(r) != FEMNIST_PIXELS), None)
  if bad is not None:
    r = x[bad]
    what = f"{len(r)} values" if isinstance(r, list) else type(r).__name__
    fail(f"x[{bad}] has {what}, expected a flat list of {FEMNIST_PIXELS} pixels")
  try:
    xa = np.asarray(x, dtype=np.float32).reshape(len(x), 28, 28)
  except (TypeError, ValueError):
    fail("x holds non-numeric pixel values")
  if not all(isinstance(v, int) and not isinstance(v, bool) for v in y):
    fail("y holds non-integer labels")
  ya = np.asarray(y, dtype=np.int64).reshape(len(y))
  if len(ya) and (ya.min() < 0 or ya.max() >= EMNIST_NUM_CLASSES):
    fail(f"y out of range [{ya.min()}, {ya.max()}], expected 0.."
         f"{EMNIST_NUM_CLASSES - 1}")
  return xa, ya.astype(np.int32)


def _leaf_shakespeare_user(x: list, y: list, fail: Callable):
  bad = next((j for j, s in enumerate(x) if not isinstance(s, str)), None)
  if bad is not None:
    fail(f"x[{bad}] is a {type(x[bad]).__name__}, expected a string")
  bad = next((j for j, s in enumerate(y)
              if not isinstance(s, str) or len(s) != 1), None)
  if bad is not None:
    fail(f"y[{bad}] is {y[bad]!r}, expected a single character")
  return list(x), list(y)


def read_leaf(folder: PathLike, dataset: str, split: str) -> dict[str, tuple]:
  """Reads one split of a LEAF JSON dataset (FEMNIST or Shakespeare).

  Source: LEAF (Caldas et al. 2019, https://github.com/TalwalkarLab/leaf),
  ``data/utils/split_data.py`` output: ``<split>/*.json`` each holding
  ``users``, ``num_samples`` and ``user_data`` (``{user: {"x", "y"}}``).
  Users present in several files are concatenated in file-name order; entries
  of ``user_data`` not listed in ``users`` are ignored (LEAF's by-sample split
  leaves empty ones there).

  Args:
    folder: the LEAF root (containing ``<split>/``, ``data/<split>/`` or
      ``<dataset>/data/<split>/``) or the split folder itself (as returned
      by `find_files`).
    dataset: ``'femnist'`` or ``'shakespeare'``.
    split: ``'train'`` or ``'test'``.

  Returns:
    user id -> ``(x, y)``, ids sorted.  femnist: x float32 [n, 28, 28],
    y int32 [n] in 0..61.  shakespeare: x list of n strings (80 characters
    each in LEAF's files), y list of n one-character strings (the next
    character); see `leaf_shakespeare_examples`.

  Raises:
    ValueError: ``dataset`` not femnist/shakespeare.
    FileNotFoundError: no ``*.json`` files found.
    DataFileError (naming the JSON file): invalid/truncated JSON; a missing
      ``users``/``num_samples``/``user_data`` key; a listed user without data;
      ``num_samples[i]`` != ``len(y)`` or ``len(x)`` != ``len(y)``; a FEMNIST
      row not of 784 values or a label outside 0..61; a Shakespeare ``y`` not
      one character; no users at all (empty dataset).
  """
  if dataset not in ("femnist", "shakespeare"):
    raise ValueError(f"LEAF has femnist and shakespeare, not {dataset!r}")
  folder = os.fspath(folder)
  split_dir = _leaf_split_dir(folder, dataset, split)
  convert = _leaf_femnist_user if dataset == "femnist" else _leaf_shakespeare_user
  fix = _leaf_fix(dataset)
  parts: dict[str, list] = {}
  for name in sorted(n for n in os.listdir(split_dir) if n.endswith(".json")):
    path = os.path.join(split_dir, name)
    users, counts, user_data = _load_leaf_json(path, dataset)
    for user, count in zip(users, counts):
      def fail(problem, user=user):
        raise DataFileError(path, f"user {user!r}: {problem}", fix)
      entry = user_data.get(user)
      if entry is None:
        fail("listed in 'users' but has no entry in 'user_data'")
      if not isinstance(entry, dict) or "x" not in entry or "y" not in entry:
        fail("user_data entry lacks the 'x' or 'y' key")
      x, y = entry["x"], entry["y"]
      if not isinstance(x, list) or not isinstance(y, list):
        fail("'x' and 'y' must be lists")
      if len(x) != len(y):
        fail(f"len(x) = {len(x)} but len(y) = {len(y)}")
      if count != len(y):
        fail(f"num_samples says {count} but user_data has {len(y)} samples")
      parts.setdefault(str(user), []).append(convert(x, y, fail))
  if not parts:
    raise DataFileError(split_dir, f"no users in any {split} JSON file (empty "
                        "dataset)", fix)
  out = {}
  for user in sorted(parts):
    ps = parts[user]
    if dataset == "femnist":
      out[user] = (np.concatenate([p[0] for p in ps]),
                   np.concatenate([p[1] for p in ps]))
    else:
      out[user] = ([s for p in ps for s in p[0]], [s for p in ps for s in p[1]])
  return out


# ----------------------------------------------------------------------------
# Shakespeare text -> next-character examples.


def char_ids(text: str) -> np.ndarray:
  """Maps text to LEAF character ids.

  Source: LEAF ``models/utils/language_utils.py`` (``ALL_LETTERS``,
  ``word_to_indices``); unlike LEAF (which maps unknown characters to -1),
  characters outside `SHAKESPEARE_VOCAB` get `SHAKESPEARE_OOV_ID` (80).

  Args:
    text: any string.

  Returns:
    int32 [len(text)] ids in 0..80.
  """
  codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
  out = np.full(codes.shape, SHAKESPEARE_OOV_ID, dtype=np.int32)
  ascii_ = codes < 128
  out[ascii_] = _CHAR_TABLE[codes[ascii_]]
  return out


def _as_rng(rng) -> np.random.Generator:
  if rng is None:
    return np.random.default_rng(0)
  if isinstance(rng, np.random.Generator):
    return rng
  return np.random.default_rng(rng)


def next_char_examples(snippets: Sequence[str], seq_len: int = SHAKESPEARE_SEQ_LEN,
                       max_examples: Optional[int] = None,
                       rng: Union[None, int, np.random.Generator] = None
                       ) -> tuple[np.ndarray, np.ndarray]:
  """Builds LEAF's next-character task from one client's TFF snippets.

  For every snippet (separately; snippets are not joined) and every character
  position ``t >= 1`` of it: ``x`` = the ``seq_len`` characters before ``t``
  (left-padded with `SHAKESPEARE_PAD_ID` when ``t < seq_len``), ``y`` = the
  character at ``t``.  This is the LEAF Shakespeare task (x = 80 previous
  characters, y = the next one; Caldas et al. 2019) built from TFF's
  ``tff.simulation.datasets.shakespeare`` snippets.  Ids from `char_ids`.

  Args:
    snippets: the client's snippets.
    seq_len: context length (80 in LEAF).
    max_examples: if set and the client has more examples, keep a uniformly
      random subset of this many (without replacement, in original order).
    rng: ``np.random.Generator``, seed, or None (seed 0: deterministic).

  Returns:
    ``(x, y)``: x int32 [m, seq_len] in 0..81, y int32 [m] in 0..80, where
    m = sum(max(len(s) - 1, 0)) (or ``min(m, max_examples)``).

  Raises:
    ValueError: ``seq_len`` < 1 or ``max_examples`` < 0.
  """
  if seq_len < 1:
    raise ValueError(f"seq_len must be >= 1, got {seq_len}")
  if max_examples is not None and max_examples < 0:
    raise ValueError(f"max_examples must be >= 0, got {max_examples}")
  pad = np.full(seq_len, SHAKESPEARE_PAD_ID, dtype=np.int32)
  buf, starts, off = [], [], 0
  for s in snippets:
    ids = char_ids(s)
    if len(ids) >= 2:
      buf += [pad, ids]
      # Example t of this snippet: x = stream[off+t : off+t+seq_len],
      # y = stream[off+t+seq_len] (= ids[t]).
      starts.append(off + np.arange(1, len(ids), dtype=np.int64))
      off += seq_len + len(ids)
  if not starts:
    return np.zeros((0, seq_len), np.int32), np.zeros((0,), np.int32)
  stream = np.concatenate(buf)
  starts = np.concatenate(starts)
  if max_examples is not None and len(starts) > max_examples:
    keep = _as_rng(rng).choice(len(starts), size=max_examples, replace=False)
    starts = starts[np.sort(keep)]
  x = stream[starts[:, None] + np.arange(seq_len)]
  y = stream[starts + seq_len]
  return x.astype(np.int32), y.astype(np.int32)


def leaf_shakespeare_examples(xs: Sequence[str], ys: Sequence[str],
                              seq_len: int = SHAKESPEARE_SEQ_LEN
                              ) -> tuple[np.ndarray, np.ndarray]:
  """Converts LEAF Shakespeare strings to the arrays of `next_char_examples`.

  Source: LEAF ``models/shakespeare`` (``word_to_indices`` for x,
  ``letter_to_vec`` for y), ids from `char_ids`.

  Args:
    xs: n context strings (80 characters in LEAF's files); longer ones keep
      their last ``seq_len`` characters, shorter ones are left-padded with
      `SHAKESPEARE_PAD_ID`.
    ys: n next characters (one-character strings).
    seq_len: context length.

  Returns:
    ``(x, y)``: x int32 [n, seq_len], y int32 [n].

  Raises:
    ValueError: ``len(xs) != len(ys)`` or a ``y`` not one character.
  """
  if len(xs) != len(ys):
    raise ValueError(f"{len(xs)} x strings but {len(ys)} y characters")
  x = np.full((len(xs), seq_len), SHAKESPEARE_PAD_ID, dtype=np.int32)
  for i, s in enumerate(xs):
    ids = char_ids(s)[-seq_len:]
    if len(ids):
      x[i, seq_len - len(ids):] = ids
  if any(len(c) != 1 for c in ys):
    raise ValueError("every y must be a single character")
  y = char_ids("".join(ys))
  return x, y


# ----------------------------------------------------------------------------
# Fixture writers (exact published layouts; atomic).


def _atomic_write(path: PathLike, write: Callable[[str], None]) -> str:
  """Runs ``write(tmp)`` on a temp name in path's folder, then renames."""
  path = os.fspath(path)
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".",
                             suffix=".tmp")
  os.close(fd)
  try:
    write(tmp)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
  return path


def _write_h5(path: PathLike, clients: dict[str, dict[str, np.ndarray]]) -> str:
  h5py = _h5py()

  def write(tmp):
    with h5py.File(tmp, "w") as f:
      group = f.create_group("examples")
      for cid, arrays in clients.items():
        g = group.create_group(str(cid))
        for name, values in sorted(arrays.items()):
          g.create_dataset(name, data=values)

  return _atomic_write(path, write)


def _fixture_arrays(cid, x, labels: dict[str, Any], shape, dtype):
  x = np.asarray(x, dtype=dtype)
  if x.ndim != len(shape) + 1 or x.shape[1:] != shape:
    raise ValueError(f'client {cid!r}: x has shape {x.shape}, expected [n, '
                     f'{", ".join(map(str, shape))}]')
  out = {}
  for name, (values, ldtype) in labels.items():
    values = np.asarray(values, dtype=ldtype).reshape(-1)
    if len(values) != len(x):
      raise ValueError(f"client {cid!r}: {len(values)} {name} for {len(x)} examples")
    out[name] = values
  return x, out


def write_tff_emnist(path: PathLike, clients: dict[str, tuple]) -> str:
  """Writes a fixture in the ``fed_emnist_*.h5`` layout (`read_tff_emnist`).

  Args:
    path: output ``.h5`` file (written atomically).
    clients: id -> ``(x, y)``, x [n, 28, 28] (stored float32 ``pixels``),
      y [n] (stored int32 ``label``; the range is not checked, so damaged
      fixtures can be written).

  Returns:
    ``path`` as a string.

  Raises:
    ValueError: wrong shapes.  ImportError: no h5py.
  """
  data = {}
  for cid, (x, y) in clients.items():
    x, labels = _fixture_arrays(cid, x, {"label": (y, np.int32)}, (28, 28),
                                np.float32)
    data[cid] = {"pixels": x, **labels}
  return _write_h5(path, data)


def write_tff_cifar100(path: PathLike, clients: dict[str, tuple]) -> str:
  """Writes a fixture in the ``fed_cifar100_*.h5`` layout (`read_tff_cifar100`).

  Args:
    path: output ``.h5`` file (written atomically).
    clients: id -> ``(x, y, coarse)``, x [n, 32, 32, 3] (stored uint8
      ``image``), y and coarse [n] (stored int64 ``label`` / ``coarse_label``,
      the dtype TFF documents; ranges not checked).

  Returns:
    ``path`` as a string.

  Raises:
    ValueError: wrong shapes.  ImportError: no h5py.
  """
  data = {}
  for cid, (x, y, coarse) in clients.items():
    x, labels = _fixture_arrays(
        cid, x, {"label": (y, np.int64), "coarse_label": (coarse, np.int64)},
        (32, 32, 3), np.uint8)
    data[cid] = {"image": x, **labels}
  return _write_h5(path, data)


def write_tff_shakespeare(path: PathLike, clients: dict[str, Sequence[str]]) -> str:
  """Writes a fixture in the ``shakespeare_*.h5`` layout (`read_tff_shakespeare`).

  Args:
    path: output ``.h5`` file (written atomically).
    clients: id -> list of snippets, stored as ``snippets`` [n]
      variable-length UTF-8 strings (read back as bytes, like TFF's file).

  Returns:
    ``path`` as a string.

  Raises:
    ImportError: no h5py.
  """
  h5py = _h5py()
  dt = h5py.string_dtype(encoding="utf-8")
  data = {cid: {"snippets": np.array([s.encode("utf-8") for s in snips],
                                     dtype=dt).reshape(-1)}
          for cid, snips in clients.items()}
  return _write_h5(path, data)


def write_leaf(folder: PathLike, dataset: str, split: str,
               clients: dict[str, tuple], users_per_file: int = 100,
               start_index: int = 0) -> list[str]:
  """Writes a fixture in LEAF's JSON layout (`read_leaf`).

  Files are ``folder/<split>/all_data_<k>_niid_0_keep_0_<split>_9.json``
  (LEAF's ``split_data.py`` naming), ``k = start_index, start_index + 1, ...``,
  each with at most ``users_per_file`` users, keys ``users``, ``num_samples``
  and ``user_data``.  Call twice with different ``start_index`` to spread one
  user over several files.

  Args:
    folder: the LEAF root (``<split>/`` is created inside).
    dataset: ``'femnist'`` (x [n, 28, 28] or [n, 784] numbers written as flat
      784-float lists, y ints) or ``'shakespeare'`` (x list of strings,
      y list of one-character strings).
    split: ``'train'`` or ``'test'``.
    clients: user id -> ``(x, y)``.
    users_per_file: users per JSON file (>= 1).
    start_index: first file index k.

  Returns:
    the written file paths.

  Raises:
    ValueError: unknown dataset, ``users_per_file`` < 1, len(x) != len(y).
  """
  if dataset not in ("femnist", "shakespeare"):
    raise ValueError(f"LEAF has femnist and shakespeare, not {dataset!r}")
  if users_per_file < 1:
    raise ValueError(f"users_per_file must be >= 1, got {users_per_file}")
  split_dir = os.path.join(os.fspath(folder), split)
  entries = []
  for user, (x, y) in clients.items():
    if dataset == "femnist":
      x = np.asarray(x, dtype=np.float32).reshape(-1, FEMNIST_PIXELS).tolist()
      y = [int(v) for v in np.asarray(y).reshape(-1)]
    else:
      x, y = [str(s) for s in x], [str(c) for c in y]
    if len(x) != len(y):
      raise ValueError(f"user {user!r}: {len(x)} x but {len(y)} y")
    entries.append((str(user), {"x": x, "y": y}))
  paths = []
  for i in range(0, len(entries), users_per_file):
    chunk = entries[i:i + users_per_file]
    k = start_index + i // users_per_file
    doc = {"users": [u for u, _ in chunk],
           "num_samples": [len(d["y"]) for _, d in chunk],
           "user_data": dict(chunk)}
    path = os.path.join(split_dir, f"all_data_{k}_niid_0_keep_0_{split}_9.json")

    def write(tmp, doc=doc):
      with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f)

    paths.append(_atomic_write(path, write))
  return paths
