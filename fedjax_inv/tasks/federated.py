"""The standard federated datasets at their real client counts: ``femnist``
(3,400 writers), ``shakespeare`` (715 speaking roles) and ``cifar100_fed`` (500 clients),
with the models and protocol of Reddi et al. 2021, "Adaptive Federated Optimization"
(App. B models; App. D: 10 clients per round, 1 local epoch of batch B; evaluation on the
test clients).

Data: the published files, read offline from ``data_dir`` by
``fedjax_inv.data.federated_files`` (TensorFlow Federated's HDF5 files, or LEAF's JSON
folders for FEMNIST and Shakespeare); nothing is downloaded. ``source='hf'`` reads the
Hugging Face hub's copies through Flower Datasets (``fedjax_inv.data.hf``: a local copy in
``data_dir`` or the cache; the hub only with ``download=True``). ``source='synthetic'``
builds a stand-in of the same shape instead (``fedjax_inv.data.federated_synthetic``: the
real client count and per-client size distribution, generated contents), which the
benchmarks and CI use.

Clients differ in size (FEMNIST: from under 10 to over 400 examples), so the defaults
train ``local_epochs=1``: each client runs its own ``ceil(n_i / B)`` steps
(``Algorithm.local_epochs``), and ``summary.json`` records the padding overhead.
"""
from __future__ import annotations

import numpy as np

from fedjax_inv.core.data import from_client_arrays
from fedjax_inv.tasks.base import Task, register_task

FEDERATED_SOURCES = ("auto", "raw", "synthetic", "hf")
TRAIN_EVAL_CLIENTS = 100  # training clients evaluated as ``train_*`` (a fixed sample)


def _check_source(source: str, name: str) -> None:
  if source not in FEDERATED_SOURCES:
    raise ValueError(f"--source {source!r} for task {name!r}: use 'auto' or 'raw' (the "
                     "published files in --data-dir), 'hf' (the Hugging Face hub's copy, "
                     "through Flower Datasets) or 'synthetic' (a generated pool of the "
                     "same shape).")


def _files(data_dir, dataset: str, name: str):
  """``(layout, {'train': path, 'test': path})`` of the published files in ``data_dir``
  (``$FEDJAX_INV_DATA_DIR`` when None). Raises FileNotFoundError naming the fix."""
  import os
  from fedjax_inv.data import federated_files as ff
  data_dir = data_dir or os.environ.get("FEDJAX_INV_DATA_DIR")
  if not data_dir:
    raise FileNotFoundError(
        f"task {name!r} reads the published {dataset} files: give --data-dir DIR (TFF's "
        f"HDF5 files or LEAF's train/ and test/ JSON folders), or --source synthetic for "
        "a generated pool of the same shape.")
  return ff.find_files(data_dir, dataset)


def _train_eval(num_clients: int, seed: int, count: int | None) -> tuple | None:
  """A fixed seeded sample of ``count`` training clients evaluated as ``train_*`` (None:
  all of them). Evaluating every one of thousands of padded clients each time would cost
  more than the training it reports on; the protocol evaluates on the test clients."""
  if count is None or count >= num_clients:
    return None
  rng = np.random.default_rng([int(seed), 0xE7A1])
  return tuple(int(i) for i in np.sort(rng.choice(num_clients, int(count), replace=False)))


def _sizes_info(sizes) -> dict:
  s = np.asarray(sizes)
  return {"min": int(s.min()), "median": float(np.median(s)), "mean": float(s.mean()),
          "max": int(s.max()), "total": int(s.sum())}


def _check_fraction(fraction) -> None:
  """ValueError unless ``heldout_writers`` is a fraction in [0, 1) (checked before any
  data is read)."""
  if not 0.0 <= float(fraction) < 1.0:
    raise ValueError(f"heldout_writers={fraction!r}; use a fraction in [0, 1) of the "
                     "writers to hold out as the 'ood' set (0 = none).")


def _split_writers(ids, fraction: float, seed: int):
  """(training writers, held-out writers): a seeded ``fraction`` of the writers is held
  out whole (FedGMA §5.2 / Fig. 1a; LEAF's ``-t user`` split)."""
  _check_fraction(fraction)
  k = int(round(float(fraction) * len(ids)))
  if fraction and k == 0:
    k = 1
  rng = np.random.default_rng([int(seed), 0x0DD])
  out = set(rng.choice(len(ids), k, replace=False).tolist()) if k else set()
  return ([c for i, c in enumerate(ids) if i not in out],
          [c for i, c in enumerate(ids) if i in out])


def _pack(clients: dict, ids, reshape):
  """Per-writer ``{id: (x, y)}`` -> a packed pool in ``ids`` order: 8-bit when every
  pixel is a multiple of 1/255 (EMNIST's are), else float32."""
  from fedjax_inv.core import packed
  xs = [reshape(clients[c][0]) for c in ids]
  ys = [np.asarray(clients[c][1], np.int32) for c in ids]
  eight = all(packed.lossless(x, np.rint(x.astype(np.float64) * 255), 255.0) for x in xs)
  return packed.pack_client_arrays(xs, ys, ids=tuple(ids),
                                   x_dtype=np.uint8 if eight else np.float32,
                                   divisor=255.0 if eight else 1.0)


def _synthetic_femnist(num_clients: int, seed: int):
  """``(train, test, cache folder)``: packed pools of the synthetic FEMNIST, from the
  pool cache (``core.packed.cache_root()/pools``, keyed by generator version, seed and
  writer count) when built before, else generated and cached (memory-mapped either
  way; None for the folder when the cache is off or not writable)."""
  from fedjax_inv.core import packed
  from fedjax_inv.data import federated_synthetic as syn
  root = packed.cache_root()
  key = f"femnist-synthetic-v{syn.FEMNIST_VERSION}-seed{int(seed)}-n{int(num_clients)}"
  folder = None if root is None else root / "pools" / key
  if folder is not None and (folder / "test" / "pool.json").is_file():
    try:
      return (packed.PackedPool.load(folder / "train"),
              packed.PackedPool.load(folder / "test"), str(folder))
    except (OSError, ValueError):
      folder = None  # damaged: rebuilt in memory, the folder left as it is
  _, train, test = syn.femnist_pools(num_clients, seed)
  if folder is None:
    return train, test, None
  try:
    for name, pool in (("train", train), ("test", test)):
      if not (folder / name / "pool.json").is_file():
        pool.save(folder / name)
    return (packed.PackedPool.load(folder / "train"),
            packed.PackedPool.load(folder / "test"), str(folder))
  except OSError:  # a read-only or full cache, or another run writing it: from memory
    return train, test, None


def _femnist_pools(data_dir, source: str, seed: int, num_clients, download=False):
  """``(train, test, provenance)``: packed pools (``core.packed.PackedPool``) of
  28×28×1 images with writer ids; ``test`` may hold writers ``train`` has not (LEAF's
  user split)."""
  if source == "hf":
    from fedjax_inv.data import hf
    return hf.femnist_pools(data_dir, download, seed, num_clients)
  from fedjax_inv.data import federated_files as ff
  from fedjax_inv.data import federated_synthetic as syn
  img = lambda x: np.asarray(x, np.float32).reshape(-1, 28, 28, 1)  # noqa: E731
  if source == "synthetic":
    n = int(num_clients or syn.FEMNIST_CLIENTS)
    train, test, cached = _synthetic_femnist(n, seed)
    return train, test, {"dataset_source": "synthetic", "data_note": (
        f"synthetic FEMNIST-shaped pool ({n} writers, sizes after TFF's "
        "totals and LEAF's spread; generated 8-bit images, not EMNIST)"),
        "pool_cache": cached}
  layout, paths = _files(data_dir, "femnist", "femnist")
  if layout == "hdf5":
    train, test = ff.read_tff_emnist(paths["train"]), ff.read_tff_emnist(paths["test"])
  else:
    train = ff.read_leaf(paths["train"], "femnist", "train")
    test = ff.read_leaf(paths["test"], "femnist", "test")
  if num_clients:
    keep = sorted(train)[:int(num_clients)]
    train = {c: train[c] for c in keep}
    test = {c: v for c, v in test.items() if c in train or layout == "leaf"}
  return (_pack(train, sorted(train), img), _pack(test, sorted(test), img),
          {"dataset_source": f"{layout}: {paths['train']}",
           "data_note": f"FEMNIST from {layout} files in {data_dir}"})


def _writers(pool, ids):
  """``pool``'s clients ``ids`` (writer ids), as a packed pool (``pool`` itself when
  that is all of them, in order)."""
  if tuple(ids) == tuple(pool.ids):
    return pool
  where = {c: i for i, c in enumerate(pool.ids)}
  return pool.subset([where[c] for c in ids])


def _joined(train, test, ids):
  """Each writer of ``ids``: its training rows then its test rows (if any), packed."""
  from fedjax_inv.core.packed import PoolWriter
  tr = {c: i for i, c in enumerate(train.ids)}
  te = {c: i for i, c in enumerate(test.ids)}
  parts = [[(p, m[c]) for p, m in ((train, tr), (test, te)) if c in m] for c in ids]
  sizes = [sum(int(p.n[i]) for p, i in ps) for ps in parts]
  w = PoolWriter(sizes, train.feature_shape, train.x.dtype, train.y.dtype, train.divisor,
                 tuple(ids))
  for j, ps in enumerate(parts):
    a = int(w.offsets[j])
    for p, i in ps:
      s, e = int(p.offsets[i]), int(p.offsets[i + 1])
      w.x[a:a + e - s], w.y[a:a + e - s] = p.x[s:e], p.y[s:e]
      a += e - s
    w._done[j] = True
  return w.pool()


def _clientdata(clients: dict, ids, reshape=None):
  xs = [clients[c][0] if reshape is None else reshape(clients[c][0]) for c in ids]
  return from_client_arrays(xs, [np.asarray(clients[c][1], np.int32) for c in ids])


@register_task("femnist", paper="Reddi et al. 2021 (App. B-D); FEMNIST (LEAF)",
               summary="FEMNIST: 3,400 writers (TFF HDF5 or LEAF JSON in --data-dir, or "
                       "--source synthetic), 62 classes, Reddi et al.'s CNN, 1 local "
                       "epoch of batch 20, 10 clients per round",
               starting="the paper's settings: Reddi et al. 2021 App. D (EMNIST CR)")
def femnist(data_dir=None, source="auto", download=False, seed=0, num_clients=None,
            heldout_writers=0.0, train_eval_clients=TRAIN_EVAL_CLIENTS) -> Task:
  """Federated EMNIST (62 classes), one client per writer.

  Data: TFF's ``fed_emnist_{train,test}.h5`` (3,400 writers, each with its own test
  examples) or LEAF's FEMNIST JSON (``-t sample``: the same writers in train/ and test/;
  ``-t user``: disjoint writers, whose test/ writers then form the ``'ood'`` set);
  ``source='hf'``: the hub's ``flwrlabs/femnist`` by ``writer_id``
  (:func:`fedjax_inv.data.hf.femnist_pools`: 10% of each writer held out as its test
  examples); ``source='synthetic'``: :func:`fedjax_inv.data.federated_synthetic.femnist`.

  Sets: ``train`` = the training writers' training examples; ``'test'`` = the training
  writers' test examples, one client per writer (Reddi et al.'s evaluation on the test
  clients; FedGMA §5.1's "client sample test"); ``'ood'`` (when ``heldout_writers > 0``
  or LEAF's user split) = writers never trained on (FedGMA §5.2, Fig. 1a: "the
  remaining clients or writers are used for testing"), their training and test
  examples together. ``train_*`` metrics are computed on a fixed seeded sample of
  ``train_eval_clients`` training writers (None: all).

  Model: :func:`fedjax_inv.models.federated.femnist_cnn` (Reddi et al. App. B, Table 5:
  two 3×3 convolutions, max pool, dropout 0.25, dense 128, dropout 0.5, dense 62).
  Sets are packed host pools (``core.packed.PackedPool``): 8-bit pixels when every value
  is a multiple of 1/255 (EMNIST's are), decoded to ``[n, 28, 28, 1]`` float32 in [0, 1]
  (TFF: 1.0 is the background); a run keeps them on the host or pads them onto the
  device (``simulation.resolve_pool``). The synthetic pool is cached (memory-mapped) under
  ``core.packed.cache_root()``.
  Defaults (Reddi et al. App. D, EMNIST CR): 1,500 rounds of 10 clients, 1 local epoch
  of batch 20, client SGD lr 0.1 (their FedAvg grid's best, 10^-1), server lr 1.

  Args:
    num_clients: keep the first N writers (sorted ids) or N synthetic writers (None =
      all: 3,400).
    heldout_writers: fraction in [0, 1) of writers held out whole as ``'ood'``
      (FedGMA Fig. 1a; ``experiments/fedgma`` uses 0.1, LEAF's default 90/10 user split).
    train_eval_clients: training writers evaluated as ``train_*`` (None = all).

  Raises:
    FileNotFoundError: no files in ``data_dir`` (names both layouts and the fix).
    fedjax_inv.data.federated_files.DataFileError: a damaged file (one line: the file and
      what is wrong).
    ValueError: a bad ``source`` or ``heldout_writers``.
  """
  _check_source(source, "femnist")  # only source='hf' downloads, and only with download
  _check_fraction(heldout_writers)
  train, test, prov = _femnist_pools(data_dir, source, seed, num_clients, download)
  ids, held = _split_writers(list(train.ids), heldout_writers, seed)
  in_test = set(test.ids)
  with_test = [c for c in ids if c in in_test]  # none under LEAF's user split
  eval_sets = {"test": _writers(test, with_test)} if with_test else {}
  # LEAF's user split (test writers never trained on), and the held-out writers whole
  ood = sorted((in_test - set(train.ids)) | set(held))
  if ood:
    eval_sets["ood"] = _joined(train, test, ood)
  data = _writers(train, ids)
  from fedjax_inv.models.federated import femnist_cnn
  sizes = np.asarray(data.n)
  info = {**prov, "paper": "Reddi et al. 2021 App. B-D (EMNIST CR)",
          "num_clients": len(ids), "heldout_writers": sorted(held)[:20],
          "num_heldout_writers": len(held), "client_sizes": _sizes_info(sizes),
          "train_eval_clients": train_eval_clients}
  return Task("femnist", "multiclass", data, eval_sets, femnist_cnn(62), info,
              defaults=dict(rounds=1500, eval_every=50, clients_per_round=10,
                            local_epochs=1, batch_size=20, client_optimizer="sgd",
                            client_lr=0.1, weight_decay=0.0),
              train_eval=_train_eval(len(ids), seed, train_eval_clients))


def _shakespeare_clients(data_dir, source, seed, num_clients, max_examples):
  from fedjax_inv.data import federated_files as ff
  from fedjax_inv.data import federated_synthetic as syn
  rng = np.random.default_rng([int(seed), 0x5A0])
  if source == "synthetic":
    cap = None if max_examples is None else 2 * int(max_examples)
    d = syn.shakespeare(num_clients or syn.SHAKESPEARE_CLIENTS, seed, max_chars=cap)
    layout, note = "tff", (f"synthetic Shakespeare-shaped pool ({len(d['train'])} roles, "
                           "LEAF's size spread; generated text, not Shakespeare)")
    raw, src = d, "synthetic"
  else:
    layout, paths = _files(data_dir, "shakespeare", "shakespeare")
    if layout == "hdf5":
      raw = {s: ff.read_tff_shakespeare(paths[s]) for s in ("train", "test")}
      layout = "tff"
    else:
      raw = {s: ff.read_leaf(paths[s], "shakespeare", s) for s in ("train", "test")}
    src, note = f"{layout}: {paths['train']}", f"Shakespeare from {layout} files"
  out = {}
  for split, clients in raw.items():
    ids = sorted(clients)[:num_clients] if num_clients else sorted(clients)
    conv = {}
    for c in ids:
      if layout == "tff":
        x, y = ff.next_char_examples(clients[c], max_examples=max_examples, rng=rng)
      else:
        x, y = ff.leaf_shakespeare_examples(*clients[c])
        if max_examples is not None and len(y) > max_examples:
          keep = np.sort(rng.choice(len(y), int(max_examples), replace=False))
          x, y = x[keep], y[keep]
      if len(y):
        conv[c] = (x.astype(np.float32), y)
    out[split] = conv
  return out["train"], out["test"], {"dataset_source": src, "data_note": note}


@register_task("shakespeare", paper="Reddi et al. 2021 (App. B-D); LEAF",
               summary="Shakespeare next character: 715 speaking roles (TFF HDF5 or LEAF "
                       "JSON in --data-dir, or --source synthetic), 80-character context, "
                       "2-layer LSTM 256, 1 local epoch of batch 4, 10 clients per round",
               starting="the paper's settings: Reddi et al. 2021 App. D (Shakespeare)")
def shakespeare(data_dir=None, source="auto", download=False, seed=0, num_clients=None,
                max_examples=1000, train_eval_clients=TRAIN_EVAL_CLIENTS) -> Task:
  """Next-character prediction, one client per speaking role.

  Formulation: LEAF's (Caldas et al. 2019): an example is the 80 characters before a
  position (left-padded) and the label is the character there, over an 82-symbol
  vocabulary (LEAF's 80 characters, out-of-vocabulary, padding;
  ``federated_files.SHAKESPEARE_VOCAB``). TFF's snippets are cut into such examples at
  every position of every snippet (``federated_files.next_char_examples``); Reddi et
  al.'s TFF model predicts every position of a chunk at once, which this engine's one
  label per example does not express: a deliberate difference.

  Sets: ``train`` = roles' training examples; ``'test'`` = their test examples (one
  client per role). ``source='hf'``: the hub's ``flwrlabs/shakespeare`` (LEAF's
  examples) by ``character_id``, each role's last 20% of lines as its test examples
  (:func:`fedjax_inv.data.hf.shakespeare_pools`), packed as uint8 character ids.
  ``max_examples`` keeps a seeded random subset per client (default
  1,000; None = all: roles run to tens of thousands of characters, and the pool is
  padded to its largest client).

  Model: :func:`fedjax_inv.models.federated.char_lstm` (embedding 8, two LSTM layers of
  256, dense to the vocabulary; Reddi et al. App. B / LEAF). Defaults (Reddi et al. App.
  D, Shakespeare): 1,200 rounds of 10 clients, 1 local epoch of batch 4, client SGD lr 1.

  Raises: as :func:`femnist`.
  """
  _check_source(source, "shakespeare")
  from fedjax_inv.data import federated_files as ff
  from fedjax_inv.models.federated import char_lstm
  if source == "hf":  # packed pools (uint8 character ids), one client per character_id
    from fedjax_inv.data import hf
    data, test, prov = hf.shakespeare_pools(data_dir, download, seed, num_clients,
                                            max_examples)
    ids = list(data.ids)
    with_test = [c for c in ids if test is not None and c in set(test.ids)]
    eval_sets = {"test": _writers(test, with_test)} if with_test else {}
  else:
    train, test, prov = _shakespeare_clients(data_dir, source, seed, num_clients,
                                             max_examples)
    if not train:
      raise ValueError("shakespeare: no role has 2 or more characters of training text.")
    ids = sorted(train)
    data = _clientdata(train, ids)
    eval_sets = {"test": _clientdata(test, [c for c in ids if c in test])}
  info = {**prov, "paper": "Reddi et al. 2021 App. B-D; LEAF (next character)",
          "num_clients": len(ids), "max_examples": max_examples,
          "client_sizes": _sizes_info(np.asarray(data.n)),
          "vocab_size": ff.SHAKESPEARE_VOCAB_SIZE, "train_eval_clients": train_eval_clients}
  return Task("shakespeare", "multiclass", data, eval_sets,
              char_lstm(ff.SHAKESPEARE_VOCAB_SIZE), info,
              defaults=dict(rounds=1200, eval_every=50, clients_per_round=10,
                            local_epochs=1, batch_size=4, client_optimizer="sgd",
                            client_lr=1.0, weight_decay=0.0),
              train_eval=_train_eval(len(ids), seed, train_eval_clients))


def _crop(x, size: int = 24):
  """Center ``size``×``size`` crop of uint8 ``[n, 32, 32, 3]``, each image standardized
  (TFF's CIFAR-100 preprocessing, ``tf.image.per_image_standardization``: ``(x - mean) /
  max(std, 1/sqrt(#values))`` over the image's pixels and channels), float32."""
  o = (x.shape[1] - size) // 2
  c = np.asarray(x)[:, o:o + size, o:o + size].astype(np.float32)
  mean = c.mean(axis=(1, 2, 3), keepdims=True)
  std = np.maximum(c.std(axis=(1, 2, 3), keepdims=True), 1.0 / np.sqrt(c[0].size))
  return ((c - mean) / std).astype(np.float32)


@register_task("cifar100_fed", paper="Reddi et al. 2021 (App. B-D)",
               summary="CIFAR-100 over 500 clients (TFF's Pachinko split; TFF HDF5 in "
                       "--data-dir, or --source synthetic), ResNet-18 with GroupNorm, 24x24 "
                       "crops, 1 local epoch of batch 20, 10 clients per round",
               starting="the paper's settings: Reddi et al. 2021 App. D (CIFAR-100)")
def cifar100_fed(data_dir=None, source="auto", download=False, seed=0, num_clients=None,
                 train_eval_clients=TRAIN_EVAL_CLIENTS, partitioner=None) -> Task:
  """Federated CIFAR-100 (TFF's ``cifar100``: 500 training clients and 100 test clients
  of 100 images each, labels by a Pachinko allocation; Reddi et al. App. C).

  Sets: ``train`` = the 500 training clients; ``'test'`` = the 100 test clients.
  Images: the center 24×24 crop, standardized per image as TFF does (Reddi et al. crop
  to 24×24: a random crop for training and the center one for testing; this engine has
  no per-step augmentation, so training uses the center crop too — a deliberate
  difference).

  Model: :func:`fedjax_inv.models.federated.cifar100_resnet18` (ResNet-18 with GroupNorm
  of 2 groups and the ImageNet stem, as TFF's ``create_resnet18`` for 24×24 crops; it is
  the package's post-activation ResNet with stride-2 stages and a 512-d projection,
  where TFF's is pre-activation and keeps the stem's resolution: 11.49 M parameters
  against TFF's 11.23 M — a known difference). Defaults (App. D, CIFAR-100): 4,000
  rounds of 10 clients, 1 local epoch of batch 20, client SGD lr 0.1 (10^-1).

  ``source='hf'``: the hub's ``uoft-cs/cifar100``; TFF's Pachinko split is not on the
  hub, so the training split is partitioned by Flower Datasets' ``partitioner``
  (default ``dirichlet:alpha=0.1,num_partitions=500,by=fine_label,
  min_partition_size=1``; :func:`fedjax_inv.data.hf.make_partitioner`) and the test split
  i.i.d. over 100 clients; the 24×24 standardized crops are packed as float32.

  Raises: as :func:`femnist` (no LEAF layout exists for CIFAR-100).
  """
  _check_source(source, "cifar100_fed")
  if partitioner is not None and source != "hf":
    raise ValueError("cifar100_fed: partitioner= applies to --source hf only.")
  from fedjax_inv.data import federated_files as ff
  from fedjax_inv.data import federated_synthetic as syn
  from fedjax_inv.models.federated import cifar100_resnet18
  if source == "hf":
    from fedjax_inv.data import hf
    data, test, prov = hf.cifar100_pools(data_dir, download, seed, num_clients,
                                         partitioner, crop=_crop)
    ids = list(range(data.num_clients))
    eval_sets = {"test": test}
  elif source == "synthetic":
    d = syn.cifar100(num_clients or syn.CIFAR100_TRAIN_CLIENTS,
                     max(1, (num_clients or syn.CIFAR100_TRAIN_CLIENTS) // 5), seed=seed)
    train, test = d["train"], d["test"]
    prov = {"dataset_source": "synthetic", "data_note": (
        f"synthetic CIFAR-100-shaped pool ({len(train)} clients of 100; generated images)")}
  else:
    layout, paths = _files(data_dir, "cifar100", "cifar100_fed")
    train, test = ff.read_tff_cifar100(paths["train"]), ff.read_tff_cifar100(paths["test"])
    if num_clients:
      train = {c: train[c] for c in sorted(train)[:int(num_clients)]}
    prov = {"dataset_source": f"{layout}: {paths['train']}",
            "data_note": f"CIFAR-100 from TFF files in {data_dir}"}
  if source != "hf":
    ids = sorted(train)
    data = _clientdata(train, ids, _crop)
    eval_sets = {"test": _clientdata(test, sorted(test), _crop)}
  info = {**prov, "paper": "Reddi et al. 2021 App. B-D (CIFAR-100)", "num_clients": len(ids),
          "client_sizes": _sizes_info(np.asarray(data.n)), "crop": 24,
          "train_eval_clients": train_eval_clients}
  return Task("cifar100_fed", "multiclass", data, eval_sets, cifar100_resnet18(100), info,
              defaults=dict(rounds=4000, eval_every=100, clients_per_round=10,
                            local_epochs=1, batch_size=20, client_optimizer="sgd",
                            client_lr=0.1, weight_decay=0.0),
              train_eval=_train_eval(len(ids), seed, train_eval_clients))


__all__ = ["cifar100_fed", "femnist", "shakespeare"]
