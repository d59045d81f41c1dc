"""DomainBed image benchmarks as leave-one-domain-out federated tasks: ``pacs``, ``vlcs``,
``office_home``, ``domainnet`` (FedSR §5; FedIIR §5 and App. F.1).

Data layout (the standard DomainBed folders, read from ``data_dir``, else
``$FEDJAX_INV_DATA_DIR``; nothing is ever downloaded)::

  <data_dir>/PACS/{art_painting,cartoon,photo,sketch}/<class>/*.jpg|png
  <data_dir>/VLCS/{Caltech101,LabelMe,SUN09,VOC2007}/<class>/*.jpg|png
  <data_dir>/office_home/{Art,Clipart,Product,Real World}/<class>/*.jpg|png
  <data_dir>/domain_net/{clipart,infograph,painting,quickdraw,real,sketch}/<class>/*.jpg

Folder names are matched case-insensitively and ignoring spaces/underscores/hyphens
(``OfficeHome``, ``Real_World`` and ``DomainNet`` work too). Images (``.jpg .jpeg .png
.bmp .gif .ppm .tif .tiff .webp``) are decoded with Pillow, converted to RGB and resized
(squashed, bilinear) to ``image_size × image_size`` — DomainBed's evaluation transform
``Resize((224, 224))``. The papers' training augmentation (random resized crops, flips,
color jitter, grayscale; FedSR §5) is **not** applied: data are fixed arrays on device.
Class labels are the class folder names sorted alphabetically (torchvision
``ImageFolder``'s rule), over the union of all domains so every domain shares the
indices. DomainNet may instead come from a *prepared* tensorflow-datasets ``domainnet``
folder (``source='tfds'``, or ``'auto'`` when the image folders are absent), read with
``tfds.data_source(..., download=False)``; its labels are tfds's class indices.

Federated protocol (the shared domain-task contract): ``holdout`` (index or name) is the
test domain; every other (source) domain is split ``1 − val_fraction`` / ``val_fraction``
with the seed (FedSR §5, FedIIR §5: 90/10). Training clients: one per source domain, or
several per domain with ``clients_per_domain`` (each domain's training part split into
equal random parts) or ``num_clients`` (FedIIR App. F.1, Alg. 2). Evaluation sets:
``'val'`` = one client per source domain (its validation part; training-domain
validation), ``'ood'`` = the held-out domain as one client.

Memory: images are float32 ``[n, s, s, 3]`` in [0, 1] (the task contract), so full PACS
at 224×224 needs ≈6 GB; use ``image_size=64``–``96`` or ``max_images_per_domain`` on
small machines. Decoded images are cached in-process (one dataset) so a
leave-one-domain-out sweep decodes them once.
"""
from __future__ import annotations

import concurrent.futures
import os
import pathlib
import re
from typing import Sequence

import numpy as np

from fedjax_inv.core.data import from_client_arrays
from fedjax_inv.tasks import Task, register_task

__all__ = ["DATASETS", "build_domain_task", "find_dataset_dir", "load_domainbed",
           "resolve_holdout"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".ppm", ".tif", ".tiff",
                    ".webp")

# name -> (folder candidates, domain folders in DomainBed order, number of classes, arch)
DATASETS = {
    "pacs": (("PACS",), ("art_painting", "cartoon", "photo", "sketch"), 7, 18),
    "vlcs": (("VLCS",), ("Caltech101", "LabelMe", "SUN09", "VOC2007"), 5, 18),
    "office_home": (("office_home", "OfficeHome", "OfficeHomeDataset_10072016"),
                    ("Art", "Clipart", "Product", "Real World"), 65, 50),
    "domainnet": (("domain_net", "DomainNet"),
                  ("clipart", "infograph", "painting", "quickdraw", "real", "sketch"), 345,
                  50),
}

SOURCES = ("auto", "raw", "tfds")


def _key(name: str) -> str:
  return re.sub(r"[\s_\-]", "", name).lower()


def _layout(dataset: str) -> str:
  dirs, domains, _, _ = DATASETS[dataset]
  return (f"<data_dir>/{dirs[0]}/<domain>/<class>/<image>.jpg|png with domains "
          f"{list(domains)} (the DomainBed layout)")


def find_dataset_dir(dataset: str, data_dir) -> pathlib.Path:
  """The dataset's root folder under ``data_dir`` (names matched loosely, see module doc).

  Raises:
    ValueError: unknown dataset.
    FileNotFoundError: ``data_dir`` unset/missing or no matching folder; the message names
      the expected layout.
  """
  if dataset not in DATASETS:
    raise ValueError(f"unknown DomainBed dataset {dataset!r}; choose one of "
                     f"{sorted(DATASETS)}.")
  if data_dir is None:
    from fedjax_inv.data.sources import default_data_dir
    data_dir = default_data_dir()
  if data_dir is None:
    raise FileNotFoundError(
        f"{dataset}: no data directory given. Pass data_dir=... (CLI --data-dir) or set "
        f"$FEDJAX_INV_DATA_DIR, with the images laid out as {_layout(dataset)}. The "
        "data is never downloaded; get it with DomainBed's "
        "`python -m domainbed.scripts.download` or from the dataset's site.")
  root = pathlib.Path(data_dir).expanduser()
  if not root.is_dir():
    raise FileNotFoundError(f"{dataset}: data directory '{root}' does not exist; expected "
                            f"{_layout(dataset)}.")
  wanted = {_key(d) for d in DATASETS[dataset][0]} | {_key(dataset)}
  for child in sorted(root.iterdir()):
    if child.is_dir() and _key(child.name) in wanted:
      return child
  raise FileNotFoundError(f"{dataset}: no folder {DATASETS[dataset][0][0]!r} in '{root}'; "
                          f"expected {_layout(dataset)}.")


def _list_images(folder: pathlib.Path) -> list[pathlib.Path]:
  return sorted(p for p in folder.iterdir()
                if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)


def _decode(path: pathlib.Path, size: int) -> np.ndarray:
  from PIL import Image
  try:
    with Image.open(path) as im:
      im = im.convert("RGB")
      if im.size != (size, size):
        im = im.resize((size, size), Image.Resampling.BILINEAR)
      return np.asarray(im, np.uint8)
  except OSError as e:
    raise ValueError(f"cannot decode image '{path}' ({e}); remove or replace it.") from e


def _decode_many(paths: Sequence[pathlib.Path], size: int) -> np.ndarray:
  if not paths:
    return np.zeros((0, size, size, 3), np.uint8)
  workers = max(1, min(8, os.cpu_count() or 1))
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    return np.stack(list(pool.map(lambda p: _decode(p, size), paths, chunksize=64)))


def _load_folders(dataset: str, root: pathlib.Path, size: int, max_per_domain, seed: int):
  domains = DATASETS[dataset][1]
  subdirs = {_key(d.name): d for d in root.iterdir() if d.is_dir()}
  missing = [d for d in domains if _key(d) not in subdirs]
  if missing:
    raise FileNotFoundError(f"{dataset}: domain folder(s) {missing} missing in '{root}' "
                            f"(found {sorted(p.name for p in subdirs.values())}); expected "
                            f"{_layout(dataset)}.")
  per_domain = {}
  for d in domains:
    classes = {c.name: _list_images(c) for c in subdirs[_key(d)].iterdir() if c.is_dir()}
    per_domain[d] = {c: v for c, v in classes.items() if v}
  classes = sorted(set().union(*(set(v) for v in per_domain.values())))
  if not classes:
    raise FileNotFoundError(f"{dataset}: no images under '{root}'; expected "
                            f"{_layout(dataset)}.")
  cls_index = {c: i for i, c in enumerate(classes)}
  rng = np.random.default_rng(seed)
  out = []
  for d in domains:
    paths = [(p, cls_index[c]) for c in sorted(per_domain[d]) for p in per_domain[d][c]]
    if not paths:
      raise FileNotFoundError(f"{dataset}: domain folder '{subdirs[_key(d)]}' holds no "
                              f"images; expected {_layout(dataset)}.")
    if max_per_domain is not None and len(paths) > max_per_domain:
      keep = np.sort(rng.choice(len(paths), int(max_per_domain), replace=False))
      paths = [paths[i] for i in keep]
    x = _decode_many([p for p, _ in paths], size)
    y = np.asarray([c for _, c in paths], np.int32)
    out.append((x, y))
  return out, classes, f"image folders under {root}"


def _load_tfds_domainnet(data_dir, size: int, max_per_domain, seed: int):
  import tensorflow_datasets as tfds
  from PIL import Image
  rng = np.random.default_rng(seed)
  out = []
  for d in DATASETS["domainnet"][1]:
    xs, ys = [], []
    for split in ("train", "test"):
      src = tfds.data_source(f"domainnet/{d}", split=split, download=False,
                             data_dir=None if data_dir is None else str(data_dir))
      for i in range(len(src)):
        r = src[i]
        im = Image.fromarray(np.asarray(r["image"], np.uint8)).convert("RGB")
        xs.append(np.asarray(im.resize((size, size), Image.Resampling.BILINEAR)))
        ys.append(int(r["label"]))
    idx = np.arange(len(xs))
    if max_per_domain is not None and len(xs) > max_per_domain:
      idx = np.sort(rng.choice(len(xs), int(max_per_domain), replace=False))
    out.append((np.stack([xs[i] for i in idx]), np.asarray(ys, np.int32)[idx]))
  classes = [str(c) for c in range(DATASETS["domainnet"][2])]
  return out, classes, "prepared tfds 'domainnet' (train+test splits)"


_CACHE: dict = {}


def load_domainbed(dataset: str, data_dir=None, *, source: str = "auto",
                   image_size: int = 224, max_images_per_domain: int | None = None,
                   seed: int = 0):
  """Decodes a DomainBed dataset into per-domain uint8 arrays.

  Args:
    dataset: 'pacs' | 'vlcs' | 'office_home' | 'domainnet'.
    data_dir: folder holding the dataset folder (default ``$FEDJAX_INV_DATA_DIR``).
    source: 'auto' | 'raw' (image folders) | 'tfds' (DomainNet only; prepared folder).
    image_size: output side length in pixels.
    max_images_per_domain: keep a seeded random subset of at most this many images per
      domain (None = all).
    seed: seeds that subset.

  Returns:
    ``(domains, classes, note)``: ``domains`` = ``[(x uint8 [n_d, s, s, 3], y int32
    [n_d])]`` in DomainBed's domain order, ``classes`` the sorted class names, ``note`` a
    provenance string. Results are cached in-process (most recent call only).

  Raises:
    ValueError: unknown dataset/source, bad sizes, undecodable image.
    FileNotFoundError: missing data; the message gives the expected layout.
  """
  if dataset not in DATASETS:
    raise ValueError(f"unknown DomainBed dataset {dataset!r}; choose one of "
                     f"{sorted(DATASETS)}.")
  if source not in SOURCES:
    raise ValueError(f"source={source!r}; choose one of {SOURCES} (nothing is downloaded).")
  if source == "tfds" and dataset != "domainnet":
    raise ValueError(f"source='tfds' is only supported for domainnet, not {dataset!r}; "
                     "use source='raw' with the image folders.")
  if int(image_size) != image_size or image_size < 1:
    raise ValueError(f"image_size={image_size!r}; use a positive number of pixels "
                     "(224 in the papers).")
  if max_images_per_domain is not None and (int(max_images_per_domain) !=
                                            max_images_per_domain or
                                            max_images_per_domain < 2):
    raise ValueError(f"max_images_per_domain={max_images_per_domain!r}; use an integer "
                     ">= 2 or None for all images.")
  key = (dataset, str(data_dir), source, int(image_size), max_images_per_domain, seed)
  if key in _CACHE:
    return _CACHE[key]
  folder_error = None
  result = None
  if source in ("auto", "raw"):
    try:
      root = find_dataset_dir(dataset, data_dir)
      result = _load_folders(dataset, root, int(image_size), max_images_per_domain, seed)
    except FileNotFoundError as e:
      if source == "raw" or dataset != "domainnet":
        raise
      folder_error = e
  if result is None:
    try:
      result = _load_tfds_domainnet(data_dir, int(image_size), max_images_per_domain, seed)
    except Exception as e:  # pylint: disable=broad-except
      reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
      where = "the default tfds data dir" if data_dir is None else f"'{data_dir}'"
      msg = (f"no prepared tfds 'domainnet' dataset (array_record format) in {where} "
             f"({reason})")
      msg = (f"{folder_error} Also {msg}." if folder_error is not None else
             f"domainnet: {msg}; prepare it with tfds (file_format=array_record) or use "
             f"the image folders: {_layout('domainnet')}.")
      raise FileNotFoundError(msg) from e
  _CACHE.clear()
  _CACHE[key] = result
  return result


def resolve_holdout(holdout, domains: Sequence[str]) -> int:
  """Index of the held-out domain given as an index or a name (loose match).

  Raises:
    ValueError: out-of-range index or unknown name (lists the domains).
  """
  domains = list(domains)
  if isinstance(holdout, (int, np.integer)) and not isinstance(holdout, bool):
    if not 0 <= int(holdout) < len(domains):
      raise ValueError(f"holdout={holdout}; use an index in 0..{len(domains) - 1} or a "
                       f"name in {domains}.")
    return int(holdout)
  if isinstance(holdout, str):
    keys = [_key(d) for d in domains]
    if _key(holdout) in keys:
      return keys.index(_key(holdout))
    if holdout.isdigit():
      return resolve_holdout(int(holdout), domains)
  raise ValueError(f"holdout={holdout!r} is not a domain; choose one of {domains} (or its "
                   "index).")


def build_domain_task(name: str, domains: Sequence[tuple[np.ndarray, np.ndarray]],
                      domain_names: Sequence[str], *, holdout, val_fraction: float,
                      seed: int, model, kind: str, info: dict, defaults: dict,
                      clients_per_domain: int | None = None,
                      num_clients: int | None = None) -> Task:
  """Leave-one-domain-out ``Task`` from per-domain arrays (the shared domain-task contract).

  Args:
    name: task name.
    domains: ``M`` pairs ``(x [n_d, ...] uint8 in 0..255 or float in [0, 1], y [n_d])``.
    domain_names: ``M`` names, in the same order.
    holdout: held-out (test) domain, index or name.
    val_fraction: validation fraction of each source domain, in [0, 1) (FedSR §5 /
      FedIIR §5: 0.1). With 0 the 'val' set is omitted.
    seed: seeds the train/validation splits and the client partition.
    model, kind, defaults: the ``Task`` fields.
    info: extra provenance merged into ``Task.info``.
    clients_per_domain: split each source domain's training part into this many clients.
    num_clients: total training clients, distributed over domains by FedIIR App. F.1
      Alg. 2 (exclusive with ``clients_per_domain``).

  Returns:
    ``Task`` with ``train`` (source-domain clients), ``eval_sets = {'val': one client per
    source domain, 'ood': the held-out domain}`` and ``info['domains']``,
    ``info['holdout']``, ``info['client_domains']``.

  Raises:
    ValueError: bad holdout, fraction or client counts.
  """
  from fedjax_inv.data import partition
  names = list(domain_names)
  if len(names) != len(domains) or len(names) < 2:
    raise ValueError(f"{name}: need >= 2 domains with one name each, got {len(domains)} "
                     f"domains and names {names}.")
  h = resolve_holdout(holdout, names)
  if clients_per_domain is not None and num_clients is not None:
    raise ValueError("pass clients_per_domain or num_clients, not both.")
  rng = np.random.default_rng(seed)

  def as_float(x):
    x = np.asarray(x)
    if x.dtype == np.uint8:
      return partition.to_float_images(x)
    return x.astype(np.float32)

  sources = [m for m in range(len(names)) if m != h]
  train_parts, val_x, val_y = [], [], []
  for m in sources:
    x, y = domains[m]
    tr, va = partition.train_val_split(len(y), val_fraction, rng)
    train_parts.append((x, y, tr))
    if len(va):
      val_x.append(as_float(x[va]))
      val_y.append(np.asarray(y)[va])
  sizes = [len(tr) for _, _, tr in train_parts]
  if clients_per_domain is not None:
    clients, owner = partition.split_each_domain(sizes, clients_per_domain, seed=seed)
  elif num_clients is not None:
    clients, owner = partition.split_domains_to_clients(sizes, num_clients, seed=seed)
  else:
    clients, owner = [np.arange(s) for s in sizes], np.arange(len(sizes))
  xs, ys = [], []
  for idx, o in zip(clients, owner):
    x, y, tr = train_parts[int(o)]
    sel = tr[idx]
    xs.append(as_float(x[sel]))
    ys.append(np.asarray(y)[sel].astype(np.int32))
  eval_sets = {}
  if val_x:
    eval_sets["val"] = from_client_arrays(val_x, [v.astype(np.int32) for v in val_y])
  hx, hy = domains[h]
  eval_sets["ood"] = from_client_arrays([as_float(hx)], [np.asarray(hy).astype(np.int32)])
  full_info = dict(info)
  full_info.update(
      domains=names, holdout=names[h],
      source_domains=[names[m] for m in sources],
      client_domains=[names[sources[int(o)]] for o in owner],
      val_fraction=val_fraction,
      split_sizes={"train": [len(y) for y in ys], "val": [len(v) for v in val_y],
                   "ood": int(len(hy))})
  return Task(name, kind, from_client_arrays(xs, ys), eval_sets, model, full_info,
              defaults=dict(defaults))


def _domainbed_task(dataset: str, *, data_dir, source, download, seed, holdout,
                    val_fraction, image_size, max_images_per_domain, clients_per_domain,
                    num_clients, arch, base_width, feature_dim, classifier_hidden,
                    small_input, pretrained) -> Task:
  from fedjax_inv.models import resnet as resnet_lib
  if download:
    raise ValueError(f"{dataset}: download=True is not supported (DomainBed datasets are "
                     f"large and licensed per dataset); place them as {_layout(dataset)}.")
  if arch is None:
    arch = f"resnet{DATASETS[dataset][3]}"
  depths = {"resnet18": 18, "resnet34": 34, "resnet50": 50}
  if arch not in depths:
    raise ValueError(f"arch={arch!r}; choose one of {sorted(depths)}.")
  domains, classes, note = load_domainbed(dataset, data_dir, source=source,
                                          image_size=image_size,
                                          max_images_per_domain=max_images_per_domain,
                                          seed=seed)
  names = list(DATASETS[dataset][1])
  resolve_holdout(holdout, names)  # fail early, before building the model
  if small_input is None:
    small_input = image_size < 96
  model = resnet_lib.resnet(depths[arch], len(classes), feature_dim=feature_dim,
                            base_width=base_width, small_input=small_input,
                            classifier_hidden=classifier_hidden)
  if pretrained is not None:
    model = resnet_lib.with_pretrained(model, pretrained)
  sizes = {n: int(len(y)) for n, (_, y) in zip(names, domains)}
  info = {
      "paper": "FedSR §5; FedIIR §5 / App. F.1 (DomainBed, leave-one-domain-out)",
      "dataset_source": note,
      "data_note": (f"{dataset}: {sum(sizes.values()):,} images ({sizes}), "
                    f"{len(classes)} classes, resized to {image_size}x{image_size}"
                    + (f", at most {max_images_per_domain} per domain"
                       if max_images_per_domain else "") + "; no augmentation"),
      "classes": classes,
      "image_size": int(image_size),
      "model": f"{arch} (GroupNorm), feature_dim "
               f"{model.feature_dim}, classifier "
               f"{'linear' if classifier_hidden is None else f'2-layer ({classifier_hidden})'}"
               + (f", pretrained featurizer from {pretrained}" if pretrained else ""),
  }
  defaults = dict(rounds=100, eval_every=5, local_steps=5, batch_size=32,
                  client_optimizer="momentum", client_lr=0.01, weight_decay=5e-4)
  return build_domain_task(dataset, domains, names, holdout=holdout,
                           val_fraction=val_fraction, seed=seed, model=model,
                           kind="multiclass", info=info, defaults=defaults,
                           clients_per_domain=clients_per_domain, num_clients=num_clients)


_DOC = """{title} (leave-one-domain-out; {paper}).

  Domains: {domains}. Data: ``<data_dir>/{folder}/<domain>/<class>/*`` (module docstring);
  FileNotFoundError naming that layout when absent. Model: GroupNorm {arch_default}
  featurizer with the papers' linear projection to {fdim} and a linear classifier
  (``classifier_hidden=int`` for FedIIR's two-layer classifier).

  Args:
    data_dir, source, download, seed: as every task (``download`` must stay False;
      ``source`` 'auto' | 'raw'{tfds}).
    holdout: test domain (index or name); ``val_fraction``: validation share of each
      source domain (0.1).
    image_size: pixels per side (224 in the papers; small values for CPU runs).
    max_images_per_domain: seeded subset size per domain (None = all).
    clients_per_domain / num_clients: many clients per domain (FedIIR App. F.1).
    arch: 'resnet18' | 'resnet34' | 'resnet50' (default {arch_default});
      base_width (64), feature_dim (None = 512 / 2048), classifier_hidden (None),
      small_input (None = CIFAR stem when image_size < 96).
    pretrained: optional ``.npz`` of featurizer weights (``models.resnet.load_pretrained``).

  Defaults: 100 rounds, 5 local steps of SGD with momentum 0.9, lr 0.01, weight decay
  5e-4, batch 32, evaluation every 5 rounds. Papers: FedSR §5 uses SGD (lr 0.01,
  momentum 0.9, weight decay 5e-4, batch 64, E=5 local steps, 5000 iterations); FedIIR
  §5 / App. F.3 uses 100 rounds of one local epoch of SGD, batch 32, lr {iir_lr}.

  Raises:
    ValueError: bad arguments (unknown holdout, arch, sizes) or ``download=True``.
    FileNotFoundError: data missing.
  """


def _register(dataset: str, title: str, paper: str, iir_lr: str):
  dirs, domains, ncls, depth = DATASETS[dataset]

  def builder(data_dir=None, source="auto", download=False, seed=0, holdout=0,
              val_fraction=0.1, image_size=224, max_images_per_domain=None,
              clients_per_domain=None, num_clients=None, arch=None, base_width=64,
              feature_dim=None, classifier_hidden=None, small_input=None,
              pretrained=None):
    return _domainbed_task(dataset, data_dir=data_dir, source=source, download=download,
                           seed=seed, holdout=holdout, val_fraction=val_fraction,
                           image_size=image_size,
                           max_images_per_domain=max_images_per_domain,
                           clients_per_domain=clients_per_domain, num_clients=num_clients,
                           arch=arch, base_width=base_width, feature_dim=feature_dim,
                           classifier_hidden=classifier_hidden, small_input=small_input,
                           pretrained=pretrained)

  builder.__name__ = dataset
  builder.__qualname__ = dataset
  builder.__doc__ = _DOC.format(
      title=title, paper=paper, domains=", ".join(domains), folder=dirs[0],
      arch_default=f"ResNet-{depth}", fdim=512 if depth == 18 else 2048,
      tfds=" | 'tfds'" if dataset == "domainnet" else "", iir_lr=iir_lr)
  register_task(dataset, paper=paper,
                summary=(f"{len(domains)} domains ({', '.join(domains)}), {ncls} classes; "
                         f"ResNet-{depth} (GroupNorm); needs the DomainBed image folders "
                         f"in <data_dir>/{dirs[0]}/"))(builder)
  return builder


pacs = _register("pacs", "PACS", "FedSR §5 (Table 2); FedIIR §5 (Table 1, App. Table 6)",
                 "2.5e-3")
vlcs = _register("vlcs", "VLCS", "FedIIR §5 (Table 1, App. Table 5)", "1e-3")
office_home = _register("office_home", "OfficeHome",
                        "FedSR §5 (Table 3); FedIIR §5 (Table 1, App. Table 7)", "1e-3")
domainnet = _register("domainnet", "DomainNet", "FedSR §5 (Table 4)", "(not used there)")
