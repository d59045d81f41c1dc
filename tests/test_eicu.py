"""eICU task (FedILC §5.1.3) on generated CSVs with the documented schema."""
import csv

import numpy as np
import pytest

from fedjax_inv.data import eicu
from fedjax_inv.tasks import make_task

NUM_HOSPITALS = 25


def _write_csv(path, num_features, rows_of_hospital, seed=0, extra_id=True):
  """Hospital h (id 100 + h) gets rows_of_hospital(h) stays; features are 0/1 drugs; the
  label depends on drug 0 so the data are learnable. Returns the arrays written."""
  rng = np.random.default_rng(seed)
  header = (["patientunitstayid"] if extra_id else []) + ["hospital_id"] + [
      f"drug_{j}" for j in range(num_features)] + ["mortality"]
  hs, xs, ys = [], [], []
  for h in range(NUM_HOSPITALS):
    n = rows_of_hospital(h)
    x = (rng.random((n, num_features)) < 0.3).astype(np.int64)
    y = ((x[:, 0] + (rng.random(n) < 0.1)) % 2).astype(np.int64)
    hs += [100 + h] * n
    xs.append(x)
    ys.append(y)
  x = np.concatenate(xs)
  y = np.concatenate(ys)
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(header)
    for i, (h, xi, yi) in enumerate(zip(hs, x, y)):
      w.writerow(([1000 + i] if extra_id else []) + [h] + xi.tolist() + [yi])
  return np.asarray(hs), x, y


def size_of(h):
  # Hospitals 0..24 (ids 100..124) with 6..30 rows: the 20 largest are ids 105..124.
  return 6 + h


def test_task_splits_20_largest_hospitals_70_30(tmp_path):
  (tmp_path / "eicu").mkdir()
  hs, x, y = _write_csv(tmp_path / "eicu" / "eicu_drugs.csv", 12, size_of)
  task = make_task("eicu", data_dir=tmp_path, expected_features=None, hidden=(8, 4),
                   seed=1)
  assert task.kind == "binary"
  info = task.info
  assert info["train_hospitals"] == [str(100 + h) for h in range(24, 4, -1)]
  assert info["ood_hospitals"] == [str(100 + h) for h in range(5)]
  assert task.train.num_clients == 20 and task.eval_sets["val"].num_clients == 20
  assert task.eval_sets["ood"].num_clients == 1
  sizes = np.array([size_of(h) for h in range(24, 4, -1)])
  n_val = np.round(0.3 * sizes).astype(int)
  np.testing.assert_array_equal(task.eval_sets["val"].n, n_val)
  np.testing.assert_array_equal(task.train.n, sizes - n_val)
  assert int(task.eval_sets["ood"].n[0]) == sum(size_of(h) for h in range(5))
  # Train + val of the largest hospital are exactly its rows (as a multiset).
  k = 0
  rows = x[hs == 124]
  got = np.concatenate([np.asarray(task.train.x[k, : int(task.train.n[k])]),
                        np.asarray(task.eval_sets["val"].x[k, : int(
                            task.eval_sets["val"].n[k])])])
  assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, rows.astype(float).tolist()))
  # OOD set holds the OOD hospitals' rows and labels.
  ood = task.eval_sets["ood"]
  np.testing.assert_array_equal(np.sort(np.asarray(ood.y[0])),
                                np.sort(y[hs < 105]))
  # Model: MLP F-hidden-1, the patient-stay id is not a feature.
  assert info["num_features"] == 12
  assert task.model.apply(task.model.init(0), np.zeros((3, 12), np.float32)).shape == (3, 1)
  for key in ("paper", "dataset_source", "data_note"):
    assert key in info
  assert task.defaults["client_lr"] == 2e-4 and task.defaults["weight_decay"] == 1e-3
  # Seeded: same seed same split, other seed other split.
  again = make_task("eicu", data_dir=tmp_path, expected_features=None, hidden=(8,), seed=1)
  np.testing.assert_array_equal(again.train.x, task.train.x)
  other = make_task("eicu", data_dir=tmp_path, expected_features=None, hidden=(8,), seed=2)
  assert not np.array_equal(other.train.x, task.train.x)
  per_h = make_task("eicu", data_dir=tmp_path, expected_features=None, hidden=(8,),
                    ood_per_hospital=True)
  np.testing.assert_array_equal(per_h.eval_sets["ood"].n, [size_of(h) for h in range(5)])


def test_full_1399_columns_and_feature_override(tmp_path):
  path = tmp_path / "full.csv"
  _write_csv(path, eicu.NUM_DRUG_FEATURES, lambda h: 4, extra_id=False)
  task = make_task("eicu", path=path, hidden=(4,))
  assert task.train.feature_shape == (1399,)
  assert task.info["model"] == "MLP 1399-4-1"
  # Equal sizes everywhere: ties broken by hospital id.
  assert task.info["train_hospitals"] == [str(100 + h) for h in range(20)]
  sub = make_task("eicu", path=path, hidden=(4,), feature_columns=["drug_7", "drug_3"])
  assert sub.train.feature_shape == (2,)
  x, _, _, names = eicu.load_eicu_csv(path, feature_columns=["drug_7", "drug_3"])
  assert names == ["drug_7", "drug_3"] and x.shape == (100, 2)
  with pytest.raises(ValueError, match="1399 drug indicators"):
    make_task("eicu", path=_small(tmp_path))
  with pytest.raises(ValueError, match="not in"):
    make_task("eicu", path=path, feature_columns=["nope"])


def _small(tmp_path, name="small.csv", **kw):
  path = tmp_path / name
  _write_csv(path, 5, lambda h: 4, **kw)
  return path


def test_missing_file_and_bad_csv(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"eicu/eicu_drugs\.csv.*hospital_id"):
    make_task("eicu", data_dir=tmp_path)
  with pytest.raises(FileNotFoundError, match="credentialed"):
    make_task("eicu", path=tmp_path / "absent.csv")
  with pytest.raises(ValueError, match="credentialed"):
    make_task("eicu", data_dir=tmp_path, download=True)
  path = _small(tmp_path)
  with pytest.raises(ValueError, match="at least one OOD hospital"):
    make_task("eicu", path=path, expected_features=None, num_train_hospitals=25)
  text = path.read_text().splitlines()
  bad = tmp_path / "bad_label.csv"
  bad.write_text("\n".join(text[:3] + [text[3].rsplit(",", 1)[0] + ",2"] + text[4:]))
  with pytest.raises(ValueError, match="row 4: 2.0 is not 0 or 1"):
    make_task("eicu", path=bad, expected_features=None)
  bad2 = tmp_path / "bad_feature.csv"
  fields = text[2].split(",")
  fields[3] = "yes"
  bad2.write_text("\n".join(text[:2] + [",".join(fields)] + text[3:]))
  with pytest.raises(ValueError, match="column 'drug_1', row 3: 'yes' is not a number"):
    make_task("eicu", path=bad2, expected_features=None)
  nolabel = tmp_path / "nolabel.csv"
  nolabel.write_text("\n".join(l.rsplit(",", 1)[0] for l in text))
  with pytest.raises(ValueError, match="no column 'mortality'"):
    make_task("eicu", path=nolabel, expected_features=None)


def test_csv_module_fallback_equals_pandas(tmp_path, monkeypatch):
  path = _small(tmp_path)
  fast = eicu.load_eicu_csv(path, expected_features=None)
  monkeypatch.setitem(__import__("sys").modules, "pandas", None)  # import -> ImportError
  slow = eicu.load_eicu_csv(path, expected_features=None)
  for a, b in zip(fast, slow):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  text = path.read_text().splitlines()
  fields = text[2].split(",")
  fields[3] = ""
  empty = tmp_path / "empty_cell.csv"
  empty.write_text("\n".join(text[:2] + [",".join(fields)] + text[3:]))
  with pytest.raises(ValueError, match="column 'drug_1', row 3"):
    eicu.load_eicu_csv(empty, expected_features=None)
  monkeypatch.undo()
  with pytest.raises(ValueError, match="column 'drug_1', row 3: empty"):
    eicu.load_eicu_csv(empty, expected_features=None)
