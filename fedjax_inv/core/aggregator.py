"""The aggregation protocol of the engine: an ``Aggregator(lift, finalize)``.

``lift`` maps one client's message and weight to a pytree of *summable* statistics; the
engine adds those statistics over clients (in any order and grouping: all at once under
``vmap``, one client at a time under ``scan``, chunk by chunk, or across devices), and
``finalize`` turns the sums into the aggregate. Because the only combine step is ``+``,
every execution strategy gives the same numbers up to float32 summation order
(docs/ARCHITECTURE.md, 'A round is a map-reduce over a client axis'). The aggregators of
the papers (geometric mean, sign masks) are in ``fedjax_inv/aggregation/aggregators.py``.
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

PyTree = Any


class Aggregator(NamedTuple):
  """An associative client-axis reduction.

  Attributes:
    lift: ``(message, weight) -> stats``. ``message`` is one client's pytree (no client
      axis), ``weight`` a float32 scalar (the client's example count, or 1.0 for uniform
      weighting). ``stats`` is a pytree of arrays that is summed over clients.
    finalize: ``stats_sum -> aggregate`` (same structure as ``message``).
    name: short name for logs.

  A ``finalize`` function with an attribute ``traced`` (a tuple of hyperparameter names,
  see :func:`traced_names`) also accepts ``hparams={name: float32 scalar}``: a sweep
  replica's traced values (``core.algorithm.HPARAMS``), e.g. FedGMA's ``tau``. A ``lift``
  function with the attribute ``reads_context = True`` is called ``lift(message, weight,
  ctx=Context)`` with the client's context (DP's adaptive clip norm in
  ``ctx.extras``; :func:`reads_context`).

  ``gather=True`` (the robust aggregators of ``fedjax_inv/aggregation/robust.py``): the
  lifted values are not summed but stacked over the client axis, and ``finalize`` gets the stack
  ``[C, ...]`` (a median or Krum needs every update at once); a ``finalize`` with the
  attribute ``needs_key = True`` also gets ``key=`` (the round's server key).
  """
  lift: Callable[[PyTree, jax.Array], PyTree]
  finalize: Callable[[PyTree], PyTree]
  name: str = "aggregator"
  gather: bool = False


def reads_context(aggregator: Aggregator) -> bool:
  """Whether ``aggregator.lift`` takes the client's ``ctx`` keyword (see Aggregator)."""
  return bool(getattr(aggregator.lift, "reads_context", False))


def lift(aggregator: Aggregator, message: PyTree, weight, ctx=None) -> PyTree:
  """``aggregator.lift(message, weight)``, given the client's ``ctx`` when the lift reads
  it (:func:`reads_context`): how the engine and its memory estimate lift a message.
  ``message`` is one client's pytree (no client axis), ``weight`` a float32 scalar."""
  if reads_context(aggregator):
    return aggregator.lift(message, weight, ctx=ctx)
  return aggregator.lift(message, weight)


def traced_names(aggregator: Aggregator) -> tuple:
  """The hyperparameters ``aggregator.finalize`` can take as traced values (``()`` for
  most aggregators; ``('tau',)`` for the sign masks)."""
  return tuple(getattr(aggregator.finalize, "traced", ()))


def weighted_mean() -> Aggregator:
  """Weighted arithmetic mean over clients: ``Σ_k w_k m_k / Σ_k w_k``.

  An absent client (``w_k = 0``: not sampled, or a padded client slot) contributes
  nothing to the value or to the gradient w.r.t. its message, even when its message
  holds inf or NaN (``where``, not ``0 * m``). If every client is absent
  (``Σ_k w_k = 0``) the aggregate is 0 (finite, with zero gradient).

  Source: McMahan et al. 2017 (FedAvg), Alg. 1 — ``w_k = n_k`` (client size) or 1.
  Shapes: any message pytree (one client's, no client axis; summed over the client axis
  ``[C]`` by the engine); weights are nonnegative scalars per client.
  """

  def lift(message, weight):
    present = weight > 0

    def leaf(m):
      # Double where: the absent client's message is zeroed before the product (so its
      # cotangent is 0, not 0 * inf) and the product is dropped after it.
      safe = jnp.where(present, m, jnp.zeros_like(m))
      wm = weight * safe
      return jnp.where(present, wm, jnp.zeros_like(wm))

    return (jax.tree.map(leaf, message), weight)

  def finalize(stats):
    total, wsum = stats
    nonempty = wsum > 0
    safe = jnp.where(nonempty, wsum, jnp.ones_like(wsum))

    def leaf(t):
      mean = t / safe
      return jnp.where(nonempty, mean, jnp.zeros_like(mean))

    return jax.tree.map(leaf, total)

  return Aggregator(lift, finalize, "mean")


def as_gathered(aggregator: Aggregator) -> Aggregator:
  """A summable aggregator on the gather path: the lifted values are stacked, and
  ``finalize`` lifts and sums them itself (the same value up to summation order). Under
  an attack the pseudo-gradients must be stacked: the attack rewrites them first."""
  if aggregator.gather:
    return aggregator

  def finalize(stacked, **kw):
    msgs, w = stacked
    sums = jax.tree.map(lambda a: jnp.sum(a, axis=0), jax.vmap(aggregator.lift)(msgs, w))
    return aggregator.finalize(sums, **kw)
  finalize.traced = traced_names(aggregator)
  return Aggregator(lambda m, w: (m, w), finalize, aggregator.name, gather=True)


def main_aggregator(algorithm) -> Aggregator:
  """The pseudo-gradient's aggregator as the round runs it: ``algorithm.aggregator``,
  on the gather path when an attack rewrites the updates."""
  agg = algorithm.aggregator
  if algorithm.attack is not None and algorithm.attack.name != "label_flip":
    return as_gathered(agg)
  return agg


def flatten_clients(stacked) -> tuple:
  """``(x [C, D] float32, unflatten)`` of a stacked message pytree (leaves ``[C, ...]``):
  each client's parameters as one row. ``unflatten(v)`` maps ``[D]`` back to one client's
  pytree, or ``[C, D]`` back to the stack (the leaves' shapes and dtypes). Used by the
  robust aggregators (``fedjax_inv/aggregation/robust.py``) and the attacks
  (``core/adversary.py``)."""
  leaves, tree = jax.tree.flatten(stacked)
  c = leaves[0].shape[0]
  x = jnp.concatenate([l.reshape(c, -1).astype(jnp.float32) for l in leaves], axis=1)

  def unflatten(v):
    parts, off = [], 0
    for leaf in leaves:
      size = math.prod(leaf.shape[1:])
      parts.append(v[..., off:off + size].reshape(v.shape[:-1] + leaf.shape[1:])
                   .astype(leaf.dtype))
      off += size
    return jax.tree.unflatten(tree, parts)
  return x, unflatten
