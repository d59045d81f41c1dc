"""eICU mortality prediction from drug indicators (FedILC §5.1.3), from a user-supplied CSV.

The eICU Collaborative Research Database (Pollard et al. 2018) is credentialed
(PhysioNet), so it cannot ship with this package and is never downloaded. Export the
cohort to one CSV file and put it at::

  <data_dir>/eicu/eicu_drugs.csv      (data_dir: the data_dir argument, else
                                       $FEDJAX_INV_DATA_DIR; or pass path=...)

CSV schema (comma-separated, one header row, one row per patient stay):

  ``hospital_id``   hospital identifier (integer or string; eICU's ``hospitalid``) —
                    defines the clients.
  ``mortality``     binary label: 1 = died in hospital, 0 = alive (eICU's
                    ``hospitaldischargestatus == 'Expired'``).
  feature columns   by default every other column except an optional
                    ``patientunitstayid`` (ignored); FedILC uses 1,399 drug indicator
                    columns (1 = the drug was given, 0 = not), so by default exactly
                    1,399 feature columns are required (``expected_features=None``
                    disables the check, or pass ``feature_columns=[...]`` to choose them).
                    Values must be finite numbers; empty cells are errors.

Federated protocol (FedILC §5.1.3): the ``num_train_hospitals`` = 20 hospitals with the
most rows are the training clients (ties broken by hospital id), each split 70 % train /
30 % validation with the seed (the ``'val'`` evaluation set: one client per training
hospital); all remaining hospitals form the out-of-distribution test set ``'ood'`` (one
pooled client, or one client per hospital with ``ood_per_hospital=True``). Model: MLP
1399-1024-1024-512-1 (FedILC §5.1.3, "4-layer MLP with 1024, 1024, 512, and 1 neuron").
"""
from __future__ import annotations

import csv
import pathlib
from typing import Sequence

import numpy as np


__all__ = ["DEFAULT_RELATIVE_PATH", "HOSPITAL_COLUMN", "LABEL_COLUMN", "NUM_DRUG_FEATURES",
           "load_eicu_csv", "make_eicu"]

HOSPITAL_COLUMN = "hospital_id"
LABEL_COLUMN = "mortality"
IGNORED_COLUMNS = ("patientunitstayid",)
NUM_DRUG_FEATURES = 1399
DEFAULT_RELATIVE_PATH = pathlib.Path("eicu") / "eicu_drugs.csv"

_SCHEMA = (f"a CSV with a header row: column '{HOSPITAL_COLUMN}' (hospital id), column "
           f"'{LABEL_COLUMN}' (0 alive / 1 died) and {NUM_DRUG_FEATURES} numeric drug "
           "indicator columns (any names; an optional 'patientunitstayid' column is "
           "ignored)")


def _resolve_path(data_dir, path) -> pathlib.Path:
  if path is not None:
    p = pathlib.Path(path).expanduser()
    if not p.is_file():
      raise FileNotFoundError(f"eICU: no file at path='{p}'. It must be {_SCHEMA}. eICU is "
                              "credentialed (PhysioNet) and is never downloaded.")
    return p
  if data_dir is None:
    from fedjax_inv.data.sources import default_data_dir
    data_dir = default_data_dir()
  where = ("<data_dir>" if data_dir is None
           else str(pathlib.Path(data_dir).expanduser()))
  p = None if data_dir is None else pathlib.Path(data_dir).expanduser() / DEFAULT_RELATIVE_PATH
  if p is None or not p.is_file():
    raise FileNotFoundError(
        f"eICU: expected the file {where}/{DEFAULT_RELATIVE_PATH.as_posix()}"
        + ("" if data_dir is not None else
           " (pass data_dir=... / --data-dir or set $FEDJAX_INV_DATA_DIR)")
        + f", {_SCHEMA}; or pass path=... . eICU is credentialed (PhysioNet): export the "
        "cohort yourself; it is never downloaded.")
  return p


def load_eicu_csv(path, feature_columns: Sequence[str] | None = None,
                  expected_features: int | None = NUM_DRUG_FEATURES):
  """Reads the eICU CSV (schema in the module docstring).

  Args:
    path: CSV file.
    feature_columns: the feature column names to use, in order (default: all columns but
      ``hospital_id``, ``mortality`` and ``patientunitstayid``).
    expected_features: with the default columns, the required number of features (1,399
      in FedILC §5.1.3); None to accept any number.

  Returns:
    ``(x float32 [n, F], y int32 [n] in {0, 1}, hospital [n] str, feature_names [F])``.

  Raises:
    ValueError: missing columns, a wrong feature count, non-numeric / empty / non-finite
      values, or labels other than 0/1 — naming the column (and row).
  """
  path = pathlib.Path(path)
  with open(path, newline="") as f:
    try:
      header = [h.strip() for h in next(csv.reader(f))]
    except StopIteration:
      raise ValueError(f"eICU: '{path}' is empty; it must be {_SCHEMA}.") from None
  for col in (HOSPITAL_COLUMN, LABEL_COLUMN):
    if col not in header:
      raise ValueError(f"eICU: '{path}' has no column '{col}' (header starts "
                       f"{header[:5]}); it must be {_SCHEMA}.")
  if len(set(header)) != len(header):
    dup = sorted({h for h in header if header.count(h) > 1})
    raise ValueError(f"eICU: duplicate column names {dup[:5]} in '{path}'.")
  if feature_columns is None:
    skip = {HOSPITAL_COLUMN, LABEL_COLUMN, *IGNORED_COLUMNS}
    feature_columns = [h for h in header if h not in skip]
    if expected_features is not None and len(feature_columns) != expected_features:
      raise ValueError(
          f"eICU: '{path}' has {len(feature_columns)} feature columns, expected "
          f"{expected_features} drug indicators (FedILC §5.1.3). Pass "
          "feature_columns=[...] to choose columns, or expected_features=None to use "
          "them all.")
  else:
    feature_columns = list(feature_columns)
    unknown = [c for c in feature_columns if c not in header]
    if unknown:
      raise ValueError(f"eICU: feature_columns {unknown[:5]} are not in '{path}' "
                       f"(columns: {header[:8]}...).")
    if not feature_columns:
      raise ValueError("eICU: feature_columns is empty; pass at least one column.")
    if HOSPITAL_COLUMN in feature_columns or LABEL_COLUMN in feature_columns:
      raise ValueError(f"eICU: feature_columns must not include '{HOSPITAL_COLUMN}' or "
                       f"'{LABEL_COLUMN}'.")
  cols = _read_columns(path, header, [HOSPITAL_COLUMN, LABEL_COLUMN, *feature_columns])

  def numeric(name):
    raw = cols[name]
    try:
      v = raw.astype(np.float64)
    except (ValueError, TypeError):
      i = next(i for i, s in enumerate(raw) if not _is_float(s))
      raise ValueError(f"eICU: column '{name}', row {i + 2}: {raw[i]!r} is not a "
                       "number.") from None
    if not np.all(np.isfinite(v)):
      i = int(np.flatnonzero(~np.isfinite(v))[0])
      raise ValueError(f"eICU: column '{name}', row {i + 2}: empty or not finite "
                       f"({raw[i]!r}).")
    return v

  x = np.empty((len(cols[LABEL_COLUMN]), len(feature_columns)), np.float32)
  for j, c in enumerate(feature_columns):
    x[:, j] = numeric(c)
  y = numeric(LABEL_COLUMN)
  if not np.all(np.isin(y, (0.0, 1.0))):
    i = int(np.flatnonzero(~np.isin(y, (0.0, 1.0)))[0])
    raise ValueError(f"eICU: column '{LABEL_COLUMN}', row {i + 2}: {y[i]} is not 0 or 1.")
  hospital = np.asarray(["" if v is None or (isinstance(v, float) and np.isnan(v))
                         else str(v).strip() for v in cols[HOSPITAL_COLUMN]])
  if np.any(hospital == ""):
    i = int(np.flatnonzero(hospital == "")[0])
    raise ValueError(f"eICU: column '{HOSPITAL_COLUMN}', row {i + 2} is empty.")
  return x, y.astype(np.int32), hospital, list(feature_columns)


def _read_columns(path: pathlib.Path, header: list, names: list) -> dict:
  """``{column: [n] array}`` for ``names``; pandas' C parser when installed (the full
  30k x 1,401 file in seconds), else the csv module."""
  try:
    import pandas as pd
  except ImportError:
    pd = None
  if pd is not None:
    try:
      df = pd.read_csv(path, usecols=names, dtype={HOSPITAL_COLUMN: str},
                       skip_blank_lines=True, low_memory=False)
    except (ValueError, pd.errors.ParserError) as e:
      raise ValueError(f"eICU: cannot parse '{path}' as CSV ({e}).") from e
    if len(df) == 0:
      raise ValueError(f"eICU: '{path}' has a header but no rows.")
    return {n: df[n].to_numpy() for n in names}
  with open(path, newline="") as f:
    reader = csv.reader(f)
    next(reader)
    rows = [r for r in reader if r]
  if not rows:
    raise ValueError(f"eICU: '{path}' has a header but no rows.")
  for i, r in enumerate(rows):
    if len(r) != len(header):
      raise ValueError(f"eICU: row {i + 2} of '{path}' has {len(r)} fields, the header "
                       f"has {len(header)}.")
  idx = {h: i for i, h in enumerate(header)}
  return {n: np.asarray([r[idx[n]] for r in rows], dtype=object) for n in names}


def _is_float(s) -> bool:
  try:
    float(s)
    return True
  except (ValueError, TypeError):
    return False


def _hospital_order(ids: Sequence[str]) -> list:
  """Sort key: numeric ids numerically, then string ids."""
  def key(h):
    try:
      return (0, float(h), h)
    except ValueError:
      return (1, 0.0, h)
  return sorted(ids, key=key)


def make_eicu(data_dir=None, *, path=None, seed: int = 0, num_train_hospitals: int = 20,
              val_fraction: float = 0.3, feature_columns: Sequence[str] | None = None,
              expected_features: int | None = NUM_DRUG_FEATURES,
              ood_per_hospital: bool = False) -> dict:
  """Clients and splits of FedILC §5.1.3 as numpy arrays (see module docstring).

  Returns:
    dict with ``train`` / ``val``: lists of ``(x [n_k, F], y [n_k])`` per training
    hospital (largest first), ``ood``: list of ``(x, y)`` (one pooled pair, or one per OOD
    hospital), and ``info``.

  Raises:
    FileNotFoundError: no CSV (message says where to put it).
    ValueError: bad CSV (see :func:`load_eicu_csv`), too few hospitals, a training
      hospital too small to split, or ``val_fraction`` outside (0, 1).
  """
  if not 0.0 < val_fraction < 1.0:
    raise ValueError(f"val_fraction={val_fraction!r}; it must be in (0, 1) (FedILC uses "
                     "0.3: a 70/30 train/validation split).")
  if int(num_train_hospitals) != num_train_hospitals or num_train_hospitals < 1:
    raise ValueError(f"num_train_hospitals={num_train_hospitals!r}; use a positive int "
                     "(20 in FedILC §5.1.3).")
  p = _resolve_path(data_dir, path)
  x, y, hosp, feats = load_eicu_csv(p, feature_columns, expected_features)
  ids, counts = np.unique(hosp, return_counts=True)
  if len(ids) <= num_train_hospitals:
    raise ValueError(f"eICU: '{p}' has {len(ids)} hospitals; {num_train_hospitals} train "
                     "and at least one OOD hospital are needed. Lower num_train_hospitals.")
  ordered = _hospital_order(list(ids))
  size = dict(zip(ids.tolist(), counts.tolist()))
  # Largest first; ties keep the id order (stable sort).
  by_size = sorted(ordered, key=lambda h: -size[h])
  train_h, ood_h = by_size[:num_train_hospitals], _hospital_order(by_size[num_train_hospitals:])
  rng = np.random.default_rng(seed)
  train, val = [], []
  for h in train_h:
    idx = np.flatnonzero(hosp == h)
    n_val = int(round(val_fraction * len(idx)))
    if n_val < 1 or n_val >= len(idx):
      raise ValueError(f"eICU: training hospital {h} has {len(idx)} rows, too few for a "
                       f"{1 - val_fraction:.0%}/{val_fraction:.0%} split with one row in "
                       "each part.")
    perm = rng.permutation(idx)
    tr, va = np.sort(perm[n_val:]), np.sort(perm[:n_val])
    train.append((x[tr], y[tr]))
    val.append((x[va], y[va]))
  if ood_per_hospital:
    ood = [(x[hosp == h], y[hosp == h]) for h in ood_h]
  else:
    m = np.isin(hosp, ood_h)
    ood = [(x[m], y[m])]
  info = {
      "paper": "FedILC §5.1.3 (eICU)",
      "dataset_source": f"user CSV {p}",
      "data_note": (f"eICU drugs CSV: {len(y):,} stays, {len(ids)} hospitals, "
                    f"{len(feats)} features, {y.mean():.1%} mortality; "
                    f"{num_train_hospitals} largest hospitals train "
                    f"({1 - val_fraction:.0%}/{val_fraction:.0%} train/val), "
                    f"{len(ood_h)} OOD hospitals"),
      "train_hospitals": train_h,
      "ood_hospitals": ood_h,
      "num_features": len(feats),
      "feature_columns_head": feats[:5],
      "split_sizes": {"train": [len(b) for _, b in train], "val": [len(b) for _, b in val],
                      "ood": [len(b) for _, b in ood]},
  }
  return {"train": train, "val": val, "ood": ood, "info": info}
