"""Shared building pieces for algorithm factories: optimizers, aggregators by name, registry.

Every algorithm factory is ``factory(**hparams) -> Algorithm`` and is registered under the
paper's name with ``@register(name, paper=..., summary=...)``. Common keyword arguments
(all factories accept them): ``client_lr``, ``server_lr``, ``local_steps``,
``batch_size`` (None = full client batch), ``client_optimizer`` ('sgd' | 'momentum' |
'adam'), ``weight_decay``, ``server_optimizer`` ('sgd' | 'momentum' | 'adagrad' | 'adam'
| 'yogi'), ``aggregator`` ('mean' | 'geometric' | 'gma' | 'and_mask'), ``tau``,
``weighting`` ('num_examples' | 'uniform'), ``client_optimizer_state`` ('restart' |
'persistent': a client's optimizer state restarts every round or persists across its
rounds, ``Algorithm.client_optimizer_state``; 'persistent' is the default of ``fedsr``,
``fedl2r`` and ``fedcmi`` only).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_inv.aggregation import aggregators as aggs
from fedjax_inv.core.algorithm import Algorithm, learning_rate_in_round
# The registry is core's (the tasks read it); re-exported here for the factories.
from fedjax_inv.core.algorithm import Entry, register, registry  # noqa: F401
from fedjax_inv.algorithms.schema import (CLIENT_OPTIMIZERS, SERVER_OPTIMIZERS,
                                          check_values)

AGGREGATORS = ("mean", "geometric", "gma", "and_mask")


# FedSGD's client recipe (one local step of ``sgd(1.0)``, so the client sends its
# gradient): a FedSGD-type factory sets these itself and refuses them as keywords.
FEDSGD_CLIENT_RECIPE = ("client_lr", "local_steps", "client_optimizer")
# ``Entry.fixed`` of the FedSGD-type methods: a task's defaults for these are not passed
# to them (its client recipe, and its client ``weight_decay``: a FedSGD-type method's
# ``weight_decay`` is the server's, docs/ALGORITHMS.md#fedilc).
FEDSGD_FIXED = FEDSGD_CLIENT_RECIPE + ("weight_decay", "local_epochs")


def make_algorithm(name: str, **hparams) -> Algorithm:
  """Builds the registered algorithm ``name`` with keyword hyperparameters.

  Every value is checked against the hyperparameter schema first
  (``algorithms/schema.py``: kind and range; ``lr`` is ``client_lr``). Every registered
  algorithm accepts the common ``client_optimizer_state='restart' | 'persistent'``
  (``Algorithm.client_optimizer_state``) and records it in ``hparams``.

  Raises:
    ValueError: unknown name (lists the available ones) or a bad hyperparameter.
  """
  entries = registry()
  if name not in entries:
    raise ValueError(f"unknown algorithm {name!r}; available: {sorted(entries)}. "
                     "Run `fedjax-inv list` to see them with their papers.")
  return entries[name].factory(**check_values(hparams, algorithm=name))


def client_optimizer(name: str, lr: float, weight_decay: float = 0.0,
                     momentum: float = 0.9) -> optax.GradientTransformation:
  """Client (local) optimizer by name; its state is created fresh every round, or once
  per client with ``client_optimizer_state='persistent'``.

  'adam' with ``weight_decay > 0`` is AdamW (decoupled decay) as in FedILC §5.1. The rate
  is ``client_lr`` of the round (``core.algorithm.learning_rate_in_round``): ``lr`` in an
  ordinary run, a batched sweep replica's own value otherwise.

  Raises:
    ValueError: unknown ``name`` or ``lr <= 0``.
  """
  if name not in CLIENT_OPTIMIZERS:
    raise ValueError(f"client_optimizer={name!r}; choose one of {CLIENT_OPTIMIZERS}.")
  if lr <= 0:
    raise ValueError(f"client_lr={lr}; it must be > 0.")

  def make(rate):
    if name == "adam":
      return (optax.adamw(rate, weight_decay=weight_decay) if weight_decay
              else optax.adam(rate))
    base = optax.sgd(rate, momentum=momentum if name == "momentum" else None)
    return optax.chain(optax.add_decayed_weights(weight_decay), base) if weight_decay else base

  return learning_rate_in_round("client_lr", make, lr)


class ReddiState(NamedTuple):
  m: Any
  v: Any


def reddi_adaptive(kind: str, learning_rate: float, b1: float = 0.9, b2: float = 0.99,
                   tau: float = 1e-3) -> optax.GradientTransformation:
  """Server optimizers FedAdagrad / FedAdam / FedYogi of Reddi et al. 2021, Alg. 2.

  Input: the pseudo-gradient ``g = w_t − mean_k w_k`` (so ``Δ_t = −g``). With
  ``m_t = β1 m + (1−β1) Δ_t`` and
    adagrad: ``v_t = v + Δ_t²``;  adam: ``v_t = β2 v + (1−β2) Δ_t²``;
    yogi: ``v_t = v − (1−β2) Δ_t² sign(v − Δ_t²)``,
  the update is ``η m_t / (√v_t + τ)``; ``v_{-1} = τ²``. No bias correction (as in the
  paper; optax.adam would add it). Shapes follow the parameter pytree.
  """
  if kind not in ("adagrad", "adam", "yogi"):
    raise ValueError(f"kind={kind!r}; expected adagrad, adam or yogi.")

  def init(params):
    return ReddiState(m=jax.tree.map(jnp.zeros_like, params),
                      v=jax.tree.map(lambda p: jnp.full_like(p, tau ** 2), params))

  def update(grads, state, params=None):
    delta = jax.tree.map(jnp.negative, grads)
    m = jax.tree.map(lambda m, d: b1 * m + (1 - b1) * d, state.m, delta)
    if kind == "adagrad":
      v = jax.tree.map(lambda v, d: v + d * d, state.v, delta)
    elif kind == "adam":
      v = jax.tree.map(lambda v, d: b2 * v + (1 - b2) * d * d, state.v, delta)
    else:
      v = jax.tree.map(lambda v, d: v - (1 - b2) * d * d * jnp.sign(v - d * d), state.v,
                       delta)
    updates = jax.tree.map(lambda m, v: learning_rate * m / (jnp.sqrt(v) + tau), m, v)
    return updates, ReddiState(m, v)

  return optax.GradientTransformation(init, update)


def server_optimizer(name: str, lr: float, momentum: float = 0.9, b1: float = 0.9,
                     b2: float = 0.99, tau: float = 1e-3) -> optax.GradientTransformation:
  """Server optimizer on the pseudo-gradient (Reddi et al. 2021): 'sgd' (FedAvg: with
  lr=1 the new model is the weighted mean of client models), 'momentum' (FedAvgM), or
  'adagrad' | 'adam' | 'yogi' (:func:`reddi_adaptive`). The rate is ``server_lr`` of the
  round (``core.algorithm.learning_rate_in_round``).

  Raises:
    ValueError: unknown ``name`` or ``lr <= 0``.
  """
  if name not in SERVER_OPTIMIZERS:
    raise ValueError(f"server_optimizer={name!r}; choose one of {SERVER_OPTIMIZERS}.")
  if lr <= 0:
    raise ValueError(f"server_lr={lr}; it must be > 0.")

  def make(rate):
    if name in ("sgd", "momentum"):
      return optax.sgd(rate, momentum=momentum if name == "momentum" else None)
    return reddi_adaptive(name, rate, b1=b1, b2=b2, tau=tau)

  return learning_rate_in_round("server_lr", make, lr)


def aggregator(name: str, tau: float = 0.4) -> aggs.Aggregator:
  """Aggregator by name: 'mean' (weighted mean), 'geometric' (FedILC §3.1 weighted
  geometric mean), 'gma' (FedGMA §4 soft mask on the mean), 'and_mask' (AND-mask), or a
  robust one (``fedjax_inv.aggregation.robust.parse``: 'median', 'trimmed_mean:beta=0.1',
  'krum:f=1', 'multi_krum:f=1,m=2', 'geomed', 'centered_clip:tau=1')."""
  from fedjax_inv.aggregation import robust
  if str(name).partition(":")[0] in robust.ROBUST:
    return robust.parse(name)
  if name not in AGGREGATORS:
    raise ValueError(f"aggregator={name!r}; choose one of {AGGREGATORS + robust.ROBUST} "
                     "(robust ones take NAME:k=v, e.g. krum:f=2).")
  if name == "mean":
    return aggs.weighted_mean()
  if name == "geometric":
    return aggs.geometric_mean_aggregator()
  if not 0.0 <= tau <= 1.0:
    raise ValueError(f"tau={tau}; the sign-agreement threshold must be in [0, 1].")
  if name == "gma":
    return aggs.gma(aggs.weighted_mean(), tau)
  return aggs.and_mask_aggregator(aggs.weighted_mean(), tau)


def uniform_mean() -> aggs.Aggregator:
  """Unweighted mean over clients (ignores the client weight)."""
  base = aggs.weighted_mean()
  return aggs.Aggregator(lambda m, w: base.lift(m, jnp.ones((), jnp.float32)),
                         base.finalize, "uniform_mean")


def build(name: str, *, components=(), client_lr: float = 0.1, server_lr: float = 1.0,
          local_steps: int = 5, batch_size: int | None = 32,
          client_optimizer: str = "sgd", weight_decay: float = 0.0,
          server_optimizer: str = "sgd", server_momentum: float = 0.9,
          b1: float = 0.9, b2: float = 0.99, server_tau: float = 1e-3,
          aggregator: str = "mean", tau: float = 0.4, weighting: str = "num_examples",
          client_optimizer_state: str = "restart", local_epochs: int | None = None,
          record: dict | None = None, **extra) -> Algorithm:
  """Assembles an ``Algorithm`` from the common knobs (see module docstring).

  ``record``: the algorithm's own hyperparameters (e.g. FedProx's ``{'mu': mu}``), added to
  ``Algorithm.hparams`` after the common knobs, so a factory never edits ``hparams`` by
  hand.

  Raises:
    ValueError: unknown keyword (names it) or bad value (e.g. a ``client_optimizer_state``
      other than 'restart' / 'persistent').
  """
  if extra:
    raise ValueError(f"algorithm {name!r} got unknown hyperparameters {sorted(extra)}.")
  hp = dict(client_lr=client_lr, server_lr=server_lr, local_steps=local_steps,
            batch_size=batch_size, client_optimizer=client_optimizer,
            weight_decay=weight_decay, server_optimizer=server_optimizer,
            aggregator=aggregator, tau=tau, weighting=weighting,
            client_optimizer_state=client_optimizer_state)
  if server_optimizer in ("adagrad", "adam", "yogi"):
    hp.update(b1=b1, b2=b2, server_tau=server_tau)
  if local_epochs is not None:  # recorded only when set: earlier summaries stay as they are
    hp["local_epochs"] = local_epochs
    del hp["local_steps"]  # not run: each client runs E * ceil(n_i / B) steps
  hp.update(record or {})
  return Algorithm(
      name=name,
      client_optimizer=_client_opt(client_optimizer, client_lr, weight_decay),
      server_optimizer=_server_opt(server_optimizer, server_lr, server_momentum, b1, b2,
                                   server_tau),
      local_steps=int(local_steps), batch_size=batch_size,
      aggregator=_agg(aggregator, tau), weighting=weighting,
      components=tuple(components), hparams=hp,
      client_optimizer_state=client_optimizer_state, local_epochs=local_epochs)


_client_opt = client_optimizer
_server_opt = server_optimizer
_agg = aggregator
