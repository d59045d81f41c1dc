"""Synthetic stand-ins of the standard federated datasets (FEMNIST, Shakespeare,
CIFAR-100): generated pools with the real client count and the real per-client size
distribution, so that benchmarks and CI exercise the real shapes without the files.

The contents are learnable but not the real data: class templates plus per-client style
and noise (images), or a per-client Markov chain over the characters (text). Accuracy on
them says nothing about the real datasets; speed, memory and padding do.

Sources of the shapes:

* FEMNIST (TensorFlow Federated's ``emnist`` with ``only_digits=False``): 3,400 writers,
  671,585 training and 77,483 test examples (TFF's dataset documentation), i.e. 197.5
  training examples per writer on average. The spread follows LEAF's Table 1 for its
  FEMNIST (3,550 writers, 226.83 ± 88.94 samples per writer): the same coefficient of
  variation, 0.392, so sizes are drawn from a normal of mean 197.5 and standard deviation
  77.4, rounded, floored at 2, and rescaled to the published total. (The per-writer counts
  themselves are not published; the draw gives writers from under 10 to about 480.)
* Shakespeare: TFF's 715 speaking roles (16,068 training / 2,356 test snippets); the
  characters per role follow LEAF's Table 1 (3,743.2 ± 6,212.26 samples per role over
  1,129 roles), drawn log-normal with that mean and standard deviation, then capped at
  the task's ``max_examples`` per client as the real-file reader caps them.
* CIFAR-100 (TFF's ``cifar100``): 500 training clients of exactly 100 images each and 100
  test clients of 100 (Reddi et al. 2021 App. C: a Pachinko allocation of the labels);
  here each client's labels follow a Dirichlet(0.1) draw over the 100 classes as a
  stand-in for the two-level Pachinko allocation.
"""
from __future__ import annotations

import numpy as np

FEMNIST_CLIENTS, FEMNIST_TRAIN, FEMNIST_TEST = 3400, 671_585, 77_483
FEMNIST_CV = 88.94 / 226.83  # LEAF Table 1
SHAKESPEARE_CLIENTS = 715
SHAKESPEARE_MEAN, SHAKESPEARE_STD = 3743.2, 6212.26  # LEAF Table 1 (characters per role)
CIFAR100_TRAIN_CLIENTS, CIFAR100_TEST_CLIENTS, CIFAR100_PER_CLIENT = 500, 100, 100


def femnist_sizes(num_clients: int = FEMNIST_CLIENTS, seed: int = 0,
                  total: int | None = None) -> np.ndarray:
  """``[num_clients]`` int training-set sizes with FEMNIST's distribution (module
  docstring): normal of mean ``total / num_clients`` and coefficient of variation 0.392,
  floored at 2, rescaled so they sum to ``total`` (default: TFF's 671,585 scaled to
  ``num_clients``). Raises ValueError for ``num_clients < 1``."""
  if int(num_clients) < 1:
    raise ValueError(f"num_clients={num_clients!r}; need at least 1 writer.")
  total = int(round(FEMNIST_TRAIN * num_clients / FEMNIST_CLIENTS)) if total is None else total
  rng = np.random.default_rng([int(seed), 0xFE1])
  mean = total / num_clients
  s = np.maximum(rng.normal(mean, FEMNIST_CV * mean, num_clients), 2.0)
  s = np.maximum(np.round(s * total / s.sum()), 2).astype(np.int64)
  return s


def _templates(rng, k: int, shape: tuple, smooth: int = 3) -> np.ndarray:
  """``[k, *shape]`` float32 class templates in [0, 1]: box-smoothed uniform noise,
  thresholded into blobs (a stand-in for strokes)."""
  t = rng.random((k,) + shape).astype(np.float32)
  for ax in (1, 2):
    t = sum(np.roll(t, s, axis=ax) for s in range(-smooth // 2 + 1, smooth // 2 + 1)) / smooth
  return (t > np.quantile(t, 0.7, axis=(1, 2), keepdims=True)).astype(np.float32)


def _images(rng, templates, sizes, noise: float):
  """Per client: labels uniform over the classes, images = its template rolled by a
  per-client offset (the writer's style) plus Gaussian noise, clipped to [0, 1]."""
  k = templates.shape[0]
  out = []
  for n in sizes:
    y = rng.integers(0, k, int(n)).astype(np.int32)
    dy, dx = rng.integers(-2, 3, 2)
    x = np.roll(templates[y], (int(dy), int(dx)), axis=(1, 2))
    x = np.clip(x + noise * rng.standard_normal(x.shape, dtype=np.float32), 0.0, 1.0)
    out.append((x.astype(np.float32), y))
  return out


# The generator's version, part of a cached pool's key: 2 = 8-bit pixels (as EMNIST's),
# written straight into packed pools; 1 (before) kept float32 pixels.
FEMNIST_VERSION = 2


def femnist_pools(num_clients: int = FEMNIST_CLIENTS, seed: int = 0):
  """A FEMNIST-shaped pool, packed: ``(ids, train, test)`` with ``train`` / ``test``
  :class:`fedjax_inv.core.packed.PackedPool` of ``uint8 [T, 28, 28, 1]`` pixels (decoded
  ``/ 255`` to [0, 1]) and int32 labels in 0..61, one client per writer in ``ids``
  order (``f0000_00`` style, sorted). Training sizes :func:`femnist_sizes`, test sizes
  ``max(1, round(n * 77,483 / 671,585))`` (TFF's ratio). Each writer's images are made
  and quantized one writer at a time into the preallocated pool (peak memory: the
  8-bit pool, 0.59 GB at 3,400 writers). Raises ValueError for ``num_clients < 1``."""
  from fedjax_inv.core.packed import PoolWriter
  sizes = femnist_sizes(num_clients, seed)
  rng = np.random.default_rng([int(seed), 0xFE2])
  tmpl = _templates(rng, 62, (28, 28))
  test_sizes = np.maximum(1, np.round(sizes * FEMNIST_TEST / FEMNIST_TRAIN)).astype(int)
  ids = tuple(f"f{i:04d}_{i % 100:02d}" for i in range(len(sizes)))
  tw = PoolWriter(sizes, (28, 28, 1), np.uint8, np.int32, 255.0, ids)
  sw = PoolWriter(test_sizes, (28, 28, 1), np.uint8, np.int32, 255.0, ids)
  for i, (n, m) in enumerate(zip(sizes, test_sizes)):
    (x, y), = _images(rng, tmpl, [n + m], noise=0.3)
    q = np.rint(x * 255.0).astype(np.uint8)[..., None]
    for w, part, lab in ((tw, q[:n], y[:n]), (sw, q[n:], y[n:])):
      a, b = int(w.offsets[i]), int(w.offsets[i + 1])
      w.x[a:b], w.y[a:b] = part, lab
      w._done[i] = True
  return ids, tw.pool(), sw.pool()


def femnist(num_clients: int = FEMNIST_CLIENTS, seed: int = 0) -> dict:
  """A FEMNIST-shaped pool as per-writer arrays: ``{'train': {writer: (x float32 [n,
  28, 28] in [0, 1], multiples of 1/255; y int32 [n] in 0..61)}, 'test': {writer: (x,
  y)}}``: :func:`femnist_pools` decoded. Raises ValueError for ``num_clients < 1``."""
  ids, train, test = femnist_pools(num_clients, seed)

  def per_writer(pool):
    out = {}
    for i, c in enumerate(ids):
      x, y = pool.client(i)
      out[c] = (x[..., 0], y)
    return out
  return {"train": per_writer(train), "test": per_writer(test)}


def cifar100(train_clients: int = CIFAR100_TRAIN_CLIENTS,
             test_clients: int = CIFAR100_TEST_CLIENTS,
             per_client: int = CIFAR100_PER_CLIENT, seed: int = 0) -> dict:
  """A CIFAR-100-shaped pool: ``{'train': {id: (x uint8 [100, 32, 32, 3], y int32 [100],
  coarse int32 [100])}, 'test': {...}}`` (TFF's layout; coarse = fine // 5). Raises
  ValueError for non-positive counts."""
  if min(train_clients, test_clients, per_client) < 1:
    raise ValueError(f"train_clients={train_clients}, test_clients={test_clients}, "
                     f"per_client={per_client}: all must be >= 1.")
  rng = np.random.default_rng([int(seed), 0xC1F])
  tmpl = _templates(rng, 100, (32, 32, 3))

  def pool(count, prefix):
    out = {}
    for i in range(count):
      p = rng.dirichlet(np.full(100, 0.1))
      y = rng.choice(100, per_client, p=p).astype(np.int32)
      x = np.clip(tmpl[y] * 200 + rng.normal(28, 30, (per_client, 32, 32, 3)), 0, 255)
      out[f"{prefix}{i}"] = (x.astype(np.uint8), y, (y // 5).astype(np.int32))
    return out
  return {"train": pool(train_clients, ""), "test": pool(test_clients, "")}


def shakespeare_sizes(num_clients: int = SHAKESPEARE_CLIENTS, seed: int = 0) -> np.ndarray:
  """``[num_clients]`` characters per role, log-normal with LEAF's mean 3,743.2 and
  standard deviation 6,212.26, at least 100."""
  rng = np.random.default_rng([int(seed), 0x5AE])
  s2 = np.log1p((SHAKESPEARE_STD / SHAKESPEARE_MEAN) ** 2)
  mu = np.log(SHAKESPEARE_MEAN) - s2 / 2
  return np.maximum(np.round(rng.lognormal(mu, np.sqrt(s2), num_clients)), 100).astype(int)


def shakespeare(num_clients: int = SHAKESPEARE_CLIENTS, seed: int = 0,
                max_chars: int | None = None) -> dict:
  """A Shakespeare-shaped pool of snippets: ``{'train': {role: [str, ...]}, 'test':
  {role: [str]}}``; each role's text has :func:`shakespeare_sizes` characters (capped at
  ``max_chars``), cut into snippets of 20-200 characters, from a role-specific bigram
  chain over lower-case letters, space and punctuation (learnable: the next character
  depends on the previous one). The last ~10% of each role's snippets are its test."""
  rng = np.random.default_rng([int(seed), 0x5AF])
  alphabet = np.array(list("abcdefghijklmnopqrstuvwxyz ,.;:!?'\n"))
  a = len(alphabet)
  base = rng.dirichlet(np.full(a, 0.3), size=a)
  train, test = {}, {}
  for i, n in enumerate(shakespeare_sizes(num_clients, seed)):
    n = int(n if max_chars is None else min(n, max_chars))
    trans = 0.8 * base + 0.2 * rng.dirichlet(np.full(a, 0.3), size=a)
    cum = np.cumsum(trans, axis=1)
    u = rng.random(n)
    chars = np.empty(n, np.int64)
    c = int(rng.integers(a))
    for t in range(n):
      c = min(int(np.searchsorted(cum[c], u[t] * cum[c, -1])), a - 1)
      chars[t] = c
    text = "".join(alphabet[chars])
    cuts = np.cumsum(rng.integers(20, 201, n // 20 + 2))
    snippets = [text[s:e] for s, e in zip(np.r_[0, cuts], cuts) if s < n]
    k = max(1, len(snippets) // 10)
    name = f"ROLE_{i:04d}"
    train[name], test[name] = snippets[:-k] or snippets, snippets[-k:]
  return {"train": train, "test": test}


def ragged_pool(num_clients: int = 100_000, median: float = 20.0, max_size: int = 2000,
                mean: float = 35.0, seed: int = 0):
  """A large ragged pool of MNIST-shaped 8-bit images, packed: the shape of the pools a
  federated simulator exists for (StackOverflow's 342k clients, a long tail of sizes).

  Sizes are log-normal with the given ``median`` and ``mean`` (sigma =
  sqrt(2 ln(mean / median))), rounded, clipped to ``[1, max_size]``: at the defaults
  about 3.5 M images for 100,000 clients (2.7 GB as 8-bit). Each image is its label's
  random blob template (10 classes, 784 pixels) plus uniform 8-bit noise; labels are
  uniform. Generated in slabs of 2^18 images straight into the packed arrays.

  Returns:
    a :class:`fedjax_inv.core.packed.PackedPool` of ``uint8 [T, 784]`` pixels (decoded
    ``/ 255``) and int32 labels in 0..9.

  Raises:
    ValueError: ``num_clients < 1``, ``median <= 0``, ``mean < median`` or
      ``max_size < 1``.
  """
  from fedjax_inv.core.packed import PackedPool
  if int(num_clients) < 1 or median <= 0 or mean < median or int(max_size) < 1:
    raise ValueError(f"ragged_pool: num_clients={num_clients}, median={median}, "
                     f"mean={mean}, max_size={max_size}; need num_clients >= 1, "
                     "median > 0, mean >= median and max_size >= 1.")
  rng = np.random.default_rng([int(seed), 0x100C])
  sigma = float(np.sqrt(2.0 * np.log(mean / median)))
  sizes = np.clip(np.round(rng.lognormal(np.log(median), sigma, int(num_clients))), 1,
                  int(max_size)).astype(np.int64)
  offsets = np.concatenate([[0], np.cumsum(sizes)])
  total = int(offsets[-1])
  tmpl = (_templates(rng, 10, (28, 28)).reshape(10, 784) * 191).astype(np.uint8)
  x = np.empty((total, 784), np.uint8)
  y = rng.integers(0, 10, total).astype(np.int32)
  slab = 1 << 18
  for s in range(0, total, slab):
    e = min(s + slab, total)
    noise = rng.integers(0, 64, (e - s, 784), dtype=np.uint8)
    np.add(tmpl[y[s:e]], noise, out=x[s:e])  # at most 191 + 63: no overflow
  return PackedPool(x, y, offsets, 255.0)
