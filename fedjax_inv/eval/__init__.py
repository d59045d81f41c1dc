"""Evaluation on device: per-client sums of loss / correct predictions, mapped over clients."""
from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_inv.core import losses
from fedjax_inv.core.data import ClientData
from fedjax_inv.core.packed import PackedPool
from fedjax_inv.core.engine import eval_logits_fn


def masked_example_sums(kind: str, logits, labels, weights) -> tuple:
  """Weighted sums over a block of examples of the per-example loss and correctness.

  Args:
    kind: ``'binary'``, ``'multiclass'`` or ``'regression'``.
    logits: ``[B, 1]``/``[B]`` (binary, regression) or ``[B, K]`` (multiclass).
    labels: ``[B]`` labels or regression targets.
    weights: ``[B]`` nonnegative weights (the 0/1 mask of real vs padded examples).

  Returns:
    ``(loss_sum, correct)`` scalars: ``Σ_i w_i ℓ_i`` and ``Σ_i w_i 1[right_i]``
    (``correct`` is 0 for regression). A row with weight 0 has no influence on either
    value or on the gradient w.r.t. logits and labels, even when its logits or labels
    hold inf/NaN (double ``where``: the row is zeroed before the loss, dropped after it).
  """
  weights = jnp.asarray(weights)
  keep = weights > 0
  logits, labels = losses.mask_rows(logits, keep), losses.mask_rows(labels, keep)

  def wsum(v):
    wv = v * weights
    return jnp.sum(jnp.where(keep, wv, jnp.zeros_like(wv)))

  loss_sum = wsum(losses.per_example_loss(kind, logits, labels))
  if kind == "regression":
    return loss_sum, jnp.zeros((), loss_sum.dtype)
  return loss_sum, wsum(losses.per_example_correct(kind, logits, labels))


def build_evaluator(model, kind: str, algorithm=None, eval_batch: int = 2048,
                    seed: int = 0) -> Callable:
  """Returns ``evaluate(params, data: ClientData) -> dict`` of per-client numpy arrays.

  Output (each ``[N]`` over the ``N`` clients of ``data``): ``loss_sum`` (summed
  per-example loss), ``correct`` (number of right predictions; absent for regression),
  ``n`` (examples). Clients are mapped with ``lax.map`` and each client's examples in
  blocks of ``eval_batch``, so memory stays bounded for large evaluation sets.
  If an algorithm component defines ``eval_forward`` (FedSR's Monte-Carlo prediction),
  it is used with a fixed evaluation key; otherwise the deterministic model.
  Padded examples (past ``n[i]``) have no influence on any output, even when their
  inputs or labels hold inf/NaN: they are zeroed before the forward pass and dropped
  with ``where`` (:func:`masked_example_sums`).
  ``data`` may also be a packed host pool (``core.packed.PackedPool``): it is evaluated
  in chunks of about ``CHUNK_ROWS`` examples, never padded as a whole (same per-client
  sums up to float32 summation order).
  ``evaluate.each(params, data)`` evaluates client ``i`` with its own ``params[i]``
  (leading client axis ``[N, ...]``): personalized models (Ditto).
  """
  losses.check_kind(kind)
  predict = eval_logits_fn(model, algorithm)
  # A deterministic prediction may skip the padding: the real rows of all clients,
  # packed (FEMNIST's test writers are padded 2.4x). A stochastic one (FedSR's
  # Monte-Carlo eval_forward) keeps the per-client blocks and their keys.
  ragged = algorithm is None or not any(c.eval_forward is not None or c.forward is not None
                                        for c in algorithm.components)

  key0 = jax.random.key(seed)

  def one_client(params, xc, yc, nc, block):
    nb = xc.shape[0] // block
    xb = xc.reshape((nb, block) + xc.shape[1:])
    yb = yc.reshape((nb, block))

    def one_block(args2):
      i, xbb, ybb = args2
      w = ((i * block + jnp.arange(block)) < nc).astype(jnp.float32)
      xbb = losses.mask_rows(xbb, w > 0)  # padded inputs never reach the model
      logits = predict(params, xbb, jax.random.fold_in(key0, i))
      return masked_example_sums(kind, logits, ybb, w)

    ls, cs = jax.lax.map(one_block, (jnp.arange(nb), xb, yb))
    return jnp.sum(ls), jnp.sum(cs)

  @functools.partial(jax.jit, static_argnames=("block",))
  def _eval(params, x, y, n, block):
    return jax.lax.map(lambda a: one_client(params, *a, block), (x, y, n))

  @functools.partial(jax.jit, static_argnames=("block",))
  def _eval_each(params, x, y, n, block):  # client i's own parameters params[i]
    return jax.lax.map(lambda a: one_client(*a, block), (params, x, y, n))

  def _padded(data: ClientData):
    block = min(eval_batch, data.n_max)
    pad = (-data.n_max) % block
    x, y = data.x, data.y
    if pad:
      x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
      y = jnp.pad(y, [(0, 0), (0, pad)])
    return x, y, block

  def _sums(loss_sum, correct, data: ClientData) -> dict:
    out = {"loss_sum": np.asarray(loss_sum), "n": np.asarray(data.n)}
    if kind != "regression":
      out["correct"] = np.asarray(correct)
    return out

  @functools.partial(jax.jit, static_argnames=("num_clients",))
  def _eval_flat(params, x, y, seg, num_clients):
    """The real examples of every client, in blocks ``[nb, B, ...]`` with their client
    ``seg`` (``num_clients`` for the padding of the last block): per-client sums by
    ``segment_sum``."""
    def one_block(args):
      xb, yb, sb = args
      w = (sb < num_clients).astype(jnp.float32)
      logits = predict(params, losses.mask_rows(xb, w > 0), key0)
      ell = losses.per_example_loss(kind, logits, yb)
      ell = jnp.where(w > 0, ell, 0.0)
      right = (jnp.where(w > 0, losses.per_example_correct(kind, logits, yb), 0.0)
               if kind != "regression" else jnp.zeros_like(ell))
      return (jax.ops.segment_sum(ell, sb, num_clients + 1),
              jax.ops.segment_sum(right.astype(jnp.float32), sb, num_clients + 1))
    ls, cs = jax.lax.map(one_block, (x, y, seg))
    return jnp.sum(ls, 0)[:num_clients], jnp.sum(cs, 0)[:num_clients]

  def _packed(params, pool) -> dict:
    """A packed pool (``core.packed.PackedPool``) in chunks of about ``CHUNK_ROWS``
    examples, never materializing its padded layout: its rows as they are stored
    (deterministic prediction), or chunks of clients padded to the pool's ``n_max``
    (stochastic prediction: the same per-client blocks and keys as the resident
    layout). Per-client sums, as :func:`evaluate` returns for the resident layout."""
    N, n = pool.num_clients, pool.n
    loss = np.zeros(N, np.float64)
    right = np.zeros(N, np.float64)
    if ragged:
      b = min(eval_batch, pool.total)
      rows = max(1, CHUNK_ROWS // b) * b
      client_of = np.repeat(np.arange(N, dtype=np.int32), n)
      for s in range(0, pool.total, rows):
        e = min(s + rows, pool.total)
        x = pool.decode(np.asarray(pool.x[s:e]))
        y, seg = np.asarray(pool.y[s:e]), client_of[s:e]
        pad = rows - (e - s) if pool.total > rows else (-(e - s)) % b
        if pad:
          x = np.concatenate([x, np.zeros((pad,) + x.shape[1:], x.dtype)])
          y = np.concatenate([y, np.zeros((pad,), y.dtype)])
          seg = np.concatenate([seg, np.full(pad, N, np.int32)])
        blocks = (-1, b)
        ls, cs = _eval_flat(params, jnp.asarray(x.reshape(blocks + x.shape[1:])),
                            jnp.asarray(y.reshape(blocks)), jnp.asarray(seg.reshape(blocks)),
                            num_clients=N)
        loss += np.asarray(ls, np.float64)
        right += np.asarray(cs, np.float64)
    else:
      block = min(eval_batch, pool.n_max)
      width = pool.n_max + (-pool.n_max) % block
      k = max(1, min(N, CHUNK_ROWS // width))
      for s in range(0, N, k):
        idx = np.arange(s, s + k)
        real = idx < N
        x, y, nn = pool.gather(np.minimum(idx, N - 1), width)
        nn = np.where(real, nn, 0).astype(np.int32)
        ls, cs = _eval(params, jnp.asarray(pool.decode(x)), jnp.asarray(y),
                       jnp.asarray(nn), block=block)
        loss[idx[real]] = np.asarray(ls)[real]
        right[idx[real]] = np.asarray(cs)[real]
    out = {"loss_sum": loss.astype(np.float32), "n": np.asarray(n)}
    if kind != "regression":
      out["correct"] = np.rint(right).astype(np.float32)
    return out

  def evaluate(params, data: ClientData) -> dict:
    if isinstance(data, PackedPool):
      return _packed(params, data)
    if ragged and _padding(data) > RAGGED_ABOVE:
      x, y, seg = _flat_blocks(data, eval_batch)
      loss_sum, correct = _eval_flat(params, x, y, seg, num_clients=data.num_clients)
      out = {"loss_sum": np.asarray(loss_sum), "n": np.asarray(data.n)}
      if kind != "regression":
        out["correct"] = np.rint(np.asarray(correct))
      return out
    x, y, block = _padded(data)
    return _sums(*_eval(params, x, y, data.n, block=block), data)

  def each(params, data: ClientData) -> dict:
    """Client ``i`` of ``data`` evaluated with its own parameters ``params[i]`` (a
    pytree with a leading client axis ``[N, ...]``, ``N = data.num_clients``): the
    personal models of Ditto (Li et al. 2021: personalized accuracy). Same output as
    ``evaluate``. Raises ValueError when the leading axis is not ``N``."""
    if isinstance(data, PackedPool):
      data = data.padded()
    lead = {a.shape[0] for a in jax.tree.leaves(params)}
    if lead != {data.num_clients}:
      raise ValueError(f"per-client parameters with leading axis {sorted(lead)} for "
                       f"{data.num_clients} clients; give one model per client.")
    x, y, block = _padded(data)
    return _sums(*_eval_each(params, x, y, data.n, block=block), data)

  evaluate.each = each
  return evaluate


# Evaluation packs the clients' real rows (no padding) when the set's padded slots exceed
# its real examples by more than this factor (``N * n_max / sum(n)``).
RAGGED_ABOVE = 1.5
# A packed pool (``core.packed.PackedPool``) is evaluated in chunks of about this many
# examples (a few hundred MB of float32 images at most: bounded memory for any pool).
CHUNK_ROWS = 1 << 16
_FLAT_CACHE: dict = {}


def _padding(data: ClientData) -> float:
  n = np.asarray(data.n, np.float64)
  return float(len(n) * data.n_max / max(n.sum(), 1.0))


def _flat_blocks(data: ClientData, block: int):
  """``(x [nb, B, ...], y [nb, B], seg [nb, B])``: every client's real rows packed in
  order, in blocks of ``B = min(block, total)``; ``seg`` = the row's client (``N`` on the
  last block's padding). Built once per evaluation set (host side) and cached."""
  key = id(data)
  hit = _FLAT_CACHE.get(key)
  if hit is not None and hit[0] is data:
    return hit[1]
  n = np.asarray(data.n)
  mask = np.arange(data.n_max)[None, :] < n[:, None]
  x = np.asarray(data.x)[mask]
  y = np.asarray(data.y)[mask]
  seg = np.repeat(np.arange(len(n), dtype=np.int32), n)
  b = min(block, len(seg))
  pad = (-len(seg)) % b
  x = np.concatenate([x, np.zeros((pad,) + x.shape[1:], x.dtype)])
  y = np.concatenate([y, np.zeros((pad,), y.dtype)])
  seg = np.concatenate([seg, np.full(pad, len(n), np.int32)])
  out = tuple(jnp.asarray(a.reshape((-1, b) + a.shape[1:])) for a in (x, y, seg))
  if len(_FLAT_CACHE) >= 8:
    _FLAT_CACHE.pop(next(iter(_FLAT_CACHE)))
  _FLAT_CACHE[key] = (data, out)
  return out


def summarize(per_client: dict, prefix: str) -> dict:
  """Metrics of one evaluation set from the evaluator's per-client sums.

  Args:
    per_client: ``build_evaluator(...)(params, data)`` — ``loss_sum``, ``n`` (and
      ``correct`` for classification), each ``[N]`` over the set's ``N`` clients.
    prefix: the set's name (``train``, ``val``, ``ood``, ...).

  Returns:
    ``{prefix}_loss`` (mean per-example loss, pooled over all examples) and, for
    classification, ``{prefix}_accuracy`` (pooled fraction in [0, 1]),
    ``{prefix}_worst_client_accuracy`` (lowest per-client accuracy) and, when ``N > 1``,
    ``{prefix}_mean_client_accuracy`` (unweighted mean of the per-client accuracies: with
    one client per source domain, DomainBed's and FedIIR's training-domain validation
    accuracy); for regression ``{prefix}_mse`` (= the loss).

  Source: DomainBed ``model_selection.IIDAccuracySelectionMethod`` and FedIIR's
  ``main.py`` (mean over domains) for the per-client mean.
  """
  n = per_client["n"].astype(np.float64)
  out = {f"{prefix}_loss": float(per_client["loss_sum"].sum() / n.sum())}
  if "correct" in per_client:
    acc = per_client["correct"] / np.maximum(n, 1.0)
    out[f"{prefix}_accuracy"] = float(per_client["correct"].sum() / n.sum())
    out[f"{prefix}_worst_client_accuracy"] = float(np.min(acc))
    if len(n) > 1:
      out[f"{prefix}_mean_client_accuracy"] = float(np.mean(acc))
  else:
    out[f"{prefix}_mse"] = out[f"{prefix}_loss"]
  return out


def summary_keys(kind: str, prefix: str, num_clients: int) -> set:
  """The keys :func:`summarize` returns for a set of ``num_clients`` clients of a task of
  loss kind ``kind`` (computed without evaluating anything)."""
  if kind == "regression":
    return {f"{prefix}_loss", f"{prefix}_mse"}
  keys = {f"{prefix}_loss", f"{prefix}_accuracy", f"{prefix}_worst_client_accuracy"}
  if num_clients > 1:
    keys.add(f"{prefix}_mean_client_accuracy")
  return keys
