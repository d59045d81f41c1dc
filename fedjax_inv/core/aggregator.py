"""The aggregation protocol of the engine: an ``Aggregator(lift, finalize)``.

``lift`` maps one client's message and weight to a pytree of *summable* statistics; the
engine adds those statistics over clients (in any order and grouping: all at once under
``vmap``, one client at a time under ``scan``, chunk by chunk, or across devices), and
``finalize`` turns the sums into the aggregate. Because the only combine step is ``+``,
every execution strategy gives the same numbers up to float32 summation order (DESIGN.md
§1). The aggregators of the papers (geometric mean, sign masks) are in
``fedjax_inv/aggregators.py``.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax

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
  replica's traced values (``core.algorithm.HPARAMS``), e.g. FedGMA's ``tau``.
  """
  lift: Callable[[PyTree, jax.Array], PyTree]
  finalize: Callable[[PyTree], PyTree]
  name: str = "aggregator"


def traced_names(aggregator: Aggregator) -> tuple:
  """The hyperparameters ``aggregator.finalize`` can take as traced values (``()`` for
  most aggregators; ``('tau',)`` for the sign masks)."""
  return tuple(getattr(aggregator.finalize, "traced", ()))


def weighted_mean() -> Aggregator:
  """Weighted arithmetic mean over clients: ``Σ_k w_k m_k / Σ_k w_k``.

  Source: McMahan et al. 2017 (FedAvg), Alg. 1 — ``w_k = n_k`` (client size) or 1.
  Shapes: any message pytree; weights are scalars per client.
  """

  def lift(message, weight):
    return (jax.tree.map(lambda m: weight * m, message), weight)

  def finalize(stats):
    total, wsum = stats
    return jax.tree.map(lambda t: t / wsum, total)

  return Aggregator(lift, finalize, "mean")
