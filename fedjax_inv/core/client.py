"""What one client computes in a round: its local training (:func:`local_train`, one
step's gradient :func:`step_gradient` of the objective :func:`make_objective`), what it
sees (:func:`client_context`) and its components' work after training
(:func:`client_outputs`). Shared by the engine (``core/engine.py``) and the memory
estimate (``core/memory.py``), which traces these same functions."""
from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import optax

from fedjax_inv.core import losses
from fedjax_inv.core import strategy as strategy_lib
from fedjax_inv.core.algorithm import HPARAMS, Algorithm, Batch, Context, Forward, Objective


def batch_indices(key, n, local_steps: int, batch_size: int) -> jax.Array:
  """``[local_steps, batch_size]`` int32 example indices, uniform over ``[0, n)`` with
  replacement, drawn once per client per round (one key, one call)."""
  return jax.random.randint(key, (local_steps, batch_size), 0, n)


def full_batch(x, y, n) -> Batch:
  """The client's whole padded data as one batch; padding gets weight 0."""
  w = (jnp.arange(x.shape[0]) < n).astype(jnp.float32)
  return Batch(x=x, y=y, w=w)


def default_forward(model, params, x, key=None) -> Forward:
  z = model.features(params, x)
  return Forward(z=z, logits=model.classify(params, z))


def eval_logits_fn(model, algorithm: Algorithm | None = None) -> Callable:
  """``logits(params, x [B, ...], key) -> [B, K]`` used for evaluation: a component's
  ``eval_forward`` (FedSR's Monte-Carlo prediction) if one defines it, else its
  ``forward``'s logits, else the deterministic ``model.apply``. Shared by
  ``eval.build_evaluator`` and ``eval.metrics.build_predict``."""
  comp = None
  if algorithm is not None:
    comp = next((c for c in algorithm.components
                 if c.eval_forward is not None or c.forward is not None), None)

  def logits(params, x, key):
    if comp is not None and comp.eval_forward is not None:
      return comp.eval_forward(model, params, x, key)
    if comp is not None:
      return comp.forward(model, params, x, key).logits
    return model.apply(params, x)

  return logits


def make_objective(model, kind: str, algorithm: Algorithm) -> Callable:
  """``objective(params, batch, ctx, key) -> scalar`` client loss: task loss on the
  minibatch + every component's loss term, divided by the components' loss scales."""
  fwd_comp = next((c for c in algorithm.components if c.forward is not None), None)
  terms = [c for c in algorithm.components if c.loss is not None]
  scales = [c for c in algorithm.components if c.loss_scale is not None]

  def objective(params, batch: Batch, ctx: Context, key):
    keys = jax.random.split(key, len(terms) + 1)
    if fwd_comp is not None:
      fwd = fwd_comp.forward(model, params, batch.x, keys[0])
    else:
      fwd = default_forward(model, params, batch.x)
    loss = losses.mean_loss(kind, fwd.logits, batch.y, batch.w)
    for c, k in zip(terms, keys[1:]):
      loss = loss + c.loss(model, kind, params, batch, fwd, ctx, k)
    for c in scales:
      loss = loss / c.loss_scale(ctx)
    return loss

  return objective


def step_gradient(model, kind: str, algorithm: Algorithm, ctx: Context) -> Callable:
  """``gradient(params, batch, key) -> (loss, grads)``: one local step's gradient as a
  client in ``ctx`` computes it: ``jax.value_and_grad`` of :func:`make_objective`, or the
  component's ``grad_estimator`` given that objective as an :class:`Objective`. The local
  training loop and the memory estimate (``core/memory.py``) both use it."""
  objective = make_objective(model, kind, algorithm)
  est = next((c for c in algorithm.components if c.grad_estimator is not None), None)

  def value_and_grad(params, batch, k):
    return jax.value_and_grad(objective)(params, batch, ctx, k)
  if est is None:
    return value_and_grad
  # What a gradient estimator sees: the default estimate and the task's structure.
  described = Objective(value_and_grad, model, kind, algorithm.task_only)
  return lambda params, batch, k: est.grad_estimator(described, params, batch, ctx, k)


def local_train(model, kind: str, algorithm: Algorithm, ctx: Context, x, y, n, key,
                opt_state=None):
  """Runs ``local_steps`` client optimizer steps from ``ctx.params`` under ``lax.scan``.

  ``x: [n_max, ...]``, ``y: [n_max]``, ``n``: true size. Minibatches: ``batch_size``
  indices per step drawn with replacement from ``[0, n)`` by :func:`batch_indices` (all
  steps at once), or the full client data when ``batch_size`` is None.
  ``opt_state``: the client chain's (``algorithm.client_chain()``) state to start from,
  one client's (no pool axis; ``client_optimizer_state='persistent'``), or None for a
  fresh ``init(ctx.params)``.
  Returns ``(final params, [K] per-step losses, final client-chain state)``. Source:
  FedAvg (McMahan et al. 2017) ClientUpdate, with the components' gradient estimator /
  correction hooks.
  """
  gradient = step_gradient(model, kind, algorithm, ctx)
  opt = algorithm.client_chain()  # components' client stages, then the client optimizer
  K, B = algorithm.local_steps, algorithm.batch_size
  k_batch, k_loss = jax.random.split(key)
  loss_keys = jax.random.split(k_loss, K)
  # A sweep replica's traced client learning rate: the optimizer was built at lr = 1.
  lr = ctx.extras.get(HPARAMS, {}).get("client_lr")

  def step(carry, inp):
    params, opt_state = carry
    batch, kl = inp
    loss, grads = gradient(params, batch, kl)
    updates, opt_state = opt.update(grads, opt_state, params, ctx=ctx)
    if lr is not None:
      updates = jax.tree.map(lambda u: u * lr, updates)
    return (optax.apply_updates(params, updates), opt_state), loss

  if B is None:
    fb = full_batch(x, y, n)
    inner = lambda carry, kl: step(carry, (fb, kl))  # noqa: E731
    xs = loss_keys
  else:
    idx = batch_indices(k_batch, n, K, B)
    if strategy_lib.pregathered(K, B, x.dtype.itemsize * math.prod(x.shape[1:])):
      ones = jnp.ones((K, B), jnp.float32)
      xs = (Batch(x=x[idx], y=y[idx], w=ones), loss_keys)
      inner = step
    else:
      def inner(carry, inp):
        i, kl = inp
        return step(carry, (Batch(x=x[i], y=y[i], w=jnp.ones((B,), jnp.float32)), kl))
      xs = (idx, loss_keys)
  if opt_state is None:
    opt_state = opt.init(ctx.params)
  (params, opt_state), step_losses = jax.lax.scan(inner, (ctx.params, opt_state), xs,
                                                  unroll=strategy_lib.local_unroll(K))
  return params, step_losses, opt_state


def client_context(server_params, round_, extras: dict, client: dict, num_clients,
                   cohort) -> Context:
  """What a client is handed in a round (the server's broadcast plus its own state): the
  global ``server_params``, the round index, every component's server state ``extras``
  and the client's ``client`` state (``{}`` on the server side)."""
  return Context(params=server_params, round=round_, extras=extras, client=client,
                 num_clients=jnp.float32(num_clients), cohort=jnp.float32(cohort))


def client_outputs(model, kind: str, component, params, batch: Batch, ctx: Context, key):
  """One component's work on one client after its local training: ``(message or None,
  new client state or None)`` from its ``message`` and ``update_client`` hooks
  (``params`` the trained local model, ``batch`` the client's whole data)."""
  msg = None if component.message is None else component.message(
      model, kind, params, batch, ctx, key)
  new = None if component.update_client is None else component.update_client(
      model, kind, params, batch, ctx, key)
  return msg, new
