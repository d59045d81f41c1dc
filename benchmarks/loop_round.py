"""The benchmark baseline ``loop`` (``impl='loop'`` of ``fedjax-inv bench``, ratio 1.00):
FedJAX's "jit backend" design, one jit-compiled single-client update run by a Python loop
over the sampled clients.

It lives here, not in ``fedjax_inv.core``: it is a benchmark reference, not an execution
strategy of the engine (``core.engine.build_round(execution='loop')`` raises and names this
class). It is not a second copy of the round: it compiles the engine's public
``engine.round_parts`` (sampling, pre-stage, client update, server step) piece by piece.
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_inv.core import engine, losses
from fedjax_inv.core.algorithm import Algorithm


class LoopRound:
  """The ``loop`` baseline: the round as a Python loop over the sampled clients of one
  compiled single-client update (FedJAX's ``for_each_client`` jit design). Same
  ``engine.round_parts`` as the engine's jitted strategies, so the same numbers up to
  float32 summation order (``tests/test_bench.py``); the aggregator's sums accumulate on
  device inside the compiled client call.

  Args:
    model: ``FunctionalModel`` (the algorithm's model, ``algorithm.model_for`` applied).
    kind: 'binary' | 'multiclass' | 'regression'.
    algorithm: ``Algorithm``.
    num_clients: pool size ``N``.
    clients_per_round: cohort ``C`` (1 <= C <= N), sampled as the engine samples.

  Raises:
    ValueError: bad loss kind or cohort size (before any compile).

  ``compile(server, client_states, data, key)`` AOT-compiles every piece (returns the
  seconds spent); ``self(server, client_states, data, key) -> (server, client_states,
  metrics)`` as a ``round_fn`` (``client_states`` is donated). Not jittable as a whole:
  it is the baseline, not for ``simulation.run``.
  """

  def __init__(self, model, kind: str, algorithm: Algorithm, num_clients: int,
               clients_per_round: int):
    losses.check_kind(kind)
    if not 1 <= clients_per_round <= num_clients:
      raise ValueError(f"clients_per_round={clients_per_round} must be in "
                       f"[1, {num_clients}] (the pool has {num_clients} clients).")
    if algorithm.client_sampling != "fixed":
      raise ValueError(f"client_sampling={algorithm.client_sampling!r}: the loop baseline "
                       "runs fixed-size cohorts only; use the engine (build_round).")
    if (algorithm.attack is not None or algorithm.participation is not None
        or algorithm.aggregator.gather):
      raise ValueError("the loop baseline runs plain rounds only (no attack, participation "
                       "or gathered aggregator); use the engine (build_round).")
    self.cohort = int(clients_per_round)
    self.strategy = "loop"
    self._compiled = None
    p = engine.round_parts(model, kind, algorithm, num_clients, clients_per_round)
    self.has_pre = p.pre_client is not None

    def inp(pool_cs, data, idx, ckeys, j):
      i = idx[j]
      return i, data.n[i], jax.tree.map(lambda a: a[i], pool_cs), ckeys[j], {}

    def pre_acc(acc, server, pool_cs, data, idx, ckeys, j):
      stats = p.pre_client(server, data, inp(pool_cs, data, idx, ckeys, j))
      return jax.tree.map(jnp.add, acc, stats)

    def client_stats(pool_cs, server, extras, data, idx, ckeys, j):
      return p.client(server, extras, data, inp(pool_cs, data, idx, ckeys, j))[0]

    def client_acc(acc, pool_cs, server, extras, data, idx, ckeys, j):
      # Sampling is without replacement, so writing client i's new state right away
      # equals the jitted strategies' gather-all / scatter-all.
      stats, new_cs = p.client(server, extras, data, inp(pool_cs, data, idx, ckeys, j))
      pool_cs = jax.tree.map(lambda pool, new: pool.at[idx[j]].set(new), pool_cs, new_cs)
      return jax.tree.map(jnp.add, acc, stats), pool_cs

    def pre_stats(server, pool_cs, data, idx, ckeys, j):
      return p.pre_client(server, data, inp(pool_cs, data, idx, ckeys, j))

    self._fns = dict(sample=lambda server, key: p.sample(server, key)[:2], pre_stats=pre_stats,
                     pre_acc=pre_acc, pre_finish=p.pre_finish, client_stats=client_stats,
                     client_acc=client_acc, finish=p.finish)

  @staticmethod
  def _zeros(fn, *args):
    shapes = jax.eval_shape(fn, *args)
    return jax.jit(lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes))

  def compile(self, server, client_states, data, key) -> float:
    """AOT-compiles every piece for these argument shapes; returns compile seconds."""
    f, j0 = self._fns, np.int32(0)
    t0 = time.perf_counter()
    c = {"sample": jax.jit(f["sample"]).lower(server, key).compile()}
    idx, ckeys = jax.eval_shape(f["sample"], server, key)
    extras = server.extras
    if self.has_pre:
      c["pre_zeros"] = self._zeros(f["pre_stats"], server, client_states, data, idx, ckeys,
                                   j0)
      zp = jax.eval_shape(c["pre_zeros"])
      c["pre_acc"] = jax.jit(f["pre_acc"], donate_argnums=(0,)).lower(
          zp, server, client_states, data, idx, ckeys, j0).compile()
      c["pre_finish"] = jax.jit(f["pre_finish"]).lower(server, zp).compile()
      extras = jax.eval_shape(f["pre_finish"], server, zp)
    c["zeros"] = self._zeros(f["client_stats"], client_states, server, extras, data, idx,
                             ckeys, j0)
    z = jax.eval_shape(c["zeros"])
    c["client_acc"] = jax.jit(f["client_acc"], donate_argnums=(0, 1)).lower(
        z, client_states, server, extras, data, idx, ckeys, j0).compile()
    c["finish"] = jax.jit(f["finish"]).lower(server, extras, z, key).compile()
    self._compiled = c
    return time.perf_counter() - t0

  def pieces(self, server, client_states, data, key) -> list:
    """``[(count, fn, args)]``: every compiled piece of one round with abstract arguments
    and how many times a round calls it (for FLOP counting from jaxprs)."""
    if self._compiled is None:
      self.compile(server, client_states, data, key)
    f, j0 = self._fns, np.int32(0)
    idx, ckeys = jax.eval_shape(f["sample"], server, key)
    out = [(1, f["sample"], (server, key))]
    extras = server.extras
    if self.has_pre:
      zp = jax.eval_shape(self._compiled["pre_zeros"])
      out += [(self.cohort, f["pre_acc"], (zp, server, client_states, data, idx, ckeys, j0)),
              (1, f["pre_finish"], (server, zp))]
      extras = jax.eval_shape(f["pre_finish"], server, zp)
    z = jax.eval_shape(self._compiled["zeros"])
    out += [(self.cohort, f["client_acc"],
             (z, client_states, server, extras, data, idx, ckeys, j0)),
            (1, f["finish"], (server, extras, z, key))]
    return out

  def client_memory(self):
    """XLA's ``memory_analysis()`` of the compiled single-client update."""
    return self._compiled["client_acc"].memory_analysis()

  def __call__(self, server, client_states, data, key):
    """One round: ``(server, client_states, metrics)`` with metrics ``{'train_loss':
    scalar, 'clients': [C] int32 sampled pool indices}`` (compiles on the first call)."""
    if self._compiled is None:
      self.compile(server, client_states, data, key)
    c = self._compiled
    idx, ckeys = c["sample"](server, key)
    extras = server.extras
    if self.has_pre:
      acc = c["pre_zeros"]()
      for j in range(self.cohort):
        acc = c["pre_acc"](acc, server, client_states, data, idx, ckeys, np.int32(j))
      extras = c["pre_finish"](server, acc)
    acc = c["zeros"]()
    for j in range(self.cohort):
      acc, client_states = c["client_acc"](acc, client_states, server, extras, data, idx,
                                           ckeys, np.int32(j))
    server, metrics = c["finish"](server, extras, acc, key)
    metrics["clients"] = idx
    return server, client_states, metrics


def build_loop_round(model, kind: str, algorithm: Algorithm, num_clients: int,
                     clients_per_round: int) -> LoopRound:
  """The baseline round (see :class:`LoopRound`): ``LoopRound(model, kind, algorithm,
  num_clients, clients_per_round)``.

  Raises:
    ValueError: bad loss kind or cohort size (before any compile).
  """
  return LoopRound(model, kind, algorithm, num_clients, clients_per_round)
