"""Multi-host (multi-controller) runs of the round engine.

Every process runs the same script; after :func:`initialize` ``jax.devices()`` lists the
devices of *all* processes, so ``engine.client_mesh()`` is a global ``clients`` mesh and
``engine.build_round(..., mesh=mesh)`` compiles one SPMD program over it (the clients'
statistics are summed by a cross-process all-reduce). What differs from one host is only
where the data comes from: each process loads the clients that its own devices hold
(:func:`local_client_range`) and :func:`global_client_data` stitches the per-process
blocks into one global ``ClientData`` without gathering it anywhere.

Tested with two local CPU processes × 4 devices against one process × 8 devices
(``tests/test_multihost.py``, worker ``tests/multihost_worker.py``); walkthrough and
launch commands (local, SLURM, TPU pod) in ``docs/multihost.md``.

Sources: JAX multi-process guide (https://docs.jax.dev/en/latest/multi_process.html),
``jax.distributed.initialize`` and ``jax.make_array_from_process_local_data`` (JAX API
reference), ``jax.experimental.multihost_utils``.
"""
from __future__ import annotations

import zlib
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fedjax_inv.core.data import ClientData

PyTree = Any


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, cpu_collectives: str | None = "gloo",
               **kwargs) -> None:
  """Connects this process to the others (``jax.distributed.initialize``).

  Must run before any other JAX call (``jax.devices()``, any computation, any
  ``jnp`` array). On Cloud TPU pods, SLURM and Open MPI all three arguments may be
  omitted (JAX reads them from the environment); elsewhere pass all three.

  Args:
    coordinator_address: ``"host:port"`` of process 0, reachable from every process.
    num_processes: number of processes taking part.
    process_id: this process, ``0 .. num_processes - 1``.
    cpu_collectives: sets ``jax_cpu_collectives_implementation`` first (``"gloo"``:
      cross-process all-reduce on the CPU backend over TCP; ``"mpi"``; None: leave the
      setting as it is). It only concerns the CPU backend and is harmless on GPU/TPU.
    **kwargs: passed on to ``jax.distributed.initialize`` (e.g. ``local_device_ids``,
      ``initialization_timeout``).

  Raises:
    RuntimeError: JAX's backend is already initialized (a JAX call came first), or the
      distributed system is already initialized.
  """
  if cpu_collectives is not None:
    jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id,
                             **kwargs)


def client_sharding(mesh: Mesh) -> NamedSharding:
  """The pool's placement: leading client axis split over the ``clients`` mesh axis."""
  return NamedSharding(mesh, P("clients"))


def local_client_range(num_clients: int, mesh: Mesh) -> range:
  """The pool indices ``[lo, hi)`` this process must load for :func:`global_client_data`.

  With ``engine.client_mesh()`` (devices in ``jax.devices()`` order, i.e. grouped by
  process) process ``p`` of ``P`` gets ``range(p * N // P, (p + 1) * N // P)``; the range
  is read from the sharding itself, so any mesh whose process blocks are contiguous works.

  Raises:
    ValueError: ``num_clients`` is not divisible by the number of mesh devices, or this
      process's devices hold a non-contiguous set of clients (a hand-made mesh that
      interleaves processes).
  """
  ndev = mesh.devices.size
  if num_clients % ndev:
    raise ValueError(f"num_clients={num_clients} must be divisible by the {ndev} devices "
                     "of the 'clients' mesh (pad the pool or drop clients).")
  idx_map = client_sharding(mesh).addressable_devices_indices_map((num_clients,))
  starts = sorted({(s[0].start or 0, num_clients if s[0].stop is None else s[0].stop)
                   for s in idx_map.values()})
  lo, hi = starts[0][0], starts[0][1]
  for a, b in starts[1:]:
    if a != hi:
      raise ValueError(f"process {jax.process_index()} holds non-contiguous clients "
                       f"{starts}; build the mesh with engine.client_mesh() (devices "
                       "grouped by process).")
    hi = b
  return range(lo, hi)


def global_client_data(local: ClientData, mesh: Mesh, num_clients: int,
                       check: bool = True) -> ClientData:
  """The global pool from each process's own block of clients.

  Every process calls it (collectively) with the clients
  ``local_client_range(num_clients, mesh)`` of the pool, in pool order. Each block is
  placed on this process's devices and the global arrays are assembled by
  ``jax.make_array_from_process_local_data``; no process ever holds the whole pool.

  Args:
    local: ``ClientData`` with ``x: [N_local, n_max, *feature_shape]``,
      ``y: [N_local, n_max]``, ``n: [N_local]`` (host numpy or JAX arrays), where
      ``N_local = len(local_client_range(num_clients, mesh))`` (``N / process_count``
      with ``client_mesh()``). ``n_max``, feature shape and dtypes must be the same in
      every process (pad to the global maximum ``n_max``).
    mesh: the global ``clients`` mesh (``engine.client_mesh()`` after :func:`initialize`).
    num_clients: global pool size ``N`` (divisible by ``mesh.devices.size``).
    check: verify across processes (one small all-gather) that every process passed the
      same per-client shapes and dtypes; a mismatch would otherwise hang or fail inside
      the first round.

  Returns:
    ``ClientData`` of global ``jax.Array``s ``x: [N, n_max, *feature_shape]``,
    ``y: [N, n_max]``, ``n: [N]``, each sharded ``P('clients')`` over ``mesh``.

  Raises:
    ValueError: ``num_clients`` not divisible by the mesh size, ``local`` has the wrong
      number of clients for this process, or (``check``) processes disagree on
      ``n_max`` / feature shape / dtypes.
  """
  rows = local_client_range(num_clients, mesh)
  if local.num_clients != len(rows):
    raise ValueError(f"process {jax.process_index()} passed {local.num_clients} clients; "
                     f"it must pass the {len(rows)} clients {rows.start}..{rows.stop - 1} "
                     f"of the {num_clients}-client pool (local_client_range).")
  leaves = {"x": np.asarray(local.x), "y": np.asarray(local.y), "n": np.asarray(local.n)}
  if check and jax.process_count() > 1:
    from jax.experimental import multihost_utils
    sig = [v for a in leaves.values() for v in (a.ndim, a.dtype.num, *a.shape[1:])]
    sig = np.asarray((sig + [-1] * 32)[:32], np.int64)
    every = np.asarray(multihost_utils.process_allgather(sig))
    if not (every == every[0]).all():
      raise ValueError("processes disagree on the per-client shapes/dtypes of their "
                       "ClientData blocks (x, y, n); pad every block to the same n_max "
                       "and use the same feature shape and dtypes: "
                       f"this process has x {leaves['x'].shape[1:]} {leaves['x'].dtype}, "
                       f"y {leaves['y'].shape[1:]} {leaves['y'].dtype}, "
                       f"n {leaves['n'].dtype}.")
  sharding = client_sharding(mesh)
  out = {k: jax.make_array_from_process_local_data(sharding, a, (num_clients,) + a.shape[1:])
         for k, a in leaves.items()}
  return ClientData(**out)


def _place(tree: PyTree, sharding: NamedSharding, check: bool, what: str) -> PyTree:
  """Leaves of ``tree`` (identical in every process) as global arrays with ``sharding``.

  Each process passes the whole value and keeps the part its devices hold
  (``make_array_from_process_local_data`` with ``global_shape`` = the full shape).
  Typed PRNG keys travel as their key data. ``check``: one all-gather of a checksum
  of all leaves verifies the processes agree (instead of ``device_put``'s per-leaf check,
  one collective per leaf)."""
  leaves, treedef = jax.tree.flatten(tree)
  impls = [jax.random.key_impl(a) if _is_key(a) else None for a in leaves]
  host = [np.asarray(jax.random.key_data(a) if i is not None else a)
          for a, i in zip(leaves, impls)]
  if check and jax.process_count() > 1:
    from jax.experimental import multihost_utils
    crc = 0
    for a in host:
      crc = zlib.crc32(np.ascontiguousarray(a).tobytes(), zlib.crc32(
          f"{a.shape}{a.dtype}".encode(), crc))
    every = np.asarray(multihost_utils.process_allgather(np.asarray([crc], np.int64)))
    if not (every == every[0]).all():
      raise ValueError(f"{what} differs between processes (checksums "
                       f"{every.ravel().tolist()}); build it from the same seed and "
                       "settings in every process.")
  out = []
  for a, impl in zip(host, impls):
    g = jax.make_array_from_process_local_data(sharding, a, a.shape)
    out.append(jax.random.wrap_key_data(g, impl=impl) if impl is not None else g)
  return jax.tree.unflatten(treedef, out)


def _is_key(a) -> bool:
  return hasattr(a, "dtype") and jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key)


def replicate(tree: PyTree, mesh: Mesh, check: bool = True) -> PyTree:
  """``tree`` (identical in every process: server state, PRNG key) as global arrays
  replicated on every device of ``mesh`` (``P()``).

  Raises:
    ValueError: (``check``, several processes) the processes passed different values.
  """
  return _place(tree, NamedSharding(mesh, P()), check, "the replicated state")


def shard_clients(tree: PyTree, mesh: Mesh, check: bool = True) -> PyTree:
  """``tree`` with leading pool axis ``[N, ...]`` on every leaf (identical in every
  process, e.g. ``init_state``'s per-client states) as global arrays sharded
  ``P('clients')``, so each process's devices hold the state of its own clients.

  Raises:
    ValueError: ``N`` not divisible by the mesh size, or (``check``, several
      processes) the processes passed different values.
  """
  ndev = mesh.devices.size
  for a in jax.tree.leaves(tree):
    if not np.ndim(a) or np.shape(a)[0] % ndev:
      raise ValueError(f"a leaf of shape {np.shape(a)} has no leading client axis "
                       f"divisible by the {ndev} mesh devices.")
  return _place(tree, client_sharding(mesh), check, "the per-client state")


def to_host(tree: PyTree) -> PyTree:
  """Every leaf as a numpy array on every process: the local copy of a replicated array,
  an all-gather (``multihost_utils.process_allgather``) of a sharded one."""
  from jax.experimental import multihost_utils

  def one(a):
    if isinstance(a, jax.Array) and not a.is_fully_addressable:
      if a.is_fully_replicated:
        return np.asarray(a.addressable_data(0))
      return np.asarray(multihost_utils.process_allgather(a, tiled=True))
    return np.asarray(a)
  return jax.tree.map(one, tree)


def agree(value: int, what: str, fix: str) -> None:
  """Checks that every process holds the same integer ``value`` (one all-gather; nothing
  to check in a single process), e.g. the round a resumed run continues from.

  Raises:
    ValueError: the processes differ; the message names ``what``, each process's value
      and ``fix``.
  """
  if jax.process_count() == 1:
    return
  from jax.experimental import multihost_utils
  every = np.asarray(multihost_utils.process_allgather(np.asarray([int(value)], np.int64)))
  every = every.ravel().tolist()
  if len(set(every)) > 1:
    seen = ", ".join(f"process {i}: {v}" for i, v in enumerate(every))
    raise ValueError(f"{what} differs between processes ({seen}); {fix}.")
