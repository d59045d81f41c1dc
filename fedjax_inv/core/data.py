"""Stacked, padded client data: the one container the engine trains on.

Every array that belongs to a client carries a leading client axis ``N`` (the client
*pool*); a round gathers ``C`` of them. Padding is handled with the true sizes ``n``,
never by slicing, so one compiled round serves clients of any size.
"""
from __future__ import annotations

from typing import Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np


@chex.dataclass(frozen=True)
class ClientData:
  """A pool of ``N`` clients, stacked and padded to ``n_max`` examples.

  Attributes:
    x: ``[N, n_max, *feature_shape]`` float32 inputs (zero padding past ``n[i]``).
    y: ``[N, n_max]`` int32 class labels, or ``[N, n_max]`` float32 regression targets.
    n: ``[N]`` int32 true number of examples per client (``1 <= n[i] <= n_max``).

  Source: docs/ARCHITECTURE.md, 'A round is a map-reduce over a client axis' (stacked
  client axis); FedJAX's ``ClientDataset`` is the unstacked, per-client equivalent this
  replaces.
  """
  x: chex.Array
  y: chex.Array
  n: chex.Array

  @property
  def num_clients(self) -> int:
    return int(self.n.shape[0])

  @property
  def n_max(self) -> int:
    return int(self.x.shape[1])

  @property
  def feature_shape(self) -> tuple[int, ...]:
    return tuple(self.x.shape[2:])

  def mask(self) -> jax.Array:
    """``[N, n_max]`` float32, 1.0 on real examples and 0.0 on padding."""
    return (jnp.arange(self.x.shape[1])[None, :] < self.n[:, None]).astype(jnp.float32)

  def take(self, idx) -> "ClientData":
    """Clients ``idx`` (``[C]`` int) as a new ``ClientData`` with ``C`` clients."""
    return ClientData(x=self.x[idx], y=self.y[idx], n=self.n[idx])

  def merged(self) -> "ClientData":
    """All clients' real examples pooled into one client (for centralized evaluation)."""
    x = np.asarray(self.x)
    y = np.asarray(self.y)
    n = np.asarray(self.n)
    xs = np.concatenate([x[i, : n[i]] for i in range(len(n))])
    ys = np.concatenate([y[i, : n[i]] for i in range(len(n))])
    return from_client_arrays([xs], [ys])


def from_client_arrays(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray],
                       n_max: int | None = None) -> ClientData:
  """Stacks per-client numpy arrays of different sizes into one padded ``ClientData``.

  Args:
    xs: ``N`` arrays, client ``i`` of shape ``[n_i, *feature_shape]`` (same feature shape).
    ys: ``N`` arrays of shape ``[n_i]``: integer class labels or float regression targets.
    n_max: pad to this many examples (default: the largest ``n_i``).

  Returns:
    ``ClientData`` with ``x: [N, n_max, *feature_shape]`` float32, ``y: [N, n_max]``,
    ``n: [N]`` int32.

  Raises:
    ValueError: no clients, an empty client, mismatched lengths or feature shapes, a
      non-numeric dtype, NaN/inf in x or y, or ``n_max`` smaller than the largest client.
      (Labels are checked against the task kind by ``fedjax_inv.tasks.Task``.)
  """
  check_client_arrays(xs, ys)
  xs = [np.asarray(x) for x in xs]
  ys = [np.asarray(y) for y in ys]
  shape = xs[0].shape[1:]
  sizes = np.array([x.shape[0] for x in xs], np.int32)
  biggest = int(sizes.max())
  n_max = biggest if n_max is None else int(n_max)
  if n_max < biggest:
    raise ValueError(f"from_client_arrays: n_max={n_max} < largest client ({biggest}); "
                     "raise n_max or leave it None.")
  y_dtype = np.float32 if np.issubdtype(ys[0].dtype, np.floating) else np.int32
  x_out = np.zeros((len(xs), n_max) + shape, np.float32)
  y_out = np.zeros((len(xs), n_max), y_dtype)
  for i, (x, y) in enumerate(zip(xs, ys)):
    x_out[i, : len(x)] = x
    y_out[i, : len(y)] = y
  return ClientData(x=jnp.asarray(x_out), y=jnp.asarray(y_out), n=jnp.asarray(sizes))


def check_client_arrays(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray]) -> None:
  """The checks of :func:`from_client_arrays` (and of ``core.packed.pack_client_arrays``):
  raises ValueError for no clients, an empty client, mismatched lengths or feature
  shapes, a non-numeric dtype, or NaN/inf in x or y, naming the client and the fix."""
  if len(xs) == 0:
    raise ValueError("from_client_arrays: got 0 clients; pass one array per client.")
  if len(xs) != len(ys):
    raise ValueError(f"from_client_arrays: {len(xs)} x arrays but {len(ys)} y arrays; "
                     "pass one (x, y) pair per client.")
  xs = [np.asarray(x) for x in xs]
  ys = [np.asarray(y) for y in ys]
  shape = xs[0].shape[1:]
  for i, (x, y) in enumerate(zip(xs, ys)):
    if x.ndim == 0 or y.ndim != 1:
      raise ValueError(f"from_client_arrays: client {i} has x of shape {x.shape} and y of "
                       f"shape {y.shape}; x needs [n_i, *features] and y needs [n_i].")
    for what, a in (("x", x), ("y", y)):
      if not (np.issubdtype(a.dtype, np.number) or a.dtype == bool):
        raise ValueError(f"from_client_arrays: client {i} has {what} of dtype {a.dtype}; "
                         "pass numeric arrays (float inputs, int labels or float targets).")
      if np.issubdtype(a.dtype, np.floating) and not np.all(np.isfinite(a)):
        bad = int(np.size(a) - np.count_nonzero(np.isfinite(a)))
        raise ValueError(f"from_client_arrays: client {i} has {bad} non-finite (NaN/inf) "
                         f"value(s) in {what}; clean or drop them first.")
    if x.shape[0] == 0:
      raise ValueError(f"from_client_arrays: client {i} has 0 examples; drop it first.")
    if x.shape[1:] != shape:
      raise ValueError(f"from_client_arrays: client {i} has feature shape {x.shape[1:]}, "
                       f"client 0 has {shape}; all clients need the same feature shape.")
    if y.shape[0] != x.shape[0]:
      raise ValueError(f"from_client_arrays: client {i} has {x.shape[0]} inputs but "
                       f"{y.shape[0]} labels.")


def padding_overhead(data: ClientData, algorithm, cohort: int, execution: str,
                     chunk_size: int | None = None, samples: int = 200,
                     seed: int = 0) -> dict:
  """The padding overhead of a run, padded examples ÷ real examples:

  * ``pool``: stored example slots ``N · n_max`` over real examples ``Σ n_i``;
  * ``compute``: example slots the local training computes per round over the real
    examples it trains on, averaged over ``samples`` random cohorts of ``cohort``. Under
    ``local_epochs`` a client runs ``E · ceil(n_i / B)`` steps of ``B`` slots; clients
    batched together (``vmap``: the cohort; ``chunked``: each chunk, the cohort sorted by
    size first) run as many steps as the largest of them; ``scan`` runs each client's
    own. With fixed ``local_steps`` every
    step is ``B`` real draws (overhead 1.0; full-batch clients compute ``n_max`` slots
    for ``n_i`` examples).

  Args: ``data`` the training pool ``[N, n_max, ...]``; ``algorithm`` its
  ``local_steps`` / ``local_epochs`` / ``batch_size``; ``cohort`` clients per round;
  ``execution`` the strategy that runs ('scan' | 'vmap' | 'chunked'); ``chunk_size`` the
  chunk under 'chunked'.

  Returns ``{'pool', 'compute', 'execution'}``: the two ratios (1.0 = no padding) and the
  strategy. Source: FEMNIST's clients of 2..~480 examples.
  """
  n = np.asarray(data.n, np.int64)
  n_max = int(data.n_max)
  out = {"pool": float(len(n) * n_max / n.sum()), "execution": execution}
  B, E = algorithm.batch_size, algorithm.local_epochs
  rng = np.random.default_rng(seed)
  ratios = []
  for _ in range(samples):
    c = n[rng.choice(len(n), min(cohort, len(n)), replace=False)]
    if E is None:
      real = (algorithm.local_steps * B * len(c)) if B else c.sum() * algorithm.local_steps
      slots = real if B else len(c) * n_max * algorithm.local_steps
    else:
      steps = E * -(-c // B)
      real = E * c.sum()
      if execution == "scan":
        slots = steps.sum() * B
      else:
        size = len(c) if execution != "chunked" else (chunk_size or len(c))
        if execution == "chunked":  # the engine orders the cohort by size first
          steps = np.sort(steps)[::-1]
        slots = sum(len(g) * g.max() for g in np.array_split(
            steps, max(1, -(-len(c) // size)))) * B
    ratios.append(slots / real)
  out["compute"] = float(np.mean(ratios))
  return out
