"""Rounds over a host pool: each round's cohort gathered from a :class:`PackedPool`,
padded to a bucketed width and sent to the device, the next cohort prefetched while the
current round runs; per-client state kept on the host for the clients seen so far.

The engine's streamed round (``engine.build_round(..., streamed=True)``) trains on the
cohort only; :class:`StreamedRound` wraps it with the host side so that it has the
resident round's signature ``(server, client_states, data, key) -> (server,
client_states, metrics)`` (it ignores ``data`` and ``client_states``: the pool and the
states live in it), and ``simulation.train_loop`` runs it unchanged. The cohort of round
``r`` is the engine's own draw (``round_fn.sample``), so a streamed run trains the same
clients with the same keys as a resident one.

Source: docs/ARCHITECTURE.md, 'Pools on the host'; the per-client-state-at-scale layout
follows FedJAX's and pfl's host-side user state (only clients that took part hold state).
"""
from __future__ import annotations

import concurrent.futures
import pathlib
import shutil
import tempfile
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_inv.core import strategy as strategy_lib
from fedjax_inv.core.data import ClientData
from fedjax_inv.core.packed import PackedPool, bucket_width

PyTree = Any
STATE_BUDGET_BYTES = 4 << 30  # host RAM for per-client state before it spills to disk


class ClientStateStore:
  """Per-client state of a pool, held only for clients that have taken part.

  Args:
    init_one: one client's initial state (a pytree without client axis), e.g.
      SCAFFOLD's ``c_i = 0``; a client never sampled reads it.
    num_clients: pool size ``N``.
    budget_bytes: host memory for the rows of seen clients; past it the rows move to a
      memory-mapped file in ``spill_dir`` (default: a temporary folder this store
      creates and removes in :meth:`close`).

  ``gather(idx) -> pytree [C, ...]`` and ``scatter(idx, states)`` move a cohort's
  states (index ``N``, an empty slot, is skipped by ``scatter`` and reads client
  ``N - 1`` in ``gather``, as the resident pool does). Memory: ``seen × state size``
  (SCAFFOLD with a 101,770-parameter MLP: 0.4 MB per client seen), not ``N ×``.
  """

  def __init__(self, init_one: PyTree, num_clients: int,
               budget_bytes: int = STATE_BUDGET_BYTES, spill_dir=None):
    leaves, self.treedef = jax.tree.flatten(init_one)
    self.init = [np.asarray(a) for a in leaves]
    self.num_clients = int(num_clients)
    self.slot_of = np.full(self.num_clients, -1, np.int64)
    self.count = 0
    self.tables = [np.empty((0,) + a.shape, a.dtype) for a in self.init]
    self.row_bytes = sum(int(a.nbytes) for a in self.init)
    self.budget = int(budget_bytes)
    self._spill_parent = spill_dir
    self._spill: pathlib.Path | None = None
    self.spilled = False

  @property
  def empty(self) -> bool:
    """True when clients carry no state (FedAvg): nothing to gather or scatter."""
    return not self.init

  def nbytes(self) -> int:
    return self.count * self.row_bytes

  def gather(self, idx) -> PyTree:
    idx = np.minimum(np.asarray(idx, np.int64), self.num_clients - 1)
    slots = self.slot_of[idx]
    seen = slots >= 0
    out = []
    for a, t in zip(self.init, self.tables):
      o = np.broadcast_to(a, (len(idx),) + a.shape).copy()
      if seen.any():
        o[seen] = t[slots[seen]]
      out.append(o)
    return jax.tree.unflatten(self.treedef, out)

  def scatter(self, idx, states: PyTree) -> None:
    idx = np.asarray(idx, np.int64)
    keep = idx < self.num_clients
    if not keep.any() or self.empty:
      return
    idx = idx[keep]
    new = idx[self.slot_of[idx] < 0]
    if len(new):
      self._grow(self.count + len(new))
      self.slot_of[new] = np.arange(self.count, self.count + len(new))
      self.count += len(new)
    slots = self.slot_of[idx]
    for t, a in zip(self.tables, jax.tree.leaves(states)):
      t[slots] = np.asarray(a)[keep]

  def _grow(self, need: int) -> None:
    cap = len(self.tables[0]) if self.tables else 0
    if need <= cap:
      return
    cap = max(need, 2 * cap, 16)
    cap = min(cap, self.num_clients) if need <= self.num_clients else need
    spill = cap * self.row_bytes > self.budget
    new_tables = []
    for i, (a, t) in enumerate(zip(self.init, self.tables)):
      if spill:
        if self._spill is None:
          self._spill = pathlib.Path(tempfile.mkdtemp(prefix="fedjax_inv_state_",
                                                      dir=self._spill_parent))
        path = self._spill / f"leaf{i}_{cap}.npy"
        nt = np.lib.format.open_memmap(path, mode="w+", dtype=a.dtype,
                                       shape=(cap,) + a.shape)
      else:
        nt = np.empty((cap,) + a.shape, a.dtype)
      nt[: self.count] = t[: self.count]
      new_tables.append(nt)
    self.tables = new_tables
    self.spilled = self.spilled or spill

  def dense(self) -> PyTree:
    """Every pool client's state ``[N, ...]`` (unseen clients at the initial value)."""
    return self.gather(np.arange(self.num_clients))

  def close(self) -> None:
    """Drops the tables and removes the spill folder this store created."""
    self.tables = [np.empty((0,) + a.shape, a.dtype) for a in self.init]
    if self._spill is not None:
      shutil.rmtree(self._spill, ignore_errors=True)  # made by _grow, nothing else
      self._spill = None


@jax.jit
def _decode(x, divisor):
  return x.astype(jnp.float32) / divisor


class StreamedRound:
  """A streamed engine round plus its host side: the round's signature, the pool on
  the host.

  Args:
    round_fn: ``engine.build_round(..., streamed=True)`` (jitted).
    pool: the training :class:`PackedPool` (``N`` clients).
    init_states: one client's initial state per entry of the engine's client states
      (``{name: pytree}``, no client axis; ``{}`` when clients are stateless).
    prefetch: gather the next round's cohort in a background thread while the current
      round runs (double buffering).

    split: ``engine.build_split_round``'s programs, or None. With them (one CPU device,
      'scan'), the cohort is cut into two groups of equal counts and similar sizes, each
      trained by its own program from its own host thread at the same time, then summed
      and finished by one program (same numbers up to float32 summation order).

  Attributes ``strategy`` and ``chunk_size`` are the engine round's; ``widths`` the
  padded cohort widths used so far (each is one compiled round program).
  """

  def __init__(self, round_fn, pool: PackedPool, init_states: dict, prefetch: bool = True,
               state_budget_bytes: int = STATE_BUDGET_BYTES, split=None):
    self.round_fn, self.pool = round_fn, pool
    # engine.build_split_round's (sample, partial, finish): the cohort in two groups of
    # balanced sizes, trained by two programs at once from two host threads
    self.split = split
    self._workers = concurrent.futures.ThreadPoolExecutor(2) if split else None
    self.strategy, self.chunk_size = round_fn.strategy, round_fn.chunk_size
    self.execution = strategy_lib.execution_name(round_fn)
    self.store = ClientStateStore(init_states, pool.num_clients, state_budget_bytes)
    self.widths: set[int] = set()
    self._round: int | None = None
    self._pending = None  # (round, future) of the prefetched cohort
    self._pool = concurrent.futures.ThreadPoolExecutor(1) if prefetch else None
    self._divisor = jnp.float32(pool.divisor)
    self.gather_s = 0.0

  def _groups(self, r: int, key):
    """The round's draw cut into two groups: slots ordered by size, dealt 0, 1, 1, 0, 0,
    1, ... (equal counts, similar work), each gathered at its own width."""
    import time
    t = time.perf_counter()
    sample, _, _ = self.split
    idx, ckeys, flags = sample(jnp.int32(r), key)
    host_idx = np.asarray(idx)
    n = self.pool.n[np.minimum(host_idx, self.pool.num_clients - 1)]
    order = np.argsort(-n, kind="stable")
    deal = np.array([0, 1, 1, 0])[np.arange(len(order)) % 4]
    groups = []
    for g in (0, 1):
      sel = np.sort(order[deal == g])
      if not len(sel):
        continue
      width = bucket_width(int(n[sel].max()), self.pool.n_max)
      x, y, ng = self.pool.gather(host_idx[sel], width)
      pos = jnp.asarray(sel)
      data = ClientData(x=_decode(jax.device_put(x), self._divisor), y=jax.device_put(y),
                        n=jax.device_put(ng))
      groups.append((sel, host_idx[sel], width, data, idx[pos], ckeys[pos],
                     jax.tree.map(lambda a: a[pos], flags)))
    self.gather_s += time.perf_counter() - t
    return idx, host_idx, groups

  def _cohort(self, r: int, key):
    if self.split is not None:
      return self._groups(r, key)
    import time
    t = time.perf_counter()
    idx = np.asarray(self.round_fn.sample(jnp.int32(r), key))
    n = self.pool.n[np.minimum(idx, self.pool.num_clients - 1)]
    width = bucket_width(int(n.max()), self.pool.n_max)
    x, y, n = self.pool.gather(idx, width)
    data = ClientData(x=_decode(jax.device_put(x), self._divisor), y=jax.device_put(y),
                      n=jax.device_put(n))
    self.gather_s += time.perf_counter() - t
    return idx, width, data

  def _take(self, r: int, key):
    if self._pending is not None and self._pending[0] == r:
      out = self._pending[1].result()
    else:
      out = self._cohort(r, key)
    self._pending = None
    if self._pool is not None:
      self._pending = (r + 1, self._pool.submit(self._cohort, r + 1, key))
    return out

  def _split_call(self, server, key):
    _, partial, finish = self.split
    idx, host_idx, groups = self._take(self._round, key)

    def run(group, states):
      _, _, _, data, gidx, gkeys, gflags = group
      return jax.block_until_ready(partial(server, states, data, gidx, gkeys, gflags))
    futures = []
    for g in groups:
      self.widths.add(g[2])
      futures.append(self._workers.submit(run, g, self.store.gather(g[1])))
    outs = [f.result() for f in futures]
    sums = jax.tree.map(lambda *a: sum(a[1:], a[0]), *[o[0] for o in outs])
    server, metrics = finish(server, sums, idx, key)
    if not self.store.empty:
      for g, (_, new_states) in zip(groups, outs):
        self.store.scatter(g[1], jax.device_get(new_states))
    self._round += 1
    return server, {}, metrics

  def __call__(self, server, client_states, data, key):
    del client_states, data  # the pool and the states are held here
    if self._round is None:
      self._round = int(server.round)
    if self.split is not None:
      return self._split_call(server, key)
    idx, width, cohort = self._take(self._round, key)
    self.widths.add(width)
    states = self.store.gather(idx)
    server, new_states, metrics = self.round_fn(server, states, cohort, key)
    if not self.store.empty:
      self.store.scatter(idx, jax.device_get(new_states))
    self._round += 1
    return server, {}, metrics

  def client_states(self) -> dict:
    """Every pool client's state ``{name: [N, ...]}`` (for personal models' metrics)."""
    return self.store.dense()

  def record(self) -> dict:
    """summary.json's ``pool`` details of the streamed rounds."""
    return {"cohort_widths": sorted(self.widths), "compiled_round_programs": len(self.widths),
            "clients_with_state": int(self.store.count),
            "client_state_mb": round(self.store.nbytes() / 2**20, 1),
            "client_state_spilled": bool(self.store.spilled),
            "host_gather_s": round(self.gather_s, 3),
            "programs_at_once": 2 if self.split is not None else 1}

  def close(self) -> None:
    for ex in (self._pool, self._workers):
      if ex is not None:
        ex.shutdown(wait=True)
    self.store.close()
