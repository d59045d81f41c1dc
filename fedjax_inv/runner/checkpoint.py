"""Checkpoint I/O of the training loop (``fedjax_inv.runner.simulation.train_loop``): orbax
``CheckpointManager`` steps holding a pytree of arrays and a JSON ``meta``.

One module for the files; what goes into a checkpoint (server state, per-client states,
selected models, histories, divergence flags) is the loop's business. A step is written
to a temporary folder and renamed when complete (orbax), so a kill during a save leaves
the previous checkpoint intact, and resuming from it is bit-identical
(``tests/test_resume.py``).

In a run over several processes (``fedjax-inv run --coordinator``) every process calls
these functions on the same folder, which must be on a shared file system. The training
loop passes host (numpy) copies of the state, which orbax writes from process 0 only, and
each save ends at orbax's barrier over the processes (``tests/test_devices.py``).
"""
from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np


def _manager(path, create: bool):
  """An ``orbax.checkpoint.CheckpointManager`` over ``path`` that keeps the newest step
  only, saving synchronously (the round loop continues after the save has landed)."""
  import orbax.checkpoint as ocp
  opts = ocp.CheckpointManagerOptions(max_to_keep=1, create=create,
                                      enable_async_checkpointing=False)
  return ocp.CheckpointManager(pathlib.Path(path).absolute(), options=opts)


def _leaf_specs(state) -> list:
  return [[list(np.shape(x)), str(np.asarray(x).dtype if not hasattr(x, "dtype")
                                   else x.dtype)] for x in jax.tree.leaves(state)]


def latest_checkpoint(path) -> int | None:
  """The round of the newest complete checkpoint in ``path`` (None: none there).
  Orbax finalizes a step by an atomic rename, so a save killed half-way is not seen."""
  path = pathlib.Path(path)
  if not path.is_dir():
    return None
  with _manager(path, create=False) as m:
    return m.latest_step()


def save_checkpoint(path, state, meta: dict) -> None:
  """Saves ``state`` (any pytree of arrays: server state, per-client states, selected
  models) and ``meta`` (JSON: ``round``, history, ...) as step ``meta['round']`` of an
  ``orbax.checkpoint.CheckpointManager`` in ``path`` (created if missing; only the newest
  step is kept). Orbax writes each step to a temporary folder and renames it when
  complete, so a kill during a save leaves the previous checkpoint intact. Arrays are
  stored bit-exactly (tensorstore/zarr); the leaves' shapes and dtypes go into ``meta``
  so a restore into another model fails with a clear message.

  Raises:
    KeyError: ``meta`` has no integer ``round``.
  """
  import orbax.checkpoint as ocp
  meta = json.loads(json.dumps(
      dict(meta, leaves=_leaf_specs(state)),
      default=lambda o: o.item() if hasattr(o, "item") else str(o)))
  with _manager(path, create=True) as m:
    m.save(int(meta["round"]), args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)
    m.wait_until_finished()


def load_checkpoint_meta(path) -> dict | None:
  """The JSON ``meta`` of the newest checkpoint in ``path`` (None: no checkpoint)."""
  import orbax.checkpoint as ocp
  step = latest_checkpoint(path)
  if step is None:
    return None
  with _manager(path, create=False) as m:
    return m.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]


def load_checkpoint(path, target):
  """Restores the newest :func:`save_checkpoint` step in ``path`` into the structure,
  shapes and dtypes of ``target`` (a pytree of arrays).

  Returns:
    ``(state, meta)``, or None when ``path`` holds no checkpoint. The restored arrays are
    uncommitted (as freshly created ones), so a run sharded over several devices
    (``--devices``) places them as it placed the fresh state; orbax commits them to one
    device, which such a run refused ("incompatible devices").

  Raises:
    ValueError: the checkpoint's arrays do not match ``target`` (another model/config).
  """
  import orbax.checkpoint as ocp
  meta = load_checkpoint_meta(path)
  if meta is None:
    return None
  if meta.get("leaves") != _leaf_specs(target):
    raise ValueError(f"checkpoint in {path} does not match this run (different model or "
                     "settings); remove it or use another --out.")
  with _manager(path, create=False) as m:
    state = m.restore(int(meta["round"]), args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target)))["state"]
  return jax.tree.map(_uncommitted, state), meta


def _uncommitted(a):
  """``a`` as an uncommitted array on the default device (values unchanged)."""
  if not isinstance(a, jax.Array):
    return a
  if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
    return jax.random.wrap_key_data(_uncommitted(jax.random.key_data(a)),
                                    impl=jax.random.key_impl(a))
  return jnp.asarray(np.asarray(a))
