"""Hugging Face datasets as a source, partitioned by Flower Datasets (``flwr-datasets``).

``--source hf`` for ``femnist`` (``flwrlabs/femnist``, one client per ``writer_id``),
``shakespeare`` (``flwrlabs/shakespeare``, one client per ``character_id``),
``cifar100_fed`` (``uoft-cs/cifar100``, a Dirichlet split of ``fine_label``), the DomainBed
tasks the hub carries (``pacs``: ``flwrlabs/pacs``; ``office_home``:
``flwrlabs/office-home``; one partition per ``domain``, decoded by
``fedjax_inv.data.domainbed``), and the generic ``hf`` task (``fedjax_inv.tasks.hf``)
for any hub dataset. The dataset is read with ``flwr_datasets.FederatedDataset`` and
the task's partitioner, then written client by client into packed pools
(``core.packed.PoolWriter``): every example once, 8-bit images as uint8; never a padded
float32 copy (the DomainBed tasks keep their own float32 domain arrays).

Where the data comes from (first match):

1. ``data_dir`` (``--data-dir``; ``$FEDJAX_INV_DATA_DIR``): a ``datasets`` ``save_to_disk``
   folder (read with ``datasets.load_from_disk``, then shuffled and partitioned as
   ``FederatedDataset`` does), or a copy of the hub repository's files (parquet / csv /
   json, e.g. from ``hf download NAME --repo-type dataset --local-dir DIR``; older
   ``huggingface_hub``: ``huggingface-cli download``),
   read by ``FederatedDataset(dataset=DIR)``. ``DIR``, ``DIR/NAME`` and
   ``DIR/<last part of NAME>`` are tried.
2. The Hugging Face cache (``$HF_HOME``, ``$HF_DATASETS_CACHE``): read offline.
3. The hub, only with ``download=True`` (``--download``), with short timeouts.

Without a copy and without ``--download`` the loader raises FileNotFoundError in one line
naming the dataset, the cache and the two ways to pre-download it. Nothing here is
imported with ``fedjax_inv``: ``datasets`` and ``flwr_datasets`` are imported on first
use (both are dependencies of fedjax_inv). Flower Datasets' usage telemetry is switched off
(``FLWR_TELEMETRY_ENABLED=0``) unless the environment sets it.
"""
from __future__ import annotations

import contextlib
import os
import pathlib
import warnings

import numpy as np

HUB_NAMES = {"femnist": "flwrlabs/femnist", "shakespeare": "flwrlabs/shakespeare",
             "cifar100_fed": "uoft-cs/cifar100", "pacs": "flwrlabs/pacs",
             "office_home": "flwrlabs/office-home"}
ETAG_TIMEOUT_S = 10      # seconds for the hub's metadata requests (--download only)
DOWNLOAD_TIMEOUT_S = 30  # seconds without data before a file download gives up
_DATA_SUFFIXES = (".parquet", ".csv", ".json", ".jsonl", ".arrow", ".txt")
_TRUE = ("1", "true", "yes", "on")


def _import():
  """``(datasets, flwr_datasets)``, imported on first use (telemetry off, short hub
  timeouts unless the environment says otherwise). Raises RuntimeError naming the
  packages to reinstall."""
  os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
  os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", str(ETAG_TIMEOUT_S))
  os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", str(DOWNLOAD_TIMEOUT_S))
  try:
    with warnings.catch_warnings():
      # tqdm.auto in a notebook without ipywidgets: about datasets' own progress bars
      warnings.filterwarnings("ignore", message="IProgress not found")
      import datasets  # pylint: disable=g-import-not-at-top
      import flwr_datasets  # pylint: disable=g-import-not-at-top
      from flwr_datasets.common import telemetry  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise RuntimeError(f"Hugging Face datasets and Flower Datasets are missing ({e}); "
                       "they are dependencies of fedjax_inv: pip install 'datasets' "
                       "'flwr-datasets' (or reinstall fedjax_inv).") from e
  if os.environ.get("FLWR_TELEMETRY_ENABLED") == "0":
    telemetry.FLWR_TELEMETRY_ENABLED = "0"  # imported earlier by someone else
  return datasets, flwr_datasets


def _env_offline() -> bool:
  return any(os.environ.get(k, "").strip().lower() in _TRUE
             for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"))


@contextlib.contextmanager
def _hub_access(online: bool):
  """Hub requests allowed (``online``, short timeouts) or refused (offline: the cache
  only) while the block runs; the previous settings are restored after it."""
  import datasets  # pylint: disable=g-import-not-at-top
  from huggingface_hub import constants as hc  # pylint: disable=g-import-not-at-top
  off = (not online) or _env_offline()
  saved = (datasets.config.HF_HUB_OFFLINE, hc.HF_HUB_OFFLINE, hc.HF_HUB_ETAG_TIMEOUT,
           hc.HF_HUB_DOWNLOAD_TIMEOUT)
  datasets.config.HF_HUB_OFFLINE = hc.HF_HUB_OFFLINE = off
  hc.HF_HUB_ETAG_TIMEOUT = min(int(hc.HF_HUB_ETAG_TIMEOUT), ETAG_TIMEOUT_S)
  hc.HF_HUB_DOWNLOAD_TIMEOUT = min(int(hc.HF_HUB_DOWNLOAD_TIMEOUT), DOWNLOAD_TIMEOUT_S)
  try:
    yield
  finally:
    (datasets.config.HF_HUB_OFFLINE, hc.HF_HUB_OFFLINE, hc.HF_HUB_ETAG_TIMEOUT,
     hc.HF_HUB_DOWNLOAD_TIMEOUT) = saved


def _has_data_files(folder: pathlib.Path) -> bool:
  return any(p.suffix in _DATA_SUFFIXES and p.is_file()
             for p in folder.rglob("*") if ".cache" not in p.parts)


def find_local(name: str, data_dir) -> tuple[str | None, pathlib.Path | None, list]:
  """``(layout, folder, tried)``: ``'disk'`` (a ``save_to_disk`` folder), ``'files'``
  (the hub repository's data files) or None, for dataset ``name`` under ``data_dir``
  (``$FEDJAX_INV_DATA_DIR`` when None); ``name`` itself when it is a folder."""
  roots = []
  if pathlib.Path(name).is_dir():
    roots.append(pathlib.Path(name))
  data_dir = data_dir or os.environ.get("FEDJAX_INV_DATA_DIR")
  if data_dir:
    d = pathlib.Path(data_dir).expanduser()
    roots += [d / name, d / name.split("/")[-1], d]
  tried = []
  for r in roots:
    if r in tried:
      continue
    tried.append(r)
    if not r.is_dir():
      continue
    if (r / "dataset_dict.json").is_file() or (r / "state.json").is_file():
      return "disk", r, tried
    if _has_data_files(r):
      return "files", r, tried
  return None, None, tried


def _predownload_hint(name: str) -> str:
  short = name.split("/")[-1]
  return (f"pre-download it with `hf download {name} --repo-type dataset "
          f"--local-dir DIR/{short}` (or datasets.load_dataset({name!r})"
          f".save_to_disk('DIR/{short}')) and pass --data-dir DIR, or pass --download")


def _missing(name, data_dir, tried, err=None, download=False) -> FileNotFoundError:
  """The one-line error for a dataset found nowhere: the dataset, where it was looked
  for (the folders, the cache), why (downloads off, or the hub's error) and the fix."""
  datasets, _ = _import()
  why = "" if err is None else f" ({type(err).__name__}: {str(err).splitlines()[0][:200]})"
  where = (f"no copy in --data-dir {data_dir} (looked in "
           f"{', '.join(str(t) for t in tried)}), " if data_dir else "")
  fetch = ("the download from the hub failed" if download and not _env_offline()
           else "downloads are off")
  return FileNotFoundError(
      f"--source hf: dataset {name!r} not found: {where}not in the Hugging Face cache "
      f"{datasets.config.HF_DATASETS_CACHE} and {fetch}{why}; {_predownload_hint(name)}.")


class HubData:
  """A hub dataset's splits with their Flower partitioners attached.

  ``partitioner(split)`` is the (dataset-assigned) ``flwr_datasets`` partitioner of a
  federated split; ``split(name)`` a whole split (None when the dataset has no such
  split); ``features`` the first federated split's ``datasets.Features``;
  ``provenance`` where the data came from.
  """

  def __init__(self, splits: dict, partitioners: dict, provenance: dict):
    self._splits, self._partitioners, self.provenance = splits, partitioners, provenance

  def partitioner(self, split: str):
    return self._partitioners[split]

  def split(self, name: str):
    return self._splits.get(name)

  @property
  def features(self):
    return self._partitioners[next(iter(self._partitioners))].dataset.features


def open_dataset(name: str, partitioners: dict, *, data_dir=None, download=False,
                 shuffle=True, seed=42, subset=None, want_splits=("test",)) -> HubData:
  """Hub dataset ``name`` with ``partitioners`` (``{split: Partitioner}``) assigned.

  As ``flwr_datasets.FederatedDataset(dataset=..., partitioners=..., shuffle=...,
  seed=...)`` (which reads it, unless it is a ``save_to_disk`` copy); ``want_splits``
  are the unpartitioned splits kept when present (e.g. the test split).

  Raises:
    FileNotFoundError: no local copy, nothing in the cache and no ``download`` (one
      line: the dataset, the cache, how to pre-download); the hub unreachable.
    ValueError: a partitioned split the dataset does not have (names the ones it has).
    RuntimeError: ``datasets`` / ``flwr-datasets`` not installed.
  """
  datasets, fd = _import()
  layout, folder, tried = find_local(name, data_dir)
  if layout == "disk":
    dd = datasets.load_from_disk(str(folder))
    if isinstance(dd, datasets.Dataset):
      dd = datasets.DatasetDict({"train": dd})
    if shuffle:  # what FederatedDataset._prepare_dataset does after loading
      dd = dd.shuffle(seed=seed)
    for split, p in partitioners.items():
      if split not in dd:
        raise ValueError(f"--source hf: {folder} has splits {sorted(dd)}, no {split!r}.")
      p.dataset = dd[split]
    splits = {s: dd[s] for s in dd}
    prov = {"dataset_source": f"hf save_to_disk: {folder}"}
  else:
    path = str(folder) if layout == "files" else name
    fds = fd.FederatedDataset(dataset=path, subset=subset, partitioners=partitioners,
                              shuffle=shuffle, seed=seed)
    if layout is None and not download and not _in_cache(name):
      raise _missing(name, data_dir, tried)  # offline and nothing cached: say so at once
    try:
      with _hub_access(online=bool(download) and layout is None):
        parts = fds.partitioners  # loads (downloads when allowed) and assigns
    except (ValueError, RuntimeError) as e:
      if "split" in str(e):
        raise ValueError(f"--source hf: {name}: {e}") from e
      raise _missing(name, data_dir, tried, e, download) from e
    except Exception as e:  # offline, not cached, unreachable (requests/httpx errors)
      raise _missing(name, data_dir, tried, e, download) from e
    partitioners = parts
    splits = {}
    for s in set(want_splits) | set(partitioners):
      try:
        splits[s] = fds.load_split(s)
      except ValueError:
        pass
    prov = {"dataset_source": (f"hf files: {folder}" if layout == "files"
                               else f"hf hub: {name}")}
  prov["hf_dataset"] = name
  return HubData(splits, partitioners, prov)


def _in_cache(name: str) -> bool:
  """Whether the hub cache holds any snapshot of dataset ``name``."""
  from huggingface_hub import constants as hc  # pylint: disable=g-import-not-at-top
  import datasets  # pylint: disable=g-import-not-at-top
  hub = pathlib.Path(hc.HF_HUB_CACHE) / ("datasets--" + name.replace("/", "--"))
  ds = pathlib.Path(datasets.config.HF_DATASETS_CACHE) / name.replace("/", "___")
  return hub.is_dir() or ds.is_dir()


# -- partitioners ------------------------------------------------------------------------

_PARTITIONERS = {
    "iid": "IidPartitioner", "dirichlet": "DirichletPartitioner",
    "shard": "ShardPartitioner", "pathological": "PathologicalPartitioner",
    "natural": "NaturalIdPartitioner", "linear": "LinearPartitioner",
    "square": "SquarePartitioner", "exponential": "ExponentialPartitioner",
}
_SEEDED = ("dirichlet", "shard", "pathological")


def _value(text: str):
  t = text.strip()
  if t.lower() in ("true", "false"):
    return t.lower() == "true"
  for conv in (int, float):
    try:
      return conv(t)
    except ValueError:
      pass
  return t


def make_partitioner(spec: str, seed: int = 42, default_by: str = "label"):
  """A ``flwr_datasets.partitioner`` object from ``'NAME[:KEY=VALUE,...]'``.

  Names: ``iid`` (``num_partitions``), ``dirichlet`` (``alpha``, ``num_partitions``,
  ``by``, ``min_partition_size``, ``self_balancing``, ``seed``), ``shard``
  (``num_partitions``, ``by``, ``num_shards_per_partition``, ``shard_size``),
  ``pathological`` (``num_partitions``, ``by``, ``num_classes_per_partition``,
  ``class_assignment_mode``), ``natural`` (``by``), ``linear`` / ``square`` /
  ``exponential`` (``num_partitions``). ``by`` is ``partition_by`` (default
  ``default_by``); ``seed`` defaults to the task's seed.

  Raises:
    ValueError: an unknown name or argument (names the valid ones).
  """
  import inspect  # pylint: disable=g-import-not-at-top
  _import()
  from flwr_datasets import partitioner as fp  # pylint: disable=g-import-not-at-top
  name, _, rest = str(spec).partition(":")
  name = name.strip().lower()
  if name not in _PARTITIONERS:
    raise ValueError(f"partitioner {spec!r}: unknown name {name!r}; use one of "
                     f"{sorted(_PARTITIONERS)}, e.g. dirichlet:alpha=0.3,num_partitions=100,"
                     "by=label.")
  kw = {}
  for item in filter(None, (s.strip() for s in rest.split(","))):
    k, eq, v = item.partition("=")
    if not eq:
      raise ValueError(f"partitioner {spec!r}: {item!r} is not KEY=VALUE.")
    kw["partition_by" if k.strip() == "by" else k.strip()] = _value(v)
  cls = getattr(fp, _PARTITIONERS[name])
  params = inspect.signature(cls.__init__).parameters
  if "partition_by" in params:
    kw.setdefault("partition_by", default_by)
  if name in _SEEDED:
    kw.setdefault("seed", int(seed))
  if "alpha" in kw and isinstance(kw["alpha"], int):
    kw["alpha"] = float(kw["alpha"])
  unknown = sorted(set(kw) - set(params) - {"self"})
  if unknown:
    raise ValueError(f"partitioner {spec!r}: {name} takes no {unknown}; its arguments: "
                     f"{sorted(set(params) - {'self'})} ('by' = partition_by).")
  try:
    return cls(**kw)
  except TypeError as e:
    raise ValueError(f"partitioner {spec!r}: {e}") from e


# -- datasets -> packed pools --------------------------------------------------------------

def write_pools(num_parts: int, get_part, convert, plan, ids=None, keep=None,
                divisor=None):
  """Packed pools from dataset partitions, every kept example decoded and stored once.

  Args:
    num_parts: partitions ``0..num_parts-1``.
    get_part: ``i -> datasets.Dataset`` (e.g. ``partitioner.load_partition``).
    convert: ``Dataset -> (x [n, *features], y [n])``; uint8 ``x`` is stored as uint8
      (decoded as ``x / divisor``), anything else as float32.
    plan: ``(i, n_i) -> (rows_0, rows_1, ...)``: the partition's rows that go to each
      output pool (e.g. its training and test rows).
    ids: client ids (``num_parts`` strings; default ``'0'``, ``'1'``, ...).
    keep: partition indices to read (default all), in this order.
    divisor: the uint8 pools' decode divisor (default 255: 8-bit pixels in [0, 1]; 1
      for stored ids such as characters).

  Returns:
    one ``PackedPool`` per output of ``plan`` (None where no client has a row), its
    clients the kept partitions with at least one row there, ids attached.
  """
  from fedjax_inv.core.packed import PoolWriter  # pylint: disable=g-import-not-at-top
  keep = list(range(num_parts)) if keep is None else [int(i) for i in keep]
  ids = [str(i) for i in range(num_parts)] if ids is None else [str(c) for c in ids]
  rng_plans = []
  for i in keep:
    part = get_part(i)
    rng_plans.append((i, part, [np.asarray(r, np.int64) for r in plan(i, len(part))]))
  if not rng_plans:
    raise ValueError("--source hf: no partitions to read.")
  outs = len(rng_plans[0][2])
  writers, first = [None] * outs, None
  for _j, (i, part, rows) in enumerate(rng_plans):
    if not any(len(r) for r in rows):
      continue
    x, y = convert(part)
    x, y = np.asarray(x), np.asarray(y)
    if first is None:
      first = x
      if x.dtype == np.uint8:
        x_dtype, div = np.uint8, 255.0 if divisor is None else float(divisor)
      else:
        x_dtype, div = np.float32, 1.0
      y_dtype = np.float32 if np.issubdtype(y.dtype, np.floating) else np.int32
      for k in range(outs):
        members = [(ii, rr[k]) for ii, _, rr in rng_plans if len(rr[k])]
        if members:
          writers[k] = (PoolWriter([len(r) for _, r in members], x.shape[1:], x_dtype,
                                   y_dtype, div, tuple(ids[ii] for ii, _ in members)),
                        {ii: m for m, (ii, _) in enumerate(members)})
    for k in range(outs):
      if len(rows[k]):
        w, slot = writers[k]
        if x.dtype != w.x.dtype and w.x.dtype == np.uint8:
          raise ValueError(f"--source hf: partition {i} has {x.dtype} inputs, the first "
                           "had uint8; give every row the same type.")
        w[slot[i]] = (x[rows[k]], y[rows[k]].astype(w.y.dtype))
  return [None if w is None else w[0].pool() for w in writers]


def images(column) -> np.ndarray:
  """An image column (``with_format('numpy')``) -> ``[n, H, W, C]`` (a channel axis
  added to grayscale). Raises ValueError for images of different sizes."""
  x = np.asarray(column)
  if x.dtype == object:
    raise ValueError("--source hf: the images differ in size; this source needs one "
                     "size per dataset (resize them first, e.g. with Dataset.map).")
  return x[..., None] if x.ndim == 3 else x


def columns(part, *names) -> dict:
  """``part``'s columns ``names`` as numpy arrays (images decoded to uint8)."""
  return part.with_format("numpy", columns=list(names))[:]


# -- the federated tasks' hub layouts ------------------------------------------------------

def femnist_pools(data_dir, download, seed, num_clients=None, test_fraction=0.1,
                  dataset=None):
  """``(train, test, provenance)`` packed pools of ``flwrlabs/femnist`` (LEAF's FEMNIST:
  ``image`` 28x28 grayscale, ``character`` 0..61, ``writer_id``), one client per
  writer (``NaturalIdPartitioner(partition_by='writer_id')``: sorted writer ids).

  The hub has one split; each writer's rows are split at random (seeded) into training
  and test rows, ``floor(test_fraction * n)`` test rows each (LEAF's ``-t sample``
  split). ``num_clients`` keeps the first N writers (sorted ids). Pixels stay 8-bit
  (divisor 255: values in [0, 1] as in LEAF's files)."""
  name = dataset or HUB_NAMES["femnist"]
  data, p, n, ids, keep = _by_natural_id(name, "writer_id", data_dir, download, seed,
                                         num_clients)
  train, test = write_pools(n, p.load_partition, _femnist_convert,
                            _random_split(seed, test_fraction), ids=ids, keep=keep)
  return train, test, {**data.provenance, "data_note": (
      f"FEMNIST from the hub dataset {name} (Flower Datasets, one client per writer_id; "
      f"{test_fraction:g} of each writer's examples held out as its test examples)")}


def _by_natural_id(name, column, data_dir, download, seed, num_clients):
  """Opens hub dataset ``name`` with one client per value of ``column`` (Flower's
  ``NaturalIdPartitioner``, unshuffled): ``(data, partitioner, N, natural ids, kept
  partition indices or None)``."""
  _import()
  from flwr_datasets.partitioner import NaturalIdPartitioner  # pylint: disable=g-import-not-at-top
  data = open_dataset(name, {"train": NaturalIdPartitioner(partition_by=column)},
                      data_dir=data_dir, download=download, shuffle=False, seed=seed)
  p = data.partitioner("train")
  n = p.num_partitions
  ids = [p.partition_id_to_natural_id[i] for i in range(n)]
  keep = range(min(n, int(num_clients))) if num_clients else None
  return data, p, n, ids, keep


def domain_partitions(name: str, data_dir=None, download=False, column="domain"):
  """A hub dataset of DomainBed's schema (``image``, ``column`` = the domain's name,
  ``label`` a ``ClassLabel``; ``flwrlabs/pacs``, ``flwrlabs/office-home``), one Flower
  natural-id partition per domain (``NaturalIdPartitioner(partition_by=column)``).

  Returns:
    ``(partitions, label_names, provenance)``: ``{domain name: datasets.Dataset}`` in the
    partitioner's order, the ``label`` column's class names, and where the data came from.

  Raises:
    FileNotFoundError: as :func:`open_dataset` (one line: the dataset, the cache, the fix).
    ValueError: the dataset lacks one of the three columns, or its ``label`` is not a
      ``ClassLabel`` (names the columns it has).
  """
  data, p, n, ids, _ = _by_natural_id(name, column, data_dir, download, 0, None)
  feats = data.features
  if not {"image", column, "label"} <= set(feats):
    raise ValueError(f"--source hf: {name} has columns {sorted(feats)}; a DomainBed "
                     f"dataset needs 'image', {column!r} and 'label'.")
  label_names = getattr(feats["label"], "names", None)
  if not label_names:
    raise ValueError(f"--source hf: {name}'s 'label' column is {feats['label']}, not a "
                     "ClassLabel with class names.")
  return ({ids[i]: p.load_partition(i) for i in range(n)}, list(label_names),
          data.provenance)


def _femnist_convert(part):
  c = columns(part, "image", "character")
  return images(c["image"]), c["character"]


def _random_split(seed, test_fraction):
  """``(i, n) -> (train rows, test rows)``: ``floor(test_fraction * n)`` random test
  rows (at least one row stays for training), seeded by ``seed`` and the partition."""
  def plan(i, n):
    t = min(int(float(test_fraction) * n), max(n - 1, 0))
    perm = np.random.default_rng([int(seed), 0x4F, int(i)]).permutation(n)
    return np.sort(perm[t:]), np.sort(perm[:t])
  return plan


def shakespeare_pools(data_dir, download, seed, num_clients=None, max_examples=1000,
                      test_fraction=0.2, dataset=None):
  """``(train, test, provenance)`` packed pools of ``flwrlabs/shakespeare`` (LEAF's
  next-character task: ``x`` 80 characters, ``y`` the next one, ``character_id``), one
  client per role (``NaturalIdPartitioner(partition_by='character_id')``).

  The data is temporal: each role's rows keep the file's order, its first
  ``1 - test_fraction`` are training rows and the rest test rows (LEAF's split); then
  ``max_examples`` keeps a seeded random subset of each (None = all). Inputs are
  character ids (``federated_files.char_ids``), stored as uint8."""
  from fedjax_inv.data import federated_files as ff  # pylint: disable=g-import-not-at-top
  name = dataset or HUB_NAMES["shakespeare"]
  data, p, n, ids, keep = _by_natural_id(name, "character_id", data_dir, download, seed,
                                         num_clients)

  def convert(part):
    c = part.with_format(None)[:]  # strings
    x, y = ff.leaf_shakespeare_examples(c["x"], c["y"])
    return x.astype(np.uint8), y  # ids 0..81



  def plan(i, m):
    t = int(round(float(test_fraction) * m))
    t = min(t, max(m - 1, 0))
    rows = np.arange(m)
    tr, te = rows[:m - t], rows[m - t:]
    rng = np.random.default_rng([int(seed), 0x5A0, int(i)])
    cap = lambda r: (r if max_examples is None or len(r) <= max_examples  # noqa: E731
                     else np.sort(rng.choice(r, int(max_examples), replace=False)))
    return cap(tr), cap(te)

  train, test = write_pools(n, p.load_partition, convert, plan, ids=ids, keep=keep,
                            divisor=1.0)
  return train, test, {**data.provenance, "data_note": (
      f"Shakespeare from the hub dataset {name} (Flower Datasets, one client per "
      f"character_id; last {test_fraction:g} of each role's lines as its test examples)")}


def cifar100_pools(data_dir, download, seed, num_clients=None, partitioner=None,
                   test_clients=100, crop=None, dataset=None):
  """``(train, test, provenance)`` of ``uoft-cs/cifar100`` (``img`` 32x32x3,
  ``fine_label``): the training split over clients by ``partitioner`` (default
  ``dirichlet:alpha=0.1,num_partitions=500,by=fine_label,min_partition_size=1``; TFF's
  Pachinko split is not on the hub), the test split i.i.d. over ``test_clients``.
  ``crop`` maps uint8 images to the model's inputs (float32: stored so)."""
  name = dataset or HUB_NAMES["cifar100_fed"]
  _import()
  from flwr_datasets.partitioner import IidPartitioner  # pylint: disable=g-import-not-at-top
  spec = partitioner or ("dirichlet:alpha=0.1,num_partitions=500,by=fine_label,"
                         "min_partition_size=1")
  part = make_partitioner(spec, seed=seed, default_by="fine_label")
  data = open_dataset(name, {"train": part, "test": IidPartitioner(int(test_clients))},
                      data_dir=data_dir, download=download, seed=seed)

  def convert(d):
    c = columns(d, "img", "fine_label")
    x = images(c["img"])
    return (x if crop is None else crop(x)), c["fine_label"]

  whole = lambda i, m: (np.arange(m),)  # noqa: E731
  p, q = data.partitioner("train"), data.partitioner("test")
  keep = range(min(p.num_partitions, int(num_clients))) if num_clients else None
  train, = write_pools(p.num_partitions, p.load_partition, convert, whole, keep=keep)
  test, = write_pools(q.num_partitions, q.load_partition, convert, whole)
  return train, test, {**data.provenance, "partitioner": spec, "data_note": (
      f"CIFAR-100 from the hub dataset {name} (Flower Datasets: train split by {spec}, "
      f"test split i.i.d. over {test_clients} clients; not TFF's Pachinko split)")}


__all__ = ["HUB_NAMES", "HubData", "cifar100_pools", "domain_partitions", "femnist_pools",
           "find_local", "make_partitioner", "open_dataset", "shakespeare_pools",
           "write_pools"]
