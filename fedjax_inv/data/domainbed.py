"""DomainBed image benchmarks: the loader of ``pacs``, ``vlcs``, ``office_home``,
``domainnet`` (FedSR §5; FedIIR §5 and App. F.1); the leave-one-domain-out tasks built
from it are in ``fedjax_inv/tasks/domainbed.py``.

Data layout (the standard DomainBed folders, read from ``data_dir``, else
``$FEDJAX_INV_DATA_DIR``; nothing is downloaded unless ``source='hf'`` with
``download=True``)::

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
PACS and OfficeHome may come from their Hugging Face hub copies (``source='hf'``:
``flwrlabs/pacs``, ``flwrlabs/office-home``; one Flower natural-id partition per
``domain``, read from a local copy, the cache or, with ``download``, the hub;
``fedjax_inv.data.hf``); their images get the same conversion, and the labels are the
hub's class names sorted, as the folders' are.

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

from fedjax_inv.data.partition import resolve_holdout  # noqa: E402,F401  (re-export)

__all__ = ["DATASETS", "find_dataset_dir", "load_domainbed", "resolve_holdout"]

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

DOMAINBED_SOURCES = ("auto", "raw", "tfds", "hf")


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


def _pil_image():
  """``PIL.Image``; ModuleNotFoundError with the install command when Pillow is absent."""
  try:
    from PIL import Image
  except ImportError as e:
    raise ModuleNotFoundError(
        "Pillow is not installed (it decodes DomainBed images); install it with: "
        "pip install 'fedjax_inv[domainbed]' (or pip install pillow)") from e
  return Image


def _to_array(im, size: int) -> np.ndarray:
  """A PIL image as uint8 ``[size, size, 3]``: RGB, squashed to the size (bilinear)."""
  Image = _pil_image()
  im = im.convert("RGB")
  if im.size != (size, size):
    im = im.resize((size, size), Image.Resampling.BILINEAR)
  return np.asarray(im, np.uint8)


def _decode(path: pathlib.Path, size: int) -> np.ndarray:
  Image = _pil_image()
  try:
    with Image.open(path) as im:
      return _to_array(im, size)
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
  Image = _pil_image()

  from fedjax_inv.data.sources import import_tfds
  tfds = import_tfds()
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


def _load_hub(dataset: str, data_dir, download: bool, size: int, max_per_domain,
              seed: int):
  """The hub copy of ``dataset`` (``hf.HUB_NAMES``) as :func:`_load_folders` returns the
  folders: per domain in DomainBed's order, a seeded subset of at most
  ``max_per_domain`` rows (the partition's row order), converted by :func:`_to_array`."""
  from fedjax_inv.data import hf
  name = hf.HUB_NAMES[dataset]
  parts, label_names, prov = hf.domain_partitions(name, data_dir, download)
  by_key = {_key(d): d for d in parts}
  missing = [d for d in DATASETS[dataset][1] if _key(d) not in by_key]
  if missing:
    raise FileNotFoundError(f"{dataset}: the hub copy {name} has domains {sorted(parts)}, "
                            f"not {missing}.")
  classes = sorted(label_names)
  to_sorted = np.asarray([classes.index(c) for c in label_names], np.int32)
  rng = np.random.default_rng(seed)
  out = []
  for d in DATASETS[dataset][1]:
    part = parts[by_key[_key(d)]]
    if max_per_domain is not None and len(part) > max_per_domain:
      part = part.select(np.sort(rng.choice(len(part), int(max_per_domain),
                                            replace=False)).tolist())
    rows = part.with_format(None)
    x = np.stack([_to_array(im, size) for im in rows["image"]])
    out.append((x, to_sorted[np.asarray(rows["label"], np.int64)]))
  return out, classes, f"{prov['dataset_source']} (Flower Datasets, one client per domain)"


_CACHE: dict = {}


def load_domainbed(dataset: str, data_dir=None, *, source: str = "auto",
                   image_size: int = 224, max_images_per_domain: int | None = None,
                   seed: int = 0, download: bool = False):
  """Decodes a DomainBed dataset into per-domain uint8 arrays.

  Args:
    dataset: 'pacs' | 'vlcs' | 'office_home' | 'domainnet'.
    data_dir: folder holding the dataset folder (default ``$FEDJAX_INV_DATA_DIR``).
    source: 'auto' | 'raw' (image folders) | 'tfds' (DomainNet only; prepared folder) |
      'hf' (PACS and OfficeHome: the Hugging Face hub's copy, ``hf.HUB_NAMES``).
    image_size: output side length in pixels.
    max_images_per_domain: keep a seeded random subset of at most this many images per
      domain (None = all).
    seed: seeds that subset.
    download: with ``source='hf'`` only, fetch the hub copy when no local copy or cache
      has it (short timeouts).

  Returns:
    ``(domains, classes, note)``: ``domains`` = ``[(x uint8 [n_d, s, s, 3], y int32
    [n_d])]`` in DomainBed's domain order, ``classes`` the sorted class names, ``note`` a
    provenance string. Results are cached in-process (most recent call only).

  Raises:
    ValueError: unknown dataset/source, a source the dataset lacks (names the datasets
      that have it), ``download`` without ``source='hf'``, bad sizes, undecodable image.
    FileNotFoundError: missing data; the message gives the expected layout (for
      ``source='hf'``: one line naming the dataset, the cache and how to pre-download).
  """
  if dataset not in DATASETS:
    raise ValueError(f"unknown DomainBed dataset {dataset!r}; choose one of "
                     f"{sorted(DATASETS)}.")
  if source not in DOMAINBED_SOURCES:
    raise ValueError(f"source={source!r}; choose one of {DOMAINBED_SOURCES} (nothing is "
                     "downloaded).")
  if source == "tfds" and dataset != "domainnet":
    raise ValueError(f"source='tfds' is only supported for domainnet, not {dataset!r}; "
                     "use source='raw' with the image folders.")
  from fedjax_inv.data.hf import HUB_NAMES
  hub = [d for d in DATASETS if d in HUB_NAMES]
  if source == "hf" and dataset not in hub:
    raise ValueError(f"source='hf': the Hugging Face hub has no copy of {dataset!r} in "
                     f"DomainBed's layout that this loader reads (it reads {hub}); use "
                     "source='raw' with the image folders.")
  if download and source != "hf":
    raise ValueError(f"{dataset}: download=True needs source='hf' (the hub copies of "
                     f"{hub}); otherwise place the images as {_layout(dataset)}.")
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
  if source == "hf":
    result = _load_hub(dataset, data_dir, bool(download), int(image_size),
                       max_images_per_domain, seed)
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
