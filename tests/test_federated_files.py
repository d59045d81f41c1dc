"""Readers/writers of the published federated files (fedjax_inv/data/federated_files.py).

Fixtures are written with the module's writers AND checked with raw h5py/json,
so a writer bug cannot hide a reader bug.  Real files are never downloaded.
"""

from __future__ import annotations

import json
import os
import sys

import h5py
import numpy as np
import pytest

from fedjax_inv.data import federated_files as ff

P = ff.SHAKESPEARE_PAD_ID
O = ff.SHAKESPEARE_OOV_ID


# ----------------------------------------------------------------------------
# Small client data.


def _emnist_clients(seed=0):
  rng = np.random.default_rng(seed)
  # Insertion order deliberately unsorted.
  return {cid: (rng.random((n, 28, 28), dtype=np.float32),
                rng.integers(0, 62, n).astype(np.int32))
          for cid, n in (("f0002_1", 3), ("f0000_14", 2), ("f0001_07", 1))}


def _cifar_clients(seed=0):
  rng = np.random.default_rng(seed)
  return {cid: (rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
                rng.integers(0, 100, n), rng.integers(0, 20, n))
          for cid, n in (("3", 2), ("10", 1), ("0", 3))}


SHAKES = {
    "THE_TRAGEDY_OF_KING_LEAR_MACBETH": ["Hark!", "My name's Macbeth.\nAy, sir."],
    "MUCH_ADO_ABOUT_NOTHING_EMILIA": ["Never.", "Caf\u00e9 \u2014 non-ASCII ~ text", ""],
}


def _femnist_leaf_clients(seed=0):
  rng = np.random.default_rng(seed)
  return {u: (rng.random((n, 28, 28), dtype=np.float32), rng.integers(0, 62, n))
          for u, n in (("f3000_2", 2), ("f1000_4", 3))}


def _shakes_leaf_clients():
  text = "To be, or not to be: that is the question:\nWhether 'tis nobler in the mind"
  text = text * 3
  xs = [text[i:i + 80] for i in range(4)]
  ys = [text[i + 80] for i in range(4)]
  return {"HAMLET_HAMLET": (xs, ys), "AS_YOU_LIKE_IT_ADAM": (xs[:2], ys[:2])}


# ----------------------------------------------------------------------------
# Round trips + raw layout checks.


def test_tff_emnist_round_trip_and_layout(tmp_path):
  clients = _emnist_clients()
  path = ff.write_tff_emnist(tmp_path / "fed_emnist_train.h5", clients)
  with h5py.File(path, "r") as f:  # the published layout, checked raw
    assert list(f.keys()) == ["examples"]
    assert sorted(f["examples"].keys()) == sorted(clients)
    for cid, (x, _y) in clients.items():
      g = f["examples"][cid]
      assert sorted(g.keys()) == ["label", "pixels"]
      assert g["pixels"].shape == (len(x), 28, 28) and g["pixels"].dtype == np.float32
      assert g["label"].shape == (len(x),) and g["label"].dtype == np.int32
      np.testing.assert_array_equal(g["pixels"][()], x)
  out = ff.read_tff_emnist(path)
  assert list(out) == sorted(clients)
  for cid, (x, y) in clients.items():
    assert out[cid][0].dtype == np.float32 and out[cid][1].dtype == np.int32
    np.testing.assert_array_equal(out[cid][0], x)
    np.testing.assert_array_equal(out[cid][1], y)
  assert [n for n in os.listdir(tmp_path)] == ["fed_emnist_train.h5"]  # no temp left


def test_tff_cifar100_round_trip_and_layout(tmp_path):
  clients = _cifar_clients()
  path = ff.write_tff_cifar100(tmp_path / "fed_cifar100_test.h5", clients)
  with h5py.File(path, "r") as f:
    for cid, (x, _y, c) in clients.items():
      g = f["examples"][cid]
      assert sorted(g.keys()) == ["coarse_label", "image", "label"]
      assert g["image"].shape == (len(x), 32, 32, 3) and g["image"].dtype == np.uint8
      assert g["label"].shape == (len(x),) and g["coarse_label"].shape == (len(x),)
      np.testing.assert_array_equal(g["coarse_label"][()], c)
  out = ff.read_tff_cifar100(path)
  assert list(out) == ["0", "10", "3"]
  for cid, (x, y, c) in clients.items():
    ox, oy, oc = out[cid]
    assert (ox.dtype, oy.dtype, oc.dtype) == (np.uint8, np.int32, np.int32)
    np.testing.assert_array_equal(ox, x)
    np.testing.assert_array_equal(oy, y)
    np.testing.assert_array_equal(oc, c)


def test_tff_shakespeare_round_trip_and_layout(tmp_path):
  path = ff.write_tff_shakespeare(tmp_path / "shakespeare_train.h5", SHAKES)
  with h5py.File(path, "r") as f:
    for cid, snippets in SHAKES.items():
      ds = f["examples"][cid]["snippets"]
      assert ds.shape == (len(snippets),)
      assert h5py.check_string_dtype(ds.dtype) is not None  # variable-length strings
      raw = ds[()]
      assert all(isinstance(v, bytes) for v in raw)  # bytes, like TFF's file
      assert [v.decode("utf-8") for v in raw] == snippets
  out = ff.read_tff_shakespeare(path)
  assert list(out) == sorted(SHAKES)
  assert out == SHAKES


def test_leaf_femnist_round_trip_layout_and_merge(tmp_path):
  clients = _femnist_leaf_clients()
  paths = ff.write_leaf(tmp_path, "femnist", "train", clients, users_per_file=1)
  assert [os.path.basename(p) for p in paths] == [
      "all_data_0_niid_0_keep_0_train_9.json", "all_data_1_niid_0_keep_0_train_9.json"]
  with open(paths[0]) as f:
    doc = json.load(f)
  assert sorted(doc) == ["num_samples", "user_data", "users"]
  (u,) = doc["users"]
  assert doc["num_samples"] == [len(clients[u][1])]
  assert all(len(row) == 784 and isinstance(row[0], float)
             for row in doc["user_data"][u]["x"])
  assert all(isinstance(v, int) for v in doc["user_data"][u]["y"])
  out = ff.read_leaf(tmp_path, "femnist", "train")
  assert list(out) == sorted(clients)
  for u, (x, y) in clients.items():
    assert out[u][0].dtype == np.float32 and out[u][0].shape == x.shape
    assert out[u][1].dtype == np.int32
    np.testing.assert_array_equal(out[u][0], x)
    np.testing.assert_array_equal(out[u][1], y)
  # One user spread over two files (plus another user) is merged in file order.
  x, y = clients["f1000_4"]
  ff.write_leaf(tmp_path, "femnist", "test", {"f1000_4": (x[:1], y[:1])})
  ff.write_leaf(tmp_path, "femnist", "test",
                {"f1000_4": (x[1:], y[1:]), "f0_0": clients["f3000_2"]},
                start_index=1)
  out = ff.read_leaf(tmp_path, "femnist", "test")
  assert list(out) == ["f0_0", "f1000_4"]
  np.testing.assert_array_equal(out["f1000_4"][0], x)
  np.testing.assert_array_equal(out["f1000_4"][1], y)


def test_leaf_shakespeare_round_trip_and_layout(tmp_path):
  clients = _shakes_leaf_clients()
  (path,) = ff.write_leaf(tmp_path / "data", "shakespeare", "test", clients)
  with open(path) as f:
    doc = json.load(f)
  u = doc["users"][0]
  assert all(isinstance(s, str) and len(s) == 80 for s in doc["user_data"][u]["x"])
  assert all(isinstance(c, str) and len(c) == 1 for c in doc["user_data"][u]["y"])
  out = ff.read_leaf(tmp_path, "shakespeare", "test")  # finds data/test
  assert list(out) == sorted(clients)
  assert {u: (list(x), list(y)) for u, (x, y) in clients.items()} == out


# ----------------------------------------------------------------------------
# find_files.


def test_find_files_hdf5_layouts(tmp_path):
  sub = tmp_path / "fed_emnist"
  for split in ("train", "test"):
    ff.write_tff_emnist(sub / f"fed_emnist_digitsonly_{split}.h5", _emnist_clients())
  layout, paths = ff.find_files(tmp_path, "femnist")
  assert layout == "hdf5"
  assert paths == {"train": str(sub / "fed_emnist_digitsonly_train.h5"),
                   "test": str(sub / "fed_emnist_digitsonly_test.h5")}
  for split in ("train", "test"):  # the 62-class files win over digits-only
    ff.write_tff_emnist(tmp_path / f"fed_emnist_{split}.h5", _emnist_clients())
  assert ff.find_files(tmp_path, "femnist")[1]["test"] == str(tmp_path / "fed_emnist_test.h5")
  for split in ("train", "test"):
    ff.write_tff_cifar100(tmp_path / f"fed_cifar100_{split}.h5", _cifar_clients())
    ff.write_tff_shakespeare(tmp_path / f"shakespeare_{split}.h5", SHAKES)
  assert ff.find_files(tmp_path, "cifar100") == ("hdf5", {
      "train": str(tmp_path / "fed_cifar100_train.h5"),
      "test": str(tmp_path / "fed_cifar100_test.h5")})
  layout, paths = ff.find_files(str(tmp_path), "shakespeare")
  assert layout == "hdf5" and ff.read_tff_shakespeare(paths["test"]) == SHAKES


@pytest.mark.parametrize("root", ["", "data", "femnist/data"])
def test_find_files_leaf_layouts(tmp_path, root):
  base = tmp_path / root
  for split in ("train", "test"):
    ff.write_leaf(base, "femnist", split, _femnist_leaf_clients())
  layout, paths = ff.find_files(tmp_path, "femnist")
  assert layout == "leaf"
  assert paths == {"train": str(base / "train"), "test": str(base / "test")}
  out = ff.read_leaf(paths["test"], "femnist", "test")  # the split folder itself
  assert list(out) == sorted(_femnist_leaf_clients())
  with pytest.raises(FileNotFoundError):  # a train folder is not read as 'test'
    ff.read_leaf(paths["train"], "femnist", "test")


@pytest.mark.parametrize("dataset,names", [
    ("femnist", ["fed_emnist_train.h5", "fed_emnist_digitsonly_test.h5",
                 "fed_emnist.tar.bz2", "preprocess.sh", "femnist/data/{train,test}"]),
    ("shakespeare", ["shakespeare_train.h5", "shakespeare_test.h5",
                     "shakespeare.tar.bz2", "preprocess.sh", "data/{train,test}"]),
    ("cifar100", ["fed_cifar100_train.h5", "fed_cifar100_test.h5",
                  "fed_cifar100.tar.bz2"]),
])
def test_find_files_not_found_message(tmp_path, dataset, names):
  (tmp_path / "train").mkdir()  # a LEAF folder without its test half is not enough
  ff.write_leaf(tmp_path, "femnist", "train", _femnist_leaf_clients())
  with pytest.raises(FileNotFoundError) as e:
    ff.find_files(tmp_path, dataset)
  msg = str(e.value)
  assert "\n" not in msg and str(tmp_path) in msg
  assert "https://storage.googleapis.com/tff-datasets-public/" in msg
  for name in names:
    assert name in msg
  if dataset == "cifar100":
    assert "LEAF" not in msg
  with pytest.raises(ValueError):
    ff.find_files(tmp_path, "mnist")


# ----------------------------------------------------------------------------
# Damaged files -> one-line DataFileError naming the file and the problem.


def _h5_edit(path, fn):
  with h5py.File(path, "r+") as f:
    fn(f)
  return path


def _emnist_file(tmp_path):
  return ff.write_tff_emnist(tmp_path / "fed_emnist_train.h5", _emnist_clients())


def _replace(f, name, data):
  del f[name]
  f[name] = data


def _emnist_case(edit, keyword):
  def make(tmp_path):
    return _h5_edit(_emnist_file(tmp_path), edit), ff.read_tff_emnist, keyword
  return make


def _cifar_case(edit, keyword):
  def make(tmp_path):
    path = ff.write_tff_cifar100(tmp_path / "fed_cifar100_train.h5", _cifar_clients())
    return _h5_edit(path, edit), ff.read_tff_cifar100, keyword
  return make


def _raw_h5(tmp_path, build, reader, keyword):
  path = str(tmp_path / "shakespeare_test.h5")
  with h5py.File(path, "w") as f:
    build(f)
  return path, reader, keyword


def _truncated(tmp_path):
  path = _emnist_file(tmp_path)
  size = os.path.getsize(path)
  with open(path, "r+b") as f:
    f.truncate(size // 2)
  return path, ff.read_tff_emnist, "HDF5"


def _not_hdf5(tmp_path):
  path = tmp_path / "fed_cifar100_test.h5"
  path.write_text("<html>404 Not Found</html>\n")
  return str(path), ff.read_tff_cifar100, "HDF5"


def _shakes_bad_snippets(tmp_path):
  path = ff.write_tff_shakespeare(tmp_path / "shakespeare_train.h5", SHAKES)
  cid = "MUCH_ADO_ABOUT_NOTHING_EMILIA"
  _h5_edit(path, lambda f: _replace(f, f"examples/{cid}/snippets", np.arange(3)))
  return path, ff.read_tff_shakespeare, "strings"


def _leaf_case(edit, keyword, dataset="femnist"):
  """Writes a valid 2-file LEAF train split, then edits the first file's JSON."""
  def make(tmp_path):
    clients = _femnist_leaf_clients() if dataset == "femnist" else _shakes_leaf_clients()
    paths = ff.write_leaf(tmp_path, dataset, "train", clients, users_per_file=1)
    with open(paths[0]) as f:
      doc = json.load(f)
    text = edit(doc)
    with open(paths[0], "w") as f:
      f.write(text if isinstance(text, str) else json.dumps(doc))
    return paths[0], lambda p: ff.read_leaf(tmp_path, dataset, "train"), keyword
  return make


def _first_user(doc):
  return doc["user_data"][doc["users"][0]]


def _leaf_empty(tmp_path):
  split = tmp_path / "train"
  split.mkdir()
  (split / "all_data_0_niid_0_keep_0_train_9.json").write_text(
      json.dumps({"users": [], "num_samples": [], "user_data": {}}))
  return str(split), lambda p: ff.read_leaf(tmp_path, "femnist", "train"), "empty"


C = "f0000_14"
DAMAGED = {
    "no_examples_group": lambda t: _raw_h5(
        t, lambda f: f.create_group("data"), ff.read_tff_shakespeare, "'examples'"),
    "no_clients": lambda t: _raw_h5(
        t, lambda f: f.create_group("examples"), ff.read_tff_shakespeare, "empty"),
    "emnist_no_label": _emnist_case(lambda f: f.__delitem__(f"examples/{C}/label"),
                                    "has no 'label' dataset"),
    "emnist_no_pixels": _emnist_case(lambda f: f.__delitem__(f"examples/{C}/pixels"),
                                     "has no 'pixels' dataset"),
    "emnist_pixels_shape": _emnist_case(
        lambda f: _replace(f, f"examples/{C}/pixels", np.zeros((2, 28, 27), np.float32)),
        "shape"),
    "emnist_label_length": _emnist_case(
        lambda f: _replace(f, f"examples/{C}/label", np.zeros(3, np.int32)), "label"),
    "emnist_label_range": _emnist_case(
        lambda f: _replace(f, f"examples/{C}/label", np.array([0, 62], np.int32)),
        "out of range"),
    "emnist_label_negative": _emnist_case(
        lambda f: _replace(f, f"examples/{C}/label", np.array([-1, 0], np.int32)),
        "out of range"),
    "cifar_no_image": _cifar_case(lambda f: f.__delitem__("examples/10/image"),
                                  "has no 'image' dataset"),
    "cifar_no_coarse": _cifar_case(lambda f: f.__delitem__("examples/0/coarse_label"),
                                   "'coarse_label'"),
    "cifar_image_shape": _cifar_case(
        lambda f: _replace(f, "examples/10/image", np.zeros((1, 32, 32), np.uint8)),
        "shape"),
    "cifar_label_range": _cifar_case(
        lambda f: _replace(f, "examples/10/label", np.array([100])), "out of range"),
    "cifar_coarse_range": _cifar_case(
        lambda f: _replace(f, "examples/10/coarse_label", np.array([20])), "out of range"),
    "shakespeare_no_snippets": lambda t: _raw_h5(
        t, lambda f: f.create_group("examples/ROLE"), ff.read_tff_shakespeare,
        "has no 'snippets' dataset"),
    "shakespeare_numeric_snippets": _shakes_bad_snippets,
    "hdf5_truncated": _truncated,
    "not_hdf5": _not_hdf5,
    "leaf_truncated_json": _leaf_case(lambda d: json.dumps(d)[:200], "JSON"),
    "leaf_no_users": _leaf_case(lambda d: d.pop("users"), "'users'"),
    "leaf_no_num_samples": _leaf_case(lambda d: d.pop("num_samples"), "'num_samples'"),
    "leaf_no_user_data": _leaf_case(lambda d: d.pop("user_data"), "'user_data'"),
    "leaf_num_samples_mismatch": _leaf_case(
        lambda d: d["num_samples"].__setitem__(0, 99), "num_samples"),
    "leaf_x_y_length": _leaf_case(lambda d: _first_user(d)["y"].append(1), "len(x)"),
    "leaf_femnist_row": _leaf_case(lambda d: _first_user(d)["x"][0].pop(), "784"),
    "leaf_user_without_data": _leaf_case(lambda d: d["user_data"].clear(),
                                         "no entry"),
    "leaf_femnist_label_range": _leaf_case(
        lambda d: _first_user(d)["y"].__setitem__(0, 62), "out of range"),
    "leaf_shakespeare_y": _leaf_case(
        lambda d: _first_user(d)["y"].__setitem__(0, "ab"), "single character",
        dataset="shakespeare"),
    "leaf_empty": _leaf_empty,
}


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_damaged_file_raises_one_line_error(tmp_path, case):
  path, reader, keyword = DAMAGED[case](tmp_path)
  with pytest.raises(ff.DataFileError) as e:
    reader(path)
  msg = str(e.value)
  assert "\n" not in msg
  assert msg.startswith(str(path) + ": ")
  assert keyword in msg
  assert isinstance(e.value, ValueError) and e.value.path == str(path)


def test_missing_h5py_message(monkeypatch, tmp_path):
  monkeypatch.setitem(sys.modules, "h5py", None)
  path = tmp_path / "fed_emnist_train.h5"
  path.write_bytes(b"")
  with pytest.raises(ImportError, match=r"pip install h5py \(or fedjax_inv\[federated\]\)"):
    ff.read_tff_emnist(path)


# ----------------------------------------------------------------------------
# Shakespeare text -> next-character examples.


def test_vocab_constants():
  assert len(ff.SHAKESPEARE_VOCAB) == 80 == len(set(ff.SHAKESPEARE_VOCAB))
  assert ff.SHAKESPEARE_VOCAB[0] == "\n" and ff.SHAKESPEARE_VOCAB[-1] == "}"
  assert (O, P, ff.SHAKESPEARE_VOCAB_SIZE) == (80, 81, 82)
  # LEAF's indices: ' ' 1, 'A' 25, 'a' 53; unknown ('~', non-ASCII) -> OOV.
  np.testing.assert_array_equal(ff.char_ids("a~ A\u00e9\n"), [53, O, 1, 25, O, 0])
  assert ff.char_ids("").shape == (0,) and ff.char_ids("ab").dtype == np.int32


def test_next_char_examples_hand_written():
  x, y = ff.next_char_examples(["ab c"], seq_len=3)
  a, b, sp, c = 53, 54, 1, 55
  np.testing.assert_array_equal(x, [[P, P, a], [P, a, b], [a, b, sp]])
  np.testing.assert_array_equal(y, [b, sp, c])
  assert x.dtype == np.int32 and y.dtype == np.int32
  # Per snippet (not joined); 0/1-char snippets give nothing; OOV kept as input/target.
  x, y = ff.next_char_examples(["ab", "", "c", "c~"], seq_len=2)
  np.testing.assert_array_equal(x, [[P, a], [P, c]])
  np.testing.assert_array_equal(y, [b, O])
  x, y = ff.next_char_examples([], seq_len=4)
  assert x.shape == (0, 4) and y.shape == (0,)


def test_next_char_examples_matches_brute_force():
  rng = np.random.default_rng(1)
  letters = list(ff.SHAKESPEARE_VOCAB) + ["~"]
  snippets = ["".join(rng.choice(letters, n)) for n in (1, 7, 12, 3)]
  seq_len = 5
  want_x, want_y = [], []
  for s in snippets:
    ids = list(ff.char_ids(s))
    for t in range(1, len(ids)):
      ctx = ids[max(0, t - seq_len):t]
      want_x.append([P] * (seq_len - len(ctx)) + ctx)
      want_y.append(ids[t])
  x, y = ff.next_char_examples(snippets, seq_len=seq_len)
  np.testing.assert_array_equal(x, want_x)
  np.testing.assert_array_equal(y, want_y)


def test_next_char_examples_max_examples():
  text = ["The quick brown fox jumps over the lazy dog, again and again."] * 2
  full_x, full_y = ff.next_char_examples(text, seq_len=8)
  m = len(full_y)
  x, y = ff.next_char_examples(text, seq_len=8, max_examples=10, rng=3)
  assert x.shape == (10, 8) and y.shape == (10,)
  # A subset of the full example list, kept in its original order.
  pos = _positions(full_x, full_y, x, y)
  assert pos == sorted(pos) and len(set(pos)) == 10
  again = ff.next_char_examples(text, seq_len=8, max_examples=10, rng=3)
  np.testing.assert_array_equal(again[0], x)  # deterministic for a seed
  x0, _ = ff.next_char_examples(text, seq_len=8, max_examples=10)  # None -> seed 0
  x0b, _ = ff.next_char_examples(text, seq_len=8, max_examples=10,
                                 rng=np.random.default_rng(0))
  np.testing.assert_array_equal(x0, x0b)
  assert not np.array_equal(
      ff.next_char_examples(text, seq_len=8, max_examples=10, rng=4)[0], x)
  x_all, _ = ff.next_char_examples(text, seq_len=8, max_examples=m + 5)
  np.testing.assert_array_equal(x_all, full_x)
  assert ff.next_char_examples(text, seq_len=8, max_examples=0)[0].shape == (0, 8)


def _positions(full_x, full_y, x, y):
  """Index of each (x, y) in the full list, matching left to right."""
  out, start = [], 0
  for r, t in zip(x, y):
    i = next(i for i in range(start, len(full_y))
             if full_y[i] == t and (full_x[i] == r).all())
    out.append(i)
    start = i + 1
  return out


def test_leaf_shakespeare_examples_match_next_char():
  (xs, ys), = [_shakes_leaf_clients()["HAMLET_HAMLET"]]
  x, y = ff.leaf_shakespeare_examples(xs, ys)
  assert x.shape == (4, 80) and x.dtype == np.int32 and y.dtype == np.int32
  text = xs[0] + "".join(ys)  # xs[i] = text[i:i+80], ys[i] = text[i+80]
  full_x, full_y = ff.next_char_examples([text], seq_len=80)
  np.testing.assert_array_equal(x, full_x[79:83])
  np.testing.assert_array_equal(y, full_y[79:83])
  sx, sy = ff.leaf_shakespeare_examples(["ab", "abcd"], ["c", "~"], seq_len=3)
  np.testing.assert_array_equal(sx, [[P, 53, 54], [54, 55, 56]])
  np.testing.assert_array_equal(sy, [55, O])
  with pytest.raises(ValueError):
    ff.leaf_shakespeare_examples(["ab"], ["cd"])


def test_writes_are_atomic(tmp_path, monkeypatch):
  (path,) = ff.write_leaf(tmp_path, "shakespeare", "train", _shakes_leaf_clients())
  before = open(path).read()

  def broken_dump(*args, **kwargs):
    raise RuntimeError("disk full")

  monkeypatch.setattr(ff.json, "dump", broken_dump)
  with pytest.raises(RuntimeError):
    ff.write_leaf(tmp_path, "shakespeare", "train", {"X": (["a"], ["b"])})
  assert os.listdir(tmp_path / "train") == [os.path.basename(path)]  # no temp left
  assert open(path).read() == before  # the old file is intact
