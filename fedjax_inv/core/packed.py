"""A packed client pool: every client's real examples stored once, contiguously, on the
host (a CSR layout), in the source's compact dtype; rounds gather only their cohort.

``ClientData`` (``core/data.py``) keeps the whole pool as one padded ``[N, n_max, ...]``
float32 array on the device. That is fastest for pools that fit, and impossible for the
pools federated simulation exists for: FEMNIST's 3,400 writers are padded 2.4x (5.1 GB as
float32, 0.53 GB of 8-bit pixels), and a 100,000-client ragged pool would need hundreds of
GB. :class:`PackedPool` stores ``x: [T, *features]`` (``T = Σ n_i``, 8-bit images stay
8-bit), ``y: [T]`` and ``offsets: [N + 1]``; client ``i`` is rows
``offsets[i]:offsets[i+1]``. Arrays may be numpy memory maps (:meth:`PackedPool.load`),
so a cached pool opens in milliseconds and only the rows a round reads are paged in.

Inputs are decoded as ``x.astype(float32) / divisor`` (``divisor=255`` for 8-bit pixels
in [0, 1]); the division is IEEE-exact on host and device alike, so a pool decoded on
the device equals the resident float32 pool bit for bit.

Source: the CSR layout of ``tff.simulation.datasets`` / Hugging Face ``datasets`` (one
table of examples plus client offsets); docs/ARCHITECTURE.md, 'Pools on the host'.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import tempfile
from typing import Sequence

import numpy as np

from fedjax_inv.core.data import ClientData

FORMAT_VERSION = 1
_META = "pool.json"


@dataclasses.dataclass(frozen=True, eq=False)
class PackedPool:
  """``N`` clients' examples, packed without padding (host memory or memory map).

  Attributes:
    x: ``[T, *feature_shape]`` inputs in their stored dtype (uint8 images, float32, ...),
      ``T = Σ n_i``; client ``i`` owns rows ``offsets[i]:offsets[i+1]``.
    y: ``[T]`` int32 class labels or float32 regression targets.
    offsets: ``[N + 1]`` int64, ``offsets[0] = 0``, ``offsets[N] = T``, increasing.
    divisor: decoded input ``= x.astype(float32) / divisor`` (1.0: as stored).
    ids: optional client ids (``N`` strings), e.g. FEMNIST's writer ids.

  Raises:
    ValueError: offsets not starting at 0, not ending at ``T``, or a client with 0
      examples; ``y`` of another length than ``x``; a non-positive divisor.
  """
  x: np.ndarray
  y: np.ndarray
  offsets: np.ndarray
  divisor: float = 1.0
  ids: tuple | None = None

  def __post_init__(self):
    off = np.asarray(self.offsets)
    if off.ndim != 1 or len(off) < 2 or off[0] != 0 or off[-1] != len(self.x):
      raise ValueError(f"PackedPool: offsets must run from 0 to the {len(self.x)} rows "
                       f"of x (got {len(off)} offsets, first {off[:1].tolist()}, last "
                       f"{off[-1:].tolist()}); build it with pack_client_arrays.")
    sizes = np.diff(off)
    if np.any(sizes < 1):
      raise ValueError(f"PackedPool: client {int(np.argmax(sizes < 1))} has "
                       f"{int(sizes.min())} examples; drop empty clients first.")
    if len(self.y) != len(self.x):
      raise ValueError(f"PackedPool: {len(self.x)} inputs but {len(self.y)} labels.")
    if not float(self.divisor) > 0:
      raise ValueError(f"PackedPool: divisor={self.divisor!r}; it must be > 0 (255 for "
                       "8-bit pixels in [0, 1], 1 for float inputs).")
    if self.ids is not None and len(self.ids) != len(off) - 1:
      raise ValueError(f"PackedPool: {len(self.ids)} ids for {len(off) - 1} clients.")
    object.__setattr__(self, "_n", sizes.astype(np.int32))

  @classmethod
  def from_client_data(cls, data: ClientData) -> "PackedPool":
    """A resident ``ClientData``'s real rows, packed (float32, as stored there)."""
    n = np.asarray(data.n, np.int64)
    keep = np.arange(data.n_max)[None, :] < n[:, None]
    x, y = np.asarray(data.x)[keep], np.asarray(data.y)[keep]
    return cls(x, y, np.concatenate([[0], np.cumsum(n)]).astype(np.int64))

  # -- the ClientData-like view every consumer of a pool reads ------------------------

  @property
  def n(self) -> np.ndarray:
    """``[N]`` int32 examples per client."""
    return self._n

  @property
  def num_clients(self) -> int:
    return int(len(self._n))

  @property
  def n_max(self) -> int:
    """The largest client: the padded width of the resident layout."""
    return int(self._n.max())

  @property
  def feature_shape(self) -> tuple[int, ...]:
    return tuple(self.x.shape[1:])

  @property
  def total(self) -> int:
    """``T``: real examples in the pool."""
    return int(self.offsets[-1])

  def stored_bytes(self) -> int:
    """Bytes of the packed arrays (x, y, offsets)."""
    return int(self.x.nbytes + self.y.nbytes + self.offsets.nbytes)

  def padded_bytes(self) -> int:
    """Bytes of the resident layout: float32 ``[N, n_max, ...]`` inputs plus labels."""
    per_row = int(np.prod(self.feature_shape, dtype=np.int64)) * 4 + 4
    return int(self.num_clients) * self.n_max * per_row + 4 * self.num_clients

  def decode(self, x: np.ndarray) -> np.ndarray:
    """Stored inputs -> float32 model inputs (``x / divisor``), on the host."""
    if x.dtype == np.float32 and self.divisor == 1.0:
      return np.asarray(x)
    return x.astype(np.float32) / np.float32(self.divisor)

  def client(self, i: int) -> tuple[np.ndarray, np.ndarray]:
    """Client ``i``'s ``(x [n_i, ...] float32 decoded, y [n_i])``."""
    a, b = int(self.offsets[i]), int(self.offsets[i + 1])
    return self.decode(np.asarray(self.x[a:b])), np.asarray(self.y[a:b])

  # -- cohorts --------------------------------------------------------------------------

  def gather(self, idx, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The padded cohort of clients ``idx`` in the stored dtype.

    Args:
      idx: ``[C]`` pool indices; ``N`` (an empty slot of Poisson sampling or dropout)
        reads client ``N - 1``, as the resident layout does (its weight is 0).
      width: padded examples per client (>= the cohort's largest client).

    Returns:
      ``(x [C, width, *features] stored dtype, y [C, width], n [C] int32)``, zero past
      each client's ``n``.

    Raises:
      ValueError: ``width`` smaller than a client of the cohort.
    """
    idx = np.minimum(np.asarray(idx, np.int64), self.num_clients - 1)
    n = self._n[idx]
    if len(n) and int(n.max()) > width:
      raise ValueError(f"gather: width={width} < the cohort's largest client "
                       f"({int(n.max())} examples).")
    x = np.zeros((len(idx), width) + self.feature_shape, self.x.dtype)
    y = np.zeros((len(idx), width), self.y.dtype)
    for j, i in enumerate(idx):
      a, b = int(self.offsets[i]), int(self.offsets[i + 1])
      x[j, : b - a] = self.x[a:b]
      y[j, : b - a] = self.y[a:b]
    return x, y, n.astype(np.int32)

  def take(self, idx) -> ClientData:
    """Clients ``idx`` (``[C]`` ints) as a resident ``ClientData`` padded to their own
    largest client, decoded to float32."""
    idx = np.asarray(idx, np.int64)
    width = int(self._n[idx].max())
    x, y, n = self.gather(idx, width)
    return _client_data(self.decode(x), y, n)

  def padded(self) -> ClientData:
    """The whole pool in the resident layout (``[N, n_max, ...]`` float32): what
    ``from_client_arrays`` builds from the same clients."""
    return self.take(np.arange(self.num_clients))

  def merged(self) -> ClientData:
    """All real examples as one client (centralized evaluation)."""
    return _client_data(self.decode(np.asarray(self.x))[None], np.asarray(self.y)[None],
                        np.array([self.total], np.int32))

  def subset(self, idx) -> "PackedPool":
    """Clients ``idx`` as a new packed pool (their rows copied, in ``idx`` order)."""
    idx = np.asarray(idx, np.int64)
    sizes = self._n[idx].astype(np.int64)
    off = np.concatenate([[0], np.cumsum(sizes)])
    x = np.empty((int(off[-1]),) + self.feature_shape, self.x.dtype)
    y = np.empty((int(off[-1]),), self.y.dtype)
    for j, i in enumerate(idx):
      a, b = int(self.offsets[i]), int(self.offsets[i + 1])
      x[off[j]:off[j + 1]] = self.x[a:b]
      y[off[j]:off[j + 1]] = self.y[a:b]
    ids = None if self.ids is None else tuple(self.ids[int(i)] for i in idx)
    return PackedPool(x, y, off, self.divisor, ids)

  # -- on disk ---------------------------------------------------------------------------

  def save(self, folder) -> pathlib.Path:
    """Writes the pool to ``folder`` (created; must not exist yet): ``x.npy``,
    ``y.npy``, ``offsets.npy`` and ``pool.json``. Written into a temporary folder
    beside it and renamed, so a reader never sees half a pool. Raises FileExistsError
    when ``folder`` exists."""
    folder = pathlib.Path(folder)
    if folder.exists():
      raise FileExistsError(f"{folder} exists; a packed pool is written once (load it, "
                            "or choose another folder).")
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
      np.save(tmp / "x.npy", np.asarray(self.x))
      np.save(tmp / "y.npy", np.asarray(self.y))
      np.save(tmp / "offsets.npy", np.asarray(self.offsets, np.int64))
      (tmp / _META).write_text(json.dumps({
          "format": FORMAT_VERSION, "divisor": float(self.divisor),
          "ids": list(self.ids) if self.ids is not None else None}))
      os.replace(tmp, folder)
    except BaseException:
      for f in tmp.iterdir():  # ours: the temporary folder made above
        f.unlink()
      tmp.rmdir()
      raise
    return folder

  @classmethod
  def load(cls, folder, mmap: bool = True) -> "PackedPool":
    """A pool written by :meth:`save`; ``mmap=True`` maps x and y read-only (pages are
    read on first touch). Raises FileNotFoundError / ValueError for a missing or
    damaged folder, naming it."""
    folder = pathlib.Path(folder)
    meta_path = folder / _META
    if not meta_path.is_file():
      raise FileNotFoundError(f"{folder}: no packed pool here ({_META} is missing).")
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != FORMAT_VERSION:
      raise ValueError(f"{folder}: packed pool format {meta.get('format')!r}, this "
                       f"version reads {FORMAT_VERSION}; delete the folder to rebuild it.")
    mode = "r" if mmap else None
    ids = meta.get("ids")
    return cls(np.load(folder / "x.npy", mmap_mode=mode),
               np.load(folder / "y.npy", mmap_mode=mode),
               np.load(folder / "offsets.npy"), float(meta["divisor"]),
               tuple(ids) if ids is not None else None)


def _client_data(x, y, n) -> ClientData:
  import jax.numpy as jnp
  return ClientData(x=jnp.asarray(x), y=jnp.asarray(y), n=jnp.asarray(n, jnp.int32))


class PoolWriter:
  """Fills a packed pool client by client into preallocated arrays (no intermediate
  copy of the whole set).

  Args:
    sizes: ``[N]`` examples per client (each >= 1).
    feature_shape: per-example input shape.
    x_dtype: stored input dtype (e.g. ``np.uint8``).
    y_dtype: label dtype (int32 labels, float32 targets).
    divisor: the pool's decode divisor.
    ids: optional client ids.

  ``writer[i] = (x_i, y_i)`` stores client ``i`` (``x_i`` cast to ``x_dtype``; a float
  client of an integer pool must hold exact multiples of ``1 / divisor``, else
  ValueError); ``writer.pool()`` returns the :class:`PackedPool` once every client is
  written (ValueError naming the first missing one).
  """

  def __init__(self, sizes, feature_shape, x_dtype=np.float32, y_dtype=np.int32,
               divisor: float = 1.0, ids=None):
    self.sizes = np.asarray(sizes, np.int64)
    if self.sizes.ndim != 1 or len(self.sizes) == 0 or np.any(self.sizes < 1):
      raise ValueError("PoolWriter: sizes must be a non-empty list of client sizes >= 1.")
    self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
    self.x = np.zeros((int(self.offsets[-1]),) + tuple(feature_shape), x_dtype)
    self.y = np.zeros((int(self.offsets[-1]),), y_dtype)
    self.divisor, self.ids = float(divisor), ids
    self._done = np.zeros(len(self.sizes), bool)

  def __setitem__(self, i: int, xy) -> None:
    x, y = xy
    a, b = int(self.offsets[i]), int(self.offsets[i + 1])
    x = np.asarray(x)
    if x.shape[0] != b - a or len(y) != b - a:
      raise ValueError(f"PoolWriter: client {i} was declared with {b - a} examples, got "
                       f"{x.shape[0]} inputs and {len(y)} labels.")
    if np.issubdtype(self.x.dtype, np.integer) and not np.issubdtype(x.dtype, np.integer):
      q = np.rint(x.astype(np.float64) * self.divisor)
      if not lossless(x, q, self.divisor):
        raise ValueError(f"PoolWriter: client {i}'s inputs are not multiples of 1/"
                         f"{self.divisor:g}; store them as float32 (x_dtype=np.float32).")
      x = q
    self.x[a:b] = x.reshape((b - a,) + self.x.shape[1:])
    self.y[a:b] = y
    self._done[i] = True

  def pool(self) -> PackedPool:
    if not self._done.all():
      raise ValueError(f"PoolWriter: client {int(np.argmin(self._done))} was never "
                       "written.")
    return PackedPool(self.x, self.y, self.offsets, self.divisor, self.ids)


def lossless(x, q, divisor: float) -> bool:
  """Whether stored values ``q`` decode (``float32(q) / divisor``) to exactly ``x``."""
  return bool(np.array_equal(q.astype(np.float32) / np.float32(divisor),
                             np.asarray(x, np.float32)))


def pack_client_arrays(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], ids=None,
                       x_dtype=None, divisor: float = 1.0) -> PackedPool:
  """Per-client arrays -> a :class:`PackedPool` (the packed twin of
  ``core.data.from_client_arrays``, with the same checks).

  Args:
    xs: ``N`` arrays ``[n_i, *features]``.
    ys: ``N`` arrays ``[n_i]`` of int labels or float targets.
    ids: optional ``N`` client ids.
    x_dtype: stored dtype (default: uint8 inputs stay uint8, anything else float32).
    divisor: decode divisor (255 with 8-bit pixels meant as [0, 1]).

  Raises:
    ValueError: as ``from_client_arrays`` (no clients, an empty client, mismatched
      lengths or shapes, non-numeric or non-finite values).
  """
  from fedjax_inv.core import data as data_lib
  data_lib.check_client_arrays(xs, ys)
  xs = [np.asarray(x) for x in xs]
  if x_dtype is None:
    x_dtype = np.uint8 if all(x.dtype == np.uint8 for x in xs) else np.float32
  y_dtype = np.float32 if np.issubdtype(np.asarray(ys[0]).dtype, np.floating) else np.int32
  w = PoolWriter([len(x) for x in xs], xs[0].shape[1:], x_dtype, y_dtype, divisor, ids)
  for i, (x, y) in enumerate(zip(xs, ys)):
    w[i] = (x, np.asarray(y))
  return w.pool()


# -- the cohort's padded width ------------------------------------------------------------

def bucket_width(largest: int, n_max: int) -> int:
  """The padded width of a cohort whose largest client has ``largest`` examples: the
  smallest of ``ceil(n_max / 2^k)``, k = 0, 1, 2, ..., at or above it. Every width is
  one compiled round program, so a run compiles at most ``log2(n_max) + 1`` of them,
  and in practice one or two: a cohort of 10 FEMNIST writers (n_max 475) almost always
  has one above 238, so its width is 475; a cohort of 100 from a long-tailed pool
  (median 20, n_max 2,000) gets 2,000, 1,000 or 500. The width costs memory and
  transfer only: under ``local_epochs`` each client runs its own steps, and padded rows
  weigh 0."""
  largest, n_max = max(int(largest), 1), int(n_max)
  w = n_max
  while w > 1 and -(-w // 2) >= largest:
    w = -(-w // 2)
  return w


def cache_root() -> pathlib.Path | None:
  """Where built pools are cached: ``$FEDJAX_INV_CACHE_DIR`` (shared with the
  execution-strategy cache), else ``$XDG_CACHE_HOME/fedjax_inv`` or
  ``~/.cache/fedjax_inv``; None when ``$FEDJAX_INV_POOL_CACHE`` is ``off``."""
  if os.environ.get("FEDJAX_INV_POOL_CACHE", "").strip().lower() in ("off", "0", "no"):
    return None
  env = os.environ.get("FEDJAX_INV_CACHE_DIR")
  if env:
    return pathlib.Path(env)
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return pathlib.Path(base) / "fedjax_inv"
